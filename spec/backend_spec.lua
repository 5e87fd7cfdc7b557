-- Backend registry and pairing resolution (CPU): the contracts of the seeds'
-- backends, the top-k transform per phase, conversions and their placement,
-- and every unsupported pair failing with its reason.
local mla = require "mlalab"
local S = require "support"
local B = mla.backend

describe("backend registry", function()
  it("holds the built-in contracts", function()
    local names = B.list()
    for _, n in ipairs { "sparse_prefill_bf16", "sparse_kv_fp8", "trtllm_fp8", "dense_bf16" } do
      assert.truthy(B.get(n), n)
      assert.is_true(#B.get(n).models > 0, n .. " says which upstream contract it models")
    end
    assert.is_true(#names >= 4)
  end)

  it("rejects malformed registrations with the reason", function()
    S.assert_error_contains(function() B.register { name = "x", phases = { "train" }, reads = { "bf16" }, sparse = true } end, "unknown phase 'train'")
    S.assert_error_contains(function() B.register { name = "x", phases = { "decode" }, reads = { "nope" }, sparse = true } end, "unknown layout 'nope'")
    S.assert_error_contains(function() B.register { name = "x", phases = { "decode" }, reads = { "fp8_ds_mla" }, input = "flat_bf16", sparse = true } end, "reads bf16 rows only")
    S.assert_error_contains(function() B.register { name = "x", phases = { "decode" }, reads = { "bf16" } } end, "sparse must be")
    S.assert_error_contains(function() B.get("missing") end, "registered:")
  end)

  it("accepts a researcher's backend and pairs it", function()
    B.register { name = "my_v4_decode", phases = { "decode" }, reads = { "fp8_v4" }, sparse = true, models = "a test" }
    local p = mla.pair { prefill = "sparse_prefill_bf16", decode = "my_v4_decode", kv_dtype = "fp8" }
    assert.equal("fp8_v4", p.stored)
    assert.equal("RAGGED", p.prefill.topk)
    assert.equal("PAGED", p.decode.topk)
  end)
end)

describe("pairing", function()
  it("bf16 pool with sparse bf16 prefill uses PAGED (the sglang #21835 crash)", function()
    local p = mla.pair { prefill = "sparse_prefill_bf16", decode = "sparse_kv_fp8", store = "bf16" }
    assert.equal("PAGED", p.prefill.topk)
    assert.is_nil(p.prefill.conversion)
    assert.equal("quantize", p.decode.conversion.name)
    assert.equal("call", p.decode.where)
  end)

  it("656 pool with sparse bf16 prefill dequantizes to ragged rows and uses RAGGED", function()
    local p = mla.pair { prefill = "sparse_prefill_bf16", decode = "sparse_kv_fp8", store = "fp8_ds_mla" }
    assert.equal("dequant_ragged", p.prefill.conversion.name)
    assert.equal("RAGGED", p.prefill.topk)
    assert.equal("PAGED", p.decode.topk)
    assert.is_nil(p.decode.conversion)
  end)

  it("trtllm store with kv-fp8 prefill requants once per prefill and decodes natively (sglang #21011)", function()
    local p = mla.pair { prefill = "sparse_kv_fp8", decode = "trtllm_fp8", kv_dtype = "fp8" }
    assert.equal("fp8_pertensor", p.stored)
    assert.equal("requant", p.prefill.conversion.name)
    assert.equal("prefill", p.prefill.where)
    assert.equal("PAGED", p.prefill.topk)
    assert.is_nil(p.decode.conversion)
    local total, parts = p:extra_bytes(1000, 100, 10)
    assert.equal(1000 * (576 + 656), parts.prefill)
    assert.equal(total, parts.prefill)
  end)

  it("decode's top-k never depends on the prefill backend", function()
    local checked = 0
    for _, pre in ipairs { "sparse_prefill_bf16", "sparse_kv_fp8", "trtllm_fp8", "dense_bf16" } do
      local p = mla.pair { prefill = pre, decode = "sparse_kv_fp8", store = "fp8_ds_mla", allow = { "dequant_pool" } }
      assert.equal("PAGED", p.decode.topk, pre)
      checked = checked + 1
    end
    assert.equal(4, checked)
  end)

  it("an unreadable store is an error naming the backend and the fix", function()
    S.assert_error_contains(function() mla.pair { prefill = "sparse_kv_fp8", decode = "trtllm_fp8", store = "fp8_ds_mla" } end,
      "decode backend 'trtllm_fp8' reads fp8_pertensor, bf16")
    S.assert_error_contains(function() mla.pair { prefill = "sparse_kv_fp8", decode = "trtllm_fp8", store = "fp8_ds_mla" } end,
      "store fp8_pertensor")
    S.assert_error_contains(function() mla.pair { prefill = "trtllm_fp8", decode = "dense_bf16", kv_dtype = "fp8" } end,
      "reads no fp8 layout")
    S.assert_error_contains(function() mla.pair { prefill = "sparse_kv_fp8", decode = "sparse_prefill_bf16", store = "bf16" } end,
      "not a decode backend")
    S.assert_error_contains(function() mla.pair { prefill = "sparse_kv_fp8", decode = "trtllm_fp8", kv_dtype = "fp16" } end,
      "unknown kv_dtype")
  end)

  it("names a misspelt option, a bad block_size and an allow that names no opt-in conversion", function()
    local base = { prefill = "dense_bf16", decode = "dense_bf16", store = "bf16" }
    local function with(k, v)
      local o = {}
      for a, b in pairs(base) do o[a] = b end
      o[k] = v
      return o
    end
    S.assert_error_contains(function() mla.pair(with("blocksize", 16)) end,
      "pair: unknown option 'blocksize' (did you mean 'block_size'? options: allow, block_size, decode, kv_dtype, prefill, store)")
    S.assert_error_contains(function() mla.pair(with("block_size", 0)) end, "pair: block_size must be an integer in [1, 2^31 - 1], got 0")
    S.assert_error_contains(function() mla.pair(with("block_size", "64")) end, "pair: block_size must be an integer")
    S.assert_error_contains(function() mla.pair(with("allow", "dequant_pool")) end, "pair: allow must be a list of conversion names")
    S.assert_error_contains(function() mla.pair(with("allow", { "requant" })) end,
      "pair: allow names 'requant', which is no opt-in conversion (dequant_pool)")
    assert.are.equal(16, mla.pair(with("block_size", 16)).block_size)
  end)

  it("FlashMLA's page-blocked dense decode on a 656 B pool relayouts per call; a page-blocked pool relayouts back for the sparse kernel", function()
    local p = mla.pair { prefill = "sparse_kv_fp8", decode = "dense_fp8_blocked", store = "fp8_ds_mla" }
    assert.is_nil(p.prefill.conversion)
    assert.equal("relayout", p.decode.conversion.name)
    assert.equal("fp8_ds_mla_blocked", p.decode.reads)
    assert.equal("call", p.decode.where)
    assert.equal("dense", p.decode.topk)
    local _, parts = p:extra_bytes(1000, 100, 10)
    assert.equal(10 * 1000 * (656 + 656), parts.decode)
    local q = mla.pair { prefill = "sparse_kv_fp8", decode = "dense_fp8_blocked", kv_dtype = "fp8" }
    assert.equal("fp8_ds_mla_blocked", q.stored)
    assert.equal("relayout", q.prefill.conversion.name)
    assert.equal("fp8_ds_mla", q.prefill.reads)
    assert.equal("prefill", q.prefill.where)
    assert.equal("PAGED", q.prefill.topk) -- the relayout keeps the pages, so slot ids stay valid
    assert.is_nil(q.decode.conversion)
    S.assert_error_contains(function() mla.pair { prefill = "trtllm_fp8", decode = "dense_fp8_blocked", store = "fp8_pertensor" } end,
      "store fp8_ds_mla and convert with relayout")
    S.assert_error_contains(function() mla.pair { prefill = "trtllm_fp8", decode = "sparse_kv_fp8", store = "fp8_ds_mla_blocked" } end,
      "per-128 scales cannot become one tensor scale losslessly")
  end)

  it("whole-pool dequant is opt-in and its bytes scale with the pool", function()
    S.assert_error_contains(function() mla.pair { prefill = "sparse_kv_fp8", decode = "dense_bf16", store = "fp8_ds_mla" } end,
      "allow = {'dequant_pool'}")
    local p = mla.pair { prefill = "sparse_kv_fp8", decode = "dense_bf16", store = "fp8_ds_mla", allow = { "dequant_pool" } }
    assert.equal("dequant_pool", p.decode.conversion.name)
    assert.equal("dense", p.decode.topk)
    local _, parts = p:extra_bytes(1000, 100, 10)
    assert.equal(10 * 1000 * (656 + 1152), parts.decode)
  end)

  it("the full matrix resolves or errors with a reason, never anything else", function()
    local stores = { "bf16", "fp8_pertensor", "fp8_ds_mla", "fp8_ds_mla_blocked" }
    local resolved, refused = 0, 0
    for _, pre in ipairs(B.list()) do
      for _, dec in ipairs(B.list()) do
        for _, st in ipairs(stores) do
          local pb, db = B.get(pre), B.get(dec)
          if pb.phases.prefill and db.phases.decode then
            local ok, p = pcall(mla.pair, { prefill = pre, decode = dec, store = st })
            if ok then
              resolved = resolved + 1
              for _, ph in ipairs { p.prefill, p.decode } do
                assert.truthy(ph.backend.reads[ph.reads], p:describe())
                assert.truthy(({ PAGED = 1, RAGGED = 1, dense = 1 })[ph.topk])
              end
            else
              refused = refused + 1
              assert.truthy(tostring(p):find("to make it work", 1, true), tostring(p))
            end
          end
        end
      end
    end
    assert.is_true(resolved > 10)
    assert.is_true(refused > 0)
  end)
end)
