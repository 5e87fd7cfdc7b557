-- The mlalab binary as users run it: behaves like lua.c for scripts, options,
-- LUA_INIT, errors and exit codes, plus its own --device/--info/--version.
-- Every case runs the very binary that runs the specs, as a child process.
local mla = require "mlalab"
local S = require "support"

local core = mla.core
local BIN = S.BIN

local tmpdir
local function tmp(name, text)
  if not tmpdir then
    tmpdir = os.tmpname()
    os.remove(tmpdir)
    assert(os.execute("mkdir -p '" .. tmpdir .. "'"))
  end
  local p = tmpdir .. "/" .. name
  local f = assert(io.open(p, "w"))
  f:write(text)
  f:close()
  return p
end

--- Runs the binary with args; returns the spawn result {exit_code, stdout, stderr, ...}.
local function run(args, opts)
  opts = opts or {}
  local argv = { BIN }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  return core.spawn { argv = argv, env = opts.env, input = opts.input or "", timeout = opts.timeout or 60 }
end

local function assert_ok(r, what)
  assert(r.exit_code == 0, string.format("%s: exit %d, stderr: %s", what or "run", r.exit_code, r.stderr))
end

describe("mlalab runs scripts like lua", function()
  it("passes script arguments as arg[1..n] and as ..., with arg[0] the script and arg[-1] the binary", function()
    local script = tmp("args.lua", "print(select('#', ...), ...)\nprint(arg[0], arg[1], arg[2], arg[3], #arg)\nprint(arg[-1])\n")
    local r = run { script, "alpha", "two words", "" }
    assert_ok(r)
    local lines = {}
    for l in r.stdout:gmatch("[^\n]*\n") do lines[#lines + 1] = l:sub(1, -2) end
    assert.equal("3\talpha\ttwo words\t", lines[1])
    assert.equal(script .. "\talpha\ttwo words\t\t3", lines[2])
    assert.equal(BIN, lines[3])
  end)

  it("skips a #! first line", function()
    local r = run { tmp("shebang.lua", "#!/usr/bin/env mlalab\nprint('after the shebang')\n") }
    assert_ok(r)
    assert.equal("after the shebang\n", r.stdout)
  end)

  it("-e runs each chunk in order, before the script", function()
    local script = tmp("uses_x.lua", "print('script sees', x)\n")
    local r = run { "-e", "x = 41", "-e", "x = x + 1; print('e', x)", script }
    assert_ok(r)
    assert.equal("e\t42\nscript sees\t42\n", r.stdout)
  end)

  it("-l mod and -l g=mod require modules into globals", function()
    local dir = tmp("mymod.lua", "return { answer = 42 }\n"):match("^(.*)/")
    local r = run({ "-l", "mymod", "-l", "m=mlalab", "-e", "print(mymod.answer, m.version == require('mlalab').version)" },
      { env = { "LUA_PATH=" .. dir .. "/?.lua;;" } })
    assert_ok(r)
    assert.equal("42\ttrue\n", r.stdout)
  end)

  it("-v and --version print the version of mlalab and Lua", function()
    for _, flag in ipairs { "-v", "--version" } do
      local r = run { flag }
      assert_ok(r, flag)
      local want = "mlalab " .. mla.version .. " (Lua 5.4."
      assert.equal(want, r.stdout:sub(1, #want))
    end
  end)

  it("- runs stdin as the script, with the arguments after it", function()
    local r = run({ "-", "a", "b" }, { input = "print('stdin got', ...)\n" })
    assert_ok(r)
    assert.equal("stdin got\ta\tb\n", r.stdout)
  end)

  it("with no script and stdin not a terminal, runs stdin", function()
    local r = run({}, { input = "print(6 * 7)\n" })
    assert_ok(r)
    assert.equal("42\n", r.stdout)
  end)

  it("-- ends the options: a script named like an option runs", function()
    local script = tmp("-e", "print('a file called -e', ...)\n")
    local here = script:match("^(.*)/")
    local r = core.spawn { argv = { "/bin/sh", "-c", "cd '" .. here .. "' && exec '" .. BIN .. "' -- -e x" }, timeout = 60 }
    assert_ok(r)
    assert.equal("a file called -e\tx\n", r.stdout)
  end)

  it("mlalab -e 'print(require(\"mlalab\").version)' prints the version", function()
    local r = run { "-e", "print(require('mlalab').version)" }
    assert_ok(r)
    assert.equal(mla.version .. "\n", r.stdout)
  end)
end)

describe("LUA_INIT", function()
  it("runs LUA_INIT as a chunk before -e", function()
    local r = run({ "-e", "print('main', seen)" }, { env = { "LUA_INIT=seen = 'yes'; print('init')" } })
    assert_ok(r)
    assert.equal("init\nmain\tyes\n", r.stdout)
  end)

  it("LUA_INIT=@file runs the file", function()
    local f = tmp("init.lua", "print('init file')\n")
    local r = run({ "-e", "print('main')" }, { env = { "LUA_INIT=@" .. f } })
    assert_ok(r)
    assert.equal("init file\nmain\n", r.stdout)
  end)

  it("LUA_INIT_5_4 wins over LUA_INIT, and -E ignores both", function()
    local env = { "LUA_INIT=print('plain')", "LUA_INIT_5_4=print('versioned')" }
    local r = run({ "-e", "print('main')" }, { env = env })
    assert_ok(r)
    assert.equal("versioned\nmain\n", r.stdout)
    r = run({ "-E", "-e", "print('main')" }, { env = env })
    assert_ok(r)
    assert.equal("main\n", r.stdout)
  end)

  it("an error in LUA_INIT stops with exit 1", function()
    local r = run({ "-e", "print('never')" }, { env = { "LUA_INIT=error('init failed')" } })
    assert.equal(1, r.exit_code)
    assert.truthy(r.stderr:find("init failed", 1, true), r.stderr)
    assert.equal("", r.stdout)
  end)
end)

describe("errors and exit codes", function()
  it("an error prints the message and a traceback on stderr and exits 1", function()
    local script = tmp("fails.lua", "local function inner() error('boom at depth') end\nlocal function outer() inner() end\nouter()\n")
    local r = run { script }
    assert.equal(1, r.exit_code)
    assert.truthy(r.stderr:find("fails.lua:1: boom at depth", 1, true), r.stderr)
    assert.truthy(r.stderr:find("stack traceback:", 1, true), r.stderr)
    assert.truthy(r.stderr:find("in local 'inner'", 1, true) or r.stderr:find("in upvalue 'inner'", 1, true), r.stderr)
  end)

  it("an error object with __tostring is shown through it; other objects are named", function()
    local r = run { "-e", "error(setmetatable({}, {__tostring = function() return 'custom object' end}))" }
    assert.equal(1, r.exit_code)
    assert.truthy(r.stderr:find("custom object", 1, true), r.stderr)
    r = run { "-e", "error({})" }
    assert.equal(1, r.exit_code)
    assert.truthy(r.stderr:find("(error object is a table value)", 1, true), r.stderr)
  end)

  it("a syntax error exits 1 naming the file and line", function()
    local r = run { tmp("syntax.lua", "print('x'\n") }
    assert.equal(1, r.exit_code)
    assert.truthy(r.stderr:find("syntax.lua:", 1, true), r.stderr)
  end)

  it("a missing script exits 1", function()
    local r = run { tmpdir .. "/does_not_exist.lua" }
    assert.equal(1, r.exit_code)
    assert.truthy(r.stderr:find("cannot open", 1, true), r.stderr)
  end)

  it("os.exit sets the exit code", function()
    for code, expr in pairs { [0] = "true", [1] = "false", [3] = "3", [200] = "200" } do
      local r = run { "-e", "os.exit(" .. expr .. ")" }
      assert.equal(code, r.exit_code, "os.exit(" .. expr .. ")")
    end
  end)

  it("an unknown option prints the usage and exits 1", function()
    local r = run { "--bogus" }
    assert.equal(1, r.exit_code)
    assert.truthy(r.stderr:find("unrecognized option '--bogus'", 1, true), r.stderr)
    assert.truthy(r.stderr:find("usage:", 1, true), r.stderr)
    r = run { "-e" }
    assert.equal(1, r.exit_code)
    assert.truthy(r.stderr:find("usage:", 1, true), r.stderr)
  end)
end)

describe("mlalab's own options", function()
  it("--device cpu makes cpu the default device", function()
    local r = run { "--device", "cpu", "-e", "local mla = require 'mlalab'; print(mla.device(), mla.zeros({2}).device)" }
    assert_ok(r)
    assert.equal("cpu\tcpu\n", r.stdout)
    r = run { "--device=cpu", "-e", "print(require('mlalab').device())" }
    assert_ok(r)
    assert.equal("cpu\n", r.stdout)
  end)

  it("a bad --device is an error naming it", function()
    local r = run { "--device", "tpu", "-e", "print(require('mlalab').zeros({1}).device)" }
    assert.is_true(r.exit_code ~= 0)
    assert.truthy(r.stderr:find("invalid device 'tpu'", 1, true), r.stderr)
    r = run { "--device", "cuda:7", "-e", "print(require('mlalab').zeros({1}).device)" }
    assert.is_true(r.exit_code ~= 0)
    assert.truthy(r.stderr:find("cuda:7", 1, true), r.stderr)
  end)

  it("--device without a value is a usage error", function()
    local r = run { "--device" }
    assert.equal(1, r.exit_code)
    assert.truthy(r.stderr:find("usage:", 1, true), r.stderr)
  end)

  it("--info prints the Lua, CUDA and NVRTC versions and the devices", function()
    local r = run { "--info" }
    assert_ok(r)
    assert.truthy(r.stdout:find("Lua: Lua 5.4", 1, true), r.stdout)
    assert.truthy(r.stdout:find("CUDA runtime: %d+%.%d"), r.stdout)
    assert.truthy(r.stdout:find("NVRTC: %d+%.%d"), r.stdout)
    assert.truthy(r.stdout:find("devices: none", 1, true) or r.stdout:find("cuda:0 ", 1, true), r.stdout)
  end)

  it("--info lists every device with its bandwidth #gpu", function()
    local r = run { "--info" }
    assert_ok(r)
    local p = mla.device_props(0)
    assert.truthy(r.stdout:find("cuda:0  " .. p.name, 1, true), r.stdout)
    assert.truthy(r.stdout:find("peak DRAM %d+ GB/s"), r.stdout)
  end)
end)

describe("Ctrl-C", function()
  -- A shell starts the child, waits until it has printed `marker` (so the
  -- Lua loop is running), sends SIGINT, and reports the exit status.
  local function interrupt(code, marker)
    local out, err = tmp("int.out", ""), tmp("int.err", "")
    local sh = string.format([[
'%s' -e %q >'%s' 2>'%s' & pid=$!
i=0
while ! grep -q '%s' '%s' && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
sleep 0.1
kill -INT $pid
wait $pid
echo "status=$?"
cat '%s'
cat '%s' >&2]], BIN, code, out, err, marker, out, out, err)
    return core.spawn { argv = { "/bin/sh", "-c", sh }, timeout = 60 }
  end

  it("interrupts a running loop with an 'interrupted' error and a non-zero exit", function()
    local r = interrupt("io.stdout:write('started\\n'); io.stdout:flush(); while true do end", "started")
    assert.truthy(r.stdout:find("started", 1, true), r.stdout)
    assert.truthy(r.stdout:find("status=1", 1, true), r.stdout .. r.stderr)
    assert.truthy(r.stderr:find("interrupted", 1, true), r.stderr)
    assert.truthy(r.stderr:find("stack traceback:", 1, true), r.stderr)
  end)

  it("can be caught by pcall and the script goes on", function()
    local code = "local ok, e = pcall(function() io.stdout:write('looping\\n'); io.stdout:flush(); while true do end end); " ..
      "print('caught', e:match('interrupted') ~= nil); print(require('mlalab').zeros({2}, 'f32', 'cpu'):numel())"
    local r = interrupt(code, "looping")
    assert.truthy(r.stdout:find("caught\ttrue\n2\n", 1, true), r.stdout .. r.stderr)
    assert.truthy(r.stdout:find("status=0", 1, true), r.stdout)
  end)

  it("leaves the GPU usable after interrupting queued work #gpu", function()
    local code = "local mla = require 'mlalab'; local a = mla.randn({4096, 4096}, {device='cuda'}); " ..
      "local ok, e = pcall(function() io.stdout:write('looping\\n'); io.stdout:flush(); while true do a:copy(a:transpose(0, 1)) end end); " ..
      "local b = mla.arange(10, 'f32', 'cuda'); print('after', b:cpu():get({9}))"
    local r = interrupt(code, "looping")
    assert.truthy(r.stdout:find("after\t9", 1, true), r.stdout .. r.stderr)
    assert.truthy(r.stdout:find("status=0", 1, true), r.stdout)
  end)
end)
