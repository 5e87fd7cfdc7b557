--- Mixed prefill/decode backends over one stored KV layout, end to end.
--
--   mlalab experiments/mixed_backend.lua [--device cpu] [--impl baked|jit] [--quick] [--jsonl FILE]
--
-- 1. The seeds' scenario (sglang #21011): KV stored in the trtllm-style
--    fp8_pertensor layout (576 B), prefill with the FlashMLA-kv-style
--    sparse_kv_fp8 backend after a requant to fp8_ds_mla (656 B) once per
--    prefill, decode with trtllm_fp8 reading the store directly; both phases
--    against the CPU reference on the stored cache, with the time of each
--    stage, and the alternative that requants on every decode step.
-- 2. The pairing matrix: every built-in prefill x decode backend x stored
--    layout (bf16, fp8_pertensor, fp8_ds_mla), with the top-k transform and
--    conversion of each phase; each pair passes against the reference or is
--    refused with its reason.
-- 3. The top-k bugs of the seeds, forced on purpose, each caught by the check.
-- On a CPU the attention calls run the CPU reference (impl ref): the checks
-- cover conversions, top-k transforms and the plumbing, not GPU kernels.
-- Exits 1 when any check fails.
local mla = require "mlalab"
local E = mla.experiment
local PR = mla.pair_run

local a = E.args({ ... }, { impl = "string", quick = "flag", jsonl = "string" }, "mixed_backend")
local gpu = mla.device() ~= "cpu"
local impl = a.impl or (gpu and "baked" or "ref")
mla.manual_seed(21011)
E.banner("mixed prefill/decode backends")
if not gpu then print("note: no GPU, so attention runs the CPU reference; conversions and top-k transforms run their CPU references") end
print("attention impl: " .. impl)
local v = E.verdicts()
local records = {}

-- Sizes: the headline at serving scale on a GPU (the last `check_q` prefill
-- tokens of each request checked against the CPU reference), small on a CPU.
local HEAD = gpu and not a.quick
  and { b = 2, kv_len = 8192, s_q = 64, h_q = 64, topk = 2048, block_size = 64, extra_blocks = 2048 - 2 * 129, check_q = 2 }
  or { b = 2, kv_len = 512, s_q = 8, h_q = 16, topk = 128, block_size = 64, extra_blocks = 48, check_q = 4 }
local MATRIX = gpu and { b = 2, kv_lens = { 1000, 600 }, s_q = 8, h_q = 64, topk = 256, block_size = 64 }
  or { b = 2, kv_lens = { 150, 97 }, s_q = 4, h_q = 8, topk = 64, block_size = 16 }
local BENCH = gpu and { max_time = 2 } or { min_samples = 3, max_time = 0.3 }

local function size_of(t)
  local s = {}
  for k, x in pairs(t) do if k ~= "check_q" then s[k] = x end end
  return s
end

-- 1. The seeds' scenario -------------------------------------------------------------

print("\n== 1. seeds' scenario (sglang #21011): store fp8_pertensor, prefill sparse_kv_fp8 via requant, decode trtllm_fp8 ==")
local head = mla.pair { prefill = "sparse_kv_fp8", decode = "trtllm_fp8", kv_dtype = "fp8", block_size = HEAD.block_size }
local scn = mla.pair_scenario.new((function() local s = size_of(HEAD) s.store = head.stored return s end)())
print(tostring(scn))
local res = head:run { scenario = scn, impl = impl, check_q = HEAD.check_q, time = true, bench = BENCH }
-- the alternative: the kv-fp8 backend decodes too, so the pool is requanted on every decode step
local alt = mla.pair { prefill = "sparse_kv_fp8", decode = "sparse_kv_fp8", store = "fp8_pertensor" }
local res_alt = alt:run { scenario = scn, impl = impl, check_q = HEAD.check_q, time = true, bench = BENCH }

local PH_FMT = "%-8s %-14s %-14s %-17s %-6s %9s %10s %10s %10s  %s"
print(string.format(PH_FMT, "phase", "backend", "reads", "conversion", "top-k", "max |d|", "convert", "top-k", "attention",
  "verdict"))
local function phase_line(label, r)
  local t = r.times or {}
  print(string.format(PH_FMT, label, r.backend, r.reads, r.conversion and (r.conversion .. "/" .. r.where) or "-",
    r.method, r.out and string.format("%.2g", r.out.max_abs) or "-", E.us(t.convert), E.us(t.topk), E.us(t.attn),
    r.status .. (r.error and (": " .. r.error) or "")))
end
phase_line("prefill", res.phases.prefill)
phase_line("decode", res.phases.decode)
phase_line("decode*", res_alt.phases.decode)
print("  * the alternative: sparse_kv_fp8 decodes too, so the 576 B pool is requanted on every decode step")
v:add("seeds' pair: prefill through requant matches the reference", res.phases.prefill.ok, res:why())
v:add("seeds' pair: trtllm decode matches the reference", res.phases.decode.ok, res:why())
v:add("alternative: requant per decode step matches the reference", res_alt.phases.decode.ok, res_alt:why())
v:add("resolver: requant runs once per prefill, never in trtllm decode",
  head.prefill.where == "prefill" and head.decode.conversion == nil and alt.decode.where == "call")

local pt, dt, at = res.phases.prefill.times, res.phases.decode.times, res_alt.phases.decode.times
if pt and dt and at then
  local steps = 16
  local bytes = head:extra_bytes(scn.pool_tokens, scn:ctx_tokens("prefill"), steps)
  local alt_bytes = alt:extra_bytes(scn.pool_tokens, scn:ctx_tokens("prefill"), steps)
  local native = pt.convert + pt.topk + pt.attn + steps * (dt.topk + dt.attn)
  local per_call = pt.convert + pt.topk + pt.attn + steps * (at.convert + at.topk + at.attn)
  print(string.format("one prefill + %d decode steps, per layer: requant once per prefill %s (%s moved), "
    .. "requant per call %s (%s moved, %.1fx)", steps, E.us(native), E.mb(bytes), E.us(per_call), E.mb(alt_bytes),
    per_call / native))
  records[#records + 1] = { section = "seeds", prefill_convert_s = pt.convert, prefill_attn_s = pt.attn,
    decode_attn_s = dt.attn, decode_requant_per_call_s = at.convert, once_total_s = native, per_call_total_s = per_call,
    extra_bytes_once = bytes, extra_bytes_per_call = alt_bytes }
end

-- 2. The pairing matrix ---------------------------------------------------------------

print("\n== 2. pairing matrix: every built-in prefill x decode x stored layout ==")
local NOTES = {
  ["bf16/sparse_prefill_bf16"] = "[a]", ["fp8_pertensor/sparse_kv_fp8/trtllm_fp8"] = "[b]",
  ["fp8_ds_mla/sparse_prefill_bf16/sparse_kv_fp8"] = "[c]", ["fp8_ds_mla/sparse_kv_fp8/dense_fp8_blocked"] = "[d]",
  ["fp8_ds_mla_blocked/sparse_kv_fp8/dense_fp8_blocked"] = "[e]",
}
print(PR.matrix_header())
local refused, reasons = {}, {}
local rows = PR.matrix {
  stores = { "bf16", "fp8_pertensor", "fp8_ds_mla", "fp8_ds_mla_blocked" }, size = MATRIX, impl = impl,
  progress = function(row)
    if row.status == "REFUSED" then -- grouped below, by reason
      local key = row.store .. ": " .. row.refusal.short
      if not refused[key] then refused[key] = {} reasons[#reasons + 1] = key end
      local other = row.refusal.phase == "prefill" and row.decode or row.prefill
      table.insert(refused[key], other)
      return
    end
    local note = NOTES[row.store .. "/" .. row.prefill .. "/" .. row.decode] or NOTES[row.store .. "/" .. row.prefill]
    print(PR.matrix_row(row) .. (note and " " .. note or ""))
    io.stdout:flush()
  end,
}
print("[a] sglang #21835: a bf16 pool with the sparse bf16 prefill needs PAGED (RAGGED crashed upstream)")
print("[b] sglang #21011, the seeds' pair   [c] a 656 B pool read by the bf16 sparse prefill: ragged dequant, RAGGED")
print("[d] FlashMLA's page-blocked dense decode on the sparse kernel's 656 B pool: a relayout every decode step")
print("[e] the same pair storing the page-blocked layout: one relayout per prefill instead of one per decode step")
print("refused, with the reason (the other phase's backends in brackets):")
for _, key in ipairs(reasons) do
  local seen, uniq = {}, {}
  for _, n in ipairs(refused[key]) do if not seen[n] then seen[n] = true uniq[#uniq + 1] = n end end
  print(string.format("  %s [%s]", key, table.concat(uniq, ", ")))
end
local t = PR.tally(rows)
print(string.format("%d pairs run and match the reference, %d refused with a reason, %d failed, %d errors",
  t.PASS, t.REFUSED, t.FAIL, t.ERROR))
for _, row in ipairs(rows) do
  if row.status ~= "REFUSED" then
    v:add(string.format("matrix %s: %s + %s", row.store, row.prefill, row.decode), row.status == "PASS",
      row.result:why())
  end
  records[#records + 1] = { section = "matrix", store = row.store, prefill = row.prefill, decode = row.decode,
    status = row.status, reason = row.refusal and row.refusal.short or (row.result and row.result:why()) }
end
v:add("matrix: some pairs are refused, each with its reason", t.REFUSED > 0)

-- 3. Bug cases --------------------------------------------------------------------------

print("\n== 3. top-k bugs forced on purpose: each must be caught ==")
local BUGS = {
  { what = "RAGGED for a bf16 pool + sparse prefill (sglang #21835)", store = "bf16",
    pair = { prefill = "sparse_prefill_bf16", decode = "trtllm_fp8" }, phase = "prefill", given = "RAGGED" },
  { what = "decode takes the prefill's transform (sglang #21011/#20850)", store = "fp8_ds_mla",
    pair = { prefill = "sparse_prefill_bf16", decode = "sparse_kv_fp8" }, phase = "decode", given = "RAGGED" },
  { what = "PAGED slot ids into ragged bf16 rows", store = "fp8_ds_mla",
    pair = { prefill = "sparse_prefill_bf16", decode = "sparse_kv_fp8" }, phase = "prefill", given = "PAGED" },
}
local BUG_FMT = "%-58s %-11s %-7s %-6s %-8s %s"
print(string.format(BUG_FMT, "bug", "stored", "phase", "given", "resolver", "result"))
for _, b in ipairs(BUGS) do
  local p = mla.pair { prefill = b.pair.prefill, decode = b.pair.decode, store = b.store }
  local r = p:run { size = MATRIX, impl = impl, force_topk = { [b.phase] = b.given } }
  local ph = r.phases[b.phase]
  local caught = not ph.ok
  local right = p[b.phase].topk ~= b.given
  print(string.format(BUG_FMT, b.what, b.store, b.phase, b.given, p[b.phase].topk,
    (caught and "caught: " or "MISSED: ") .. r:why():gsub(";.*", "")))
  v:add("bug caught: " .. b.what, caught, "the check passed a wrong transform")
  v:add("resolver avoids: " .. b.what, right)
  records[#records + 1] = { section = "bugs", bug = b.what, caught = caught, resolver = p[b.phase].topk, why = r:why() }
end

if a.jsonl then
  local f = assert(io.open(a.jsonl, "w"))
  for _, rec in ipairs(records) do f:write(mla.json.encode(rec), "\n") end
  f:close()
  print("records: " .. a.jsonl)
end
v:finish()
