local mla = require "mlalab"
local S = require "support"

local FIX = "spec/fixtures/npy/"
local all_dtypes = { "u8", "i8", "u16", "i16", "i32", "i64", "f16", "bf16", "f32", "f64", "e4m3", "e5m2", "ue8m0", "e2m1" }

local function tmp_path()
  local p = os.tmpname()
  os.remove(p)
  return p .. ".npy"
end

local function write_file(bytes)
  local p = tmp_path()
  local f = assert(io.open(p, "wb"))
  f:write(bytes)
  f:close()
  return p
end

local function read_file(p)
  local f = assert(io.open(p, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

--- An npy file built byte by byte: prefix for `version`, the dict text as
-- given (no padding added), then data.
local function npy_bytes(dict, data, version)
  version = version or 1
  local len = version == 1 and string.pack("<I2", #dict) or string.pack("<I4", #dict)
  return "\x93NUMPY" .. string.char(version, 0) .. len .. dict .. (data or "")
end

local function dict(descr, shape, fortran)
  return string.format("{'descr': '%s', 'fortran_order': %s, 'shape': %s, }", descr, fortran and "True" or "False", shape)
end

--- Loading the bytes fails with an error naming the file and containing `msg`.
local function assert_load_error(bytes, msg, opts)
  local p = write_file(bytes)
  local err = S.assert_error_contains(function() mla.npy.load(p, opts or { device = "cpu" }) end, msg)
  assert.truthy(err:find(p, 1, true), "error does not name the file: " .. err)
  os.remove(p)
end

local function words(n, mul, add, mod)
  local t = {}
  for i = 0, n - 1 do t[#t + 1] = (i * mul + add) % mod end
  return t
end

--- Raw bytes of a CPU tensor (little-endian words, e2m1 packed).
local function raw_bytes(t) return mla.core.tensor_bytes(t) end

describe("npy round trips", function()
  for _, dt in ipairs(all_dtypes) do
    it("saves and loads " .. dt .. " bit for bit in 1 to 8 dims", function()
      for _, shape in ipairs { { 6 }, { 3, 4 }, { 2, 1, 3, 2 }, { 2, 2, 1, 2, 1, 2, 2, 2 } } do
        local t = mla.random_bytes(shape, { dtype = dt, device = "cpu" })
        local p = tmp_path()
        mla.npy.save(p, t)
        local back = mla.npy.load(p, { as = dt, device = "cpu" })
        os.remove(p)
        assert.equal(dt, back.dtype)
        assert.same(shape, back:size())
        assert.is_true(back:equal(t), dt .. " " .. table.concat(shape, "x"))
      end
    end)
  end

  it("0-d tensors keep their shape and value", function()
    for _, dt in ipairs { "f32", "f64", "i64", "bf16", "e4m3", "u8" } do
      local t = mla.random_bytes({}, { dtype = dt, device = "cpu" })
      local p = tmp_path()
      t:save_npy(p)
      local back = mla.npy.load(p, { as = dt, device = "cpu" })
      os.remove(p)
      assert.same({}, back:size())
      assert.is_true(back:equal(t), dt)
    end
  end)

  it("zero-size tensors round-trip with their shape", function()
    local t = mla.empty({ 3, 0, 5 }, "f32", "cpu")
    local p = tmp_path()
    mla.npy.save(p, t)
    local h = mla.npy.header(p)
    assert.same({ 3, 0, 5 }, h.shape)
    assert.equal(0, h.data_bytes)
    local back = mla.npy.load(p, { device = "cpu" })
    os.remove(p)
    assert.same({ 3, 0, 5 }, back:size())
    assert.equal(0, back:numel())
  end)

  it("saving a strided view writes it in C order", function()
    local base = mla.randn({ 4, 6, 5 }, { device = "cpu" })
    local v = base:permute({ 2, 0, 1 }):narrow(1, 1, 2) -- [5, 2, 6], offset, non-contiguous
    assert.is_false(v:is_contiguous())
    local p = tmp_path()
    mla.npy.save(p, v)
    local back = mla.npy.load(p, { device = "cpu" })
    os.remove(p)
    assert.is_true(back:is_contiguous())
    assert.is_true(back:equal(v:contiguous()))
  end)

  it("e2m1 travels packed: a [2, 6] tensor is a [2, 3] '|u1' array", function()
    local t = mla.random_bytes({ 2, 6 }, { dtype = "e2m1", device = "cpu" })
    local p = tmp_path()
    mla.npy.save(p, t)
    local h = mla.npy.header(p)
    assert.equal("|u1", h.descr)
    assert.same({ 2, 3 }, h.shape)
    assert.equal(raw_bytes(t), raw_bytes(mla.npy.load(p, { device = "cpu" })))
    os.remove(p)
  end)

  it("narrow formats are written as their raw words", function()
    for dt, descr in pairs { bf16 = "<u2", e4m3 = "|u1", e5m2 = "|u1", ue8m0 = "|u1", f16 = "<f2" } do
      local t = mla.random_bytes({ 3, 4 }, { dtype = dt, device = "cpu" })
      local p = tmp_path()
      mla.npy.save(p, t)
      assert.equal(descr, mla.npy.header(p).descr)
      local s = read_file(p)
      os.remove(p)
      assert.equal(raw_bytes(t), s:sub(-#raw_bytes(t)))
    end
  end)

  it("the header is numpy's dict, padded so the data starts at a multiple of 64", function()
    local t = mla.rand({ 2, 3 }, { device = "cpu" })
    local p = tmp_path()
    mla.npy.save(p, t)
    local s = read_file(p)
    os.remove(p)
    assert.equal("\x93NUMPY\1\0", s:sub(1, 8))
    local hlen = string.unpack("<I2", s, 9)
    assert.equal(0, (10 + hlen) % 64)
    assert.equal("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", s:sub(11, 10 + 59))
    assert.equal("\n", s:sub(10 + hlen, 10 + hlen))
    assert.equal(10 + hlen + 24, #s)
  end)

  it("1-d shapes are written as (n,)", function()
    local p = tmp_path()
    mla.npy.save(p, mla.rand({ 7 }, { device = "cpu" }))
    assert.truthy(read_file(p):find("'shape': (7,), }", 1, true))
    os.remove(p)
  end)

  it("a failed save leaves no file behind", function()
    local p = tmp_path()
    S.assert_error_contains(function() mla.npy.save(p, mla.empty({ 3 }, "e2m1", "cpu")) end, "last dim must be even")
    assert.is_nil(io.open(p, "rb"))
  end)

  it("loads onto the requested device #gpu", function()
    local t = mla.randn({ 5, 7 }, { dtype = "bf16", device = "cpu" })
    local p = tmp_path()
    mla.npy.save(p, t)
    local g = mla.npy.load(p, { as = "bf16", device = "cuda" })
    os.remove(p)
    assert.equal("cuda:0", g.device)
    assert.is_true(g:equal(t))
  end)

  it("saves CUDA tensors and strided CUDA views #gpu", function()
    for _, dt in ipairs(all_dtypes) do
      local g = mla.random_bytes({ 4, 6, 8 }, { dtype = dt, device = "cuda" })
      local v = dt == "e2m1" and g:narrow(0, 1, 2) or g:permute({ 1, 0, 2 }):narrow(2, 2, 4)
      local p = tmp_path()
      mla.npy.save(p, v)
      local back = mla.npy.load(p, { as = dt, device = "cpu" })
      os.remove(p)
      assert.is_true(back:equal(v:cpu()), dt)
    end
  end)
end)

describe("npy files written by numpy", function()
  local function load(name, opts)
    if type(opts) == "string" then opts = { as = opts } end
    opts = opts or {}
    opts.device = "cpu"
    return mla.npy.load(FIX .. name, opts)
  end

  it("reads f32, f64 0-d, f16, i8, u16, i32 and bool arrays", function()
    local f = load("f32_2x3.npy")
    assert.equal("f32", f.dtype)
    assert.same({ { -1.875, -1.125, -0.375 }, { 0.375, 1.125, 1.875 } }, f:totable())
    local pi = load("f64_0d.npy")
    assert.same({}, pi:size())
    assert.equal(math.pi, pi:item())
    local h = load("f16_7.npy")
    local expect = {}
    for i, w in ipairs(words(7, 3, 1, 64)) do expect[i] = w * 0.125 - 2 end
    assert.same(expect, h:totable())
    local i8 = {}
    for i, w in ipairs(words(6, 53, 7, 256)) do i8[i] = w - 128 end
    assert.same(i8, load("i8_6.npy"):totable())
    assert.same(words(4, 40503, 999, 65536), S.values(load("u16_2x2.npy")))
    assert.same({ -2147483648, 123456789, 2147483647 }, load("i32_3.npy"):totable())
    local b = load("bool_4.npy")
    assert.equal("u8", b.dtype)
    assert.same({ 1, 0, 1, 1 }, b:totable())
  end)

  it("reads zero-size and 8-d arrays", function()
    local z = load("i64_0x5.npy")
    assert.same({ 0, 5 }, z:size())
    assert.equal("i64", z.dtype)
    local e = load("f32_8d.npy")
    assert.same({ 2, 1, 2, 1, 3, 1, 2, 2 }, e:size())
    local expect = {}
    for i = 1, 48 do expect[i] = i - 1 end
    assert.same(expect, S.values(e))
  end)

  it("reads v2.0 and v3.0 headers", function()
    assert.equal("2.0", mla.npy.header(FIX .. "v2_i16_3x4.npy").version)
    assert.equal("3.0", mla.npy.header(FIX .. "v3_u8_5.npy").version)
    local expect = {}
    for i, w in ipairs(words(12, 7919, 0, 65536)) do expect[i] = w - 32768 end
    local t = load("v2_i16_3x4.npy")
    assert.same({ 3, 4 }, t:size())
    assert.same(expect, S.values(t))
    assert.same(words(5, 37, 11, 256), load("v3_u8_5.npy"):totable())
  end)

  it("loads fortran-order arrays transposed back into C order", function()
    assert.is_true(mla.npy.header(FIX .. "fortran_f32_2x3x4.npy").fortran_order)
    local t = load("fortran_f32_2x3x4.npy")
    assert.same({ 2, 3, 4 }, t:size())
    assert.is_true(t:is_contiguous())
    for i = 0, 1 do
      for j = 0, 2 do
        for k = 0, 3 do assert.equal(100 * i + 10 * j + k, t:get({ i, j, k })) end
      end
    end
  end)

  it("reads bf16 and fp8 raw words with as=", function()
    local bf = load("bf16_words_3x5.npy", { as = "bf16" })
    assert.equal("bf16", bf.dtype)
    assert.same(S.values(load("bf16_words_3x5.npy")), S.values(bf:view("u16")))
    local f8 = load("e4m3_bytes_2x8.npy", { as = "e4m3" })
    assert.equal("e4m3", f8.dtype)
    assert.same(words(16, 73, 5, 256), S.values(f8:view("u8")))
  end)

  it("reads ml_dtypes bfloat16 ('<V2'), float8 ('<V1', '<f1') and e8m0 files with as=", function()
    assert.equal("<V2", mla.npy.header(FIX .. "ml_bf16_4x8.npy").descr)
    local bf = load("ml_bf16_4x8.npy", { as = "bf16" })
    assert.same({ 4, 8 }, bf:size())
    assert.same(words(32, 40503, 12345, 65536), S.values(bf:view("u16")))
    assert.same(words(16, 73, 5, 256), S.values(load("ml_e4m3_16.npy", "e4m3"):view("u8")))
    assert.equal("<f1", mla.npy.header(FIX .. "ml_e5m2_2x8.npy").descr)
    assert.same(words(16, 29, 3, 256), S.values(load("ml_e5m2_2x8.npy", { as = "e5m2" }):view("u8")))
    assert.same(words(6, 41, 100, 256), S.values(load("ml_e8m0_6.npy", { as = "ue8m0" }):view("u8")))
  end)

  it("reads ml_dtypes float4_e2m1fn (one code per byte) into packed e2m1", function()
    local t = load("ml_e2m1_3x3.npy", { as = "e2m1" })
    assert.equal("e2m1", t.dtype)
    assert.same({ 3, 3 }, t:size())
    local codes = words(9, 5, 1, 16)
    local expect = {}
    for i, c in ipairs(codes) do
      local v = ({ 0, 0.5, 1, 1.5, 2, 3, 4, 6 })[(c & 7) + 1]
      expect[i] = c >= 8 and -v or v
    end
    assert.same(expect, S.values(t))
  end)

  it("rejects big-endian, uint32 without as=, complex, structured and object arrays", function()
    local cases = {
      { "be_f32_3.npy", "big-endian" },
      { "u32_3.npy", "no unsigned 32-bit dtype; load the raw words with as='i32'" },
      { "c64_2.npy", "complex numbers are not supported" },
      { "struct_2.npy", "structured dtypes are not supported" },
      { "object_2.npy", "Python objects" },
      { "ml_bf16_4x8.npy", "name their format with as=" },
    }
    for _, c in ipairs(cases) do
      local err = S.assert_error_contains(function() load(c[1]) end, c[2])
      assert.truthy(err:find(c[1], 1, true), err)
    end
  end)

  it("reads uint32 words with as='i32'", function()
    assert.same({ 1, 2, 4000000000 - 2 ^ 32 }, load("u32_3.npy", { as = "i32" }):totable())
  end)
end)

describe("npy malformed files", function()
  local good = dict("<f4", "(2,)")
  local data8 = string.pack("<ff", 1.5, -2)

  it("a well-formed hand-built file loads (baseline for the cases below)", function()
    local p = write_file(npy_bytes(good, data8))
    assert.same({ 1.5, -2 }, mla.npy.load(p, { device = "cpu" }):totable())
    os.remove(p)
  end)

  it("rejects empty, short and non-npy files", function()
    assert_load_error("", "too short (0 bytes)")
    assert_load_error("\x93NUM", "too short (4 bytes)")
    assert_load_error("PK\3\4 this is a zip", "bad magic")
    assert_load_error("\x93NUMPY", "ends inside the npy version")
    assert_load_error("\x93NUMPY\1\0\5", "ends inside the npy header length")
    assert_load_error("\x93NUMPY\2\0\5\0", "ends inside the npy header length")
  end)

  it("rejects unknown format versions", function()
    assert_load_error(npy_bytes(good, data8, 4), "version 4.0 is not supported")
    local b = npy_bytes(good, data8)
    assert_load_error(b:sub(1, 7) .. "\1" .. b:sub(9), "version 1.1 is not supported")
    assert_load_error(b:sub(1, 6) .. "\0" .. b:sub(8), "version 0.0 is not supported")
  end)

  it("rejects a header longer than the file or implausibly long", function()
    assert_load_error(npy_bytes(good):sub(1, 30), "header is truncated")
    assert_load_error("\x93NUMPY\2\0" .. string.pack("<I4", 0xFFFFFFFF) .. good, "implausibly large")
  end)

  it("rejects dicts that are not numpy's", function()
    local cases = {
      { "[1, 2]", "expected '{'" },
      { "{'descr': '<f4', 'fortran_order': False}", "key 'shape' is missing" },
      { "{'fortran_order': False, 'shape': (2,)}", "key 'descr' is missing" },
      { "{'descr': '<f4', 'shape': (2,)}", "key 'fortran_order' is missing" },
      { "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}", "unexpected key 'extra'" },
      { "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", "'descr' appears twice" },
      { "{'descr' '<f4', 'fortran_order': False, 'shape': (2,)}", "expected ':'" },
      { "{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", "expected ',' or '}'" },
      { "{'descr': '<f4", "unterminated string" },
      { "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", "found the end of the header" },
      { "{'descr': '<f4', 'fortran_order': False, 'shape': (2,),", "not closed" },
      { "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk", "after the dict" },
      { "{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}", "expected ',' or '}'" },
      { "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", "True or False" },
      { "{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2,)}", "True or False" },
      { "{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", "shape must be a tuple" },
      { "{'descr': '<f4', 'fortran_order': False, 'shape': (2)}", "not a tuple" },
      { "{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}", "expected ',' or ')'" },
      { "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}", "negative dimension" },
      { "{'descr': '<f4', 'fortran_order': False, 'shape': (2.0,)}", "not a plain integer" },
      { "{'descr': '<f4', 'fortran_order': False, 'shape': (02,)}", "leading zero" },
      { "{'descr': '<f4', 'fortran_order': False, 'shape': ('2',)}", "expected a dimension" },
      { "{'descr': 'a\\'b', 'fortran_order': False, 'shape': (2,)}", "escape sequences" },
      { "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", "structured dtypes" },
      { "{'" .. string.rep("k", 40) .. "': 1}", "too long" },
    }
    for _, c in ipairs(cases) do assert_load_error(npy_bytes(c[1], data8), c[2]) end
  end)

  it("rejects shapes beyond 8 dims or 64-bit sizes", function()
    assert_load_error(npy_bytes(dict("|u1", "(1, 1, 1, 1, 1, 1, 1, 1, 1)"), "x"), "more than 8 dims")
    assert_load_error(npy_bytes(dict("|u1", "(99999999999999999999,)")), "does not fit in 64 bits")
    assert_load_error(npy_bytes(dict("|u1", "(4294967296, 4294967296)")), "element count overflows 64 bits")
    assert_load_error(npy_bytes(dict("<f8", "(1152921504606846976,)")), "item size overflows 64 bits")
  end)

  it("rejects data shorter or longer than the shape says, without allocating for a lying shape", function()
    assert_load_error(npy_bytes(good, data8:sub(1, 7)), "data is truncated: shape and descr '<f4' need 8 bytes, the file has 7")
    assert_load_error(npy_bytes(good, data8 .. "\0"), "1 unexpected bytes after the data")
    assert_load_error(npy_bytes(dict("|u1", "(1099511627776,)"), "abc"), "need 1099511627776 bytes, the file has 3")
    assert_load_error(npy_bytes(dict("|u1", "(0, 1152921504606846975)")) .. "x", "unexpected bytes")
  end)

  it("a zero-size shape with enormous dims is a clear error, not an overflow", function()
    assert_load_error(npy_bytes(dict("|u1", "(0, 4294967296, 4294967296)")), "too large to address")
  end)

  it("rejects unsupported descrs", function()
    local cases = {
      { "<c8", "complex" }, { "|O", "Python objects" }, { "<U4", "strings" }, { "|S3", "strings" },
      { "<M8", "datetimes" }, { ">f4", "big-endian" }, { ">i2", "big-endian" }, { "<f16", "items of 16 bytes" },
      { "<f3", "items of 3 bytes" }, { "|b2", "booleans have 1 byte" }, { "float32", "not a numpy type string" },
      { "<f", "not a numpy type string" }, { "", "not a numpy type string" }, { "<V2", "as=" },
      { "<u8", "no unsigned 64-bit dtype" }, { "<f1", "as=" }, { "<V3", "items of 3 bytes" },
    }
    for _, c in ipairs(cases) do assert_load_error(npy_bytes(dict(c[1], "(0,)")), c[2]) end
  end)

  it("rejects as= values that do not fit the descr", function()
    local f4 = npy_bytes(dict("<f4", "(2,)"), data8)
    assert_load_error(f4, "as='bf16' needs 2-byte words", { as = "bf16", device = "cpu" })
    assert_load_error(f4, "as='nope' is not a dtype", { as = "nope", device = "cpu" })
    assert_load_error(f4, "as='e2m1' reads bytes from a 1-byte integer or void descr", { as = "e2m1", device = "cpu" })
    assert_load_error(npy_bytes(dict("<f2", "(2,)"), "abcd"), "'<f2' holds f16 values", { as = "bf16", device = "cpu" })
    assert_load_error(npy_bytes(dict("|u1", "()"), "a"), "0-d '|u1' array", { as = "e2m1", device = "cpu" })
    assert_load_error(npy_bytes(dict("|u1", "(2, 2)", true), "abcd"), "fortran order", { as = "e2m1", device = "cpu" })
    assert_load_error(npy_bytes(dict("<V1", "(3,)"), "\1\2\17"), "byte 2 is 0x11, not a float4_e2m1fn code", { as = "e2m1", device = "cpu" })
  end)

  it("names a missing file and a directory", function()
    S.assert_error_contains(function() mla.npy.load("/nonexistent/x.npy") end, "npy.load('/nonexistent/x.npy'): cannot open")
    S.assert_error_contains(function() mla.npy.load("spec/fixtures", { device = "cpu" }) end, "npy.load('spec/fixtures')")
  end)

  it("rejects bad arguments with clear errors", function()
    S.assert_error_contains(function() mla.npy.load(nil) end, "path must be a string")
    S.assert_error_contains(function() mla.npy.load(FIX .. "f32_2x3.npy", { dtype = "bf16" }) end, "unknown option 'dtype'")
    S.assert_error_contains(function() mla.npy.load(FIX .. "f32_2x3.npy", { as = 3 }) end, "as must be a dtype name")
    S.assert_error_contains(function() mla.npy.save(tmp_path(), {}) end, "a tensor is expected")
    S.assert_error_contains(function() mla.npy.save("/nonexistent/dir/x.npy", mla.rand({ 2 }, { device = "cpu" })) end, "cannot open for writing")
    local t = mla.rand({ 2 }, { device = "cpu" })
    t:close()
    S.assert_error_contains(function() mla.npy.save(tmp_path(), t) end, "closed tensor")
  end)

  it("accepts what numpy's reader accepts: double quotes, any key order, spacing, 'L' suffixes", function()
    local d = "{ \"shape\" : ( 2L , ) ,\"fortran_order\":False,\n'descr':\"<f4\"}  \n"
    local p = write_file(npy_bytes(d, data8))
    assert.same({ 1.5, -2 }, mla.npy.load(p, { device = "cpu" }):totable())
    os.remove(p)
  end)
end)

describe("npy fuzz regressions", function()
  -- Inputs libFuzzer found (fuzz/npy_fuzz.c); each must stay a clear error.
  local dir = FIX .. "fuzz/"
  local cases = dofile(dir .. "cases.lua")
  for _, c in ipairs(cases) do
    it(c.file .. " is rejected with '" .. c.error .. "'", function()
      local err = S.assert_error_contains(function() mla.npy.load(dir .. c.file, { as = c.as, device = "cpu" }) end, c.error)
      assert.truthy(err:find(c.file, 1, true), err)
    end)
  end
end)
