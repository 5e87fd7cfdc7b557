-- mla.kv_jit: the JIT write / gather twins behind mla.kernels' calling
-- convention. CPU: they compile without a GPU and refuse what they cannot
-- run; #gpu: bit-identical to the baked kernels on a cross-layer view.
local mla = require "mlalab"
local S = require "support"

local LUA_ONLY = {
  name = "spec_kv_jit_ue8m0", fields = {
    { "nope", "e4m3", 512, scale = { dtype = "ue8m0", group = 64, policy = "pow2", eps = 1e-4 } }, { "rope", "bf16", 64 } },
  regions = { { name = "token", row = { "nope", "rope", "nope.scale", { align = 16 } } } }, v_dims = 512, token_align = 16,
}

describe("kv_jit", function()
  it("compiles write and gather for sm_90a without a GPU, for a built-in and a Lua-only layout", function()
    local n = 0
    for _, L in ipairs { mla.layout.get("fp8_ds_mla"), mla.layout.define(LUA_ONLY) } do
      for _, which in ipairs { "write", "gather" } do
        local m = mla.kv_jit.module(which, L, 16, "sm_90a")
        assert.equal(2, #m:kernels())
        n = n + 1
      end
    end
    assert.equal(4, n)
  end)

  it("refuses CPU pages, bad slots and bad rows with the reason", function()
    local c = mla.cache.new { layout = "bf16", num_blocks = 2, block_size = 4, device = "cpu" }
    local rows = mla.zeros({ 3, 576 }, "bf16", "cpu")
    S.assert_error_contains(function() mla.kv_jit.write(c:view(0), mla.arange(3, "i32", "cpu"), rows) end,
      "kv_jit.write: JIT kernels run on a GPU: the pages are on cpu")
    S.assert_error_contains(function() mla.kv_jit.gather(c:layer(0), mla.arange(3, "i32", "cpu")) end,
      "kv_jit.gather: a cache table {pages =, layout =, block_size =} is expected")
    S.assert_error_contains(function() mla.kv_jit.module("read", "bf16", 4) end, "which must be 'write' or 'gather'")
  end)
end)

describe("kv_jit on the GPU", function()
  it("write and gather equal the baked kernels on layer 5 of a 9-layer block-major cache #gpu", function()
    mla.manual_seed(950)
    for _, name in ipairs { "bf16", "fp8_pertensor", "fp8_ds_mla", "fp8_v4" } do
      local caches = {}
      for k = 1, 2 do
        caches[k] = mla.cache.new { layout = name, num_blocks = 12, block_size = 64, num_layers = 9, order = "block_major",
          device = "cuda", tensor_scale = 0.25 }
        caches[k].buffers[1]:fill(0)
      end
      local L = caches[1].layout
      local n = 12 * 64
      local slots = {}
      for i = 1, n do slots[i] = (i % 9 == 0) and -1 or (i * 97) % n end
      local st = mla.tensor(slots, "i32", "cuda")
      local rows = mla.randn({ n, L.dim }, { std = 0.5, dtype = "bf16", device = "cuda" })
      mla.kernels.write(caches[1]:view(5), st, rows)
      mla.kv_jit.write(caches[2]:view(5), st, rows)
      local r = mla.compare(caches[2].buffers[1], caches[1].buffers[1], "exact")
      assert.is_true(r.ok and r.compared > 0, name .. ": " .. (r.reasons[1] or ""))
      local a = mla.kernels.gather_sparse(caches[1]:view(5), st)
      local b = mla.kv_jit.gather(caches[1]:view(5), st)
      local g = mla.compare(b, a, "exact")
      assert.is_true(g.ok and g.compared > 0, name .. ": " .. (g.reasons[1] or ""))
    end
  end)
end)
