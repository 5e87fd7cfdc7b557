-- Counter-based random numbers: Philox4x32-10 (checked against Random123's
-- known answers through an independent Lua implementation), reproducible
-- from the seed, the same bits on the CPU and the GPU, sane distributions.
local mla = require "mlalab"
local S = require "support"

local core = mla.core
local MASK = 0xFFFFFFFF

--- Philox4x32-10 from the Random123 definition: 4 counter words, 2 key words.
local function philox4x32_10(c0, c1, c2, c3, k0, k1)
  for _ = 1, 10 do
    local p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2 -- exact 64-bit products (Lua integers wrap mod 2^64)
    local hi0, lo0, hi1, lo1 = (p0 >> 32) & MASK, p0 & MASK, (p1 >> 32) & MASK, p1 & MASK
    c0, c1, c2, c3 = hi1 ~ c1 ~ k0, lo1, hi0 ~ c3 ~ k1, lo0
    k0, k1 = (k0 + 0x9E3779B9) & MASK, (k1 + 0xBB67AE85) & MASK
  end
  return c0, c1, c2, c3
end

--- mlalab's stream: element i draws from counter (i, 0, 0, 0) under key = seed.
local function words(seed, i) return philox4x32_10(i & MASK, (i >> 32) & MASK, 0, 0, seed & MASK, (seed >> 32) & MASK) end

--- [0, 1) from 53 bits of two words.
local function u01(a, b) return (((a >> 5) << 26) | (b >> 6)) * (1.0 / 9007199254740992.0) end

local function bytes_of(t) return core.tensor_bytes(t) end

local function stats(values)
  local n, s, s2 = #values, 0, 0
  for _, v in ipairs(values) do s = s + v end
  local mean = s / n
  for _, v in ipairs(values) do s2 = s2 + (v - mean) ^ 2 end
  return mean, math.sqrt(s2 / (n - 1))
end

local seeds = { 0, 1, 0x5eed, 0x123456789ABCDEF0, -1 }

describe("Philox4x32-10", function()
  it("the Lua reference reproduces Random123's known answers", function()
    assert.same({ 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8 }, { philox4x32_10(0, 0, 0, 0, 0, 0) })
    assert.same({ 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd },
      { philox4x32_10(MASK, MASK, MASK, MASK, MASK, MASK) })
    assert.same({ 0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1 },
      { philox4x32_10(0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0) })
  end)

  it("random_bytes element i holds the first Philox word(s) of counter i", function()
    for _, seed in ipairs(seeds) do
      local t32 = mla.random_bytes({ 64 }, { dtype = "i32", seed = seed, device = "cpu" })
      local t64 = mla.random_bytes({ 64 }, { dtype = "i64", seed = seed, device = "cpu" })
      local t8 = mla.random_bytes({ 64 }, { dtype = "u8", seed = seed, device = "cpu" })
      local b32, b64, b8 = bytes_of(t32), bytes_of(t64), bytes_of(t8)
      for i = 0, 63 do
        local w0, w1 = words(seed, i)
        assert.equal(w0, string.unpack("<I4", b32, 4 * i + 1), "i32 seed " .. seed .. " element " .. i)
        assert.equal(w0 | (w1 << 32), string.unpack("<i8", b64, 8 * i + 1), "i64 seed " .. seed)
        assert.equal(w0 & 0xFF, b8:byte(i + 1), "u8 seed " .. seed)
      end
    end
  end)

  it("the first element of seed 0 is Random123's zero-key answer", function()
    assert.equal(0x6627e8d5, string.unpack("<I4", bytes_of(mla.random_bytes({ 1 }, { dtype = "i32", seed = 0, device = "cpu" }))))
  end)

  it("e2m1 random codes are the low nibble of each element's word", function()
    local t = mla.random_bytes({ 10 }, { dtype = "e2m1", seed = 99, device = "cpu" })
    local b = bytes_of(t)
    for i = 0, 9 do
      local w0 = words(99, i)
      assert.equal(w0 & 15, (b:byte(i // 2 + 1) >> (4 * (i % 2))) & 15, "element " .. i)
    end
  end)
end)

describe("uniform and normal values", function()
  it("uniform f64 is lo + (hi - lo) * u from the element's words, exactly", function()
    for _, seed in ipairs(seeds) do
      local lo, hi = -3.5, 7.25
      local t = mla.rand({ 200 }, { lo = lo, hi = hi, seed = seed, dtype = "f64", device = "cpu" })
      local b = bytes_of(t)
      for i = 0, 199 do
        local w0, w1 = words(seed, i)
        assert.equal(lo + (hi - lo) * u01(w0, w1), string.unpack("<d", b, 8 * i + 1))
      end
    end
  end)

  it("uniform f32 is the f64 value rounded to nearest", function()
    local f64 = mla.rand({ 500 }, { seed = 42, dtype = "f64", device = "cpu" })
    local f32 = mla.rand({ 500 }, { seed = 42, dtype = "f32", device = "cpu" })
    local b64, b32 = bytes_of(f64), bytes_of(f32)
    for i = 0, 499 do
      assert.equal(string.pack("<f", (string.unpack("<d", b64, 8 * i + 1))), b32:sub(4 * i + 1, 4 * i + 4))
    end
  end)

  it("normal values follow Box-Muller on the element's words", function()
    local t = mla.randn({ 300 }, { mean = 1.5, std = 2, seed = 7, dtype = "f64", device = "cpu" })
    local b = bytes_of(t)
    for i = 0, 299 do
      local w0, w1, w2, w3 = words(7, i)
      local u1, u2 = 1 - u01(w0, w1), u01(w2, w3)
      local expect = 1.5 + 2 * math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)
      local got = string.unpack("<d", b, 8 * i + 1)
      assert.is_true(math.abs(got - expect) <= 1e-12 * (1 + math.abs(expect)), string.format("element %d: %.17g vs %.17g", i, got, expect))
    end
  end)

  it("uniform values stay in [lo, hi] with the right mean and spread", function()
    local n, lo, hi = 200000, -2, 6
    local v = S.values(mla.rand({ n }, { lo = lo, hi = hi, seed = 11, device = "cpu" }))
    local mean, sd = stats(v)
    local mn, mx = math.huge, -math.huge
    for _, x in ipairs(v) do mn, mx = math.min(mn, x), math.max(mx, x) end
    assert.is_true(mn >= lo and mx <= hi, string.format("range [%g, %g]", mn, mx))
    assert.is_true(mn < lo + 0.001 and mx > hi - 0.001, "values reach both ends")
    local want_sd = (hi - lo) / math.sqrt(12)
    assert.is_true(math.abs(mean - (lo + hi) / 2) < 5 * want_sd / math.sqrt(n), "mean " .. mean)
    assert.is_true(math.abs(sd / want_sd - 1) < 0.01, "sd " .. sd)
  end)

  it("normal values have the requested mean and std, and a normal shape", function()
    local n = 200000
    local v = S.values(mla.randn({ n }, { mean = -1, std = 3, seed = 12, device = "cpu" }))
    local mean, sd = stats(v)
    assert.is_true(math.abs(mean + 1) < 5 * 3 / math.sqrt(n), "mean " .. mean)
    assert.is_true(math.abs(sd / 3 - 1) < 0.01, "std " .. sd)
    local within1, m3, m4 = 0, 0, 0
    for _, x in ipairs(v) do
      local z = (x + 1) / 3
      if math.abs(z) < 1 then within1 = within1 + 1 end
      m3, m4 = m3 + z ^ 3, m4 + z ^ 4
    end
    assert.is_true(math.abs(within1 / n - 0.6827) < 0.005, "P(|z| < 1) = " .. within1 / n)
    assert.is_true(math.abs(m3 / n) < 0.03, "skewness " .. m3 / n)
    assert.is_true(math.abs(m4 / n - 3) < 0.06, "kurtosis " .. m4 / n)
  end)

  it("random bytes are evenly spread over all 256 values", function()
    local n = 256 * 400
    local b = bytes_of(mla.random_bytes({ n }, { seed = 13, device = "cpu" }))
    local counts = {}
    for i = 0, 255 do counts[i] = 0 end
    for i = 1, n do local c = b:byte(i); counts[c] = counts[c] + 1 end
    local chi2 = 0
    for i = 0, 255 do chi2 = chi2 + (counts[i] - 400) ^ 2 / 400 end
    assert.is_true(chi2 < 340, "chi-square (255 dof) = " .. chi2) -- p < 0.0003 for a uniform source
    assert.is_true(chi2 > 180, "chi-square (255 dof) = " .. chi2 .. " is too regular")
  end)
end)

describe("seeds", function()
  it("the same seed gives the same tensor, call after call", function()
    for _, kind in ipairs { "rand", "randn", "random_bytes" } do
      local a = mla[kind]({ 7, 9 }, { seed = 2024, device = "cpu" })
      local b = mla[kind]({ 7, 9 }, { seed = 2024, device = "cpu" })
      assert.is_true(a:equal(b), kind)
    end
  end)

  it("different seeds give different tensors", function()
    local a = S.values(mla.rand({ 1000 }, { seed = 1, device = "cpu" }))
    local b = S.values(mla.rand({ 1000 }, { seed = 2, device = "cpu" }))
    local same = 0
    for i = 1, 1000 do if a[i] == b[i] then same = same + 1 end end
    assert.equal(0, same)
  end)

  it("manual_seed makes the unseeded stream repeat, and next draws differ", function()
    mla.manual_seed(77)
    local a1, a2 = mla.randn({ 16 }, { device = "cpu" }), mla.rand({ 16 }, { device = "cpu" })
    mla.manual_seed(77)
    local b1, b2 = mla.randn({ 16 }, { device = "cpu" }), mla.rand({ 16 }, { device = "cpu" })
    assert.is_true(a1:equal(b1))
    assert.is_true(a2:equal(b2))
    assert.is_false(a1:equal(mla.randn({ 16 }, { device = "cpu" })))
    assert.equal(77, mla.seed())
  end)

  it("a view filled in place gets the values of a fresh tensor in its logical order, neighbours untouched", function()
    local base = mla.full({ 6, 10 }, -7, "f32", "cpu")
    local view = base:transpose(0, 1):narrow(0, 2, 5) -- [5, 6], strided
    view:uniform_(0, 1, 31)
    local fresh = mla.rand({ 5, 6 }, { seed = 31, device = "cpu" })
    assert.is_true(view:contiguous():equal(fresh))
    local v = base:totable()
    for i = 1, 6 do
      for j = 1, 10 do
        local inside = j >= 3 and j <= 7
        assert.is_true(inside == (v[i][j] ~= -7), string.format("element (%d, %d)", i - 1, j - 1))
      end
    end
  end)
end)

describe("the same numbers on CPU and GPU #gpu", function()
  local dtypes = { "f32", "f64", "bf16", "f16", "e4m3", "e5m2", "ue8m0", "i32", "i64", "u8", "i16", "e2m1" }

  for _, kind in ipairs { "rand", "randn", "random_bytes" } do
    it(kind .. ": every dtype, several seeds, bit for bit", function()
      for _, dt in ipairs(dtypes) do
        for _, seed in ipairs(seeds) do
          local c = mla[kind]({ 33, 130 }, { seed = seed, dtype = dt, device = "cpu" })
          local g = mla[kind]({ 33, 130 }, { seed = seed, dtype = dt, device = "cuda" })
          assert.is_true(c:equal(g), string.format("%s %s seed %d", kind, dt, seed))
        end
      end
    end)
  end

  it("in-place fills of strided views agree with the CPU and leave neighbours alone", function()
    for _, dt in ipairs { "f32", "bf16", "i32", "e4m3" } do
      local c = mla.zeros({ 8, 12, 6 }, dt, "cpu")
      local g = mla.zeros({ 8, 12, 6 }, dt, "cuda")
      for _, t in ipairs { c, g } do t:permute({ 2, 0, 1 }):narrow(2, 3, 5):normal_(0, 1, 555) end
      assert.is_true(c:equal(g), dt)
    end
  end)

  it("a million normals: same bits on both devices", function()
    local c = mla.randn({ 1000, 1000 }, { seed = 9, dtype = "f64", device = "cpu" })
    local g = mla.randn({ 1000, 1000 }, { seed = 9, dtype = "f64", device = "cuda" })
    assert.is_true(c:equal(g))
  end)
end)
