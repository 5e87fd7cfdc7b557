-- mla.help: the library described from its own doc comments, in scripts and
-- as the REPL's `help`.
local mla = require "mlalab"
local S = require "support"

local H = mla.help

local function has(text, needle)
  assert(text:find(needle, 1, true), string.format("%q not in:\n%s", needle, text))
end

describe("mla.help", function()
  it("lists every entry point and every module with its first doc line", function()
    local t = H.text()
    has(t, "entry points (mla.*):")
    has(t, "mla.empty(shape, dtype|opts, device): uninitialised contiguous tensor.")
    has(t, "modules (mla.<name>, loaded on first use):")
    -- the modules are the files next to init.lua, each with its header's first line
    local attention = io.open(package.searchpath("mlalab.attention", package.path)):read("l")
    has(t, "attention ")
    has(t, (attention:gsub("^%-%-%-? ?", "")))
    has(t, "layout ")
    has(t, "kernels ")
    assert.are.equal(t, H.text(mla))
  end)

  it("shows a function's defining line and its whole doc comment, by value or by name", function()
    local by_value, by_name = H.text(mla.attention.decode), H.text("attention.decode")
    assert.are.equal(by_value, by_name)
    has(by_value, "attention.lua:")
    has(by_value, "function M.decode(o)")
    has(by_value, "mla.attention.decode{...} -> out, lse [, plan]")
    assert.are.equal(by_name, H.text("mla.attention.decode"))
  end)

  it("describes a module by its header and lists its functions", function()
    local t = H.text(mla.attention)
    has(t, "MLA decode attention over any cache layout")
    has(t, "mla.attention:")
    has(t, "last_variant  What the last baked launch ran")
    assert.are.equal(t, H.text("attention"))
  end)

  it("follows init.lua's entry points to the function they call", function()
    has(H.text(mla.compare), "function M.compare(a, b, opts)")
    has(H.text("bench"), "function M.bench(")
  end)

  it("lists the methods of tensors and other objects, C bindings with the doc written beside them", function()
    local t = H.text(mla.zeros({ 2 }, "f32", "cpu"))
    has(t, "tensor(f32, [2], cpu) [0, 0]: methods")
    has(t, "narrow          t:narrow(dim, start, length) -> a view")
    has(t, "float           t:float() -> t:to(\"f32\")")
    local lt = H.text(mla.layout.get("fp8_v4"))
    has(lt, "layout(fp8_v4, 512 dims, 584 B/token, 2 regions): methods")
    has(lt, "doc: DeepSeek V4, 584 B/token page-split")
    has(lt, "upstream: FlashMLA MODEL1/V4")
    has(H.text(42), "42: a number")
  end)

  it("shows a C binding's whole doc, by value or by name", function()
    local t = H.text(mla.zeros({ 2 }, "f32", "cpu").copy)
    has(t, "a C function of the core")
    has(t, "dst:copy(src[, {saturate=true")
    has(t, "to NaN / inf as torch's .to does") -- a later line of the doc
    has(H.text("device_props"), "mla.device_props: a C function of the core\n  mla.device_props([device]) -> ")
    -- core.doc: nil for Lua functions, undocumented C functions and other values
    assert.is_nil(mla.core.doc(mla.zeros))
    assert.is_nil(mla.core.doc(print))
    assert.is_nil(mla.core.doc(42))
    has(H.text(print), "a C function of the core, without a doc")
  end)

  it("has a doc for every entry point, every module's functions and every tensor method", function()
    -- an undocumented Lua function shows its defining line, a C one "a C function"
    local function undocumented(text)
      local bad, n = {}, 0
      for name, doc in text:gmatch("\n  ([%w_]+) +([^\n]*)") do
        n = n + 1
        if doc:match("^function ") or doc:match("^local function ") or doc == "a C function" then bad[#bad + 1] = name end
      end
      return table.concat(bad, ", "), n
    end
    local bad, n = undocumented(H.text():match("^(.-)\nmodules"))
    assert.are.equal("", bad)
    assert.is_true(n >= 25, n .. " entry points listed")
    bad, n = undocumented(H.text(mla.zeros({ 1 }, "f32", "cpu")))
    assert.are.equal("", bad)
    assert.is_true(n >= 40, n .. " tensor methods listed")
    local modules, all_bad = 0, {}
    for line in H.text():match("\nmodules[^\n]*\n(.*)$"):gmatch("[^\n]+") do
      local mod = assert(line:match("^  ([%w_]+) "), line)
      modules = modules + 1
      bad = undocumented(H.text(mod))
      if bad ~= "" then all_bad[#all_bad + 1] = mod .. ": " .. bad end
      -- mla.bench, mla.compare, mla.sweep are functions: their modules' tables hold the rest
      local t = require("mlalab." .. mod)
      if type(t) == "table" and t ~= mla[mod] then
        bad = undocumented(H.text(t))
        if bad ~= "" then all_bad[#all_bad + 1] = "mlalab." .. mod .. ": " .. bad end
      end
    end
    assert.is_true(modules >= 30, modules .. " modules listed")
    -- and the methods of the objects a script holds: layouts, caches, pairings, JIT modules, results
    local c = mla.cache.new { layout = "fp8_v4", num_blocks = 2, block_size = 16, device = "cpu" }
    local objects = { layout = c.layout, cache = c,
      pair = mla.pair { prefill = "sparse_kv_fp8", decode = "trtllm_fp8", store = "fp8_pertensor" },
      rtc_module = mla.rtc.compile { source = 'extern "C" __global__ void f(int *x) { x[0] = 1; }', name = "help_obj.cu",
        arch = "sm_90a", cache = "memory" },
      bench_result = mla.bench(function() end, { device = "cpu", max_time = 0.01, min_samples = 2, min_time = 0 }),
      compare_result = mla.compare(mla.zeros({ 2 }, "f32", "cpu"), mla.zeros({ 2 }, "f32", "cpu")),
      sweep_result = mla.sweep { name = "h", params = { { "a", { 1 } } }, run = function() return { v = 1 } end, table = false,
        progress = false } }
    for _, what in ipairs { "layout", "cache", "pair", "rtc_module", "bench_result", "compare_result", "sweep_result" } do
      bad, n = undocumented(H.text(objects[what]))
      assert.is_true(n >= 3, what .. ": " .. n .. " methods listed")
      if bad ~= "" then all_bad[#all_bad + 1] = what .. " methods: " .. bad end
    end
    assert.are.equal("", table.concat(all_bad, "; "))
  end)

  it("documents the JIT kernel handle's C methods (core.RtcKernel)", function()
    local t = H.text(mla.core.RtcKernel)
    for _, m in ipairs { "launch", "params", "attributes", "time_raw_launches" } do has(t, "  " .. m .. " ") end
    assert.is_nil(t:find("a C function", 1, true), t)
    has(H.text(mla.core.RtcKernel.launch), "k:launch{grid=, block=, args={...}")
  end)

  it("finds every module and documented function that mentions a word, C bindings included", function()
    local t = H.find_text("UE8M0") -- any case
    has(t, "layout (module)")
    has(t, "C Tensor: copy")
    has(t, "dst:copy(src[, {saturate=true")
    assert.is_nil(t:find("M.find", 1, true), "help.find lists itself:\n" .. t)
    local n = tonumber(t:match("(%d+) match"))
    assert.is_true(n >= 4, t)
    has(H.find_text("region_offset"), "layout: M.region_offset")
    has(H.find_text("zzz-no-such-word"), "help.find: nothing documented mentions 'zzz-no-such-word'")
    local ok, err = pcall(H.find_text, 42)
    assert.is_false(ok)
    has(err, "help.find: a word to look for is expected")
  end)

  it("names a part that does not exist", function()
    local ok, err = pcall(H.text, "attention.nope")
    assert.is_false(ok)
    has(err, "help: mla.attention.nope is not a part of the library")
  end)

  it("prints when called, and is the REPL's help", function()
    local r = mla.core.spawn { argv = { S.BIN, "-i" }, input = "help 'attention.last_variant'\nhelp.find 'region_offset'\n",
      timeout = 60 }
    assert.are.equal(0, r.exit_code, r.stderr)
    has(r.stdout, "function M.last_variant()")
    has(r.stdout, "What the last baked launch ran")
    has(r.stdout, "layout: M.region_offset")
  end)
end)

describe("mla.help on the GPU #gpu", function()
  it("lists a loaded JIT kernel's methods with their docs", function()
    local m = mla.rtc.compile { source = 'extern "C" __global__ void fill1(float *x, int n) { if ((int)threadIdx.x < n) x[threadIdx.x] = 1; }',
      name = "help_fill1.cu" }
    local t = H.text(m:kernel("fill1"))
    has(t, ": methods")
    has(t, "launch             k:launch{grid=")
    has(t, "signature          k:signature()")
  end)
end)
