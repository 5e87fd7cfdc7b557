--- Runs one KV-cache operation a few times at kv_bench's 256 MiB shape, for
-- Nsight Compute (per-kernel times of a multi-kernel operation):
--   ncu --metrics gpu__time_duration.sum --csv mlalab bench/kv_profile.lua <case> [runs]
-- Cases: compact (capacity mode: mark, rank, page gather, remap), write_fp4.
local mla = require "mlalab"
local K = require "mlalab.kernels"

local name, runs = ..., tonumber(select(2, ...) or "3")
local BS, dev = 64, "cuda"
local function filled(layout, tokens)
  local c = mla.cache.new { layout = mla.layout.get(layout), num_blocks = (tokens + BS - 1) // BS, block_size = BS,
    device = dev, tensor_scale = 0.5 }
  local v, n = c:view(0), c.num_blocks * BS
  K.write(v, mla.arange(n, "i64", dev), mla.randn({ n, c.layout.dim }, { device = dev }):to("bf16"))
  return c, v
end

local run
if name == "compact" then
  local W = 2048
  local T = (256 * 2 ^ 20 // (656 + 1152)) // W
  local c, v = filled("fp8_ds_mla", 2 * T * W)
  local idx = mla.rand({ T * W }, { lo = 0, hi = c.num_blocks * BS, device = dev, dtype = "i32" }):reshape({ T, W })
  local o = { out = mla.empty({ c.num_blocks * BS, 576 }, "bf16", dev), check = false }
  run = function() K.compact(v, idx, o) end
elseif name == "write_fp4" then
  local n = 256 * 2 ^ 20 // (1024 + 288)
  local _, v = filled("fp4_v41", n)
  local slots, rows = mla.arange(n, "i64", dev), mla.randn({ n, 512 }, { device = dev }):to("bf16")
  run = function() K.write(v, slots, rows, { check = false }) end
else
  error("kv_profile: case must be compact or write_fp4")
end
for _ = 1, runs do run() end
mla.synchronize()
K.check(dev)
print(name, "ran", runs)
