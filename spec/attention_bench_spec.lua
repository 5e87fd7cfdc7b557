-- The attention bench's library (mlalab.attention_bench) on small CPU cases: the points' options
-- reach attention.decode, the names say them, and the counting follows its formula.
local mla = require "mlalab"
local AB = require "mlalab.attention_bench"
local S = require "support"

describe("attention bench library", function()
  it("names a point by its shape and options", function()
    local p = { kind = "dense", layout = "fp8_ds_mla", b = 128, s_q = 2, h_q = 8, len = 4096 }
    assert.equal("dense fp8_ds_mla b128 s2 h8 L4096", AB.name(p))
    p.causal_tail = false
    assert.equal("dense fp8_ds_mla b128 s2 h8 L4096 shared", AB.name(p))
    p.specialize = false
    assert.equal("dense fp8_ds_mla b128 s2 h8 L4096 gen shared", AB.name(p))
    assert.equal("sparse fp8_v4 b2 s1 h64 k128 slice",
      AB.name { kind = "sparse", layout = "fp8_v4", b = 2, h_q = 64, topk = 128, specialize = "slice" })
  end)

  it("times a reference call and counts its bytes and FLOPs by the formula", function()
    local p = { kind = "dense", layout = "fp8_ds_mla", b = 2, s_q = 2, h_q = 8, len = 100, impl = "ref",
      causal_tail = false, device = "cpu" }
    local r = AB.run(p, { max_time = 0.02 })
    assert.is_true(r.median > 0)
    assert.equal(200, r.keys) -- two requests of 100 keys
    -- q and out in bf16, 656 bytes a key
    assert.equal(2 * 2 * 2 * 8 * (576 + 512) + 200 * 656, r.bytes)
    assert.equal(2 * 16 * 200 * (576 + 512), r.flops)
    local row = AB.row(r)
    assert.truthy(row:find("dense fp8_ds_mla b2 s2 h8 L100 sh", 1, true)) -- the case column is 34 wide
    assert.truthy(row:find("ref", 1, true))
  end)

  it("passes a point's options to attention.decode, which checks them", function()
    S.assert_error_contains(function()
      AB.run({ kind = "dense", layout = "bf16", b = 1, s_q = 2, h_q = 4, len = 40, impl = "ref", causal_tail = "no",
        device = "cpu" },
        { max_time = 0.01 })
    end, 'causal_tail must be a boolean, got "no"')
  end)
end)
