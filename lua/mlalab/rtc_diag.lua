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

return diag
