--- Timing that a verdict can rest on: `mla.bench(fn, opts)` measures fn the
-- way NVBench measures a kernel, `mla.ab(a, b)` says whether b is faster
-- than a from the two sample distributions.
--
-- Modes (GPU; fn must launch its work on mlalab's device stream, as every
-- mlalab operation does, and must not wait on it):
--   cold   one call per sample: L2 flush ("clean", the default: a memset of an
--          L2-sized buffer plus a read pass over a second buffer, so the timed
--          work finds no dirty line to write back; flush="memset": NVBench's
--          memset alone, whose dirty lines are written back inside the timed
--          kernel: +38% at 32 MiB vs ncu on H100, bench/RESULTS.md), then the call queued behind a
--          blocking kernel (no launch gap, no idle-stream bias), timed by an
--          event pair. The default. cold_calls = k (or "auto": enough calls
--          for cold_batch_time of work) makes a sample the mean of k cold
--          calls, each behind its own flush (as kernels, in the blocked
--          queue) and timed by its own event pair (or CUPTI span): the kernel's
--          own launch-to-launch spread (1.3% at 21 us on H100) averages down
--          while every call stays cold.
--   hot    a batch of back-to-back calls per sample (warm L2), time / calls.
--   graph  `graph_calls` calls captured once into a CUDA graph; each sample
--          replays the graph behind the blocker: host overhead gone, for
--          kernels of a few microseconds.
-- On the cpu device every mode times fn with the monotonic clock, so the
-- same script runs in CI.
-- Stopping rule (NVBench's stdrel): at least min_samples, then stop when the
-- relative stdev is under max_noise and the measured time exceeds min_time,
-- or when the noise estimate has plateaued; never past max_time of wall time.
-- Samples taken while the SM clock is under `throttle` x the default clock
-- are dropped, with NVBench's back-off.
local mla = require "mlalab"
local core = mla.core
local S = require "mlalab.bench_stats"

local M = {}
M.stats = S

M.defaults = {
  mode = "cold", warmup = 1, min_samples = 10, max_noise = 0.005, min_time = 0.5, max_time = 15,
  max_samples = math.huge, plateau = true, blocking = true, block_timeout = 5, sync = false,
  throttle = 0.75, throttle_delay = 0.05, clock = "nvml", skip_time = 0, batch_time = 0.01, batch_min = 4,
  batch_max = 256, reference = true, timer = "events", cold_calls = 1, cold_batch_time = 4e-4,
}
local MAX_COLD_CALLS = 64 -- event pairs of the C timer (MLA_TIMING_MAX_CALLS)
local MAX_METRICS = 8 -- counters besides the duration (MLA_PM_MAX_METRICS)
--- The DRAM counters a bench passes as metrics to see the bytes a call moved.
M.DRAM_METRICS = { "dram__bytes_read.sum", "dram__bytes_write.sum" }
local FLUSH_DEFAULT = { cold = "clean", hot = false, graph = false }

local bench_body -- below M.bench
-- Every option of mla.bench and measure (M.defaults' and those without a default).
local OPTION_NAMES = { "name", "device", "bytes", "flops", "flush", "graph_calls", "metrics", "setup", "verbose", "log",
  "default_mhz" }
for k in pairs(M.defaults) do OPTION_NAMES[#OPTION_NAMES + 1] = k end

local function options(opts)
  if opts ~= nil and type(opts) ~= "table" then error("bench: opts must be a table, got " .. type(opts), 3) end
  require("mlalab.options").check("bench", opts, OPTION_NAMES, 3)
  local o = {}
  for k, v in pairs(M.defaults) do o[k] = v end
  for k, v in pairs(opts or {}) do o[k] = v end
  if FLUSH_DEFAULT[o.mode] == nil then error("bench: mode must be 'cold', 'hot' or 'graph' (got " .. tostring(o.mode) .. ")", 3) end
  if o.flush == nil then o.flush = FLUSH_DEFAULT[o.mode] end
  if o.flush ~= true and o.flush ~= false and o.flush ~= "memset" and o.flush ~= "clean" and o.flush ~= "none" then
    error("bench: flush must be true, false, 'memset' or 'clean'", 3)
  end
  for _, k in ipairs { "min_samples", "max_noise", "min_time", "max_time", "throttle", "batch_time" } do
    if type(o[k]) ~= "number" or o[k] < 0 then error("bench: " .. k .. " must be a non-negative number", 3) end
  end
  if o.clock ~= "nvml" and o.clock ~= "stamps" and o.clock ~= "none" then
    error("bench: clock must be 'nvml', 'stamps' or 'none'", 3)
  end
  if o.timer ~= "events" and o.timer ~= "cupti" and o.timer ~= "pm" then
    error("bench: timer must be 'events', 'cupti' or 'pm'", 3)
  end
  if o.metrics ~= nil then
    if o.timer ~= "pm" then error("bench: metrics are read by timer 'pm' (got timer '" .. tostring(o.timer) .. "')", 3) end
    if type(o.metrics) ~= "table" or #o.metrics > MAX_METRICS then
      error("bench: metrics must be a list of at most " .. MAX_METRICS .. " counter names", 3)
    end
    for i, m in ipairs(o.metrics) do
      if type(m) ~= "string" or m == "" then error("bench: metrics[" .. i .. "] must be a metric name", 3) end
    end
  end
  if o.timer == "pm" and o.mode == "graph" then
    error("bench: timer 'pm' profiles kernels one by one; time graphs with 'events' or 'cupti'", 3)
  end
  local cc = o.cold_calls
  if cc ~= "auto" and (math.type(cc) ~= "integer" or cc < 1 or cc > MAX_COLD_CALLS) then
    error("bench: cold_calls must be an integer in [1, " .. MAX_COLD_CALLS .. "] or 'auto' (got " .. tostring(cc) .. ")", 3)
  end
  if type(o.cold_batch_time) ~= "number" or o.cold_batch_time <= 0 then
    error("bench: cold_batch_time must be a positive number", 3)
  end
  o.device = o.device or mla.device()
  if o.metrics and o.device == "cpu" then
    error("bench: metrics are GPU counters; the cpu device has none (it times with a clock)", 3)
  end
  return o
end

-- Reference rates, measured once per process and device ------------------------

-- The reference rates, once per process and device. Each is measured the way
-- every kernel is (M.bench: cold samples, the stopping rule, the throttle
-- guard), so a fraction compares like with like: a cuBLAS GEMM that runs for
-- half a second draws more power than a 30 ms burst and settles at a lower
-- clock (bench/RESULTS.md, thirty-sixth session). The burst figure (3 warm-up
-- runs, then the median of 20) is kept beside it for comparison.
local ref_cache = {}

local function reference(dev, kind)
  dev = dev or mla.device()
  if dev == "cpu" then return nil end
  local key = dev .. "/" .. kind
  if not ref_cache[key] then
    local size = kind == "memcpy" and (1 << 30) or 8192
    local work = kind == "memcpy" and 2 * size / 1e9 or 2 * size ^ 3 / 1e12 -- GB read + written, TFLOP
    -- the burst first, as the process starts (the GPU at its coolest: the burst's best case)
    local burst = kind == "memcpy" and core.memcpy_bandwidth(dev, size, 20) or core.gemm_rate(dev, size, 20)
    local op <close> = core.reference_op(dev, kind, size)
    local r = bench_body(function() op:launch() end,
      options { device = dev, reference = false, name = kind == "memcpy" and "cudaMemcpy D2D 1 GiB" or "cuBLAS bf16 GEMM 8192^3" })
    ref_cache[key] = { rate = work / r.median, burst = burst, clock_mhz = r.clock_mhz, samples = r.n }
  end
  return ref_cache[key]
end

--- GB/s of cudaMemcpy device to device (bytes read + written) on this device.
function M.memcpy_bandwidth(dev)
  local r = reference(dev, "memcpy")
  return r and r.rate
end

--- TFLOPS of a cuBLAS bf16 GEMM 8192^3 (fp32 accumulation) on this device.
function M.gemm_rate(dev)
  local r = reference(dev, "gemm")
  return r and r.rate
end

--- Both references with what stands behind them: {memcpy = {rate, burst,
-- clock_mhz, samples}, gemm = {...}} (GB/s, TFLOPS, MHz); nil on the cpu.
function M.references(dev)
  local m = reference(dev, "memcpy")
  return m and { memcpy = m, gemm = reference(dev, "gemm") }
end

--- One line naming both references, for a bench's header.
function M.references_line(dev)
  local r = M.references(dev)
  if not r then return "no GPU references (cpu)" end
  return string.format("cudaMemcpy D2D %.0f GB/s (burst %.0f), cuBLAS bf16 GEMM 8192^3 %.0f TFLOPS at %.0f MHz (burst %.0f); "
    .. "timed as the kernels are", r.memcpy.rate, r.memcpy.burst, r.gemm.rate, r.gemm.clock_mhz or 0, r.gemm.burst)
end

-- Samplers: each returns (seconds per call, SM MHz or nil) --------------------

local function cpu_sampler(fn, calls)
  return function()
    local t0 = core.clock()
    for _ = 1, calls do fn() end
    return (core.clock() - t0) / calls, nil
  end
end

local function guarded(dev, f, ...)
  local ok, err = pcall(f, ...)
  if not ok then
    core.timing_abort(dev)
    error(err, 0)
  end
end

-- A timeline timer (cupti, pm) must see work in the sample (seen: nil when it
-- saw no `kind`; `why` says what that means), and in every call of a cold
-- batch (calls_seen, counting `what`).
local function check_seen(timer, seen, calls_seen, segments, dev, kind, why, what)
  if not seen then
    error("bench: timer '" .. timer .. "' saw no " .. kind .. " on " .. dev .. " inside the sample: " .. why, 0)
  end
  if segments and segments > 1 and calls_seen ~= segments then
    error(string.format("bench: timer '%s' saw %s in %d of the %d calls of a cold batch: every call must launch %s",
      timer, what, calls_seen, segments, what), 0)
  end
end

-- The pm timer's reading of one sample: seconds and metrics per call.
local function pm_reading(s, dev, calls, segments, nmetrics)
  check_seen("pm", s.pm_kernels, s.pm_calls, segments, dev, "kernel",
    "the function launched none (copies and memsets are not profiled)", "kernels")
  local per_call = {}
  for i = 1, nmetrics do per_call[i] = s.pm_metrics[i] / calls end
  return s.pm_s / calls, s.sm_mhz, per_call
end

-- segments: calls the CUPTI timeline must tell apart (k in a cold batch, else 1)
local function gpu_sample(o, clock, launch, calls, block, segments)
  local dev = o.device
  local cupti, pm = o.timer == "cupti", o.timer == "pm"
  if pm then -- the profiler serializes kernels: nothing may hold the stream
    block = false
    if clock == "stamps" then clock = "none" end
  end
  core.timing_begin(dev, { flush = o.flush, block = block, clock = clock, block_timeout = o.block_timeout, cupti = cupti,
    pm = pm })
  guarded(dev, launch)
  local s = core.timing_end(dev)
  if s.block_timed_out then
    error("bench: the blocking kernel released itself after " .. o.block_timeout .. " s: the function waited on "
      .. "the GPU (a sync, a copy to the host, t:get()) while the stream was blocked; pass sync=true, or move "
      .. "that work out of the timed function", 0)
  end
  if cupti then
    check_seen("cupti", s.activities, s.cupti_calls, segments, dev, "kernel, copy or memset",
      "the function launched nothing on the GPU", "GPU work")
    return s.span_s / calls, s.sm_mhz
  end
  if pm then return pm_reading(s, dev, calls, segments, o.metrics and #o.metrics or 0) end
  return s.gpu_s / calls, s.sm_mhz
end

-- k cold calls per sample: a flush (kernels, queued) and a new event pair between calls
local function cold_sampler(o, clock, fn, k)
  local block = o.blocking and not o.sync
  local dev = o.device
  local launch = fn
  if k > 1 then
    launch = function()
      fn()
      for _ = 2, k do
        core.timing_next(dev)
        fn()
      end
    end
  end
  return function() return gpu_sample(o, clock, launch, k, block, k) end
end

local function cold_calls_for(o, est)
  if o.cold_calls ~= "auto" then return o.cold_calls end
  if est <= 0 then return MAX_COLD_CALLS end
  return math.max(1, math.min(MAX_COLD_CALLS, math.ceil(o.cold_batch_time / est)))
end

local function hot_sampler(o, clock, fn, calls)
  local function batch() for _ = 1, calls do fn() end end
  local block = o.blocking and not o.sync and calls <= o.batch_max
  return function() return gpu_sample(o, clock, batch, calls, block) end
end

--- Captures `calls` calls of fn into a graph; refuses captures that allocated
-- (the graph would keep pointers into memory the allocator hands out again).
local function capture(o, fn, calls)
  local dev = o.device
  local before = core.alloc_stats(dev)
  core.graph_begin(dev)
  local ok, err = pcall(function() for _ = 1, calls do fn() end end)
  if not ok then
    core.graph_abort(dev)
    error("bench: graph capture failed inside the function: " .. tostring(err), 0)
  end
  local g = core.graph_end(dev)
  local after = core.alloc_stats(dev)
  if after.n_malloc ~= before.n_malloc or after.n_hits ~= before.n_hits then
    g:close()
    error("bench: the function allocated device memory during graph capture; allocate outputs outside it", 0)
  end
  if g:nodes() == 0 then
    g:close()
    error("bench: graph capture recorded no work: the function launched nothing on mlalab's device stream", 0)
  end
  return g
end

-- The measurement loop ----------------------------------------------------------

local Result = {}
Result.__index = Result
M.Result = Result

local function calls_for(o, est)
  if est <= 0 then return o.batch_max end
  return math.max(o.batch_min, math.min(o.batch_max, math.ceil(o.batch_time / est)))
end

local function run_loop(o, sample, res)
  local crit = S.stdrel(o)
  local default_mhz = res.default_mhz
  local delay, drops_in_row = o.throttle_delay, 0
  local t_start = core.clock()
  local clocks = {}
  while true do
    local t, mhz, metrics = sample()
    if mhz and default_mhz and mhz < o.throttle * default_mhz then
      -- NVBench: drop the sample, cool down, lengthen the pause when it keeps happening
      res.dropped = res.dropped + 1
      if drops_in_row > 2 then delay = delay + math.min(delay * 1.5, 0.5) end
      drops_in_row = drops_in_row + 1
      if o.log ~= false then
        io.stderr:write(string.format("bench: %s: SM clock %.0f MHz < %.0f%% of %.0f MHz, sample dropped, pausing %.3f s\n",
          res.name, mhz, 100 * o.throttle, default_mhz, delay))
      end
      core.sleep(delay)
    else
      drops_in_row = 0
      res.samples[#res.samples + 1] = t
      if metrics then res.metric_samples[#res.metric_samples + 1] = metrics end
      if mhz then clocks[#clocks + 1] = mhz end
      crit:add(t)
    end
    local wall = core.clock() - t_start
    if #res.samples >= o.min_samples then
      local done, why = crit:finished()
      if done then res.stop = why break end
    end
    if #res.samples >= o.max_samples then res.stop = "max_samples" break end
    if wall > o.max_time then res.stop = "max_time" break end
  end
  res.wall = core.clock() - t_start
  if #clocks > 0 then res.clock_mhz = S.mean(clocks) end
end

local function summarize(res, o)
  local s = res.samples
  res.n = #s
  if res.n == 0 then return end
  local st = S.summary(s)
  for k, v in pairs(st) do res[k] = v end
  res.total = st.mean * res.n
  local t = res.median
  local flags = {}
  if o.bytes then
    res.bytes = o.bytes
    res.gbs = o.bytes / t / 1e9
    if res.peak_gbs then res.bw_util = res.gbs / res.peak_gbs end
    if res.memcpy_gbs then res.memcpy_frac = res.gbs / res.memcpy_gbs end
  end
  if o.flops then
    res.flops = o.flops
    res.tflops = o.flops / t / 1e12
    if res.gemm_tflops then res.gemm_frac = res.tflops / res.gemm_tflops end
  end
  if res.device ~= "cpu" and t < 10e-6 and (res.mode == "cold" or res.mode == "hot") then flags[#flags + 1] = "latency-bound" end
  if res.stop == "max_time" or res.stop == "max_samples" then
    if not (res.noise and res.noise < o.max_noise) then flags[#flags + 1] = "not-converged" end
  end
  if res.noise and res.noise > 0.05 then flags[#flags + 1] = "noisy" end
  if res.dropped > 0 then flags[#flags + 1] = "throttled:" .. res.dropped end
  if res.sync_mode then flags[#flags + 1] = "MLALAB_SYNC:unblocked" end
  if res.timer == "cupti" or res.timer == "pm" then flags[#flags + 1] = res.timer end
  if o.metrics and #res.metric_samples > 0 then
    -- per call, the median over the samples (the counters of one kernel vary little)
    res.metrics = {}
    for i, name in ipairs(o.metrics) do
      local v = {}
      for j, m in ipairs(res.metric_samples) do v[j] = m[i] end
      res.metrics[name] = S.summary(v).median
    end
  end
  if res.mode == "cold" and res.calls > 1 then flags[#flags + 1] = "cold-x" .. res.calls end
  res.flags = flags
end

--- mla.bench(fn, opts) -> result (prints as one row; keeps its samples).
-- opts: name, device, mode, bytes, flops (declared per call), warmup=1,
-- min_samples=10, max_noise=0.005, min_time=0.5, max_time=15, max_samples,
-- plateau=true, flush (cold: true; "memset", "clean", false), blocking=true, sync=false,
-- block_timeout=5, throttle=0.75, throttle_delay=0.05, clock="nvml"|"stamps"|"none",
-- skip_time=0, batch_time=0.01, batch_min=4, batch_max=256 (hot), graph_calls,
-- reference=true (measure memcpy / GEMM rates for the fractions), timer="events" (the
-- event pair, NVBench's) or "cupti" (the GPU's activity timeline: first start to
-- last end of the kernels, copies and memsets inside the sample, as Nsight
-- Systems and FlashMLA's benchmarks read it; without the ~1.5 us of front-end work
-- an event pair brackets, bench/RESULTS.md) or "pm" (each kernel's
-- gpu__time_duration from the performance monitors, Nsight Compute's "Duration";
-- kernels are serialized and copies are not counted; not in graph mode),
-- metrics (timer "pm": up to 8 counter names, e.g. "dram__bytes_read.sum",
-- reported per call as res.metrics[name], the median over samples), cold_calls=1 (cold: calls per
-- sample, each flushed and timed on its own; "auto": enough for
-- cold_batch_time=4e-4 s), setup (untimed,
-- before every sample), verbose, log=true (throttle messages on stderr).
function M.bench(fn, opts)
  if type(fn) ~= "function" then error("bench: a function expected", 2) end
  local o = options(opts)
  if o.timer == "events" or o.device == "cpu" then return bench_body(fn, o) end
  local open, close
  -- the reference rates are timed (with events) before CUPTI or the profiler is on
  if o.reference and o.device ~= "cpu" then
    if o.bytes then M.memcpy_bandwidth(o.device) end
    if o.flops then M.gemm_rate(o.device) end
  end
  if o.timer == "cupti" then
    local ok, why = core.cupti_available()
    if not ok then error("bench: timer 'cupti' needs CUPTI: " .. why, 2) end
    open, close = core.cupti_open, core.cupti_close
  else
    local ok, why = core.pm_available()
    if not ok then error("bench: timer 'pm' needs CUPTI's range profiler: " .. why, 2) end
    open = function() core.pm_open(o.device, o.metrics) end
    close = core.pm_close
  end
  open()
  local done, res = pcall(bench_body, fn, o)
  close()
  if not done then error(res, 0) end
  return res
end

bench_body = function(fn, o)
  local res = setmetatable({ name = o.name or "bench", device = o.device, mode = o.mode, samples = {}, dropped = 0,
    calls = 1, opts = o, timer = o.device ~= "cpu" and o.timer or "clock", metric_samples = {} }, Result)
  local gpu = o.device ~= "cpu"
  local clock = o.clock
  local sync_env = os.getenv("MLALAB_SYNC")
  if gpu and sync_env and sync_env ~= "" and sync_env ~= "0" and o.blocking then
    -- every launch waits for its kernel: a blocked stream would never drain
    o.blocking = false
    res.sync_mode = true
  end
  if gpu then
    local info = core.timing_info(o.device)
    res.default_mhz, res.l2_bytes = info.default_sm_mhz, info.l2_bytes
    if clock == "nvml" and not info.nvml then clock = "stamps" end
    res.clock_source = clock
    res.peak_gbs = core.device_props(o.device).peak_dram_gbs
    if o.reference and o.bytes then res.memcpy_gbs = M.memcpy_bandwidth(o.device) end
    if o.reference and o.flops then res.gemm_tflops = M.gemm_rate(o.device) end
    -- load the harness kernels once so the first sample pays no module load
    core.timing_begin(o.device, { flush = false, block = true, clock = clock })
    core.timing_end(o.device)
  end
  if clock == "none" then clock = nil end

  -- warm-up: also the estimate that sizes batches and graphs
  local est = 0
  for _ = 1, math.max(1, o.warmup) do
    if gpu then
      est = gpu_sample({ device = o.device, flush = o.flush, block_timeout = o.block_timeout, timer = o.timer }, "none", fn,
        1, false)
    else
      est = cpu_sampler(fn, 1)()
    end
  end
  res.warmup_s = est
  if o.skip_time > 0 and est < o.skip_time then
    res.skipped, res.stop, res.n, res.flags = true, "skipped", 0, { "skipped" }
    return res
  end

  local sample
  if not gpu then
    res.calls = o.mode == "cold" and 1 or (o.graph_calls or calls_for(o, est))
    sample = cpu_sampler(fn, res.calls)
  elseif o.mode == "cold" then
    res.calls = cold_calls_for(o, est)
    sample = cold_sampler(o, clock, fn, res.calls)
  elseif o.mode == "hot" then
    res.calls = calls_for(o, est)
    sample = hot_sampler(o, clock, fn, res.calls)
  else
    res.calls = o.graph_calls or calls_for(o, est)
    local g = capture(o, fn, res.calls)
    res.graph_nodes = g:nodes()
    local launch = function() g:launch() end
    gpu_sample({ device = o.device, flush = false, block_timeout = o.block_timeout, timer = o.timer }, "none", launch, 1,
      false)
    local block = o.blocking and not o.sync
    sample = function() return gpu_sample(o, clock, launch, res.calls, block) end
    res._graph = g
  end
  if o.setup then -- untimed, before every sample
    local inner, setup = sample, o.setup
    sample = function()
      setup()
      return inner()
    end
  end
  run_loop(o, sample, res)
  if res._graph then res._graph:close() res._graph = nil end
  summarize(res, o)
  if o.verbose then print(res:row()) end
  return res
end

--- mla.bench_mod.measure(sample, opts): the stopping rule and the throttle
-- guard around any sampler returning (seconds, SM MHz or nil), e.g. a timer
-- of your own; opts.default_mhz turns the guard on.
function M.measure(sample, opts)
  if type(sample) ~= "function" then error("measure: a sampler function expected", 2) end
  local o = options(opts)
  local res = setmetatable({ name = o.name or "measure", device = o.device, mode = "custom", samples = {}, dropped = 0,
    calls = 1, default_mhz = o.default_mhz, opts = o, metric_samples = {} }, Result)
  run_loop(o, sample, res)
  summarize(res, o)
  return res
end

-- Reporting ------------------------------------------------------------------------

--- fmt_time(seconds) -> "12.34 us", "1.234 ms" or "1.234 s" ("-" for nil).
local function fmt_time(s)
  if s == nil then return "-" end
  if s < 1e-3 then return string.format("%.2f us", s * 1e6) end
  if s < 1 then return string.format("%.3f ms", s * 1e3) end
  return string.format("%.3f s", s)
end
M.fmt_time = fmt_time

local function pct(f) return f and string.format("%.1f%%", 100 * f) or "-" end

local COLS = { { "case", 26 }, { "mode", 5 }, { "median", 11 }, { "min", 11 }, { "max", 11 }, { "noise", 7 },
  { "samples", 7 }, { "GB/s", 8 }, { "%peak", 6 }, { "%memcpy", 7 }, { "TFLOPS", 7 }, { "%gemm", 6 }, { "flags", 20 } }

local function pad(s, w)
  s = tostring(s)
  if #s > w then return s:sub(1, w - 1) .. "~" end
  return s .. string.rep(" ", w - #s)
end

--- The header line of the results table (the columns of r:row()).
function M.header()
  local p = {}
  for _, c in ipairs(COLS) do p[#p + 1] = pad(c[1], c[2]) end
  return table.concat(p, " ")
end

--- r:cells() -> the row's cells as strings, in the header's columns.
function Result:cells()
  return {
    self.name, self.mode, fmt_time(self.median), fmt_time(self.min), fmt_time(self.max), pct(self.noise),
    self.n or 0, self.gbs and string.format("%.1f", self.gbs) or "-", pct(self.bw_util), pct(self.memcpy_frac),
    self.tflops and string.format("%.2f", self.tflops) or "-", pct(self.gemm_frac), table.concat(self.flags or {}, ","),
  }
end

--- r:row() -> one line: the cells padded to the header's widths (also tostring(r)).
function Result:row()
  local p, cells = {}, self:cells()
  for i, c in ipairs(COLS) do p[#p + 1] = pad(cells[i], c[2]) end
  return table.concat(p, " ")
end
Result.__tostring = Result.row

--- "DRAM per call: read R MiB + written W MiB = T MiB, declared D MiB (T/D)"
-- for a result taken with metrics = M.DRAM_METRICS; nil otherwise.
function Result:dram_line()
  local m = self.metrics
  local rd, wr = m and m[M.DRAM_METRICS[1]], m and m[M.DRAM_METRICS[2]]
  if not (rd and wr) then return nil end
  local MiB = 1 << 20
  local line = string.format("DRAM per call: read %.2f MiB + written %.2f MiB = %.2f MiB", rd / MiB, wr / MiB,
    (rd + wr) / MiB)
  if self.bytes then
    line = line .. string.format(", declared %.2f MiB (%.1f%%)", self.bytes / MiB, 100 * (rd + wr) / self.bytes)
  end
  return line
end

--- Everything but the samples and options: what goes into JSON lines.
function Result:summary()
  local out = {}
  for _, k in ipairs { "name", "device", "mode", "n", "median", "min", "max", "mean", "stdev", "noise", "q1", "q3",
    "total", "wall", "dropped", "calls", "stop", "clock_mhz", "default_mhz", "clock_source", "bytes", "flops", "gbs",
    "tflops", "peak_gbs", "bw_util", "memcpy_gbs", "memcpy_frac", "gemm_tflops", "gemm_frac", "warmup_s", "skipped",
    "timer", "metrics" } do
    out[k] = self[k]
  end
  out.flags = self.flags and table.concat(self.flags, ",") or nil
  return out
end

--- table(results[, out = io.stdout]): writes the header and one row a result.
function M.table(results, out)
  out = out or io.stdout
  out:write(M.header(), "\n")
  for _, r in ipairs(results) do out:write(r:row(), "\n") end
end

-- A/B ---------------------------------------------------------------------------------

--- mla.ab(a, b, opts): is b faster than a? From the samples of two results
-- (or two arrays of times). Verdict "faster" / "slower" / "same" / "unclear":
-- the ratio median(b)/median(a) with a distribution-free interval (order
-- statistics of each median) must clear the `threshold` (default 0.5%, NVBench's
-- clear gap) and the Mann-Whitney test must agree (p < alpha, default 0.01);
-- "same" needs the whole interval inside +-threshold.
function M.ab(a, b, opts)
  return S.ab(a, b, opts)
end

return M
