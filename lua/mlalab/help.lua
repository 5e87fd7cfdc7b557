--- mla.help(x): what a part of the library is and does, read from the doc
-- comments of its own source, so it can never disagree with the code.
--   help()                      the library's entry points and its modules
--   help(mla.attention)         a module: its header comment, then each
--   help("attention")             function with the first line of its doc
--   help(mla.attention.decode)  a function: where it is defined, the line
--   help("attention.decode")      that defines it and its whole doc comment
--   help(t)                     a tensor, layout or other object: its methods
--   help.find "ue8m0"           every module and documented function that mentions a word
-- In the REPL `help` is the same function. mla.help.text(x) returns the text
-- instead of printing it.
local M = {}

local file_lines = {} -- path -> array of lines (false: unreadable)

local function lines_of(path)
  if file_lines[path] == nil then
    local f = io.open(path, "r")
    if not f then
      file_lines[path] = false
    else
      local t = {}
      for l in f:lines() do t[#t + 1] = l end
      f:close()
      file_lines[path] = t
    end
  end
  return file_lines[path] or nil
end

local function strip(l) return (l:gsub("^%s*%-%-%-?%s?", "")) end

-- The comment lines right above line n (none when code or a blank line is there).
local function comment_above(lines, n)
  local first = n
  while first > 1 and lines[first - 1]:match("^%s*%-%-") do first = first - 1 end
  local out = {}
  for i = first, n - 1 do out[#out + 1] = strip(lines[i]) end
  return out
end

-- A file's leading comment block.
local function header_of(lines)
  local out = {}
  for _, l in ipairs(lines) do
    if not l:match("^%-%-") then break end
    out[#out + 1] = strip(l)
  end
  return out
end

-- init.lua's entry points (mla.compare, mla.bench, ...) are wrappers made by
-- its entry(mod, fn): their doc is that of mla[mod][fn].
local function follow(f)
  local info = debug.getinfo(f, "S")
  if not info.source:match("mlalab/init%.lua$") then return f end
  local up = {}
  for i = 1, 8 do
    local k, v = debug.getupvalue(f, i)
    if not k then break end
    up[k] = v
  end
  if type(up.mod) == "string" and type(up.fn) == "string" then
    local m = require("mlalab")[up.mod]
    if type(m) == "table" and type(m[up.fn]) == "function" then return m[up.fn] end
  end
  return f
end

-- Where Lua function f is defined: path, its lines and the defining line number.
local function source_of(f)
  f = follow(f)
  local info = debug.getinfo(f, "S")
  if info.what == "C" or not info.source:match("^@") then return nil end
  local path = info.source:sub(2)
  local lines = lines_of(path)
  if not lines or not lines[info.linedefined] then return nil end
  return path, lines, info.linedefined
end

-- The library's modules by name ("attention"), and the name of a loaded module table.
local function module_path(name) return package.searchpath("mlalab." .. name, package.path) end

local function module_name_of(t)
  for name, m in pairs(package.loaded) do
    if m == t and type(name) == "string" then
      local short = name:match("^mlalab%.(.+)$")
      if short and short ~= "core" and short ~= "paths" then return short end
    end
  end
  return nil
end

--- module_names() -> the library's module names, sorted: every file next to
-- init.lua (read through ls: Lua has no directory listing of its own).
local function module_names()
  local init = package.searchpath("mlalab.init", package.path) or package.searchpath("mlalab", package.path)
  local names = {}
  if not init then return names end
  local dir = init:match("^(.*)/[^/]*$") or "."
  local p = io.popen("ls '" .. dir:gsub("'", "'\\''") .. "' 2>/dev/null")
  if p then
    for f in p:lines() do
      local n = f:match("^([%w_]+)%.lua$")
      if n and n ~= "init" then names[#names + 1] = n end
    end
    p:close()
  end
  table.sort(names)
  return names
end

--- methods_of(v) -> the methods table a value indexes, or nil: a table's
-- metatable __index table, or for the core's userdata (tensors, JIT kernels),
-- whose __index is a C function, core.<Name> from the metatable's __name.
local function methods_of(v)
  local mt = getmetatable(v)
  if type(mt) ~= "table" then return nil end
  local name = type(mt.__name) == "string" and mt.__name:match("^mlalab%.(%w+)$")
  local core = package.loaded["mlalab.core"]
  if name and type(core) == "table" and type(core[name]) == "table" then return core[name] end
  if type(mt.__index) == "table" then return mt.__index end
  return nil
end

-- The doc of a C binding, written beside it in src/l_*.c (core.doc), or nil.
local function c_doc(f)
  local ok, core = pcall(require, "mlalab.core")
  return ok and type(core.doc) == "function" and core.doc(f) or nil
end

local function first_doc_line(f)
  if type(f) ~= "function" then return type(f) end
  local path, lines, n = source_of(f)
  if not path then
    local doc = c_doc(f)
    return doc and doc:match("^[^\n]*") or "a C function"
  end
  local doc = comment_above(lines, n)
  for _, l in ipairs(doc) do
    if l:match("%S") then return l end
  end
  return (lines[n]:gsub("^%s+", ""))
end

local function sorted_keys(t)
  local ks = {}
  for k in pairs(t) do
    if type(k) == "string" then ks[#ks + 1] = k end
  end
  table.sort(ks)
  return ks
end

local function function_text(f, name)
  local path, lines, n = source_of(f)
  if not path then
    local doc = c_doc(f)
    if doc then return (name and name .. ": " or "") .. "a C function of the core\n  " .. doc:gsub("\n", "\n  ") .. "\n" end
    return (name or "this function") .. ": a C function of the core, without a doc\n"
  end
  local out = { string.format("%s:%d: %s", path, n, (lines[n]:gsub("^%s+", ""))) }
  for _, l in ipairs(comment_above(lines, n)) do out[#out + 1] = "  " .. l end
  return table.concat(out, "\n") .. "\n"
end

local function members_text(t, title)
  local out = { title }
  local w = 0
  local ks = sorted_keys(t)
  for _, k in ipairs(ks) do w = math.max(w, #k) end
  for _, k in ipairs(ks) do
    if not k:match("^_") then out[#out + 1] = string.format("  %-" .. w .. "s  %s", k, first_doc_line(t[k])) end
  end
  return table.concat(out, "\n") .. "\n"
end

local function module_text(name, t)
  local path = module_path(name)
  local out = {}
  local lines = path and lines_of(path)
  if lines then
    for _, l in ipairs(header_of(lines)) do out[#out + 1] = l end
    out[#out + 1] = ""
  end
  if type(t) == "table" then out[#out + 1] = members_text(t, "mla." .. name .. ":")
  elseif type(t) == "function" then out[#out + 1] = function_text(t, "mla." .. name) end
  return table.concat(out, "\n")
end

local function overview()
  local mla = require "mlalab"
  local out = { "mlalab " .. tostring(mla.version) .. ": help(x) for any of these (a value or a name, e.g. help \"attention.decode\")", "" }
  local fns = {}
  for _, k in ipairs(sorted_keys(mla)) do
    if type(rawget(mla, k)) == "function" then fns[k] = rawget(mla, k) end
  end
  out[#out + 1] = members_text(fns, "entry points (mla.*):")
  out[#out + 1] = "modules (mla.<name>, loaded on first use):"
  for _, n in ipairs(module_names()) do
    local lines = lines_of(module_path(n))
    local h = lines and header_of(lines)[1] or ""
    out[#out + 1] = string.format("  %-20s %s", n, (h:gsub("^mla%.help%(x%): ", "")))
  end
  return table.concat(out, "\n") .. "\n"
end

-- A dotted name under mla ("attention.decode") to its value.
local function resolve(name)
  local v = require "mlalab"
  for part in name:gmatch("[^%.]+") do
    if type(v) ~= "table" then return nil end
    v = v[part]
    if v == nil then return nil end
  end
  return v
end

--- The help text of x (see the header): a string.
function M.text(x, name)
  if x == nil or x == require "mlalab" then return overview() end
  if type(x) == "string" then
    local key = x:gsub("^mla%.", "")
    local v = resolve(key)
    if v == nil then error(string.format("help: mla.%s is not a part of the library", key), 2) end
    return M.text(v, key)
  end
  if type(x) == "function" then return function_text(x, name and "mla." .. name) end
  if type(x) == "table" then
    local mod = module_name_of(x)
    if mod then return module_text(mod, x) end
    local methods = methods_of(x)
    if methods then
      -- an object that documents itself (a layout: its doc and upstream names) says so first
      local about = ""
      for _, k in ipairs { "doc", "upstream" } do
        if type(rawget(x, k)) == "string" then about = about .. k .. ": " .. rawget(x, k) .. "\n" end
      end
      return about .. members_text(methods, tostring(x) .. ": methods")
    end
    return members_text(x, (name and "mla." .. name or tostring(x)) .. ":")
  end
  if type(x) == "userdata" then
    local methods = methods_of(x)
    if methods then return members_text(methods, tostring(x) .. ": methods") end
  end
  return string.format("%s: a %s\n", tostring(x), type(x))
end

M.module_names = module_names
M.methods_of = methods_of

--- mla.help.find_text(word) -> text: every module and documented function of
-- the library whose name or doc mentions `word` (plain text, any case), one
-- line each: where it is defined and its doc's first line; the C bindings'
-- docs too. mla.help.find(word) prints it (in the REPL: help.find "ue8m0").
function M.find_text(word)
  if type(word) ~= "string" or word == "" then error("help.find: a word to look for is expected", 2) end
  local needle = word:lower()
  local hits = {}
  local function consider(where, name, doc)
    local text = (name .. "\n" .. table.concat(doc, "\n")):lower()
    if text:find(needle, 1, true) then
      local first = ""
      for _, l in ipairs(doc) do
        if l:match("%S") then first = l; break end
      end
      hits[#hits + 1] = string.format("  %-34s %s", where .. " " .. name, first)
    end
  end
  for _, mod in ipairs(module_names()) do
    local lines = lines_of(module_path(mod)) or {}
    consider(mod, "(module)", header_of(lines))
    for n, l in ipairs(lines) do
      local name = l:match("^%s*function%s+([%w_%.:]+)%s*%(") or l:match("^%s*([%w_%.]+)%s*=%s*function%s*%(")
      if name and not l:match("^%s*local ") and not (mod == "help" and name:match("^M%.find")) then
        local doc = comment_above(lines, n)
        if #doc > 0 then consider(mod .. ":", name, doc) end
      end
    end
  end
  local core = require "mlalab.core"
  local seen = {}
  local function c_table(where, t)
    for _, k in ipairs(sorted_keys(t)) do
      local f = rawget(t, k)
      local doc = type(f) == "function" and not seen[f] and c_doc(f)
      if doc then
        seen[f] = true
        local lines = {}
        for l in doc:gmatch("[^\n]+") do lines[#lines + 1] = l end
        consider(where, k, lines)
      end
    end
  end
  c_table("C:", require "mlalab")
  for _, obj in ipairs { "Tensor", "RtcKernel" } do
    if type(core[obj]) == "table" then c_table("C " .. obj .. ":", core[obj]) end
  end
  if #hits == 0 then return string.format("help.find: nothing documented mentions '%s'\n", word) end
  return string.format("help.find '%s': %d match%s\n", word, #hits, #hits == 1 and "" or "es") .. table.concat(hits, "\n") .. "\n"
end

--- mla.help.find(word): prints mla.help.find_text(word).
function M.find(word) io.write(M.find_text(word)) end

return setmetatable(M, { __call = function(_, x) io.write(M.text(x)) end })
