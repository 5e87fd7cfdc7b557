--- Host benchmarks (issue 2), each against its target:
--   (a) the cost of a Lua call into a tensor method, ns per call (<= 1 us);
--   (b) a 1 GiB device-to-device `copy` vs cudaMemcpy D2D measured in the same
--       run (>= 95%);
--   (c) strided copies between a per-layer view of a block-major cross-layer
--       cache and a contiguous tensor, vs the same cudaMemcpy rate (>= 75%).
-- Bandwidths count bytes read + written (10^9 B/s), as the memcpy reference
-- does (src/timing_ref.c: 1 GiB, median of 20 event-timed copies). GPU copies
-- are timed by mla.bench in cold mode (L2 flushed, queued behind the blocking
-- kernel, event pair, NVBench stopping rule). Without a GPU only (a) runs.
--
--   mlalab bench/host_bench.lua [--quick] [--json FILE]
local mla = require "mlalab"
local B = mla.bench_mod
local core = mla.core

local args = { quick = false }
do
  local a, i = { ... }, 1
  while i <= #a do
    if a[i] == "--quick" then args.quick = true
    elseif a[i] == "--json" then args.json, i = a[i + 1], i + 1
    else error("host_bench: unknown argument " .. tostring(a[i]) .. " (expected --quick, --json FILE)") end
    i = i + 1
  end
end

local results = { date = os.date("!%Y-%m-%dT%H:%M:%SZ"), mlalab = mla.version, calls = {}, copies = {} }
local has_gpu = mla.has_cuda()

local function verdict(ok) return ok and "PASS" or "FAIL" end

-- (a) Lua call overhead ------------------------------------------------------------

--- Best of several rounds of n calls, minus the same loop around a no-op Lua call.
local function ns_per_call(fn, n)
  local best = math.huge
  for _ = 1, 5 do
    local t0 = core.clock()
    for _ = 1, n do fn() end
    best = math.min(best, core.clock() - t0)
  end
  return best / n * 1e9
end

local function call_overhead()
  local n = args.quick and 100000 or 2000000
  local t = mla.zeros({ 64, 576 }, "bf16", "cpu")
  local g = has_gpu and mla.zeros({ 64, 576 }, "bf16", "cuda") or nil
  local noop = function() end
  local base = ns_per_call(function() noop(t) end, n)
  local cases = {
    { "t:numel()", function() t:numel() end },
    { "t:size(0)", function() t:size(0) end },
    { "t:dim()", function() t:dim() end },
    { "t:stride(1)", function() t:stride(1) end },
    { "t:is_contiguous()", function() t:is_contiguous() end },
    { "t.dtype (property)", function() return t.dtype end },
    { "t:narrow(0, 8, 16) (new view)", function() t:narrow(0, 8, 16) end },
    { "t:select(0, 3) (new view)", function() t:select(0, 3) end },
    { "t:view({64, 4, 144}) (new view)", function() t:view({ 64, 4, 144 }) end },
  }
  if g then cases[#cases + 1] = { "g:narrow(0, 8, 16) (cuda view)", function() g:narrow(0, 8, 16) end } end
  print(string.format("\n(a) Lua call into a tensor method (%d calls, best of 5; loop + Lua call of %.1f ns subtracted)", n, base))
  print(string.format("%-34s %10s %10s %8s", "call", "ns/call", "target", "verdict"))
  for _, c in ipairs(cases) do
    local ns = ns_per_call(c[2], n) - base
    local ok = ns <= 1000
    print(string.format("%-34s %10.1f %10s %8s", c[1], ns, "<= 1000", verdict(ok)))
    results.calls[#results.calls + 1] = { call = c[1], ns = ns, pass = ok }
  end
end

-- (b), (c) copies on the GPU ------------------------------------------------------------

local function bench_copy(name, dst, src, bytes_moved, target)
  dst:copy(src) -- warm-up, and the check below
  local r = B.bench(function() dst:copy(src) end, { name = name, bytes = bytes_moved, max_time = args.quick and 3 or 15 })
  local ok = r.memcpy_frac and r.memcpy_frac >= target
  print(string.format("%-44s %9.1f MB %11s %9.0f %9.1f%% %7s %7s  %s", name, bytes_moved / 1e6, B.fmt_time(r.median),
    r.gbs, 100 * (r.memcpy_frac or 0), string.format(">=%d%%", math.floor(100 * target + 0.5)), verdict(ok),
    #r.flags > 0 and table.concat(r.flags, ",") or ""))
  results.copies[#results.copies + 1] = { name = name, bytes = bytes_moved, median_s = r.median, min_s = r.min, noise = r.noise,
    gbs = r.gbs, memcpy_gbs = r.memcpy_gbs, fraction = r.memcpy_frac, target = target, pass = ok, flags = r.flags }
  return r
end

--- The copy moved the right bytes: a few slices compared on the host.
local function spot_check(dst, src, what)
  local n = dst:size(0)
  for _, i in ipairs { 0, n // 2, n - 1 } do
    assert(dst:narrow(0, i, 1):equal(src:narrow(0, i, 1)), what .. ": slice " .. i .. " differs")
  end
end

local function header()
  print(string.format("%-44s %12s %11s %9s %10s %7s %7s", "copy", "moved (r+w)", "median", "GB/s", "of memcpy", "target", "verdict"))
end

local function contiguous_copy()
  local bytes = args.quick and (256 << 20) or (1 << 30)
  local src = mla.random_bytes({ bytes }, { device = "cuda", seed = 1 })
  local dst = mla.empty({ bytes }, "u8", "cuda")
  print(string.format("\n(b) device-to-device copy, contiguous (cudaMemcpy D2D reference: %.0f GB/s)", B.memcpy_bandwidth("cuda:0")))
  header()
  bench_copy(string.format("u8 [%d] dst:copy(src)", bytes), dst, src, 2 * bytes, 0.95)
  spot_check(dst:view({ bytes >> 20, 1 << 20 }), src:view({ bytes >> 20, 1 << 20 }), "contiguous copy")
end

-- One config per carve: blocks x layers x page bytes, the layer copied.
local function cross_layer_copies()
  local s = args.quick and 4 or 1
  print("\n(c) strided: per-layer view of a block-major cross-layer cache <-> contiguous")
  header()
  local configs = {
    -- fp8_ds_mla pages: 64 tokens x 656 B = 41984 B per layer per block
    { name = "u8 [%d, 4, 41984] layer 2 -> contiguous", nb = 12800 // s, layers = 4, shape = { 41984 }, dtype = "u8", layer = 2 },
    { name = "contiguous -> u8 [%d, 4, 41984] layer 2", nb = 12800 // s, layers = 4, shape = { 41984 }, dtype = "u8", layer = 2,
      write = true },
    -- DeepSeek-V3 bf16 carve: 61 layers, block size 64, 576 per token
    { name = "bf16 [%d, 61, 64, 576] layer 30 -> contiguous", nb = 2048 // s, layers = 61, shape = { 64, 576 }, dtype = "bf16", layer = 30 },
    -- token-granular pages: rows of 656 B, stride 4 x 656
    { name = "u8 [%d, 4, 656] layer 1 -> contiguous", nb = (1 << 19) // s, layers = 4, shape = { 656 }, dtype = "u8", layer = 1 },
  }
  for _, c in ipairs(configs) do
    local full = { c.nb, c.layers }
    for _, d in ipairs(c.shape) do full[#full + 1] = d end
    local cache = mla.random_bytes(full, { dtype = c.dtype, device = "cuda", seed = 2 })
    local view = cache:select(1, c.layer)
    assert(not view:is_contiguous(), "the layer view must be strided")
    local flat = { c.nb }
    for _, d in ipairs(c.shape) do flat[#flat + 1] = d end
    local out = c.write and mla.random_bytes(flat, { dtype = c.dtype, device = "cuda", seed = 3 }) or mla.empty(flat, c.dtype, "cuda")
    local elem = c.dtype == "bf16" and 2 or 1
    local bytes = 2 * view:numel() * elem
    local name = string.format(c.name, c.nb)
    if c.write then
      bench_copy(name, view, out, bytes, 0.75)
      spot_check(view, out, name)
    else
      bench_copy(name, out, view, bytes, 0.75)
      spot_check(out, view, name)
    end
    cache:close(); out:close()
    mla.synchronize("cuda")
  end
end

local props = has_gpu and mla.device_props(0) or nil
print(string.format("mlalab %s host bench, %s, device: %s", mla.version, results.date,
  props and string.format("%s (sm_%d%d, %d SMs, peak DRAM %.0f GB/s by formula)", props.name, props.major, props.minor,
    props.sm_count, props.peak_dram_gbs) or "cpu only"))
results.device = props and props.name or "cpu"
call_overhead()
if has_gpu then
  results.memcpy_gbs = B.memcpy_bandwidth("cuda:0")
  contiguous_copy()
  cross_layer_copies()
else
  print("\n(b), (c): no usable GPU (" .. core.device_status() .. "), skipped")
end

local all = true
for _, r in ipairs(results.calls) do all = all and r.pass end
for _, r in ipairs(results.copies) do all = all and r.pass end
print("\n" .. (all and "all targets met" or "SOME TARGETS MISSED"))
if args.json then
  local f = assert(io.open(args.json, "w"))
  f:write(require("mlalab.json").encode(results), "\n")
  f:close()
end
os.exit(all and 0 or 1)
