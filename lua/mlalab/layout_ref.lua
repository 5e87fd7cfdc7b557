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
  core.ref_write(d, pages, host_f32(x, "x", "layout_ref.write"), host_slots(slots, "layout_ref.write"), opts.tensor_scale)
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
  core.ref_read(d, pages, slots, out, opts.tensor_scale)
  return out
end

return M
