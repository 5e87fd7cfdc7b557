-- The packed conversions of mla/token_access.cuh that the baked KV kernels
-- (src/kernels/kv_*.cu) and their JIT twins use, against the scalar device
-- encoders the CPU reference is proven equal to (kv_kernels_spec): e2m1 and
-- e4m3 encoding and bf16 NaN canonicalization on all 2^32 fp32 / bf16x2 bit
-- patterns, decoding on every code, and mla::divide8 (x / s without a
-- division per element) bit-identical to __fdiv_rn for every bf16 x and many
-- fp32 x over scales of every kind the layouts produce (e4m3 and ue8m0 codes,
-- raw f32 amax / qmax scales, tensor scales, extremes, NaN), and the
-- division-free e2m1 quotient encoder on its whole domain, on the device and
-- (without a GPU) its same source on the host, whose f16 pair instructions
-- mla/f16x2.h carries out in software.
local mla = require "mlalab"
local rtc = mla.rtc

local SRC = [[
#include "mla/token_access.cuh"

__device__ __forceinline__ void miss(unsigned long long *bad, unsigned long long *first, unsigned long long i) {
  atomicAdd(bad, 1ull);
  atomicMin(first, i);
}

#define FOR_ALL_32(i) \
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < (1ull << 32); \
       i += (unsigned long long)gridDim.x * blockDim.x)

__device__ __forceinline__ uint32_t mix(uint32_t x) { // a bijection of the 32-bit words
  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
  return x;
}

extern "C" __global__ void e2m1_all(unsigned long long *bad, unsigned long long *first) {
  FOR_ALL_32(i) {
    float q[8];
    for (int k = 0; k < 8; k++) q[k] = __uint_as_float(k == 0 ? (uint32_t)i : mix((uint32_t)i + k));
    const uint32_t w = mla::e2m1x8_encode(q);
    for (int k = 0; k < 8; k++)
      if (((w >> (4 * k)) & 15u) != mla::enc_e2m1(q[k])) miss(bad, first, i);
  }
}

extern "C" __global__ void e4m3_all(unsigned long long *bad, unsigned long long *first) {
  FOR_ALL_32(i) {
    float q[8];
    for (int k = 0; k < 8; k++) q[k] = __uint_as_float(k == 0 ? (uint32_t)i : mix((uint32_t)i ^ (0x9e3779b9u * k)));
    const uint2 w = mla::e4m3x8_encode(q);
    for (int k = 0; k < 8; k++)
      if ((((k < 4 ? w.x : w.y) >> (8 * (k & 3))) & 0xFFu) != mla::enc_e4m3(q[k])) miss(bad, first, i);
  }
}

extern "C" __global__ void bf16_canon_all(unsigned long long *bad, unsigned long long *first) {
  FOR_ALL_32(i) {
    const uint32_t w = (uint32_t)i;
    const uint32_t ref = (uint32_t)mla::enc_bf16(mla::bf16_bits_to_float((uint16_t)w)) |
                         (uint32_t)mla::enc_bf16(mla::bf16_bits_to_float((uint16_t)(w >> 16))) << 16;
    if (mla::bf16x2_canon_nan(w) != ref) miss(bad, first, i);
  }
}

extern "C" __global__ void decode_all(unsigned long long *bad, unsigned long long *first) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 65536) return;
  float x[8];
  mla::e4m3x8_decode(make_uint2(i | i << 16, i >> 8 | i << 8), x); // both bytes of i in every position
  for (int k = 0; k < 8; k++) {
    const uint32_t b = k < 4 ? ((i | i << 16) >> (8 * k)) & 0xFF : ((i >> 8 | i << 8) >> (8 * (k - 4))) & 0xFF;
    if (__float_as_uint(x[k]) != __float_as_uint(mla::e4m3_to_float((uint8_t)b))) miss(bad, first, i);
  }
  mla::e2m1x8_decode(i | i << 16, x);
  for (int k = 0; k < 8; k++) {
    const uint32_t nib = ((i | i << 16) >> (4 * k)) & 15u;
    if (__float_as_uint(x[k]) != __float_as_uint(mla::e2m1_to_float((uint8_t)nib))) miss(bad, first, i);
  }
}

// Scale s: the 256 e4m3 codes for blockIdx.y < 256, else scales[blockIdx.y - 256];
// x = every bf16 pattern, then as many mixed fp32 patterns.
extern "C" __global__ void divide_all(const float *scales, unsigned long long *bad, unsigned long long *first) {
  const float s = blockIdx.y < 256 ? mla::e4m3_to_float((uint8_t)blockIdx.y) : scales[blockIdx.y - 256];
  const mla::divisor dv = mla::make_divisor(s);
  for (uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < 2 * 65536 / 8; j += gridDim.x * blockDim.x) {
    float x[8], y[8];
    for (int k = 0; k < 8; k++) {
      const uint32_t e = 8 * j + k;
      x[k] = e < 65536 ? __uint_as_float(e << 16) : __uint_as_float(mix(e * 0x2545f491u + blockIdx.y));
      y[k] = __fdiv_rn(x[k], s);
    }
    mla::divide8(dv, x);
    for (int k = 0; k < 8; k++) {
      const bool same = __float_as_uint(x[k]) == __float_as_uint(y[k]) || (x[k] != x[k] && y[k] != y[k]);
      if (!same) miss(bad, first, (unsigned long long)blockIdx.y << 32 | (8 * j + k));
    }
  }
}

// e2m1x8_encode_bf16_div: every e4m3 scale code (blockIdx.y; those in [2^-9, 448]
// and NaN are the function's domain) x every bf16 pattern (NaN x only with a
// NaN scale: a NaN in a group makes its scale NaN), against __fdiv_rn +
// the scalar encoder. The word packs 8 consecutive patterns.
extern "C" __global__ void e2m1_div_all(unsigned long long *bad, unsigned long long *first) {
  const float s = mla::e4m3_to_float((uint8_t)blockIdx.y);
  if (!(s != s || (s >= 0x1p-9f && s <= 448.0f))) return;
  const float r = __frcp_rn(s);
  for (uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < 65536 / 8; j += gridDim.x * blockDim.x) {
    uint32_t h[8];
    for (int k = 0; k < 8; k++) h[k] = 8 * j + k;
    const uint4 w = make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
    const uint32_t got = mla::e2m1x8_encode_bf16_div(w, s, r);
    for (int k = 0; k < 8; k++) {
      const float x = __uint_as_float(h[k] << 16);
      if (x != x && s == s) continue;
      if (((got >> (4 * k)) & 15u) != mla::enc_e2m1(__fdiv_rn(x, s)))
        miss(bad, first, (unsigned long long)blockIdx.y << 32 | h[k]);
    }
  }
}
]]

local function scales()
  local s = {}
  local function add(v) s[#s + 1] = v end
  for k = -149, 127 do add(2.0 ^ k) end
  for _, v in ipairs { 0.75, 0.3, 0.625, 0.375, 0.125, 0.5, 1e-4 / 448, 2 ^ -126 * 1.5, 3.4e38, 1.17e-38, 6e-39, 0, -0.5,
    -0.3, 1 / 0, -1 / 0, 0 / 0 } do add(v) end
  math.randomseed(0x5eed)
  for _ = 1, 3000 do add((math.random() * 2 ^ math.random(-40, 40)) / 448) end -- amax / qmax
  for _ = 1, 500 do add(math.random() * 2 ^ math.random(-140, 120)) end
  return s
end

describe("packed conversions of mla/token_access.cuh #gpu", function()
  local m
  local function run(name, grid, args)
    m = m or rtc.compile { source = SRC, name = "kv_convert_check.cu" }
    local bad, first = mla.zeros({ 1 }, "i64", "cuda"), mla.full({ 1 }, -1, "i64", "cuda")
    local a = {}
    for i, x in ipairs(args or {}) do a[i] = x end
    a[#a + 1], a[#a + 2] = bad, first
    m:kernel(name):launch { grid = grid, block = 256, args = a }
    return math.tointeger(bad:cpu():item()), math.tointeger(first:cpu():item())
  end

  it("e2m1 and e4m3 encoders equal the scalar ones on all 2^32 fp32 inputs", function()
    for _, k in ipairs { "e2m1_all", "e4m3_all" } do
      local n, first = run(k, 132 * 16)
      assert.equal(0, n, string.format("%s: %d mismatches, first input 0x%08x", k, n, first))
    end
  end)

  it("bf16 NaN canonicalization equals encoding the decoded value, on all bf16 pairs", function()
    local n, first = run("bf16_canon_all", 132 * 16)
    assert.equal(0, n, string.format("%d mismatches, first word 0x%08x", n, first))
  end)

  it("packed e4m3 / e2m1 decoding equals the scalar decoders on every code", function()
    local n, first = run("decode_all", 256)
    assert.equal(0, n, string.format("%d mismatches, first 0x%x", n, first))
  end)

  it("the division-free e2m1 encoder equals __fdiv_rn + e2m1 for every bf16 x and every e4m3 scale in [2^-9, 448] or NaN", function()
    local n, first = run("e2m1_div_all", { 32, 256 })
    assert.equal(0, n, string.format("%d mismatches, first at e4m3 scale code 0x%02x, bf16 x 0x%04x", n,
      first >= 0 and first >> 32 or -1, first >= 0 and first & 0xffff or -1))
  end)

  it("divide8 is bit-identical to __fdiv_rn for every bf16 x and mixed fp32 x, over every kind of scale", function()
    local s = scales()
    local st = mla.tensor(s, "f32", "cuda")
    local n, first = run("divide_all", { 16, 256 + #s }, { st })
    local y = first >= 0 and first >> 32 or -1
    local what = y < 0 and "-" or y < 256 and string.format("e4m3 code 0x%02x", y) or tostring(s[y - 255])
    assert.equal(0, n, string.format("%d mismatches, first at scale %s, element %d", n, what, first & 0xffffffff))
  end)
end)

describe("the division-free e2m1 encoder's source on the host (mla/e2m1_div.h, f16 pairs in software)", function()
  -- e4m3 scale codes 0x01..0x7e ([2^-9, 448]) x every non-NaN bf16 (254 NaN patterns), and the two NaN
  -- codes x every bf16
  local domain = 126 * (65536 - 254) + 2 * 65536

  it("equals x / s and the reference e2m1 encoder for every bf16 x and every e4m3 scale in [2^-9, 448] or NaN", function()
    local r = mla.core.e2m1_div_check()
    assert.equal(domain, r.pairs)
    assert.equal(0, r.mismatches, string.format("%d mismatches, first at e4m3 scale code 0x%02x, bf16 x 0x%04x",
      r.mismatches, r.first_scale_code, r.first_x))
  end)

  it("sees a quotient 1e-3 off: the check has teeth", function()
    local r = mla.core.e2m1_div_check(1 + 1e-3)
    assert.equal(domain, r.pairs)
    assert.is_true(r.mismatches > 0, "a wrong quotient gave no mismatch")
    assert.is_true(r.first_scale_code >= 0 and r.first_x >= 0)
  end)
end)
