--- The batch a pairing runs on (`mla.pair_scenario.new{...}`): one stored
-- pool, a few requests over randomly permuted pages, prefill queries (s_q
-- tokens per request, the last s_q positions of each), one decode query per
-- request, and the indexer's request-local top-k positions (-1 holes and
-- -1 padding), plus the CPU reference outputs on the stored cache.
--
-- The scenario is immutable from the outside: every pool slot holds random
-- bf16-representable rows from the start (other requests' tokens, so a
-- wrong index reads real but wrong data), and the decode phase rewrites the
-- decode tokens with the same rows each time, so several pairs can share one
-- scenario and its memoized references.
--
-- Reference slots are computed here in Lua from the block table, never with
-- the top-k transform kernels under test.
local mla = require "mlalab"
local layout = require "mlalab.layout"
local C = require "mlalab.attention_cases"

local M = {}
local Scenario = {}
Scenario.__index = Scenario
M.Scenario = Scenario

local function fail(fmt, ...) error("pair_scenario: " .. string.format(fmt, ...), 3) end

local function int(o, k, def, lo)
  local v = o[k] == nil and def or o[k]
  local i = math.tointeger(v)
  if not i or i < lo then fail("%s must be an integer >= %d, got %s", k, lo, tostring(v)) end
  return i
end

-- k distinct random values of [0, n) (partial Fisher-Yates), in draw order.
local function sample(n, k, draw)
  local a, out = {}, {}
  for j = 1, k do
    local i = j - 1 + draw(n - j + 1)
    local vi, vj = a[i] or i, a[j - 1] or (j - 1)
    a[i], a[j - 1] = vj, vi
    out[j] = vi
  end
  return out
end

-- One row of indexer output: positions of [0, visible) with holes, -1 padded.
local function topk_row(visible, topk, holes, draw)
  local row = sample(visible, math.min(topk, visible), draw)
  for j = 1, #row do
    if holes > 0 and draw(1000000) < holes * 1000000 then row[j] = -1 end
  end
  for j = #row + 1, topk do row[j] = -1 end
  return row
end

--- new{store = layout name, b = 2, kv_len = n | kv_lens = {...}, s_q = 4, h_q = 16, topk = 64,
--   block_size = 64, extra_blocks = (as many as the requests use), holes = 0.1, q_std = 3,
--   kv_std = 0.1, tensor_scale = 2^-8, device = default, seed = next}
-- kv_len counts the tokens before the decode token (prefix + prefill tokens);
-- the decode query sits at position kv_len.
function M.new(o)
  if type(o) ~= "table" then error("pair_scenario.new: an options table is expected", 2) end
  local L = layout.get(o.store or fail("store (the stored layout's name) is required"))
  local s = setmetatable({ layout = L, store = L.name }, Scenario)
  s.b = int(o, "b", 2, 1)
  s.s_q = int(o, "s_q", 4, 1)
  s.h_q = int(o, "h_q", 16, 1)
  s.topk = int(o, "topk", 64, 1)
  s.block_size = int(o, "block_size", 64, 1)
  s.holes = o.holes or 0.1
  s.device = o.device or mla.device()
  s.seed = o.seed or mla.next_seed()
  s.tensor_scale = o.tensor_scale or 2 ^ -8
  s.kv_std, s.q_std = o.kv_std or 0.1, o.q_std or 3
  local lens = o.kv_lens
  if not lens then
    lens = {}
    for r = 1, s.b do lens[r] = int(o, "kv_len", 256, 1) end
  end
  if #lens ~= s.b then fail("kv_lens has %d entries for b = %d requests", #lens, s.b) end
  for r, n in ipairs(lens) do
    if not math.tointeger(n) or n < s.s_q then
      fail("kv_lens[%d] = %s: each request needs at least s_q = %d tokens", r, tostring(n), s.s_q)
    end
  end
  s.kv_lens = lens
  local draw = C.rng(s.seed)
  s.draw = draw

  -- pages: each request owns ceil((kv_len + 1) / bs) pages (room for the decode token)
  local bs, need, maxb = s.block_size, 0, 1
  for _, n in ipairs(lens) do
    local nb = (n + 1 + bs - 1) // bs
    need, maxb = need + nb, math.max(maxb, nb)
  end
  s.num_blocks = need + int(o, "extra_blocks", need, 0)
  local perm = sample(s.num_blocks, s.num_blocks, draw)
  local bt, k = {}, 0
  for r = 1, s.b do
    local row = {}
    for j = 1, maxb + 1 do row[j] = C.GARBAGE end -- unused columns hold garbage, as FlashMLA's tests do
    for j = 1, (lens[r] + 1 + bs - 1) // bs do
      k = k + 1
      row[j] = perm[k]
    end
    bt[r] = row
  end
  s.bt = bt
  s.block_table = mla.tensor(bt, "i32", s.device)

  -- the pool: every slot written with random rows (bf16-representable)
  s.cache = mla.cache.new { layout = L, num_blocks = s.num_blocks, block_size = bs, device = s.device,
    tensor_scale = s.tensor_scale }
  s.pool_tokens = s.num_blocks * bs
  local rows = mla.randn({ s.pool_tokens, L.dim }, { std = s.kv_std, dtype = "bf16", device = s.device })
  s.cache:write(0, rows, mla.arange(s.pool_tokens, "i64", s.device))
  s.dec_rows = mla.randn({ s.b, L.dim }, { std = s.kv_std, dtype = "bf16", device = s.device })
  local ds = {}
  for r = 1, s.b do ds[r] = s:slot(r - 1, lens[r]) end
  s.dec_slots = mla.tensor(ds, "i64", s.device)

  -- queries and the indexer's top-k positions
  s.q = {
    prefill = mla.randn({ s.b, s.s_q, s.h_q, L.k_dims }, { std = s.q_std, dtype = "bf16", device = s.device }),
    decode = mla.randn({ s.b, 1, s.h_q, L.k_dims }, { std = s.q_std, dtype = "bf16", device = s.device }),
  }
  local pre, dec = {}, {}
  for r = 1, s.b do
    for i = 0, s.s_q - 1 do pre[#pre + 1] = topk_row(lens[r] - s.s_q + i + 1, s.topk, s.holes, draw) end
    dec[r] = topk_row(lens[r] + 1, s.topk, s.holes, draw)
  end
  s.positions = { prefill = pre, decode = dec }
  s.topk_pos = { prefill = mla.tensor(pre, "i32", s.device), decode = mla.tensor(dec, "i32", s.device) }
  s.refs = {}
  return s
end

--- Slot of request r's (0-based) position p: block_table[r, p / bs] * bs + p % bs.
function Scenario:slot(r, p)
  local bs = self.block_size
  return self.bt[r + 1][p // bs + 1] * bs + p % bs
end

--- Query tokens per request and cache lengths of a phase.
function Scenario:shape(phase)
  if phase == "prefill" then return self.s_q, self.kv_lens end
  local lens = {}
  for r, n in ipairs(self.kv_lens) do lens[r] = n + 1 end
  return 1, lens
end

--- Exclusive prefix sum of the phase's cache lengths: rows of ragged K.
function Scenario:cu_k(phase)
  local _, lens = self:shape(phase)
  local cu = { 0 }
  for r, n in ipairs(lens) do cu[r + 1] = cu[r] + n end
  return cu
end

function Scenario:q_lens(phase)
  local s_q = self:shape(phase)
  local ql = {}
  for r = 1, self.b do ql[r] = s_q end
  return ql
end

--- The stored pool as kernels take it (layer 0).
function Scenario:view() return self.cache:view(0) end

--- Writes the decode tokens (the decode step's quantize-and-cache; idempotent).
function Scenario:write_decode_tokens()
  self.cache:write(0, self.dec_rows, self.dec_slots)
end

--- Reference slot ids [b, s_q, topk] (i32, CPU) of a phase: the top-k
-- positions mapped through the block table in Lua.
function Scenario:ref_indices(phase)
  local key = "idx_" .. phase
  if self.refs[key] then return self.refs[key] end
  local s_q = self:shape(phase)
  local pos, out = self.positions[phase], {}
  for r = 0, self.b - 1 do
    local rr = {}
    for i = 0, s_q - 1 do
      local row, src = {}, pos[r * s_q + i + 1]
      for j, p in ipairs(src) do row[j] = p < 0 and -1 or self:slot(r, p) end
      rr[i + 1] = row
    end
    out[r + 1] = rr
  end
  self.refs[key] = mla.tensor(out, "i32", "cpu")
  return self.refs[key]
end

--- The query tokens compared with the reference: the last `check_q` of each
-- request (all by default). Rows are independent for sparse attention, and
-- the causal diagonal s_k - s_q + i keeps the last queries' masks.
function Scenario:checked(phase, check_q)
  local s_q = self:shape(phase)
  local n = math.min(check_q or s_q, s_q)
  return s_q - n, n
end

--- CPU reference (out f32, lse) of a phase on a cache view `view` (default:
-- the stored pool), "sparse" over the top-k slots or "dense" (causal) over
-- whole requests, for the checked queries. Memoized by `key`.
function Scenario:reference(phase, kind, check_q, view, key)
  key = string.format("%s/%s/%s/%s", key or "stored", phase, kind, tostring(check_q))
  local hit = self.refs[key]
  if hit then return hit[1], hit[2] end
  if phase == "decode" then self:write_decode_tokens() end
  local lo, n = self:checked(phase, check_q)
  local a = { q = self.q[phase]:narrow(1, lo, n), cache = view or self:view(), impl = "ref" }
  if kind == "sparse" then
    a.indices = self:ref_indices(phase):narrow(1, lo, n)
  else
    local _, lens = self:shape(phase)
    a.block_table, a.cache_lens = self.block_table, mla.tensor(lens, "i32", "cpu")
  end
  local out, lse = mla.attention.decode(a)
  self.refs[key] = { out, lse }
  return out, lse
end

--- Context tokens the batch references in a phase (what a ragged gather moves).
function Scenario:ctx_tokens(phase)
  local cu = self:cu_k(phase)
  return cu[#cu]
end

function Scenario:__tostring()
  return string.format("scenario(%s, %d requests of %s tokens, s_q %d, %d heads, top-k %d, pool %d tokens, %s)",
    self.store, self.b, table.concat(self.kv_lens, "/"), self.s_q, self.h_q, self.topk, self.pool_tokens, self.device)
end

return M
