-- The REPL's tab completion: mla.complete.candidates on words of every kind,
-- then the binary's readline hook under a pseudo-terminal (util-linux `script`).
local mla = require "mlalab"
local S = require "support"

local C = mla.complete

local function has(list, x)
  for _, v in ipairs(list) do if v == x then return true end end
  error(string.format("%q not among %d candidates: %s", x, #list, table.concat(list, " ")), 2)
end

describe("mla.complete.candidates", function()
  local env = setmetatable({ mla = mla, t = mla.zeros({ 2, 3 }, "f32", "cpu"), count = 3, string = string,
    L = mla.layout.get("fp8_v4") }, { __index = _G })

  it("completes globals, keywords and module names not loaded yet", function()
    has(C.candidates("ml", env), "mla.")
    has(C.candidates("loc", _G), "local")
    assert.are.same({ "count" }, C.candidates("cou", env))
    local m = C.candidates("mla.cubi", env)
    assert.are.same({ "mla.cubin." }, m)
    has(C.candidates("mla.", env), "mla.attention.")
    has(C.candidates("mla.", env), "mla.zeros(")
  end)

  it("completes a tensor's C methods after ':' and its fields after '.'", function()
    assert.are.same({ "t:narrow(" }, C.candidates("t:nar", env))
    has(C.candidates("t:", env), "t:copy(")
    has(C.candidates("t:", env), "t:uniform_(") -- a method the Lua side adds
    has(C.candidates("t.", env), "t.shape.")
    has(C.candidates("t.", env), "t.dtype")
    for _, c in ipairs(C.candidates("t:", env)) do assert.truthy(c:match("%($"), c) end -- methods only
  end)

  it("walks fields and a layout's class methods", function()
    assert.are.same({ "mla.layout.get(" }, C.candidates("mla.layout.get", env))
    has(C.candidates("L:page_", env), "L:page_bytes(")
    has(C.candidates("L.", env), "L.name")
    has(C.candidates("string.fo", env), "string.format(")
  end)

  it("offers nothing for what is not a plain word, and never raises on it", function()
    for _, w in ipairs { "mla..x", "x:y", "mla.nope.", "t:narrow(", "1 +", "count.", "mla:zz", "" } do
      local ok, c = pcall(C.candidates, w, env)
      assert.is_true(ok, w)
      assert.are.equal("table", type(c))
    end
    assert.are.same({}, C.candidates("mla.nope.x", env))
    assert.are.same({}, C.candidates("count.x", env))
    local ok, err = pcall(C.candidates, 5)
    assert.is_false(ok)
    assert.truthy(err:find("complete.candidates: a word", 1, true))
  end)
end)

describe("the REPL's tab key", function()
  it("completes through readline under a terminal, or the binary says it has no readline", function()
    if not mla.core.readline then
      local r = mla.core.spawn { argv = { S.BIN, "--info" }, timeout = 60 }
      assert.truthy(r.stdout:find("REPL: plain lines", 1, true), r.stdout)
      return
    end
    -- `script` gives the REPL a terminal; TAB completes "t:nar" to "t:narrow(" and the line runs
    local input = 't = mla.zeros({2, 3}, "f32", "cpu")\nv = t:nar\t0, 1, 1)\nprint("numel", v:numel())\nos.exit(0)\n'
    local r = mla.core.spawn { argv = { "/bin/sh", "-c", "MLALAB_DEVICE=cpu TERM=dumb exec script -qec \"'" .. S.BIN ..
      "' -i\" /dev/null" }, input = input, timeout = 60 }
    assert.are.equal(0, r.exit_code, r.stdout .. r.stderr)
    assert.truthy(r.stdout:find("numel\t3", 1, true), r.stdout)
  end)
end)
