--- What a decode launch costs beyond its tiles. Times the memory-bound shape (b = 128, one
-- query, h_q = 16) of each layout at growing context lengths, cold (L2 flushed, one call per
-- sample behind the blocking kernel) and hot (back-to-back calls), and fits
-- time = F + tiles x T by least squares over the lengths: T is the time of a 64-key tile of
-- every CTA, F the rest (launch, prologue, ramp-up, the last CTAs' tail), which weighs most
-- at short contexts. Compare F between the modes and between kernels (specialize = false runs
-- the generic kernel; --timer cupti takes the kernels' own spans from the activity timeline,
-- without the event pair's front-end time).
--   mlalab bench/attn_fixed_cost.lua [layout ...] [--max-time s] [--generic] [--timer events|cupti]
local AB = require "mlalab.attention_bench"

local layouts, max_time, specialize, timer = {}, 0.3, nil, nil
local args = { ... }
local i = 1
while i <= #args do
  local a = args[i]
  if a == "--max-time" then
    max_time = tonumber(args[i + 1]) or error("bench/attn_fixed_cost.lua: --max-time takes a number of seconds", 0)
    i = i + 1
  elseif a == "--generic" then
    specialize = false
  elseif a == "--timer" then
    timer = args[i + 1] or error("bench/attn_fixed_cost.lua: --timer takes events or cupti", 0)
    i = i + 1
  elseif a:sub(1, 2) == "--" then
    error("bench/attn_fixed_cost.lua: unknown option " .. a .. " (--max-time s, --generic, --timer t)", 0)
  else
    layouts[#layouts + 1] = a
  end
  i = i + 1
end
if #layouts == 0 then layouts = { "bf16", "fp8_pertensor", "fp8_ds_mla", "fp8_v4" } end

local LENS = { 512, 1024, 2048, 4096, 8192, 16384 }
local TILE = 64

-- Least squares of y = F + T x over the points; returns F, T and R^2.
local function fit(xs, ys)
  local n, sx, sy, sxx, sxy = #xs, 0, 0, 0, 0
  for k = 1, n do
    sx, sy, sxx, sxy = sx + xs[k], sy + ys[k], sxx + xs[k] * xs[k], sxy + xs[k] * ys[k]
  end
  local T = (n * sxy - sx * sy) / (n * sxx - sx * sx)
  local F = (sy - T * sx) / n
  local ss, st, my = 0, 0, sy / n
  for k = 1, n do
    ss, st = ss + (ys[k] - F - T * xs[k]) ^ 2, st + (ys[k] - my) ^ 2
  end
  return F, T, st > 0 and 1 - ss / st or 1
end

print(string.format("%-14s %-5s %-10s %s", "layout", "mode", "variant", "us at L = " .. table.concat(LENS, " / ")))
for _, layout in ipairs(layouts) do
  for _, mode in ipairs { "cold", "hot" } do
    local xs, ys, cells, variant = {}, {}, {}, "?"
    for _, len in ipairs(LENS) do
      local p = { kind = "dense", layout = layout, b = 128, s_q = 1, h_q = 16, len = len, specialize = specialize }
      local r = AB.run(p, { max_time = max_time, mode = mode, timer = timer })
      xs[#xs + 1], ys[#ys + 1] = len / TILE, r.median * 1e6
      cells[#cells + 1] = string.format("%.1f", r.median * 1e6)
      variant = r.plan and r.plan.variant or variant
    end
    local F, T, r2 = fit(xs, ys)
    local at4k = F / (F + T * 4096 / TILE)
    print(string.format("%-14s %-5s %-10s %s | F %.1f us, T %.3f us a tile, R^2 %.4f, F at L4096 %.1f%%", layout, mode,
      variant, table.concat(cells, " / "), F, T, r2, 100 * at4k))
  end
end
