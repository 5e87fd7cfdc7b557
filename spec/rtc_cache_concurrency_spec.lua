-- The JIT kernel cache under concurrency (issue 9): processes compiling the
-- same kernel into one cache directory at once all succeed and leave exactly
-- one consistent entry and no temp files; a process killed mid-write leaves
-- nothing that is ever loaded, and the next process recompiles. Runs on CPU
-- (NVRTC needs no GPU), as fresh mlalab processes.
local mla = require "mlalab"
local R = require "rtc_support"
local core = mla.core

local SRC = [[
template <int N> __global__ void scale_rows(float *p, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] *= (float)N;
}
extern "C" __global__ void shared_kernel(float *p, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += 1.0f;
}
]]

local function new_case()
  local dir = R.tmpdir()
  local src = R.write(dir .. "/shared.cu", string.format("// case %d %d\n%s", os.time(), math.random(1, 1 << 30), SRC))
  return dir, dir .. "/cache", src
end

-- Starts n children at once (one shell, n background jobs); returns their parsed outputs.
local function run_together(n, dir, cache, src, extra_env)
  local lines = {}
  for i = 1, n do lines[i] = R.child_command(src, cache, dir .. "/out" .. i, extra_env) .. " &" end
  lines[#lines + 1] = "wait"
  local r = core.spawn { argv = { "/bin/sh", "-c", table.concat(lines, "\n") }, timeout = 300 }
  assert(r.exit_code == 0 and not r.timed_out, "the shell running the children failed: " .. r.stderr)
  local out = {}
  for i = 1, n do
    out[i] = R.parse_child(R.read(dir .. "/out" .. i))
    out[i].stderr = R.read(dir .. "/out" .. i .. ".err") or ""
  end
  return out
end

local function assert_one_valid_entry(cache, key)
  local entries, temps, other = R.cache_files(cache)
  assert.same({ key .. ".cubin" }, entries)
  assert.same({}, temps)
  assert.same({}, other)
  local state, why = core.rtc_entry_check(key, R.read(cache .. "/" .. key .. ".cubin"))
  assert.equal("hit", state, why)
end

teardown(R.cleanup)

describe("the kernel cache under concurrency", function()
  it("6 processes compiling one kernel at once all succeed with the same key and cubin, one entry, no temp files", function()
    local dir, cache, src = new_case()
    -- every writer pauses halfway through its temp file: the writes overlap there
    local out = run_together(6, dir, cache, src, { "MLALAB_RTC_TEST_WRITE=pause:300" })
    local compiled = 0
    for i, o in ipairs(out) do
      assert(o.state, "child " .. i .. " printed no result; stderr: " .. o.stderr)
      assert.is_true(o.state == "compiled" or o.state == "disk")
      if o.state == "compiled" then compiled = compiled + 1 end
      assert.same({ out[1].key, out[1].hash, 0 }, { o.key, o.hash, o.corrupt })
    end
    assert.is_true(compiled >= 2, "only " .. compiled .. " process compiled: nothing ran concurrently")
    assert_one_valid_entry(cache, out[1].key)
    local after = R.child_compile(src, cache)
    assert.same({ "disk", out[1].key, out[1].hash }, { after.state, after.key, after.hash })
  end)

  it("processes reading while others replace the entry see the old or the new one, whole", function()
    local dir, cache, src = new_case()
    local first = R.child_compile(src, cache)
    assert.equal("compiled", first.state)
    local lines = {}
    for i = 1, 4 do -- writers: recompile and overwrite the entry, pausing mid-write
      lines[#lines + 1] = R.child_command(src, cache, dir .. "/w" .. i, { "MLALAB_RTC_TEST_WRITE=pause:150",
        "MLALAB_KERNEL_CACHE_REFRESH=1" }) .. " &"
    end
    for i = 1, 6 do -- readers, staggered across the writers' renames
      lines[#lines + 1] = string.format("(sleep %.2f; %s) &", 0.15 * i, R.child_command(src, cache, dir .. "/r" .. i))
    end
    lines[#lines + 1] = "wait"
    local r = core.spawn { argv = { "/bin/sh", "-c", table.concat(lines, "\n") }, timeout = 300 }
    assert.equal(0, r.exit_code)
    for i = 1, 4 do
      local o = R.parse_child(R.read(dir .. "/w" .. i))
      assert.same({ "compiled", first.key, first.hash }, { o.state, o.key, o.hash })
    end
    for i = 1, 6 do
      local o = R.parse_child(R.read(dir .. "/r" .. i))
      assert.same({ "disk", first.key, first.hash, 0 }, { o.state, o.key, o.hash, o.corrupt })
    end
    assert_one_valid_entry(cache, first.key)
  end)

  it("a process killed halfway through writing leaves no entry; the next one recompiles and cleans up", function()
    local dir, cache, src = new_case()
    local killed = R.child_compile(src, cache, { env = { "MLALAB_RTC_TEST_WRITE=kill" } })
    assert.equal(9, killed.signal) -- SIGKILL, from inside the write
    assert.is_nil(killed.state)
    local entries, temps = R.cache_files(cache)
    assert.same({}, entries)
    assert.equal(1, #temps) -- the half-written temp file, under a name nothing loads
    local tmp = R.read(cache .. "/" .. temps[1])
    assert.is_true(#tmp > 0)
    local next_one = R.child_compile(src, cache)
    assert.same({ "compiled", 0 }, { next_one.state, next_one.corrupt })
    assert_one_valid_entry(cache, next_one.key) -- the dead writer's temp file is gone too
    assert.equal("disk", R.child_compile(src, cache).state)
  end)

  it("a half-written file left under the entry's own name is recompiled, never loaded", function()
    local dir, cache, src = new_case()
    local a = R.child_compile(src, cache)
    local path = cache .. "/" .. a.key .. ".cubin"
    local whole = R.read(path)
    R.write(path, whole:sub(1, #whole // 2)) -- what a non-atomic writer killed halfway would leave
    local b = R.child_compile(src, cache)
    assert.same({ "compiled", 1, a.hash }, { b.state, b.corrupt, b.hash })
    assert_one_valid_entry(cache, a.key)
  end)

  it("a temp file of a writer that is still alive is left alone", function()
    local dir, cache, src = new_case()
    assert(os.execute("mkdir -p " .. R.quote(cache)))
    -- pid 1 is always alive: a temp file carrying it must survive another process's write
    local mine = string.format(".%s.tmp.1.abcdef", ("0"):rep(32))
    R.write(cache .. "/" .. mine, "partial")
    local a = R.child_compile(src, cache)
    assert.equal("compiled", a.state)
    local _, temps = R.cache_files(cache)
    assert.same({ mine }, temps)
  end)
end)
