local mla = require "mlalab"
local isolate = require "mlalab.isolate"
local ser = require "mlalab.serialize"
local core = mla.core
local S = require "support"

describe("serialize", function()
  it("round-trips plain data exactly, floats and binary strings included", function()
    local v = { 1, -0.0, 0.1, 2 ^ -1074, math.maxinteger, math.mininteger, "a\0b\r\n\255", true,
                nested = { x = { y = "z" } }, [3.5] = false }
    local back = ser.decode(ser.encode(v))
    assert.same(v, back)
    assert.equal(1 / -0.0, 1 / back[2]) -- the sign of zero survives
    assert.is_true(back[4] > 0)
  end)

  it("carries functions with their data upvalues and module references", function()
    local k, tbl = 7, { 1, 2 }
    local f = function(x) return x * k + #tbl + mla.arange(3, "i64", "cpu"):numel() end
    local g = ser.decode(ser.encode(f))
    assert.equal(3 * 7 + 2 + 3, g(3))
  end)

  it("carries tensors as bytes", function()
    local t = mla.randn({ 3, 5 }, { seed = 4, dtype = "bf16", device = "cpu" }):transpose(0, 1)
    local back = ser.decode(ser.encode({ t = t })).t
    assert.is_true(back:equal(t))
  end)

  it("refuses what cannot cross a process boundary, naming where it is", function()
    S.assert_error_contains(function() ser.encode({ a = { io.stdout } }) end, "value.a.1 is a userdata")
    local cyc = {}
    cyc.self = cyc
    S.assert_error_contains(function() ser.encode(cyc) end, "cyclic")
    S.assert_error_contains(function() ser.encode(print) end, "C function")
  end)
end)

describe("isolate", function()
  it("returns the values of a function run in a child process", function()
    local base = 10
    local r = isolate.run(function(a, b) return a + b + base, { s = "ok" } end, { 1, 2 })
    assert.equal("OK", r.status)
    assert.equal(13, r.value[1])
    assert.equal("ok", r.value[2].s)
  end)

  it("reports a Lua error as ERROR with its message", function()
    local r = isolate.run(function() error("deliberate failure") end)
    assert.equal("ERROR", r.status)
    assert.truthy(r.error:find("deliberate failure", 1, true))
  end)

  it("kills work that runs past its time limit and reports TIMEOUT", function()
    local r = isolate.run(function() while true do end end, {}, { timeout = 0.5 })
    assert.equal("TIMEOUT", r.status)
    assert.is_true(r.elapsed < 5)
  end)

  it("reports a process that exits without a result", function()
    local r = isolate.run(function() os.exit(3) end)
    assert.equal("ERROR", r.status)
    assert.equal(3, r.exit_code)
  end)

  it("classifies CUDA faults, naming the kernel, and device OOM", function()
    local status, err, kernel = isolate.classify(
      "synchronize cuda:0 (last kernel launched: my_kernel): CUDA error cudaErrorIllegalAddress (an illegal memory access was encountered)")
    assert.equal("FAULT", status)
    assert.equal("cudaErrorIllegalAddress", err)
    assert.equal("my_kernel", kernel)
    status, err, kernel = isolate.classify("kernel mla_debug_trap: CUDA error cudaErrorLaunchFailure (unspecified launch failure)")
    assert.equal("FAULT", status)
    assert.equal("mla_debug_trap", kernel)
    assert.equal("OOM", (isolate.classify("out of device memory on cuda:0: requested 1 bytes")))
  end)
end)

describe("isolate #gpu", function()
  it("records an out-of-bounds store as FAULT naming the kernel, and the parent stays usable", function()
    local r = isolate.run(function()
      local buf = mla.zeros({ 16 }, "f32", "cuda")
      mla.core.debug_kernel("oob_store", buf)
      mla.synchronize()
    end, {}, { timeout = 60 })
    assert.equal("FAULT", r.status, r.error)
    assert.equal("mla_debug_oob_store", r.kernel)
    assert.truthy(r.cuda_error)
    local t = mla.arange(8, "f32", "cuda")
    assert.same({ 0, 1, 2, 3, 4, 5, 6, 7 }, t:totable())
  end)

  it("stops a kernel that never returns as TIMEOUT", function()
    local r = isolate.run(function()
      local flag = mla.zeros({ 4 }, "i32", "cuda")
      mla.core.debug_kernel("spin", flag)
      mla.synchronize()
    end, {}, { timeout = 5 })
    assert.equal("TIMEOUT", r.status)
  end)

  it("reports an impossible allocation as OOM", function()
    local r = isolate.run(function() return mla.empty({ 1 << 50 }, "u8", "cuda") end, {}, { timeout = 60 })
    assert.equal("OOM", r.status, r.error)
  end)
end)

describe("a sweep without isolation #gpu", function()
  it("stops at a fault with an error naming the kernel, keeps the points before it, and exits non-zero", function()
    local bin = S.BIN
    local jsonl = os.tmpname()
    local code = string.format([[
      local mla = require 'mlalab'
      mla.sweep { name = 'nofault', params = { { 'i', { 1, 2, 3, 4 } } }, jsonl = %q, progress = false,
        run = function(p)
          local b = mla.zeros({ 16 }, 'f32', 'cuda')
          if p.i == 3 then mla.core.debug_kernel('oob_store', b) end
          mla.synchronize('cuda')
          return { value = p.i * 2 }
        end }
    ]], jsonl)
    local r = core.spawn { argv = { bin, "-e", code }, timeout = 120 }
    assert.are_not.equal(0, r.exit_code)
    assert.truthy(r.stderr:find("mla_debug_oob_store", 1, true), r.stderr)
    local lines = {}
    for l in io.lines(jsonl) do lines[#lines + 1] = l end
    os.remove(jsonl)
    -- points 1 and 2 were written before the fault; nothing after it ran
    assert.is_true(#lines >= 2, "lines " .. #lines)
    assert.truthy(lines[1]:find('"status":"OK"', 1, true), lines[1])
    assert.truthy(lines[2]:find('"status":"OK"', 1, true), lines[2])
    for _, l in ipairs(lines) do assert.falsy(l:find('"i":4', 1, true), l) end
  end)
end)
