--- Run work in a child process with its own CUDA context.
-- One illegal address or trap poisons a whole CUDA context; a hanging kernel
-- blocks its process forever. mla.isolate runs a function in a fresh mlalab
-- process and classifies what happened, so a sweep over JIT variants still
-- being written loses one point, not the run:
--   OK       the function returned; `value` holds its results
--   ERROR    it raised a Lua error (message in `error`)
--   FAULT    a CUDA fault (illegal address, trap, ...): `kernel` and `cuda_error` name it
--   OOM      out of device memory
--   TIMEOUT  it ran past `timeout` seconds (also a kernel that never returns)
--   CRASH    the process died from a signal
-- The function and its arguments cross the boundary by value (bytecode,
-- plain data, tensors as bytes; modules by name), see mlalab.serialize.
local core = require "mlalab.core"
local ser = require "mlalab.serialize"

local isolate = {}

local function exe()
  local p = package.loaded["mlalab.paths"]
  return (p and p.exe) or error("isolate: cannot locate the mlalab executable")
end

--- Classifies a child's failure message.
function isolate.classify(msg)
  msg = msg or ""
  if msg:find("out of device memory", 1, true) or msg:find("cudaErrorMemoryAllocation", 1, true) then
    return "OOM"
  end
  local cuda_error = msg:match("CUDA error (cudaError%w+)")
  if cuda_error then
    local kernel = msg:match("last kernel launched: ([%w_:<>,%.]+)") or msg:match("kernel ([%w_:<>,%.]+):")
    return "FAULT", cuda_error, kernel
  end
  return "ERROR"
end

local function first_line(s) return (s or ""):match("^[^\n]*") end

local RUN_OPTIONS = { "timeout", "device", "env", "sync" }

--- isolate.run(fn, args, opts) -> result
-- opts: timeout (seconds, default 60), device (default: this process's),
-- env (extra NAME=value strings), sync (attribute faults to kernels by
-- synchronising after each launch, default true).
function isolate.run(fn, args, opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("isolate.run: opts must be a table, got a " .. type(opts), 2) end
  require("mlalab.options").check("isolate.run", opts, RUN_OPTIONS)
  assert(type(fn) == "function", "isolate.run: a function is required")
  local payload = ser.encode({ fn = fn, args = args or {}, device = opts.device or core.default_device() })
  local env = { "MLALAB_DEVICE=" .. (opts.device or core.default_device()) }
  if opts.sync ~= false then env[#env + 1] = "MLALAB_SYNC=1" end
  for _, e in ipairs(opts.env or {}) do env[#env + 1] = e end
  local r = core.spawn {
    argv = { exe(), "-e", "require('mlalab.isolate')._child()" },
    env = env, input = payload, timeout = opts.timeout or 60, result_fd = 3,
  }
  local res = { elapsed = r.elapsed, stdout = r.stdout, stderr = r.stderr, exit_code = r.exit_code }
  if r.timed_out then
    res.status, res.error = "TIMEOUT", string.format("no result within %.3g s (process killed)", opts.timeout or 60)
    return res
  end
  local ok, decoded = false, nil
  if r.result and #r.result > 0 then ok, decoded = pcall(ser.decode, r.result) end
  if ok and decoded then
    if decoded.ok then
      res.status, res.value = "OK", decoded.values
    else
      res.error = decoded.error
      res.status, res.cuda_error, res.kernel = isolate.classify(decoded.error)
      res.kernel = res.kernel or decoded.last_kernel
    end
    return res
  end
  if r.signal ~= 0 then
    res.status, res.error = "CRASH", "killed by signal " .. r.signal .. ": " .. first_line(r.stderr)
  else
    res.error = "no result (exit " .. r.exit_code .. "): " .. (r.stderr ~= "" and r.stderr or r.stdout)
    res.status, res.cuda_error, res.kernel = isolate.classify(res.error)
  end
  return res
end

--- isolate.map(fn, list_of_arg_tables, opts) -> list of results, one per entry.
function isolate.map(fn, list, opts)
  local out = {}
  for i, args in ipairs(list) do out[i] = isolate.run(fn, args, opts) end
  return out
end

--- The child's side: read the payload, run, write the result to fd 3.
function isolate._child()
  local out = assert(io.open("/dev/fd/3", "wb"))
  local function reply(t)
    local ok, s = pcall(ser.encode, t)
    if not ok then s = ser.encode({ ok = false, error = "isolate: result cannot cross the process boundary: " .. tostring(s) }) end
    out:write(s)
    out:flush()
  end
  local job = ser.decode(io.read("a"))
  local results = table.pack(xpcall(job.fn, debug.traceback, table.unpack(job.args, 1, job.args.n or #job.args)))
  if results[1] then
    -- make sure queued GPU work finished (and faulted) inside the child
    local sok, serr = pcall(core.synchronize)
    if not sok then
      reply({ ok = false, error = tostring(serr) })
    else
      reply({ ok = true, values = { table.unpack(results, 2, results.n) } })
    end
  else
    local last = ""
    pcall(function() last = core.last_kernel() end)
    reply({ ok = false, error = tostring(results[2]), last_kernel = last ~= "" and last or nil })
  end
  out:close()
end

return isolate
