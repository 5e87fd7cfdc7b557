--- A sweep that survives its own kernels: ten points, each in a child process
-- with its own CUDA context. One point launches a JIT kernel with an
-- out-of-bounds store, one a kernel that never returns; the other eight scale
-- a random vector and check it bit for bit. Expected: 8 OK, 1 FAULT (naming
-- the kernel and the CUDA error), 1 TIMEOUT, and all eight results kept.
--
--   mlalab experiments/fault_sweep.lua [--out DIR] [--timeout S]
--
-- On a machine without a GPU the faulting point raises a Lua error and the
-- hanging point spins in Lua instead (8 OK, 1 ERROR, 1 TIMEOUT), so the same
-- script runs in CI.
local mla = require "mlalab"

local out, timeout = "out/fault_sweep", 20
do
  local a, i = { ... }, 1
  while i <= #a do
    if a[i] == "--out" then out, i = a[i + 1], i + 1
    elseif a[i] == "--timeout" then timeout, i = assert(tonumber(a[i + 1]), "--timeout needs seconds"), i + 1
    else error("fault_sweep: unknown argument " .. tostring(a[i])) end
    i = i + 1
  end
end

-- Runs in the child: everything it needs is required there, by name.
local function point(p)
  local mla = require "mlalab"
  local gpu = mla.core.device_count() > 0 and mla.device() ~= "cpu"
  if not gpu then
    if p.kind == "oob" then error("no GPU: the out-of-bounds kernel is not launched") end
    if p.kind == "spin" then while true do end end
  end
  local src = [[
extern "C" __global__ void scale(float *x, long long n, float a) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * a;
}
extern "C" __global__ void oob_store(float *x, long long far) { x[far] = 1.0f; }
extern "C" __global__ void spin_forever(volatile int *flag) { while (*flag == 0) { } }
]]
  local n = 1 << 20
  local x = mla.randn({ n }, { device = gpu and "cuda" or "cpu", seed = p.i })
  local want = x:to("cpu"):totable()
  for i = 1, n do want[i] = string.unpack("<f", string.pack("<f", want[i] * 3.0)) end
  if not gpu then
    local y = x:totable()
    for i = 1, n do y[i] = string.unpack("<f", string.pack("<f", y[i] * 3.0)) end
    for i = 1, n do if y[i] ~= want[i] then error("mismatch at " .. i) end end
    return { checked = n }
  end
  local mod = mla.rtc.compile { source = src, name = "fault_sweep.cu" }
  if p.kind == "oob" then
    mod:kernel("oob_store"):launch { grid = 1, block = 1, args = { x, 1 << 40 } }
  elseif p.kind == "spin" then
    local flag = mla.zeros({ 1 }, "i32", "cuda")
    mod:kernel("spin_forever"):launch { grid = 1, block = 1, args = { flag } }
  else
    mod:kernel("scale"):launch { grid = (n + 255) // 256, block = 256, args = { x, n, 3.0 } }
  end
  mla.synchronize()
  local got = x:to("cpu"):totable()
  for i = 1, n do if got[i] ~= want[i] then error(string.format("element %d: %g, expected %g", i, got[i], want[i])) end end
  return { checked = n }
end

local points = {}
for i = 1, 10 do
  points[i] = { i = i, kind = i == 4 and "oob" or i == 7 and "spin" or "scale" }
end

local res = mla.sweep {
  name = "fault_sweep", points = points, run = point,
  isolate = { timeout = timeout },
  jsonl = out .. "/fault_sweep.jsonl",
}

local counts = {}
for _, r in ipairs(res.records) do counts[r.status] = (counts[r.status] or 0) + 1 end
print()
for _, r in ipairs(res.records) do
  if r.status ~= "OK" then
    print(string.format("point %d (%s): %s %s %s", r.i, r.kind, r.status, r.kernel or "", r.cuda_error or ""))
  end
end
local gpu = mla.core.device_count() > 0 and mla.device() ~= "cpu"
local expect = gpu and { OK = 8, FAULT = 1, TIMEOUT = 1 } or { OK = 8, ERROR = 1, TIMEOUT = 1 }
local ok = true
for k, v in pairs(expect) do ok = ok and counts[k] == v end
for k, v in pairs(counts) do ok = ok and expect[k] == v end
local parts = {}
for _, k in ipairs { "OK", "FAULT", "ERROR", "TIMEOUT", "OOM", "CRASH" } do
  if counts[k] then parts[#parts + 1] = counts[k] .. " " .. k end
end
print(string.format("fault_sweep: %s (results in %s/fault_sweep.jsonl): %s", table.concat(parts, ", "), out,
  ok and "PASS" or "FAIL"))
os.exit(ok and 0 or 1)
