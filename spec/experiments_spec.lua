-- The four experiments as users run them, on the CPU: each passes its own
-- checks, prints its tables and exits 0; a failed check exits 1.
local mla = require "mlalab"
local S = require "support"

local core = mla.core
local BIN = S.BIN

local function run(args)
  local argv = { BIN, "--device", "cpu" }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  return core.spawn { argv = argv, input = "", timeout = 300 }
end

local function assert_passed(r, what)
  assert(r.exit_code == 0, string.format("%s: exit %d\nstdout:\n%s\nstderr:\n%s", what, r.exit_code, r.stdout, r.stderr))
  assert.truthy(r.stdout:find("verdict: all %d+ checks passed"), r.stdout)
end

local function tmpdir()
  local d = os.tmpname()
  os.remove(d)
  assert(os.execute("mkdir -p '" .. d .. "'"))
  return d
end

describe("experiments on the CPU", function()
  it("mixed_backend: the seeds' pair, the matrix and the caught bugs", function()
    local r = run { "experiments/mixed_backend.lua" }
    assert_passed(r, "mixed_backend")
    for _, text in ipairs { "requant/prefill", "sglang #21835", "26 pairs run and match the reference",
      "relayout/call", "relayout/prefill", "refused, with the reason", "caught: prefill out" } do
      assert.truthy(r.stdout:find(text, 1, true), text)
    end
  end)

  it("mixed_backend exits 1 and names the check when one fails", function()
    -- an impossible bound on the quantize conversion's error fails every pair that quantizes
    local r = run { "-e", "require('mlalab.pair_run').LOSSY_COS = 1e-12", "experiments/mixed_backend.lua" }
    assert.equal(1, r.exit_code)
    assert.truthy(r.stdout:find("FAIL  matrix bf16: sparse_kv_fp8 + sparse_kv_fp8", 1, true), r.stdout)
    assert.truthy(r.stdout:find("checks FAILED", 1, true))
  end)

  it("cross_layer: every kernel equivalent on a 61-layer view, the packed-page kernel caught", function()
    local r = run { "experiments/cross_layer.lua" }
    assert_passed(r, "cross_layer")
    local _, caught = r.stdout:gsub("token_rows<true> %(cpu model%)%s+%S+%s+caught", "")
    assert.equal(2, caught)
  end)

  it("sparse_gather: tables and the JSONL / CSV / SVG files", function()
    local d = tmpdir()
    local r = run { "experiments/sparse_gather.lua", "--quick", "--out", d }
    assert_passed(r, "sparse_gather")
    for _, f in ipairs { "sparse_gather.jsonl", "sparse_gather.csv", "sparse_gather.svg" } do
      local fh = io.open(d .. "/" .. f)
      assert.truthy(fh, f)
      assert.is_true(#fh:read("a") > 100, f)
      fh:close()
    end
    assert.truthy(r.stdout:find("compaction of referenced pages", 1, true))
  end)

  it("new_layout: a Lua-only layout verified and timed beside the built-ins", function()
    local r = run { "experiments/new_layout.lua", "--quick", "--quiet" }
    assert_passed(r, "new_layout")
    assert.truthy(r.stdout:find("lab_fp8_ue8m0_64%s+656"), r.stdout)
  end)

  it("an unknown argument is an error naming it", function()
    local r = run { "experiments/mixed_backend.lua", "--colour", "red" }
    assert.equal(1, r.exit_code)
    assert.truthy(r.stderr:find("mixed_backend: unknown argument '--colour'", 1, true), r.stderr)
  end)
end)

-- Scripts that no CPU run executes still have to compile: a syntax error in
-- a benchmark would otherwise first show on the device, costing its time.
describe("bench and experiment scripts", function()
  it("every script in bench/ and experiments/ compiles", function()
    local R = require "rtc_support"
    local files = {}
    for _, dir in ipairs { "bench", "experiments" } do
      for _, n in ipairs(R.list(dir)) do
        if n:match("%.lua$") then files[#files + 1] = dir .. "/" .. n end
      end
    end
    assert.truthy(#files >= 15, "found only " .. #files .. " scripts")
    for _, f in ipairs(files) do
      local chunk, err = loadfile(f)
      assert(chunk, err)
    end
  end)

  -- a run that stops with exit code 1 and the message on stderr
  local function refused(args, message)
    local r = run(args)
    assert.equal(1, r.exit_code)
    assert.truthy(r.stderr:find(message, 1, true), r.stderr)
  end

  it("attn_l2_resident refuses the CPU and bad options with a message", function()
    refused({ "bench/attn_l2_resident.lua" }, "times the baked GPU kernels; no GPU here")
    refused({ "bench/attn_l2_resident.lua", "--pages", "0" }, "--pages takes a positive whole number")
  end)

  it("attn_splits refuses the CPU and bad options with a message", function()
    refused({ "bench/attn_splits.lua" }, "times the baked GPU kernels' split counts; no GPU here")
    refused({ "bench/attn_splits.lua", "--max-time", "-1" }, "--max-time takes a positive number")
    refused({ "bench/attn_splits.lua", "--fast" }, "unknown argument --fast")
  end)

  it("attn_rows refuses the CPU and bad options with a message", function()
    refused({ "bench/attn_rows.lua" }, "times the baked GPU kernels; no GPU here")
    refused({ "bench/attn_rows.lua", "--max-time", "0" }, "--max-time takes a positive number")
    refused({ "bench/attn_rows.lua", "--fast" }, "unknown argument --fast")
  end)
end)
