--- `mlalab --check-kernels`: compile every JIT kernel file of kernels_rtc/
-- (not include/) for the configured architectures and print each kernel's
-- registers, spills and shared memory; false (exit status 1) on any error.
-- NVRTC needs no GPU, so CI runs this on CPU machines.
--
-- A file that includes the generated "mla_layout.h" is compiled once per
-- layout: every built-in of mlalab.layout, or the ones its header names.
-- The `/* mlalab-rtc ... */` block of a file (mla.rtc.file_meta) may say:
--   names = { "k<int>", ... }   name expressions to instantiate
--   layouts = { "bf16", ... }   layouts to check it with (default: all built-ins)
--   block_size = 64             tokens per page of the generated header (default 64)
--   archs = { "sm_90a" }        the architectures it supports (others are skipped)
--   skip = "why"                not compiled by the check
--
-- Arguments (after --check-kernels; none may start with '-'):
--   sm_90a,sm_80        architectures (default: core.rtc_config().archs)
--   kv_write.cu ...     only these files
--   layouts=a,b         only these layouts
--   jobs=N              worker processes (default: the CPU count, at most 8)
--   dir=PATH            check the kernel files of another directory
local core = require "mlalab.core"
local rtc = require "mlalab.rtc"

local M = {}

M.DEFAULT_BLOCK_SIZE = 64

local function split_list(s)
  local out = {}
  for item in tostring(s):gmatch("[^,%s]+") do out[#out + 1] = item end
  return out
end

local function read_text(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

--- Whether a kernel source needs the generated layout header.
function M.needs_layout(text, meta)
  if meta and meta.layouts then return true end
  return text:find('#%s*include%s*[<"]' .. rtc.LAYOUT_HEADER:gsub("%.", "%%.") .. '[>"]') ~= nil
end

--- Names of the layouts a check uses (all built-ins of mlalab.layout).
function M.builtin_layouts()
  local ok, layout = pcall(require, "mlalab.layout")
  if not ok then error("check-kernels: mlalab.layout does not load: " .. tostring(layout), 0) end
  return layout.builtins()
end

--- Kernel files: every *.cu under kernels_rtc/ outside include/, sorted.
function M.kernel_files(dir)
  dir = dir or rtc.kernels_dir()
  local out = {}
  for _, path in ipairs(core.rtc_list_files(dir, ".cu")) do
    local rel = path:sub(#dir + 2)
    if not rel:match("^include/") then out[#out + 1] = { path = path, rel = rel } end
  end
  return out
end

local function wanted(list, v)
  if not list then return true end
  for _, x in ipairs(list) do if x == v then return true end end
  return false
end

--- The jobs of a check: one per (file, arch[, layout]).
-- opts: archs (list), files (list of names relative to kernels_rtc/), layouts (list), dir.
-- Returns jobs, skipped ({rel, why}).
function M.plan(opts)
  opts = opts or {}
  local archs = opts.archs or split_list(core.rtc_config().archs)
  for i, a in ipairs(archs) do archs[i] = rtc.normalize_arch(a) end
  local jobs, skipped, seen = {}, {}, {}
  local all_layouts
  for _, f in ipairs(M.kernel_files(opts.dir)) do
    if wanted(opts.files, f.rel) or wanted(opts.files, "kernels_rtc/" .. f.rel) then
      seen[f.rel] = true
      local text = read_text(f.path)
      local meta = rtc.file_meta(text, "kernels_rtc/" .. f.rel)
      if meta.skip then
        skipped[#skipped + 1] = { rel = f.rel, why = meta.skip }
      else
        local layouts = { false }
        if M.needs_layout(text, meta) then
          all_layouts = all_layouts or M.builtin_layouts()
          layouts = {}
          for _, n in ipairs(meta.layouts or all_layouts) do
            if wanted(opts.layouts, n) then layouts[#layouts + 1] = n end
          end
        end
        local file_archs = meta.archs and {} or nil
        for _, a in ipairs(meta.archs or {}) do file_archs[#file_archs + 1] = rtc.normalize_arch(a) end
        for _, arch in ipairs(archs) do
          if wanted(file_archs, arch) then
            for _, lay in ipairs(layouts) do
              jobs[#jobs + 1] = { path = f.path, rel = f.rel, arch = arch, layout = lay or nil,
                block_size = lay and (meta.block_size or M.DEFAULT_BLOCK_SIZE) or nil }
            end
          else
            skipped[#skipped + 1] = { rel = f.rel, why = arch .. " is not among the file's archs" }
          end
        end
      end
    end
  end
  for _, f in ipairs(opts.files or {}) do
    if not seen[(f:gsub("^kernels_rtc/", ""))] then
      error("check-kernels: no kernel file " .. f .. " in " .. (opts.dir or rtc.kernels_dir()), 0)
    end
  end
  if opts.layouts then
    local known = {}
    for _, n in ipairs(M.builtin_layouts()) do known[n] = true end
    for _, n in ipairs(opts.layouts) do
      if not known[n] then
        error("check-kernels: no layout '" .. n .. "' (known: " .. table.concat(M.builtin_layouts(), ", ") .. ")", 0)
      end
    end
  end
  return jobs, skipped
end

--- Compiles one job; never raises. Returns {ok=, kernels={...}, state=, ms=, error=}.
function M.run_job(job)
  local r = { rel = job.rel, arch = job.arch, layout = job.layout }
  local ok, mod = pcall(function()
    local spec = { file = job.path, arch = job.arch }
    if job.layout then
      spec.layout = require("mlalab.layout").get(job.layout)
      spec.block_size = job.block_size
    end
    return rtc.compile(spec)
  end)
  if not ok then
    r.ok, r.error = false, tostring(mod)
    return r
  end
  r.ok, r.state, r.ms = true, mod.cache_state, mod.compile_ms
  r.kernels = {}
  local res = mod:resources()
  for _, k in ipairs(mod:kernels()) do
    local u = res[k.name] or {}
    r.kernels[#r.kernels + 1] = { name = k.name, registers = u.registers, spill_stores = u.spill_stores,
      spill_loads = u.spill_loads, shared_mem = u.shared_mem, stack = u.stack }
  end
  table.sort(r.kernels, function(a, b) return a.name < b.name end)
  return r
end

-- Parallel workers ---------------------------------------------------------------

local function shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function cpu_count()
  local p = io.popen("getconf _NPROCESSORS_ONLN 2>/dev/null")
  local n = p and tonumber(p:read("a"):match("%d+"))
  if p then p:close() end
  return n or 1
end

--- Entry of a worker process: jobs from MLALAB_CHECK_IN, results to MLALAB_CHECK_OUT.
function M._worker()
  local ser = require "mlalab.serialize"
  local jobs = ser.decode(read_text(os.getenv("MLALAB_CHECK_IN")))
  local out = {}
  for i, job in ipairs(jobs) do out[i] = M.run_job(job) end
  local f = assert(io.open(os.getenv("MLALAB_CHECK_OUT"), "wb"))
  f:write(ser.encode(out))
  f:close()
end

-- Runs jobs in `n` child processes (one shell, n background workers) sharing the disk cache.
local function run_parallel(jobs, n)
  local ser = require "mlalab.serialize"
  local exe = package.loaded["mlalab.paths"] and package.loaded["mlalab.paths"].exe
  if not exe then return nil end
  local base = os.tmpname()
  local shards, script = {}, {}
  for i = 1, n do shards[i] = {} end
  for i, job in ipairs(jobs) do local s = shards[(i - 1) % n + 1]; s[#s + 1] = job end
  for i = 1, n do
    local fin, fout = base .. ".in" .. i, base .. ".out" .. i
    local f = assert(io.open(fin, "wb"))
    f:write(ser.encode(shards[i]))
    f:close()
    script[#script + 1] = string.format("MLALAB_CHECK_IN=%s MLALAB_CHECK_OUT=%s %s -e %s >%s 2>&1 &", shell_quote(fin),
      shell_quote(fout), shell_quote(exe), shell_quote("require('mlalab.rtc_check')._worker()"),
      shell_quote(base .. ".log" .. i))
  end
  script[#script + 1] = "wait"
  local r = core.spawn { argv = { "/bin/sh", "-c", table.concat(script, "\n") } }
  local results = {}
  for i = 1, n do
    local fout, flog = base .. ".out" .. i, base .. ".log" .. i
    local fh = io.open(fout, "rb")
    local got = fh and fh:read("a")
    if fh then fh:close() end
    local ok, list = pcall(ser.decode, got or "")
    if not (ok and type(list) == "table") then
      local lh = io.open(flog, "rb")
      local log = lh and lh:read("a") or ""
      if lh then lh:close() end
      list = {}
      for k, job in ipairs(shards[i]) do
        list[k] = { rel = job.rel, arch = job.arch, layout = job.layout, ok = false,
          error = "worker process failed (exit " .. tostring(r.exit_code) .. "): " .. log }
      end
    end
    for k, res in ipairs(list) do results[#results + 1] = res; shards[i][k].result = res end
    os.remove(base .. ".in" .. i); os.remove(fout); os.remove(flog)
  end
  os.remove(base)
  -- back in plan order
  local ordered = {}
  for i, job in ipairs(jobs) do ordered[i] = job.result or { rel = job.rel, arch = job.arch, layout = job.layout,
    ok = false, error = "no result from its worker" } end
  return ordered
end

-- Report ------------------------------------------------------------------------------

local function fmt_row(cols, widths)
  local out = {}
  for i, c in ipairs(cols) do
    local s = tostring(c)
    out[i] = i <= 4 and s .. string.rep(" ", widths[i] - #s) or string.rep(" ", widths[i] - #s) .. s
  end
  return table.concat(out, "  ")
end

--- The table of results (a string) and the number of failed jobs.
function M.report(results)
  local head = { "file", "kernel", "arch", "layout", "regs", "spill st/ld", "smem", "stack", "ms" }
  local rows, errors = {}, {}
  for _, r in ipairs(results) do
    if r.ok then
      for _, k in ipairs(r.kernels) do
        rows[#rows + 1] = { r.rel, k.name, r.arch, r.layout or "-", k.registers or "?",
          string.format("%s/%s", k.spill_stores or "?", k.spill_loads or "?"), k.shared_mem or "?", k.stack or "?",
          r.state == "compiled" and string.format("%.0f", r.ms) or r.state }
      end
    else
      errors[#errors + 1] = r
      rows[#rows + 1] = { r.rel, "(error)", r.arch, r.layout or "-", "-", "-", "-", "-", "FAILED" }
    end
  end
  local widths = {}
  for i, h in ipairs(head) do widths[i] = #h end
  for _, row in ipairs(rows) do
    for i, c in ipairs(row) do widths[i] = math.max(widths[i], #tostring(c)) end
  end
  local out = { fmt_row(head, widths) }
  for _, row in ipairs(rows) do out[#out + 1] = fmt_row(row, widths) end
  for _, e in ipairs(errors) do
    out[#out + 1] = ""
    out[#out + 1] = string.format("error: %s [%s%s]:", e.rel, e.arch, e.layout and (", layout " .. e.layout) or "")
    out[#out + 1] = e.error
  end
  return table.concat(out, "\n") .. "\n", #errors
end

local function parse_args(...)
  local o = {}
  for _, a in ipairs { ... } do
    local k, v = a:match("^(%w+)=(.*)$")
    if k == "jobs" then
      o.jobs = math.tointeger(tonumber(v))
      if not o.jobs or o.jobs < 1 then error("check-kernels: jobs=N needs a positive integer, got " .. v, 0) end
    elseif k == "layouts" then o.layouts = split_list(v)
    elseif k == "archs" then o.archs = split_list(v)
    elseif k == "dir" then o.dir = v
    elseif k then error("check-kernels: unknown option '" .. a .. "' (known: jobs=, layouts=, archs=, dir=)", 0)
    elseif a:match("%.cu$") then o.files = o.files or {}; o.files[#o.files + 1] = a
    elseif a:match("^sm_") or a:match("^%d+[af]?$") then
      o.archs = o.archs or {}
      for _, x in ipairs(split_list(a)) do o.archs[#o.archs + 1] = x end
    else
      error("check-kernels: unexpected argument '" .. a .. "' (give architectures such as sm_90a, kernel files "
        .. "such as kv_write.cu, jobs=N or layouts=a,b)", 0)
    end
  end
  return o
end

--- The CLI: prints the table; true when every kernel compiled.
function M.run(...)
  local ok, o = pcall(parse_args, ...)
  if not ok then io.stderr:write("mlalab: ", tostring(o), "\n"); return false end
  local ok2, jobs, skipped = pcall(M.plan, o)
  if not ok2 then io.stderr:write("mlalab: ", tostring(jobs), "\n"); return false end
  if #jobs == 0 then
    io.stderr:write("mlalab: check-kernels: nothing to compile (no kernel file matches the arguments)\n")
    return false
  end
  local t0 = core.rtc_clock_ms()
  local n = math.min(o.jobs or math.min(cpu_count(), 8), #jobs)
  local results = n > 1 and run_parallel(jobs, n) or nil
  if not results then
    results = {}
    for i, job in ipairs(jobs) do results[i] = M.run_job(job) end
  end
  local text, nerr = M.report(results)
  io.write(text)
  for _, s in ipairs(skipped) do io.write(string.format("skipped: %s (%s)\n", s.rel, s.why)) end
  local nk = 0
  for _, r in ipairs(results) do nk = nk + (r.kernels and #r.kernels or 0) end
  io.write(string.format("%d compile%s (%d kernels) in %.1f s with %d process%s: %s\n", #jobs, #jobs == 1 and "" or "s",
    nk, (core.rtc_clock_ms() - t0) / 1000, math.max(n, 1), n > 1 and "es" or "",
    nerr == 0 and "all compiled" or (nerr .. " FAILED")))
  io.stdout:flush()
  return nerr == 0
end

return M
