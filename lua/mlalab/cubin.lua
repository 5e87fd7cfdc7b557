--- Machine code of cubins, compared kernel by kernel without a disassembler:
-- did a change (a refactor, a header moved, a comment) leave a kernel's
-- instructions as they were? Works on any cubin, from NVRTC (`mla.rtc`
-- modules carry theirs as `.cubin`) or from `nvcc -cubin` with the build's
-- flags, and needs no GPU.
--
--   local cubin = require "mlalab.cubin"
--   cubin.diff_files("before.cubin", "after.cubin")     -- prints one line a kernel
--   local rows = cubin.compare(a_bytes, b_bytes, "rs16")  -- kernels whose name contains "rs16"
--
-- A kernel's code is its ELF section `.text.<mangled name>`. Two kernels are
-- "same" when those bytes are equal (debug sections such as .debug_line may
-- still differ: they only move with line numbers). Otherwise the report gives
-- both lengths in 16-byte instructions and how many lead and trail
-- identically: a prologue-only change keeps a long identical tail, since
-- branches are PC-relative. Register renaming shows as a difference (the
-- bytes change); mask it with a disassembler where it matters.
local M = {}

local INSTR = 16 -- bytes an instruction (sm_70 and later)

local function fail(what, msg) error("cubin: " .. what .. ": " .. msg, 3) end

--- Sections of an ELF64 little-endian image: { [name] = bytes }.
function M.sections(bytes, what)
  what = what or "image"
  if type(bytes) ~= "string" then fail(what, "expected the file's bytes (a string), got " .. type(bytes)) end
  if #bytes < 64 or bytes:sub(1, 4) ~= "\127ELF" then fail(what, "not an ELF file") end
  if bytes:byte(5) ~= 2 or bytes:byte(6) ~= 1 then fail(what, "not a 64-bit little-endian ELF (a cubin is)") end
  local shoff = string.unpack("<I8", bytes, 0x29)
  local shentsize, shnum, shstrndx = string.unpack("<I2I2I2", bytes, 0x3B)
  if shentsize < 64 or shnum == 0 or shstrndx >= shnum or shoff + shnum * shentsize > #bytes then
    fail(what, "its section header table lies outside the file (truncated?)")
  end
  local hdr = {}
  for i = 0, shnum - 1 do
    local name, typ, _, _, off, size = string.unpack("<I4I4I8I8I8I8", bytes, shoff + i * shentsize + 1)
    hdr[i] = { name = name, nobits = typ == 8, off = off, size = size } -- SHT_NOBITS: no bytes in the file
  end
  local str = hdr[shstrndx]
  if str.off + str.size > #bytes then fail(what, "its section name table lies outside the file") end
  local out = {}
  for i = 0, shnum - 1 do
    local h = hdr[i]
    local at = str.off + h.name + 1
    local e = bytes:find("\0", at, true)
    if not e or e > str.off + str.size + 1 then fail(what, "section " .. i .. " has no name in the name table") end
    local name = bytes:sub(at, e - 1)
    if not h.nobits then -- .bss, .nv.shared.*: a size but no bytes in the file
      if h.off + h.size > #bytes then fail(what, "section " .. name .. " lies outside the file (truncated?)") end
      out[name] = bytes:sub(h.off + 1, h.off + h.size)
    end
  end
  return out
end

--- Kernels of a cubin: { [mangled name] = code bytes }.
function M.kernels(bytes, what)
  local k = {}
  for name, b in pairs(M.sections(bytes, what)) do
    local kn = name:match("^%.text%.(.+)$")
    if kn then k[kn] = b end
  end
  return k
end

local function common_prefix(a, b)
  local n = math.min(#a, #b) // INSTR
  for i = 0, n - 1 do
    if a:sub(i * INSTR + 1, (i + 1) * INSTR) ~= b:sub(i * INSTR + 1, (i + 1) * INSTR) then return i end
  end
  return n
end

local function common_suffix(a, b, limit)
  for i = 0, limit - 1 do
    if a:sub(#a - (i + 1) * INSTR + 1, #a - i * INSTR) ~= b:sub(#b - (i + 1) * INSTR + 1, #b - i * INSTR) then return i end
  end
  return limit
end

--- Rows { name, status = "same" | "differs" | "only_a" | "only_b", a, b (instructions),
-- prefix, suffix (instructions identical at the start and the end) }, sorted by name;
-- `pattern` (plain text) keeps the kernels whose name contains it.
function M.compare(a_bytes, b_bytes, pattern)
  local ka, kb = M.kernels(a_bytes, "first cubin"), M.kernels(b_bytes, "second cubin")
  local names, seen = {}, {}
  for _, k in ipairs { ka, kb } do
    for n in pairs(k) do
      if not seen[n] and (not pattern or n:find(pattern, 1, true)) then seen[n] = true, table.insert(names, n) end
    end
  end
  table.sort(names)
  local rows = {}
  for _, n in ipairs(names) do
    local x, y = ka[n], kb[n]
    local r = { name = n, a = x and #x // INSTR, b = y and #y // INSTR }
    if not x then r.status = "only_b"
    elseif not y then r.status = "only_a"
    elseif x == y then r.status, r.prefix, r.suffix = "same", r.a, r.a
    else
      r.status = "differs"
      r.prefix = common_prefix(x, y)
      r.suffix = common_suffix(x, y, math.min(r.a, r.b) - r.prefix)
    end
    rows[#rows + 1] = r
  end
  return rows
end

--- The rows as text, one line a kernel, then a count by status.
function M.report(rows)
  local lines, count = {}, {}
  for _, r in ipairs(rows) do
    count[r.status] = (count[r.status] or 0) + 1
    local what
    if r.status == "same" then what = string.format("same     %6d instructions", r.a)
    elseif r.status == "differs" then
      what = string.format("differs  %6d -> %d instructions, the first %d and the last %d identical", r.a, r.b,
        r.prefix, r.suffix)
    elseif r.status == "only_a" then what = string.format("only in the first  (%d instructions)", r.a)
    else what = string.format("only in the second (%d instructions)", r.b) end
    lines[#lines + 1] = what .. "  " .. r.name
  end
  local tally = {}
  for _, s in ipairs { "same", "differs", "only_a", "only_b" } do
    if count[s] then tally[#tally + 1] = count[s] .. " " .. s end
  end
  lines[#lines + 1] = #rows .. " kernels: " .. (#tally > 0 and table.concat(tally, ", ") or "none")
  return table.concat(lines, "\n")
end

local function read(path)
  local f, err = io.open(path, "rb")
  if not f then error("cubin: cannot open " .. tostring(path) .. ": " .. tostring(err), 3) end
  local b = f:read("a")
  f:close()
  return b
end

--- Compares two cubin files, prints the report and returns the rows.
function M.diff_files(a_path, b_path, pattern)
  local rows = M.compare(read(a_path), read(b_path), pattern)
  print(M.report(rows))
  return rows
end

return M
