--- Values to Lua source and back, across a process boundary (mla.isolate).
-- Plain data round-trips exactly (floats as hex, strings byte for byte);
-- functions travel as bytecode with their upvalues (modules by name,
-- data by value); tensors travel as bytes and come back on the CPU unless
-- the receiver asks for a device.
local core = require "mlalab.core"

local ser = {}

local function module_name(v)
  for name, m in pairs(package.loaded) do
    if m == v and type(name) == "string" then return name end
  end
end

local encode

local function encode_function(f, seen, path)
  local ups, i = {}, 1
  while true do
    local name, v = debug.getupvalue(f, i)
    if not name then break end
    if name == "_ENV" then
      ups[#ups + 1] = string.format("{%q,ENV}", name)
    else
      ups[#ups + 1] = string.format("{%q,%s}", name, encode(v, seen, path .. "." .. name))
    end
    i = i + 1
  end
  local ok, code = pcall(string.dump, f)
  if not ok then error("isolate: " .. path .. " is a C function and cannot cross the process boundary", 0) end
  return string.format("F(%q,{%s})", code, table.concat(ups, ","))
end

--- Lua source for value v (an expression over the helpers F, T, M, ENV).
function encode(v, seen, path)
  seen, path = seen or {}, path or "value"
  local t = type(v)
  if t == "nil" or t == "boolean" then return tostring(v) end
  if t == "number" then
    if v ~= v then return "(0/0)" end
    if v == math.huge then return "math.huge" elseif v == -math.huge then return "-math.huge" end
    return string.format("%q", v)
  end
  if t == "string" then return string.format("%q", v) end
  local mod = (t == "table" or t == "userdata") and module_name(v)
  if mod then return string.format("M(%q)", mod) end
  if t == "function" then return encode_function(v, seen, path) end
  if t == "userdata" and core.is_tensor(v) then
    if v:is_closed() then error("isolate: " .. path .. " is a closed tensor", 0) end
    return string.format("T(%q,%q,%s,%q)", core.tensor_bytes(v), v.dtype, encode(v:size(), seen, path), v.device)
  end
  if t == "table" then
    if seen[v] then error("isolate: " .. path .. " is a cyclic table", 0) end
    if getmetatable(v) ~= nil then error("isolate: " .. path .. " is a table with a metatable (an object); pass plain data", 0) end
    seen[v] = true
    local parts = {}
    for k, x in pairs(v) do
      parts[#parts + 1] = "[" .. encode(k, seen, path) .. "]=" .. encode(x, seen, path .. "." .. tostring(k))
    end
    seen[v] = nil
    return "{" .. table.concat(parts, ",") .. "}"
  end
  error("isolate: " .. path .. " is a " .. t .. " and cannot cross the process boundary", 0)
end

ser.encode = function(v) return "return " .. encode(v) end

--- Decodes a string made by ser.encode. Tensors come back on `opts.device`
-- (default: the device they left from when usable, else cpu).
function ser.decode(src, opts)
  opts = opts or {}
  local env = {}
  env.math = math
  env.ENV = {}
  env.M = function(name) return require(name) end
  env.T = function(bytes, dtype, shape, device)
    local dev = opts.device or device
    if dev ~= "cpu" and core.device_count() == 0 then dev = "cpu" end
    return core.tensor_from_bytes(bytes, dtype, shape, dev)
  end
  env.F = function(code, ups)
    local f = assert(load(code, "=isolated", "b"))
    for i, u in ipairs(ups) do
      local name, v = u[1], u[2]
      if name == "_ENV" then v = _ENV end
      debug.setupvalue(f, i, v)
    end
    return f
  end
  local chunk = assert(load(src, "=serialized", "t", env))
  return chunk()
end

return ser
