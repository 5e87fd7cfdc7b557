--- Verdicts: exact bytes, allclose, cosine, NMSE, and the cross-layer
-- equivalence check. `mla.compare(a, b, opts)` returns a result that prints
-- as one table row; `mla.assert_close` raises with the full report.
--
-- b is the reference: relative errors divide by |b|. The one exception is
-- NMSE, which follows ggml literally: sum (a-b)^2 / sum a^2.
-- Every statistic comes from one pass in C (src/compare.c), on the GPU when
-- either tensor lives there; CPU and GPU return the same bits.
local mla = require "mlalab"
local core = mla.core

local M = {}

-- Tolerance sets from upstream tests (../shared/reference/testing-and-timing.md).
M.presets = {
  exact = { mode = "exact" },
  flashmla_dense_decode = { mode = "allclose+cosine", atol = 8e-4, rtol = 2.01 / 128, cos = 5e-6 },
  flashmla_sparse_decode = { mode = "allclose+cosine", atol = 1e-3, rtol = 2.01 / 128, cos = 5e-6 },
  flashmla_sparse_prefill = { mode = "allclose+cosine", atol = 8e-4, rtol = 3.01 / 128, cos = 7e-6 },
  flashmla_lse = { mode = "allclose", atol = 1e-6, rtol = 8.01 / 65536 },
  ggml = { mode = "nmse", nmse = 1e-7, nan = "fail" },
  ggml_matmul = { mode = "nmse", nmse = 5e-4, nan = "fail" },
  quant_roundtrip = { mode = "allclose", atol = 0.2, rtol = 0.2 },
}

local MODES = { exact = true, allclose = true, cosine = true, nmse = true }

-- Options ----------------------------------------------------------------------

local function parse_modes(m)
  local list = {}
  if type(m) == "string" then
    for w in m:gmatch("[^+,%s]+") do list[#list + 1] = w end
  elseif type(m) == "table" then
    for _, w in ipairs(m) do list[#list + 1] = w end
  end
  local set = {}
  for _, w in ipairs(list) do
    if not MODES[w] then error("compare: unknown mode '" .. tostring(w) .. "' (exact, allclose, cosine, nmse)", 4) end
    set[w] = true
  end
  return set
end

local OPTION_NAMES = { "mode", "atol", "rtol", "cos", "nmse", "nan", "first", "name", "preset", "min_count" }

--- Merges preset, then explicit options; infers modes from the tolerances given.
local function normalize(opts)
  if type(opts) == "string" then opts = M.presets[opts] and { preset = opts } or { mode = opts } end
  opts = opts or {}
  if type(opts) ~= "table" then error("compare: opts must be a table, a preset or a mode name, got " .. type(opts), 3) end
  require("mlalab.options").check("compare", opts, OPTION_NAMES, 3)
  local o = {}
  if opts.preset then
    local p = M.presets[opts.preset] or error("compare: unknown preset '" .. tostring(opts.preset) .. "'", 3)
    for k, v in pairs(p) do o[k] = v end
  end
  for k, v in pairs(opts) do o[k] = v end
  local modes = parse_modes(o.mode)
  if not o.mode then
    if o.atol or o.rtol then modes.allclose = true end
    if o.cos then modes.cosine = true end
    if o.nmse then modes.nmse = true end
    if not next(modes) then modes.exact = true end -- the tight default
  end
  o.modes = modes
  o.atol, o.rtol = o.atol or 0, o.rtol or 0
  o.cos, o.nmse = o.cos or 1e-6, o.nmse or 1e-7
  o.first = o.first or 5
  o.nan = o.nan or "match"
  if o.nan ~= "match" and o.nan ~= "fail" then error("compare: nan must be 'match' or 'fail'", 3) end
  o.min_count = o.min_count or 1
  return o
end

local function mode_name(modes)
  local out = {}
  for _, m in ipairs { "exact", "allclose", "cosine", "nmse" } do
    if modes[m] then out[#out + 1] = m end
  end
  return table.concat(out, "+")
end

-- Formatting -------------------------------------------------------------------

--- coords(shape, idx) -> the 0-based coordinates of flat row-major index idx in shape.
local function coords(shape, idx)
  local c = {}
  for d = #shape, 1, -1 do
    local s = shape[d]
    c[d] = s > 0 and idx % s or 0
    idx = s > 0 and idx // s or 0
  end
  return c
end
M.coords = coords

local function fmt_coords(c)
  if not c then return "-" end
  return "[" .. table.concat(c, ",") .. "]"
end

--- num(v) -> a number as the report prints it: 4 significant digits, "nan", "inf", "-inf", "-" for nil.
local function num(v)
  if v == nil then return "-" end
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" elseif v == -math.huge then return "-inf" end
  if v == 0 then return "0" end
  return string.format("%.4g", v)
end
M.num = num

local function hex(bits, nbits)
  return string.format("0x%0" .. math.max(1, nbits // 4) .. "x", bits & ((nbits >= 64) and -1 or ((1 << nbits) - 1)))
end

-- Result -------------------------------------------------------------------------

local Result = {}
Result.__index = Result

local COLS = { { "verdict", 7 }, { "case", 28 }, { "mode", 16 }, { "n", 11 }, { "bad", 9 }, { "max_abs", 20 },
  { "max_rel", 20 }, { "cos_diff", 9 }, { "nmse", 9 }, { "nan/inf", 8 } }

local function pad(s, w)
  s = tostring(s)
  if #s > w then return s:sub(1, w - 1) .. "~" end
  return s .. string.rep(" ", w - #s)
end

--- The header line of the verdicts table (the columns of r:row()).
function M.header()
  local p = {}
  for _, c in ipairs(COLS) do p[#p + 1] = pad(c[1], c[2]) end
  return table.concat(p, " ")
end

--- r:cells() -> the row's cells as strings, in the header's columns.
function Result:cells()
  return {
    self.verdict, self.name or "-", self.mode, self.compared, self.mismatches,
    num(self.max_abs) .. "@" .. fmt_coords(self.max_abs_at), num(self.max_rel) .. "@" .. fmt_coords(self.max_rel_at),
    num(self.cos_diff), num(self.nmse), self.specials_agree and "agree" or "DIFFER",
  }
end

--- r:row() -> one line: the cells padded to the header's widths (also tostring(r)).
function Result:row()
  local p, cells = {}, self:cells()
  for i, c in ipairs(COLS) do p[#p + 1] = pad(cells[i], c[2]) end
  return table.concat(p, " ")
end
Result.__tostring = Result.row

--- Multi-line report: the row, why it failed, the first mismatches.
function Result:report()
  local lines = { M.header(), self:row() }
  lines[#lines + 1] = string.format("  a: %s %s   b: %s %s   compared %d of %d elements on %s",
    self.dtype_a, fmt_coords(self.shape), self.dtype_b, fmt_coords(self.shape), self.compared, self.numel, self.ran_on)
  lines[#lines + 1] = string.format("  tolerances: atol=%s rtol=%s cos=%s nmse=%s nan=%s", num(self.tol.atol),
    num(self.tol.rtol), num(self.tol.cos), num(self.tol.nmse), self.tol.nan)
  lines[#lines + 1] = string.format("  NaN a/b: %d/%d   inf a/b: %d/%d   positions differing in NaN/inf: %d",
    self.nan_a, self.nan_b, self.inf_a, self.inf_b, self.class_diff)
  for _, r in ipairs(self.reasons) do lines[#lines + 1] = "  FAIL: " .. r end
  if #self.first > 0 then
    lines[#lines + 1] = string.format("  first %d of %d mismatches:", #self.first, self.mismatches)
    for _, m in ipairs(self.first) do
      lines[#lines + 1] = string.format("    at %-16s a=%-12s (%s)  b=%-12s (%s)  |a-b|=%s", fmt_coords(m.at), num(m.a),
        hex(m.abits, self.bits_a), num(m.b), hex(m.bbits, self.bits_b), num(math.abs(m.a - m.b)))
    end
  end
  return table.concat(lines, "\n")
end

local function dtype_bits(dt) return core.dtype_info(dt).bits end

local function build(a, b, o, s)
  local shape = a:size()
  local r = setmetatable({
    name = o.name, mode = mode_name(o.modes), modes = o.modes, shape = shape, numel = s.numel, compared = s.count,
    ran_on = s.ran_on, dtype_a = a.dtype, dtype_b = b.dtype, bits_a = dtype_bits(a.dtype), bits_b = dtype_bits(b.dtype),
    mismatches = s.bad, bits_diff = s.bits_diff, close_fail = s.close_fail, class_diff = s.class_diff,
    nan_a = s.nan_a, nan_b = s.nan_b, inf_a = s.inf_a, inf_b = s.inf_b, specials_agree = s.class_diff == 0,
    max_abs = s.max_abs, max_rel = s.max_rel,
    max_abs_at = s.at_max_abs and coords(shape, s.at_max_abs.idx),
    max_rel_at = s.at_max_rel and coords(shape, s.at_max_rel.idx),
    at_max_abs = s.at_max_abs, at_max_rel = s.at_max_rel,
    sums = { ab = s.sum_ab, aa = s.sum_aa, bb = s.sum_bb, dd = s.sum_dd },
    tol = { atol = o.atol, rtol = o.rtol, cos = o.cos, nmse = o.nmse, nan = o.nan },
    first = {}, reasons = {},
  }, Result)
  local den = s.sum_aa + s.sum_bb
  r.cos_diff = den > 0 and 1 - 2 * s.sum_ab / den or 0
  r.nmse = s.sum_aa > 0 and s.sum_dd / s.sum_aa or (s.sum_dd == 0 and 0 or math.huge)
  for i, m in ipairs(s.first) do
    r.first[i] = { at = coords(shape, m.idx), idx = m.idx, a = m.a, b = m.b, abits = m.abits, bbits = m.bbits }
  end
  return r
end

local function judge(r, o)
  local why = r.reasons
  if r.compared ~= r.numel then
    why[#why + 1] = string.format("the comparison visited %d of %d elements", r.compared, r.numel)
  end
  if r.compared < o.min_count then
    why[#why + 1] = string.format("only %d elements compared (at least %d needed): a dead comparison cannot pass",
      r.compared, o.min_count)
  end
  if o.modes.exact and r.bits_diff > 0 then
    why[#why + 1] = string.format("exact: %d elements differ in their bits", r.bits_diff)
  end
  local inexact = o.modes.allclose or o.modes.cosine or o.modes.nmse
  if inexact and r.class_diff > 0 then
    why[#why + 1] = string.format("NaN/inf positions differ at %d elements (a: %d NaN %d inf; b: %d NaN %d inf)",
      r.class_diff, r.nan_a, r.inf_a, r.nan_b, r.inf_b)
  end
  if o.nan == "fail" and r.nan_a + r.nan_b > 0 then
    why[#why + 1] = string.format("NaN present (a: %d, b: %d) and nan='fail'", r.nan_a, r.nan_b)
  end
  if o.modes.allclose and r.close_fail > 0 then
    why[#why + 1] = string.format("allclose: %d elements with |a-b| >= %s and |a-b|/|b| >= %s (max abs %s at %s)",
      r.close_fail, num(o.atol), num(o.rtol), num(r.max_abs), fmt_coords(r.max_abs_at))
  end
  if o.modes.cosine and not (r.cos_diff <= o.cos) then
    why[#why + 1] = string.format("cosine: 1 - 2*sum(ab)/sum(a^2+b^2) = %s > %s", num(r.cos_diff), num(o.cos))
  end
  if o.modes.nmse and not (r.nmse <= o.nmse) then
    why[#why + 1] = string.format("nmse: sum((a-b)^2)/sum(a^2) = %s > %s", num(r.nmse), num(o.nmse))
  end
  r.ok = #why == 0
  r.verdict = r.ok and "PASS" or "FAIL"
  return r
end

--- mla.compare(a, b, opts): opts = {mode="exact"|"allclose"|"cosine"|"nmse" or
-- a combination ("allclose+cosine", {"allclose","cosine"}), atol=, rtol=,
-- cos=, nmse=, nan="match"|"fail", first=5, name=, preset=, min_count=1}.
-- A string is a preset name or a mode.
function M.compare(a, b, opts)
  if not core.is_tensor(a) or not core.is_tensor(b) then error("compare: two tensors expected", 2) end
  local o = normalize(opts)
  local s = core.compare(a, b, {
    exact = o.modes.exact, close = o.modes.allclose, special = o.modes.allclose or o.modes.cosine or o.modes.nmse,
    no_nan = o.nan == "fail", atol = o.atol, rtol = o.rtol, first = o.first,
  })
  return judge(build(a, b, o, s), o)
end

--- mla.assert_close(a, b, opts): raises with the report unless the comparison passes.
function M.assert_close(a, b, opts)
  local r = M.compare(a, b, opts)
  if not r.ok then error("assert_close failed\n" .. r:report(), 2) end
  return r
end

--- Prints results as one table; returns true when all passed.
function M.table(results, out)
  out = out or io.stdout
  out:write(M.header(), "\n")
  local ok = true
  for _, r in ipairs(results) do
    out:write(r:row(), "\n")
    ok = ok and r.ok
  end
  return ok
end

-- Case IDs (ggml style) and suites ------------------------------------------------

--- "OP(k1=v1,k2=v2)" with parameters in the declared order (or sorted keys).
function M.case_id(op, params, order)
  params = params or {}
  if not order then
    order = {}
    for k in pairs(params) do order[#order + 1] = k end
    table.sort(order)
  end
  local parts = {}
  for _, k in ipairs(order) do
    local v = params[k]
    if v ~= nil then parts[#parts + 1] = k .. "=" .. (type(v) == "boolean" and (v and 1 or 0) or tostring(v)) end
  end
  return op .. "(" .. table.concat(parts, ",") .. ")"
end

local Suite = {}
Suite.__index = Suite

--- A list of named cases, each with its own tolerances; prints one table
-- and the list of failures at the end.
function M.suite(name, defaults)
  return setmetatable({ name = name, defaults = defaults or {}, results = {} }, Suite)
end

function Suite:check(case, a, b, opts)
  local o = {}
  for k, v in pairs(self.defaults) do o[k] = v end
  if type(opts) == "string" then opts = M.presets[opts] and { preset = opts } or { mode = opts } end
  for k, v in pairs(opts or {}) do o[k] = v end
  o.name = case
  local r = M.compare(a, b, o)
  self.results[#self.results + 1] = r
  return r
end

function Suite:failures()
  local f = {}
  for _, r in ipairs(self.results) do
    if not r.ok then f[#f + 1] = r end
  end
  return f
end

function Suite:report(out)
  out = out or io.stdout
  out:write("== ", self.name or "compare", " ==\n")
  local ok = M.table(self.results, out)
  local f = self:failures()
  out:write(string.format("%d passed, %d failed\n", #self.results - #f, #f))
  for _, r in ipairs(f) do out:write("  failed: ", r.name or "?", "\n") end
  return ok
end

-- Equivalence on a cross-layer view -----------------------------------------------
require("mlalab.compare_equivalence")(M, mla)

return M
