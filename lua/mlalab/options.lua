--- Option tables checked against the names a function knows: a misspelt
-- option would otherwise fall back to its default without a word.
--   options.check("cache.new", o, { "layout", "num_blocks", ... })
-- raises "cache.new: unknown option 'num_layer' (did you mean 'num_layers'?
-- options: ...)".
local M = {}

-- Edit distance (insertions, deletions, substitutions) of two short names.
local function distance(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      local cost = a:sub(i, i) == b:sub(j, j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

local sets = setmetatable({}, { __mode = "k" }) -- known list -> its names as a set, built once

--- check(fn, opts, known[, level = 2]) -> opts: raises naming fn and the first
-- unknown string key of opts (nil opts pass), with the closest known name
-- when it is within two edits, and the list of known names.
function M.check(fn, opts, known, level)
  if opts == nil then return opts end
  local set = sets[known]
  if not set then
    set = {}
    for _, k in ipairs(known) do set[k] = true end
    sets[known] = set
  end
  local bad = {}
  for k in pairs(opts) do
    if type(k) ~= "string" or not set[k] then bad[#bad + 1] = tostring(k) end
  end
  if #bad == 0 then return opts end
  table.sort(bad)
  local best, bd = nil, 3
  for _, k in ipairs(known) do
    local d = distance(bad[1], k)
    if d < bd then best, bd = k, d end
  end
  local names = {}
  for i, k in ipairs(known) do names[i] = k end
  table.sort(names)
  error(string.format("%s: unknown option '%s' (%soptions: %s)", fn, bad[1], best and ("did you mean '" .. best .. "'? ") or "",
    table.concat(names, ", ")), (level or 2) + 1)
end

return M
