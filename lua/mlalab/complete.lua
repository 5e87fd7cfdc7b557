--- Tab completion of the REPL: what a Lua expression word can go on as.
--   mla.complete.candidates("mla.att")  -> { "mla.attention." }
--   mla.complete.candidates("t:nar")    -> { "t:narrow(" }       (t a tensor)
-- A word is a name, or names joined by "." with at most a final ":".
-- Candidates are whole words: a table's ends in ".", a function's in "(".
-- Resolving the word reads fields only (a module of mla loads on first
-- use, as it would when the line ran); nothing is called.
local M = {}

local KEYWORDS = { "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if", "in",
  "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while" }

local help = require "mlalab.help"
local methods_of = help.methods_of -- the methods table a value indexes
local modules -- mla's module names, listed once (help.module_names reads the directory)

-- Every string key v offers after "." (fields and methods) or ":" (methods: functions only).
local function keys_of(v, colon)
  local out, seen = {}, {}
  local function add(k, x)
    if type(k) == "string" and k:match("^[%a_][%w_]*$") and not seen[k] and (not colon or type(x) == "function") then
      seen[k] = true
      out[#out + 1] = { k, x }
    end
  end
  if type(v) == "table" then
    for k, x in pairs(v) do add(k, x) end
  end
  local t, depth = methods_of(v), 0
  while type(t) == "table" and depth < 4 do -- an __index chain of tables (classes over classes)
    for k, x in pairs(t) do add(k, x) end
    t, depth = methods_of(t), depth + 1
  end
  if not colon and (getmetatable(v) or {}).__name == "mlalab.Tensor" then -- fields its C __index answers
    for _, k in ipairs { "shape", "strides", "dtype", "device", "ndim" } do add(k, v[k]) end
  end
  if type(v) == "string" then
    for k, x in pairs(string) do add(k, x) end
  end
  if v == package.loaded["mlalab"] and not colon then -- modules not loaded yet are names too
    modules = modules or help.module_names()
    for _, k in ipairs(modules) do add(k, rawget(v, k) or {}) end
  end
  return out
end

local function suffix(x)
  if type(x) == "function" then return "(" end
  if type(x) == "table" then return "." end
  return ""
end

--- candidates(word[, env = _G]) -> sorted list of the completions of word.
function M.candidates(word, env)
  env = env or _G
  if type(word) ~= "string" then error("complete.candidates: a word (string) is expected", 2) end
  local out = {}
  local base, sep, partial = word:match("^([%a_][%w_%.]*)([%.:])([%w_]*)$")
  if not base then -- a global name or a keyword
    if word ~= "" and not word:match("^[%a_][%w_]*$") then return out end
    for k, x in pairs(env) do
      if type(k) == "string" and k:sub(1, #word) == word and k:match("^[%a_][%w_]*$") then out[#out + 1] = k .. suffix(x) end
    end
    for _, k in ipairs(KEYWORDS) do
      if k:sub(1, #word) == word then out[#out + 1] = k end
    end
    table.sort(out)
    return out
  end
  if base:find("..", 1, true) or base:sub(-1) == "." then return out end
  local v = env
  for part in base:gmatch("[^.]+") do
    local ok, x = pcall(function() return v[part] end)
    if not ok or x == nil then return out end
    v = x
  end
  for _, kx in ipairs(keys_of(v, sep == ":")) do
    local k = kx[1]
    if k:sub(1, #partial) == partial then out[#out + 1] = base .. sep .. k .. suffix(kx[2]) end
  end
  table.sort(out)
  return out
end

return M
