-- Misspelt options are errors, never a silent default: mla.options.check and
-- the entry points that use it.
local mla = require "mlalab"
local S = require "support"

local O = mla.options

describe("mla.options.check", function()
  it("passes known names and nil, and names the first unknown one with the closest known name", function()
    assert.are.same({ layout = 1 }, O.check("f", { layout = 1 }, { "layout", "num_layers" }))
    assert.is_nil(O.check("f", nil, { "layout" }))
    S.assert_error_contains(function() O.check("f", { num_layer = 1 }, { "num_layers", "layout" }) end,
      "f: unknown option 'num_layer' (did you mean 'num_layers'? options: layout, num_layers)")
    S.assert_error_contains(function() O.check("f", { zzzzzz = 1 }, { "num_layers", "layout" }) end,
      "f: unknown option 'zzzzzz' (options: layout, num_layers)")
    S.assert_error_contains(function() O.check("f", { [1] = "x" }, { "a" }) end, "f: unknown option '1'")
  end)
end)

describe("entry points refuse a misspelt option", function()
  local c = mla.cache.new { layout = "bf16", num_blocks = 2, block_size = 16, device = "cpu" }
  local v = c:view(0)

  it("cache.new, compare, bench", function()
    S.assert_error_contains(function() mla.cache.new { layout = "bf16", num_blocks = 2, num_layer = 3, device = "cpu" } end,
      "cache.new: unknown option 'num_layer' (did you mean 'num_layers'?")
    local t = mla.zeros({ 2 }, "f32", "cpu")
    S.assert_error_contains(function() mla.compare(t, t, { mode = "allclose", atoll = 1e-3 }) end,
      "compare: unknown option 'atoll' (did you mean 'atol'?")
    S.assert_error_contains(function() mla.compare(t, t, 5) end, "compare: opts must be a table, a preset or a mode name")
    S.assert_error_contains(function() mla.bench(function() end, { max_tme = 0.01, device = "cpu" }) end,
      "bench: unknown option 'max_tme' (did you mean 'max_time'?")
  end)

  it("the KV kernels and the JIT cache view", function()
    S.assert_error_contains(function() mla.kernels.gather_sparse(v, { 0 }, { nclos = 64 }) end,
      "gather_sparse: unknown option 'nclos' (did you mean 'ncols'?")
    S.assert_error_contains(function() mla.kernels.write(v, { 0 }, mla.zeros({ 1, 576 }, "bf16", "cpu"), { chek = false }) end,
      "write: unknown option 'chek' (did you mean 'check'? options: check)")
    S.assert_error_contains(function() mla.rtc.cache_view(v.pages, "bf16", { block_size = 16, alow_cpu = true }) end,
      "cache_view: unknown option 'alow_cpu' (did you mean 'allow_cpu'?")
    -- the right names still work
    mla.kernels.write(v, { 0 }, mla.zeros({ 1, 576 }, "bf16", "cpu"), { check = false })
    assert.are.equal("string", type(mla.rtc.cache_view(v.pages, "bf16", { block_size = 16, allow_cpu = true })))
  end)

  it("sweep, pair, pair:run, the pair matrix and isolate.run", function()
    S.assert_error_contains(function()
      mla.sweep { name = "x", params = { { "a", { 1 } } }, run = function() return {} end, tabel = false }
    end, "sweep: unknown option 'tabel' (did you mean 'table'?")
    local p = mla.pair { prefill = "dense_bf16", decode = "dense_bf16", store = "bf16" }
    S.assert_error_contains(function() mla.pair { prefill = "dense_bf16", decode = "dense_bf16", stor = "bf16" } end,
      "pair: unknown option 'stor' (did you mean 'store'?")
    S.assert_error_contains(function() p:run { tim = true } end, "pair.run: unknown option 'tim' (did you mean 'time'?")
    S.assert_error_contains(function() mla.pair_run.matrix { store = { "bf16" } } end,
      "pair_run.matrix: unknown option 'store' (did you mean 'stores'?")
    S.assert_error_contains(function() mla.isolate_mod.run(function() end, {}, { timout = 5 }) end,
      "isolate.run: unknown option 'timout' (did you mean 'timeout'?")
    S.assert_error_contains(function()
      mla.attention_cases.dense { layout = "bf16", b = 1, s_q = 1, h_q = 1, lenz = { 3 }, device = "cpu" }
    end, "attention_cases.dense: unknown option 'lenz' (did you mean 'lens'?")
    S.assert_error_contains(function()
      mla.equivalence { run = function() return mla.zeros({ 1 }, "f32", "cpu") end, page_bytes = 64, layres = 3, device = "cpu" }
    end, "equivalence: unknown option 'layres' (did you mean 'layers'?")
  end)
end)
