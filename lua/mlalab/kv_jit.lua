--- The JIT twins of the KV write and sparse gather (kernels_rtc/kv_write.cu,
-- kv_gather.cu) behind the calling convention of mla.kernels: a cache table
-- { pages, layout, block_size, tensor_scale } (e.g. cache:view(i)), slot ids,
-- bf16 rows. One module per (layout, block size), compiled on first use for
-- the current GPU (or `arch`, which compiles without launching).
--
--   mla.kv_jit.write(view, slots, rows)           -- slots < 0 skipped
--   local out = mla.kv_jit.gather(view, slots)    -- bf16 [n, dim]; slots < 0 leave zeros
--   mla.kv_jit.module("gather", L, bs, "sm_90a")   -- compile only (no GPU needed)
local mla = require "mlalab"

local M = {}

local FILES = { write = "kv_write.cu", gather = "kv_gather.cu" }
local modules = {}

local function fail(fmt, ...) error("kv_jit." .. string.format(fmt, ...), 3) end

--- The compiled module of `which` ("write" or "gather") for a layout and block size.
function M.module(which, L, bs, arch)
  L = mla.layout.get(L)
  local file = FILES[which] or fail("module: which must be 'write' or 'gather', got %s", tostring(which))
  local key = table.concat({ which, L.name, bs, arch or "" }, "/")
  if not modules[key] then
    modules[key] = mla.rtc.compile { file = file, layout = L, block_size = bs, arch = arch }
  end
  return modules[key]
end

local function args_of(fn, c, slots)
  if type(c) ~= "table" or not mla.is_tensor(c.pages) then fail("%s: a cache table {pages =, layout =, block_size =} is expected", fn) end
  if not c.pages:is_cuda() then fail("%s: JIT kernels run on a GPU: the pages are on %s", fn, c.pages.device) end
  local L = mla.layout.get(c.layout)
  local bs = c.block_size or (c.pages:dim() == 3 and c.pages:size(1)) or fail("%s: the cache table needs block_size", fn)
  if not mla.is_tensor(slots) or slots:dim() ~= 1 then fail("%s: slots must be a 1-D index tensor", fn) end
  if slots.dtype ~= "i32" and slots.dtype ~= "i64" then fail("%s: slots must be i32 or i64, got %s", fn, slots.dtype) end
  if not slots:is_contiguous() then slots = slots:contiguous() end
  local ts = c.tensor_scale
  if type(ts) == "number" then ts = mla.full({ 1 }, ts, "f32", c.pages.device) end
  local view = mla.rtc.cache_view(c.pages, L, { block_size = bs, tensor_scale = ts })
  return L, bs, view, slots, slots.dtype == "i32" and "<int>" or "<long long>"
end

local function grid(n) return math.max(1, math.min((n + 3) // 4, 1 << 20)) end -- 4 warps (rows) per block, grid-stride loops

--- write(cache, slots, rows): rows bf16 [>= n, dim] (row stride from the tensor).
function M.write(c, slots, rows)
  local L, bs, view, s, suffix = args_of("write", c, slots)
  if not mla.is_tensor(rows) or rows.dtype ~= "bf16" or rows:dim() ~= 2 or rows:size(1) ~= L.dim or rows:stride(1) ~= 1 then
    fail("write: rows must be bf16 [n, %d] with unit column stride", L.dim)
  end
  local n = s:size(0)
  if rows:size(0) < n then fail("write: %d rows for %d slots", rows:size(0), n) end
  M.module("write", L, bs):kernel("kv_write" .. suffix):launch { grid = grid(n), block = 128,
    args = { view, s, n, rows, rows:stride(0), 0 } }
end

--- gather(cache, slots, out) -> out bf16 [n, dim] (allocated with zeros when not given).
function M.gather(c, slots, out)
  local L, bs, view, s, suffix = args_of("gather", c, slots)
  local n = s:size(0)
  out = out or mla.zeros({ n, L.dim }, "bf16", c.pages.device)
  if out.dtype ~= "bf16" or out:dim() ~= 2 or out:size(0) < n or out:stride(1) ~= 1 or out:size(1) % 8 ~= 0 then
    fail("gather: out must be bf16 [>= %d, multiple of 8 <= %d] with unit column stride", n, L.dim)
  end
  M.module("gather", L, bs):kernel("kv_gather" .. suffix):launch { grid = grid(n), block = 128,
    args = { view, s, n, out, out:stride(0), math.min(out:size(1), L.dim), 0 } }
  return out
end

return M
