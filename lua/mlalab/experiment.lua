--- Small helpers shared by experiments/*.lua: arguments, the device line,
-- and the verdict list that decides the exit status.
--
--   local E = mla.experiment
--   local a = E.args({ ... }, { impl = "string", quick = "flag" }, "mixed_backend")
--   E.banner("mixed_backend", a)
--   local v = E.verdicts()
--   v:add("requant pair", ok, "detail")
--   v:finish()                        -- prints the summary, exits 1 if any check failed
local mla = require "mlalab"

local E = {}

--- Parses `--name value` and `--flag` arguments against `spec` (name ->
-- "string" | "number" | "flag"). `--device D` is always accepted and sets
-- the default device (as `mlalab --device D script` does).
function E.args(list, spec, who)
  local out, i = {}, 1
  while i <= #list do
    local k = list[i]
    local name = type(k) == "string" and k:match("^%-%-([%w_-]+)$")
    local key = name and name:gsub("-", "_")
    local kind = key == "device" and "string" or (key and spec[key])
    if not kind then error(string.format("%s: unknown argument '%s'", who, tostring(k)), 0) end
    if kind == "flag" then
      out[key] = true
    else
      local v = list[i + 1]
      if v == nil then error(string.format("%s: --%s needs a value", who, name), 0) end
      if kind == "number" then
        v = tonumber(v) or error(string.format("%s: --%s needs a number, got '%s'", who, name, v), 0)
      end
      out[key] = v
      i = i + 1
    end
    i = i + 1
  end
  if out.device then mla.set_device(out.device) end
  return out
end

--- The device an experiment runs on, in words.
function E.device_line()
  local dev = mla.device()
  if dev == "cpu" then return "cpu (no GPU: CPU reference paths, smaller sizes)" end
  local p = mla.core.device_props(tonumber(dev:match("cuda:(%d+)")) or 0)
  return string.format("%s (%s, sm_%d%d, %d SMs)", dev, p.name, p.major, p.minor, p.sm_count)
end

--- Prints the experiment's title and device.
function E.banner(title)
  print(string.format("mlalab %s: %s on %s", mla.version, title, E.device_line()))
end

local V = {}
V.__index = V

--- A list of named checks; finish() prints them and exits non-zero on a failure.
function E.verdicts() return setmetatable({ list = {} }, V) end

function V:add(name, ok, detail)
  self.list[#self.list + 1] = { name = name, ok = not not ok, detail = detail or "" }
  return ok
end

function V:failed()
  local n = 0
  for _, c in ipairs(self.list) do if not c.ok then n = n + 1 end end
  return n
end

--- Prints every failed check (and the count of passed ones); exits 1 on a failure.
function V:finish(no_exit)
  local bad = self:failed()
  print()
  for _, c in ipairs(self.list) do
    if not c.ok then print(string.format("FAIL  %s%s", c.name, c.detail ~= "" and ": " .. c.detail or "")) end
  end
  if bad == 0 then
    print(string.format("verdict: all %d checks passed", #self.list))
  else
    print(string.format("verdict: %d of %d checks FAILED", bad, #self.list))
  end
  io.stdout:flush()
  if not no_exit then os.exit(bad == 0 and 0 or 1) end
  return bad == 0
end

--- Microseconds (or "-") of a time in seconds.
function E.us(s)
  if not s or s == 0 then return "-" end
  if s >= 1 then return string.format("%.2f s", s) end
  if s >= 1e-3 then return string.format("%.2f ms", s * 1e3) end
  return string.format("%.1f us", s * 1e6)
end

--- Bytes in MB (10^6), compact.
function E.mb(b) return string.format("%.1f MB", b / 1e6) end

return E
