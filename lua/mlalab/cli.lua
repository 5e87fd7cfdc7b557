--- Command-line entry points of the mlalab binary (--info, --check-kernels).
-- Each returns true on success; main.c turns false into exit status 1.
local cli = {}

local function versions()
  local core = require "mlalab.core"
  local rt, drv = core.cuda_versions()
  local function v(x) return x == 0 and "none" or string.format("%d.%d", x // 1000, (x % 1000) // 10) end
  return rt, drv, v
end

--- `mlalab --info`: Lua, CUDA runtime and driver, NVRTC, and each device's SMs, memory, L2 and peak DRAM.
function cli.info()
  local core = require "mlalab.core"
  local rt, drv, v = versions()
  print(string.format("mlalab %s", core.version))
  print(string.format("Lua: %s   REPL: %s", _VERSION, core.readline and "readline (history, tab completion)" or "plain lines"))
  print(string.format("CUDA runtime: %s   driver: %s", v(rt), v(drv)))
  local ok, rtc = pcall(require, "mlalab.rtc")
  if ok and rtc.nvrtc_version then
    local maj, min = rtc.nvrtc_version()
    print(string.format("NVRTC: %d.%d", maj, min))
  end
  local n = core.device_count()
  if n == 0 then
    print("devices: none (" .. core.device_status() .. ")")
  end
  for d = 0, n - 1 do
    local p = core.device_props(d)
    print(string.format("cuda:%d  %s  sm_%d%d  %d SMs  %.1f GiB  L2 %.1f MiB  mem clock %d MHz x %d bit  peak DRAM %.0f GB/s",
      d, p.name, p.major, p.minor, p.sm_count, p.total_mem / 2 ^ 30, p.l2_bytes / 2 ^ 20,
      p.mem_clock_khz // 1000, p.bus_width_bits, p.peak_dram_gbs))
  end
  return true
end

--- `mlalab --check-kernels [archs]`: see mlalab.rtc_check.
function cli.check_kernels(...)
  local ok, rtc = pcall(require, "mlalab.rtc")
  if not ok then
    io.stderr:write("mlalab: --check-kernels needs the rtc module: " .. tostring(rtc) .. "\n")
    return false
  end
  return rtc.check_kernels(...)
end

return cli
