--- Every KV kernel and attention through the cross-layer equivalence check
-- (vLLM #45111 as one table): each kernel runs on a contiguous cache and on
-- layer 37 of a 61-layer block-major cache (page stride 61 x page bytes,
-- neighbours poisoned); outputs must be bit-identical, the cache bytes equal,
-- no neighbour byte changed, and the check not dead (mla.equivalence).
--
--   mlalab experiments/cross_layer.lua [--device cpu] [--blocks N] [--quiet]
--
-- Then a deliberately wrong JIT kernel (experiments/kernels/token_rows.cu
-- <true>: page base page * block_size * entry instead of the view's page
-- stride) must be caught, next to its correct twin. On a GPU: the baked
-- kernels, the JIT twins (kv_write, kv_gather, attn_decode) and one view
-- whose pages lie past 4 GiB (64-bit offsets). On a CPU: the CPU references
-- run the same checks; the JIT kernels are compiled (sm_90a) but cannot
-- launch, and the packed-page bug runs as a CPU model (the pages re-strided
-- the packed way, read by the reference). Exits 1 when a check fails.
local mla = require "mlalab"
local E = mla.experiment
local K = mla.kernels

local a = E.args({ ... }, { blocks = "number", quiet = "flag" }, "cross_layer")
local gpu = mla.device() ~= "cpu"
local dev = mla.device()
local LAYERS, LAYER = 61, 37
local BS = gpu and 64 or 16
local BLOCKS = a.blocks or (gpu and 16 or 6)
local BAKED = gpu and "baked" or "ref"
mla.manual_seed(45111)
E.banner(string.format("cross-layer equivalence, layer %d of a %d-layer block-major cache, %d blocks of %d tokens",
  LAYER, LAYERS, BLOCKS, BS))
if not gpu then
  print("note: no GPU: 'ref' rows run the CPU reference kernels; JIT rows are compiled for sm_90a, not launched ('cc')")
end
local v = E.verdicts()
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "experiments"

local LAYOUTS = { "bf16", "fp8_pertensor", "fp8_ds_mla", "fp8_v4", "indexer_fp8" }
local ATTN_LAYOUTS = { "bf16", "fp8_pertensor", "fp8_ds_mla", "fp8_v4" }
local TS = 2 ^ -6 -- the per-tensor scale of fp8_pertensor

-- Per layout: written pages on the host (every slot), the scale, index sets.
local data = {}
local function setup(name, blocks)
  local key = name .. "/" .. blocks
  if data[key] then return data[key] end
  local L = mla.layout.get(name)
  local n = blocks * BS
  local host = mla.zeros({ blocks, L:page_bytes(BS) }, "u8", "cpu")
  local ts = L:has_tensor_scale() and mla.full({ 1 }, TS, "f32", "cpu") or nil
  mla.layout_ref.write(L, host, mla.randn({ n, L.dim }, { std = 0.5, dtype = "bf16", device = "cpu" }),
    mla.arange(n, "i64", "cpu"), { block_size = BS, tensor_scale = ts })
  local draw = mla.attention_cases.rng(mla.next_seed())
  local slots, pages = {}, {}
  for i = 1, n do slots[i] = (i % 7 == 0) and -1 or draw(n) end
  for i = 1, blocks do pages[i] = i - 1 end
  for i = blocks, 2, -1 do local j = draw(i) + 1 pages[i], pages[j] = pages[j], pages[i] end
  -- writes need distinct slots: two tokens racing for one slot leave either's bytes on a GPU
  local wslots = {}
  for i = 1, n do wslots[i] = i - 1 end
  for i = n, 2, -1 do local j = draw(i) + 1 wslots[i], wslots[j] = wslots[j], wslots[i] end
  for i = 7, n, 7 do wslots[i] = -1 end
  local half = blocks // 2
  local bt = { {}, {} }
  for i = 1, half do bt[1][i] = pages[i] end
  for i = half + 1, blocks do bt[2][i - half] = pages[i] end
  for i = #bt[2] + 1, half do bt[2][i] = mla.attention_cases.GARBAGE end
  while #bt[1] < #bt[2] do bt[1][#bt[1] + 1] = mla.attention_cases.GARBAGE end
  local d = {
    L = L, host = host, n = n, blocks = blocks, ts = ts and ts:to(dev),
    slots = mla.tensor(slots, "i32", dev), wslots = mla.tensor(wslots, "i32", dev), bt = mla.tensor(bt, "i32", dev),
    lens = { half * BS - 3, (blocks - half) * BS },
    rows = mla.randn({ n, L.dim }, { std = 0.5, dtype = "bf16", device = dev }),
  }
  d.cu = mla.tensor({ 0, d.lens[1], d.lens[1] + d.lens[2] }, "i32", dev)
  local idx = { { {} }, { {} } } -- sparse attention: [2, 1, 128] slot ids cycling through `slots`
  for j = 1, 128 do idx[1][1][j], idx[2][1][j] = slots[j % n + 1], slots[(j + 61) % n + 1] end
  d.indices = mla.tensor(idx, "i32", dev)
  data[key] = d
  return d
end

local function view_of(d, t) return { pages = t, layout = d.L, block_size = BS, tensor_scale = d.ts } end

-- Checks: kernel name, impl, layout, and the equivalence spec (or compile-only).
local results = {} -- [kernel .. "|" .. impl][layout] = cell
local order = {}
local function record(kernel, impl, layout, ok, cell, detail)
  local key = kernel .. "|" .. impl
  if not results[key] then results[key] = {} order[#order + 1] = { kernel = kernel, impl = impl, key = key } end
  results[key][layout] = cell
  v:add(string.format("%s (%s) on %s", kernel, impl, layout), ok, detail)
end

local function equivalence(kernel, impl, layout, kind, run, blocks)
  local d = setup(layout, blocks or BLOCKS)
  local spec = { name = kernel, kind = kind, page_bytes = d.L:page_bytes(BS), blocks = d.blocks, layers = LAYERS,
    layer = LAYER, device = dev,
    run = function(t, ctx) return run(d, view_of(d, t), ctx) end }
  if kind == "read" then spec.payload = function(t) t:copy(d.host) end end
  local ok, r = pcall(mla.equivalence, spec)
  if not ok then
    record(kernel, impl, layout, false, "ERROR", tostring(r))
    return nil
  end
  record(kernel, impl, layout, r.ok, r.ok and "PASS" or "FAIL", r.ok and "" or r:report())
  if not a.quiet and not r.ok then print(r:report()) end
  return r
end

local function compiled(kernel, file, layout, names)
  local ok, m = pcall(mla.rtc.compile, { file = file, layout = mla.layout.get(layout), block_size = BS, arch = "sm_90a",
    names = names })
  record(kernel, "jit", layout, ok, ok and "cc" or "ERROR", ok and "" or tostring(m))
  return ok and m or nil
end

-- Read kernels -----------------------------------------------------------------------------

for _, name in ipairs(LAYOUTS) do
  equivalence("gather_sparse", BAKED, name, "read", function(d, cv) return K.gather_sparse(cv, d.slots) end)
  equivalence("gather_dense", BAKED, name, "read", function(d, cv)
    return K.gather_dense(cv, d.bt, d.cu, { num_rows = d.lens[1] + d.lens[2] })
  end)
  equivalence("gather_raw", BAKED, name, "read", function(d, cv)
    local out = K.gather_raw(cv, d.bt, d.cu, { num_rows = d.lens[1] + d.lens[2] })
    local o = {}
    for i, t in ipairs(out) do o["region" .. i] = t end
    return o
  end)
end
equivalence("compact", BAKED, "fp8_ds_mla", "read", function(d, cv)
  local rows, remap = K.compact(cv, d.slots)
  return { rows = rows, remap = remap }
end)
equivalence("gather_referenced", BAKED, "fp8_ds_mla", "read", function(d, cv)
  local rows, remap = K.gather_referenced(cv, d.slots)
  return { rows = rows, remap = remap }
end)
equivalence("requant (read 576)", BAKED, "fp8_pertensor", "read", function(d, cv)
  local dst = mla.cache.new { layout = "fp8_ds_mla", num_blocks = d.blocks, block_size = BS, device = dev }
  dst:layer(0):fill(0)
  K.requant(cv, dst:view(0))
  return dst:layer(0)
end)

-- Write kernels ----------------------------------------------------------------------------

for _, name in ipairs(LAYOUTS) do
  equivalence("write", BAKED, name, "write", function(d, cv) K.write(cv, d.wslots, d.rows) end)
end
equivalence("requant (write 656)", BAKED, "fp8_ds_mla", "write", function(d, cv)
  local s = setup("fp8_pertensor", d.blocks)
  local src = s.host:to(dev)
  K.requant(view_of(s, src), cv)
end)

-- Attention ---------------------------------------------------------------------------------

local function attention(kind, impl)
  for _, name in ipairs(ATTN_LAYOUTS) do
    local q = mla.randn({ 2, 1, 16, mla.layout.get(name).k_dims }, { std = 3, dtype = "bf16", device = dev })
    equivalence("attention " .. kind, impl, name, "read", function(d, cv)
      local o = { q = q, cache = cv, impl = impl }
      if kind == "dense" then
        o.block_table, o.cache_lens = d.bt, mla.tensor(d.lens, "i32", dev)
      else
        o.indices = d.indices
      end
      local out, lse = mla.attention.decode(o)
      return { out = out, lse = lse }
    end)
  end
end
attention("dense", BAKED)
attention("sparse", BAKED)

-- JIT twins ----------------------------------------------------------------------------------

for _, name in ipairs(LAYOUTS) do
  if gpu then
    equivalence("kv_gather.cu", "jit", name, "read", function(d, cv) return mla.kv_jit.gather(cv, d.slots) end)
    equivalence("kv_write.cu", "jit", name, "write", function(d, cv) mla.kv_jit.write(cv, d.wslots, d.rows) end)
  else
    compiled("kv_gather.cu", "kv_gather.cu", name)
    compiled("kv_write.cu", "kv_write.cu", name)
  end
end
if gpu then
  attention("dense", "jit")
  attention("sparse", "jit")
else
  for _, name in ipairs(ATTN_LAYOUTS) do compiled("attn_decode.cu", "attn_decode.cu", name) end
end

-- 64-bit offsets: a view spanning more than 4 GiB ---------------------------------------------

if gpu then
  local big = 1000 -- 61 x 1000 pages of 73,728 B: block 960 starts past 2^32 bytes
  equivalence("gather_sparse >4GiB view", BAKED, "bf16", "read", function(d, cv) return K.gather_sparse(cv, d.slots) end, big)
end

-- Table ----------------------------------------------------------------------------------------

print()
local cols = {}
for _, n in ipairs(LAYOUTS) do cols[#cols + 1] = string.format("%-14s", n) end
print(string.format("%-26s %-5s %s", "kernel", "impl", table.concat(cols, "")))
for _, row in ipairs(order) do
  local cells = {}
  for _, n in ipairs(LAYOUTS) do cells[#cells + 1] = string.format("%-14s", results[row.key][n] or "") end
  print(string.format("%-26s %-5s %s", row.kernel, row.impl, table.concat(cells, "")))
end
print("PASS: outputs bit-identical, cache bytes equal, zero bleed into the 60 neighbour layers, not a dead check"
  .. (gpu and "" or "; cc: compiled, not launched"))

-- The deliberately wrong kernel ---------------------------------------------------------------

print("\n== a kernel that assumes packed pages (page * block_size * entry), next to its correct twin ==")
local file = here .. "/kernels/token_rows.cu"
local BUG_FMT = "%-40s %-11s %-6s %s"
print(string.format(BUG_FMT, "kernel", "layout", "result", "detail"))
for _, name in ipairs { "bf16", "fp8_ds_mla" } do
  local L = mla.layout.get(name)
  local mod = mla.rtc.compile { file = file, layout = L, block_size = BS, arch = not gpu and "sm_90a" or nil,
    names = { "token_rows<false>", "token_rows<true>" } }
  for _, packed in ipairs { false, true } do
    local label
    local run
    if gpu then
      label = string.format("token_rows<%s> (jit)", tostring(packed))
      run = function(d, cv)
        local row = L.regions[1].row_bytes
        local out = mla.zeros({ d.n, row }, "u8", dev)
        mod:kernel(string.format("token_rows<%s>", tostring(packed))):launch { grid = d.n, block = 128,
          args = { mla.rtc.cache_view(cv.pages, L, { block_size = BS, tensor_scale = d.ts }), d.slots, d.n, out } }
        return out
      end
    else
      -- the same addressing on the CPU: the view re-strided as packed pages, read by the reference
      label = string.format("token_rows<%s> (cpu model)", tostring(packed))
      run = function(d, cv)
        local p = cv.pages
        if packed then p = p:as_strided({ p:size(0), p:size(1) }, { d.L:page_bytes(BS), 1 }) end
        return K.gather_sparse({ pages = p, layout = L, block_size = BS, tensor_scale = d.ts }, d.slots)
      end
    end
    local d = setup(name, BLOCKS)
    local r = mla.equivalence { name = label, kind = "read", page_bytes = L:page_bytes(BS), blocks = BLOCKS, layers = LAYERS,
      layer = LAYER, device = dev, payload = function(t) t:copy(d.host) end, run = function(t) return run(d, view_of(d, t)) end }
    local detail
    for _, ch in ipairs(r.checks) do if not ch.ok then detail = ch.name .. ": " .. ch.detail break end end
    if packed then
      print(string.format(BUG_FMT, label, name, r.ok and "MISSED" or "caught", detail or "the check passed a wrong kernel"))
      v:add("packed-page kernel caught on " .. name, not r.ok, "the equivalence check passed a kernel that ignores the page stride")
    else
      print(string.format(BUG_FMT, label, name, r.ok and "PASS" or "FAIL", detail or "identical, zero bleed"))
      v:add("stride-aware twin passes on " .. name, r.ok, detail)
    end
  end
end
if not gpu then print("(token_rows.cu compiled for sm_90a; without a GPU its addressing runs as the CPU model above)") end
v:finish()
