--- Line plots as self-contained SVG: a metric against a parameter, one line
-- per variant. No dependencies; every point also carries its values as
-- data-x / data-y attributes, so tests and scripts can read a plot back.
local P = {}

local PALETTE = { "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf" }

local function xml(s)
  return (tostring(s):gsub("[&<>\"]", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;" }))
end

local function num(v)
  if math.type(v) == "integer" then return tostring(v) end
  return string.format("%.6g", v)
end

--- Compact tick labels: binary prefixes for powers of two from 1024 on.
local function tick_label(v, binary)
  if binary and v >= 1024 and math.type(math.tointeger(v)) == "integer" then
    local units = { "Ki", "Mi", "Gi", "Ti" }
    local u, x = 0, v
    while x >= 1024 and x % 1024 == 0 and u < #units do x, u = x // 1024, u + 1 end
    if u > 0 then return string.format("%d%s", x, units[u]) end
  end
  local a = math.abs(v)
  if a ~= 0 and (a >= 1e5 or a < 1e-3) then return string.format("%.3g", v) end
  return string.format("%.4g", v)
end

local function nice_step(span, n)
  local raw = span / n
  local mag = 10 ^ math.floor(math.log(raw, 10))
  for _, m in ipairs { 1, 2, 5, 10 } do
    if m * mag >= raw then return m * mag end
  end
  return 10 * mag
end

local function axis(lo, hi, log)
  if log then
    if lo <= 0 then error("plot: a log axis needs positive values (got " .. lo .. ")", 0) end
    local base = hi / lo >= 1000 and 10 or 2
    local a, b = math.floor(math.log(lo, base) + 1e-9), math.ceil(math.log(hi, base) - 1e-9)
    if a == b then a, b = a - 1, b + 1 end
    local ticks = {}
    local stride = math.max(1, math.ceil((b - a) / 10))
    for e = a, b, stride do ticks[#ticks + 1] = base ^ e end
    return { lo = base ^ a, hi = base ^ b, log = true, ticks = ticks, binary = base == 2,
      map = function(v) return (math.log(v) - math.log(base ^ a)) / (math.log(base ^ b) - math.log(base ^ a)) end }
  end
  if lo == hi then lo, hi = lo - (lo == 0 and 1 or math.abs(lo) * 0.1), hi + (hi == 0 and 1 or math.abs(hi) * 0.1) end
  local step = nice_step(hi - lo, 6)
  local a, b = math.floor(lo / step) * step, math.ceil(hi / step) * step
  local ticks = {}
  for i = 0, math.floor((b - a) / step + 0.5) do ticks[#ticks + 1] = a + i * step end
  return { lo = a, hi = b, ticks = ticks, map = function(v) return (v - a) / (b - a) end }
end

--- P.svg{records=, x=, y=, series=, file=, logx=, logy=, title=, xlabel=,
-- ylabel=, width=760, height=460} -> {file=, svg=, series={name -> points}}
function P.svg(o)
  if type(o.records) ~= "table" then error("plot: records expected", 2) end
  if not o.x or not o.y then error("plot: x and y (field names) expected", 2) end
  local groups, order = {}, {}
  for _, r in ipairs(o.records) do
    local x, y = r[o.x], r[o.y]
    if type(x) == "number" and type(y) == "number" and y == y then
      local s = o.series and tostring(r[o.series]) or o.y
      if not groups[s] then groups[s] = {} order[#order + 1] = s end
      local g = groups[s]
      g[#g + 1] = { x, y }
    end
  end
  if #order == 0 then
    error(string.format("plot: no numeric (%s, %s) pairs among %d records", o.x, o.y, #o.records), 2)
  end
  local xlo, xhi, ylo, yhi = math.huge, -math.huge, math.huge, -math.huge
  for _, s in ipairs(order) do
    table.sort(groups[s], function(p, q) return p[1] < q[1] end)
    for _, pt in ipairs(groups[s]) do
      xlo, xhi = math.min(xlo, pt[1]), math.max(xhi, pt[1])
      ylo, yhi = math.min(ylo, pt[2]), math.max(yhi, pt[2])
    end
  end
  if not o.logy and ylo > 0 and o.y_from_zero ~= false then ylo = 0 end
  local ax, ay = axis(xlo, xhi, o.logx), axis(ylo, yhi, o.logy)
  local W, H = o.width or 760, o.height or 460
  local L, R, T, B = 80, 170, 40, 60
  local pw, ph = W - L - R, H - T - B
  local function px(v) return L + ax.map(v) * pw end
  local function py(v) return T + (1 - ay.map(v)) * ph end

  local s = {}
  local function add(...) s[#s + 1] = string.format(...) end
  add('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">', W, H, W, H)
  add('<rect width="100%%" height="100%%" fill="white"/>')
  add('<text class="title" x="%d" y="22" text-anchor="middle" font-size="15">%s</text>', W // 2, xml(o.title or (o.y .. " vs " .. o.x)))
  for _, t in ipairs(ax.ticks) do
    local x = px(t)
    add('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e5e5e5"/>', x, T, x, T + ph)
    add('<text class="xtick" x="%.1f" y="%d" text-anchor="middle">%s</text>', x, T + ph + 16, xml(tick_label(t, ax.binary)))
  end
  for _, t in ipairs(ay.ticks) do
    local y = py(t)
    add('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e5e5e5"/>', L, y, L + pw, y)
    add('<text class="ytick" x="%d" y="%.1f" text-anchor="end">%s</text>', L - 6, y + 4, xml(tick_label(t, ay.binary)))
  end
  add('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>', L, T, pw, ph)
  add('<text class="xlabel" x="%d" y="%d" text-anchor="middle">%s</text>', L + pw // 2, H - 14,
    xml((o.xlabel or o.x) .. (o.logx and " (log)" or "")))
  add('<text class="ylabel" x="18" y="%d" text-anchor="middle" transform="rotate(-90 18 %d)">%s</text>', T + ph // 2,
    T + ph // 2, xml((o.ylabel or o.y) .. (o.logy and " (log)" or "")))
  local out = { series = {} }
  for i, name in ipairs(order) do
    local col = PALETTE[(i - 1) % #PALETTE + 1]
    local pts = {}
    for _, pt in ipairs(groups[name]) do pts[#pts + 1] = string.format("%.1f,%.1f", px(pt[1]), py(pt[2])) end
    add('<polyline class="series" data-series="%s" fill="none" stroke="%s" stroke-width="2" points="%s"/>', xml(name),
      col, table.concat(pts, " "))
    for _, pt in ipairs(groups[name]) do
      add('<circle class="point" data-series="%s" data-x="%s" data-y="%s" cx="%.1f" cy="%.1f" r="3" fill="%s"/>',
        xml(name), num(pt[1]), num(pt[2]), px(pt[1]), py(pt[2]), col)
    end
    local ly = T + 10 + (i - 1) * 18
    add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>', L + pw + 12, ly, L + pw + 32, ly, col)
    add('<text class="legend" x="%d" y="%d">%s</text>', L + pw + 38, ly + 4, xml(name))
    out.series[name] = groups[name]
  end
  add("</svg>")
  out.svg = table.concat(s, "\n") .. "\n"
  if o.file then
    local f = assert(io.open(o.file, "w"))
    f:write(out.svg)
    f:close()
    out.file = o.file
  end
  return out
end

return P
