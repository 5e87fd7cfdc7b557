--- Quantize-and-cache on every built-in layout, the specialized variant
-- (src/kernels/kv_write_spec.cuh) and the generic kernel, beside cudaMemcpy
-- D2D measured in the same run (bytes = source rows read + cache written,
-- 1e9 B/s), cold, median; inputs as bench/kv_bench.lua's write cases
-- (randn rows, page-shuffled slots, tensor scale 0.5).
--
--   mlalab bench/kv_write_variants.lua [--mib 256] [--max-time 2] [--generic 0|1] [--only name,name]
--     [--verify 1] [--once 1]
-- --once 1: one specialized write per selected layout and no timing (for ncu).
--
-- The specialized variant's knobs are environment variables read once per
-- process (src/kernels/kv_write.cu): MLALAB_KV_WRITE_STAGE=0|1,
-- MLALAB_KV_WRITE_UT=1|2, MLALAB_KV_WRITE_MB=3|4, MLALAB_KV_WRITE_PF=0|1 (the
-- cp.async prefetch of the next tile's source rows; on by default for bf16-only
-- layouts), MLALAB_KV_WRITE_GRID=1..9 (k x the resident blocks, 1 the old
-- persistent wave; 9 or unset: a block for every tile set); run the script once
-- per setting.
local mla = require "mlalab"
local B = mla.bench_mod
local K = mla.kernels

local args = { mib = 256, max_time = 2, generic = 1, verify = 0, once = 0 }
do
  local a = { ... }
  for i = 1, #a, 2 do
    local k = a[i]:gsub("^%-%-", ""):gsub("%-", "_")
    if k == "only" then args.only = a[i + 1] or error("kv_write_variants: --only needs names")
    else args[k] = tonumber(a[i + 1]) or error("kv_write_variants: bad value for " .. a[i]) end
  end
end
local dev, BS = "cuda", 64
mla.manual_seed(0x6b76)
math.randomseed(0x6b76)
-- --verify 1: before timing, each selected layout's variant (as the environment
-- picks it) against the CPU reference on slot mappings with page-long runs of
-- consecutive slots (the staged variant's whole-range copy), runs shifted by
-- one so that they cross pages inside a warp's token set, and -1 / shuffled
-- entries; exits non-zero on the first difference.
local function verify(name)
  local L = mla.layout.get(name)
  local nb = 9
  local n = nb * BS - 13
  local p = {}
  for i = 1, nb do p[i] = i - 1 end
  for i = nb, 2, -1 do local j = math.random(i) p[i], p[j] = p[j], p[i] end
  local patterns = {}
  local s1, s2, s3 = {}, {}, {}
  for t = 0, n - 1 do
    s1[t + 1] = p[t // BS + 1] * BS + t % BS
    local u = t + 1
    s2[t + 1] = p[u // BS % nb + 1] * BS + u % BS
    s3[t + 1] = s1[t + 1]
  end
  for t = 1, n, 97 do s3[t] = -1 end
  for _ = 1, 40 do
    local i, j = math.random(n), math.random(n)
    s3[i], s3[j] = s3[j], s3[i]
  end
  patterns = { s1, s2, s3 }
  for k, s in ipairs(patterns) do
    local rows = mla.randn({ n, L.dim }, { device = "cpu" }):to("bf16")
    local ref = mla.cache.new { layout = L, num_blocks = nb, block_size = BS, device = "cpu", tensor_scale = 0.5 }
    local rv = ref:view(0)
    rv.pages:fill(0)
    K.write(rv, mla.tensor(s, "i64", "cpu"), rows)
    local c = mla.cache.new { layout = L, num_blocks = nb, block_size = BS, device = dev, tensor_scale = 0.5 }
    local v = c:view(0)
    v.pages:fill(0)
    K.write(v, mla.tensor(s, "i64", dev), rows:cuda())
    local ran = K.last_variant()
    local x, y = mla.core.tensor_bytes(v.pages:cpu()), mla.core.tensor_bytes(rv.pages)
    if x ~= y then
      local at = -1
      for i = 1, #x do if x:byte(i) ~= y:byte(i) then at = i - 1 break end end
      print(string.format("verify %s pattern %d (%s): FAIL, first difference at byte %d", name, k, ran, at))
      os.exit(1)
    end
    print(string.format("verify %s pattern %d (%s): ok, %d bytes identical", name, k, ran, #x))
  end
end

local memcpy = args.once == 1 and 1 or B.memcpy_bandwidth(dev)
print(string.format("device: %s; cudaMemcpy D2D (read + write) %.0f GB/s", mla.device_props(dev).name, memcpy))
print(string.format("%-18s %-9s %10s %9s %8s  %s", "layout", "variant", "median us", "GB/s", "memcpy", "ran"))
local only
if args.only then
  only = {}
  for n in args.only:gmatch("[^,]+") do only[n] = true end
end
for _, name in ipairs(mla.layout.builtins()) do
  if only and not only[name] then goto next_layout end
  if args.verify == 1 then verify(name) end
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
  if args.once == 1 then
    K.write(v, slots, rows)
    K.check(dev)
    print(string.format("%-18s one write, %d tokens, ran %s", name, n, K.last_variant()))
    goto done
  end
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
  ::done::
  c, v, slots, rows = nil, nil, nil, nil
  collectgarbage()
  ::next_layout::
end
