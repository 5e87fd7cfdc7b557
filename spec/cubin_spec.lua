-- mla.cubin: kernels' machine code compared between two cubins without a
-- disassembler (ELF .text sections), on modules NVRTC builds without a GPU:
-- a comment leaves every kernel the same, a changed constant changes only
-- its kernel, kernels present on one side are named, and bad input is a
-- Lua error naming what is wrong.
local mla = require "mlalab"
local S = require "support"
local R = require "rtc_support"
local cubin = require "mlalab.cubin"
local rtc = mla.rtc

local saved_dir
setup(function()
  saved_dir = rtc.cache_dir()
  rtc.set_cache { memory_only = true }
end)
teardown(function()
  if saved_dir then rtc.set_cache { dir = saved_dir } else rtc.set_cache { memory_only = true } end
end)

local function build(src) return rtc.compile { source = src, name = "cubin_spec.cu", arch = R.ARCH }.cubin end

local SRC = [[
extern "C" __global__ void scale(float *p, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = p[i] * SCALE + 1.0f;
}
extern "C" __global__ void copy(const float *a, float *b, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) b[i] = a[i];
}
]]
local function src(scale, extra) return "#define SCALE " .. scale .. "\n" .. (extra or "") .. SRC end

local function by_name(rows)
  local t = {}
  for _, r in ipairs(rows) do t[r.name] = r end
  return t
end

describe("cubin.compare", function()
  it("finds every kernel the same when only a comment changed", function()
    local rows = cubin.compare(build(src("3.0f")), build(src("3.0f", "// a comment\n")))
    assert.equal(2, #rows)
    for _, r in ipairs(rows) do
      assert.equal("same", r.status, r.name)
      assert.is_true(r.a > 0 and r.a == r.b and r.prefix == r.a)
    end
    assert.truthy(cubin.report(rows):find("2 kernels: 2 same", 1, true))
  end)

  it("finds only the kernel whose constant changed, with its identical head and tail", function()
    local rows = by_name(cubin.compare(build(src("3.0f")), build(src("5.0f"))))
    assert.equal("same", rows.copy.status)
    local r = rows.scale
    assert.equal("differs", r.status)
    assert.is_true(r.prefix + r.suffix < math.min(r.a, r.b), "the differing instructions are counted in neither end")
    assert.truthy(cubin.report({ r }):find("differs", 1, true))
  end)

  it("names the kernels one side lacks, and filters by name", function()
    local extra = [[extern "C" __global__ void only_here(int *p) { p[0] = 7; }
]]
    local rows = by_name(cubin.compare(build(src("3.0f")), build(src("3.0f", extra))))
    assert.equal("only_b", rows.only_here.status)
    assert.is_nil(rows.only_here.a)
    local f = cubin.compare(build(src("3.0f")), build(src("3.0f", extra)), "cop")
    assert.equal(1, #f)
    assert.equal("copy", f[1].name)
  end)

  it("rejects what is not a cubin, naming the side and the problem", function()
    local good = build(src("3.0f"))
    S.assert_error_contains(function() cubin.compare("not an elf at all, just text....................................", good) end,
      "cubin: first cubin: not an ELF file")
    S.assert_error_contains(function() cubin.compare(good, good:sub(1, 200)) end, "second cubin")
    S.assert_error_contains(function() cubin.compare(good, 42) end, "expected the file's bytes")
    S.assert_error_contains(function() cubin.diff_files("/nonexistent/a.cubin", "/nonexistent/b.cubin") end,
      "cubin: cannot open /nonexistent/a.cubin")
  end)
end)
