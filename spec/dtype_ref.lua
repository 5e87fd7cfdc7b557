--- An independent, pure-Lua reference for mlalab's narrow number formats,
-- written from the format definitions (IEEE 754 binary16 / bfloat16, OCP
-- FP8 E4M3FN / E5M2, OCP MX E8M0 and E2M1) and CUDA's documented conversion
-- rules, never from src/dtype.c. Used by spec/dtype_spec.lua.
--
-- Encoding rules (what cuda_fp8.h / cuda_bf16.h / cuda_fp4.h do, and what
-- mlalab's tensor conversions promise):
--   * round to nearest, ties to the even code; the sign of zero is kept;
--   * overflow (the rounded magnitude, with an unbounded exponent, exceeds
--     the largest finite value): fp8 satfinite and e2m1 give the largest
--     finite value, fp8 without saturation gives NaN (e4m3) or inf (e5m2),
--     bf16/f16 give inf; +-inf is an overflow too;
--   * NaN becomes one canonical positive code per format (e2m1 has no NaN:
--     +6, as __nv_cvt_float_to_fp4 does);
--   * ue8m0 is a power of two 2^(code-127), no sign and no zero: round-up
--     gives the smallest power >= |x|, round-zero the largest power <= |x|,
--     both clamped to code 0 below; codes past 254 are 254 with saturation,
--     NaN (255) without.
local R = {}

local huge, NaN = math.huge, 0 / 0

--- Exact 2^k as a float (pow of 2.0 with an integer exponent is exact).
local function pow2(k) return 2.0 ^ k end

R.formats = {
  e4m3 = { ebits = 4, mbits = 3, bias = 7, special = "fn" },   -- no inf; S.1111.111 is NaN
  e5m2 = { ebits = 5, mbits = 2, bias = 15, special = "ieee" }, -- exponent 11111: inf / NaN
  e2m1 = { ebits = 2, mbits = 1, bias = 1, special = "none" },  -- every code is a number
  f16 = { ebits = 5, mbits = 10, bias = 15, special = "ieee" },
  bf16 = { ebits = 8, mbits = 7, bias = 127, special = "ieee" },
}

--- Canonical NaN code a conversion writes.
R.nan_code = { e4m3 = 0x7F, e5m2 = 0x7F, e2m1 = 0x7, f16 = 0x7FFF, bf16 = 0x7FFF, ue8m0 = 0xFF, f32 = 0x7FFFFFFF }

function R.bits(name)
  if name == "ue8m0" then return 8 end
  local f = R.formats[name]
  return 1 + f.ebits + f.mbits
end

--- Value of a code (a float; NaN for NaN codes; -0.0 for negative zero).
function R.decode(name, code)
  if name == "ue8m0" then
    if code == 0xFF then return NaN end
    return pow2(code - 127)
  end
  local f = R.formats[name]
  local sign = (code >> (f.ebits + f.mbits)) & 1
  local E = (code >> f.mbits) & ((1 << f.ebits) - 1)
  local M = code & ((1 << f.mbits) - 1)
  local emax, mmax = (1 << f.ebits) - 1, (1 << f.mbits) - 1
  local v
  if f.special == "ieee" and E == emax then
    v = M == 0 and huge or NaN
  elseif f.special == "fn" and E == emax and M == mmax then
    v = NaN
  elseif E == 0 then
    v = M * pow2(1 - f.bias - f.mbits) -- subnormal: 0.M x 2^(1-bias)
  else
    v = ((1 << f.mbits) + M) * pow2(E - f.bias - f.mbits) -- 1.M x 2^(E-bias)
  end
  if sign == 1 then v = -v end
  return v
end

-- Non-negative finite values with their codes, ascending, plus one virtual
-- entry past the largest: the next value with an unbounded exponent, whose
-- selection by rounding means overflow.
local tables = {}
function R.magnitudes(name)
  if tables[name] then return tables[name] end
  local f = R.formats[name]
  local vals, codes = {}, {}
  for code = 0, (1 << (f.ebits + f.mbits)) - 1 do
    local v = R.decode(name, code)
    if v == v and v ~= huge then
      assert(#vals == 0 or v > vals[#vals], "codes of a format ascend with their values")
      vals[#vals + 1], codes[#codes + 1] = v, code
    end
  end
  local top = codes[#codes]
  local ulp = pow2(((top >> f.mbits) & ((1 << f.ebits) - 1)) - f.bias - f.mbits)
  vals[#vals + 1], codes[#codes + 1] = vals[#vals] + ulp, top + 1
  tables[name] = { vals = vals, codes = codes, max_code = top }
  return tables[name]
end

--- Code of x (a float holding an f32 or any double) in `name`.
-- saturate applies to fp8 only (e2m1 always saturates, bf16/f16 never).
function R.encode(name, x, saturate)
  if x ~= x then return R.nan_code[name] end
  local f = R.formats[name]
  local t = R.magnitudes(name)
  local signbit = (x < 0 or (x == 0 and 1 / x < 0)) and (1 << (f.ebits + f.mbits)) or 0
  local a = math.abs(x)
  local code, over
  if a == huge then
    over = true
  else
    local vals = t.vals
    local lo, hi = 1, #vals
    if a >= vals[hi] then
      lo = hi
    else -- largest lo with vals[lo] <= a < vals[lo + 1]
      while hi - lo > 1 do
        local mid = (lo + hi) // 2
        if vals[mid] <= a then lo = mid else hi = mid end
      end
    end
    if vals[lo] == a or lo == #vals then
      code = t.codes[lo]
    else
      local midpoint = (vals[lo] + vals[lo + 1]) / 2 -- exact: both have few significant bits
      if a < midpoint then code = t.codes[lo]
      elseif a > midpoint then code = t.codes[lo + 1]
      else code = (t.codes[lo] % 2 == 0) and t.codes[lo] or t.codes[lo + 1] end
    end
    over = code > t.max_code
  end
  if over then
    if name == "e2m1" or ((name == "e4m3" or name == "e5m2") and saturate) then code = t.max_code
    elseif f.special == "ieee" then code = t.max_code + 1 -- the inf code
    else code = 0x7F end -- e4m3 without saturation: NaN
  end
  return code | signbit
end

--- floor(log2(a)) for a finite a > 0, exactly: the exponent field of the
-- double (IEEE 754 binary64), searched for in the subnormal range.
local function floor_log2(a)
  local e = (string.unpack("<I8", string.pack("<d", a)) >> 52) & 0x7FF
  if e > 0 then return e - 1023 end
  local k = -1023
  while pow2(k) > a do k = k - 1 end
  return k
end

function R.encode_ue8m0(x, round_up, saturate)
  if x ~= x then return 0xFF end
  local a = math.abs(x)
  local k
  if a == huge then
    k = 255
  elseif a == 0 then
    k = 0
  else
    local e = floor_log2(a)
    if round_up and a ~= pow2(e) then e = e + 1 end
    k = math.max(0, e + 127)
  end
  if k >= 255 then k = saturate and 254 or 255 end
  return k
end

-- Float <-> bit pattern helpers -------------------------------------------------

function R.f32_of_bits(u) return (string.unpack("<f", string.pack("<I4", u))) end
function R.bits_of_f32(x) return (string.unpack("<I4", string.pack("<f", x))) end

--- Packs a list of unsigned integers as little-endian words of `size` bytes.
function R.pack_words(list, size)
  local fmt, parts, chunk = "<I" .. size, {}, {}
  for i = 1, #list do
    chunk[#chunk + 1] = string.pack(fmt, list[i])
    if #chunk == 4096 then parts[#parts + 1] = table.concat(chunk); chunk = {} end
  end
  parts[#parts + 1] = table.concat(chunk)
  return table.concat(parts)
end

--- Packs 4-bit codes two per byte, even element in the low nibble.
function R.pack_nibbles(list)
  local bytes = {}
  for i = 1, #list, 2 do bytes[#bytes + 1] = list[i] | ((list[i + 1] or 0) << 4) end
  return R.pack_words(bytes, 1)
end

return R
