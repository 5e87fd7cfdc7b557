--- Reading NVRTC's log: compile errors as Lua error objects that point at
-- kernels_rtc/<file>(line) with the offending source lines, and per-kernel
-- resource usage from the ptxas -v lines (registers, spills, shared memory),
-- which NVRTC prints without a GPU.
local diag = {}

-- Error objects ------------------------------------------------------------

local CompileError = {}
CompileError.__index = CompileError
CompileError.__tostring = function(e) return e.text end
diag.CompileError = CompileError

--- True for a compile error raised by mla.rtc.
function diag.is_compile_error(e) return getmetatable(e) == CompileError end

local function split_lines(s)
  local out = {}
  for line in (s .. "\n"):gmatch("([^\n]*)\n") do out[#out + 1] = line:gsub("\r$", "") end
  return out
end

--- Diagnostics of a log: { {file=, line=, severity=, message=, raw=}, ... } in log order.
function diag.parse_log(log)
  local out = {}
  for raw in (log or ""):gmatch("[^\n]+") do
    local file, line, sev, msg = raw:match("^(.-)%((%d+)%): (%a[%a ]-): (.*)$")
    if file and (sev == "error" or sev == "warning" or sev == "catastrophic error" or sev == "remark") then
      out[#out + 1] = { file = file, line = tonumber(line), severity = sev, message = msg, raw = raw }
    elseif raw:match("^nvrtc: error") or raw:match("^error") then
      out[#out + 1] = { severity = "error", message = raw, raw = raw }
    end
  end
  return out
end

--- Builds the error object of a failed compile.
-- ctx: program (name), options (list), arch, log, source_of(name) -> text, shown_path(name) -> display path.
function diag.compile_error(ctx)
  local items = diag.parse_log(ctx.log)
  local errors = {}
  for _, d in ipairs(items) do
    if d.severity ~= "warning" and d.severity ~= "remark" then errors[#errors + 1] = d end
  end
  if #errors == 0 then errors[1] = { severity = "error", message = (ctx.log or ""):match("[^\n]+") or "NVRTC failed without a message" } end
  local excerpt = {}
  for i, e in ipairs(errors) do
    if e.file then
      e.path = ctx.shown_path(e.file)
      local text = ctx.source_of(e.file)
      local lines = text and split_lines(text)
      if lines and lines[e.line] then
        e.source = lines[e.line]
        if i <= 5 then
          for l = math.max(1, e.line - 1), math.min(#lines, e.line + 1) do
            excerpt[#excerpt + 1] = string.format("%s %5d | %s", l == e.line and ">" or " ", l, lines[l])
          end
          excerpt[#excerpt + 1] = string.format("        ^ %s(%d): %s", e.path, e.line, e.message)
        end
      end
    end
  end
  local first = errors[1]
  local message = first.file and string.format("%s(%d): %s: %s", first.path, first.line, first.severity, first.message)
    or first.message
  local parts = { message }
  if #excerpt > 0 then parts[#parts + 1] = table.concat(excerpt, "\n") end
  if #errors > 1 then parts[#parts + 1] = string.format("(%d errors; all of them in err.errors, the NVRTC log in err.log)", #errors)
  else parts[#parts + 1] = "(the NVRTC log is in err.log, the options in err.options)" end
  return setmetatable({
    message = message, errors = errors, log = ctx.log, options = ctx.options, program = ctx.program, arch = ctx.arch,
    text = table.concat(parts, "\n"),
  }, CompileError)
end

-- Resources -------------------------------------------------------------------

--- Per-entry resource usage from the ptxas -v lines of a log:
-- { [mangled] = {registers=, spill_stores=, spill_loads=, stack=, shared_mem=, barriers=, cmem=} }
function diag.resources(log)
  local out, entries, current = {}, {}, nil
  for line in (log or ""):gmatch("[^\n]+") do
    local e = line:match("Compiling entry function '([^']+)'")
    if e then
      entries[e] = true
      current = e
      out[e] = out[e] or { registers = 0, spill_stores = 0, spill_loads = 0, stack = 0, shared_mem = 0, barriers = 0, cmem = 0 }
    end
    local f = line:match("Function properties for (%S+)")
    if f then current = entries[f] and f or nil end
    local r = current and out[current]
    if r then
      local stack, st, ld = line:match("(%d+) bytes stack frame, (%d+) bytes spill stores, (%d+) bytes spill loads")
      if stack then r.stack, r.spill_stores, r.spill_loads = tonumber(stack), tonumber(st), tonumber(ld) end
      local regs = line:match("Used (%d+) registers")
      if regs then
        r.registers = tonumber(regs)
        r.barriers = tonumber(line:match("used (%d+) barriers") or 0)
        r.shared_mem = tonumber(line:match("(%d+) bytes smem") or 0)
        r.cmem = tonumber(line:match("(%d+) bytes cmem%[0%]") or 0)
      end
    end
  end
  return out
end

--- The log without ptxas info lines: what a researcher wants to see (warnings).
function diag.warnings(log)
  local out = {}
  for line in (log or ""):gmatch("[^\n]+") do
    if not line:match("^ptxas") then out[#out + 1] = line end
  end
  return table.concat(out, "\n")
end

-- Names -------------------------------------------------------------------------

--- The function name inside an Itanium-mangled kernel name (the last
-- component of a nested name), or the name itself for extern "C" kernels.
function diag.base_name(mangled)
  if mangled:sub(1, 2) ~= "_Z" then return mangled end
  local s, pos = mangled, 3
  local nested = s:sub(pos, pos) == "N"
  if nested then pos = pos + 1 end
  local last
  while true do
    local c = s:sub(pos, pos)
    if c == "L" then pos = pos + 1 end -- internal linkage
    local len = s:match("^(%d+)", pos)
    if not len then break end
    pos = pos + #len
    last = s:sub(pos, pos + tonumber(len) - 1)
    pos = pos + tonumber(len)
    if not nested then break end
    if s:sub(pos, pos) == "I" then -- template args of an inner component: skip them
      local depth = 0
      repeat
        local ch = s:sub(pos, pos)
        local n = ch:match("%d") and s:match("^(%d+)", pos)
        local literal = s:sub(pos - 2, pos - 2) == "L" or (s:sub(pos - 1, pos - 1) == "n" and s:sub(pos - 3, pos - 3) == "L")
        if n and not literal then
          pos = pos + #n + tonumber(n) -- a source name: skip its characters
        else
          if ch == "I" then depth = depth + 1 elseif ch == "E" then depth = depth - 1 end
          pos = pos + 1
        end
      until depth == 0 or pos > #s
    end
    if s:sub(pos, pos) == "E" then break end
  end
  return last or mangled
end

-- Parameter names --------------------------------------------------------------

-- Source with comments and string/char literals blanked (same length).
local function strip_comments(src)
  local out, i, n = {}, 1, #src
  while i <= n do
    local c2 = src:sub(i, i + 1)
    if c2 == "//" then
      local j = src:find("\n", i, true) or n + 1
      out[#out + 1] = string.rep(" ", j - i); i = j
    elseif c2 == "/*" then
      local _, j = src:find("*/", i + 2, true)
      j = j or n
      out[#out + 1] = (src:sub(i, j):gsub("[^\n]", " ")); i = j + 1
    elseif src:sub(i, i) == '"' or src:sub(i, i) == "'" then
      local q, j = src:sub(i, i), i + 1
      while j <= n and src:sub(j, j) ~= q do j = j + (src:sub(j, j) == "\\" and 2 or 1) end
      out[#out + 1] = q .. string.rep(" ", j - i - 1) .. q; i = j + 1
    else
      local j = src:find("[/\"']", i) or n + 1
      if j == i then j = i + 1 end
      out[#out + 1] = src:sub(i, j - 1); i = j
    end
  end
  return table.concat(out)
end

-- Index just past the bracket closing the one at `i` (any of ( [ { <), or nil.
local OPEN = { ["("] = ")", ["["] = "]", ["{"] = "}", ["<"] = ">" }
local function close_of(s, i)
  local depth = 0
  for j = i, #s do
    local c = s:sub(j, j)
    if OPEN[c] then depth = depth + 1 elseif c == ")" or c == "]" or c == "}" or c == ">" then
      depth = depth - 1
      if depth == 0 then return j + 1 end
    end
  end
  return nil
end

local TYPE_WORDS = { int = 1, float = 1, double = 1, char = 1, short = 1, long = 1, bool = 1, void = 1, unsigned = 1,
  signed = 1, const = 1, volatile = 1, __restrict__ = 1, restrict = 1, struct = 1, size_t = 1, auto = 1 }

-- The declared name of one parameter's text, or nil when it has none.
local function param_name(p)
  local depth, cut = 0, #p
  for j = 1, #p do -- drop a default value
    local c = p:sub(j, j)
    if OPEN[c] then depth = depth + 1 elseif c == ")" or c == "]" or c == "}" or c == ">" then depth = depth - 1
    elseif c == "=" and depth == 0 then cut = j - 1; break end
  end
  p = p:sub(1, cut):gsub("%b[]", ""):gsub("%s+$", "")
  local name = p:match("([%a_][%w_]*)$")
  if not name or TYPE_WORDS[name] or p:match("^%s*" .. name .. "$") or p:find("::%s*" .. name .. "$") then return nil end
  return name
end

--- Parameter names of the kernel `base` (a function name) declared
-- __global__ in `src`, for a parameter list of `count` entries; nil when
-- the declaration cannot be found or read.
function diag.param_names(src, base, count)
  if type(src) ~= "string" or not base then return nil end
  local s = strip_comments(src)
  local pos = 1
  while true do
    local g = s:find("__global__", pos, true)
    if not g then return nil end
    pos = g + 10
    -- the first identifier followed by "(" that is not an attribute names the function
    local i = pos
    local name, open
    while true do
      local a, b, id = s:find("([%a_][%w_]*)%s*%(", i)
      if not a then break end
      if id == "__launch_bounds__" or id == "__attribute__" or id == "__declspec" then
        i = close_of(s, s:find("(", b, true)) or #s + 1
      else
        name, open = id, b
        break
      end
    end
    if name == base and open then
      local close = close_of(s, open)
      if close then
        local body = s:sub(open + 1, close - 2)
        local names, depth, start = {}, 0, 1
        if body:match("^%s*void%s*$") or body:match("^%s*$") then body = "" end
        for j = 1, #body + 1 do
          local c = body:sub(j, j)
          if OPEN[c] then depth = depth + 1 elseif c == ")" or c == "]" or c == "}" or c == ">" then depth = depth - 1
          elseif (c == "," and depth == 0) or j == #body + 1 then
            if body ~= "" then names[#names + 1] = param_name(body:sub(start, j - 1)) or ("#" .. (#names + 1)) end
            start = j + 1
          end
        end
        if count == nil or #names == count then return names end
      end
    end
  end
end

return diag
