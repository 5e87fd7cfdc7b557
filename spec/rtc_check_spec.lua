-- `mlalab --check-kernels` (lua/mlalab/rtc_check.lua): every kernel file for
-- every architecture (and every layout for layout-generic files), a table of
-- registers, spills and shared memory, a non-zero exit on any error. Runs
-- the binary as CI does; NVRTC needs no GPU.
local mla = require "mlalab"
local S = require "support"
local R = require "rtc_support"
local core = mla.core
local check = require "mlalab.rtc_check"

teardown(R.cleanup)

local function run(args, cache)
  local argv = { R.BIN, "--check-kernels" }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  return core.spawn { argv = argv, env = { "MLALAB_KERNEL_CACHE=" .. (cache or R.tmpdir()), "MLALAB_DEVICE=cpu" }, timeout = 600 }
end

-- A kernel directory of our own: a plain kernel, a layout-generic one, one
-- limited to an architecture, one skipped, and headers that are not kernels.
local function kernel_dir(extra)
  local d = R.tmpdir()
  assert(os.execute("mkdir -p " .. R.quote(d .. "/include/x") .. " " .. R.quote(d .. "/sub")))
  R.write(d .. "/plain.cu", 'extern "C" __global__ void plain(int *p) { __shared__ int s[64]; s[threadIdx.x] = 1; p[0] = s[0]; }\n')
  R.write(d .. "/sub/generic.cu", '#include "mla_layout.h"\nextern "C" __global__ void generic(long long *p) { p[0] = MLA_LAYOUT_PAGE_BYTES; }\n')
  R.write(d .. "/only90.cu", '/* mlalab-rtc\n  archs = { "sm_90a" },\n  names = { "t<2>" },\n*/\n'
    .. 'template <int N> __global__ void t(int *p) { p[0] = N; }\n')
  R.write(d .. "/skipped.cu", '/* mlalab-rtc\n  skip = "work in progress",\n*/\nthis does not compile\n')
  R.write(d .. "/include/x/not_a_kernel.cu", "this is not compiled either\n")
  for name, text in pairs(extra or {}) do R.write(d .. "/" .. name, text) end
  return d
end

describe("mlalab --check-kernels", function()
  it("plans one compile per file and architecture, and per layout where the file includes mla_layout.h", function()
    local d = kernel_dir()
    local jobs, skipped = check.plan { dir = d, archs = { "sm_80", "sm_90a" }, layouts = { "bf16", "fp8_v4" } }
    local got = {}
    for _, j in ipairs(jobs) do got[#got + 1] = string.format("%s %s %s", j.rel, j.arch, j.layout or "-") end
    assert.same({
      "only90.cu sm_90a -", "plain.cu sm_80 -", "plain.cu sm_90a -",
      "sub/generic.cu sm_80 bf16", "sub/generic.cu sm_80 fp8_v4", "sub/generic.cu sm_90a bf16", "sub/generic.cu sm_90a fp8_v4",
    }, got)
    local why = {}
    for _, s in ipairs(skipped) do why[#why + 1] = s.rel .. ": " .. s.why end
    assert.same({ "only90.cu: sm_80 is not among the file's archs", "skipped.cu: work in progress" }, why)
  end)

  it("covers every built-in layout and the configured architectures by default", function()
    local jobs = check.plan { files = { "kv_write.cu" } }
    local archs = {}
    for a in core.rtc_config().archs:gmatch("[^,]+") do archs[#archs + 1] = a end
    assert.equal(#archs * #mla.layout.builtins(), #jobs)
  end)

  it("prints registers, spills and shared memory per kernel and exits 0 when everything compiles", function()
    local d = kernel_dir()
    local r = run { "dir=" .. d, "sm_90a", "layouts=bf16,indexer_fp8", "jobs=2" }
    assert.equal(0, r.exit_code, r.stderr .. r.stdout)
    local lines = {}
    for line in r.stdout:gmatch("[^\n]+") do lines[#lines + 1] = line end
    assert.truthy(lines[1]:match("^file%s+kernel%s+arch%s+layout%s+regs%s+spill st/ld%s+smem%s+stack%s+ms$"))
    local plain = r.stdout:match("\nplain%.cu%s+plain%s+sm_90a%s+%-%s+(%d+)%s+0/0%s+256%s+0")
    assert.is_true(tonumber(plain) > 0, "no row for plain.cu:\n" .. r.stdout)
    assert.truthy(r.stdout:find("\nonly90%.cu%s+t<2>%s+sm_90a%s+%-%s+%d+"))
    assert.truthy(r.stdout:find("\nsub/generic%.cu%s+generic%s+sm_90a%s+bf16%s+%d+"))
    assert.truthy(r.stdout:find("\nsub/generic%.cu%s+generic%s+sm_90a%s+indexer_fp8%s+%d+"))
    assert.truthy(r.stdout:find("skipped: skipped.cu (work in progress)", 1, true))
    assert.truthy(r.stdout:find("4 compiles (4 kernels)", 1, true))
    assert.truthy(r.stdout:find("all compiled", 1, true))
  end)

  it("exits non-zero and shows the compile error with its file and line when a kernel does not compile", function()
    local d = kernel_dir { ["broken.cu"] = 'extern "C" __global__ void broken(int *p) {\n  p[0] = no_such_name;\n}\n' }
    local r = run { "dir=" .. d, "sm_90a", "layouts=bf16" }
    assert.equal(1, r.exit_code)
    assert.truthy(r.stdout:find("\nbroken%.cu%s+%(error%)%s+sm_90a%s+%-.-FAILED"))
    assert.truthy(r.stdout:find("error: broken.cu [sm_90a]:", 1, true))
    assert.truthy(r.stdout:find("broken.cu(2): error: identifier \"no_such_name\" is undefined", 1, true))
    assert.truthy(r.stdout:find("p[0] = no_such_name;", 1, true))
    assert.truthy(r.stdout:find("1 FAILED", 1, true))
    assert.truthy(r.stdout:find("\nplain%.cu%s+plain%s+sm_90a")) -- the others are still checked
  end)

  it("rejects unknown arguments, files and layouts", function()
    for _, c in ipairs {
      { { "bogus" }, "unexpected argument 'bogus'" },
      { { "nope.cu" }, "no kernel file nope.cu" },
      { { "layouts=nope" }, "no layout 'nope'" },
      { { "jobs=0" }, "jobs=N needs a positive integer" },
      { { "sm_91" }, "cannot build sm_91 cubins" },
    } do
      local r = run(c[1])
      assert.equal(1, r.exit_code)
      assert.truthy(r.stderr:find(c[2], 1, true), r.stderr)
    end
  end)

  it("reads resources from the ptxas report of each compile", function()
    local d = kernel_dir()
    local jobs = check.plan { dir = d, archs = { "sm_90a" }, files = { "plain.cu" } }
    assert.equal(1, #jobs)
    local res = check.run_job(jobs[1])
    assert.is_true(res.ok, res.error)
    assert.equal(1, #res.kernels)
    local k = res.kernels[1]
    assert.same({ "plain", 256, 0, 0 }, { k.name, k.shared_mem, k.spill_stores, k.spill_loads })
    assert.is_true(k.registers > 0)
    local text, nerr = check.report { res }
    assert.equal(0, nerr)
    assert.truthy(text:find("plain.cu", 1, true))
  end)
end)
