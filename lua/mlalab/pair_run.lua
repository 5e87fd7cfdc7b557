--- Running a pairing end to end (`pair:run{...}`, `mla.pair_run.matrix{...}`).
--
-- For each phase (prefill: s_q query tokens per request; decode: one), on a
-- shared scenario (mlalab.pair_scenario):
--   1. decode only: the decode tokens are written (quantize-and-cache);
--   2. the phase's conversion runs (requant / quantize / dequant_pool /
--      dequant_ragged, mlalab.pair_convert), or the backend reads the pool;
--   3. the indexer's request-local top-k positions go through the phase's
--      transform (PAGED or RAGGED with mla.kernels; dense backends take the
--      block table instead);
--   4. the backend runs (backend.run, mla.attention.decode for the built-ins);
--   5. out and lse are compared with the CPU reference on the stored cache
--      (FlashMLA tolerances, out against the reference rounded to bf16). A
--      lossy conversion (quantize) is judged in two parts: the kernel
--      against the reference on what it read, and the conversion's own error
--      against the stored reference (cosine, LOSSY_COS).
-- opts.force_topk = { prefill = "RAGGED" } overrides the resolved transform:
-- the bug cases (sglang #21835, #21011) that a check must catch.
-- opts.time = true adds median times (mla.bench; CPU wall clock on the CPU)
-- of the conversion, the top-k transform and the attention call.
local mla = require "mlalab"
local K = require "mlalab.kernels"
local backend = require "mlalab.backend"
local scenario = require "mlalab.pair_scenario"
local convert = require "mlalab.pair_convert"

local M = {}

--- Largest cosine distance allowed between attention on an fp8-quantized
-- pool (e4m3, per-128 scales) and on the bf16 pool: measured ~4e-4 on
-- scenario data (q std 3, K std 0.1), so 5x headroom.
M.LOSSY_COS = 2e-3

local PRESET = {
  prefill = { sparse = "flashmla_sparse_prefill", dense = "flashmla_dense_decode" },
  decode = { sparse = "flashmla_sparse_decode", dense = "flashmla_dense_decode" },
}

local function fail(fmt, ...) error("pair.run: " .. string.format(fmt, ...), 0) end

local Result = {}
Result.__index = Result
M.Result = Result

-- The backend gets what its contract says it reads, or the run stops here.
local function check_reads(b, cache)
  local name = mla.layout.get(cache.layout).name
  if not b.reads[name] then
    fail("backend '%s' reads %s, but the phase hands it %s", b.name, table.concat(b.read_list, ", "), name)
  end
  if (b.input == "flat_bf16") ~= (cache.block_size == 1) then
    fail("backend '%s' reads %s input, but the phase hands it pages of %d tokens", b.name, b.input, cache.block_size)
  end
end

local function bench_opts(o, name, dev)
  local bo = { name = name, device = dev }
  local defaults = dev == "cpu" and { min_samples = 3, min_time = 0.05, max_time = 0.5, max_noise = 0.05 }
    or { max_time = 2, max_noise = 0.01 }
  for k, v in pairs(defaults) do bo[k] = v end
  for k, v in pairs(o.bench or {}) do bo[k] = v end
  return bo
end

-- The transform of a phase as a closure writing into a preallocated tensor.
local function topk_closure(scn, phase, method, cu_q)
  local dev = scn.device
  local s_q = scn:shape(phase)
  local out = mla.empty({ scn.b * s_q, scn.topk }, "i32", dev)
  local pos = scn.topk_pos[phase]
  if method == "PAGED" then
    return out, function(check) K.topk_paged(pos, scn.block_table, scn.block_size, { cu_q = cu_q, out = out, check = check }) end
  elseif method == "RAGGED" then
    local cu_k = mla.tensor(scn:cu_k(phase), "i32", dev)
    return out, function(check) K.topk_ragged(pos, cu_k, { cu_q = cu_q, out = out, check = check }) end
  end
  fail("unknown top-k transform '%s' (PAGED, RAGGED or dense)", tostring(method))
end

local function compare_phase(r, scn, phase, b, ph, input, out, lse, o)
  local kind = b.sparse and "sparse" or "dense"
  local lo, n = scn:checked(phase, o.check_q)
  local got_o = out:narrow(1, lo, n):to({ dtype = "f32", device = "cpu" })
  local got_l = lse:narrow(2, lo, n):to("cpu")
  local ro, rl = scn:reference(phase, kind, o.check_q)
  local lossy = ph.conversion and not ph.conversion.lossless
  if lossy then
    -- the kernel against the reference on what it read; the conversion against the stored reference
    local ko, kl = scn:reference(phase, kind, o.check_q, input.cache, "converted:" .. ph.conversion.name)
    r.conv = mla.compare(ko, ro, { mode = "cosine", cos = M.LOSSY_COS, name = "conversion" })
    ro, rl = ko, kl
  end
  r.out = mla.compare(got_o, ro:to("bf16"):to("f32"), { preset = PRESET[phase][kind], name = phase .. " out" })
  r.lse = mla.compare(got_l, rl, { preset = "flashmla_lse", name = phase .. " lse" })
  r.compared = r.out.compared
  r.ok = r.out.ok and r.lse.ok and (r.conv == nil or r.conv.ok) and r.compared > 0
end

local function run_phase(scn, pair, phase, o)
  local ph = pair[phase]
  local b = ph.backend
  local r = { phase = phase, backend = b.name, reads = ph.reads, conversion = ph.conversion and ph.conversion.name,
    where = ph.where, topk = ph.topk, ok = false }
  local method = o.force_topk and o.force_topk[phase] or ph.topk
  r.method, r.forced = method, method ~= ph.topk
  if (method == "dense") ~= not b.sparse then
    fail("%s backend '%s' is %s: top-k '%s' does not apply", phase, b.name, b.sparse and "sparse" or "dense", method)
  end
  if not b.run then fail("backend '%s' has no run function", b.name) end
  if phase == "decode" then scn:write_decode_tokens() end
  local dev = scn.device
  local input = convert.prepare(scn, ph, phase)
  input.run(true)
  check_reads(b, input.cache)
  local s_q, lens = scn:shape(phase)
  local ctx = { q = scn.q[phase], cache = input.cache, impl = o.impl, phase = phase }
  local topk_run
  if method == "dense" then
    ctx.block_table, ctx.cache_lens = scn.block_table, mla.tensor(lens, "i32", dev)
  else
    local cu_q = {}
    for i = 0, scn.b do cu_q[i + 1] = i * s_q end
    local idx
    idx, topk_run = topk_closure(scn, phase, method, mla.tensor(cu_q, "i32", dev))
    topk_run(true)
    ctx.indices = idx:reshape({ scn.b, s_q, scn.topk })
  end
  local out, lse = b.run(ctx)
  compare_phase(r, scn, phase, b, ph, input, out, lse, o)
  r.status = r.ok and "PASS" or "FAIL"
  r.conv_rows = input.rows
  if o.time then
    local t = {}
    if input.rows > 0 then t.convert = mla.bench(function() input.run(false) end, bench_opts(o, phase .. " convert", dev)) end
    if topk_run then t.topk = mla.bench(function() topk_run(false) end, bench_opts(o, phase .. " top-k", dev)) end
    ctx.out, ctx.lse, ctx.check = out, lse, false
    t.attn = mla.bench(function() b.run(ctx) end, bench_opts(o, phase .. " attention", dev))
    r.bench = t
    r.times = { convert = t.convert and t.convert.median or 0, topk = t.topk and t.topk.median or 0, attn = t.attn.median }
  end
  return r
end

local RUN_KEYS = { "scenario", "size", "impl", "check_q", "force_topk", "time", "bench" }
local MATRIX_KEYS = { "stores", "prefills", "decodes", "allow", "size", "impl", "check_q", "time", "bench", "progress" }

--- Runs a resolved pair (mla.pair{...}) end to end. opts: scenario (shared,
-- its store must be the pair's) or size = options of pair_scenario.new;
-- impl ("baked" | "jit" | "ref"), check_q (last query tokens compared per
-- request), force_topk, time, bench (mla.bench options).
function M.run(pair, o)
  o = o or {}
  require("mlalab.options").check("pair.run", o, RUN_KEYS)
  local scn = o.scenario
  if scn then
    if scn.store ~= pair.stored then fail("the scenario stores %s, the pair %s", scn.store, pair.stored) end
  else
    local so = {}
    for k, v in pairs(o.size or {}) do so[k] = v end
    so.store = pair.stored
    scn = scenario.new(so)
  end
  local res = setmetatable({ pair = pair, stored = pair.stored, scenario = scn, device = scn.device, phases = {}, ok = true }, Result)
  for _, phase in ipairs { "prefill", "decode" } do
    local ok, r = pcall(run_phase, scn, pair, phase, o)
    if not ok then
      local ph = pair[phase]
      r = { phase = phase, backend = ph.backend.name, reads = ph.reads, conversion = ph.conversion and ph.conversion.name,
        where = ph.where, topk = ph.topk, method = o.force_topk and o.force_topk[phase] or ph.topk, ok = false,
        status = "ERROR", error = tostring(r) }
      r.forced = r.method ~= ph.topk
    end
    res.phases[phase] = r
    res.ok = res.ok and r.ok
  end
  res.status = res.ok and "PASS" or ((res.phases.prefill.status == "ERROR" or res.phases.decode.status == "ERROR") and "ERROR" or "FAIL")
  return res
end

-- A failed comparison in a few words.
local function short(c)
  if c.close_fail and c.close_fail > 0 then
    return string.format("%s: %d of %d off, max |d| %.3g", c.name, c.close_fail, c.compared, c.max_abs)
  end
  return c.name .. ": " .. (c.reasons[1] or "failed")
end

--- One line on what failed (or "" when everything passed).
function Result:why()
  local w = {}
  for _, phase in ipairs { "prefill", "decode" } do
    local r = self.phases[phase]
    if r.error then
      w[#w + 1] = phase .. " error: " .. r.error:gsub("\n.*", ""):gsub("^[^:]*%.lua:%d+: ", "")
    elseif not r.ok then
      local bad = {}
      for _, k in ipairs { "out", "lse", "conv" } do
        if r[k] and not r[k].ok then bad[#bad + 1] = short(r[k]) end
      end
      w[#w + 1] = table.concat(bad, "; ")
    end
  end
  return table.concat(w, " | ")
end

--- Every comparison of both phases as full reports.
function Result:report()
  local lines = { string.format("%s: %s", tostring(self.pair), self.status) }
  for _, phase in ipairs { "prefill", "decode" } do
    local r = self.phases[phase]
    if r.error then lines[#lines + 1] = phase .. ": " .. r.error end
    for _, k in ipairs { "out", "lse", "conv" } do
      if r[k] then lines[#lines + 1] = r[k]:report() end
    end
  end
  return table.concat(lines, "\n")
end

-- The matrix -------------------------------------------------------------------------

local function names(list, phase)
  if list then return list end
  local out = {}
  for _, n in ipairs(backend.list()) do
    if backend.get(n).phases[phase] then out[#out + 1] = n end
  end
  return out
end

--- matrix{stores = {"bf16", "fp8_pertensor", "fp8_ds_mla", "fp8_ds_mla_blocked"}, prefills =, decodes = (default: every
-- registered backend of the phase), allow = {...}, size = scenario options, impl, check_q, time, bench}
-- -> rows { store, prefill, decode, status = PASS | FAIL | ERROR | REFUSED, result | refusal }.
-- One scenario per stored layout, shared by its pairs (references computed once).
function M.matrix(o)
  o = o or {}
  require("mlalab.options").check("pair_run.matrix", o, MATRIX_KEYS)
  local rows = {}
  for _, st in ipairs(o.stores or { "bf16", "fp8_pertensor", "fp8_ds_mla", "fp8_ds_mla_blocked" }) do
    local scn
    for _, pre in ipairs(names(o.prefills, "prefill")) do
      for _, dec in ipairs(names(o.decodes, "decode")) do
        local row = { store = st, prefill = pre, decode = dec }
        local p, refusal = backend.resolve({ prefill = pre, decode = dec, store = st, allow = o.allow })
        if not p then
          row.status, row.refusal = "REFUSED", refusal
        else
          if not scn then
            local so = {}
            for k, v in pairs(o.size or {}) do so[k] = v end
            so.store = st
            scn = scenario.new(so)
          end
          local ro = { scenario = scn }
          for _, k in ipairs(RUN_KEYS) do
            if k ~= "size" and k ~= "scenario" then ro[k] = o[k] end
          end
          row.pair, row.result = p, M.run(p, ro)
          row.status = row.result.status
        end
        rows[#rows + 1] = row
        if o.progress then o.progress(row) end
      end
    end
  end
  return rows
end

local function conv_cell(r)
  if not r.conversion then return "-" end
  return r.conversion .. "/" .. r.where
end

local MATRIX_FMT = "%-18s %-19s %-6s %-20s %-17s %-6s %-20s %s"

--- The header line of the matrix table (the columns of matrix_row).
function M.matrix_header()
  return string.format(MATRIX_FMT, "stored", "prefill", "top-k", "conversion", "decode", "top-k", "conversion", "verdict")
end

--- One table row of a matrix entry.
function M.matrix_row(row)
  if row.status == "REFUSED" then
    return string.format(MATRIX_FMT, row.store, row.prefill, "", "", row.decode, "", "", "refused: " .. row.refusal.short)
  end
  local pr, dr = row.result.phases.prefill, row.result.phases.decode
  local v = row.status
  if row.status ~= "PASS" then v = v .. ": " .. row.result:why() end
  return string.format(MATRIX_FMT, row.store, row.prefill, pr.method, conv_cell(pr), row.decode, dr.method, conv_cell(dr), v)
end

--- Counts of a matrix by status.
function M.tally(rows)
  local t = { PASS = 0, FAIL = 0, ERROR = 0, REFUSED = 0 }
  for _, r in ipairs(rows) do t[r.status] = t[r.status] + 1 end
  return t
end

return M
