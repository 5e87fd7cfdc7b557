local mla = require "mlalab"
local S = require "support"
local B = mla.bench_mod

local function spin(seconds)
  return function()
    local t0 = mla.core.clock()
    while mla.core.clock() - t0 < seconds do end
  end
end

local function fake_sampler(times, clocks)
  local i = 0
  return function()
    i = i + 1
    return times[(i - 1) % #times + 1], clocks and clocks[i]
  end
end

describe("bench on the cpu", function()
  it("takes at least min_samples before any stop test", function()
    local r = mla.bench(spin(1e-4), { device = "cpu", min_samples = 10, min_time = 0, max_noise = math.huge, plateau = false })
    assert.equal(10, r.n)
    assert.equal("converged", r.stop)
  end)

  it("keeps measuring until min_time of measured time has accumulated", function()
    -- no noise bound and no plateau stop: only min_time can end it (robust on a loaded CI machine)
    local r = mla.bench(spin(2e-4), { device = "cpu", min_time = 0.05, max_noise = math.huge, plateau = false })
    assert.is_true(r.total > 0.05, "total " .. r.total)
    assert.equal("converged", r.stop)
  end)

  it("stops at the wall-clock cap when the noise never converges", function()
    local t0 = mla.core.clock()
    local r = mla.bench(spin(1e-4), { device = "cpu", max_noise = 0, min_time = 0, max_time = 0.2, plateau = false })
    local wall = mla.core.clock() - t0
    assert.equal("max_time", r.stop)
    assert.is_true(wall >= 0.2 and wall < 2, "wall " .. wall) -- loose upper bound: CI machines are shared
    assert.truthy(table.concat(r.flags, ","):find("not-converged", 1, true))
  end)

  it("honours max_samples", function()
    local r = mla.bench(spin(1e-5), { device = "cpu", max_noise = 0, min_time = 0, max_samples = 37, plateau = false })
    assert.equal(37, r.n)
    assert.equal("max_samples", r.stop)
  end)

  it("reports median, min, max, mean and noise from the samples it keeps", function()
    local r = mla.bench(spin(1e-4), { device = "cpu", min_time = 0.01, max_noise = 1 })
    assert.equal(r.n, #r.samples)
    assert.is_true(r.min <= r.median and r.median <= r.max)
    assert.is_true(r.min <= r.mean and r.mean <= r.max)
    assert.near(r.stdev / r.mean, r.noise, 1e-12)
    assert.is_true(r.median >= 1e-4)
  end)

  it("refuses cold_calls outside [1, 64] and a non-positive cold_batch_time", function()
    for _, bad in ipairs { 0, 65, 2.5, "many" } do
      S.assert_error_contains(function() mla.bench(spin(1e-5), { device = "cpu", cold_calls = bad }) end, "cold_calls must be")
    end
    S.assert_error_contains(function() mla.bench(spin(1e-5), { device = "cpu", cold_batch_time = 0 }) end,
      "cold_batch_time must be")
  end)

  it("derives GB/s (1e9) and TFLOPS from the declared bytes and flops", function()
    local r = mla.bench(spin(1e-4), { device = "cpu", min_time = 0, max_noise = 1, bytes = 1e6, flops = 1e9 })
    assert.near(1e6 / r.median / 1e9, r.gbs, 1e-9)
    assert.near(1e9 / r.median / 1e12, r.tflops, 1e-9)
  end)

  it("runs setup before every sample without timing it", function()
    local calls = 0
    local r = mla.bench(function() end, { device = "cpu", min_time = 0, max_noise = 1, max_samples = 12,
      setup = function() calls = calls + 1 spin(2e-3)() end })
    assert.equal(r.n, calls)
    assert.is_true(r.median < 1e-3, "median " .. r.median)
  end)

  it("times batches in hot mode and divides by the calls per sample", function()
    local r = mla.bench(spin(1e-4), { device = "cpu", mode = "hot", batch_time = 2e-3, min_time = 0, max_noise = 1 })
    assert.is_true(r.calls >= 4)
    assert.is_true(r.median >= 1e-4 and r.median < 1e-3, "median " .. r.median)
  end)

  it("skips kernels shorter than skip_time", function()
    local r = mla.bench(function() end, { device = "cpu", skip_time = 1 })
    assert.is_true(r.skipped)
    assert.equal(0, r.n)
  end)

  it("prints as one row and summarizes without its samples", function()
    local r = mla.bench(spin(1e-4), { name = "spin", device = "cpu", min_time = 0, max_noise = 1 })
    local row = tostring(r)
    assert.is_nil(row:find("\n"))
    assert.truthy(row:find("spin", 1, true))
    local s = r:summary()
    assert.is_nil(s.samples)
    assert.equal(r.median, s.median)
  end)

  it("rejects bad options", function()
    S.assert_error_contains(function() mla.bench(function() end, { mode = "warm" }) end, "mode must be")
    S.assert_error_contains(function() mla.bench(function() end, { max_noise = -1 }) end, "max_noise")
    S.assert_error_contains(function() mla.bench(42) end, "a function expected")
    S.assert_error_contains(function() mla.bench(function() end, { flush = "dirty" }) end, "flush must be")
    S.assert_error_contains(function() mla.bench(function() end, { timer = "tsc" }) end, "timer must be")
    S.assert_error_contains(function() mla.bench(function() end, { metrics = { "dram__bytes_read.sum" } }) end,
      "metrics are read by timer 'pm'")
    S.assert_error_contains(function()
      mla.bench(function() end, { timer = "pm", metrics = { "a.sum", "b.sum", "c.sum", "d.sum", "e.sum", "f.sum",
        "g.sum", "h.sum", "i.sum" } })
    end, "at most 8 counter names")
    S.assert_error_contains(function() mla.bench(function() end, { timer = "pm", metrics = { 42 } }) end,
      "metrics[1] must be a metric name")
    S.assert_error_contains(function() mla.bench(function() end, { timer = "pm", mode = "graph" }) end,
      "timer 'pm' profiles kernels one by one")
  end)

  it("refuses GPU counters on the cpu device, which times with a clock", function()
    S.assert_error_contains(function()
      mla.bench(function() end, { device = "cpu", timer = "pm", metrics = { "dram__bytes_read.sum" } })
    end, "the cpu device has none")
    local r = mla.bench(function() end, { device = "cpu", timer = "pm", min_time = 0, max_time = 0.05 })
    assert.equal("clock", r.timer)
  end)

  it("has no reference rates on the cpu, and its reference operations need a CUDA device", function()
    assert.is_nil(B.references("cpu"))
    assert.is_nil(B.gemm_rate("cpu"))
    assert.is_nil(B.memcpy_bandwidth("cpu"))
    assert.equal("no GPU references (cpu)", B.references_line("cpu"))
    S.assert_error_contains(function() mla.core.reference_op("cpu", "gemm", 8192) end, "a CUDA device is required here (got cpu)")
  end)

  it("times with the monotonic clock on the cpu whatever GPU timer is asked for", function()
    local r = mla.bench(function() end, { timer = "cupti", min_time = 0, max_time = 0.05 })
    assert.equal("clock", r.timer)
    assert.is_true(r.n >= 10)
  end)
end)

describe("bench stopping criterion and throttle guard", function()
  it("stops on a noise plateau when the target noise is out of reach", function()
    local times = {}
    for i = 1, 100 do times[i] = 1e-3 * (1 + 0.05 * math.sin(i)) end -- ~3.5 % noise forever
    local r = B.measure(fake_sampler(times), { max_noise = 0.001, min_time = 0, max_time = 30 })
    assert.equal("plateau", r.stop)
    assert.is_true(r.n > 64)
  end)

  it("drops samples taken under 75% of the default SM clock and backs off", function()
    local clocks = { 1000, 1000, 1000, 1000, 1000 }
    for i = 6, 40 do clocks[i] = 1900 end
    local t0 = mla.core.clock()
    local r = B.measure(fake_sampler({ 1e-3 }, clocks), { default_mhz = 1980, min_time = 0, max_noise = 1,
      throttle_delay = 0.01, log = false })
    local wall = mla.core.clock() - t0
    assert.equal(5, r.dropped)
    assert.equal(10, r.n)
    -- delays 0.01, 0.01, 0.01, then +min(1.5 d, 0.5) after more than two drops in a row: 0.025, 0.0625
    assert.is_true(wall > 0.11, "wall " .. wall)
    assert.near(1900, r.clock_mhz, 1e-9)
    assert.truthy(table.concat(r.flags, ","):find("throttled:5", 1, true))
  end)

  it("keeps samples at or above the threshold", function()
    local r = B.measure(fake_sampler({ 1e-3 }, { 1485, 1486, 1500, 1600, 1700, 1800, 1900, 1950, 1980, 1990 }),
      { default_mhz = 1980, min_time = 0, max_noise = 1, log = false })
    assert.equal(0, r.dropped)
  end)
end)

describe("A/B verdicts", function()
  local function jitter(center, n, spread, seed)
    local out, x = {}, seed or 1
    for i = 1, n do
      x = (x * 1103515245 + 12345) % 2147483648
      out[i] = center * (1 + spread * (x / 2147483648 - 0.5))
    end
    return out
  end

  it("calls b faster when its whole interval is below a by more than the threshold", function()
    local v = mla.ab({ samples = jitter(100, 200, 0.02, 1), name = "base" }, { samples = jitter(90, 200, 0.02, 2), name = "new" })
    assert.equal("faster", v.verdict)
    assert.near(0.9, v.ratio, 0.01)
    assert.near(1 / 0.9, v.speedup, 0.02)
    assert.truthy(tostring(v):find("^FASTER%s+new vs base"))
  end)

  it("calls b slower in the mirrored case", function()
    assert.equal("slower", mla.ab(jitter(90, 200, 0.02, 3), jitter(100, 200, 0.02, 4)).verdict)
  end)

  it("calls two draws of one distribution the same", function()
    local v = mla.ab(jitter(100, 2000, 0.01, 5), jitter(100, 2000, 0.01, 6))
    assert.equal("same", v.verdict)
    assert.is_true(v.lo >= 0.995 and v.hi <= 1.005)
  end)

  it("stays unclear when noise hides a difference", function()
    local v = mla.ab(jitter(100, 12, 0.5, 7), jitter(97, 12, 0.5, 8))
    assert.equal("unclear", v.verdict)
  end)

  it("stays unclear with fewer than 5 samples", function()
    assert.equal("unclear", mla.ab({ 1, 2, 3 }, { 1, 2, 3, 4, 5, 6 }).verdict)
  end)

  it("does not trust a gap that different SM clocks explain", function()
    local a = { samples = jitter(100, 200, 0.02, 9), clock_mhz = 1980 }
    local b = { samples = jitter(90, 200, 0.02, 10), clock_mhz = 1980 * 100 / 90 }
    local v = mla.ab(a, b)
    assert.equal("unclear", v.verdict)
    assert.truthy(tostring(v):find("not confirmed in cycles", 1, true))
  end)

  it("computes the Mann-Whitney p-value of two separated samples", function()
    local p, pb = B.stats.mann_whitney({ 1, 2, 3, 4, 5 }, { 6, 7, 8, 9, 10 })
    -- U = 25, mu = 12.5, sigma = sqrt(25 * 11 / 12): z = 2.611, p = 0.00902
    assert.near(0.00902, p, 2e-5)
    assert.equal(0, pb)
  end)
end)

-- f on the 1st, 3rd, ... call only: a cold batch whose calls do not all launch work
local function every_other(f)
  local i = 0
  return function()
    i = i + 1
    if i % 2 == 1 then f() end
  end
end

describe("bench on the GPU #gpu", function()
  S.on_device("cuda", before_each, after_each)
  local N = 64 * 1024 * 1024 -- 64 MiB: ~45 us to copy
  local src, dst

  setup(function()
    src = mla.random_bytes({ N }, { device = "cuda", seed = 1 })
    dst = mla.empty({ N }, "u8", "cuda")
  end)

  local function copy() dst:copy(src) end

  it("times a copy kernel cold with a sane bandwidth", function()
    local r = mla.bench(copy, { name = "copy64M", bytes = 2 * N, max_time = 10 })
    print("\n" .. B.header() .. "\n" .. tostring(r))
    assert.is_true(r.n >= 10)
    assert.is_true(r.median > 5e-6 and r.median < 5e-3, "median " .. r.median)
    assert.is_true(r.gbs > 100 and r.bw_util < 1.05, "gbs " .. r.gbs)
    assert.is_true(r.memcpy_frac > 0.2 and r.memcpy_frac < 1.3, "memcpy_frac " .. r.memcpy_frac)
    assert.is_true(r.noise < 0.05, "noise " .. r.noise)
    assert.truthy(r.clock_source == "nvml" or r.clock_source == "stamps")
  end)

  it("measures the memcpy and GEMM reference rates once per process, as kernels are timed, beside a burst", function()
    local bw = B.memcpy_bandwidth()
    assert.equal(bw, B.memcpy_bandwidth())
    assert.is_true(bw > 100 and bw < 20000, "memcpy " .. bw)
    local tf = B.gemm_rate()
    assert.is_true(tf > 10 and tf < 5000, "gemm " .. tf)
    assert.equal(tf, B.gemm_rate())
    local r = B.references()
    assert.equal(bw, r.memcpy.rate)
    assert.equal(tf, r.gemm.rate)
    for _, k in ipairs { "memcpy", "gemm" } do
      assert.is_true(r[k].samples >= 10, k .. " samples " .. r[k].samples)
      -- the sustained rate and the 20-run burst measure the same operation: within a factor of two
      assert.is_true(r[k].rate > 0.5 * r[k].burst and r[k].rate < 2 * r[k].burst, k .. " " .. r[k].rate .. " vs " .. r[k].burst)
    end
    assert.truthy(B.references_line():find("cuBLAS bf16 GEMM 8192^3 " .. string.format("%.0f", tf), 1, true))
  end)

  it("keeps a reference operation alive for the harness, and refuses bad sizes and use after close", function()
    local op = mla.core.reference_op("cuda", "memcpy", 1 << 20)
    local r = mla.bench(function() op:launch() end, { name = "memcpy 1 MiB", bytes = 2 * (1 << 20), max_time = 2, reference = false })
    assert.is_true(r.n >= 10 and r.median > 0 and r.median < 1e-3, "median " .. r.median)
    op:close()
    S.assert_error_contains(function() op:launch() end, "reference_op: launch after close")
    op:close() -- twice is harmless
    S.assert_error_contains(function() mla.core.reference_op("cuda", "gemm", 100) end, "gemm reference: n must be a multiple of 64 in 256..32768 (got 100)")
    S.assert_error_contains(function() mla.core.reference_op("cuda", "memcpy", 4096) end, "memcpy reference: use at least 1 MiB (got 4096 bytes)")
    S.assert_error_contains(function() mla.core.reference_op("cuda", "conv", 4096) end, "invalid option 'conv'")
  end)

  it("runs hot and graph modes on a microsecond kernel", function()
    local s, d = mla.random_bytes({ 1 << 20 }, { device = "cuda", seed = 2 }), mla.empty({ 1 << 20 }, "u8", "cuda")
    local f = function() d:copy(s) end
    local hot = mla.bench(f, { mode = "hot", max_time = 3 })
    local graph = mla.bench(f, { mode = "graph", graph_calls = 50, max_time = 3 })
    assert.is_true(hot.calls >= 4)
    assert.equal(50, graph.calls)
    assert.is_true(graph.median > 0 and graph.median < 1e-4, "graph " .. graph.median)
  end)

  it("refuses a function that waits on the GPU inside a blocked sample", function()
    S.assert_error_contains(function()
      mla.bench(function() copy() mla.synchronize() end, { block_timeout = 0.5, max_time = 2 })
    end, "blocking kernel released itself")
    -- the stream is usable afterwards
    assert.is_true(mla.compare(dst, src).ok)
  end)

  it("refuses allocations during graph capture", function()
    S.assert_error_contains(function()
      mla.bench(function() src:clone() end, { mode = "graph", graph_calls = 4 })
    end, "allocated device memory during graph capture")
  end)

  it("reads the GPU's activity timeline with timer='cupti', without the event pair's front-end time", function()
    local ok, why = mla.core.cupti_available()
    assert.is_true(ok, why)
    local ev = mla.bench(copy, { name = "copy64M events", bytes = 2 * N, max_time = 5 })
    local cu = mla.bench(copy, { name = "copy64M cupti", bytes = 2 * N, timer = "cupti", max_time = 5 })
    print("\n" .. B.header() .. "\n" .. tostring(ev) .. "\n" .. tostring(cu))
    assert.equal("cupti", cu.timer)
    assert.truthy(table.concat(cu.flags, ","):find("cupti", 1, true))
    -- the same copy: the timeline drops the launch processing inside the event pair, never adds to it
    assert.is_true(cu.median <= ev.median * 1.01, string.format("cupti %.3g vs events %.3g", cu.median, ev.median))
    assert.is_true(cu.median >= ev.median * 0.8, string.format("cupti %.3g vs events %.3g", cu.median, ev.median))
    assert.is_true(cu.noise < 0.05, "noise " .. cu.noise)
    -- tracing is off again: the event timer still works afterwards
    assert.is_true(mla.bench(copy, { max_time = 1 }).n >= 10)
  end)

  it("times graph replays and kernels of our own with timer='cupti'", function()
    local rows = 256
    local s = mla.random_bytes({ rows, 4096 }, { device = "cuda", seed = 3 })
    local d = mla.empty({ rows, 4096 + 128 }, "u8", "cuda"):narrow(1, 0, 4096) -- strided: copy_rows_kernel
    local f = function() d:copy(s) end
    local g = mla.bench(f, { mode = "graph", graph_calls = 20, timer = "cupti", max_time = 2 })
    local cold = mla.bench(f, { timer = "cupti", max_time = 2 })
    assert.equal(20, g.calls)
    assert.is_true(g.median > 0 and g.median < 1e-4, "graph " .. g.median)
    assert.is_true(cold.median > 0 and cold.median < 1e-3, "cold " .. cold.median)
  end)

  it("says so when the timed function launched nothing under timer='cupti'", function()
    S.assert_error_contains(function() mla.bench(function() end, { timer = "cupti", max_time = 1 }) end,
      "launched nothing on the GPU")
    assert.is_true(mla.bench(copy, { max_time = 1 }).n >= 10)
  end)

  it("times cold batches: k flushed calls per sample, each timed by its own event pair or CUPTI span", function()
    local one = mla.bench(copy, { name = "copy64M x1", bytes = 2 * N, max_time = 5 })
    local ev = mla.bench(copy, { name = "copy64M x8", bytes = 2 * N, cold_calls = 8, max_time = 5 })
    local cu = mla.bench(copy, { name = "copy64M x8 cupti", bytes = 2 * N, cold_calls = 8, timer = "cupti", max_time = 5 })
    local auto = mla.bench(copy, { name = "copy64M auto", bytes = 2 * N, cold_calls = "auto", cold_batch_time = 2e-4 })
    print("\n" .. B.header() .. "\n" .. tostring(one) .. "\n" .. tostring(ev) .. "\n" .. tostring(cu) .. "\n" .. tostring(auto))
    assert.equal(8, ev.calls)
    assert.equal(8, cu.calls)
    assert.truthy(table.concat(ev.flags, ","):find("cold-x8", 1, true))
    -- per call, not per sample, and still cold: within 5% of one call per sample
    assert.is_true(math.abs(ev.median / one.median - 1) < 0.05, string.format("x8 %.4g vs x1 %.4g", ev.median, one.median))
    assert.is_true(cu.median <= ev.median * 1.01 and cu.median >= ev.median * 0.8,
      string.format("cupti %.4g vs events %.4g", cu.median, ev.median))
    -- a mean of 8 launches spreads less than single launches
    assert.is_true(ev.noise < one.noise, string.format("noise x8 %.4g vs x1 %.4g", ev.noise, one.noise))
    -- auto: enough calls for 0.2 ms of work (a 64 MiB copy runs ~45 us)
    assert.is_true(auto.calls >= 3 and auto.calls <= 8, "auto calls " .. auto.calls)
  end)

  it("says so when some calls of a cold batch launched nothing under timer='cupti'", function()
    S.assert_error_contains(function() mla.bench(every_other(copy), { timer = "cupti", cold_calls = 4, max_time = 1 }) end,
      "saw GPU work in 2 of the 4 calls")
    assert.is_true(mla.bench(copy, { max_time = 1 }).n >= 10)
  end)

  it("times kernels from the performance monitors with timer='pm' and reads DRAM counters per call", function()
    local ok, why = mla.core.pm_available()
    assert.is_true(ok, why)
    -- a padded destination row: copy_rows_kernel (a contiguous copy is a cudaMemcpy, which is no kernel)
    local rows = 16384
    local s = mla.random_bytes({ rows, 4096 }, { device = "cuda", seed = 11 })
    local d = mla.empty({ rows, 4096 + 128 }, "u8", "cuda"):narrow(1, 0, 4096)
    local f = function() d:copy(s) end
    local bytes = rows * 4096
    local cu = mla.bench(f, { name = "copy64M cupti", bytes = 2 * bytes, timer = "cupti", max_time = 5 })
    local pm = mla.bench(f, { name = "copy64M pm", bytes = 2 * bytes, timer = "pm", max_time = 5,
      metrics = { "dram__bytes_read.sum", "dram__bytes_write.sum" } })
    print("\n" .. B.header() .. "\n" .. tostring(cu) .. "\n" .. tostring(pm))
    print(string.format("DRAM read %.0f, written %.0f bytes per call; %d bytes each way declared",
      pm.metrics["dram__bytes_read.sum"], pm.metrics["dram__bytes_write.sum"], bytes))
    assert.equal("pm", pm.timer)
    assert.truthy(table.concat(pm.flags, ","):find("pm", 1, true))
    -- the same kernel: the monitors' duration includes the grid launch the timeline leaves out, a few us at most
    assert.is_true(pm.median >= cu.median * 0.99 and pm.median <= cu.median * 1.10,
      string.format("pm %.4g vs cupti %.4g", pm.median, cu.median))
    assert.is_true(pm.noise < 0.05, "noise " .. pm.noise)
    -- behind the flush the source comes from DRAM whole; the writes may partly stay in L2 when the kernel ends
    local rd, wr = pm.metrics["dram__bytes_read.sum"], pm.metrics["dram__bytes_write.sum"]
    assert.is_true(rd >= 0.98 * bytes and rd <= 1.05 * bytes, "read " .. rd)
    assert.is_true(wr > 0.1 * bytes and wr <= 1.05 * bytes, "written " .. wr)
    local js = pm:summary()
    assert.equal(rd, js.metrics["dram__bytes_read.sum"])
    -- cold batches: each call its own counters, flushes not profiled
    local x4 = mla.bench(f, { name = "copy64M pm x4", bytes = 2 * bytes, timer = "pm", cold_calls = 4, max_time = 3 })
    assert.equal(4, x4.calls)
    assert.is_true(math.abs(x4.median / pm.median - 1) < 0.05, string.format("x4 %.4g vs x1 %.4g", x4.median, pm.median))
    -- the profiler is off again: the other timers still work
    assert.is_true(mla.bench(f, { max_time = 1 }).n >= 10)
    assert.is_true(mla.bench(f, { timer = "cupti", max_time = 1 }).n >= 10)
  end)

  it("says what is wrong with a timer='pm' request", function()
    local rows = 1024
    local s = mla.random_bytes({ rows, 4096 }, { device = "cuda", seed = 12 })
    local d = mla.empty({ rows, 4096 + 128 }, "u8", "cuda"):narrow(1, 0, 4096)
    local f = function() d:copy(s) end
    S.assert_error_contains(function() mla.bench(function() end, { timer = "pm", max_time = 1 }) end,
      "timer 'pm' saw no kernel")
    S.assert_error_contains(function() mla.bench(f, { timer = "pm", metrics = { "no__such_counter.sum" }, max_time = 1 }) end,
      "is not a metric")
    S.assert_error_contains(function()
      mla.bench(f, { timer = "pm", metrics = { "dram__throughput.avg.pct_of_peak_sustained_elapsed" }, max_time = 1 })
    end, "takes counters")
    S.assert_error_contains(function() mla.bench(every_other(f), { timer = "pm", cold_calls = 4, max_time = 1 }) end,
      "saw kernels in 2 of the 4 calls")
    -- each failure closed its session: a new one opens
    assert.is_true(mla.bench(f, { timer = "pm", max_time = 1 }).n >= 10)
  end)

  it("keeps cold batches cold: a warm-L2 copy would be far faster than the flushed one", function()
    local s, d = mla.random_bytes({ 4 << 20 }, { device = "cuda", seed = 5 }), mla.empty({ 4 << 20 }, "u8", "cuda")
    local f = function() d:copy(s) end
    local cold = mla.bench(f, { cold_calls = 16, max_time = 3 })
    local hot = mla.bench(f, { mode = "hot", max_time = 3 })
    assert.is_true(cold.median > 1.15 * hot.median, string.format("cold x16 %.4g vs hot %.4g", cold.median, hot.median))
  end)

  it("tells a faster kernel from a slower one on the device", function()
    local small = mla.bench(function() dst:narrow(0, 0, N // 2):copy(src:narrow(0, 0, N // 2)) end, { name = "half", max_time = 5 })
    local full = mla.bench(copy, { name = "full", max_time = 5 })
    assert.equal("faster", mla.ab(full, small).verdict)
  end)
end)
