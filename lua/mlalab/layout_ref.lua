--- The CPU reference for caches, callable directly: quantize-and-write rows
-- into slots, read-and-dequantize slots (src/ref/layout_ref.c through
-- core.ref_write / core.ref_read). Generic over the layout; pages is one
-- layer's u8 view ([pages, page_bytes] with any page stride, or
-- [pages, block_size, row] for one-region layouts) on the CPU.
local core = require "mlalab.core"
local layout = require "mlalab.layout"

local M = {}

local function block_size_of(fn, pages, opts)
  local bs = opts.block_size
  if bs == nil and core.is_tensor(pages) and pages:dim() == 3 then bs = pages:size(1) end
  if bs == nil then error(fn .. ": opts.block_size is required for [pages, page_bytes] views", 3) end
  return bs
end

local function host_f32(t, what, fn)
  if not core.is_tensor(t) then error(string.format("%s: %s must be a tensor", fn, what), 3) end
  if t:get_dtype() == "f32" and not t:is_cuda() then return t end
  return t:to({ dtype = "f32", device = "cpu" }) -- bf16 / f16 inputs widen exactly
end

local function host_scale(s)
  if core.is_tensor(s) and s:is_cuda() then return s:to("cpu") end
  return s
end

local function host_slots(s, fn)
  if not core.is_tensor(s) then error(fn .. ": slots must be an i64 tensor", 3) end
  if s:is_cuda() then s = s:to("cpu") end
  return s
end

--- write(layout, pages, x [n, dim], slots [n] i64, {block_size=, tensor_scale=})
-- x may be any float dtype (widened to f32 exactly) and on any device.
function M.write(L, pages, x, slots, opts)
  opts = opts or {}
  L = layout.get(L)
  local d = L:packed(block_size_of("layout_ref.write", pages, opts))
  core.ref_write(d, pages, host_f32(x, "x", "layout_ref.write"), host_slots(slots, "layout_ref.write"),
    host_scale(opts.tensor_scale))
end

--- read(layout, pages, slots [n] i64, {block_size=, cols = dim, out =, tensor_scale=}) -> f32 [n, cols]
-- Rows whose slot is negative are left as they were in `out` (zeros when
-- the reference allocates it).
function M.read(L, pages, slots, opts)
  opts = opts or {}
  L = layout.get(L)
  local d = L:packed(block_size_of("layout_ref.read", pages, opts))
  slots = host_slots(slots, "layout_ref.read")
  local out = opts.out or core.full({ slots:size(0), opts.cols or L.dim }, 0, { dtype = "f32", device = "cpu" })
  core.ref_read(d, pages, slots, out, host_scale(opts.tensor_scale))
  return out
end

-- Round-trip error in units of half a quantization step ---------------------

local SCALE_BYTES = { f32 = 4, bf16 = 2, ue8m0 = 1, e4m3 = 1 }

local function decode_scale(dt, bytes, off)
  if dt == "f32" then return (string.unpack("<f", bytes, off + 1)) end
  if dt == "bf16" then return (string.unpack("<f", string.pack("<I4", string.unpack("<I2", bytes, off + 1) << 16))) end
  return core.tensor_from_bytes(bytes:sub(off + 1, off + 1), dt, { 1 }, "cpu"):to("f32"):item()
end

-- Half the spacing of dtype's grid around |y| (y in code units).
local function half_step(dt, y)
  y = math.abs(y)
  if y ~= y or y == math.huge then return 0 end
  local e = y > 0 and math.floor(math.log(y, 2)) or -1000
  if dt == "e4m3" then return 2.0 ^ (math.max(e, -6) - 4) end
  if dt == "e5m2" then return 2.0 ^ (math.max(e, -14) - 3) end
  if dt == "e2m1" then return y < 2 and 0.25 or y < 4 and 0.5 or 1 end
  if dt == "bf16" then return 2.0 ^ (math.max(e, -126) - 8) end
  if dt == "f16" then return 2.0 ^ (math.max(e, -14) - 11) end
  return 2.0 ^ (math.max(e, -126) - 24) -- f32
end

--- Worst |x - read(write(x))| over all dims of the given slots, divided by
-- half the quantization step at x under the scale actually stored (the
-- bound every format promises: <= 1). pages: CPU view holding the written
-- slots; x: the rows written (CPU f32 [n, dim]). Returns ratio, dim, row.
function M.worst_step_ratio(L, pages, x, slots, opts)
  opts = opts or {}
  L = layout.get(L)
  local bs = block_size_of("layout_ref.worst_step_ratio", pages, opts)
  local d = core.layout_unpack(L:packed(bs))
  x = host_f32(x, "x", "layout_ref.worst_step_ratio")
  local ts = opts.tensor_scale and opts.tensor_scale:to("cpu"):item() or 1
  local y = M.read(L, pages, slots, opts)
  local lo, hi = pages:byte_range()
  local bytes = core.tensor_bytes(pages:as_strided({ hi - lo }, { 1 }, lo))
  local stride = pages:stride(0) * pages:element_size()
  local token_stride = pages:dim() == 3 and pages:stride(1) or d.region_row_bytes[1]
  local sl = host_slots(slots, "layout_ref.worst_step_ratio"):totable()
  local worst, wdim, wrow = 0, nil, nil
  for r, slot in ipairs(sl) do
    if slot >= 0 then
      local t = slot % bs
      local function at(reg, b) return (slot // bs) * stride + layout.region_offset(d, reg, t, b, token_stride) end
      for _, f in ipairs(d.fields) do
        if f.role == "data" then
          for e = 0, f.count - 1 do
            local s = 1
            if f.scale_kind == "tensor" then s = ts
            elseif f.scale_kind == "group" then
              s = decode_scale(f.scale_dtype, bytes, at(f.scale_region, f.scale_off + (e // f.group) * SCALE_BYTES[f.scale_dtype]))
            end
            local dim = f.dim_lo + e
            local xv, yv = x:get({ r - 1, dim }), y:get({ r - 1, dim })
            local err = math.abs(xv - yv)
            local bound = half_step(f.dtype, xv / s) * s * (1 + 2 ^ -20) + math.abs(yv) * 2 ^ -23
            local ratio = err == 0 and 0 or (bound > 0 and err / bound or math.huge)
            if ratio ~= ratio then ratio = math.huge end
            if ratio > worst then worst, wdim, wrow = ratio, dim, r - 1 end
          end
        end
      end
    end
  end
  return worst, wdim, wrow
end

return M
