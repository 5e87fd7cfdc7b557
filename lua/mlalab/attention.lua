--- MLA decode attention over any cache layout, dense or sparse, with three
-- implementations of the same semantics (src/attn.h):
--   "ref"   the CPU reference (src/ref/attn_ref.c): double precision on the
--           dequantized cache; returns f32 outputs on the CPU
--   "baked" the production kernels (src/kernels/attn_decode*.cu): tensor
--           cores, split-KV with an LSE combine; bf16 output on the GPU
--   "jit"   kernels_rtc/attn_decode.cu, compiled for the layout by mla.rtc
--           (any layout, no C++ edit; simpler and slower)
--
--   local out, lse = mla.attention.decode{
--     q = q,                                 -- bf16 [b, s_q, h_q, d_qk], any strides
--     cache = c:view(layer),                 -- or pages = tensor, layout = name, block_size =, tensor_scale =
--     block_table = bt, cache_lens = lens,   -- dense (i32 [b, max_blocks], [b]); causal = true by default
--     -- or: indices = idx, topk_len = n,    -- sparse (i32 [b, s_q, topk] slot ids, -1 = none; [b])
--     sink = s,                              -- optional f32 [h_q]
--     scale = 1 / math.sqrt(576),            -- default d_qk^-0.5
--     impl = "baked",                        -- default: baked on a GPU, ref on the CPU
--   }
-- out: [b, s_q, h_q, d_v]; lse: f32 [b, h_q, s_q], natural log; a query
-- with no key gets lse = +inf and a zero output. Options: out=, lse=
-- (preallocated, contiguous; baked: out 16-byte aligned), check = true (index values checked on the host,
-- which costs a device-to-host copy: pass false when timing), splits = 0
-- (baked: automatic from the SM count and the batch), specialize = true
-- (baked: a cache whose descriptor equals a built-in fp8 layout's, read with
-- 16-row tiles, runs that layout's compile-time-specialized kernel: on
-- Hopper the 16-row wgmma kernel, elsewhere the V-slice kernel; "slice"
-- forces the V-slice kernel; "wide" runs 64-row tiles whatever the row
-- count; false forces the generic, descriptor-driven kernel), causal_tail =
-- true (baked, dense causal: where a tile of rows holds several queries, it
-- attends its first query's keys and a tail kernel the rest, so a key masked
-- for a query never meets it in a shared P V; false shares the tile's keys
-- as FlashMLA does: faster, but a NaN or inf in one of the last s_q - 1 keys
-- may reach the earlier queries' outputs). The third
-- result of the baked path is its plan (splits, rows per CTA, stages,
-- tile_keys, variant = "generic", "wgmma", "wgmma16rs" or the built-in
-- layout's name for the V-slice kernel, ...); M.last_variant()
-- names what the last baked launch ran. On Hopper, 64-row tiles of bf16 rows
-- and of the built-in fp8 layouts run 64-key tiles (fp8 fed from registers);
-- other layouts run 32-key staged tiles (tile_keys). Dense decode over bf16
-- rows takes 64-row tiles on Hopper whatever the row count (faster than the
-- 16- and 32-row kernels there).
local mla = require "mlalab"
local core = mla.core
local layout = require "mlalab.layout"
local options = require "mlalab.options"

local M = {}

local function fail(fmt, ...) error("attention.decode: " .. string.format(fmt, ...), 3) end
-- a bad option's value for an error message: strings quoted, numbers as they are, else the type
local function shown(v)
  if type(v) == "string" then return string.format("%q", v) end
  return type(v) == "number" and tostring(v) or "a " .. type(v)
end

local function shape_str(t)
  local s = {}
  for i = 0, t:dim() - 1 do s[#s + 1] = tostring(t:size(i)) end
  return "[" .. table.concat(s, ", ") .. "]"
end

local KNOWN = { "q", "cache", "pages", "layout", "block_size", "tensor_scale", "block_table", "cache_lens", "causal",
  "causal_tail", "indices", "topk_len", "sink", "scale", "impl", "out", "lse", "check", "splits", "specialize" }

-- The cache: a view table from cache:view(i), or pages + layout (+ block_size, tensor_scale).
local function resolve_cache(o)
  local pages, L, bs, ts
  if o.cache ~= nil then
    local v = o.cache
    if type(v) ~= "table" or not core.is_tensor(v.pages) then
      fail("cache must be a cache view (cache:view(layer)) holding pages, layout and block_size")
    end
    if o.pages ~= nil then fail("give cache or pages, not both") end
    pages, L, bs, ts = v.pages, v.layout, v.block_size, v.tensor_scale
    if o.layout ~= nil and layout.get(o.layout) ~= layout.get(L) then
      fail("layout '%s' differs from the cache view's layout '%s'", layout.get(o.layout).name, layout.get(L).name)
    end
  else
    pages, L, bs, ts = o.pages, o.layout, o.block_size, o.tensor_scale
    if not core.is_tensor(pages) then fail("pass cache = cache:view(layer), or pages = a u8 tensor of pages with layout =") end
    if L == nil then fail("layout is required with pages (a layout name or mla.layout object)") end
    if bs == nil and pages:dim() == 3 then bs = pages:size(1) end
    if bs == nil then fail("block_size is required with [pages, page_bytes] pages") end
  end
  local ok, lay = pcall(layout.get, L)
  if not ok then fail("%s", lay) end
  if o.tensor_scale ~= nil and o.cache ~= nil then ts = o.tensor_scale end
  if ts ~= nil and not core.is_tensor(ts) then fail("tensor_scale must be an f32 tensor [1], got %s", shown(ts)) end
  if not math.tointeger(bs) or bs < 1 or bs > 0x7fffffff then
    fail("block_size must be a positive integer below 2^31, got %s", tostring(bs))
  end
  return pages, lay, bs, ts
end

-- An index tensor as contiguous i32 on `device` (integer dtypes only).
local function index_tensor(t, name, device)
  if t == nil then return nil end
  if not core.is_tensor(t) then fail("%s must be a tensor, got a %s", name, type(t)) end
  if core.dtype_info(t.dtype).is_float then fail("%s must hold integers (i32), got %s", name, t.dtype) end
  if t.dtype ~= "i32" then t = t:to("i32") end
  if t.device ~= device then t = t:to(device) end
  return t:is_contiguous() and t or t:contiguous()
end

local function float_tensor(t, name, device)
  if t == nil then return nil end
  if not core.is_tensor(t) then fail("%s must be a tensor, got a %s", name, type(t)) end
  if not core.dtype_info(t.dtype).is_float then fail("%s must be a float tensor (f32), got %s", name, t.dtype) end
  if t.dtype ~= "f32" then t = t:to("f32") end
  if t.device ~= device then t = t:to(device) end
  return t:is_contiguous() and t or t:contiguous()
end

-- JIT modules, one per (layout, block size, arch).
local jit_modules = {}
local function jit_module(L, bs)
  local key = L.name .. "/" .. bs
  local m = jit_modules[key]
  if not m then
    m = mla.rtc.compile { file = "attn_decode.cu", layout = L, block_size = bs }
    jit_modules[key] = m
  end
  return m
end

--- The options as the bindings take them, plus what the caller needs.
function M.prepare(o)
  if type(o) ~= "table" then error("attention.decode: an options table is expected", 2) end
  options.check("attention.decode", o, KNOWN, 3)
  local pages, L, bs, ts = resolve_cache(o)
  local q = o.q
  if not core.is_tensor(q) then fail("q must be a bf16 tensor [b, s_q, h_q, d_qk]") end
  if q.dtype ~= "bf16" then fail("q must be bf16, got %s", q.dtype) end
  if q:dim() ~= 4 then fail("q must be [b, s_q, h_q, d_qk], got %s", shape_str(q)) end
  if q:size(3) ~= L.k_dims then
    fail("q has d_qk = %d but layout '%s' stores K as %d dims", q:size(3), L.name, L.k_dims)
  end
  local impl = o.impl or (pages:is_cuda() and "baked" or "ref")
  if impl ~= "ref" and impl ~= "baked" and impl ~= "jit" then fail("impl must be 'ref', 'baked' or 'jit', got %s", tostring(impl)) end
  if impl ~= "ref" and not pages:is_cuda() then fail("impl '%s' runs on a GPU: the cache pages are on the CPU", impl) end
  local device = impl == "ref" and "cpu" or pages.device
  if impl ~= "ref" and q.device ~= device then fail("q is on %s but the cache is on %s", q.device, device) end
  if layout.has_tensor_scale(L) and ts == nil then
    fail("layout '%s' has a per-tensor scale: pass tensor_scale (f32 [1]) or a cache view", L.name)
  end
  local sparse = o.indices ~= nil
  if sparse and (o.block_table ~= nil or o.cache_lens ~= nil) then
    fail("pass indices (sparse) or block_table and cache_lens (dense), not both")
  end
  if not sparse and (o.block_table == nil or o.cache_lens == nil) then
    fail("dense decode needs block_table and cache_lens; sparse decode needs indices")
  end
  if o.specialize ~= nil and type(o.specialize) ~= "boolean" and o.specialize ~= "slice" and o.specialize ~= "wide" then
    fail("specialize must be true, false (the generic kernel), \"slice\" (the V-slice kernel for 16-row tiles) or "
      .. "\"wide\" (64-row tiles), got %s", shown(o.specialize))
  end
  if o.splits ~= nil and math.type(o.splits) ~= "integer" then fail("splits must be an integer, got %s", shown(o.splits)) end
  if sparse and o.causal then fail("causal applies to dense decode; sparse queries see exactly their indices") end
  if o.causal_tail ~= nil and type(o.causal_tail) ~= "boolean" then fail("causal_tail must be a boolean, got %s", shown(o.causal_tail)) end
  if not sparse and o.topk_len ~= nil then fail("topk_len applies to sparse decode (with indices)") end
  local scale = o.scale or 1 / math.sqrt(L.k_dims)
  if type(scale) ~= "number" or scale ~= scale or scale <= 0 or scale == math.huge then
    fail("scale must be a finite positive number, got %s", tostring(scale))
  end
  local b, s_q, h_q = q:size(0), q:size(1), q:size(2)
  local a = {
    layout = L:packed(bs), pages = impl == "ref" and pages:to("cpu") or pages,
    tensor_scale = ts and (impl == "ref" and ts:to("cpu") or ts),
    q = impl == "ref" and q:to("cpu") or q, scale = scale,
    indices = index_tensor(o.indices, "indices", device),
    topk_len = index_tensor(o.topk_len, "topk_len", device),
    block_table = index_tensor(o.block_table, "block_table", device),
    cache_lens = index_tensor(o.cache_lens, "cache_lens", device),
    sink = float_tensor(o.sink, "sink", device),
    causal = not sparse and (o.causal == nil or o.causal == true),
    check = o.check, splits = o.splits, specialize = o.specialize, causal_tail = o.causal_tail,
  }
  local out_dt = impl == "ref" and "f32" or "bf16"
  a.out = o.out or core.empty({ b, s_q, h_q, L.v_dims }, { dtype = out_dt, device = device })
  a.lse = o.lse or core.empty({ b, h_q, s_q }, { dtype = "f32", device = device })
  return a, { impl = impl, layout = L, block_size = bs, sparse = sparse }
end

local function run_jit(a, info)
  local L, q = info.layout, a.q
  local b, s_q, h_q = q:size(0), q:size(1), q:size(2)
  if a.check ~= false then core.attn_check(a) end -- index values, as the other paths check them
  local mod = jit_module(L, info.block_size)
  local view = mla.rtc.cache_view(a.pages, L, { block_size = info.block_size, tensor_scale = a.tensor_scale })
  local rows = info.sparse and h_q or s_q * h_q
  local problems = info.sparse and b * s_q or b
  if rows == 0 or problems == 0 then return end
  local topk = a.indices and a.indices:size(2) or 0
  mod:kernel("attn_decode_jit"):launch {
    grid = { rows, problems }, block = 128,
    args = { view, q, q:stride(0), q:stride(1), q:stride(2), q:stride(3), s_q, h_q, info.sparse and 1 or 0,
      a.causal and 1 or 0, a.block_table or 0, a.block_table and a.block_table:size(1) or 0, a.cache_lens or 0,
      a.indices or 0, topk, a.topk_len or 0, a.sink or 0, a.scale, a.out, a.lse },
  }
end

--- mla.attention.decode{...} -> out, lse [, plan]
function M.decode(o)
  local a, info = M.prepare(o)
  if info.impl == "ref" then
    core.attn_decode_ref(a)
    return a.out, a.lse
  elseif info.impl == "baked" then
    local plan = core.attn_decode(a)
    return a.out, a.lse, plan
  end
  run_jit(a, info)
  return a.out, a.lse
end

--- What the last baked launch ran: "generic", a built-in layout's name, or "none".
function M.last_variant() return core.attn_last_variant() end

-- FLOPs and bytes of a call: mlalab.attention_bench (cost).

return M
