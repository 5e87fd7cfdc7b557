--- Every built-in cache layout: its byte map, then one table of checks per
-- format on a cross-layer cache of 61 layers on the default device:
--   round trip  worst |x - read(write(x))| in units of half a quantization
--               step under the stored scale (must be <= 1)
--   write bleed bytes changed outside the written token rows, neighbours zeroed
--   read poison reads identical with every other byte random, then 0xff
-- Run: mlalab experiments/layouts.lua [--quiet] [--block-size N]. Exits 1 if
-- any check fails. On a GPU the cache lives on the device; writes and reads
-- go through mla.cache (the CPU reference on host copies until GPU kernels
-- are dispatched there).
local mla = require "mlalab"

local quiet, bs = false, 64
local a = arg or {}
local i = 1
while i <= #a do
  if a[i] == "--quiet" then quiet = true
  elseif a[i] == "--block-size" then bs = math.tointeger(tonumber(a[i + 1])) or error("--block-size needs an integer"); i = i + 1
  else error("layouts: unknown argument " .. tostring(a[i])) end
  i = i + 1
end

local LAYERS, LAYER, BLOCKS = 61, 37, 3
local dev = mla.device()
mla.manual_seed(2024)

if not quiet then
  for _, name in ipairs(mla.layout.builtins()) do
    mla.layout.show(name, bs)
    print()
  end
end

-- Rows that exercise every regime: normal values, small ones, a spike, zeros.
local function inputs(dim, n)
  local x = mla.randn({ n, dim }, { std = 2, device = "cpu" })
  for d = 0, dim - 1 do
    x:set({ 1, d }, x:get({ 1, d }) * 1e-3)
    x:set({ 2, d }, d % 64 < 32 and 0 or x:get({ 2, d }))
  end
  x:set({ 0, 3 }, 900)
  return x
end

local function check(name)
  local L = mla.layout.get(name)
  local c = mla.cache.new { layout = L, num_blocks = BLOCKS, block_size = bs, num_layers = LAYERS, order = "block_major",
    page_pad = L.page_align, device = dev }
  local n = 6
  local slots = { 0, bs + 1, 3 * bs - 1, -1, 2, bs + 7 }
  local st = mla.tensor(slots, "i64", "cpu")
  local x = inputs(L.dim, n)
  for l = 0, LAYERS - 1 do c:layer(l):fill(0) end
  if L:has_tensor_scale() then -- a calibrated per-tensor scale, amax / 448 as vLLM computes it
    local amax = 0
    for r = 0, n - 1 do for d = 0, L.dim - 1 do amax = math.max(amax, math.abs(x:get({ r, d }))) end end
    c:tensor_scale(LAYER):fill(amax / 448)
  end
  c:poison(LAYER, "zeros")
  c:write(LAYER, x, st)
  local bleed = c:check_bleed(LAYER, { slots = slots })
  local host = c:layer(LAYER):cpu()
  local ratio, dim, row = mla.layout_ref.worst_step_ratio(L, host, x, st, { block_size = bs,
    tensor_scale = c:tensor_scale(LAYER) })
  local clean = c:read(LAYER, st)
  local poisoned = true
  for _, pattern in ipairs { "random", "nan" } do
    c:poison(LAYER, pattern)
    poisoned = poisoned and c:read(LAYER, st):equal(clean)
  end
  local rt_ok = ratio <= 1
  return {
    name = name, token = L.token_bytes, page = L:page_bytes(bs),
    rt = string.format("%.3f%s", ratio, rt_ok and "" or string.format(" (row %d dim %d)", row, dim)),
    bleed = bleed and bleed.message or "none",
    poison = poisoned and "identical" or "DIFFERS",
    ok = rt_ok and not bleed and poisoned,
  }
end

local rows, all_ok = {}, true
for _, name in ipairs(mla.layout.builtins()) do
  local ok, r = pcall(check, name)
  if not ok then r = { name = name, token = 0, page = 0, rt = "-", bleed = "-", poison = "-", ok = false, err = r } end
  rows[#rows + 1] = r
  all_ok = all_ok and r.ok
end

print(string.format("layout checks on %s: %d layers block-major, layer %d, block_size %d", dev, LAYERS, LAYER, bs))
local fmt = "%-18s %8s %9s %12s  %-12s %-10s %s"
print(string.format(fmt, "format", "B/token", "B/page", "round trip", "write bleed", "read poison", "verdict"))
for _, r in ipairs(rows) do
  print(string.format(fmt, r.name, r.token, r.page, r.rt, r.bleed, r.poison, r.ok and "ok" or "FAIL"))
  if r.err then print("  error: " .. tostring(r.err)) end
end
print(all_ok and "all checks passed" or "SOME CHECKS FAILED")
os.exit(all_ok and 0 or 1)
