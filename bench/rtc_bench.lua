--- JIT kernels (issue 4): what a cached kernel costs a fresh process, and what
-- a launch from Lua costs next to a raw cudaLaunchKernel.
--
-- 1. Compile times, per kernel file of kernels_rtc/ (layout-generic files
--    with the fp8_ds_mla header): the cold NVRTC compile (fresh cache), then
--    a disk hit in a FRESH process (a child mlalab, timed from just before
--    the spawn to "module ready": compiled or found, loaded, kernel handles
--    taken when a GPU is there), against a child that only starts and
--    prints; and the in-process hit time (memo cleared). Target: <= 2 ms
--    per kernel for the hit. Runs on CPU too (arch sm_90a, no loading).
-- 2. Launch overhead (GPU only): N launches of an empty JIT kernel from a Lua
--    loop (k:launch{...}, fresh tables every call, and one reused table)
--    against a C loop of plain cudaLaunchKernel calls of a baked empty kernel
--    with the same parameters (and of the JIT handle), host time of the
--    loops, medians of R rounds, all in this run. Target: <= 1.5x.
--
--   mlalab bench/rtc_bench.lua [--launches N] [--rounds R] [--hits H] [--out DIR]
local mla = require "mlalab"
local core = mla.core
local rtc = mla.rtc
local stats = require "mlalab.bench_stats"
local json = require "mlalab.json"

local args = { launches = 20000, rounds = 7, hits = 9 }
do
  local a = { ... }
  local i = 1
  while i <= #a do
    local k = a[i]
    if k == "--launches" then args.launches, i = math.tointeger(tonumber(a[i + 1])), i + 1
    elseif k == "--rounds" then args.rounds, i = math.tointeger(tonumber(a[i + 1])), i + 1
    elseif k == "--hits" then args.hits, i = math.tointeger(tonumber(a[i + 1])), i + 1
    elseif k == "--out" then args.out, i = a[i + 1], i + 1
    else error("rtc_bench: unknown argument " .. tostring(k) .. " (--launches N, --rounds R, --hits H, --out DIR)") end
    i = i + 1
  end
  assert(args.launches and args.launches > 0 and args.rounds and args.rounds > 0 and args.hits and args.hits > 0,
    "rtc_bench: --launches, --rounds and --hits take positive integers")
end

local has_gpu = core.device_count() > 0
local ARCH = has_gpu and rtc.default_arch() or "sm_90a"
local EXE = assert(package.loaded["mlalab.paths"].exe, "rtc_bench: cannot locate the mlalab executable")
local LAYOUT, BLOCK = "fp8_ds_mla", 64

local function median(x) return stats.summary(x).median end
local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local cache = os.tmpname()
os.remove(cache)
assert(os.execute("mkdir -p " .. q(cache)))
rtc.set_cache { dir = cache }

print(string.format("mlalab %s, NVRTC %d.%d, arch %s, %s", core.version, core.rtc_version(), select(2, core.rtc_version()),
  ARCH, has_gpu and core.device_props(0).name or "no GPU (compile-time part only)"))

-- 1. compile times ---------------------------------------------------------------------------

local specs = {}
for _, f in ipairs(require("mlalab.rtc_check").kernel_files()) do
  local text = assert(io.open(f.path, "rb")):read("a")
  local needs = require("mlalab.rtc_check").needs_layout(text, rtc.file_meta(text, f.rel))
  specs[#specs + 1] = { file = f.rel, layout = needs and LAYOUT or nil }
end

-- The child: sets up what any JIT user pays once per process (the rtc and
-- layout modules, the CUDA context on a GPU), then compiles every spec (disk
-- hits), takes the kernel handles on a GPU, and prints the monotonic clock at
-- its start, after the set-up and at "ready" (ms), and the cache states.
local CHILD = [[
local t_script = require("mlalab.core").rtc_clock_ms()
local mla = require "mlalab"
local core, rtc = mla.core, mla.rtc
local _ = mla.layout.builtins()
if core.device_count() > 0 then mla.zeros({ 1 }, "f32", "cuda"); mla.synchronize() end
local specs = load(os.getenv("RTC_BENCH_SPECS"))()
local states, t0 = {}, core.rtc_clock_ms()
for i, s in ipairs(specs) do
  local m = rtc.compile { file = s.file, arch = s.arch, layout = s.layout and mla.layout.get(s.layout), block_size = s.block_size }
  if core.device_count() > 0 then
    for _, k in ipairs(m:kernels()) do m:kernel(k.name) end
  end
  states[i] = m.cache_state
end
local t1 = core.rtc_clock_ms()
io.write(string.format("%.6f %.6f %.6f %s\n", t_script, t0, t1, table.concat(states, ",")))
]]

local function spec_list(only)
  local parts = {}
  for i, s in ipairs(specs) do
    if not only or only == i then
      parts[#parts + 1] = string.format("{file=%q,arch=%q,layout=%s,block_size=%s}", s.file, ARCH,
        s.layout and string.format("%q", s.layout) or "nil", s.layout and BLOCK or "nil")
    end
  end
  return "return {" .. table.concat(parts, ",") .. "}"
end

-- One fresh process: ms from before the spawn to its script start, to the end
-- of its set-up and to ready; `hits` = ready - set-up (the cached kernels' cost).
local function fresh_process(list)
  local t_spawn = core.rtc_clock_ms()
  local r = core.spawn { argv = { EXE, "-e", CHILD }, timeout = 300,
    env = { "MLALAB_KERNEL_CACHE=" .. cache, "RTC_BENCH_SPECS=" .. list } }
  assert(r.exit_code == 0, "child failed: " .. r.stderr)
  local ts, t0, t1, st = r.stdout:match("^(%S+) (%S+) (%S+) (%S*)")
  return { start = tonumber(ts) - t_spawn, setup = tonumber(t0) - tonumber(ts), ready = tonumber(t1) - t_spawn,
    hits = tonumber(t1) - tonumber(t0), states = st }
end

print("\n== 1. compile: cold NVRTC compile vs a disk-cache hit (" .. LAYOUT .. " header where a file needs one)")
local rows, results = {}, { compile = {} }
local first_in_process = true
for i, s in ipairs(specs) do
  local spec = { file = s.file, arch = ARCH, layout = s.layout and mla.layout.get(s.layout), block_size = s.layout and BLOCK }
  local t0 = core.rtc_clock_ms()
  local m = rtc.compile(spec)
  local cold_wall = core.rtc_clock_ms() - t0
  assert(m.cache_state == "compiled", s.file .. ": expected a cold compile, got " .. m.cache_state)
  local nk = #m:kernels()
  -- in-process hits: memo cleared, so prepare (read + hash sources) + read + check the entry (+ load + handles)
  local hit = {}
  for h = 1, args.hits do
    rtc.clear_memo()
    local t = core.rtc_clock_ms()
    local mm = rtc.compile(spec)
    if has_gpu then for _, k in ipairs(mm:kernels()) do mm:kernel(k.name) end end
    hit[h] = core.rtc_clock_ms() - t
    assert(mm.cache_state == "disk")
  end
  -- fresh processes: this file alone
  local fp = {}
  for h = 1, math.max(3, args.hits // 3) do fp[h] = fresh_process(spec_list(i)) end
  local ready, start = {}, {}
  for h, x in ipairs(fp) do
    assert(x.states == "disk", s.file .. ": the fresh process did not hit the cache (" .. x.states .. ")")
    ready[h], start[h] = x.hits, x.start
  end
  local r = { file = s.file, layout = s.layout, kernels = nk, cold_ms = m.compile_ms, cold_wall_ms = cold_wall,
    first_in_process = first_in_process, hit_ms = median(hit), fresh_hit_ms = median(ready), fresh_start_ms = median(start) }
  first_in_process = false
  results.compile[#results.compile + 1] = r
  rows[#rows + 1] = r
end

-- all files in one fresh process
local all = {}
for h = 1, math.max(3, args.hits // 3) do all[h] = fresh_process(spec_list()) end
local total_kernels = 0
for _, r in ipairs(rows) do total_kernels = total_kernels + r.kernels end
local function med(field)
  local v = {}
  for i, x in ipairs(all) do v[i] = x[field] end
  return median(v)
end

print(string.format("%-16s %-11s %7s %12s %14s %16s %14s", "file", "layout", "kernels", "cold NVRTC", "hit in-process",
  "hit fresh proc", "per kernel"))
for _, r in ipairs(rows) do
  print(string.format("%-16s %-11s %7d %9.1f ms %11.3f ms %13.3f ms %11.3f ms%s", r.file, r.layout or "-", r.kernels,
    r.cold_ms, r.hit_ms, r.fresh_hit_ms, r.fresh_hit_ms / r.kernels, r.first_in_process and "  (cold incl. NVRTC start-up)" or ""))
end
local per_kernel = med("hits") / total_kernels
results.fresh_process = { spawn_to_script_ms = med("start"), setup_ms = med("setup"), hits_ms = med("hits"),
  spawn_to_ready_ms = med("ready"), kernels = total_kernels, per_kernel_ms = per_kernel }
print(string.format("one fresh process, all %d kernels of %d files: spawn to script %.2f ms, set-up %.2f ms (modules%s), "
  .. "cached kernels %.2f ms (disk hits%s), spawn to ready %.2f ms", total_kernels, #rows, med("start"), med("setup"),
  has_gpu and ", CUDA context" or "", med("hits"), has_gpu and ", loaded, handles taken" or "", med("ready")))
print(string.format("cache hit in a fresh process: %.3f ms per kernel  [target <= 2 ms: %s]", per_kernel,
  per_kernel <= 2 and "MET" or "MISSED"))

-- 2. launch overhead ----------------------------------------------------------------------------

if not has_gpu then
  print("\n== 2. launch overhead: skipped (no GPU: " .. core.device_status() .. ")")
else
  print(string.format("\n== 2. launch overhead: %d launches of an empty kernel (grid 1, block 32), median of %d rounds",
    args.launches, args.rounds))
  local m = rtc.compile { source = 'extern "C" __global__ void empty_kernel(float *p, int a, long long b) { if (a < 0 && p) p[b] = 0.0f; }',
    name = "rtc_bench_empty.cu" }
  local k = m:kernel("empty_kernel")
  local buf = mla.zeros({ 16 }, "f32", "cuda")
  local cfg = { grid = 1, block = 32, args = { buf, 1, 0 } }
  k:launch(cfg) -- params, attributes, module load: once
  mla.synchronize()
  local N = args.launches
  local t = { lua = {}, lua_reused = {}, raw_jit = {}, raw_baked = {} }
  for _ = 1, args.rounds do
    t.raw_baked[#t.raw_baked + 1] = core.rtc_time_baked_launches(N, { grid = 1, block = 32 }, buf, 1, 0)
    mla.synchronize()
    local t0 = core.rtc_clock_ms()
    for _ = 1, N do k:launch { grid = 1, block = 32, args = { buf, 1, 0 } } end
    t.lua[#t.lua + 1] = (core.rtc_clock_ms() - t0) / 1e3
    mla.synchronize()
    t0 = core.rtc_clock_ms()
    for _ = 1, N do k:launch(cfg) end
    t.lua_reused[#t.lua_reused + 1] = (core.rtc_clock_ms() - t0) / 1e3
    mla.synchronize()
    t.raw_jit[#t.raw_jit + 1] = k:time_raw_launches(N, { grid = 1, block = 32 })
  end
  local us = {}
  for key, v in pairs(t) do us[key] = median(v) / N * 1e6 end
  results.launch = { launches = N, rounds = args.rounds, us_per_launch = us, ratio = us.lua / us.raw_baked,
    ratio_reused = us.lua_reused / us.raw_baked }
  print(string.format("  raw cudaLaunchKernel, baked empty kernel (C loop)   %7.3f us/launch", us.raw_baked))
  print(string.format("  raw cudaLaunchKernel, JIT kernel handle (C loop)    %7.3f us/launch  (%.2fx)", us.raw_jit, us.raw_jit / us.raw_baked))
  print(string.format("  k:launch{...} from Lua, new tables every call       %7.3f us/launch  (%.2fx)", us.lua, us.lua / us.raw_baked))
  print(string.format("  k:launch(cfg) from Lua, one reused table            %7.3f us/launch  (%.2fx)", us.lua_reused,
    us.lua_reused / us.raw_baked))
  print(string.format("  ratio Lua / raw baked: %.2fx  [target <= 1.5x: %s]", us.lua / us.raw_baked,
    us.lua / us.raw_baked <= 1.5 and "MET" or "MISSED"))
end

if args.out then
  assert(os.execute("mkdir -p " .. q(args.out)))
  local f = assert(io.open(args.out .. "/rtc_bench.json", "w"))
  f:write(json.encode(results), "\n")
  f:close()
  print("\nwrote " .. args.out .. "/rtc_bench.json")
end
os.execute("rm -rf " .. q(cache))
