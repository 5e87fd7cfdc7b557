--- mla.rtc: JIT kernels from kernels_rtc/ (or strings) with NVRTC.
--
--   local L = mla.layout.get("fp8_ds_mla")
--   local mod = mla.rtc.compile{ file = "kv_gather.cu", layout = L, block_size = 64 }
--   local k = mod:kernel("kv_gather<long long>")  -- a name expression (new ones are instantiated on demand)
--   k:launch{ grid = 132, block = 128,
--             args = { mla.rtc.cache_view(pages, L, { block_size = 64 }), slots, n, out, out:stride(0), 576, 0 } }
--
-- Every compile yields a cubin for one real architecture (the current
-- device's, or `arch = "sm_90a"`): compiling needs no GPU. Results are cached
-- by content: an in-process memo, then a disk cache (MLALAB_KERNEL_CACHE, a
-- directory; "memory" keeps it in the process). Compile errors are error
-- objects whose message points at kernels_rtc/<file>(line). Launch arguments
-- are checked against the kernel's parameter list (errors name the parameter;
-- mod:check_args does the same without a GPU). Modules notice edited sources:
-- mod:kernel() recompiles when a file changed, mod:reload() forces the check.
local core = require "mlalab.core"
local diag = require "mlalab.rtc_diag"
local layouts = require "mlalab.rtc_layout"

local rtc = {}
rtc.CompileError = diag.CompileError
rtc.is_compile_error = diag.is_compile_error
rtc.layout_header = layouts.header
rtc.builtins_header = layouts.builtins_header
rtc.cache_view = layouts.cache_view
rtc.LAYOUT_HEADER = layouts.HEADER_NAME
--- mod:kernel() checks the module's files and recompiles when one changed.
rtc.auto_reload = true

-- Paths and configuration -----------------------------------------------------

local function env(name)
  local v = os.getenv(name)
  return v ~= nil and v ~= "" and v or nil
end

local function exists(path) return core.rtc_stat(path) ~= nil end

--- Directory of the JIT kernels (kernels_rtc/ next to lua/).
function rtc.kernels_dir()
  local p = package.loaded["mlalab.paths"]
  if p and p.kernels_rtc then return p.kernels_rtc end
  local src = debug.getinfo(1, "S").source:match("^@(.*)/lua/mlalab/rtc%.lua$")
  return src and (src .. "/kernels_rtc") or "kernels_rtc"
end

local cuda_dirs
--- CUDA's include directories ({include, include/cccl}), handed to NVRTC and
-- never hashed file by file (the NVRTC build in the key pins them).
function rtc.cuda_include_dirs()
  if cuda_dirs then return cuda_dirs end
  local cfg = core.rtc_config()
  local cands = { env "MLALAB_CUDA_INCLUDE", cfg.cuda_include and cfg.cuda_include:match("^[^;]+"),
    env "CUDA_HOME" and env "CUDA_HOME" .. "/include", env "CUDA_PATH" and env "CUDA_PATH" .. "/include",
    "/usr/local/cuda/include" }
  for i = 1, 5 do
    local d = cands[i]
    if d and exists(d .. "/cuda_fp16.h") then
      cuda_dirs = { d }
      if exists(d .. "/cccl/cuda/std/cstdint") then cuda_dirs[2] = d .. "/cccl" end
      return cuda_dirs
    end
  end
  error("rtc: cannot find CUDA's include directory (no cuda_fp16.h); set MLALAB_CUDA_INCLUDE", 2)
end

local config = {}
local function default_cache_dir()
  local v = env "MLALAB_KERNEL_CACHE"
  if v == "memory" or v == "off" or v == "none" then return nil end
  if v then return v end
  local base = env "XDG_CACHE_HOME" or (env "HOME" and env "HOME" .. "/.cache")
  return base and (base .. "/mlalab/kernels") or nil
end
config.dir = default_cache_dir()
config.save_source = env "MLALAB_KERNEL_CACHE_SAVE_SOURCE" ~= nil and env "MLALAB_KERNEL_CACHE_SAVE_SOURCE" ~= "0"
config.salt = env "MLALAB_KERNEL_CACHE_SALT" or ""
config.verbose = env "MLALAB_RTC_VERBOSE" ~= nil and env "MLALAB_RTC_VERBOSE" ~= "0"
-- refresh: compile every program again and overwrite its entry (never read the cache)
config.refresh = env "MLALAB_KERNEL_CACHE_REFRESH" ~= nil and env "MLALAB_KERNEL_CACHE_REFRESH" ~= "0"

--- The disk cache directory, or nil in memory-only mode.
function rtc.cache_dir() return config.dir end

--- rtc.set_cache{dir=path | memory_only=true, save_source=bool, salt=str, verbose=bool, refresh=bool}
-- (refresh: recompile every program and overwrite its entry; MLALAB_KERNEL_CACHE_REFRESH=1)
function rtc.set_cache(o)
  assert(type(o) == "table", "set_cache: an options table is expected")
  if o.memory_only then config.dir = nil
  elseif o.dir ~= nil then
    if type(o.dir) ~= "string" or o.dir == "" then error("set_cache: dir must be a path", 2) end
    config.dir = o.dir
  end
  if o.save_source ~= nil then config.save_source = not not o.save_source end
  if o.salt ~= nil then config.salt = tostring(o.salt) end
  if o.verbose ~= nil then config.verbose = not not o.verbose end
  if o.refresh ~= nil then config.refresh = not not o.refresh end
end

-- Statistics and the in-process memo -------------------------------------------

local stats
--- Counters since start (or reset_stats): memo_hits, disk_hits, compiles,
-- corrupt (entries found damaged and recompiled), failures, write_errors,
-- and compile_ms / read_ms / prepare_ms totals.
function rtc.stats()
  local c = {}
  for k, v in pairs(stats) do c[k] = v end
  return c
end
--- rtc.reset_stats(): zeroes the counters rtc.stats() reports.
function rtc.reset_stats()
  stats = { memo_hits = 0, disk_hits = 0, compiles = 0, corrupt = 0, failures = 0, write_errors = 0, compile_ms = 0,
    read_ms = 0, prepare_ms = 0 }
end
rtc.reset_stats()

local MEMO_MAX = 256
local memo, memo_order = {}, {}
local function memo_put(key, rec)
  if not memo[key] then
    memo_order[#memo_order + 1] = key
    if #memo_order > MEMO_MAX then memo[table.remove(memo_order, 1)] = nil end
  end
  memo[key] = rec
end
--- Forgets compiled programs held in this process (the disk cache stays).
function rtc.clear_memo() memo, memo_order = {}, {} end

-- Architectures -------------------------------------------------------------------

local supported
--- Real architectures NVRTC can emit (75, 80, ...).
function rtc.supported_archs()
  supported = supported or core.rtc_supported_archs()
  return supported
end

--- "sm_90a", "90a", "sm_80" -> canonical "sm_XX[a|f]"; errors name what NVRTC supports.
function rtc.normalize_arch(a)
  local s = tostring(a)
  local num, suf = s:match("^sm_(%d+)([af]?)$")
  if not num then num, suf = s:match("^(%d+)([af]?)$") end
  if not num then
    if s:match("^compute_") then
      error("rtc: arch '" .. s .. "' is a PTX target; mlalab always builds a cubin, give sm_XX (e.g. sm_90a)", 3)
    end
    error("rtc: arch '" .. s .. "' is not of the form sm_XX, sm_XXa or sm_XXXf", 3)
  end
  local n = tonumber(num)
  local ok = false
  for _, v in ipairs(rtc.supported_archs()) do ok = ok or v == n end
  if not ok then
    local maj, min = core.rtc_version()
    error(string.format("rtc: NVRTC %d.%d cannot build sm_%d cubins (supported: %s)", maj, min, n,
      table.concat(rtc.supported_archs(), " ")), 3)
  end
  if suf == "a" and n < 90 then error("rtc: arch-specific targets (sm_XXa) start at sm_90a, got " .. s, 3) end
  if suf == "f" and n < 100 then error("rtc: family targets (sm_XXXf) start at sm_100f, got " .. s, 3) end
  return "sm_" .. n .. suf
end

--- Target of the current device: sm_XYa from compute capability X.Y >= 9.0
-- (arch-specific features such as wgmma; the cubin is only for that device
-- anyway), sm_XY below. Without a GPU: MLALAB_RTC_ARCH, else an error.
function rtc.default_arch(device)
  if core.device_count() == 0 then
    local a = env "MLALAB_RTC_ARCH"
    if a then return rtc.normalize_arch(a) end
    error("rtc: no GPU to take the architecture from (" .. core.device_status() .. "); pass arch = 'sm_90a' " ..
      "(NVRTC compiles without a GPU) or set MLALAB_RTC_ARCH", 3)
  end
  local d = device or core.default_device()
  local idx = tonumber(tostring(d):match("^cuda:(%d+)$")) or 0
  local p = core.device_props(idx)
  local cc = p.major * 10 + p.minor
  return rtc.normalize_arch("sm_" .. cc .. (cc >= 90 and "a" or ""))
end

--- rtc.nvrtc_version() -> major, minor of the NVRTC library in use.
function rtc.nvrtc_version() return core.rtc_version() end

-- File headers -----------------------------------------------------------------------

local META_KEYS = { names = "table", layouts = "table", block_size = "number", defines = "table", options = "table",
  archs = "table", skip = "string" }

--- The `/* mlalab-rtc ... */` block of a kernel file: Lua table fields that
-- say how the file is compiled (names, defines, options, layouts, ...).
function rtc.file_meta(text, where)
  local body = text:match("/%*%s*mlalab%-rtc%s(.-)%*/")
  if not body then return {} end
  local fn, err = load("return {" .. body .. "\n}", "=" .. (where or "kernel") .. " (mlalab-rtc header)", "t", {})
  if not fn then error("rtc: " .. err, 0) end
  local ok, meta = pcall(fn)
  if not ok then error("rtc: " .. tostring(meta), 0) end
  for k, v in pairs(meta) do
    local want = META_KEYS[k]
    if not want then
      local known = {}
      for name in pairs(META_KEYS) do known[#known + 1] = name end
      table.sort(known)
      error(string.format("rtc: %s: unknown key '%s' in the mlalab-rtc header (known: %s)", where or "kernel",
        tostring(k), table.concat(known, ", ")), 0)
    end
    if type(v) ~= want then
      error(string.format("rtc: %s: '%s' in the mlalab-rtc header must be a %s", where or "kernel", k, want), 0)
    end
  end
  return meta
end

-- Compile specs ------------------------------------------------------------------------

local function read_text(path)
  local f, err = io.open(path, "rb")
  if not f then error("rtc: " .. err, 3) end
  local s = f:read("a")
  f:close()
  return s
end

local function dir_of(path) return path:match("^(.*)/[^/]*$") or "." end

local function resolve_file(file)
  local kd = rtc.kernels_dir()
  if file:sub(1, 1) == "/" then
    local rel = file:sub(1, #kd + 1) == kd .. "/" and file:sub(#kd + 2)
    if not exists(file) then error("rtc: no such kernel file: " .. file, 4) end
    return file, rel and ("kernels_rtc/" .. rel) or file
  end
  local rel = file:gsub("^kernels_rtc/", "")
  if exists(kd .. "/" .. rel) then return kd .. "/" .. rel, "kernels_rtc/" .. rel end
  if exists(file) then return file, file end
  error(string.format("rtc: no kernel file '%s' in %s or the current directory", file, kd), 4)
end

local function define_option(name, v)
  if type(name) ~= "string" or not name:match("^[%a_][%w_]*$") then
    error("rtc: define names must be identifiers, got " .. tostring(name), 4)
  end
  if v == true then return "-D" .. name end
  if math.type(v) == "integer" then return string.format("-D%s=%d", name, v) end
  if type(v) == "number" then return string.format("-D%s=%.17g", name, v) end
  if type(v) == "string" then return "-D" .. name .. "=" .. v end
  error("rtc: define " .. name .. " must be true, a number or a string", 4)
end

local function append_unique(list, seen, v)
  if not seen[v] then seen[v] = true; list[#list + 1] = v end
end

local SPEC_KEYS = { "file", "source", "name", "names", "defines", "include_dirs", "options", "std", "arch", "lineinfo",
  "layout", "block_size", "headers", "cache" }

-- Turns a user spec into everything a compile needs (except the names).
local function resolve(spec)
  require("mlalab.options").check("rtc.compile", spec, SPEC_KEYS, 3)
  local s = { headers = {} }
  local text
  if spec.file ~= nil then
    if spec.source ~= nil then error("rtc.compile: give file or source, not both", 3) end
    if type(spec.file) ~= "string" then error("rtc.compile: file must be a path", 3) end
    s.path, s.program = resolve_file(spec.file)
    s.dir = dir_of(s.path)
    text = read_text(s.path)
  elseif type(spec.source) == "string" then
    s.source, text = spec.source, spec.source
    s.program = spec.name or "string.cu"
    if type(s.program) ~= "string" then error("rtc.compile: name must be a string", 3) end
  else
    error("rtc.compile: file (a path under kernels_rtc/) or source (a string) is required", 3)
  end
  s.meta = rtc.file_meta(text, s.program)
  s.arch = spec.arch and rtc.normalize_arch(spec.arch) or rtc.default_arch()
  s.cache = spec.cache
  if s.cache ~= nil and s.cache ~= true and s.cache ~= false and s.cache ~= "memory" then
    error("rtc.compile: cache must be true, false or 'memory'", 3)
  end
  -- names: the file's, then the spec's
  s.names = {}
  local seen = {}
  for _, src in ipairs { s.meta.names or {}, spec.names or {} } do
    if type(src) ~= "table" then error("rtc.compile: names must be a list of name expressions", 3) end
    for _, n in ipairs(src) do
      if type(n) ~= "string" or n == "" then error("rtc.compile: names must be non-empty strings", 3) end
      append_unique(s.names, seen, n)
    end
  end
  -- options, in a fixed order (part of the cache key)
  if spec.std ~= nil and type(spec.std) ~= "string" then error("rtc.compile: std must be a string such as \"c++17\"", 3) end
  if spec.lineinfo ~= nil and type(spec.lineinfo) ~= "boolean" then error("rtc.compile: lineinfo must be a boolean", 3) end
  local o = { "-arch=" .. s.arch, "-std=" .. (spec.std or "c++17") }
  if spec.lineinfo ~= false then o[#o + 1] = "-lineinfo" end
  o[#o + 1] = "-Xptxas=-v" -- resource usage per kernel, read from the log
  local defs = {}
  for k, v in pairs(s.meta.defines or {}) do defs[k] = v end
  if spec.defines ~= nil and type(spec.defines) ~= "table" then error("rtc.compile: defines must be a table", 3) end
  for k, v in pairs(spec.defines or {}) do defs[k] = v end
  local dnames = {}
  for k, v in pairs(defs) do if v ~= false then dnames[#dnames + 1] = k end end
  table.sort(dnames, function(a, b) return tostring(a) < tostring(b) end)
  for _, k in ipairs(dnames) do o[#o + 1] = define_option(k, defs[k]) end
  for _, src in ipairs { s.meta.options or {}, spec.options or {} } do
    if type(src) ~= "table" then error("rtc.compile: options must be a list of strings", 3) end
    for _, v in ipairs(src) do
      if type(v) ~= "string" then error("rtc.compile: options must be strings", 3) end
      o[#o + 1] = v
    end
  end
  if spec.include_dirs ~= nil and type(spec.include_dirs) ~= "table" then
    error("rtc.compile: include_dirs must be a list of directories", 3)
  end
  for _, d in ipairs(spec.include_dirs or {}) do
    if type(d) ~= "string" then error("rtc.compile: include_dirs must be a list of directories (strings)", 3) end
    o[#o + 1] = "--include-path=" .. d
  end
  o[#o + 1] = "--include-path=" .. rtc.kernels_dir() .. "/include"
  s.sys_dirs = rtc.cuda_include_dirs()
  for _, d in ipairs(s.sys_dirs) do o[#o + 1] = "--include-path=" .. d end
  s.options = o
  -- in-memory headers: the generated layout header and any given ones
  if spec.headers ~= nil then
    if type(spec.headers) ~= "table" then error("rtc.compile: headers must map include names to texts", 3) end
    for k, v in pairs(spec.headers) do
      if type(k) ~= "string" or type(v) ~= "string" then error("rtc.compile: headers must map include names to texts", 3) end
      s.headers[k] = v
    end
  end
  if spec.layout ~= nil then
    local ok, err = pcall(function()
      local L = spec.layout
      if type(L) == "string" then L = require("mlalab.layout").get(L) end -- a layout's name will do
      local bs = spec.block_size or s.meta.block_size
      s.headers[layouts.HEADER_NAME] = layouts.header(L, bs)
      s.layout_desc = layouts.normalize(type(L.desc) == "function" and L:desc(bs) or L, bs)
    end)
    if not ok then error("rtc.compile: layout: " .. tostring(err), 3) end
  end
  return s
end

-- Building ------------------------------------------------------------------------------

local function note(fmt, ...)
  if config.verbose then io.stderr:write("rtc: ", string.format(fmt, ...), "\n") end
end

local warned_write
local function parse_entries(rec)
  rec.entries, rec.sigs = {}, {}
  for low, sig in rec.signatures:gmatch("([^\t\n]+)\t([^\n]*)\n") do
    rec.entries[#rec.entries + 1] = { lowered = low, sig = sig }
    rec.sigs[low] = sig
  end
  rec.resources = diag.resources(rec.log)
end

local function prepare(s, names)
  return core.rtc_prepare {
    name = s.program, file = s.path, source = s.source, dir = s.dir, options = s.options, names = names,
    headers = s.headers, sys_dirs = s.sys_dirs, salt = config.salt,
  }
end

-- memo, then disk, then NVRTC; raises the compile error object on failure
local function obtain(s, prep)
  local key = prep:key()
  stats.prepare_ms = stats.prepare_ms + prep:prepare_ms()
  if s.cache ~= false and not config.refresh then
    local rec = memo[key]
    if rec then
      stats.memo_hits = stats.memo_hits + 1
      return rec, "memo"
    end
  end
  local dir = (s.cache == nil or s.cache == true) and config.dir or nil
  local r = core.rtc_build(prep, { cache_dir = dir, save_source = config.save_source, no_read = s.cache == false or config.refresh })
  if r.read_ms then stats.read_ms = stats.read_ms + r.read_ms end
  if r.corrupt then
    stats.corrupt = stats.corrupt + 1
    note("%s: damaged cache entry %s (%s): recompiled", s.program, key, r.corrupt)
  end
  if not r.ok then
    stats.failures = stats.failures + 1
    stats.compile_ms = stats.compile_ms + (r.compile_ms or 0)
    local kd = rtc.kernels_dir()
    error(diag.compile_error {
      log = r.log, options = s.options, program = s.program, arch = s.arch,
      source_of = function(name) return (prep:text(name)) end,
      shown_path = function(name)
        if name == s.program then return name end
        local _, path = prep:text(name)
        if path and path:sub(1, #kd + 1) == kd .. "/" then return "kernels_rtc/" .. path:sub(#kd + 2) end
        return path or name
      end,
    }, 0)
  end
  if r.state == "compiled" then
    stats.compiles = stats.compiles + 1
    stats.compile_ms = stats.compile_ms + r.compile_ms
    note("%s [%s]: compiled in %.1f ms", s.program, s.arch, r.compile_ms)
  else
    stats.disk_hits = stats.disk_hits + 1
    note("%s [%s]: disk cache hit (%.3f ms)", s.program, s.arch, r.read_ms or 0)
  end
  if r.write_error then
    stats.write_errors = stats.write_errors + 1
    if not warned_write then
      warned_write = true
      io.stderr:write("mlalab: kernel cache not written (", r.write_error, "); set MLALAB_KERNEL_CACHE to a writable directory\n")
    end
  end
  parse_entries(r)
  if s.cache ~= false then memo_put(key, r) end
  return r, r.state
end

-- Modules ---------------------------------------------------------------------------------

local Module = {}
Module.__index = Module
rtc.Module = Module

function Module:_adopt(prep, rec, state)
  self.prep, self.rec, self.key = prep, rec, prep:key()
  self.cache_state = state
  self.compile_ms = state == "compiled" and rec.compile_ms or 0
  self.log = rec.log
  self.warnings = diag.warnings(rec.log)
  self.cubin = rec.cubin
end

local function build_module(self)
  local s = self._s
  local prep = prepare(s, self.names)
  local rec, state = obtain(s, prep)
  self:_adopt(prep, rec, state)
end

--- rtc.compile(spec) -> module. spec: file (under kernels_rtc/) or source (+ name),
-- names (name expressions), defines ({N = 128, FLAG = true}), include_dirs, options
-- (extra NVRTC options, in order), std ("c++17"), arch ("sm_90a"; default: the
-- current device), lineinfo (true), layout + block_size (generates "mla_layout.h"),
-- headers ({["x.h"] = text}, in memory), cache (true | "memory" | false).
function rtc.compile(spec)
  if type(spec) == "string" then spec = { file = spec } end
  if type(spec) ~= "table" then error("rtc.compile: a spec table (or a file name) is expected", 2) end
  local s = resolve(spec)
  local self = setmetatable({
    _s = s, _spec = spec, names = s.names, program = s.program, arch = s.arch, options = s.options, path = s.path,
    layout_desc = s.layout_desc, _kernels = {}, _infos = {},
  }, Module)
  build_module(self)
  return self
end

--- True if a source file or a header read from disk changed since the build.
function Module:changed() return self.prep:changed() end

-- Lowered name of a kernel: a name expression, a mangled or extern "C" name,
-- or the base name of exactly one entry.
function Module:_lowered(name, soft)
  local r = self.rec
  local low = r.lowered[name]
  if low then return low end
  if r.sigs[name] then return name end
  local found = {}
  for _, e in ipairs(r.entries) do
    if diag.base_name(e.lowered) == name then found[#found + 1] = e.lowered end
  end
  if #found == 1 then return found[1] end
  if #found > 1 and not soft then
    error(string.format("rtc: %s has %d kernels named %s (%s); use a name expression such as %s<...>", self.program,
      #found, name, table.concat(found, ", "), name), 3)
  end
  return nil
end

function Module:_library()
  local r = self.rec
  if not r.library then r.library = core.rtc_load(r.cubin) end
  return r.library
end

local function display_names(self)
  local by_low = {}
  for expr, low in pairs(self.rec.lowered) do
    if not by_low[low] or #expr < #by_low[low] then by_low[low] = expr end
  end
  local count = {}
  for _, e in ipairs(self.rec.entries) do
    local b = diag.base_name(e.lowered)
    count[b] = (count[b] or 0) + 1
  end
  for _, e in ipairs(self.rec.entries) do
    if not by_low[e.lowered] then
      local b = diag.base_name(e.lowered)
      by_low[e.lowered] = count[b] == 1 and b or e.lowered
    end
  end
  return by_low
end

--- Kernels of the module: { {name=, lowered=, signature=}, ... } in cubin order.
function Module:kernels()
  local names, out = display_names(self), {}
  for i, e in ipairs(self.rec.entries) do out[i] = { name = names[e.lowered], lowered = e.lowered, signature = e.sig } end
  return out
end

--- Resource usage from ptxas: { [kernel name] = {registers=, spill_stores=, spill_loads=,
-- stack=, shared_mem=, barriers=, cmem=} }, or one kernel's entry with a name.
function Module:resources(name)
  local names = display_names(self)
  if name then
    local low = self:_lowered(name)
    return low and self.rec.resources[low] or nil
  end
  local out = {}
  for low, r in pairs(self.rec.resources) do out[names[low] or low] = r end
  return out
end

--- Lowered (mangled) name of a name expression or kernel, or nil.
function Module:lowered_name(name) return self:_lowered(name, true) end

-- Parameter names of an entry, read off its __global__ declaration in the
-- program text (nil when they cannot be found): errors name parameters.
local function param_names_of(self, low)
  local sig = self.rec.sigs[low]
  if not sig then return nil end
  local count = sig == "" and 0 or select(2, sig:gsub(",", ",")) + 1
  return diag.param_names(self.prep:text(self.program), diag.base_name(low), count)
end

local function info_of(self, name, low)
  return { name = name, lowered = low, program = self.program, arch = self.arch, sig = self.rec.sigs[low],
    resources = self.rec.resources[low], param_names = param_names_of(self, low), module = self }
end

--- The kernel for a name or name expression. A new template expression
-- ("f<256>") is instantiated on demand (one recompile, cached like any other).
function Module:kernel(name)
  if type(name) ~= "string" or name == "" then error("kernel: a kernel name or name expression is expected", 2) end
  if rtc.auto_reload and self.prep:changed() then self:reload() end
  local k = self._kernels[name]
  if k then return k end
  local low = self:_lowered(name)
  if not low and name:find("[<(]") then low = self:instantiate(name) end
  if not low then
    local list = {}
    for _, e in ipairs(self:kernels()) do list[#list + 1] = e.name end
    error(string.format("rtc: %s has no kernel '%s' (kernels: %s)", self.program, name,
      #list > 0 and table.concat(list, ", ") or "none"), 2)
  end
  local info = info_of(self, name, low)
  k = core.rtc_kernel(self:_library(), low, name, self.rec.sigs[low], info)
  self._kernels[name], self._infos[name] = k, info
  return k
end

--- Adds a name expression ("f<256, float>") to the module and recompiles it
-- (cached like any compile; no GPU needed). Returns its lowered name. A
-- compile error is raised and the module keeps its last build.
function Module:instantiate(expr)
  if type(expr) ~= "string" or expr == "" then error("instantiate: a name expression is expected", 2) end
  local low = self.rec.lowered[expr]
  if low then return low end
  self.names[#self.names + 1] = expr
  local ok, err = pcall(self.reload, self, true)
  if not ok then
    table.remove(self.names)
    error(err, 0)
  end
  return self.rec.lowered[expr]
end

--- Recompiles if any source or header changed (by content). Returns true when
-- the module was rebuilt; kernels obtained before keep working and now run the
-- new code. A compile error is raised and the module keeps its last build.
function Module:reload(force)
  local s = self._s
  if s.path then -- the file's mlalab-rtc block (names, defines, options) may have changed too
    s = resolve(self._spec)
    local seen = {}
    for _, n in ipairs(s.names) do seen[n] = true end
    for _, n in ipairs(self.names) do append_unique(s.names, seen, n) end -- instantiated ones stay
  end
  local prep = prepare(s, s.names)
  if prep:key() == self.key and not force then
    self.prep = prep -- same content (a touched file): remember the new times
    return false
  end
  local rec, state = obtain(s, prep)
  self._s, self.names, self.options = s, s.names, s.options
  self:_adopt(prep, rec, state)
  for name, k in pairs(self._kernels) do
    local low = self:_lowered(name, true)
    if low then
      core.rtc_rebind(k, self:_library(), low, rec.sigs[low])
      local info = self._infos[name]
      info.lowered, info.sig, info.resources = low, rec.sigs[low], rec.resources[low]
      info.param_names = param_names_of(self, low)
    else
      self._kernels[name], self._infos[name] = nil, nil
    end
  end
  note("%s: reloaded (%s)", self.program, state)
  return true
end

--- Parameters as the PTX declares them (no GPU needed): { {offset=, size=, kind=, type=}, ... }
function Module:signature(name)
  local low = self:_lowered(name)
  if not low then error("rtc: " .. self.program .. " has no kernel '" .. tostring(name) .. "'", 2) end
  return core.rtc_signature(self.rec.sigs[low] or "")
end

--- Names of a kernel's parameters as its source declares them (nil if unknown).
function Module:param_names(name)
  local low = self:_lowered(name)
  if not low then error("rtc: " .. self.program .. " has no kernel '" .. tostring(name) .. "'", 2) end
  return param_names_of(self, low)
end

--- Checks and packs launch arguments against a kernel's parameters without a
-- GPU (the launch runs the same checks against the device's list): returns the
-- packed parameter bytes, or raises naming the kernel and the parameter.
function Module:check_args(name, args)
  local low = self:_lowered(name)
  if not low then error("rtc: " .. self.program .. " has no kernel '" .. tostring(name) .. "'", 2) end
  local ok, packed = pcall(core.rtc_pack_args, self.rec.sigs[low] or "", args, param_names_of(self, low), name)
  if not ok then error(packed, 2) end
  return packed
end

Module.__tostring = function(self)
  return string.format("rtc module %s [%s] %d kernel%s, %s%s", self.program, self.arch, #self.rec.entries,
    #self.rec.entries == 1 and "" or "s", self.cache_state,
    self.cache_state == "compiled" and string.format(" in %.1f ms", self.compile_ms) or "")
end

-- Kernels (userdata from the C core; Lua adds a few methods) -------------------------

local K = core.RtcKernel
--- k:signature() -> parameters as the PTX declares them (CPU); k:params() asks the device.
function K.signature(k) return core.rtc_signature(k.sig or "") end

-- Scalars that Lua numbers cannot express directly --------------------------------------

--- rtc.f16(x): a 2-byte argument for a __half parameter (round to nearest even).
function rtc.f16(x) return core.rtc_scalar_bytes("f16", x) end
--- rtc.bf16(x): a 2-byte argument for a __nv_bfloat16 parameter (round to nearest even).
function rtc.bf16(x) return core.rtc_scalar_bytes("bf16", x) end
--- Packs args against a PTX signature string with the launch's own checks (no GPU).
rtc.pack_args = core.rtc_pack_args

--- `mlalab --check-kernels [archs]`: see mlalab.rtc_check.
function rtc.check_kernels(...) return require("mlalab.rtc_check").run(...) end

return rtc
