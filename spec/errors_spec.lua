-- Every misuse is a Lua error whose message says what is wrong and what was
-- expected: bad dtype, shape, stride, views out of range, wrong device,
-- closed tensors, out of memory, CUDA errors after a launch naming the kernel.
local mla = require "mlalab"
local S = require "support"

local core = mla.core
local E = S.assert_error_contains

local function cpu_tensor() return mla.randn({ 3, 4 }, { device = "cpu" }) end

describe("bad dtypes", function()
  it("creation names the unknown dtype and lists the known ones", function()
    local err = E(function() mla.empty({ 2 }, "f33", "cpu") end, "unknown dtype 'f33'")
    assert.truthy(err:find("bf16", 1, true) and err:find("e2m1", 1, true), err)
    E(function() mla.rand({ 2 }, { dtype = "float128", device = "cpu" }) end, "unknown dtype 'float128'")
    E(function() mla.tensor({ 1, 2 }, "int128", "cpu") end, "unknown dtype 'int128'")
  end)

  it("conversions and reinterpretation name the unknown dtype", function()
    local t = cpu_tensor()
    E(function() t:to("fp7") end, "'fp7' is neither a dtype")
    E(function() t:to({ dtype = "fp7" }) end, "unknown dtype 'fp7'")
    E(function() t:view("fp7") end, "unknown dtype 'fp7'")
    E(function() mla.dtype_info("fp7") end, "unknown dtype 'fp7'")
  end)

  it("a tensor element that is not a number is named", function()
    E(function() mla.tensor({ 1, "two" }, "f32", "cpu") end, "element is a string, not a number")
  end)
end)

describe("bad shapes", function()
  it("negative sizes, too many dims and non-integer sizes", function()
    E(function() mla.empty({ 3, -1 }, "f32", "cpu") end, "size of dim 1 is negative (-1)")
    E(function() mla.empty({ 1, 1, 1, 1, 1, 1, 1, 1, 1 }, "f32", "cpu") end, "at most 8")
    E(function() mla.empty({ 2, 2.5 }, "f32", "cpu") end, "shape entry 2 is not an integer")
    E(function() mla.empty({ 2, "x" }, "f32", "cpu") end, "shape entry 2 is not an integer (string)")
  end)

  it("shapes too large to address, and allocations beyond any host", function()
    E(function() mla.empty({ 1 << 40, 1 << 40 }, "f32", "cpu") end, "too large to address")
    E(function() mla.empty({ 0, 1 << 40, 1 << 40 }, "f32", "cpu") end, "too large to address")
    E(function() mla.empty({ 1 << 50 }, "u8", "cpu") end, "out of host memory: requested 1125899906842624 bytes")
  end)

  it("view and reshape check element counts and strides", function()
    local t = mla.arange(6, "i32", "cpu")
    E(function() t:view({ 4, 2 }) end, "view: shape has 8 elements, tensor has 6")
    E(function() t:view({ -1, -1 }) end, "only one size may be -1")
    E(function() t:view({ -1, 4 }) end, "cannot infer dim 0 for 6 elements")
    E(function() t:view({ 2, 3 }):transpose(0, 1):view({ 6 }) end, "strides do not allow this shape")
    E(function() t:reshape({ 7 }) end, "shape has 7 elements, tensor has 6")
    E(function() t:view({ 1 << 40, 1 << 40, 0 }) end, "overflows 64 bits")
  end)

  it("copies need equal shapes and name both", function()
    E(function() mla.zeros({ 2, 3 }, "f32", "cpu"):copy(mla.zeros({ 3, 2 }, "f32", "cpu")) end,
      "copy: shape mismatch, destination [2, 3], source [3, 2]")
  end)
end)

describe("bad strides", function()
  local base = mla.randn({ 10 }, { device = "cpu" })

  it("negative strides and offsets are rejected", function()
    E(function() base:as_strided({ 2 }, { -1 }, 5) end, "stride of dim 0 is negative (-1)")
    E(function() base:as_strided({ 2 }, { 1 }, -1) end, "storage offset is negative (-1)")
  end)

  it("the true extent after the strides is checked against the storage", function()
    E(function() base:as_strided({ 3, 2 }, { 4, 1 }, 1) end, "view reaches byte 44 but its storage has 40 bytes")
    E(function() base:as_strided({ 2 }, { 1 }, 9) end, "storage has 40 bytes")
  end)

  it("as_strided needs as many strides as sizes, and 64-bit extents", function()
    E(function() base:as_strided({ 2, 2 }, { 1 }) end, "2 sizes but 1 strides")
    E(function() base:as_strided({ 3 }, { 1 << 62 }) end, "overflows 64-bit addressing")
  end)

  it("byte reinterpretation needs aligned offsets and strides", function()
    local row = mla.zeros({ 3, 10 }, "u8", "cpu")
    E(function() row:narrow(1, 1, 8):view("f32") end, "not aligned to the new element size")
    E(function() row:narrow(1, 0, 6):view("f32") end, "not a multiple of 32 bits")
    E(function() row:transpose(0, 1):view("f32") end, "the last dim must be contiguous")
    E(function() row:view("f32") end, "last dim of 10 x 8 bits is not a multiple of 32 bits")
  end)
end)

describe("views out of range", function()
  local t = mla.arange(24, "i32", "cpu"):view({ 2, 3, 4 })

  it("narrow, select and dims", function()
    E(function() t:narrow(1, 2, 2) end, "narrow(1, 2, 2) is out of range for size 3")
    E(function() t:narrow(1, -1, 1) end, "out of range")
    E(function() t:narrow(1, 1) end, "bad argument #3 to 'narrow' (number expected, got no value)")
    E(function() t:select(0, 2) end, "select(0, 2) is out of range for size 2")
    E(function() t:select(5, 0) end, "dim 5 out of range for a 3-dim tensor")
    E(function() t:size(-4) end, "dim -4 out of range for a 3-dim tensor")
    E(function() t:transpose(0, 3) end, "dim 3 out of range")
  end)

  it("permute needs a permutation", function()
    E(function() t:permute({ 0, 0, 1 }) end, "is not a permutation of 0..2")
    E(function() t:permute({ 0, 1 }) end, "permute: 2 entries for a 3-dim tensor")
  end)

  it("element access checks every coordinate", function()
    E(function() t:get({ 1, 3, 0 }) end, "index 3 out of range for dim 1 of size 3")
    E(function() t:get({ 0, 0 }) end, "index has 2 coordinates, tensor has 3 dims")
    E(function() t:set({ 2, 0, 0 }, 1) end, "out of range for dim 0")
    E(function() t:item() end, "item: tensor has 24 elements, not 1")
    E(function() t:totable(10) end, "totable: 24 elements exceed the limit 10")
  end)
end)

describe("wrong devices", function()
  it("an unknown device string is named", function()
    E(function() mla.zeros({ 2 }, "f32", "tpu") end, "invalid device 'tpu' (expected cpu, cuda or cuda:N)")
    E(function() cpu_tensor():to("cuda:x") end, "invalid device 'cuda:x'")
    E(function() mla.set_device("gpu0") end, "invalid device 'gpu0'")
  end)

  it("a CUDA device that is not there is named, with the reason", function()
    if S.has_gpu then
      local n = core.device_count()
      E(function() mla.zeros({ 2 }, "f32", "cuda:" .. n) end, string.format("device 'cuda:%d' does not exist (%d CUDA device", n, n))
    else
      E(function() mla.zeros({ 2 }, "f32", "cuda") end, "no CUDA device is usable")
    end
  end)

  it("work that needs a GPU buffer rejects a CPU tensor", function()
    E(function() core.debug_kernel("trap", mla.zeros({ 4 }, "u8", "cpu")) end, "the buffer must be on a CUDA device")
    E(function() core.device_props("cpu") end, "a CUDA device is required here (got cpu)")
  end)

  it("single e2m1 elements on the GPU are not addressable #gpu", function()
    local g = mla.zeros({ 4 }, "e2m1", "cuda")
    E(function() g:set({ 1 }, 1) end, "single e2m1 elements on the GPU are not addressable")
    E(function() g:narrow(0, 1, 3):fill(1) end, "fill: an e2m1 tensor on the GPU needs a contiguous, even last dim")
  end)
end)

describe("closed tensors", function()
  it("every method rejects a closed tensor", function()
    local t = cpu_tensor()
    t:close()
    assert.is_true(t:is_closed())
    local calls = {
      function() t:numel() end, function() t:size() end, function() t:stride() end, function() t:narrow(0, 0, 1) end,
      function() t:select(0, 0) end, function() t:view({ 12 }) end, function() t:permute({ 1, 0 }) end,
      function() t:to("f64") end, function() t:clone() end, function() t:contiguous() end, function() t:fill(1) end,
      function() t:get({ 0, 0 }) end, function() t:totable() end, function() t:as_strided({ 2 }, { 1 }) end,
      function() t:data_ptr() end, function() t:uniform_() end,
    }
    for i, f in ipairs(calls) do
      local err = E(f, "attempt to use a closed tensor")
      assert.truthy(err, "call " .. i)
    end
  end)

  it("a closed tensor as an argument is rejected too", function()
    local a, b = cpu_tensor(), cpu_tensor()
    b:close()
    E(function() a:copy(b) end, "attempt to use a closed tensor")
    E(function() a:equal(b) end, "attempt to use a closed tensor")
  end)

  it("closing twice, and a <close> scope after an explicit close, are harmless", function()
    local t = cpu_tensor()
    t:close()
    t:close()
    do
      local s <close> = cpu_tensor()
      s:close()
    end
    assert.equal("tensor(closed)", tostring(t))
  end)

  it("non-tensor arguments name the expected type", function()
    E(function() cpu_tensor():copy({}) end, "mlalab.Tensor expected, got table")
  end)
end)

describe("device memory and kernel errors #gpu", function()
  it("out of device memory says what was requested and what is free", function()
    local p = mla.device_props(0)
    local want = p.total_mem * 2
    local err = E(function() mla.empty({ want }, "u8", "cuda") end, "out of device memory on cuda:0: requested " .. want .. " bytes")
    assert.truthy(err:match("bytes, %d+ free of %d+"), err)
    -- the device still works afterwards
    assert.equal(3, mla.arange(4, "f32", "cuda"):get({ 3 }))
  end)

  it("a launch the runtime refuses names the kernel and the CUDA error; the device stays usable", function()
    local mod = mla.rtc.compile { name = "errors_spec_noop.cu", source = 'extern "C" __global__ void noop_kernel(int *p) { if (p) p[0] = 1; }' }
    local buf = mla.zeros({ 1 }, "i32", "cuda")
    local k = mod:kernel("noop_kernel")
    -- grid.y beyond 65535: only cudaLaunchKernel can say no
    E(function() k:launch { grid = { 1, 70000, 1 }, block = 32, args = { buf } } end,
      "launch of kernel noop_kernel: CUDA error cudaError")
    E(function() k:launch { grid = 1, block = 4096, args = { buf } } end, "kernel noop_kernel: block of 4096 threads exceeds its limit")
    k:launch { grid = 1, block = 32, args = { buf } }
    assert.equal(1, buf:get({ 0 }))
  end)

  it("a kernel that faults is reported with its name when the process synchronizes", function()
    -- in a child process: a trap poisons the CUDA context for good
    local bin = S.BIN
    local code = "local mla = require 'mlalab'; local b = mla.zeros({16}, 'u8', 'cuda'); " ..
      "mla.core.debug_kernel('trap', b); mla.synchronize('cuda')"
    local r = core.spawn { argv = { bin, "-e", code }, timeout = 120 }
    assert.equal(1, r.exit_code)
    assert.truthy(r.stderr:find("mla_debug_trap", 1, true), r.stderr)
    assert.truthy(r.stderr:find("CUDA error", 1, true), r.stderr)
    assert.truthy(r.stderr:find("restart the process", 1, true), r.stderr)
  end)
end)
