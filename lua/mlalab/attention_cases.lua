--- Decode-attention cases for specs, benches and sweeps: a cache written
-- through its layout (quantize-then-dequantize data, so a comparison with
-- the reference measures kernel error only), block tables over randomly
-- permuted pages (unused entries hold garbage, as FlashMLA's tests do),
-- sparse index lists with -1 holes, and every byte no query may read set to
-- 0xff (NaN in every float format) so a stray read shows.
--
--   local C = mla.attention_cases
--   local case = C.dense{ layout = "fp8_ds_mla", b = 4, s_q = 1, h_q = 16, lens = {0, 100, 700, 1300} }
--   local out, lse = mla.attention.decode(C.args(case, { impl = "baked" }))
--
-- Options (both): layout, b, s_q, h_q, block_size = 64, device (default
-- device), num_layers = 1, layer = 0, order = "layer_major" | "block_major",
-- page_pad = 0, extra_blocks = 0, q_pad = false (q as a strided view),
-- q_std = 3, kv_std = 0.1 (FlashMLA's KV scale, randn/10; q larger so
-- scores spread with std ~0.3 at d^-0.5 instead of FlashMLA's ~0.01), seed, fill = "write" | "replicate" (benches: write
-- `template_pages` pages through the layout, copy them over the rest).
-- dense: lens = {..} or len = n, kv_ramp = {lo, hi} (position t of a request of n tokens drawn with
-- std kv_std x 2^(lo + (hi - lo + 1) t // n), capped at 2^hi: scale exponents that rise, or with
-- lo > hi fall, along the request), kv_dims = {d0, d1, gain}: dims [d0, d1) of every row drawn with
-- gain x that std instead (0: zeros), e.g. RoPE dims far larger than the rest. sparse: topk, pool = tokens holding data,
-- invalid = fraction of -1 entries, empty_rows = {{r, i}, ...} all -1,
-- topk_len = {..} (or true: random lengths), unique = true (distinct slots per row).
local mla = require "mlalab"
local core = mla.core
local layout = require "mlalab.layout"

local M = {}

M.GARBAGE = 2147480000 -- FlashMLA's filler for unused block-table entries

-- xorshift64*: deterministic draws from one seed, independent of the tensor RNG
local function rng(seed)
  local s = (seed or mla.next_seed()) ~ 0x2545F4914F6CDD1D
  if s == 0 then s = 1 end
  return function(n)
    s = s ~ (s >> 12); s = s ~ (s << 25); s = s ~ (s >> 27)
    local v = (s * 0x2545F4914F6CDD1D) >> 11 -- logical shift: non-negative
    return v % n
  end
end
M.rng = rng

local function permutation(n, draw)
  local p = {}
  for i = 1, n do p[i] = i - 1 end
  for i = n, 2, -1 do
    local j = draw(i) + 1
    p[i], p[j] = p[j], p[i]
  end
  return p
end

local function new_cache(o, num_blocks)
  local c = mla.cache.new { layout = o.layout, num_blocks = num_blocks, block_size = o.block_size or 64,
    num_layers = o.num_layers or 1, order = o.order or "layer_major", page_pad = o.page_pad or 0, device = o.device,
    tensor_scale = o.tensor_scale }
  for _, buf in ipairs(c.buffers) do buf:fill(255) end -- NaN everywhere until written
  return c
end

-- Rows of std `std` (kv_dims: some dims at gain x std, or zero).
local function draw_rows(o, n, dim, std)
  local x = mla.randn({ n, dim }, { std = std, device = "cpu" })
  local kd = o.kv_dims
  if kd then
    local v = x:narrow(1, kd[1], kd[2] - kd[1])
    if kd[3] == 0 then v:fill(0) else v:normal_(0, std * kd[3]) end
  end
  return x
end

-- Every option dense and sparse cases read (the header lists them).
local OPTION_NAMES = { "layout", "b", "s_q", "h_q", "block_size", "device", "num_layers", "layer", "order", "page_pad",
  "extra_blocks", "extra_columns", "q_pad", "q_std", "kv_std", "seed", "fill", "template_pages", "tensor_scale", "lens", "len",
  "kv_ramp", "kv_dims", "topk", "pool", "invalid", "empty_rows", "topk_len", "unique" }

local function check_options(fn, o)
  if type(o) ~= "table" then error(fn .. ": an options table is expected", 3) end
  require("mlalab.options").check(fn, o, OPTION_NAMES, 3)
end

-- kv_dims as draw_rows reads it; an error names the caller of dense / sparse.
local function check_kv_dims(o, L)
  local kd = o.kv_dims
  if kd == nil then return end
  local d0, d1, g
  if type(kd) == "table" then d0, d1, g = kd[1], kd[2], kd[3] end
  if math.type(d0) == "integer" and math.type(d1) == "integer" and type(g) == "number"
      and 0 <= d0 and d0 < d1 and d1 <= L.dim and g >= 0 then return end
  local got = type(kd) == "table" and string.format("{%s, %s, %s}", tostring(d0), tostring(d1), tostring(g)) or tostring(kd)
  error(string.format("attention_cases: kv_dims must be {d0, d1, gain} with 0 <= d0 < d1 <= %d (%s's dims) and "
    .. "gain >= 0, got %s", L.dim, L.name, got), 3)
end

-- Writes random rows into the given slots of the case's layer; gains[i]
-- (optional) multiplies the std of slot i's row.
local function write_rows(c, o, slots, gains)
  local L, layer = c.layout, o.layer or 0
  if #slots == 0 then return end
  if (o.fill or "write") == "write" then
    local i = 1
    while i <= #slots do -- runs of one gain
      local g, j = gains and gains[i] or 1, i
      while j < #slots and (gains and gains[j + 1] or 1) == g do j = j + 1 end
      local x = draw_rows(o, j - i + 1, L.dim, (o.kv_std or 0.1) * g)
      c:write(layer, x, mla.tensor(table.move(slots, i, j, 1, {}), "i64", "cpu"))
      i = j + 1
    end
    return
  end
  -- replicate: write template pages, then copy them page-block by page-block
  local pages = c:layer(layer)
  local nb, bs = c.num_blocks, c.block_size
  local tp = math.min(o.template_pages or 16, nb)
  local tslots = {}
  for i = 0, tp * bs - 1 do tslots[#tslots + 1] = i end
  local x = draw_rows(o, #tslots, L.dim, o.kv_std or 0.1)
  c:write(layer, x, mla.tensor(tslots, "i64", "cpu"))
  local done = tp
  while done < nb do
    local n = math.min(done, nb - done)
    pages:narrow(0, done, n):copy(pages:narrow(0, 0, n))
    done = done + n
  end
end

local function make_q(o, L)
  local shape = { o.b, o.s_q, o.h_q, L.k_dims }
  local dev = o.device
  if not o.q_pad then return mla.randn(shape, { std = o.q_std or 3, dtype = "bf16", device = dev }) end
  -- padded on every dim (last by 128, others by 1), then sliced back: FlashMLA's non-contiguity wrapper
  local big = mla.randn({ o.b + 1, o.s_q + 1, o.h_q + 1, L.k_dims + 128 }, { std = o.q_std or 3, dtype = "bf16", device = dev })
  return big:narrow(0, 1, o.b):narrow(1, 1, o.s_q):narrow(2, 1, o.h_q):narrow(3, 64, L.k_dims)
end

--- Dense case: per-request lengths over permuted pages.
function M.dense(o)
  check_options("attention_cases.dense", o)
  local L = layout.get(o.layout)
  check_kv_dims(o, L)
  local bs = o.block_size or 64
  local lens = o.lens
  if not lens then
    lens = {}
    for r = 1, o.b do lens[r] = o.len end
  end
  assert(#lens == o.b, "attention_cases.dense: lens must have b entries")
  local draw = rng(o.seed)
  local need, max_blocks = 0, 1
  for r = 1, o.b do
    local nbk = (lens[r] + bs - 1) // bs
    need = need + nbk
    if nbk > max_blocks then max_blocks = nbk end
  end
  max_blocks = max_blocks + (o.extra_columns or 1) -- columns past the last used one hold garbage
  local num_blocks = need + (o.extra_blocks or 0)
  if num_blocks < 1 then num_blocks = 1 end
  local perm = permutation(num_blocks, draw)
  local bt, slots, gains, k = {}, {}, {}, 0
  local ramp = o.kv_ramp
  for r = 1, o.b do
    local row = {}
    for j = 1, max_blocks do row[j] = M.GARBAGE end
    local nbk = (lens[r] + bs - 1) // bs
    for j = 1, nbk do
      k = k + 1
      row[j] = perm[k]
      local n = math.min(bs, lens[r] - (j - 1) * bs)
      for t = 0, n - 1 do
        slots[#slots + 1] = perm[k] * bs + t
        if ramp then
          local pos, lo, hi = (j - 1) * bs + t, ramp[1], ramp[2]
          local step = lo <= hi and 1 or -1
          local e = lo + step * ((math.abs(hi - lo) + 1) * pos // lens[r])
          if step * (e - hi) > 0 then e = hi end
          gains[#slots] = 2.0 ^ e
        end
      end
    end
    bt[r] = row
  end
  local c = new_cache(o, num_blocks)
  write_rows(c, o, slots, ramp and gains or nil)
  local dev = c.device
  return {
    kind = "dense", layout = L, cache = c, view = c:view(o.layer or 0), q = make_q(o, L),
    block_table = mla.tensor(bt, "i32", dev), cache_lens = mla.tensor(lens, "i32", dev),
    lens = lens, b = o.b, s_q = o.s_q, h_q = o.h_q, block_size = bs, written = #slots,
  }
end

--- Sparse case: every (request, query) row lists topk slots of a pool of
-- written tokens, with -1 holes; some rows all -1; optional topk_len.
function M.sparse(o)
  check_options("attention_cases.sparse", o)
  local L = layout.get(o.layout)
  check_kv_dims(o, L)
  local bs = o.block_size or 64
  local draw = rng(o.seed)
  local pool = o.pool or math.max(o.topk * 2, bs)
  local num_blocks = (pool + bs - 1) // bs + (o.extra_blocks or 1)
  local perm = permutation(num_blocks * bs, draw) -- pool tokens scattered over all slots
  local pool_slots = {}
  for i = 1, pool do pool_slots[i] = perm[i] end
  local empty = {}
  for _, e in ipairs(o.empty_rows or {}) do empty[e[1] * 1000003 + e[2]] = true end
  local tl
  if o.topk_len == true then
    tl = {}
    for r = 1, o.b do tl[r] = draw(o.topk + 1) end
  elseif o.topk_len then
    tl = o.topk_len
  end
  local idx = {}
  for r = 0, o.b - 1 do
    local rr = {}
    for i = 0, o.s_q - 1 do
      local row = {}
      local pick = o.unique ~= false and permutation(pool, draw) or nil
      for j = 1, o.topk do
        local v
        if empty[r * 1000003 + i] then v = -1
        elseif tl and j > tl[r + 1] then v = (j % 3 == 0) and M.GARBAGE or -1 -- never read: garbage past topk_len
        elseif o.invalid and draw(1000000) < o.invalid * 1000000 then v = -1
        else v = pool_slots[(pick and pick[((j - 1) % pool) + 1] or draw(pool)) + 1] end
        row[j] = v
      end
      rr[i + 1] = row
    end
    idx[r + 1] = rr
  end
  local c = new_cache(o, num_blocks)
  write_rows(c, o, pool_slots)
  local dev = c.device
  return {
    kind = "sparse", layout = L, cache = c, view = c:view(o.layer or 0), q = make_q(o, L),
    indices = mla.tensor(idx, "i32", dev), topk_len = tl and mla.tensor(tl, "i32", dev) or nil,
    b = o.b, s_q = o.s_q, h_q = o.h_q, topk = o.topk, block_size = bs, written = #pool_slots,
  }
end

--- Arguments of mla.attention.decode for a case, plus extra options.
function M.args(case, extra)
  local a = { q = case.q, cache = case.view }
  if case.kind == "dense" then a.block_table, a.cache_lens = case.block_table, case.cache_lens
  else a.indices, a.topk_len = case.indices, case.topk_len end
  for k, v in pairs(extra or {}) do a[k] = v end
  return a
end

--- Attended keys of a case: the sum of lengths (dense; no causal trimming)
-- or of valid index entries within topk_len (sparse). Each is one cached
-- token row read from memory (sparse rows of one request are not deduplicated).
function M.attended(case)
  local n = 0
  if case.kind == "dense" then
    for _, l in ipairs(case.lens) do n = n + l end
    return n
  end
  local tl = case.topk_len and case.topk_len:to("cpu"):totable() or nil
  for r, rr in ipairs(case.indices:to("cpu"):totable()) do
    for _, row in ipairs(rr) do
      for j = 1, tl and tl[r] or #row do
        if row[j] >= 0 then n = n + 1 end
      end
    end
  end
  return n
end

return M
