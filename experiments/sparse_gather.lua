--- Sparse vs dense gather-dequant, and compaction vs per-token gather
-- (../shared/reference/kernels-and-indices.md §2, §3, §5; the vLLM sparse
-- gather and #42248 / #42576 seeds).
--
--   mlalab experiments/sparse_gather.lua [--device cpu] [--layout fp8_ds_mla] [--out DIR] [--quick]
--
-- 1. Dense: gather_dense of every token of 4 requests (N rows in total) from
--    a paged pool into bf16 rows. Sparse: gather_sparse of density x N of
--    those tokens by slot id. Times (mla.bench, cold L2), GB/s (cache bytes
--    read + bf16 bytes written), and the speed-up of sparse over dense, for
--    densities 3% .. 100% and N = 16K .. 262K rows (CPU: 2K .. 16K). Each
--    point checks that the sparse rows equal the dense rows at the same
--    positions, bit for bit. JSON lines, CSV and an SVG plot under --out.
-- 2. Compaction (dequantize the referenced pages, remap: value-dependent
--    shapes, a host sync) vs per-token gather (one row per index, remap =
--    position: shapes from the index shape, graph-safe), for top-k indices
--    touching 5% .. 100% of the pool's pages; both must address identical rows.
-- Exits 1 when a check fails.
local mla = require "mlalab"
local E = mla.experiment
local K = mla.kernels
local C = mla.attention_cases

local a = E.args({ ... }, { layout = "string", out = "string", quick = "flag" }, "sparse_gather")
local gpu = mla.device() ~= "cpu"
local dev = mla.device()
local L = mla.layout.get(a.layout or "fp8_ds_mla")
local OUT = a.out or "out/sparse_gather"
local BS = 64
local LENGTHS = gpu and (a.quick and { 16384, 65536 } or { 16384, 32768, 65536, 131072, 262144 })
  or (a.quick and { 2048 } or { 2048, 8192, 16384 })
local DENSITIES = { 0.03, 0.12, 0.25, 0.5, 1.0 }
local BENCH = gpu and { max_time = 1 } or { min_samples = 3, max_time = 0.2, max_noise = 0.05 }
mla.manual_seed(42248)
E.banner(string.format("sparse vs dense gather-dequant of %s rows (%d B/token -> bf16 %d dims)", L.name, L.token_bytes, L.dim))
if not gpu then print("note: no GPU: the CPU reference kernels are timed (wall clock), at smaller lengths") end
local v = E.verdicts()
local ROW_OUT = L.dim * 2

-- mla.bench options: the device's defaults plus these.
local function bopts(extra)
  local o = {}
  for k, x in pairs(BENCH) do o[k] = x end
  for k, x in pairs(extra) do o[k] = x end
  return o
end

-- k distinct random values of [0, n)
local function sample(n, k, draw)
  local idx, out = {}, {}
  for j = 1, k do
    local i = j - 1 + draw(n - j + 1)
    local vi, vj = idx[i] or i, idx[j - 1] or (j - 1)
    idx[i], idx[j - 1] = vj, vi
    out[j] = vi
  end
  return out
end

-- A pool holding 4 requests of N/4 tokens each on permuted pages, plus as many free pages.
local pools = {}
local function pool(n)
  if pools[n] then return pools[n] end
  local draw = C.rng(mla.next_seed())
  local pages_per_req = (n // 4 + BS - 1) // BS
  local nb = 8 * pages_per_req
  local c = mla.cache.new { layout = L, num_blocks = nb, block_size = BS, device = dev, tensor_scale = 2 ^ -6 }
  c:write(0, mla.randn({ nb * BS, L.dim }, { std = 0.5, dtype = "bf16", device = dev }), mla.arange(nb * BS, "i64", dev))
  local perm = sample(nb, nb, draw)
  local bt, slot_of = {}, {}
  for r = 1, 4 do
    bt[r] = {}
    for j = 1, pages_per_req do bt[r][j] = perm[(r - 1) * pages_per_req + j] end
    for p = 0, n // 4 - 1 do slot_of[#slot_of + 1] = bt[r][p // BS + 1] * BS + p % BS end
  end
  local q = n // 4
  pools[n] = { cache = c, view = c:view(0), bt = mla.tensor(bt, "i32", dev), cu = mla.tensor({ 0, q, 2 * q, 3 * q, 4 * q }, "i32", dev),
    n = 4 * q, slot_of = slot_of, draw = draw, nb = nb }
  return pools[n]
end

-- 1. Sparse vs dense ------------------------------------------------------------------------

print("\n== 1. sparse (by slot id) vs dense (whole requests) gather-dequant ==")
local res = mla.sweep {
  name = "sparse_gather", params = { { "rows", LENGTHS }, { "density", DENSITIES } },
  jsonl = OUT .. "/sparse_gather.jsonl", csv = OUT .. "/sparse_gather.csv", progress = false, table = false,
  plot = { file = OUT .. "/sparse_gather.svg", x = "density", y = "speedup", series = "rows", logx = true,
    title = L.name .. ": sparse gather speed-up over dense gather vs density" },
  run = function(p)
    local P = pool(p.rows)
    local n = P.n
    local k = math.max(1, math.floor(p.density * n + 0.5))
    local pos = sample(n, k, P.draw) -- positions in the concatenated requests = rows of the dense output
    local slots = {}
    for i, x in ipairs(pos) do slots[i] = P.slot_of[x + 1] end
    local st, pt = mla.tensor(slots, "i32", dev), mla.tensor(pos, "i32", dev)
    local dense_out = mla.empty({ n, L.dim }, "bf16", dev)
    local sparse_out = mla.empty({ k, L.dim }, "bf16", dev)
    K.gather_dense(P.view, P.bt, P.cu, { out = dense_out, num_rows = n })
    K.gather_sparse(P.view, st, { out = sparse_out })
    -- the sparse rows are the dense rows at the same positions, bit for bit
    local flat = { pages = dense_out:view("u8"), layout = "bf16", block_size = 1 }
    local same = mla.compare(K.gather_sparse(flat, pt), sparse_out, "exact")
    local bd = mla.bench(function() K.gather_dense(P.view, P.bt, P.cu, { out = dense_out, num_rows = n, check = false }) end,
      bopts({ name = "dense", bytes = n * (L.token_bytes + ROW_OUT) }))
    local bsp = mla.bench(function() K.gather_sparse(P.view, st, { out = sparse_out, check = false }) end,
      bopts({ name = "sparse", bytes = k * (L.token_bytes + ROW_OUT + 4) }))
    v:add(string.format("sparse rows == dense rows (N %d, density %g)", n, p.density), same.ok and same.compared > 0,
      same.reasons[1])
    return { sparse_rows = k, dense_us = bd.median * 1e6, sparse_us = bsp.median * 1e6, dense_gbs = bd.gbs,
      sparse_gbs = bsp.gbs, speedup = bd.median / bsp.median, rows_equal = same.ok and "yes" or "NO" }
  end,
}
local SFMT = "%8s %8s %9s %11s %11s %9s %9s %9s  %s"
print(string.format(SFMT, "rows", "density", "gathered", "dense", "sparse", "dense", "sparse", "speed-up", "rows equal"))
print(string.format(SFMT, "", "", "", "", "", "GB/s", "GB/s", "", ""))
for _, r in ipairs(res.records) do
  if r.status == "OK" then
    print(string.format(SFMT, r.rows, string.format("%g%%", r.density * 100), r.sparse_rows, E.us(r.dense_us / 1e6),
      E.us(r.sparse_us / 1e6), string.format("%.1f", r.dense_gbs), string.format("%.1f", r.sparse_gbs),
      string.format("%.2fx", r.speedup), r.rows_equal))
  else
    print(string.format("%8s %8s  %s: %s", r.rows, r.density, r.status, tostring(r.error)))
  end
end
for _, r in ipairs(res.records) do
  v:add(string.format("point N %d density %g ran", r.rows, r.density), r.status == "OK", r.error)
end
if gpu then
  local best
  for _, r in ipairs(res.records) do
    if r.status == "OK" and r.density == DENSITIES[1] and r.rows == LENGTHS[#LENGTHS] then best = r end
  end
  v:add("sparse beats dense at 3% density on the longest pool", best and best.speedup > 1,
    best and string.format("speed-up %.2f", best.speedup) or "no point")
end
if mla.bench_mod.memcpy_bandwidth() then
  print(string.format("cudaMemcpy D2D in the same run: %.0f GB/s", mla.bench_mod.memcpy_bandwidth()))
end
print(string.format("files: %s/sparse_gather.{jsonl,csv,svg}", OUT))

-- 2. Compaction vs per-token gather ------------------------------------------------------------

print("\n== 2. compaction of referenced pages vs graph-safe per-token gather ==")
local N = LENGTHS[#LENGTHS]
local P = pool(N)
local T, TOPK = gpu and 64 or 16, gpu and 2048 or 256
local CFMT = "%-10s %8s %12s %12s %11s %11s %9s  %s"
print(string.format("pool %d pages of %d tokens; %d queries x top-k %d (10%% -1)", P.nb, BS, T, TOPK))
print(string.format(CFMT, "pages ref.", "indices", "compact", "per-token", "compact MB", "per-tok MB", "speed-up", "rows equal"))
for _, frac in ipairs { 0.05, 0.25, 1.0 } do
  local npages = math.max(1, math.floor(frac * P.nb + 0.5))
  local pages = sample(P.nb, npages, P.draw)
  local idx = {}
  for t = 1, T do
    local row = {}
    for j = 1, TOPK do
      row[j] = P.draw(10) == 0 and -1 or pages[P.draw(npages) + 1] * BS + P.draw(BS)
    end
    idx[t] = row
  end
  local it = mla.tensor(idx, "i32", dev)
  local rows_c, remap_c, pg = K.compact(P.view, it)
  local rows_r, remap_r = K.gather_referenced(P.view, it)
  -- every valid index reads the same row through either remap
  local fc = { pages = rows_c:view("u8"), layout = "bf16", block_size = 1 }
  local fr = { pages = rows_r:view("u8"), layout = "bf16", block_size = 1 }
  local same = mla.compare(K.gather_sparse(fc, remap_c), K.gather_sparse(fr, remap_r), "exact")
  local bc = mla.bench(function() K.compact(P.view, it) end,
    bopts({ name = "compact", sync = true }))
  local out_r = mla.empty({ T * TOPK, L.dim }, "bf16", dev)
  local rm = mla.empty({ T * TOPK }, "i32", dev)
  local br = mla.bench(function() K.gather_referenced(P.view, it, { out = out_r, remap = rm, check = false }) end,
    bopts({ name = "per-token" }))
  print(string.format(CFMT, string.format("%d%%", math.floor(frac * 100 + 0.5)), T * TOPK, E.us(bc.median), E.us(br.median),
    string.format("%.1f", rows_c:numel() * 2 / 1e6), string.format("%.1f", rows_r:numel() * 2 / 1e6),
    string.format("%.2fx", bc.median / br.median), same.ok and "yes" or "NO"))
  v:add(string.format("compaction and per-token gather address the same rows (%d%% of pages)", math.floor(frac * 100 + 0.5)),
    same.ok and same.compared > 0, same.reasons[1])
  v:add("compaction keeps only referenced pages", pg:numel() <= npages, string.format("%d pages for %d referenced", pg:numel(), npages))
end
print("speed-up = compact time / per-token time (> 1: per-token is faster); compaction syncs with the host and cannot be graph-captured")
v:finish()
