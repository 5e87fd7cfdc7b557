-- Quantization through the CPU reference, bit-exact against an independent
-- model of the upstream quantizers (spec/layout_model.lua), and the
-- round-trip and edge-case behaviour layout_desc.h promises.
local mla = require "mlalab"
local S = require "support"
local M = require "layout_model"
local core = mla.core

-- The CPU reference is the subject here: tensors default to the host even on
-- a GPU machine (GPU cases name their device).
local prev_device
setup(function() prev_device = mla.device(); mla.set_device("cpu") end)
teardown(function() mla.set_device(prev_device) end)

local BS = 4
local ALL = { "bf16", "fp8_pertensor", "fp8_ds_mla", "fp8_ds_mla_amax", "fp8_v4", "fp8_v4_vllm", "indexer_fp8",
  "indexer_fp8_ue8m0", "fp4_v41", "fp8_v41" }
local TENSOR_SCALE = 0.375 -- not a power of two on purpose

-- pages with a page stride one page_align larger than needed (never block_size x row)
local function pages_for(L, n)
  local pb = L:page_bytes(BS)
  return mla.zeros({ n or 3, pb + L.page_align }, "u8"):narrow(1, 0, pb)
end

local function scale_tensor(L) return L:has_tensor_scale() and mla.tensor({ TENSOR_SCALE }, "f32") or nil end

local function write(L, pages, x, slots)
  mla.layout_ref.write(L, pages, x, mla.tensor(slots, "i64"), { block_size = BS, tensor_scale = scale_tensor(L) })
end
local function read(L, pages, slots)
  return mla.layout_ref.read(L, pages, mla.tensor(slots, "i64"), { block_size = BS, tensor_scale = scale_tensor(L) })
end

-- Rows of bf16-valued inputs (FlashMLA quantizes bf16 caches) with tiles of
-- very different magnitudes, an all-zero tile, spikes and negative zeros.
local function inputs(dim, n, seed)
  mla.manual_seed(seed)
  local x = mla.randn({ n, dim }):to("bf16"):to("f32")
  local mags = { 1e-3, 0.02, 1, 7, 300, 3e4 }
  for r = 0, n - 1 do
    for d = 0, dim - 1 do
      local tile = r % 2 == 0 and d // 16 or d // 128 -- odd rows: whole groups of one magnitude
      local v = x:get({ r, d }) * mags[(r + tile) % #mags + 1]
      if (r + tile) % 5 == 0 then v = 0 end
      if d == 37 and r % 2 == 0 then v = -0.0 end
      if d == 70 and r % 3 == 1 then v = 5000 end
      x:set({ r, d }, M.bf16(v))
    end
  end
  return x
end

local function row_of(x, r)
  local a = {}
  for d = 0, x:size(1) - 1 do a[d] = x:get({ r, d }) end
  return a
end

-- The whole page buffer the model expects after writing rows to slots.
local function expected_pages(name, L, pages, x, slots)
  local stride, pb = pages:stride(0), L:page_bytes(BS)
  local buf = {}
  local total = (pages:size(0) - 1) * stride + pb
  for i = 1, total do buf[i] = 0 end
  for r, slot in ipairs(slots) do
    if slot >= 0 then
      local rows = M.formats[name](row_of(x, r - 1), { tensor_scale = TENSOR_SCALE })
      local offs = M.row_offset[name](slot % BS, BS)
      for k, bytes in ipairs(rows) do
        local base = (slot // BS) * stride + offs[k]
        for i = 1, #bytes do buf[base + i] = bytes:byte(i) end
      end
    end
  end
  return buf, total
end

local function assert_bytes_equal(name, got, want, total)
  for i = 1, total do
    if got:byte(i) ~= want[i] then
      error(string.format("%s: byte %d of the cache is 0x%02x, the upstream formula gives 0x%02x", name, i - 1, got:byte(i), want[i]), 2)
    end
  end
end

-- All bytes of the view's storage span, as a string.
local function storage_bytes(pages)
  local lo, hi = pages:byte_range()
  return core.tensor_bytes(pages:as_strided({ hi - lo }, { 1 }, lo))
end

describe("bytes identical to the upstream quantizers", function()
  local slots = { 0, 5, 11, -1, 2, 7 }
  for _, name in ipairs(ALL) do
    it(name .. " writes the formula's bytes for bf16-valued rows, and nothing else", function()
      local L = mla.layout.get(name)
      local pages = pages_for(L)
      local x = inputs(L.dim, #slots, 1000 + #name)
      write(L, pages, x, slots)
      local want, total = expected_pages(name, L, pages, x, slots)
      assert_bytes_equal(name, storage_bytes(pages), want, total)
    end)
  end
end)

-- Decoders of stored scales and elements, from the model (not src/dtype.c).
local function decode_scale(dt, s, off)
  if dt == "f32" then return (string.unpack("<f", s, off + 1)) end
  if dt == "bf16" then return (string.unpack("<f", string.pack("<I4", string.unpack("<I2", s, off + 1) << 16))) end
  if dt == "ue8m0" then local b = s:byte(off + 1); return b == 255 and 0 / 0 or 2.0 ^ (b - 127) end
  return M.e4m3_value(s:byte(off + 1))
end
local function decode_elem(dt, s, off, e)
  if dt == "e4m3" then return M.e4m3_value(s:byte(off + e + 1)) end
  if dt == "e2m1" then return M.e2m1_value(s:byte(off + e // 2 + 1) >> (4 * (e % 2))) end
  if dt == "bf16" then return (string.unpack("<f", string.pack("<I4", string.unpack("<I2", s, off + 2 * e + 1) << 16))) end
  error("no decoder for " .. dt)
end

-- For every dim of a slot: the stored code's value and the scale it is multiplied by.
local function codes_and_scales(L, bytes, stride, slot)
  local d = core.layout_unpack(L:packed(BS))
  local base = (slot // BS) * stride
  local t = slot % BS
  local function row(r) return base + d.region_off[r + 1] + t * d.region_row_bytes[r + 1] end
  local q, s, dts = {}, {}, {}
  for _, f in ipairs(d.fields) do
    if f.role == "data" then
      for e = 0, f.count - 1 do
        local dim = f.dim_lo + e
        q[dim] = decode_elem(f.dtype, bytes, row(f.region) + f.byte_off, e)
        dts[dim] = f.dtype
        if f.scale_kind == "group" then
          s[dim] = decode_scale(f.scale_dtype, bytes, row(f.scale_region) + f.scale_off + (e // f.group) * (f.scale_dtype == "f32" and 4 or f.scale_dtype == "bf16" and 2 or 1))
        elseif f.scale_kind == "tensor" then s[dim] = M.f32(TENSOR_SCALE)
        else s[dim] = 1 end
      end
    end
  end
  return q, s, dts
end

-- Half the spacing of the element grid around |y| (y in code units).
local function half_step(dt, y)
  y = math.abs(y)
  if dt == "e4m3" then return y < 2 ^ -6 and 2 ^ -10 or 2.0 ^ (math.floor(math.log(y, 2)) - 4) end
  if dt == "e2m1" then return y < 2 and 0.25 or y < 4 and 0.5 or 1 end
  if dt == "bf16" then return y == 0 and 0 or 2.0 ^ (math.floor(math.log(y, 2)) - 8) end
  error(dt)
end

describe("dequantization", function()
  local slots = { 6, 1, 9 }
  for _, name in ipairs(ALL) do
    it(name .. " reads exactly decode(q) x decode(scale) in fp32", function()
      local L = mla.layout.get(name)
      local pages = pages_for(L)
      local x = inputs(L.dim, #slots, 77)
      write(L, pages, x, slots)
      local y = read(L, pages, slots)
      local bytes = storage_bytes(pages)
      for r, slot in ipairs(slots) do
        local q, s, dts = codes_and_scales(L, bytes, pages:stride(0), slot)
        for dim = 0, L.dim - 1 do
          local want = dts[dim] == "bf16" and s[dim] == 1 and q[dim] or M.f32(q[dim] * s[dim])
          local got = y:get({ r - 1, dim })
          assert(got == want or (got ~= got and want ~= want),
            string.format("%s slot %d dim %d: read %.9g, decode gives %.9g", name, slot, dim, got, want))
        end
      end
    end)

    it(name .. " round-trips every value within half a quantization step", function()
      local L = mla.layout.get(name)
      local pages = pages_for(L)
      mla.manual_seed(4242)
      local x = mla.randn({ #slots, L.dim }, { std = 3 })
      for d = 0, L.dim - 1 do x:set({ 1, d }, x:get({ 1, d }) * 1e-3) end -- a row of small values
      write(L, pages, x, slots)
      local y = read(L, pages, slots)
      local bytes = storage_bytes(pages)
      local worst = 0
      for r, slot in ipairs(slots) do
        local _, s, dts = codes_and_scales(L, bytes, pages:stride(0), slot)
        for dim = 0, L.dim - 1 do
          local xv, yv = x:get({ r - 1, dim }), y:get({ r - 1, dim })
          local bound = half_step(dts[dim], xv / s[dim]) * s[dim] * (1 + 2 ^ -20) + math.abs(yv) * 2 ^ -23
          local err = math.abs(xv - yv)
          assert(err <= bound, string.format("%s dim %d: |%.9g - %.9g| = %.3g above half a step %.3g", name, dim, xv, yv, err, bound))
          worst = math.max(worst, bound > 0 and err / bound or 0)
        end
      end
      assert.is_true(worst > 0.05, "the inputs never exercised rounding") -- the check measured something
    end)
  end
end)

-- One token written to slot 1 of a fresh page: its region rows as byte
-- strings, and the dequantized row.
local function one(name, values, opts)
  opts = opts or {}
  local L = type(name) == "string" and mla.layout.get(name) or name
  local pages = pages_for(L, 1)
  local x = mla.zeros({ 1, L.dim })
  for d, v in pairs(values) do x:set({ 0, d }, v) end
  local ts = opts.tensor_scale and mla.tensor({ opts.tensor_scale }, "f32") or scale_tensor(L)
  mla.layout_ref.write(L, pages, x, mla.tensor({ 1 }, "i64"), { block_size = BS, tensor_scale = ts })
  local y = mla.layout_ref.read(L, pages, mla.tensor({ 1 }, "i64"), { block_size = BS, tensor_scale = ts })
  local bytes, d = storage_bytes(pages), L:desc(BS)
  local rows = {}
  for r = 1, d.nregions do
    local lo = d.region_off[r] + d.region_row_bytes[r]
    rows[r] = bytes:sub(lo + 1, lo + d.region_row_bytes[r])
  end
  local out = {}
  for i = 0, L.dim - 1 do out[i] = y:get({ 0, i }) end
  return rows, out
end

local function hex(s, i, j) return (s:sub(i + 1, j):gsub(".", function(c) return string.format("%02x", c:byte()) end)) end
local function is_negzero(v) return v == 0 and 1 / v < 0 end

describe("hand-computed bytes", function()
  it("fp8_ds_mla: scales 2^ceil(log2(max(a/448, 1e-4))) as f32 at 512, codes RNE, bf16 RoPE at 528", function()
    -- tile 0: a = 3.5 -> s = 2^-7; tile 1: zero -> 2^-13; tile 2: a = 1000 -> s = 4, 250 -> 256;
    -- tile 3: a = 0.04 < 0.0448 -> 2^-13, 0.04 * 8192 = 327.68 -> 320
    local rows, y = one("fp8_ds_mla", { [0] = 3.5, [1] = 1.0, [2] = -0.5, [256] = 1000, [384] = 0.04, [512] = 1.5 })
    local r = rows[1]
    assert.equal("7e70e8", hex(r, 0, 3))
    assert.equal("78", hex(r, 256, 257))
    assert.equal("7a", hex(r, 384, 385))
    assert.equal("0000003c" .. "00000039" .. "00008040" .. "00000039", hex(r, 512, 528))
    assert.equal("c03f", hex(r, 528, 530))
    assert.same({ 3.5, 1.0, -0.5, 1024, 320 * 2 ^ -13, 1.5 }, { y[0], y[1], y[2], y[256], y[384], y[512] })
  end)

  it("fp8_ds_mla_amax: raw f32 scale a/448, FLT_MIN for an all-zero tile", function()
    local rows = one("fp8_ds_mla_amax", { [0] = 3.0 })
    assert.equal(hex(string.pack("<f", 3.0 / 448), 0, 4), hex(rows[1], 512, 516))
    assert.equal("00008000", hex(rows[1], 516, 520)) -- 2^-126
    assert.equal("7e", hex(rows[1], 0, 1)) -- 3 / (3/448) rounds to 448
  end)

  it("fp8_v4: ue8m0 scale bytes in the page tail, zero pad byte, floor 2^-13 (vLLM: 2^-22)", function()
    local vals = { [0] = 3.5, [1] = 1.0, [2] = -0.5, [128] = 1000, [448] = 1.5 }
    local rows, y = one("fp8_v4", vals)
    assert.equal("7e70e8", hex(rows[1], 0, 3))
    assert.equal("78", hex(rows[1], 128, 129))
    assert.equal("c03f", hex(rows[1], 448, 450))
    assert.equal("78" .. "72" .. "81" .. "72727272" .. "00", hex(rows[2], 0, 8))
    assert.same({ 3.5, 1.0, -0.5, 1024, 1.5 }, { y[0], y[1], y[2], y[128], y[448] })
    local vrows = one("fp8_v4_vllm", vals)
    assert.equal("78" .. "69" .. "81" .. "69696969" .. "00", hex(vrows[2], 0, 8))
    assert.equal(rows[1], vrows[1]) -- both writers agree on tiles with a >= 0.0448
  end)

  it("indexer_fp8: f32 scale max(a, 1e-4)/448 after the data rows; ue8m0 option rounds it up to a power of two", function()
    local rows = one("indexer_fp8", { [0] = 448, [1] = -1, [2] = 300 }) -- s = 1; 300 is nearer 288 than 320
    assert.equal("7eb879", hex(rows[1], 0, 3))
    assert.equal("0000803f", hex(rows[2], 0, 4))
    rows = one("indexer_fp8", {}) -- all zero: s = f32(f32(1e-4) / 448)
    assert.equal(hex(string.pack("<f", M.f32(M.f32(1e-4) / 448)), 0, 4), hex(rows[2], 0, 4))
    rows = one("indexer_fp8_ue8m0", { [0] = 300, [1] = 0.25 }) -- 300/448 -> 1.0; 0.25 = 2^-2 -> 0x28
    assert.equal("7928", hex(rows[1], 0, 2))
    assert.equal("0000803f", hex(rows[2], 0, 4))
    rows = one("indexer_fp8", { [0] = 300 }) -- raw scale 300/448: 300 / s rounds to 448
    assert.equal(hex(string.pack("<f", 300 / 448), 0, 4), hex(rows[2], 0, 4))
    assert.equal("7e", hex(rows[1], 0, 1))
  end)

  it("fp4_v41: e4m3 scale clamp(a/6, 2^-9, 448) per 16, e2m1 codes with the even dim in the low nibble", function()
    -- group 0: a = 6 -> s = 1 (0x38): 6, 1, -0.5, 3.2 -> codes 7, 2, 9, 5
    -- group 1: zero -> s = 2^-9 (0x01); group 2: a = 0.3 -> 0.05 -> e4m3 1.625 x 2^-5 (0x15):
    --   0.3 / 0.05078125 = 5.9 -> 6 (7), 0.1 / 0.05078125 = 1.97 -> 2 (4)
    local rows, y = one("fp4_v41", { [0] = 6, [1] = 1, [2] = -0.5, [3] = 3.2, [32] = 0.3, [33] = 0.1 })
    assert.equal("2759", hex(rows[1], 0, 2))
    assert.equal("47", hex(rows[1], 16, 17))
    assert.equal("380115", hex(rows[2], 0, 3))
    assert.same({ 6, 1, -0.5, 3, 6 * 0.05078125, 2 * 0.05078125 }, { y[0], y[1], y[2], y[3], y[32], y[33] })
  end)

  it("fp8_pertensor: q = e4m3(x / s_t), ties to even, saturating at 448", function()
    -- s_t = 0.5: 100 -> 200, halfway between 192 and 208 -> 192 (even); 300 -> 600 -> 448; -0 -> 0x80
    local rows, y = one("fp8_pertensor", { [0] = 100, [1] = 300, [2] = -0.0, [3] = -1e6, [512] = 0.25 }, { tensor_scale = 0.5 })
    assert.equal("747e80fe", hex(rows[1], 0, 4))
    assert.equal("30", hex(rows[1], 512, 513)) -- RoPE under the same scale: 0.25 / 0.5 = 0.5 -> 0x30
    assert.same({ 96, 224, -224, 0.25 }, { y[0], y[1], y[3], y[512] })
    assert.is_true(is_negzero(y[2]))
  end)

  it("bf16: round to nearest even", function()
    local rows = one("bf16", { [0] = 1.5, [1] = 1 + 2 ^ -8, [2] = 1 + 3 * 2 ^ -8, [575] = -2 })
    assert.equal("c03f" .. "803f" .. "823f", hex(rows[1], 0, 6))
    assert.equal("00c0", hex(rows[1], 1150, 1152))
  end)
end)

describe("edge cases", function()
  it("all-zero groups store the eps floor and read back as +0", function()
    local floors = { fp8_ds_mla = { 512, "00000039" }, fp8_ds_mla_amax = { 512, "00008000" } }
    for name, want in pairs(floors) do
      local rows, y = one(name, {})
      assert.equal(string.rep(want[2], 4), hex(rows[1], want[1], want[1] + 16), name)
      assert.equal(string.rep("00", 512), hex(rows[1], 0, 512), name)
      for i = 0, 575 do assert.is_true(y[i] == 0 and 1 / y[i] > 0, name) end
    end
    local rows = one("fp8_v4", {})
    assert.equal(string.rep("72", 7) .. "00", hex(rows[2], 0, 8))
    rows = one("fp4_v41", {})
    assert.equal(string.rep("01", 32), hex(rows[2], 0, 32))
    assert.equal(string.rep("00", 256), hex(rows[1], 0, 256))
  end)

  it("negative zeros keep their sign through every element type", function()
    for _, name in ipairs(ALL) do
      local L = mla.layout.get(name)
      local vals = {}
      for d = 0, L.dim - 1 do vals[d] = -0.0 end
      local _, y = one(name, vals)
      for d = 0, L.dim - 1 do assert(is_negzero(y[d]), name .. " dim " .. d .. " read " .. tostring(y[d])) end
    end
  end)

  it("a spike takes the group's scale and flushes its small neighbours to zero", function()
    local vals = {}
    for d = 0, 127 do vals[d] = 1e-3 end
    vals[5] = 1000
    local rows, y = one("fp8_ds_mla", vals)
    assert.equal("00008040", hex(rows[1], 512, 516)) -- s = 4
    assert.equal("78", hex(rows[1], 5, 6))
    assert.equal(1024, y[5])
    assert.equal(0, y[6])
    assert.equal("00000039", hex(rows[1], 516, 520)) -- the next group is unaffected
  end)

  it("exact powers of two survive pow2 scaling unchanged", function()
    for _, name in ipairs { "fp8_ds_mla", "fp8_v4", "indexer_fp8_ue8m0" } do
      local L = mla.layout.get(name)
      local vals = {}
      for d = 0, L.dim - 1 do vals[d] = (d % 2 == 0 and 1 or -1) * 2.0 ^ ((d % 18) - 9) end
      local _, y = one(name, vals)
      for d = 0, L.dim - 1 do assert(y[d] == vals[d], string.format("%s dim %d: %g read as %g", name, d, vals[d], y[d])) end
    end
  end)

  it("values at the fp8 limit: 448 codes as 0x7e under s = 1, 464 moves the scale up a power of two", function()
    local rows = one("fp8_ds_mla", { [0] = 448, [128] = 464 })
    assert.equal("7e", hex(rows[1], 0, 1))
    assert.equal("0000803f" .. "00000040", hex(rows[1], 512, 520))
    assert.equal("76", hex(rows[1], 128, 129)) -- 232, halfway between 224 and 240 -> 224 (even)
    local prow = one("fp8_pertensor", { [0] = 448, [1] = 464, [2] = 1e30, [3] = -1 / 0, [4] = 0 / 0 }, { tensor_scale = 1 })
    assert.equal("7e7e7efe7f", hex(prow[1], 0, 5)) -- satfinite (torch's cast would give NaN), NaN stays NaN
  end)

  it("a NaN makes its group's scale NaN, and no other group", function()
    local rows, y = one("fp8_ds_mla", { [3] = 0 / 0, [130] = 2 })
    local s0 = string.unpack("<f", rows[1], 513)
    assert.is_true(s0 ~= s0)
    for d = 0, 127 do assert.is_true(y[d] ~= y[d]) end
    assert.equal(2, y[130])
    local vrows, vy = one("fp8_v4", { [70] = 0 / 0, [1] = 2 })
    assert.equal("ff", hex(vrows[2], 1, 2))
    for d = 64, 127 do assert.is_true(vy[d] ~= vy[d]) end
    assert.equal(2, vy[1])
    local frows = one("fp4_v41", { [17] = 0 / 0 })
    assert.equal("017f01", hex(frows[2], 0, 3)) -- e4m3 NaN scale for group 1 only
  end)

  it("an infinity stays inside its group", function()
    for _, name in ipairs { "fp8_ds_mla", "fp8_v4", "fp4_v41", "fp8_v41", "indexer_fp8" } do
      local L = mla.layout.get(name)
      local group = L.fields[1].scale.group
      local vals = {}
      for d = 0, L.dim - 1 do vals[d] = math.cos(d) end
      local _, clean = one(name, vals)
      vals[0] = 1 / 0
      local _, y = one(name, vals)
      assert.is_true(y[0] ~= y[0] or y[0] == 1 / 0 or y[0] >= 448, name) -- NaN, inf or saturated, per the scale dtype
      for d = group, L.dim - 1 do assert(y[d] == clean[d], string.format("%s dim %d changed", name, d)) end
    end
  end)

  it("pow2 and amax policies differ only in the scale they store", function()
    local vals = {}
    for d = 0, 511 do vals[d] = math.sin(d) * 3 end
    local p, yp = one("fp8_ds_mla", vals)
    local a, ya = one("fp8_ds_mla_amax", vals)
    local sp, sa = string.unpack("<f", p[1], 513), string.unpack("<f", a[1], 513)
    assert.equal(M.pow2_ceil(sa), sp)
    assert.is_true(sa < sp)
    assert.equal(p[1]:sub(529), a[1]:sub(529)) -- RoPE bytes identical
    local ep, ea = 0, 0
    for d = 0, 511 do ep, ea = math.max(ep, math.abs(yp[d] - vals[d])), math.max(ea, math.abs(ya[d] - vals[d])) end
    assert.is_true(ea <= ep) -- the finer scale is never worse on the worst value
  end)
end)

describe("a format defined only in Lua", function()
  local L = mla.layout.define {
    name = "fp8_ue8m0_64_spec",
    fields = {
      { "nope", "e4m3", 512, scale = { dtype = "ue8m0", group = 64, policy = "pow2", eps = 1e-4 } },
      { "rope", "bf16", 64 },
    },
    v_dims = 512,
  }

  it("lays out 648 B/token: 512 e4m3, 8 ue8m0 scales, 64 bf16", function()
    assert.equal(648, L.token_bytes)
    local d = L:desc(BS)
    assert.same({ 648 }, d.region_row_bytes)
    assert.same({ 0, 512, 520 }, { d.fields[1].byte_off, d.fields[1].scale_off, d.fields[2].byte_off })
  end)

  it("quantizes with its own rules through the C reference", function()
    local rows, y = one(L, { [0] = 3.5, [64] = 1000, [512] = -2.5 })
    assert.equal("7e", hex(rows[1], 0, 1))
    assert.equal("78" .. "81" .. string.rep("72", 6), hex(rows[1], 512, 520))
    assert.equal("20c0", hex(rows[1], 520, 522))
    assert.same({ 3.5, 1024, -2.5 }, { y[0], y[64], y[512] })
  end)
end)

describe("layout_ref.worst_step_ratio", function()
  it("stays within one half step after a write and flags a corrupted code", function()
    local L = mla.layout.get("fp8_v4")
    local pages = pages_for(L, 2)
    local x = mla.randn({ 2, 512 })
    local slots = mla.tensor({ 1, 6 }, "i64")
    mla.layout_ref.write(L, pages, x, slots, { block_size = BS })
    local ratio = mla.layout_ref.worst_step_ratio(L, pages, x, slots, { block_size = BS })
    assert.is_true(ratio > 0 and ratio <= 1, tostring(ratio))
    pages:set({ 1, 2 * 576 + 10 }, pages:get({ 1, 2 * 576 + 10 }) ~ 0x08) -- slot 6 = page 1, token 2, dim 10
    local bad, dim, row = mla.layout_ref.worst_step_ratio(L, pages, x, slots, { block_size = BS })
    assert.is_true(bad > 1)
    assert.same({ 10, 1 }, { dim, row })
  end)
end)
