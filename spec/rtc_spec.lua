-- mla.rtc: NVRTC compiles (files, strings, defines, options, name
-- expressions), the content-addressed disk cache across fresh processes
-- (hits, misses, corrupted and truncated entries recompiled), compile errors
-- that point at kernels_rtc/<file>(line), resource usage, argument checks
-- naming parameters, reloads on edited sources and headers, and layout
-- headers whose constants kernels read. All of it runs without a GPU
-- (NVRTC needs none); #gpu: launches of the JIT KV kernels give the CPU
-- reference's bytes, dynamic shared memory opt-in, launch errors name the kernel.
local mla = require "mlalab"
local S = require "support"
local assert_bytes, perm = S.assert_bytes, S.perm
local R = require "rtc_support"
local core = mla.core
local rtc = mla.rtc
local K = mla.kernels

local ARCH = R.ARCH

-- Every spec compiles into a cache directory of its own.
local saved_dir
setup(function()
  saved_dir = rtc.cache_dir()
  rtc.set_cache { dir = R.tmpdir() .. "/cache" }
end)
teardown(function()
  if saved_dir then rtc.set_cache { dir = saved_dir } else rtc.set_cache { memory_only = true } end
  R.cleanup()
end)

-- A source that no earlier run compiled (the key covers the text).
local function fresh(src)
  return string.format("// nonce %d %d\n%s", os.time(), math.random(1, 1 << 30), src)
end

local TEMPLATE_SRC = [[
template <int N, typename T> __global__ void fill(T *p) { p[threadIdx.x] = (T)N; }
extern "C" __global__ void plain(int *p, int n) { if (n > 0) p[0] = n; }
]]

describe("rtc.compile", function()
  it("compiles a source string into a cubin for the given architecture, without a GPU", function()
    local m = rtc.compile { source = fresh(TEMPLATE_SRC), name = "tpl.cu", arch = ARCH }
    assert.equal("sm_90a", m.arch)
    assert.equal("\127ELF", m.cubin:sub(1, 4))
    assert.is_true(#m.cubin > 500)
    assert.equal("plain", m:lowered_name("plain"))
    local names = {}
    for _, k in ipairs(m:kernels()) do names[#names + 1] = k.name end
    assert.same({ "plain" }, names) -- templates exist only once instantiated
  end)

  it("compiles a file of kernels_rtc/ by name, with the names its mlalab-rtc block lists", function()
    local m = rtc.compile { file = "kv_gather.cu", layout = mla.layout.get("bf16"), block_size = 16, arch = ARCH }
    assert.equal("kernels_rtc/kv_gather.cu", m.program)
    assert.equal("_Z9kv_gatherIiEv14mla_cache_viewPKT_xPtxiPy", m:lowered_name("kv_gather<int>"))
    assert.equal("_Z9kv_gatherIxEv14mla_cache_viewPKT_xPtxiPy", m:lowered_name("kv_gather<long long>"))
    assert.same({ "view", "slots", "n", "out", "out_stride", "ncols", "bad" }, m:param_names("kv_gather<long long>"))
  end)

  it("instantiates templates through name expressions, at compile time or later", function()
    local m = rtc.compile { source = fresh(TEMPLATE_SRC), name = "tpl.cu", arch = ARCH, names = { "fill<4, float>" } }
    assert.equal("_Z4fillILi4EfEvPT0_", m:lowered_name("fill<4, float>"))
    assert.is_nil(m:lowered_name("fill<7, int>"))
    assert.equal("_Z4fillILi7EiEvPT0_", m:instantiate("fill<7, int>"))
    assert.equal("_Z4fillILi4EfEvPT0_", m:lowered_name("fill<4, float>")) -- earlier ones stay
    assert.equal(3, #m:kernels())
  end)

  it("raises a compile error for an invalid name expression and keeps the module's last build", function()
    local m = rtc.compile { source = fresh(TEMPLATE_SRC), name = "tpl.cu", arch = ARCH }
    local key = m.key
    local ok, err = pcall(m.instantiate, m, "fill<4, no_such_type>")
    assert.is_false(ok)
    assert.is_true(rtc.is_compile_error(err))
    assert.truthy(tostring(err):find("no_such_type", 1, true))
    assert.equal(key, m.key)
    assert.equal("plain", m:lowered_name("plain"))
  end)

  it("passes defines as -D options (integers, strings, flags) that the kernel sees", function()
    local src = fresh([[
static_assert(WIDTH == 96, "WIDTH");
static_assert(sizeof(ELEM) == 2, "ELEM");
#ifndef FLAG
#error FLAG missing
#endif
extern "C" __global__ void k(ELEM *p) { p[0] = (ELEM)WIDTH; }
]])
    local m = rtc.compile { source = src, name = "defs.cu", arch = ARCH,
      defines = { WIDTH = 96, ELEM = "unsigned short", FLAG = true, UNUSED = false } }
    local opts = table.concat(m.options, " ")
    assert.truthy(opts:find("-DWIDTH=96", 1, true))
    assert.truthy(opts:find("-DELEM=unsigned short", 1, true))
    assert.truthy(opts:find("-DFLAG", 1, true))
    assert.falsy(opts:find("UNUSED", 1, true))
    local ok, err = pcall(rtc.compile, { source = src, name = "defs.cu", arch = ARCH, defines = { WIDTH = 95, ELEM = "short", FLAG = true } })
    assert.is_false(ok)
    assert.truthy(tostring(err):find('static assertion failed with "WIDTH"', 1, true))
  end)

  it("passes options, the language standard and include directories to NVRTC", function()
    local inc = R.tmpdir()
    R.write(inc .. "/extra.cuh", "#define EXTRA_VALUE 41\n")
    local src = fresh([[
#include "extra.cuh"
static_assert(__cplusplus >= 202002L, "C++20");
static_assert(EXTRA_VALUE + OPT_VALUE == 42, "sum");
extern "C" __global__ void k(int *p) { p[0] = EXTRA_VALUE; }
]])
    local m = rtc.compile { source = src, name = "opts.cu", arch = ARCH, std = "c++20", include_dirs = { inc },
      options = { "-DOPT_VALUE=1" } }
    assert.equal("k", m:lowered_name("k"))
    local ok, err = pcall(rtc.compile, { source = src, name = "opts.cu", arch = ARCH, include_dirs = { inc }, options = { "-DOPT_VALUE=1" } })
    assert.is_false(ok) -- C++17 by default
    assert.truthy(tostring(err):find('"C++20"', 1, true))
  end)

  it("rejects PTX targets, unknown architectures and unknown options with clear errors", function()
    S.assert_error_contains(function() rtc.compile { source = "", arch = "compute_90a" } end, "always builds a cubin")
    S.assert_error_contains(function() rtc.compile { source = "", arch = "sm_91" } end, "cannot build sm_91 cubins")
    S.assert_error_contains(function() rtc.compile { source = "", arch = "sm_80a" } end, "start at sm_90a")
    S.assert_error_contains(function() rtc.compile { source = "", arch = ARCH, defins = {} } end, "unknown option 'defins'")
    S.assert_error_contains(function() rtc.compile { file = "no_such_kernel.cu", arch = ARCH } end, "no kernel file 'no_such_kernel.cu'")
    -- option values of the wrong type (the argument fuzz's finds): each names the option
    S.assert_error_contains(function() rtc.compile { source = "", arch = ARCH, include_dirs = { {} } } end,
      "rtc.compile: include_dirs must be a list of directories (strings)")
    S.assert_error_contains(function() rtc.compile { source = "", arch = ARCH, std = 5 } end, "rtc.compile: std must be a string")
    S.assert_error_contains(function() rtc.compile { source = "", arch = ARCH, lineinfo = "x" } end, "rtc.compile: lineinfo must be a boolean")
    S.assert_error_contains(function() rtc.compile { source = "", arch = ARCH, layout = "nope", block_size = 16 } end,
      "rtc.compile: layout: ")
    S.assert_error_contains(function() rtc.compile { source = "", arch = ARCH, layout = 7, block_size = 16 } end, "rtc.compile: layout: ")
  end)

  it("takes a layout by name as well as by value", function()
    local by_name = rtc.compile { file = "kv_gather.cu", layout = "bf16", block_size = 16, arch = ARCH, cache = "memory" }
    local by_value = rtc.compile { file = "kv_gather.cu", layout = mla.layout.get("bf16"), block_size = 16, arch = ARCH,
      cache = "memory" }
    assert.are.equal(by_value.key, by_name.key)
  end)
end)

-- Compile errors --------------------------------------------------------------------

describe("rtc compile errors", function()
  -- A kernels_rtc/ of our own (its include/ is the real one), for files with errors.
  local function with_kernels_dir(files, fn)
    local root = R.tmpdir()
    local kd = root .. "/kernels_rtc"
    assert(os.execute("mkdir -p " .. R.quote(kd)))
    assert(os.execute("ln -s " .. R.quote(rtc.kernels_dir() .. "/include") .. " " .. R.quote(kd .. "/include")))
    for name, text in pairs(files) do R.write(kd .. "/" .. name, text) end
    local paths = package.loaded["mlalab.paths"]
    local old = paths.kernels_rtc
    paths.kernels_rtc = kd
    local ok, err = pcall(fn)
    paths.kernels_rtc = old
    if not ok then error(err, 0) end
  end

  it("point at kernels_rtc/<file>(line) and show the offending line", function()
    with_kernels_dir({ ["broken.cu"] = 'extern "C" __global__ void k(int *p) {\n  int x = 2;\n  p[0] = undefined_thing + x;\n}\n' }, function()
      local ok, err = pcall(rtc.compile, { file = "broken.cu", arch = ARCH })
      assert.is_false(ok)
      assert.is_true(rtc.is_compile_error(err))
      assert.equal('kernels_rtc/broken.cu(3): error: identifier "undefined_thing" is undefined', err.message)
      assert.equal("  p[0] = undefined_thing + x;", err.errors[1].source)
      assert.equal(3, err.errors[1].line)
      local text = tostring(err)
      assert.truthy(text:find(">     3 |   p[0] = undefined_thing + x;", 1, true))
      assert.truthy(err.log:find("1 error detected", 1, true))
      assert.truthy(table.concat(err.options, " "):find("-arch=sm_90a", 1, true))
    end)
  end)

  it("in an included header point at that header's path and line", function()
    with_kernels_dir({
      ["uses_header.cu"] = '#include "bad_header.cuh"\nextern "C" __global__ void k(int *p) { p[0] = helper(); }\n',
      ["bad_header.cuh"] = "__device__ int helper() {\n  return missing_value;\n}\n",
    }, function()
      local ok, err = pcall(rtc.compile, { file = "uses_header.cu", arch = ARCH })
      assert.is_false(ok)
      assert.equal('kernels_rtc/bad_header.cuh(2): error: identifier "missing_value" is undefined', err.message)
      assert.equal("  return missing_value;", err.errors[1].source)
    end)
  end)

  it("count every error of a file", function()
    local ok, err = pcall(rtc.compile, { source = fresh("__global__ void a() { x1 = 1; }\n__global__ void b() { x2 = 2; }\n"),
      name = "two.cu", arch = ARCH })
    assert.is_false(ok)
    assert.equal(2, #err.errors)
    assert.truthy(tostring(err):find("(2 errors", 1, true))
  end)
end)

-- Resources --------------------------------------------------------------------------

describe("rtc resource usage", function()
  -- N floats per thread, indexed at run time: 64 fit in registers, 256 go to the stack.
  local function source(n)
    return (([[
extern "C" __global__ void res_kernel(float *out, int i, int j) {
  __shared__ float tile[256];
  float local[N];
  for (int k = 0; k < N; k++) local[k] = out[k] * k;
  tile[threadIdx.x] = local[i & (N - 1)];
  __syncthreads();
  out[threadIdx.x] = tile[j & 255] + local[j & (N - 1)];
}
]]):gsub("N", tostring(n)))
  end
  local SRC = source(256)

  it("reports registers, shared memory and the stack frame of each kernel from ptxas, without a GPU", function()
    local m = rtc.compile { source = fresh(SRC), name = "res.cu", arch = ARCH }
    local r = m:resources("res_kernel")
    assert(r, "no resources for res_kernel (" .. tostring(m.cache_state) .. "); log:\n" .. tostring(m.rec.log))
    assert.is_true(r.registers > 0 and r.registers <= 255)
    assert.equal(1024, r.shared_mem)
    assert.equal(1024, r.stack) -- the run-time indexed array lives in local memory
    assert.same(r, m:resources().res_kernel)
  end)

  it("reports spills when registers are capped", function()
    local m = rtc.compile { source = fresh(source(64)), name = "res.cu", arch = ARCH, options = { "-maxrregcount=24" } }
    local r = m:resources("res_kernel")
    assert(r, "no resources for res_kernel (" .. tostring(m.cache_state) .. "); log:\n" .. tostring(m.rec.log))
    assert.is_true(r.registers <= 24)
    assert.is_true(r.spill_stores > 0 and r.spill_loads > 0)
  end)

  it("keeps the resource report of a disk hit", function()
    local src = fresh(SRC)
    local a = rtc.compile { source = src, name = "res.cu", arch = ARCH }
    rtc.clear_memo()
    local b = rtc.compile { source = src, name = "res.cu", arch = ARCH }
    assert.equal("disk", b.cache_state)
    assert.same(a:resources(), b:resources())
  end)
end)

-- Arguments ------------------------------------------------------------------------------

describe("rtc argument checks (no GPU: the PTX parameter list)", function()
  local SRC = [[
extern "C" __global__ void args_kernel(const float *x, int n, double scale, unsigned char flag, long long count,
                                       float3 v, short s) {}
]]
  local m
  local function mod()
    m = m or rtc.compile { source = SRC, name = "args.cu", arch = ARCH }
    return m
  end

  it("lays parameters out as CUDA does (offsets, sizes, kinds)", function()
    local sig = mod():signature("args_kernel")
    local got = {}
    for i, p in ipairs(sig) do got[i] = { p.offset, p.size, p.kind } end
    assert.same({ { 0, 8, "int" }, { 8, 4, "int" }, { 16, 8, "float" }, { 24, 1, "int" }, { 32, 8, "int" },
      { 40, 12, "bytes" }, { 52, 2, "int" } }, got)
    assert.same({ "x", "n", "scale", "flag", "count", "v", "s" }, mod():param_names("args_kernel"))
  end)

  it("packs numbers, booleans, byte strings and tensors at the parameters' offsets and sizes", function()
    local t = mla.zeros({ 4 }, "f32", "cpu")
    local v = string.pack("<fff", 1, 2, 3)
    local got = mod():check_args("args_kernel", { t, 7, 0.5, true, 1 << 40, v, -3 })
    local want = string.pack("<I8i4xxxxdBxxxxxxxi8", t:data_ptr(), 7, 0.5, 1, 1 << 40) .. v .. string.pack("<i2", -3)
    assert.equal(want, got)
  end)

  it("names the kernel and every parameter when the count is wrong", function()
    S.assert_error_contains(function() mod():check_args("args_kernel", { 0, 7 }) end,
      "kernel args_kernel: expects 7 arguments (x, n, scale, flag, count, v, s), got 2")
  end)

  it("names the parameter whose argument has the wrong size", function()
    S.assert_error_contains(function() mod():check_args("args_kernel", { 0, 7, 0.5, true, 1, string.pack("<ff", 1, 2), -3 }) end,
      "kernel args_kernel: parameter 'v': argument 6 of 7 (b8[12], 12 bytes): got a 8-byte string")
  end)

  it("names the parameter whose integer does not fit", function()
    S.assert_error_contains(function() mod():check_args("args_kernel", { 0, 1 << 40, 0.5, true, 1, ("\0"):rep(12), -3 }) end,
      "parameter 'n': argument 2 of 7 (u32, 4 bytes): the integer 1099511627776 does not fit in 4 bytes")
    S.assert_error_contains(function() mod():check_args("args_kernel", { 0, 7, 0.5, 256, 1, ("\0"):rep(12), -3 }) end,
      "parameter 'flag': argument 4 of 7 (u8, 1 bytes): the integer 256 does not fit in 1 bytes")
  end)

  it("names the parameter given a fraction for an integer or a tensor for a number", function()
    S.assert_error_contains(function() mod():check_args("args_kernel", { 0, 2.5, 0.5, true, 1, ("\0"):rep(12), -3 }) end,
      "parameter 'n': argument 2 of 7 (u32, 4 bytes): got the number 2.5, which is not an integer")
    S.assert_error_contains(function() mod():check_args("args_kernel", { 0, 7, mla.zeros({ 2 }, "f32", "cpu"), true, 1, ("\0"):rep(12), -3 }) end,
      "parameter 'scale': argument 3 of 7 (f64, 8 bytes): got a cpu f32 tensor (an 8-byte device pointer)")
  end)

  it("rejects values kernels cannot take", function()
    S.assert_error_contains(function() mod():check_args("args_kernel", { {}, 7, 0.5, true, 1, ("\0"):rep(12), -3 }) end,
      "argument 1 of 7 is a table; kernels take tensors, numbers, booleans and byte strings")
    S.assert_error_contains(function() mod():check_args("args_kernel", { 0, nil, 0.5, true, 1, ("\0"):rep(12), -3, n = 7 }) end,
      "argument 2 of 7 is nil")
  end)
end)

-- The disk cache --------------------------------------------------------------------------

describe("rtc disk cache", function()
  local SRC = 'extern "C" __global__ void cached(float *p, int n) { if (threadIdx.x < n) p[threadIdx.x] *= 2.0f; }\n'

  local function setup_case()
    local dir = R.tmpdir()
    local src = R.write(dir .. "/src.cu", fresh(SRC))
    return dir .. "/cache", src
  end

  local function assert_ok(r, what)
    assert(r.exit_code == 0, string.format("%s: exit %s signal %s, stderr: %s", what, r.exit_code, r.signal, r.stderr))
  end

  it("misses in a fresh process, then hits in the next one (same key, same cubin)", function()
    local cache, src = setup_case()
    local a = R.child_compile(src, cache)
    assert_ok(a, "first process")
    assert.equal("compiled", a.state)
    local b = R.child_compile(src, cache)
    assert_ok(b, "second process")
    assert.equal("disk", b.state)
    assert.equal(a.key, b.key)
    assert.equal(a.hash, b.hash)
    local entries, temps = R.cache_files(cache)
    assert.same({ a.key .. ".cubin" }, entries)
    assert.same({}, temps)
  end)

  it("hits the in-process memo, counts hits, misses and compile time", function()
    rtc.reset_stats()
    local src = fresh(SRC)
    local a = rtc.compile { source = src, name = "memo.cu", arch = ARCH }
    local b = rtc.compile { source = src, name = "memo.cu", arch = ARCH }
    rtc.clear_memo()
    local c = rtc.compile { source = src, name = "memo.cu", arch = ARCH }
    local d = rtc.compile { source = src, name = "memo.cu", arch = ARCH, cache = false }
    assert.same({ "compiled", "memo", "disk", "compiled" }, { a.cache_state, b.cache_state, c.cache_state, d.cache_state })
    local st = rtc.stats()
    assert.same({ 2, 1, 1 }, { st.compiles, st.memo_hits, st.disk_hits })
    assert.is_true(st.compile_ms > 0 and a.compile_ms > 0)
  end)

  it("keys on the source, defines, options, architecture, headers and the program name", function()
    local base = { source = fresh(SRC), name = "key.cu", arch = ARCH }
    local function key(changes)
      local s = {}
      for k, v in pairs(base) do s[k] = v end
      for k, v in pairs(changes) do s[k] = v end
      return rtc.compile(s).key
    end
    local keys = { key {}, key { source = base.source .. " " }, key { defines = { X = 1 } }, key { options = { "-ftz=true" } },
      key { arch = "sm_80" }, key { headers = { ["unused.h"] = "int u;" } }, key { name = "key2.cu" } }
    local seen = {}
    for i, k in ipairs(keys) do
      assert.is_nil(seen[k], "key " .. i .. " repeats key " .. tostring(seen[k]))
      seen[k] = i
    end
    assert.equal(keys[1], key {}) -- and is stable
  end)

  it("recompiles a deliberately corrupted entry instead of loading it, and rewrites it", function()
    local cache, src = setup_case()
    local a = R.child_compile(src, cache)
    assert_ok(a, "first process")
    local path = cache .. "/" .. a.key .. ".cubin"
    local bytes = R.read(path)
    local mid = #bytes // 2
    R.write(path, bytes:sub(1, mid - 1) .. string.char(bytes:byte(mid) ~ 0x40) .. bytes:sub(mid + 1))
    assert.same({ "corrupt", "checksum mismatch" }, { core.rtc_entry_check(a.key, R.read(path)) })
    local b = R.child_compile(src, cache)
    assert_ok(b, "second process")
    assert.same({ "compiled", 1, a.hash }, { b.state, b.corrupt, b.hash })
    assert.equal("hit", (core.rtc_entry_check(a.key, R.read(path))))
    assert.equal("disk", R.child_compile(src, cache).state)
  end)

  it("recompiles a truncated entry instead of loading it", function()
    local cache, src = setup_case()
    local a = R.child_compile(src, cache)
    assert_ok(a, "first process")
    local path = cache .. "/" .. a.key .. ".cubin"
    local bytes = R.read(path)
    for _, cut in ipairs { #bytes - 1, #bytes // 2, 47, 0 } do
      R.write(path, bytes:sub(1, cut))
      local b = R.child_compile(src, cache)
      assert_ok(b, "process after a cut at " .. cut)
      assert.same({ "compiled", 1, a.hash }, { b.state, b.corrupt, b.hash })
      assert.equal("hit", (core.rtc_entry_check(a.key, R.read(path)))) -- rewritten whole
    end
  end)

  it("treats an entry stored under another key, or a foreign file, as corrupt", function()
    local cache, src = setup_case()
    local a = R.child_compile(src, cache)
    assert_ok(a, "first process")
    local bytes = R.read(cache .. "/" .. a.key .. ".cubin")
    local other = ("0"):rep(32)
    assert.same({ "corrupt", "entry stored under another key" }, { core.rtc_entry_check(other, bytes) })
    assert.same({ "corrupt", "not an mlalab kernel cache entry of this format version" },
      { core.rtc_entry_check(a.key, "\127ELF" .. ("\0"):rep(100)) })
  end)

  it("keeps working in memory when the cache directory cannot be written", function()
    local dir = R.tmpdir()
    R.write(dir .. "/file", "x")
    rtc.reset_stats()
    rtc.set_cache { dir = dir .. "/file/cache" } -- a path under a regular file
    local ok, m = pcall(rtc.compile, { source = fresh(SRC), name = "ro.cu", arch = ARCH })
    rtc.set_cache { dir = R.tmpdir() .. "/cache" }
    assert.is_true(ok, tostring(m))
    assert.equal("compiled", m.cache_state)
    assert.equal(1, rtc.stats().write_errors)
  end)
end)

-- Reload -----------------------------------------------------------------------------------

describe("rtc module reload", function()
  local function project()
    local dir = R.tmpdir()
    R.write(dir .. "/names.cuh", "#define KNAME kern_one\n")
    R.write(dir .. "/k.cu", '#include "names.cuh"\nextern "C" __global__ void KNAME(int *p) { p[0] = 1; }\n')
    return dir
  end
  local function kernel_names(m)
    local out = {}
    for _, k in ipairs(m:kernels()) do out[#out + 1] = k.name end
    table.sort(out)
    return out
  end

  it("recompiles when an included header changes", function()
    local dir = project()
    local m = rtc.compile { file = dir .. "/k.cu", arch = ARCH }
    assert.same({ "kern_one" }, kernel_names(m))
    assert.is_false(m:changed())
    assert.is_false(m:reload())
    R.write(dir .. "/names.cuh", "#define KNAME kern_two_renamed\n")
    assert.is_true(m:changed())
    assert.is_true(m:reload())
    assert.same({ "kern_two_renamed" }, kernel_names(m))
    assert.is_false(m:changed())
  end)

  it("recompiles when the source file changes, and picks up its new mlalab-rtc block", function()
    local dir = project()
    local m = rtc.compile { file = dir .. "/k.cu", arch = ARCH }
    R.write(dir .. "/k.cu", '/* mlalab-rtc\n  names = { "tk<3>" },\n  defines = { EXTRA = 5 },\n*/\n#include "names.cuh"\n'
      .. 'extern "C" __global__ void KNAME(int *p) { p[0] = EXTRA; }\ntemplate <int N> __global__ void tk(int *p) { p[0] = N; }\n')
    assert.is_true(m:reload())
    assert.same({ "kern_one", "tk<3>" }, kernel_names(m))
    assert.truthy(table.concat(m.options, " "):find("-DEXTRA=5", 1, true))
  end)

  it("does not recompile a touched file whose content is the same", function()
    local dir = project()
    local m = rtc.compile { file = dir .. "/k.cu", arch = ARCH }
    local key = m.key
    assert(os.execute("touch -m -d '2030-01-01 00:00:00' " .. R.quote(dir .. "/names.cuh")))
    assert.is_true(m:changed())
    assert.is_false(m:reload())
    assert.equal(key, m.key)
    assert.is_false(m:changed())
  end)

  it("keeps the last build when the edited source does not compile", function()
    local dir = project()
    local m = rtc.compile { file = dir .. "/k.cu", arch = ARCH }
    R.write(dir .. "/names.cuh", "#define KNAME kern_one\nint broken = ;\n")
    local ok, err = pcall(m.reload, m)
    assert.is_false(ok)
    assert.is_true(rtc.is_compile_error(err))
    assert.same({ "kern_one" }, kernel_names(m))
    assert.is_true(m:changed()) -- still pending: the next reload tries again
  end)
end)

-- Layout headers ------------------------------------------------------------------------------

describe("rtc layout headers", function()
  local SCALE_KINDS = { none = 0, tensor = 1, group = 2 }
  local function f32(x) return (string.unpack("<f", string.pack("<f", x))) end
  local function hexf(x) return string.format("%a", f32(x)) .. "f" end

  -- The descriptor's numbers as defines a kernel compares with its constants.
  local function expectations(d)
    local last = #d.region_row_bytes
    local f = d.fields[1]
    return { EXPECT_DIM = d.dim, EXPECT_K = d.k_dims or d.dim, EXPECT_V = d.v_dims or d.k_dims or d.dim,
      EXPECT_BS = d.block_size, EXPECT_PAGE_BYTES = d.page_bytes, EXPECT_NFIELDS = #d.fields, EXPECT_NREGIONS = last,
      EXPECT_LAST_REGION = last - 1, EXPECT_LAST_OFF = d.region_off[last], EXPECT_LAST_ROW = d.region_row_bytes[last],
      EXPECT_F0_COUNT = f.count, EXPECT_F0_OFF = f.byte_off or 0, EXPECT_F0_KIND = SCALE_KINDS[f.scale_kind or "none"],
      EXPECT_F0_GROUP = f.group or 0, EXPECT_F0_SCALE_OFF = f.scale_off or 0, EXPECT_F0_QMAX = hexf(f.qmax or 0),
      EXPECT_F0_EPS = hexf(f.eps or 0) }
  end

  local READER = [[
#include "mla_layout.h" // self-contained: nothing needs including before it
static_assert(mla_layout.dim == EXPECT_DIM && MLA_LAYOUT_DIM == EXPECT_DIM, "dim");
static_assert(mla_layout.k_dims == EXPECT_K && mla_layout.v_dims == EXPECT_V, "k/v dims");
static_assert(mla_layout.block_size == EXPECT_BS && MLA_LAYOUT_BLOCK_SIZE == EXPECT_BS, "block_size");
static_assert(mla_layout.page_bytes == EXPECT_PAGE_BYTES && MLA_LAYOUT_PAGE_BYTES == EXPECT_PAGE_BYTES, "page_bytes");
static_assert(mla_layout.nfields == EXPECT_NFIELDS && mla_layout.nregions == EXPECT_NREGIONS, "counts");
static_assert(mla_layout.region_off[EXPECT_LAST_REGION] == EXPECT_LAST_OFF, "region_off");
static_assert(mla_layout.region_row_bytes[EXPECT_LAST_REGION] == EXPECT_LAST_ROW, "region_row_bytes");
static_assert(mla_layout.fields[0].count == EXPECT_F0_COUNT && mla_layout.fields[0].byte_off == EXPECT_F0_OFF, "field 0");
static_assert(mla_layout.fields[0].scale_kind == EXPECT_F0_KIND && mla_layout.fields[0].group == EXPECT_F0_GROUP, "scale");
static_assert(mla_layout.fields[0].scale_off == EXPECT_F0_SCALE_OFF, "scale_off");
static_assert(mla_layout.fields[0].qmax == EXPECT_F0_QMAX && mla_layout.fields[0].eps == EXPECT_F0_EPS, "floats");
extern "C" __global__ void read_layout(long long *out) {
  out[0] = mla_layout.page_bytes;
  out[1] = mla_layout.region_off[mla_layout.nregions - 1];
  out[2] = mla_layout.fields[0].count;
}
]]

  local custom = mla.layout.define {
    name = "rtc_spec_custom",
    fields = { { "lat", "e5m2", 96, scale = { dtype = "bf16", group = 32, policy = "amax", eps = 1e-3 } }, { "tail", "f16", 32 } },
  }
  local cases = {
    { "bf16", function() return mla.layout.get("bf16"), 64 end },
    { "fp8_v4 (page-split, ue8m0 scales, padding)", function() return mla.layout.get("fp8_v4"), 16 end },
    { "indexer_fp8 (no V dims)", function() return mla.layout.get("indexer_fp8"), 32 end },
    { "a descriptor table of fp8_ds_mla", function() return mla.layout.get("fp8_ds_mla"):desc(8), nil end },
    { "a Lua-only layout", function() return custom, 4 end },
  }
  for _, c in ipairs(cases) do
    it(c[1] .. ": a kernel compiled with the generated header reads the descriptor's numbers", function()
      local L, bs = c[2]()
      local d = L.desc and L:desc(bs) or L
      local m = rtc.compile { source = READER, name = "layout_reader.cu", arch = ARCH, layout = L, block_size = bs,
        defines = expectations(d) }
      assert.equal("read_layout", m:lowered_name("read_layout"))
      local h = rtc.layout_header(L, bs)
      assert.truthy(h:find("constexpr mla_layout_desc mla_layout = {", 1, true))
      assert.truthy(h:find(string.format("constexpr long long MLA_LAYOUT_PAGE_BYTES = %dLL;", d.page_bytes), 1, true))
    end)
  end

  it("a kernel expecting other numbers fails to compile (the constants are really read)", function()
    local L = mla.layout.get("fp8_ds_mla")
    local e = expectations(L:desc(64))
    e.EXPECT_LAST_OFF = e.EXPECT_LAST_OFF + 1
    local ok, err = pcall(rtc.compile, { source = READER, name = "layout_reader.cu", arch = ARCH, layout = L, block_size = 64, defines = e })
    assert.is_false(ok)
    assert.truthy(tostring(err):find('static assertion failed with "region_off"', 1, true))
  end)

  it("rejects a descriptor that is not one, naming the member", function()
    S.assert_error_contains(function() rtc.layout_header({ dim = 64, fields = {} }, 16) end, "fields must be a non-empty list")
    S.assert_error_contains(function() rtc.layout_header(mla.layout.get("bf16")) end, "block_size is required")
    S.assert_error_contains(function()
      rtc.layout_header({ dim = 64, page_bytes = 128, region_row_bytes = { 128 }, fields = { { count = 64, dtype = "q9" } } }, 1)
    end, "fields[1].dtype: unknown dtype 'q9'")
  end)

  it("packs an mla_cache_view with the tensor's strides and checks it against the layout", function()
    local L = mla.layout.get("fp8_ds_mla")
    local c = mla.cache.new { layout = L, num_blocks = 3, block_size = 16, num_layers = 4, order = "block_major", device = "cpu" }
    local v = c:view(2)
    local bytes = rtc.cache_view(v.pages, L, { block_size = 16, allow_cpu = true })
    local base, page_stride, token_stride, pages, scale = string.unpack("<i8i8i8i8i8", bytes)
    assert.same({ v.pages:data_ptr(), v.pages:stride(0), 656, 3, 0 }, { base, page_stride, token_stride, pages, scale })
    assert.is_true(page_stride > L:page_bytes(16)) -- the cross-layer stride, not block_size x row
    S.assert_error_contains(function() rtc.cache_view(v.pages, L, { block_size = 16 }) end, "pages must be a CUDA tensor")
    S.assert_error_contains(function() rtc.cache_view(mla.zeros({ 3, 100 }, "u8", "cpu"), L, { block_size = 16, allow_cpu = true }) end,
      "cache_view: ")
  end)
end)

-- On the GPU ----------------------------------------------------------------------------------

describe("JIT kernels on the GPU #gpu", function()
  S.on_device("cuda", before_each, after_each)
  local function single(L, nb, bs, dev, scale)
    local c = mla.cache.new { layout = L, num_blocks = nb, block_size = bs, device = dev, tensor_scale = scale }
    local v = c:view(0)
    v.pages:fill(0)
    return v
  end

  local function grid_for(n) return math.max(1, math.min((n + 3) // 4, 1024)) end

  for _, name in ipairs(mla.layout.builtins()) do
    it(name .. ": kv_write.cu writes the CPU reference's bytes into a 61-layer view, neighbours stay zero", function()
      for seed = 1, 2 do
        math.randomseed(400 + seed)
        mla.manual_seed(400 + seed)
        local L = mla.layout.get(name)
        local bs, nb = ({ 4, 16, 64 })[math.random(3)], math.random(3, 9)
        local cpu = single(L, nb, bs, "cpu", 0.625)
        local c = mla.cache.new { layout = L, num_blocks = nb, block_size = bs, num_layers = 61, order = "block_major",
          device = "cuda", tensor_scale = 0.625 }
        local g = c:view(33)
        g.pages:fill(0)
        c:poison(33, "zeros")
        local n = math.random(1, nb * bs)
        local p, sl = perm(nb * bs), {}
        for i = 1, n do sl[i] = (i % 5 == 2) and -1 or p[i] end
        local rows = mla.randn({ n, L.dim }, { std = ({ 1, 40 })[seed], device = "cpu" }):to("bf16")
        K.write(cpu, mla.tensor(sl, "i64", "cpu"), rows) -- the CPU reference (src/ref)
        local m = rtc.compile { file = "kv_write.cu", layout = L, block_size = bs }
        local view = rtc.cache_view(g.pages, L, { block_size = bs, tensor_scale = g.tensor_scale })
        local bad = mla.zeros({ 1 }, "i64", "cuda")
        local slots = mla.tensor(sl, "i64", "cuda")
        m:kernel("kv_write<long long>"):launch { grid = grid_for(n), block = 128,
          args = { view, slots, n, rows:cuda(), rows:stride(0), bad } }
        assert_bytes(g.pages:cpu(), cpu.pages, string.format("%s seed %d", name, seed))
        assert.equal(0, bad:cpu():item())
        assert.is_nil(c:check_bleed(33, { slots = sl }))
      end
    end)

    it(name .. ": kv_gather.cu reads the CPU reference's bf16 rows; -1 rows untouched, bad slots counted", function()
      math.randomseed(500)
      mla.manual_seed(500)
      local L = mla.layout.get(name)
      local bs, nb = 16, 7
      local cpu = single(L, nb, bs, "cpu", 0.375)
      local all = {}
      for i = 1, nb * bs do all[i] = i - 1 end
      K.write(cpu, mla.tensor(all, "i64", "cpu"), mla.randn({ nb * bs, L.dim }, { std = 3, device = "cpu" }):to("bf16"))
      local c = mla.cache.new { layout = L, num_blocks = nb, block_size = bs, num_layers = 5, order = "block_major",
        device = "cuda", tensor_scale = 0.375 }
      c:poison(2, "random")
      local g = c:view(2)
      g.pages:copy(cpu.pages)
      if g.tensor_scale then g.tensor_scale:copy(cpu.tensor_scale) end
      local n = 150
      local sl = {}
      for i = 1, n do sl[i] = math.random() < 0.1 and -1 or math.random(0, nb * bs - 1) end
      sl[7] = nb * bs + 3 -- past the cache: skipped and counted
      local sl_ref = {}
      for i = 1, n do sl_ref[i] = sl[i] < nb * bs and sl[i] or -1 end
      local want = K.gather_sparse(cpu, mla.tensor(sl_ref, "i32", "cpu"), { out = mla.full({ n, L.dim }, 7, "bf16", "cpu") })
      local m = rtc.compile { file = "kv_gather.cu", layout = L, block_size = bs }
      local out = mla.full({ n, L.dim }, 7, "bf16", "cuda")
      local bad = mla.zeros({ 1 }, "i64", "cuda")
      m:kernel("kv_gather<int>"):launch { grid = grid_for(n), block = 128,
        args = { rtc.cache_view(g.pages, L, { block_size = bs, tensor_scale = g.tensor_scale }), mla.tensor(sl, "i32", "cuda"),
          n, out, out:stride(0), L.dim, bad } }
      assert_bytes(out:cpu(), want, name)
      assert.equal(1, bad:cpu():item())
    end)
  end

  it("checks launch arguments against the device's parameter list, which matches the PTX one", function()
    local m = rtc.compile { file = "kv_gather.cu", layout = mla.layout.get("bf16"), block_size = 16 }
    local k = m:kernel("kv_gather<long long>")
    local dev, ptx = k:params(), k:signature()
    assert.equal(#ptx, #dev)
    for i = 1, #dev do assert.same({ ptx[i].offset, ptx[i].size }, { dev[i].offset, dev[i].size }) end
    S.assert_error_contains(function()
      k:launch { grid = 1, block = 128, args = { "short", 0, 0, 0, 0, 0, 0 } }
    end, "kernel kv_gather<long long>: parameter 'view': argument 1 of 7 (b8[40], 40 bytes): got a 5-byte string")
    S.assert_error_contains(function() k:launch { grid = 1, block = 128, args = { 0 } } end,
      "expects 7 arguments (view, slots, n, out, out_stride, ncols, bad), got 1")
    S.assert_error_contains(function()
      k:launch { grid = 1, block = 128, args = { ("\0"):rep(40), mla.zeros({ 2 }, "i64", "cpu"), 0, 0, 0, 0, 0 } }
    end, "is a cpu tensor, but the kernel launches on cuda")
  end)

  it("opts into large dynamic shared memory automatically, and names the kernel past the device's limit", function()
    local m = rtc.compile { source = [[
extern "C" __global__ void big_smem(int *out, int n) {
  extern __shared__ int buf[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = i;
  __syncthreads();
  if (threadIdx.x == 0) out[0] = buf[n - 1];
}]], name = "big_smem.cu" }
    local k = m:kernel("big_smem")
    local out = mla.zeros({ 1 }, "i32", "cuda")
    local bytes = 200 * 1024
    k:launch { grid = 1, block = 256, shared_mem = bytes, args = { out, bytes // 4 } }
    assert.equal(bytes // 4 - 1, out:cpu():item())
    S.assert_error_contains(function()
      k:launch { grid = 1, block = 256, shared_mem = 1 << 20, args = { out, 16 } }
    end, "kernel big_smem: shared_mem 1048576 bytes")
  end)

  it("names the kernel when a launch fails #nosan", function()
    local m = rtc.compile { source = 'extern "C" __global__ void __launch_bounds__(128) small_block(int *p) { p[threadIdx.x] = 1; }',
      name = "launch_err.cu" }
    local k = m:kernel("small_block")
    local out = mla.zeros({ 1024 }, "i32", "cuda")
    S.assert_error_contains(function() k:launch { grid = 1, block = 1024, args = { out } } end,
      "kernel small_block: block of 1024 threads exceeds its limit of 128")
    S.assert_error_contains(function() k:launch { grid = { 1, 70000 }, block = 32, args = { out } } end,
      "launch of kernel small_block")
    k:launch { grid = 1, block = 128, args = { out } } -- the kernel still works
    local got = out:cpu():totable()
    assert.same({ 1, 1, 0 }, { got[1], got[128], got[129] })
  end)

  it("a reloaded module's kernels run the new code", function()
    local dir = R.tmpdir()
    R.write(dir .. "/val.cuh", "#define VALUE 11\n")
    R.write(dir .. "/val.cu", '#include "val.cuh"\nextern "C" __global__ void put_value(int *p) { p[0] = VALUE; }\n')
    local m = rtc.compile { file = dir .. "/val.cu" }
    local k = m:kernel("put_value")
    local out = mla.zeros({ 1 }, "i32", "cuda")
    k:launch { grid = 1, block = 1, args = { out } }
    assert.equal(11, out:cpu():item())
    R.write(dir .. "/val.cuh", "#define VALUE 222\n")
    assert.equal(k, m:kernel("put_value")) -- auto reload on access, same kernel object
    k:launch { grid = 1, block = 1, args = { out } }
    assert.equal(222, out:cpu():item())
  end)
end)
