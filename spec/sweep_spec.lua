local mla = require "mlalab"
local S = require "support"
local json = require "mlalab.json"

local function tmpdir()
  local d = os.tmpname()
  os.remove(d)
  assert(os.execute("mkdir -p " .. d))
  return d
end

local function read(path)
  local f = assert(io.open(path, "r"))
  local s = f:read("a")
  f:close()
  return s
end

local function lines(path)
  local out = {}
  for l in io.lines(path) do out[#out + 1] = l end
  return out
end

-- A quiet sink for tables and progress lines.
local function sink()
  local path = os.tmpname()
  return assert(io.open(path, "w")), path
end

local function parse_csv(text)
  local rows = {}
  for line in text:gmatch("[^\n]+") do
    local row, i = {}, 1
    while i <= #line + 1 do
      if line:sub(i, i) == '"' then
        local j, cell = i + 1, {}
        while true do
          local c = line:sub(j, j)
          if c == '"' and line:sub(j + 1, j + 1) == '"' then cell[#cell + 1] = '"' j = j + 2
          elseif c == '"' then j = j + 1 break
          else cell[#cell + 1] = c j = j + 1 end
        end
        row[#row + 1] = table.concat(cell)
        i = j + 1
      else
        local j = line:find(",", i, true) or #line + 1
        row[#row + 1] = line:sub(i, j - 1)
        i = j + 1
      end
    end
    rows[#rows + 1] = row
  end
  return rows
end

local function model(p) return { time = p.n * (p.variant == "fast" and 1 or 2), label = "x,\"y\"" } end

describe("sweep", function()
  local dir, out, out_path
  before_each(function()
    dir = tmpdir()
    out, out_path = sink()
  end)
  after_each(function()
    out:close()
    os.remove(out_path)
    os.execute("rm -rf " .. dir)
  end)

  it("runs the grid with the first parameter outermost and names each case", function()
    local seen = {}
    local r = mla.sweep { name = "g", params = { { "variant", { "a", "b" } }, { "n", { 1, 2, 3 } } }, out = out,
      progress = false, run = function(p) seen[#seen + 1] = p.variant .. p.n return 0 end }
    assert.same({ "a1", "a2", "a3", "b1", "b2", "b3" }, seen)
    assert.equal("g(variant=b,n=2)", r.records[5].case)
  end)

  it("accepts a map of parameters in sorted or declared order, and explicit points", function()
    local r = mla.sweep { params = { z = { 1 }, a = { 2, 3 } }, run = function() return 1 end, out = out, progress = false }
    assert.equal("sweep(a=2,z=1)", r.records[1].case)
    r = mla.sweep { params = { z = { 1 }, a = { 2 } }, order = { "z", "a" }, run = function() return 1 end, out = out, progress = false }
    assert.equal("sweep(z=1,a=2)", r.records[1].case)
    r = mla.sweep { points = { { k = 1 }, { k = 5 } }, run = function(p) return p.k * 2 end, out = out, progress = false }
    assert.same({ 2, 10 }, r:column("value"))
  end)

  it("streams one flushed JSON line per point while the sweep runs", function()
    local path = dir .. "/s.jsonl"
    local seen_lines = {}
    mla.sweep { name = "s", params = { { "variant", { "fast", "slow" } }, { "n", { 1, 2 } } }, jsonl = path, out = out,
      progress = false,
      run = function(p)
        seen_lines[#seen_lines + 1] = #lines(path)
        return model(p)
      end }
    assert.same({ 0, 1, 2, 3 }, seen_lines) -- each earlier point was on disk before the next began
    local recs = json.read_lines(path)
    assert.equal(4, #recs)
    assert.equal("s(variant=slow,n=2)", recs[4].case)
    assert.equal(4, recs[4].time)
    assert.equal("OK", recs[4].status)
    assert.equal("slow", recs[4].variant)
  end)

  it("writes CSV and JSON files whose contents parse back to the results", function()
    local r = mla.sweep { name = "c", params = { { "variant", { "fast", "slow" } }, { "n", { 10, 20 } } }, run = model,
      csv = dir .. "/c.csv", json = dir .. "/sub/c.json", out = out, progress = false }
    local rows = parse_csv(read(dir .. "/c.csv"))
    assert.equal(5, #rows)
    local h = {}
    for i, name in ipairs(rows[1]) do h[name] = i end
    assert.equal("c(variant=fast,n=20)", rows[3][h.case])
    assert.equal("20", rows[3][h.n])
    assert.equal("40", rows[5][h.time])
    assert.equal('x,"y"', rows[2][h.label])
    local doc = json.decode(read(dir .. "/sub/c.json"))
    assert.same({ "variant", "n" }, { doc.params[1], doc.params[2] })
    assert.equal(4, #doc.records)
    assert.equal(r.records[2].time, doc.records[2].time)
  end)

  it("plots a metric against a parameter, one line per variant, to an SVG file", function()
    local svg = dir .. "/p.svg"
    mla.sweep { name = "p", params = { { "variant", { "fast", "slow" } }, { "n", { 1024, 4096, 16384 } } }, run = model,
      out = out, progress = false, plot = { file = svg, x = "n", y = "time", series = "variant", logx = true } }
    local text = read(svg)
    assert.truthy(text:find("^<svg"))
    local lines_n, pts = 0, {}
    for series in text:gmatch('<polyline class="series" data%-series="(%w+)"') do lines_n = lines_n + 1 end
    for series, x, y in text:gmatch('<circle class="point" data%-series="(%w+)" data%-x="([^"]+)" data%-y="([^"]+)"') do
      pts[#pts + 1] = { series, tonumber(x), tonumber(y) }
    end
    assert.equal(2, lines_n)
    assert.equal(6, #pts)
    assert.same({ "slow", 16384, 32768 }, pts[6])
    assert.truthy(text:find('<text class="legend"[^>]*>fast</text>'))
    assert.truthy(text:find(">16Ki<", 1, true)) -- binary tick labels on a log2 axis
  end)

  it("records a failing point and carries on", function()
    local path = dir .. "/e.jsonl"
    local r = mla.sweep { params = { { "n", { 1, 2, 3 } } }, jsonl = path, out = out, progress = false,
      run = function(p)
        if p.n == 2 then error("boom at 2") end
        return p.n
      end }
    assert.same({ "OK", "ERROR", "OK" }, r:column("status"))
    assert.truthy(r.records[2].error:find("boom at 2", 1, true))
    assert.equal(3, #json.read_lines(path))
  end)

  it("stops on an interrupt, keeping every finished point on disk", function()
    local path = dir .. "/i.jsonl"
    S.assert_error_contains(function()
      mla.sweep { params = { { "n", { 1, 2, 3, 4 } } }, jsonl = path, csv = dir .. "/i.csv", out = out, progress = false,
        run = function(p)
          if p.n == 3 then error("interrupted!") end
          return p.n
        end }
    end, "interrupted!")
    local recs = json.read_lines(path)
    assert.equal(3, #recs)
    assert.equal("ERROR", recs[3].status)
    assert.equal(4, #parse_csv(read(dir .. "/i.csv")))
  end)

  it("raises on the first failure with on_error='raise'", function()
    S.assert_error_contains(function()
      mla.sweep { params = { { "n", { 1, 2 } } }, on_error = "raise", out = out, progress = false,
        run = function() error("bad point") end }
    end, "point sweep(n=1) failed")
  end)

  it("resumes from its JSON lines, re-running only what did not finish", function()
    local path = dir .. "/r.jsonl"
    local ran = {}
    local function run(p)
      ran[#ran + 1] = p.n
      if p.n == 2 and #ran == 2 then error("flaky") end
      return p.n * 10
    end
    mla.sweep { params = { { "n", { 1, 2, 3 } } }, jsonl = path, out = out, progress = false, run = run }
    ran = {}
    local r = mla.sweep { params = { { "n", { 1, 2, 3 } } }, jsonl = path, resume = true, out = out, progress = false,
      run = run }
    assert.same({ 2 }, ran)
    assert.same({ 10, 20, 30 }, r:column("value"))
    assert.is_true(r.records[1].resumed)
  end)

  it("flattens bench and compare results into metric columns", function()
    local r = mla.sweep { params = { { "n", { 1 } } }, out = out, progress = false,
      run = function()
        -- any noise converges: an empty function's spread on a busy CPU can pass 100%, and the count must be min_samples
        local b = mla.bench(function() end, { device = "cpu", min_time = 0, max_noise = math.huge })
        local c = mla.compare(mla.ones({ 2 }, "f32", "cpu"), mla.ones({ 2 }, "f32", "cpu"))
        return { k = b, check = c }
      end }
    local rec = r.records[1]
    assert.equal(10, rec.k_samples)
    assert.is_number(rec.k_median)
    assert.equal("PASS", rec.check_verdict)
  end)

  it("renames a metric that collides with a parameter", function()
    local r = mla.sweep { params = { { "n", { 7 } } }, out = out, progress = false, run = function() return { n = 1 } end }
    assert.equal(7, r.records[1].n)
    assert.equal(1, r.records[1].out_n)
  end)

  it("prints plain progress lines when not on a terminal, and a table at the end", function()
    local prog, prog_path = sink()
    mla.sweep { params = { { "n", { 1, 2 } } }, out = out, progress = false, progress_out = prog, run = function() return 1 end }
    mla.sweep { params = { { "n", { 1, 2 } } }, out = out, progress_out = prog, run = function() return 1 end }
    prog:close()
    out:flush()
    local p = read(prog_path)
    os.remove(prog_path)
    assert.truthy(p:find("[1/2] OK sweep(n=1)", 1, true))
    assert.truthy(p:find("[2/2] OK sweep(n=2)", 1, true))
    assert.truthy(read(out_path):find("2 points: 2 OK, 0 not OK", 1, true))
  end)
end)

describe("json", function()
  it("round-trips nested values, escapes and integers", function()
    local v = { a = 1, b = 2.5, s = 'q"\\\n\t\1', list = { 1, 2, { x = true } }, f = false }
    local back = json.decode(json.encode(v))
    assert.equal(1, back.a)
    assert.equal("integer", math.type(back.a))
    assert.equal(2.5, back.b)
    assert.equal(v.s, back.s)
    assert.same({ 1, 2 }, { back.list[1], back.list[2] })
    assert.is_true(back.list[3].x)
    assert.is_false(back.f)
  end)

  it("writes NaN and infinities as null and keeps the requested key order", function()
    assert.equal('{"z":1,"a":null,"b":null}', json.encode({ a = 0 / 0, b = math.huge, z = 1 }, { "z" }))
  end)

  it("rejects malformed input with a position", function()
    S.assert_error_contains(function() json.decode('{"a": 1,}') end, "expected a key at character 9")
  end)
end)
