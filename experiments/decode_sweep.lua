--- Decode attention sweep: batch, context length (or top-k), heads, layout,
-- dense vs sparse; prints time, GB/s, TFLOPS and the fractions of the
-- cudaMemcpy bandwidth and cuBLAS GEMM rate measured in the same run, and
-- streams every point to JSON lines (resumable).
--
--   mlalab experiments/decode_sweep.lua [--out DIR] [--quick | --small] [--impl baked|jit|ref] [--resume]
--
-- --small: b = 128, h_q 16 and 128, context 8192, top-k 2048 (16 points, about a minute on an H100).
-- On a CPU-only machine --impl ref with --quick runs the same grid on tiny
-- sizes (the reference; timings are CPU wall times).
local mla = require "mlalab"
local AB = require "mlalab.attention_bench"

local args = { out = "out/decode_sweep", impl = mla.has_cuda() and "baked" or "ref" }
do
  local a, i = { ... }, 1
  while i <= #a do
    local k = a[i]
    if k == "--out" then args.out, i = a[i + 1], i + 1
    elseif k == "--quick" then args.quick = true
    elseif k == "--small" then args.small = true
    elseif k == "--resume" then args.resume = true
    elseif k == "--impl" then args.impl, i = a[i + 1], i + 1
    else error("decode_sweep: unknown argument " .. tostring(k)) end
    i = i + 1
  end
end

local dense_lens = args.quick and { 256, 1024 } or args.small and { 8192 } or { 4096, 8192, 16384, 32768 }
local topks = args.quick and { 128 } or { 2048 }
local batches = args.quick and { 2 } or args.small and { 128 } or { 32, 128 }
local heads = args.quick and { 16, 64 } or args.small and { 16, 128 } or { 16, 64, 128 }
local layouts = { "bf16", "fp8_pertensor", "fp8_ds_mla", "fp8_v4" }

local points = {}
for _, L in ipairs(layouts) do
  for _, b in ipairs(batches) do
    for _, h in ipairs(heads) do
      for _, len in ipairs(dense_lens) do
        points[#points + 1] = { kind = "dense", layout = L, b = b, s_q = 1, h_q = h, len = len, impl = args.impl }
      end
      for _, k in ipairs(topks) do
        points[#points + 1] = { kind = "sparse", layout = L, b = b, s_q = 2, h_q = h, topk = k,
          pool = args.quick and 2048 or 131072, impl = args.impl }
      end
    end
  end
end

local bench_opts = args.quick and { max_time = 0.5, min_time = 0.05 } or args.small and { max_time = 1 } or { max_time = 3 }
if mla.has_cuda() then
  local B = mla.bench_mod
  print(B.references_line() .. " (same run)")
end
print(AB.header())
mla.sweep {
  name = "decode", points = points, jsonl = args.out .. "/decode_sweep.jsonl", csv = args.out .. "/decode_sweep.csv",
  resume = args.resume, progress = false,
  run = function(p)
    local r = AB.run(p, bench_opts)
    print(AB.row(r))
    io.stdout:flush()
    local rec = AB.record(r)
    return { median_s = rec.median, gbs = rec.gbs, tflops = rec.tflops, memcpy_frac = rec.memcpy_frac,
      gemm_frac = rec.gemm_frac, splits = rec.plan_splits, rows_per_cta = rec.plan_rows_per_cta }
  end,
}
