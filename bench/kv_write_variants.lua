--- Quantize-and-cache on every built-in layout, the specialized variant
-- (src/kernels/kv_write_spec.cuh) and the generic kernel, beside cudaMemcpy
-- D2D measured in the same run (bytes = source rows read + cache written,
-- 1e9 B/s), cold, median; inputs as bench/kv_bench.lua's write cases
-- (randn rows, page-shuffled slots, tensor scale 0.5).
--
--   mlalab bench/kv_write_variants.lua [--mib 256] [--max-time 2] [--generic 0|1]
local mla = require "mlalab"
local B = mla.bench_mod
local K = mla.kernels

local args = { mib = 256, max_time = 2, generic = 1 }
do
  local a = { ... }
  for i = 1, #a, 2 do
    local k = a[i]:gsub("^%-%-", ""):gsub("%-", "_")
    args[k] = tonumber(a[i + 1]) or error("kv_write_variants: bad value for " .. a[i])
  end
end
local dev, BS = "cuda", 64
mla.manual_seed(0x6b76)
math.randomseed(0x6b76)
local memcpy = B.memcpy_bandwidth(dev)
print(string.format("device: %s; cudaMemcpy D2D (read + write) %.0f GB/s", mla.device_props(dev).name, memcpy))
print(string.format("%-18s %-9s %10s %9s %8s  %s", "layout", "variant", "median us", "GB/s", "memcpy", "ran"))
for _, name in ipairs(mla.layout.builtins()) do
  local L = mla.layout.get(name)
  local per = 2 * L.dim + L.token_bytes
  local n = args.mib * (1 << 20) // per
  local nb = (n + BS - 1) // BS
  local c = mla.cache.new { layout = L, num_blocks = nb, block_size = BS, device = dev, tensor_scale = 0.5 }
  local v = c:view(0)
  local p = {}
  for i = 1, nb do p[i] = i - 1 end
  for i = nb, 2, -1 do local j = math.random(i) p[i], p[j] = p[j], p[i] end
  local s = {}
  for t = 0, n - 1 do s[t + 1] = p[t // BS + 1] * BS + t % BS end
  local slots = mla.tensor(s, "i64", dev)
  local rows = mla.randn({ n, L.dim }, { device = dev }):to("bf16")
  for _, spec in ipairs(args.generic == 1 and { true, false } or { true }) do
    local was = K.specialize(spec)
    K.write(v, slots, rows)
    local ran = K.last_variant()
    local r = mla.bench(function() K.write(v, slots, rows, { check = false }) end,
      { name = name, bytes = n * per, device = dev, max_time = args.max_time })
    K.check(dev)
    K.specialize(was)
    print(string.format("%-18s %-9s %10.1f %9.0f %7.1f%%  %s", name, spec and "spec" or "generic", r.median * 1e6, r.gbs,
      100 * r.gbs / memcpy, ran))
  end
  c, v, slots, rows = nil, nil, nil, nil
  collectgarbage()
end
