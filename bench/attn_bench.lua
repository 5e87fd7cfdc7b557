--- Decode attention on the H100: the baked kernels on the issue's shapes,
-- each beside cudaMemcpy bandwidth and the cuBLAS bf16 GEMM rate measured in
-- the same run (bench/RESULTS.md records the figures).
--   memory-bound: h_q x s_q <= 16, b = 128, context 4K to 32K   (target >= 85% of memcpy);
--                 fp8 built-ins run their compile-time-specialized kernels (variant column:
--                 wgmma16rs on Hopper), points with specialize = "slice" the V-slice kernel,
--                 with specialize = false the generic kernel
--   compute-bound: h_q = 128, dense, context 4K (and 8K, 32K)  (target >= 50% of GEMM)
--   sparse fp8: h_q = 128, s_q = 2, topk 2048, b = 128         (target >= 40% of GEMM)
--
--   mlalab bench/attn_bench.lua [--out DIR] [--only memory|compute|sparse|jit] [--max-time S]
--                               [--timer events|cupti|pm] [--counters 1]
-- --counters 1 (with --timer pm) reads the DRAM bytes each call moved (decode and
-- combine kernels), printed under the row beside the bytes the bench declares.
local mla = require "mlalab"
local json = require "mlalab.json"
local AB = require "mlalab.attention_bench"

local args = { out = "/tmp/mlalab-bench", max_time = 4 }
do
  local a, i = { ... }, 1
  while i <= #a do
    local k = a[i]
    if k == "--out" then args.out, i = a[i + 1], i + 1
    elseif k == "--only" then args.only, i = a[i + 1], i + 1
    elseif k == "--max-time" then args.max_time, i = tonumber(a[i + 1]), i + 1
    elseif k == "--timer" then args.timer, i = a[i + 1], i + 1
    elseif k == "--counters" then args.counters, i = a[i + 1] == "1", i + 1
    else error("attn_bench: unknown argument " .. tostring(k)) end
    i = i + 1
  end
end
if not mla.has_cuda() then error("attn_bench: needs a GPU") end
if args.counters and args.timer ~= "pm" then error("attn_bench: --counters 1 needs --timer pm") end

local groups = {
  memory = {
    { kind = "dense", layout = "bf16", b = 128, s_q = 1, h_q = 16, len = 4096 },
    { kind = "dense", layout = "bf16", b = 128, s_q = 1, h_q = 16, len = 8192 },
    { kind = "dense", layout = "bf16", b = 128, s_q = 1, h_q = 16, len = 32768 },
    { kind = "dense", layout = "bf16", b = 128, s_q = 2, h_q = 8, len = 8192 },
    { kind = "dense", layout = "fp8_ds_mla", b = 128, s_q = 1, h_q = 16, len = 4096 },
    { kind = "dense", layout = "fp8_ds_mla", b = 128, s_q = 1, h_q = 16, len = 8192 },
    { kind = "dense", layout = "fp8_ds_mla", b = 128, s_q = 1, h_q = 16, len = 32768 },
    { kind = "dense", layout = "fp8_ds_mla", b = 128, s_q = 2, h_q = 8, len = 8192 },
    -- causal MTP: the tail's cost at the short end, and without it (causal_tail = false)
    { kind = "dense", layout = "fp8_ds_mla", b = 128, s_q = 2, h_q = 8, len = 4096 },
    { kind = "dense", layout = "fp8_ds_mla", b = 128, s_q = 2, h_q = 8, len = 4096, causal_tail = false },
    { kind = "dense", layout = "fp8_ds_mla", b = 128, s_q = 2, h_q = 8, len = 8192, causal_tail = false },
    { kind = "dense", layout = "fp8_v4", b = 128, s_q = 1, h_q = 16, len = 4096 },
    { kind = "dense", layout = "fp8_v4", b = 128, s_q = 1, h_q = 16, len = 8192 },
    { kind = "dense", layout = "fp8_v4", b = 128, s_q = 1, h_q = 16, len = 32768 },
    { kind = "dense", layout = "fp8_pertensor", b = 128, s_q = 1, h_q = 16, len = 4096 },
    { kind = "dense", layout = "fp8_pertensor", b = 128, s_q = 1, h_q = 16, len = 8192 },
    { kind = "dense", layout = "fp8_pertensor", b = 128, s_q = 1, h_q = 16, len = 32768 },
    -- the V-slice kernel (what GPUs other than Hopper run) and the generic (descriptor-driven)
    -- kernel on the same shapes, for comparison
    { kind = "dense", layout = "fp8_ds_mla", b = 128, s_q = 1, h_q = 16, len = 8192, specialize = "slice" },
    { kind = "dense", layout = "fp8_v4", b = 128, s_q = 1, h_q = 16, len = 8192, specialize = "slice" },
    { kind = "dense", layout = "fp8_pertensor", b = 128, s_q = 1, h_q = 16, len = 8192, specialize = "slice" },
    { kind = "dense", layout = "fp8_ds_mla", b = 128, s_q = 1, h_q = 16, len = 8192, specialize = false },
    { kind = "dense", layout = "fp8_v4", b = 128, s_q = 1, h_q = 16, len = 8192, specialize = false },
  },
  compute = {
    { kind = "dense", layout = "bf16", b = 128, s_q = 1, h_q = 128, len = 4096 },
    { kind = "dense", layout = "bf16", b = 128, s_q = 2, h_q = 128, len = 4096 },
    { kind = "dense", layout = "fp8_ds_mla", b = 128, s_q = 1, h_q = 128, len = 4096 },
    { kind = "dense", layout = "fp8_v4", b = 128, s_q = 1, h_q = 128, len = 4096 },
    { kind = "dense", layout = "fp8_pertensor", b = 128, s_q = 1, h_q = 128, len = 4096 },
    -- longer contexts, where a CTA's fixed cost weighs less (the issue's memory-bound range: 4K to 32K)
    { kind = "dense", layout = "fp8_ds_mla", b = 128, s_q = 1, h_q = 128, len = 8192 },
    { kind = "dense", layout = "fp8_v4", b = 128, s_q = 1, h_q = 128, len = 8192 },
    { kind = "dense", layout = "fp8_pertensor", b = 128, s_q = 1, h_q = 128, len = 8192 },
    { kind = "dense", layout = "fp8_ds_mla", b = 128, s_q = 1, h_q = 128, len = 32768 },
    { kind = "dense", layout = "fp8_v4", b = 128, s_q = 1, h_q = 128, len = 32768 },
    { kind = "dense", layout = "fp8_pertensor", b = 128, s_q = 1, h_q = 128, len = 32768 },
  },
  sparse = {
    { kind = "sparse", layout = "fp8_ds_mla", b = 128, s_q = 2, h_q = 128, topk = 2048, pool = 131072 },
    { kind = "sparse", layout = "fp8_v4", b = 128, s_q = 2, h_q = 128, topk = 2048, pool = 131072 },
  },
  jit = {
    { kind = "dense", layout = "fp8_ds_mla", b = 32, s_q = 1, h_q = 16, len = 4096, impl = "jit" },
  },
}
local order = { "memory", "compute", "sparse", "jit" }

os.execute("mkdir -p '" .. args.out .. "'")
local jf = assert(io.open(args.out .. "/attn_bench.jsonl", "w"))
local B = mla.bench_mod
local dev = mla.device()
print(string.format("device %s; %s", mla.device_props().name, B.references_line(dev)))
print(AB.header())
for _, g in ipairs(order) do
  if not args.only or args.only == g then
    for _, p in ipairs(groups[g]) do
      p.group = g
      local ok, r = pcall(AB.run, p, { max_time = args.max_time, timer = args.timer,
        metrics = args.counters and mla.bench_mod.DRAM_METRICS or nil })
      if ok then
        print(AB.row(r))
        local dram = r:dram_line()
        if dram then print("  " .. dram) end
        jf:write(json.encode(AB.record(r)), "\n")
      else
        print(string.format("%-34s FAILED: %s", AB.name(p), tostring(r)))
        jf:write(json.encode({ name = AB.name(p), error = tostring(r) }), "\n")
      end
      io.stdout:flush()
      jf:flush()
    end
  end
end
jf:close()
