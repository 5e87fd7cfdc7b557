-- Strided copies between any two views on any devices, checked byte for byte
-- against a Lua model of the storages: the expected destination bytes are
-- computed here from the source bytes, the views' sizes/strides/offsets and
-- (for converting copies) the reference conversions of spec/dtype_ref.lua.
local mla = require "mlalab"
local S = require "support"
local R = require "dtype_ref"

local core = mla.core
local BITS = { u8 = 8, i8 = 8, u16 = 16, i16 = 16, i32 = 32, i64 = 64, f16 = 16, bf16 = 16, f32 = 32, f64 = 64,
  e4m3 = 8, e5m2 = 8, ue8m0 = 8, e2m1 = 4 }

-- Storages as Lua byte arrays ---------------------------------------------------

local rng_state = 0x9E3779B97F4A7C15
local function random_bytes(n)
  local b = {}
  for i = 1, n do
    rng_state = rng_state ~ (rng_state << 13); rng_state = rng_state ~ (rng_state >> 7); rng_state = rng_state ~ (rng_state << 17)
    b[i] = (rng_state >> 24) & 0xFF
  end
  return b
end

local function to_string(bytes)
  local parts = {}
  for i = 1, #bytes, 4096 do parts[#parts + 1] = string.char(table.unpack(bytes, i, math.min(i + 4095, #bytes))) end
  return table.concat(parts)
end

local function to_array(s)
  local b = {}
  for i = 1, #s, 4096 do
    local chunk = { s:byte(i, math.min(i + 4095, #s)) }
    for k = 1, #chunk do b[i + k - 1] = chunk[k] end
  end
  return b
end

--- A u8 tensor holding `bytes` on `device` (the storage every view below is cut from).
local function storage(bytes, device) return core.tensor_from_bytes(to_string(bytes), "u8", { #bytes }, device) end
local function storage_bytes(t) return core.tensor_bytes(t) end

local function read_raw(bytes, dt, e)
  local bits = BITS[dt]
  if bits == 4 then
    local b = bytes[e // 2 + 1]
    return e % 2 == 0 and (b & 15) or (b >> 4)
  end
  local n, v = bits // 8, 0
  for k = n - 1, 0, -1 do v = (v << 8) | bytes[e * n + k + 1] end
  return v
end

local function write_raw(bytes, dt, e, v)
  local bits = BITS[dt]
  if bits == 4 then
    local i = e // 2 + 1
    bytes[i] = e % 2 == 0 and ((bytes[i] & 0xF0) | v) or ((bytes[i] & 0x0F) | (v << 4))
    return
  end
  local n = bits // 8
  for k = 0, n - 1 do bytes[e * n + k + 1] = (v >> (8 * k)) & 0xFF end
end

-- Values of raw words, for converting copies ------------------------------------

local function trunc_sat(v, lo, hi)
  if v ~= v then return 0 end
  v = math.max(lo, math.min(hi, v))
  return math.tointeger(v < 0 and math.ceil(v) or math.floor(v))
end

local decode = {
  u8 = function(r) return r end,
  i32 = function(r) return r >= 0x80000000 and r - 0x100000000 or r end,
  f32 = function(r) return (string.unpack("<f", string.pack("<I4", r))) end,
  f64 = function(r) return (string.unpack("<d", string.pack("<i8", r))) end,
}
for _, f in ipairs { "bf16", "f16", "e4m3", "e5m2", "e2m1", "ue8m0" } do decode[f] = function(r) return R.decode(f, r) end end

local encode = {
  u8 = function(v) return trunc_sat(v, 0, 255) end,
  i32 = function(v) return trunc_sat(v, -2147483648, 2147483647) & 0xFFFFFFFF end,
  f64 = function(v) return v ~= v and 0x7FFFFFFFFFFFFFFF or (string.unpack("<i8", string.pack("<d", v))) end,
  f32 = function(v) return v ~= v and 0x7FFFFFFF or (string.unpack("<I4", string.pack("<f", v))) end, -- exact sources only
  ue8m0 = function(v) return R.encode_ue8m0(v, true, true) end,
}
for _, f in ipairs { "bf16", "f16", "e4m3", "e5m2", "e2m1" } do encode[f] = function(v) return R.encode(f, v, true) end end

--- Row-major walk over every index of `sizes`.
local function each_index(sizes, fn)
  local n = 1
  for _, s in ipairs(sizes) do n = n * s end
  local idx = {}
  for d = 1, #sizes do idx[d] = 0 end
  for _ = 1, n do
    fn(idx)
    for d = #sizes, 1, -1 do
      idx[d] = idx[d] + 1
      if idx[d] < sizes[d] then break end
      idx[d] = 0
    end
  end
end

local function elem(v, idx)
  local e = v.offset
  for d = 1, #idx do e = e + idx[d] * v.strides[d] end
  return e
end

local function desc(t) return { dtype = t.dtype, sizes = t:size(), strides = t:stride(), offset = t:offset() } end

--- Expected destination storage after dst:copy(src), from the storages' bytes.
local function model_copy(dst_bytes, dv, src_bytes, sv)
  local same = dv.dtype == sv.dtype
  local out = {}
  for i = 1, #dst_bytes do out[i] = dst_bytes[i] end
  -- the source is read in full before any write (overlapping views included)
  local vals = {}
  each_index(sv.sizes, function(idx) vals[#vals + 1] = read_raw(src_bytes, sv.dtype, elem(sv, idx)) end)
  local k = 0
  each_index(dv.sizes, function(idx)
    k = k + 1
    local r = vals[k]
    if not same then r = encode[dv.dtype](decode[sv.dtype](r)) end
    write_raw(out, dv.dtype, elem(dv, idx), r)
  end)
  return to_string(out)
end

--- Copies src_view into dst_view, each cut by a function from a fresh random
-- storage of the given byte size on its device, and compares the whole
-- destination storage with the model (bytes outside the view must not change).
local function check_copy(c, src_dev, dst_dev)
  local sb, db = random_bytes(c.src_bytes), random_bytes(c.dst_bytes)
  local ss, ds = storage(sb, src_dev), storage(db, dst_dev)
  local sv, dv = c.src(ss:view(c.src_dtype)), c.dst(ds:view(c.dst_dtype or c.src_dtype))
  if c.strided ~= false then assert.is_false(sv:is_contiguous() and dv:is_contiguous() and sv:offset() == 0 and dv:offset() == 0, c.name .. ": nothing strided") end
  dv:copy(sv)
  local want = model_copy(db, desc(dv), sb, desc(sv))
  local got = storage_bytes(ds)
  if want ~= got then
    for i = 1, #want do
      if want:byte(i) ~= got:byte(i) then
        error(string.format("%s (%s -> %s): storage byte %d is %02x, expected %02x", c.name, src_dev, dst_dev, i - 1, got:byte(i), want:byte(i)), 2)
      end
    end
  end
  return true
end

-- Same-dtype cases: each has a source view and a destination view of one shape.
local cases = {
  { name = "u8 permuted -> contiguous", src_dtype = "u8", src_bytes = 120, dst_bytes = 120,
    src = function(b) return b:view({ 4, 5, 6 }):permute({ 2, 0, 1 }) end, dst = function(b) return b:view({ 6, 4, 5 }) end },
  { name = "bf16 narrowed with offsets -> narrowed", src_dtype = "bf16", src_bytes = 160, dst_bytes = 126,
    src = function(b) return b:view({ 8, 10 }):narrow(0, 2, 5):narrow(1, 3, 6) end,
    dst = function(b) return b:view({ 7, 9 }):narrow(0, 1, 5):narrow(1, 2, 6) end },
  { name = "f32 as_strided with gaps -> column-major as_strided", src_dtype = "f32", src_bytes = 256, dst_bytes = 128,
    src = function(b) return b:as_strided({ 3, 4 }, { 10, 2 }, 7) end, dst = function(b) return b:as_strided({ 3, 4 }, { 1, 3 }, 5) end },
  { name = "i64 select + transpose -> contiguous", src_dtype = "i64", src_bytes = 480, dst_bytes = 120,
    src = function(b) return b:view({ 3, 4, 5 }):select(1, 2):transpose(0, 1) end, dst = function(b) return b:view({ 5, 3 }) end },
  { name = "u8 rows of 13 bytes at odd offsets", src_dtype = "u8", src_bytes = 288, dst_bytes = 100,
    src = function(b) return b:view({ 6, 48 }):narrow(1, 3, 13) end, dst = function(b) return b:narrow(0, 1, 78):view({ 6, 13 }) end },
  { name = "u8 16-byte aligned rows (vector path)", src_dtype = "u8", src_bytes = 640, dst_bytes = 512,
    src = function(b) return b:view({ 10, 64 }):narrow(1, 16, 32) end, dst = function(b) return b:view({ 8, 64 }):narrow(0, 1, 5):view({ 10, 32 }) end,
    strided = true },
  { name = "f16 rows of 6 bytes (2-byte path)", src_dtype = "f16", src_bytes = 240, dst_bytes = 240,
    src = function(b) return b:view({ 8, 15 }):narrow(1, 1, 3) end, dst = function(b) return b:view({ 15, 8 }):narrow(0, 2, 8):narrow(1, 4, 3) end },
  { name = "f32 broadcast source (stride 0)", src_dtype = "f32", src_bytes = 64, dst_bytes = 80,
    src = function(b) return b:as_strided({ 4, 5 }, { 0, 1 }, 3) end, dst = function(b) return b:view({ 4, 5 }) end },
  { name = "8-d permuted u16", src_dtype = "u16", src_bytes = 2 * 256, dst_bytes = 2 * 256,
    src = function(b) return b:view({ 2, 2, 2, 2, 2, 2, 2, 2 }):permute({ 7, 3, 0, 5, 1, 6, 2, 4 }) end,
    dst = function(b) return b:view({ 2, 2, 2, 2, 2, 2, 2, 2 }) end },
  { name = "e2m1 at an odd nibble -> contiguous", src_dtype = "e2m1", src_bytes = 20, dst_bytes = 10,
    src = function(b) return b:view({ 4, 10 }):narrow(1, 1, 5) end, dst = function(b) return b:view({ 4, 5 }) end },
  { name = "e2m1 whole bytes, strided rows", src_dtype = "e2m1", src_bytes = 24, dst_bytes = 24,
    src = function(b) return b:view({ 6, 8 }):narrow(1, 2, 4) end, dst = function(b) return b:view({ 4, 12 }):narrow(0, 1, 2):view({ 6, 4 }) end },
}

-- Converting cases: random bit patterns (NaN, inf, huge, tiny included).
local convert_cases = {
  { name = "f32 strided -> bf16 strided", src_dtype = "f32", dst_dtype = "bf16", src_bytes = 4 * 60, dst_bytes = 2 * 80,
    src = function(b) return b:view({ 6, 10 }):transpose(0, 1):narrow(0, 2, 7) end, dst = function(b) return b:view({ 8, 10 }):narrow(0, 1, 7):narrow(1, 2, 6) end },
  { name = "bf16 -> f32", src_dtype = "bf16", dst_dtype = "f32", src_bytes = 2 * 48, dst_bytes = 4 * 48,
    src = function(b) return b:view({ 4, 12 }):permute({ 1, 0 }) end, dst = function(b) return b:view({ 12, 4 }) end },
  { name = "f32 -> e4m3 (satfinite)", src_dtype = "f32", dst_dtype = "e4m3", src_bytes = 4 * 64, dst_bytes = 64,
    src = function(b) return b:view({ 8, 8 }):transpose(0, 1) end, dst = function(b) return b:view({ 8, 8 }) end },
  { name = "i32 -> f64", src_dtype = "i32", dst_dtype = "f64", src_bytes = 4 * 30, dst_bytes = 8 * 40,
    src = function(b) return b:view({ 5, 6 }):narrow(1, 1, 4) end, dst = function(b) return b:view({ 8, 5 }):narrow(0, 2, 5):narrow(1, 0, 4) end },
  { name = "f64 -> i32 (truncate, saturate, NaN -> 0)", src_dtype = "f64", dst_dtype = "i32", src_bytes = 8 * 24, dst_bytes = 4 * 24,
    src = function(b) return b:view({ 4, 6 }):transpose(0, 1) end, dst = function(b) return b:view({ 6, 4 }) end },
  { name = "u8 -> f16", src_dtype = "u8", dst_dtype = "f16", src_bytes = 50, dst_bytes = 2 * 50,
    src = function(b) return b:view({ 5, 10 }) end, dst = function(b) return b:view({ 10, 5 }):transpose(0, 1) end },
  { name = "e4m3 -> bf16", src_dtype = "e4m3", dst_dtype = "bf16", src_bytes = 64, dst_bytes = 2 * 64,
    src = function(b) return b:view({ 4, 16 }):narrow(1, 4, 8) end, dst = function(b) return b:view({ 8, 8 }):narrow(0, 0, 4) end },
  { name = "f32 -> e2m1 (contiguous even rows)", src_dtype = "f32", dst_dtype = "e2m1", src_bytes = 4 * 48, dst_bytes = 24,
    src = function(b) return b:view({ 8, 6 }):transpose(0, 1) end, dst = function(b) return b:view({ 6, 8 }) end },
  { name = "bf16 -> ue8m0 (round up)", src_dtype = "bf16", dst_dtype = "ue8m0", src_bytes = 2 * 40, dst_bytes = 40,
    src = function(b) return b:view({ 5, 8 }):transpose(0, 1) end, dst = function(b) return b:view({ 8, 5 }) end },
}

local function run_cases(list, src_dev, dst_dev)
  for _, c in ipairs(list) do check_copy(c, src_dev, dst_dev) end
end

describe("strided copies cpu -> cpu", function()
  for _, c in ipairs(cases) do
    it(c.name, function() assert.is_true(check_copy(c, "cpu", "cpu")) end)
  end
  for _, c in ipairs(convert_cases) do
    it("converting: " .. c.name, function() assert.is_true(check_copy(c, "cpu", "cpu")) end)
  end
end)

for _, dir in ipairs { { "cpu", "cuda" }, { "cuda", "cpu" }, { "cuda", "cuda" } } do
  describe(string.format("strided copies %s -> %s #gpu", dir[1], dir[2]), function()
    it("every same-dtype case", function() run_cases(cases, dir[1], dir[2]) end)
    it("every converting case", function() run_cases(convert_cases, dir[1], dir[2]) end)
  end)
end

describe("overlapping copies", function()
  for _, dev in ipairs { "cpu", "cuda" } do
    local tag = dev == "cuda" and " #gpu" or ""
    it("read the whole source before writing, on " .. dev .. tag, function()
      -- both views come from one storage: the model reads and writes the same bytes
      local sb = random_bytes(4 * 36)
      local st = storage(sb, dev)
      local m = st:view("f32"):view({ 6, 6 })
      m:copy(m:transpose(0, 1))
      assert.equal(model_copy(sb, desc(m), sb, desc(m:transpose(0, 1))), storage_bytes(st), "in-place transpose")
      sb = random_bytes(2 * 50)
      st = storage(sb, dev)
      local g = st:view("i16"):view({ 5, 10 })
      local dv, sv = g:narrow(1, 1, 9), g:narrow(1, 0, 9)
      dv:copy(sv)
      assert.equal(model_copy(sb, desc(dv), sb, desc(sv)), storage_bytes(st), "columns shifted right")
    end)
  end

  it("copying a view onto itself changes nothing", function()
    local t = mla.randn({ 4, 5 }, { device = "cpu" })
    local before = core.tensor_bytes(t)
    t:copy(t)
    assert.equal(before, core.tensor_bytes(t))
  end)
end)

-- The cross-layer carve: one allocation per block holds every layer -----------------

describe("cross-layer caches", function()
  local NB, L, PAGE = 5, 4, 1312 -- 2 tokens x 656 B per page

  local function layer_roundtrip(dev)
    local bytes = random_bytes(NB * L * PAGE)
    local st = storage(bytes, dev)
    local cache = st:view({ NB, L, PAGE })
    for l = 0, L - 1 do
      local layer = cache:select(1, l)
      assert.is_false(layer:is_contiguous())
      assert.equal(L * PAGE, layer:stride(0))
      assert.equal(l * PAGE, layer:offset())
      local out = mla.empty({ NB, PAGE }, "u8", dev)
      out:copy(layer)
      local want = {}
      for b = 0, NB - 1 do
        local first = (b * L + l) * PAGE
        want[#want + 1] = to_string({ table.unpack(bytes, first + 1, first + PAGE) })
      end
      assert.equal(table.concat(want), core.tensor_bytes(out), "layer " .. l)
    end
    -- writing one layer back leaves every other layer byte for byte
    local fresh = random_bytes(NB * PAGE)
    cache:select(1, 2):copy(storage(fresh, dev):view({ NB, PAGE }))
    local expect = {}
    for i = 1, #bytes do expect[i] = bytes[i] end
    for b = 0, NB - 1 do
      for k = 1, PAGE do expect[(b * L + 2) * PAGE + k] = fresh[b * PAGE + k] end
    end
    assert.equal(to_string(expect), storage_bytes(st))
  end

  it("a per-layer view of a block-major u8 cache copies into a contiguous tensor and back", function()
    layer_roundtrip("cpu")
  end)

  it("the same on cuda #gpu", function() layer_roundtrip("cuda") end)

  it("a bf16 [blocks, layers, block_size, 576] cache: layer views equal the pages of that layer", function()
    for _, dev in ipairs(S.devices()) do
      local nb, nl, bs = 3, 3, 16
      local cache = mla.randn({ nb, nl, bs, 576 }, { dtype = "bf16", device = dev })
      local cpu = cache:cpu()
      for l = 0, nl - 1 do
        local v = cache:select(1, l)
        assert.same({ nl * bs * 576, 576, 1 }, v:stride())
        local c = v:contiguous()
        for _, p in ipairs { { 0, 0, 0 }, { nb - 1, bs - 1, 575 }, { 1, 7, 300 } } do
          assert.equal(cpu:get({ p[1], l, p[2], p[3] }), c:get(p), dev .. " layer " .. l)
        end
        assert.is_true(c:equal(cpu:select(1, l)), dev .. " layer " .. l)
      end
    end
  end)
end)
