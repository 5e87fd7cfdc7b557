--- Helpers of the JIT specs (rtc_spec, rtc_cache_concurrency_spec): temp
-- directories, files, and child mlalab processes compiling with a given
-- kernel cache directory, as a researcher's fresh process would.
local mla = require "mlalab"
local core = mla.core

local R = {}

R.BIN = require("support").BIN
R.ARCH = "sm_90a" -- NVRTC builds it without a GPU

local function quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
R.quote = quote

--- A new empty directory (removed by R.cleanup).
local made = {}
function R.tmpdir()
  local d = os.tmpname()
  os.remove(d)
  assert(os.execute("mkdir -p " .. quote(d)))
  made[#made + 1] = d
  return d
end

function R.cleanup()
  for _, d in ipairs(made) do os.execute("rm -rf " .. quote(d)) end
  made = {}
end

function R.write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
  return path
end

function R.read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

--- Names in a directory (hidden ones too), sorted.
function R.list(dir)
  local p = io.popen("ls -A " .. quote(dir) .. " 2>/dev/null")
  local out = {}
  for line in p:read("a"):gmatch("[^\n]+") do out[#out + 1] = line end
  p:close()
  table.sort(out)
  return out
end

--- Entries (<key>.cubin) and temp files of a cache directory.
function R.cache_files(dir)
  local entries, temps, other = {}, {}, {}
  for _, n in ipairs(R.list(dir)) do
    if n:match("^%x+%.cubin$") then entries[#entries + 1] = n
    elseif n:find(".tmp.", 1, true) then temps[#temps + 1] = n
    else other[#other + 1] = n end
  end
  return entries, temps, other
end

-- The child: compiles the source file named by RTC_SPEC_SRC (as program
-- RTC_SPEC_NAME, for R.ARCH) and prints "state key cubin-hash corrupt-count".
local CHILD = [[
local mla = require "mlalab"
local core = mla.core
local src = assert(io.open(os.getenv("RTC_SPEC_SRC"), "rb")):read("a")
local m = mla.rtc.compile { source = src, name = os.getenv("RTC_SPEC_NAME"), arch = os.getenv("RTC_SPEC_ARCH") }
io.write(m.cache_state, " ", m.key, " ", core.rtc_hash(m.cubin), " ", mla.rtc.stats().corrupt, "\n")
]]

--- Compiles `src_path` in a fresh mlalab process with the cache in `cache`.
-- Returns the spawn result plus state, key, hash, corrupt parsed from stdout.
function R.child_compile(src_path, cache, opts)
  opts = opts or {}
  local env = { "MLALAB_KERNEL_CACHE=" .. cache, "RTC_SPEC_SRC=" .. src_path, "RTC_SPEC_NAME=" .. (opts.name or "child.cu"),
    "RTC_SPEC_ARCH=" .. R.ARCH, "MLALAB_DEVICE=cpu" }
  for _, e in ipairs(opts.env or {}) do env[#env + 1] = e end
  local r = core.spawn { argv = { R.BIN, "-e", CHILD }, env = env, timeout = opts.timeout or 120 }
  r.state, r.key, r.hash, r.corrupt = r.stdout:match("^(%S+) (%x+) (%x+) (%d+)")
  r.corrupt = tonumber(r.corrupt)
  return r
end

--- Shell command line of the child (for N of them started at once by /bin/sh).
function R.child_command(src_path, cache, out_path, extra_env)
  local env = { "MLALAB_KERNEL_CACHE=" .. cache, "RTC_SPEC_SRC=" .. src_path, "RTC_SPEC_NAME=child.cu",
    "RTC_SPEC_ARCH=" .. R.ARCH, "MLALAB_DEVICE=cpu" }
  for _, e in ipairs(extra_env or {}) do env[#env + 1] = e end
  local parts = {}
  for i, e in ipairs(env) do parts[i] = quote(e) end
  return string.format("env %s %s -e %s >%s 2>%s.err", table.concat(parts, " "), quote(R.BIN), quote(CHILD),
    quote(out_path), quote(out_path))
end

--- Parses a child's output file ("state key hash corrupt").
function R.parse_child(text)
  local state, key, hash, corrupt = (text or ""):match("^(%S+) (%x+) (%x+) (%d+)")
  return { state = state, key = key, hash = hash, corrupt = tonumber(corrupt) }
end

return R
