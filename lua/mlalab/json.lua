--- A small JSON encoder and decoder (sweep records, bench reports, specs).
-- Encoding: integers stay integers, floats keep 17 significant digits,
-- NaN and +-inf become null (JSON has no spelling for them), object keys are
-- sorted (or follow `order`), a table with keys 1..n is an array.
local J = {}

J.null = setmetatable({}, { __tostring = function() return "null" end })

local ESC = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f", ["\n"] = "\\n", ["\r"] = "\\r",
  ["\t"] = "\\t" }

local function esc_str(s)
  return '"' .. s:gsub('[%c"\\]', function(c) return ESC[c] or string.format("\\u%04x", c:byte()) end) .. '"'
end

local function is_array(t)
  local n = #t
  local k = 0
  for _ in pairs(t) do
    k = k + 1
    if k > n then return false end
  end
  return k == n
end

local encode

local function encode_num(v)
  if math.type(v) == "integer" then return string.format("%d", v) end
  if v ~= v or v == math.huge or v == -math.huge then return "null" end
  if v == math.floor(v) and math.abs(v) < 1e15 then return string.format("%.1f", v) end
  return string.format("%.17g", v)
end

encode = function(v, out, order, seen)
  local t = type(v)
  if v == nil or v == J.null then out[#out + 1] = "null"
  elseif t == "boolean" then out[#out + 1] = v and "true" or "false"
  elseif t == "number" then out[#out + 1] = encode_num(v)
  elseif t == "string" then out[#out + 1] = esc_str(v)
  elseif t == "table" then
    if seen[v] then error("json: cycle in table", 0) end
    seen[v] = true
    if next(v) ~= nil and is_array(v) or (next(v) == nil and getmetatable(v) == J.array_mt) then
      out[#out + 1] = "["
      for i = 1, #v do
        if i > 1 then out[#out + 1] = "," end
        encode(v[i], out, nil, seen)
      end
      out[#out + 1] = "]"
    else
      local keys, used = {}, {}
      for _, k in ipairs(order or {}) do
        if v[k] ~= nil then keys[#keys + 1] = k used[k] = true end
      end
      local rest = {}
      for k in pairs(v) do
        if type(k) ~= "string" and type(k) ~= "number" then error("json: key of type " .. type(k), 0) end
        if not used[k] then rest[#rest + 1] = tostring(k) end
      end
      table.sort(rest)
      for _, k in ipairs(rest) do keys[#keys + 1] = k end
      out[#out + 1] = "{"
      for i, k in ipairs(keys) do
        if i > 1 then out[#out + 1] = "," end
        local val = v[k]
        if val == nil then val = v[tonumber(k)] end
        out[#out + 1] = esc_str(tostring(k))
        out[#out + 1] = ":"
        encode(val, out, nil, seen)
      end
      out[#out + 1] = "}"
    end
    seen[v] = nil
  else
    error("json: cannot encode a " .. t, 0)
  end
end

J.array_mt = {}
--- Marks a table as an array, so an empty one encodes as [].
function J.array(t) return setmetatable(t or {}, J.array_mt) end

--- json.encode(value, order): order lists the top-level keys to put first.
function J.encode(v, order)
  local out = {}
  encode(v, out, order, {})
  return table.concat(out)
end

-- Decoding --------------------------------------------------------------------

local function decode_error(s, i, what) error(string.format("json: %s at character %d", what, i), 0) end

local function skip(s, i)
  return s:find("[^ \t\r\n]", i) or #s + 1
end

local decode_value

local function utf8_of(cp) return utf8.char(cp) end

local function decode_string(s, i)
  local out, j = {}, i + 1
  while true do
    local c = s:sub(j, j)
    if c == "" then decode_error(s, j, "unterminated string") end
    if c == '"' then return table.concat(out), j + 1 end
    if c == "\\" then
      local e = s:sub(j + 1, j + 1)
      local map = { b = "\b", f = "\f", n = "\n", r = "\r", t = "\t", ['"'] = '"', ["\\"] = "\\", ["/"] = "/" }
      if map[e] then
        out[#out + 1] = map[e]
        j = j + 2
      elseif e == "u" then
        local hex = s:sub(j + 2, j + 5)
        if not hex:match("^%x%x%x%x$") then decode_error(s, j, "bad \\u escape") end
        local cp = tonumber(hex, 16)
        j = j + 6
        if cp >= 0xD800 and cp <= 0xDBFF and s:sub(j, j + 1) == "\\u" then
          local lo = tonumber(s:sub(j + 2, j + 5), 16)
          if lo and lo >= 0xDC00 and lo <= 0xDFFF then
            cp = 0x10000 + (cp - 0xD800) * 0x400 + (lo - 0xDC00)
            j = j + 6
          end
        end
        out[#out + 1] = utf8_of(cp)
      else
        decode_error(s, j, "bad escape")
      end
    else
      out[#out + 1] = c
      j = j + 1
    end
  end
end

decode_value = function(s, i)
  i = skip(s, i)
  local c = s:sub(i, i)
  if c == "{" then
    local obj = {}
    i = skip(s, i + 1)
    if s:sub(i, i) == "}" then return obj, i + 1 end
    while true do
      if s:sub(i, i) ~= '"' then decode_error(s, i, "expected a key") end
      local k
      k, i = decode_string(s, i)
      i = skip(s, i)
      if s:sub(i, i) ~= ":" then decode_error(s, i, "expected ':'") end
      local v
      v, i = decode_value(s, i + 1)
      obj[k] = v
      i = skip(s, i)
      local d = s:sub(i, i)
      if d == "}" then return obj, i + 1 end
      if d ~= "," then decode_error(s, i, "expected ',' or '}'") end
      i = skip(s, i + 1)
    end
  elseif c == "[" then
    local arr, n = J.array(), 0
    i = skip(s, i + 1)
    if s:sub(i, i) == "]" then return arr, i + 1 end
    while true do
      local v
      v, i = decode_value(s, i)
      n = n + 1
      arr[n] = v
      i = skip(s, i)
      local d = s:sub(i, i)
      if d == "]" then return arr, i + 1 end
      if d ~= "," then decode_error(s, i, "expected ',' or ']'") end
      i = i + 1
    end
  elseif c == '"' then
    return decode_string(s, i)
  elseif s:sub(i, i + 3) == "true" then return true, i + 4
  elseif s:sub(i, i + 4) == "false" then return false, i + 5
  elseif s:sub(i, i + 3) == "null" then return J.null, i + 4
  else
    local num = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", i)
    if not num or num == "" or num == "-" then decode_error(s, i, "unexpected character '" .. c .. "'") end
    local v = (num:find("[.eE]") and tonumber(num)) or math.tointeger(tonumber(num)) or tonumber(num)
    return v, i + #num
  end
end

--- json.decode(s) -> the value; malformed text raises naming the position.
function J.decode(s)
  if type(s) ~= "string" then error("json.decode: a string expected", 2) end
  local v, i = decode_value(s, 1)
  i = skip(s, i)
  if i <= #s then decode_error(s, i, "trailing characters") end
  return v
end

--- Reads a JSON-lines file into an array of records (blank lines skipped).
function J.read_lines(path)
  local f = assert(io.open(path, "r"))
  local out = {}
  for line in f:lines() do
    if line:find("%S") then out[#out + 1] = J.decode(line) end
  end
  f:close()
  return out
end

return J
