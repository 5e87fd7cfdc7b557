-- Pairs that run: every built-in (prefill, decode, stored layout) end to end
-- against the CPU reference, or refused with its reason; the top-k bugs of the
-- seeds caught; the seeds' requant scenario; the same matrix on a GPU (#gpu).
local mla = require "mlalab"
local S = require "support"
local PR = mla.pair_run

local PREFILLS = { "sparse_prefill_bf16", "sparse_kv_fp8", "trtllm_fp8", "dense_bf16" }
local DECODES = { "sparse_kv_fp8", "trtllm_fp8", "dense_bf16", "dense_fp8_blocked" }
local STORES = { "bf16", "fp8_pertensor", "fp8_ds_mla", "fp8_ds_mla_blocked" }

local function small(seed)
  return { b = 2, kv_lens = { 70 + seed % 13, 41 }, s_q = 3, h_q = 4, topk = 64, block_size = 16, device = "cpu" }
end

-- Every phase compared something and passed.
local function assert_passed(res)
  assert.is_true(res.ok, res:report())
  for _, phase in ipairs { "prefill", "decode" } do
    assert.is_true(res.phases[phase].compared > 0, phase .. " compared no element")
  end
end

local function run_matrix(size, extra)
  local o = { stores = STORES, prefills = PREFILLS, decodes = DECODES, size = size }
  for k, v in pairs(extra or {}) do o[k] = v end
  local ok, rows = pcall(PR.matrix, o)
  assert.is_true(ok, "the matrix raised: " .. tostring(rows))
  assert.equal(#STORES * #PREFILLS * #DECODES, #rows)
  local t = PR.tally(rows)
  for _, r in ipairs(rows) do
    if r.status == "REFUSED" then
      assert.truthy(r.refusal.message:find("to make it work", 1, true), r.refusal.message)
      assert.truthy(#r.refusal.short > 0)
    else
      assert.equal("PASS", r.status, PR.matrix_row(r) .. "\n" .. r.result:report())
      assert_passed(r.result)
    end
  end
  return rows, t
end

describe("pairing matrix on the CPU", function()
  it("every built-in prefill x decode x stored layout passes against the reference or is refused with its reason", function()
    mla.manual_seed(801)
    local rows, t = run_matrix(small(801))
    assert.equal(0, t.FAIL + t.ERROR)
    assert.is_true(t.PASS >= 20, "pairs that ran: " .. t.PASS)
    assert.is_true(t.REFUSED > 0)
    -- each stored layout runs some pair, and each transform and conversion is exercised
    local seen = {}
    for _, r in ipairs(rows) do
      if r.status == "PASS" then
        seen[r.store] = true
        for _, ph in pairs(r.result.phases) do
          seen[ph.method] = true
          if ph.conversion then seen[ph.conversion] = true end
        end
      end
    end
    for _, k in ipairs { "bf16", "fp8_pertensor", "fp8_ds_mla", "fp8_ds_mla_blocked", "PAGED", "RAGGED", "dense", "requant",
      "quantize", "dequant_ragged", "relayout" } do
      assert.is_true(seen[k] == true, k .. " never ran")
    end
  end)

  it("whole-pool dequant, when allowed, runs too (dense decode over a quantized pool)", function()
    mla.manual_seed(802)
    local rows = run_matrix(small(802), { allow = { "dequant_pool" } })
    local n = 0
    for _, r in ipairs(rows) do
      if r.status == "PASS" and r.result.phases.decode.conversion == "dequant_pool" then n = n + 1 end
    end
    assert.is_true(n > 0)
  end)
end)

describe("top-k transform bugs are caught", function()
  it("bf16 pool + sparse bf16 prefill resolves PAGED and passes; RAGGED there (sglang #21835) fails the check", function()
    mla.manual_seed(803)
    local p = mla.pair { prefill = "sparse_prefill_bf16", decode = "trtllm_fp8", store = "bf16" }
    assert.equal("PAGED", p.prefill.topk)
    local scn = mla.pair_scenario.new { store = "bf16", b = 2, kv_lens = { 90, 60 }, s_q = 3, h_q = 4, topk = 64,
      block_size = 16, device = "cpu" }
    assert_passed(p:run { scenario = scn })
    local bad = p:run { scenario = scn, force_topk = { prefill = "RAGGED" } }
    assert.is_false(bad.ok)
    assert.is_true(bad.phases.prefill.forced)
    assert.equal("FAIL", bad.phases.prefill.status)
    assert.is_true(bad.phases.prefill.out.close_fail > 0)
    assert.is_true(bad.phases.decode.ok) -- decode untouched by the prefill's mistake
  end)

  it("decode taking the prefill's RAGGED (the cancelling bugs of sglang #21011) fails the check", function()
    mla.manual_seed(804)
    local p = mla.pair { prefill = "sparse_prefill_bf16", decode = "sparse_kv_fp8", store = "fp8_ds_mla" }
    assert.equal("RAGGED", p.prefill.topk)
    assert.equal("PAGED", p.decode.topk)
    local scn = mla.pair_scenario.new { store = "fp8_ds_mla", b = 2, kv_lens = { 80, 50 }, s_q = 2, h_q = 4, topk = 64,
      block_size = 16, device = "cpu" }
    assert_passed(p:run { scenario = scn })
    local bad = p:run { scenario = scn, force_topk = { decode = p.prefill.topk } }
    assert.is_true(bad.phases.prefill.ok)
    assert.equal("FAIL", bad.phases.decode.status)
    assert.truthy(bad:why():find("decode out", 1, true))
  end)

  it("PAGED slot ids into ragged rows stop with an index error naming the entry, not a crash", function()
    mla.manual_seed(805)
    local p = mla.pair { prefill = "sparse_prefill_bf16", decode = "sparse_kv_fp8", store = "fp8_ds_mla" }
    local bad = p:run { size = { b = 2, kv_len = 60, s_q = 2, h_q = 4, topk = 64, block_size = 16, device = "cpu" },
      force_topk = { prefill = "PAGED" } }
    assert.equal("ERROR", bad.status)
    assert.truthy(bad.phases.prefill.error:find("is neither -1 nor a slot", 1, true), bad.phases.prefill.error)
  end)

  it("a transform that does not fit the backend is refused", function()
    local p = mla.pair { prefill = "dense_bf16", decode = "dense_bf16", store = "bf16" }
    local r = p:run { size = { b = 1, kv_len = 20, s_q = 2, h_q = 2, topk = 64, block_size = 16, device = "cpu" },
      force_topk = { decode = "PAGED" } }
    assert.equal("ERROR", r.phases.decode.status)
    assert.truthy(r.phases.decode.error:find("is dense: top-k 'PAGED' does not apply", 1, true))
    assert.is_true(r.phases.prefill.ok)
  end)
end)

describe("the seeds' scenario (sglang #21011)", function()
  it("trtllm store, kv-fp8 prefill through requant once per prefill, native trtllm decode, with times", function()
    mla.manual_seed(806)
    local p = mla.pair { prefill = "sparse_kv_fp8", decode = "trtllm_fp8", kv_dtype = "fp8" }
    assert.equal("fp8_pertensor", p.stored)
    local res = p:run { size = { b = 2, kv_lens = { 100, 77 }, s_q = 4, h_q = 4, topk = 64, block_size = 16,
      device = "cpu", tensor_scale = 2 ^ -7 }, time = true, bench = { min_samples = 2, max_time = 0.1 } }
    assert_passed(res)
    local pre, dec = res.phases.prefill, res.phases.decode
    assert.equal("requant", pre.conversion)
    assert.equal("prefill", pre.where)
    assert.equal(res.scenario.pool_tokens, pre.conv_rows)
    assert.is_nil(dec.conversion)
    assert.is_nil(pre.conv) -- lossless: judged against the stored reference directly
    for _, k in ipairs { "convert", "topk", "attn" } do assert.is_true(pre.times[k] > 0, k) end
    assert.equal(0, dec.times.convert)
  end)

  it("a lossy conversion is judged on what the kernel read, and its own error stays under LOSSY_COS", function()
    mla.manual_seed(807)
    local p = mla.pair { prefill = "sparse_kv_fp8", decode = "dense_bf16", store = "bf16" }
    assert.equal("quantize", p.prefill.conversion.name)
    local res = p:run { size = { b = 2, kv_len = 90, s_q = 2, h_q = 4, topk = 64, block_size = 16, device = "cpu" } }
    assert_passed(res)
    local conv = res.phases.prefill.conv
    assert.is_true(conv.cos_diff > 0 and conv.cos_diff <= PR.LOSSY_COS, tostring(conv.cos_diff))
  end)
end)

describe("pair runs: errors", function()
  it("a backend without run, a scenario of another layout and impossible sizes are clear errors", function()
    mla.backend.register { name = "spec_no_run_decode", phases = { "decode" }, reads = { "bf16" }, sparse = true,
      models = "a test" }
    local p = mla.pair { prefill = "dense_bf16", decode = "spec_no_run_decode", store = "bf16" }
    local r = p:run { size = { b = 1, kv_len = 20, s_q = 2, h_q = 2, topk = 64, block_size = 16, device = "cpu" } }
    assert.equal("ERROR", r.status)
    assert.truthy(r.phases.decode.error:find("backend 'spec_no_run_decode' has no run function", 1, true))
    local scn = mla.pair_scenario.new { store = "fp8_ds_mla", b = 1, kv_len = 20, s_q = 2, h_q = 2, topk = 64,
      block_size = 16, device = "cpu" }
    S.assert_error_contains(function() p:run { scenario = scn } end, "the scenario stores fp8_ds_mla, the pair bf16")
    S.assert_error_contains(function() mla.pair_scenario.new { store = "bf16", b = 2, kv_lens = { 10, 1 }, s_q = 2 } end,
      "kv_lens[2] = 1: each request needs at least s_q = 2 tokens")
    S.assert_error_contains(function() mla.pair_scenario.new { store = "bf16", b = 2, kv_lens = { 10 } } end,
      "kv_lens has 1 entries for b = 2 requests")
    S.assert_error_contains(function() mla.pair_scenario.new { b = 2 } end, "store (the stored layout's name) is required")
  end)
end)

-- GPU: the same matrix with the baked kernels and with the JIT attention -----------

for _, impl in ipairs { "baked", "jit" } do
  describe("pairing matrix on the GPU (" .. impl .. ")", function()
    S.on_device("cuda", before_each, after_each)
    it("every pair passes against the CPU reference or is refused #gpu", function()
      mla.manual_seed(900)
      local _, t = run_matrix({ b = 2, kv_lens = { 700, 301 }, s_q = 4, h_q = 64, topk = 128, block_size = 64 },
        { impl = impl, allow = { "dequant_pool" } })
      assert.is_true(t.PASS >= 20)
    end)
  end)
end
