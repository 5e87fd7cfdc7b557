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

  it("lists the methods of tensors and other objects, naming C functions as such", function()
    local t = H.text(mla.zeros({ 2 }, "f32", "cpu"))
    has(t, "tensor(f32, [2], cpu) [0, 0]: methods")
    has(t, "narrow")
    has(t, "a C function")
    has(t, "float           function T:float()")
    has(H.text(mla.layout.get("fp8_v4")), "layout(fp8_v4, 512 dims, 584 B/token, 2 regions): methods")
    has(H.text(42), "42: a number")
  end)

  it("names a part that does not exist", function()
    local ok, err = pcall(H.text, "attention.nope")
    assert.is_false(ok)
    has(err, "help: mla.attention.nope is not a part of the library")
  end)

  it("prints when called, and is the REPL's help", function()
    local r = mla.core.spawn { argv = { S.BIN, "-i" }, input = "help 'attention.last_variant'\n", timeout = 60 }
    assert.are.equal(0, r.exit_code, r.stderr)
    has(r.stdout, "function M.last_variant()")
    has(r.stdout, "What the last baked launch ran")
  end)
end)
