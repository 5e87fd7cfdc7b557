--- Sweeps: run a grid of parameters, stream each result to JSON lines as it
-- completes (one flushed line per point: nothing is lost on Ctrl-C or a
-- crash), show progress, print a table at the end, write CSV / JSON on
-- request, and plot a metric against a parameter per variant (SVG).
--
--   local res = mla.sweep{
--     name = "copy",
--     params = { {"variant", {"kernel", "memcpy"}}, {"bytes", {1 << 20, 1 << 24}} }, -- ordered, outer first
--     run = function(p) return mla.bench(f(p), {bytes = 2 * p.bytes}) end,
--     jsonl = "out/copy.jsonl", csv = "out/copy.csv", json = "out/copy.json",
--     plot = { file = "out/copy.svg", x = "bytes", y = "gbs", series = "variant", logx = true },
--   }
-- `params` may also be a map {bytes = {...}, variant = {...}} (keys sorted,
-- or in the order of `order`), or give `points`, an explicit list of tables.
-- run(p) returns a number, a table of scalars, or a bench/compare result.
local mla = require "mlalab"
local json = require "mlalab.json"
local plot = require "mlalab.plot"

local M = {}

-- Points ---------------------------------------------------------------------------

local function axes_of(o)
  local axes = {}
  if type(o.params) ~= "table" then error("sweep: params (a table) or points expected", 3) end
  if o.params[1] then
    for _, a in ipairs(o.params) do
      if type(a) ~= "table" or type(a[1]) ~= "string" or type(a[2]) ~= "table" then
        error("sweep: ordered params are {name, {values...}} pairs", 3)
      end
      axes[#axes + 1] = { name = a[1], values = a[2] }
    end
  else
    local names = {}
    if o.order then
      names = o.order
    else
      for k in pairs(o.params) do names[#names + 1] = k end
      table.sort(names)
    end
    for _, k in ipairs(names) do
      local v = o.params[k]
      if type(v) ~= "table" then v = { v } end
      axes[#axes + 1] = { name = k, values = v }
    end
  end
  for _, a in ipairs(axes) do
    if #a.values == 0 then error("sweep: parameter '" .. a.name .. "' has no values", 3) end
  end
  return axes
end

--- The cartesian product, the first axis outermost.
local function grid(axes)
  local pts = { {} }
  for _, a in ipairs(axes) do
    local nxt = {}
    for _, p in ipairs(pts) do
      for _, v in ipairs(a.values) do
        local q = {}
        for k, x in pairs(p) do q[k] = x end
        q[a.name] = v
        nxt[#nxt + 1] = q
      end
    end
    pts = nxt
  end
  return pts
end

--- case_id(name, point, order) -> "name(k1=v1,k2=v2)": a point's id, its keys in `order` (booleans as 1 / 0).
local function case_id(name, p, order)
  local parts = {}
  for _, k in ipairs(order) do
    local v = p[k]
    if v ~= nil then parts[#parts + 1] = k .. "=" .. (type(v) == "boolean" and (v and 1 or 0) or tostring(v)) end
  end
  return (name or "sweep") .. "(" .. table.concat(parts, ",") .. ")"
end
M.case_id = case_id

-- Metrics from what run returns ----------------------------------------------------------

local BENCH_FIELDS = { "median", "min", "max", "noise", "samples", "gbs", "tflops", "bw_util", "memcpy_frac", "gemm_frac",
  "flags" }

local function scalar(v) local t = type(v) return t == "number" or t == "string" or t == "boolean" end

--- Flattens what run returned into scalar metrics, keeping a column order.
local function flatten_into(m, order, prefix, v)
  local function put(k, x)
    if x == nil then return end
    if m[k] == nil then order[#order + 1] = k end
    m[k] = x
  end
  local p = prefix == "" and "" or prefix .. "_"
  if scalar(v) then
    put(prefix == "" and "value" or prefix, v)
  elseif type(v) == "table" and v.samples and v.median ~= nil then -- a bench result (or its plain copy)
    local s = v.summary and v:summary() or v
    s.samples = s.n
    if s.flags == "" then s.flags = nil end
    for _, f in ipairs(BENCH_FIELDS) do put(p .. f, s[f]) end
  elseif type(v) == "table" and v.verdict and v.reasons then -- a compare result (or its plain copy)
    put(p .. "verdict", v.verdict)
    put(p .. "max_abs", v.max_abs)
    put(p .. "max_rel", v.max_rel)
    put(p .. "mismatches", v.mismatches)
  elseif type(v) == "table" then
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys, function(x, y) return tostring(x) < tostring(y) end)
    for _, k in ipairs(keys) do flatten_into(m, order, p .. tostring(k), v[k]) end
  elseif v ~= nil then
    error("sweep: run returned a " .. type(v) .. " where a number, string, table or result was expected", 0)
  end
end

local function metrics_of(v)
  local m, order = {}, {}
  flatten_into(m, order, "", v)
  return m, order
end

-- Progress ---------------------------------------------------------------------------------

local function stderr_is_tty()
  local env = os.getenv("MLALAB_PROGRESS")
  if env == "0" then return false elseif env == "1" then return true end
  if os.getenv("CI") then return false end
  local ok = os.execute("test -t 2")
  return ok == true or ok == 0
end

local function fmt_dur(s)
  if s ~= s or s == math.huge then return "?" end
  if s < 60 then return string.format("%.0fs", s) end
  if s < 3600 then return string.format("%dm%02ds", s // 60, math.floor(s % 60)) end
  return string.format("%dh%02dm", s // 3600, math.floor(s % 3600) // 60)
end

local function fmt_val(v)
  if type(v) == "number" then
    if math.type(v) == "integer" then return tostring(v) end
    if v ~= v then return "nan" end
    return string.format("%.4g", v)
  end
  return tostring(v)
end

local Progress = {}
Progress.__index = Progress

local function progress(total, tty, out)
  return setmetatable({ total = total, done = 0, t0 = mla.core.clock(), tty = tty, out = out or io.stderr }, Progress)
end

function Progress:update(i, rec)
  self.done = i
  local el = mla.core.clock() - self.t0
  local eta = self.done > 0 and el / self.done * (self.total - self.done) or math.huge
  if self.tty then
    local w = 24
    local fill = math.floor(w * self.done / math.max(1, self.total))
    local line = string.format("\r[%s%s] %d/%d %3d%% eta %s  %s %s", string.rep("#", fill), string.rep(".", w - fill),
      self.done, self.total, math.floor(100 * self.done / math.max(1, self.total)), fmt_dur(eta), rec.status, rec.case)
    self.out:write(line:sub(1, 160), "\27[K")
  else
    self.out:write(string.format("[%d/%d] %s %s (%.2fs, eta %s)\n", self.done, self.total, rec.status, rec.case,
      rec.elapsed or 0, fmt_dur(eta)))
  end
  self.out:flush()
end

function Progress:finish()
  if self.tty then self.out:write("\r\27[K") self.out:flush() end
end

-- Result ------------------------------------------------------------------------------------

local Sweep = {}
Sweep.__index = Sweep

--- Column order: case, parameters (declared order), status, metrics (first seen), error.
function Sweep:columns()
  local cols, seen = { "case" }, { case = true, status = true, error = true, index = true, elapsed = true,
    kernel = true, cuda_error = true }
  for _, k in ipairs(self.param_names) do cols[#cols + 1] = k seen[k] = true end
  cols[#cols + 1] = "status"
  for _, r in ipairs(self.records) do
    for _, k in ipairs(r._metric_order or {}) do
      if not seen[k] then cols[#cols + 1] = k seen[k] = true end
    end
  end
  for _, k in ipairs { "elapsed", "error", "kernel", "cuda_error" } do cols[#cols + 1] = k end
  return cols
end

local function clean(r)
  local o = {}
  for k, v in pairs(r) do
    if type(k) == "string" and k:sub(1, 1) ~= "_" then o[k] = v end
  end
  return o
end

--- s:table([out = io.stdout[, cols]]): the records as an aligned table, the columns any record fills.
function Sweep:table(out, cols)
  out = out or io.stdout
  cols = cols or self:columns()
  local used = {}
  for _, c in ipairs(cols) do
    for _, r in ipairs(self.records) do
      if r[c] ~= nil then used[#used + 1] = c break end
    end
  end
  local w = {}
  for i, c in ipairs(used) do
    w[i] = #c
    for _, r in ipairs(self.records) do w[i] = math.min(40, math.max(w[i], #fmt_val(r[c] == nil and "-" or r[c]))) end
  end
  local function line(vals)
    local p = {}
    for i, v in ipairs(vals) do
      v = tostring(v)
      if #v > w[i] then v = v:sub(1, w[i] - 1) .. "~" end
      p[i] = v .. string.rep(" ", w[i] - #v)
    end
    out:write(table.concat(p, "  "), "\n")
  end
  line(used)
  for _, r in ipairs(self.records) do
    local vals = {}
    for i, c in ipairs(used) do vals[i] = r[c] == nil and "-" or fmt_val(r[c]) end
    line(vals)
  end
  local bad = 0
  for _, r in ipairs(self.records) do if r.status ~= "OK" then bad = bad + 1 end end
  out:write(string.format("%d points: %d OK, %d not OK\n", #self.records, #self.records - bad, bad))
end

local function csv_cell(v)
  if v == nil then return "" end
  if type(v) == "number" then
    if math.type(v) == "integer" then return tostring(v) end
    if v ~= v then return "nan" end
    return string.format("%.17g", v)
  end
  v = tostring(v)
  if v:find('[,"\r\n]') then v = '"' .. v:gsub('"', '""') .. '"' end
  return v
end

--- s:write_csv(path) -> path: one row a record, every column, cells quoted as CSV needs.
function Sweep:write_csv(path)
  local cols = self:columns()
  local f = assert(io.open(path, "w"))
  local h = {}
  for i, c in ipairs(cols) do h[i] = csv_cell(c) end
  f:write(table.concat(h, ","), "\n")
  for _, r in ipairs(self.records) do
    local row = {}
    for i, c in ipairs(cols) do row[i] = csv_cell(r[c]) end
    f:write(table.concat(row, ","), "\n")
  end
  f:close()
  return path
end

--- s:write_json(path) -> path: {name, params, records} as one JSON document.
function Sweep:write_json(path)
  local recs = json.array()
  for i, r in ipairs(self.records) do recs[i] = clean(r) end
  local f = assert(io.open(path, "w"))
  f:write(json.encode({ name = self.name, params = json.array(self.param_names), records = recs },
    { "name", "params", "records" }), "\n")
  f:close()
  return path
end

--- Values of one column, in record order.
function Sweep:column(name)
  local out = {}
  for i, r in ipairs(self.records) do out[i] = r[name] end
  return out
end

--- Plot a metric against a parameter, one line per value of `series` (SVG).
function Sweep:plot(o)
  local p = {}
  for k, v in pairs(o) do p[k] = v end
  p.records = {}
  for _, r in ipairs(self.records) do
    if r.status == "OK" then p.records[#p.records + 1] = r end
  end
  p.title = p.title or (self.name .. ": " .. p.y .. " vs " .. p.x)
  return plot.svg(p)
end

-- Running -------------------------------------------------------------------------------------

local function ensure_dir(path)
  local dir = path:match("^(.*)/[^/]+$")
  if dir and dir ~= "" then os.execute("mkdir -p '" .. dir:gsub("'", "'\\''") .. "'") end
end

--- The default runner: in this process, errors recorded as status "ERROR".
local function in_process(run, p)
  local ok, v = pcall(run, p)
  if ok then return "OK", v end
  return "ERROR", v
end

--- Each point in a child process (mlalab.isolate): a faulting or hanging
-- kernel costs one point, recorded as FAULT / TIMEOUT / OOM / CRASH.
local function isolated(iso_opts)
  local iso = mla.isolate_mod or error("sweep: isolate needs mlalab.isolate", 0)
  return function(run, p)
    local r = iso.run(run, { p }, iso_opts)
    if r.status == "OK" then return "OK", r.value and r.value[1] end
    return r.status, r.error, { kernel = r.kernel, cuda_error = r.cuda_error }
  end
end

local function is_fatal(msg)
  msg = tostring(msg)
  return msg:find("interrupted!", 1, true) or mla.core.context_poisoned()
end

local OPTION_NAMES = { "name", "params", "points", "order", "filter", "run", "jsonl", "csv", "json", "plot", "progress",
  "progress_out", "table", "resume", "on_error", "isolate", "runner", "out" }

--- mla.sweep{...} -> result with :table(), :write_csv(), :write_json(), :plot(), :column().
-- Options: name, params | points, order, filter(p), run(p), jsonl, csv, json,
-- plot (one table or a list), progress (default: on a terminal), table=true,
-- resume (skip points already OK in the jsonl file), on_error="record"|"raise",
-- isolate (true or mlalab.isolate options: every point in a child process),
-- runner(run, p) -> status ("OK" or a failure class), value or message, extra fields,
-- out (stream for table and progress lines).
function M.sweep(o)
  if type(o) ~= "table" or type(o.run) ~= "function" then error("sweep: {params=, run=function(p) ... end} expected", 2) end
  require("mlalab.options").check("sweep", o, OPTION_NAMES)
  local name = o.name or "sweep"
  local axes, points
  if o.points then
    points = o.points
    axes = {}
    local seen = {}
    for _, p in ipairs(points) do
      local ks = {}
      for k in pairs(p) do ks[#ks + 1] = k end
      table.sort(ks)
      for _, k in ipairs(ks) do
        if not seen[k] then seen[k] = true axes[#axes + 1] = { name = k } end
      end
    end
  else
    axes = axes_of(o)
    points = grid(axes)
  end
  local names = {}
  for i, a in ipairs(axes) do names[i] = a.name end
  if o.filter then
    local kept = {}
    for _, p in ipairs(points) do if o.filter(p) then kept[#kept + 1] = p end end
    points = kept
  end

  local res = setmetatable({ name = name, param_names = names, records = {} }, Sweep)
  local done = {}
  if o.resume and o.jsonl then
    local f = io.open(o.jsonl, "r")
    if f then
      f:close()
      for _, r in ipairs(json.read_lines(o.jsonl)) do
        if r.status == "OK" and r.case then
          done[r.case] = r
        end
      end
    end
  end
  local jf
  if o.jsonl then
    ensure_dir(o.jsonl)
    jf = assert(io.open(o.jsonl, o.resume and "a" or "w"))
  end
  local tty = o.progress
  if tty == nil then tty = stderr_is_tty() end
  local prog = o.progress ~= false and progress(#points, tty, o.progress_out) or nil
  local runner = o.runner or (o.isolate and isolated(type(o.isolate) == "table" and o.isolate or nil)) or in_process

  local function finish_outputs()
    if jf then jf:close() jf = nil end
    if o.csv then ensure_dir(o.csv) res:write_csv(o.csv) end
    if o.json then ensure_dir(o.json) res:write_json(o.json) end
  end

  for i, p in ipairs(points) do
    local id = case_id(name, p, names)
    local rec = done[id]
    if rec then
      rec._metric_order = {}
      for k in pairs(rec) do
        if type(k) == "string" and k ~= "case" and k ~= "status" and p[k] == nil then rec._metric_order[#rec._metric_order + 1] = k end
      end
      table.sort(rec._metric_order)
      rec.resumed = true
    else
      local t0 = mla.core.clock()
      local status, v, extra = runner(o.run, p)
      rec = { case = id, index = i, status = status, elapsed = mla.core.clock() - t0 }
      for k, x in pairs(extra or {}) do rec[k] = x end
      for _, k in ipairs(names) do rec[k] = p[k] end
      local order = {}
      if status == "OK" then
        local okm, m, mo = pcall(metrics_of, v)
        if not okm then
          rec.status, rec.error = "ERROR", tostring(m)
        else
          for _, k in ipairs(mo) do
            local key = k
            -- a metric named like a parameter or a record field keeps both: out_<name>
            if p[k] ~= nil or k == "case" or k == "status" or k == "index" or k == "elapsed" or k == "error" then
              key = "out_" .. k
            end
            rec[key] = m[k]
            order[#order + 1] = key
          end
        end
        rec._value = v
      else
        rec.error = tostring(v)
      end
      rec._metric_order = order
      if jf then
        local cols = { "case", "index" }
        for _, k in ipairs(names) do cols[#cols + 1] = k end
        cols[#cols + 1] = "status"
        for _, k in ipairs(order) do cols[#cols + 1] = k end
        jf:write(json.encode(clean(rec), cols), "\n")
        jf:flush() -- one line per point, on disk before the next point starts
      end
      if status ~= "OK" and (o.on_error == "raise" or is_fatal(rec.error)) then
        res.records[#res.records + 1] = rec
        if prog then prog:finish() end
        finish_outputs()
        error(string.format("sweep %s: point %s failed: %s%s", name, id, rec.error,
          o.jsonl and ("\n(results so far are in " .. o.jsonl .. ")") or ""), 0)
      end
    end
    res.records[#res.records + 1] = rec
    if prog then prog:update(i, rec) end
  end
  if prog then prog:finish() end
  finish_outputs()
  if o.table ~= false then res:table(o.out) end
  if o.plot then
    local plots = o.plot[1] and o.plot or { o.plot }
    res.plots = {}
    for _, pl in ipairs(plots) do
      ensure_dir(pl.file)
      res.plots[#res.plots + 1] = res:plot(pl)
    end
  end
  return res
end

M.load = json.read_lines

return M
