/* Token-level device operations over a layout descriptor, shared by the
 * baked KV-cache kernels (src/kernels/kv_*.cu) and their JIT twins
 * (kernels_rtc/kv_*.cu): dequantize a token's 8-dim chunks into bf16 and
 * quantize bf16 chunks into a token, with exactly the arithmetic of the CPU
 * reference (src/ref/layout_ref.c, semantics in layout_desc.h).
 *
 * A token row is cut into chunks of 8 dims (layout validation guarantees
 * every field and group is a whole number of chunks). Where chunk c lives is
 * a chunk_plan, resolved once per kernel (kept in shared memory) so the
 * per-token loop does no field lookup. Lanes own chunks: lane j of the lpt
 * lanes of a token handles chunks j, j + lpt, j + 2 lpt, ... */
#ifndef MLA_TOKEN_ACCESS_CUH
#define MLA_TOKEN_ACCESS_CUH

#include "convert.cuh"
#include "e2m1_div.h"
#include "layout_access.cuh"
#include "layout_desc.h"
#include "quant_math.h"

namespace mla {

/* Where dims [8c, 8c + 8) of a token live. 32 bytes. */
struct chunk_plan {
  int64_t data_base;  /* byte offset from the page base to the chunk of token 0 (mla_region_base) */
  int64_t scale_base; /* same for the chunk's group scale (group scales only) */
  int32_t data_row;   /* bytes between tokens (mla_region_step); 0 = the view's token stride (region 0) */
  int32_t scale_row;
  int8_t field;       /* descriptor field, -1 past the row */
  uint8_t dtype, scale_kind, scale_dtype;
  int16_t group_lo;   /* first chunk of the chunk's scale group */
  int16_t group_n;    /* chunks in that group */
};

__device__ __forceinline__ int64_t elem_bytes8(int dtype, int64_t elems) {
  return dtype == MLA_E2M1 ? elems / 2 : dtype == MLA_F32 ? elems * 4 : (dtype == MLA_BF16 || dtype == MLA_F16) ? elems * 2 : elems;
}

/* Plan of chunk c (the loops over fields are uniform, so any thread may call it). */
__device__ __forceinline__ chunk_plan plan_chunk(const mla_layout_desc &d, int c) {
  chunk_plan p;
  p.data_base = p.scale_base = 0;
  p.data_row = p.scale_row = 0;
  p.field = -1;
  p.dtype = p.scale_kind = p.scale_dtype = 0;
  p.group_lo = (int16_t)c;
  p.group_n = 1;
  int d0 = 8 * c;
  for (int f = 0; f < MLA_LAYOUT_MAX_FIELDS && f < d.nfields; f++) {
    const mla_layout_field &fd = d.fields[f];
    if (fd.role != MLA_FIELD_DATA || d0 < fd.dim_lo || d0 >= fd.dim_lo + fd.count) continue;
    int e = d0 - fd.dim_lo;
    p.field = (int8_t)f;
    p.dtype = (uint8_t)fd.dtype;
    p.scale_kind = (uint8_t)fd.scale_kind;
    p.data_base = mla_region_base(&d, fd.region, fd.byte_off + elem_bytes8(fd.dtype, e));
    p.data_row = (int32_t)mla_region_step(&d, fd.region);
    if (fd.scale_kind == MLA_SCALE_GROUP) {
      int g = e / fd.group;
      p.scale_dtype = (uint8_t)fd.scale_dtype;
      p.scale_base = mla_region_base(&d, fd.scale_region, fd.scale_off + (int64_t)g * mla_scale_size(fd.scale_dtype));
      p.scale_row = (int32_t)mla_region_step(&d, fd.scale_region);
      p.group_lo = (int16_t)((fd.dim_lo + g * fd.group) / 8);
      p.group_n = (int16_t)(fd.group / 8);
    }
  }
  return p;
}

/* Fills plan[0, nchunks) cooperatively; the caller synchronizes. */
__device__ __forceinline__ void plan_chunks(const mla_layout_desc &d, chunk_plan *plan, int nchunks) {
  for (int c = threadIdx.x; c < nchunks; c += blockDim.x) plan[c] = plan_chunk(d, c);
}

/* Zeroes token t's padding bytes of the page at pg, as the reference does
 * (byte by byte: pads are few, and a chunked region's may span pieces). */
__device__ __forceinline__ void zero_pads(const mla_layout_desc &d, unsigned char *pg, int64_t t, int64_t token_stride) {
  for (int f = 0; f < MLA_LAYOUT_MAX_FIELDS && f < d.nfields; f++) {
    const mla_layout_field &fd = d.fields[f];
    if (fd.role != MLA_FIELD_PAD) continue;
    const int64_t step = mla_region_step(&d, fd.region);
    for (int k = 0; k < fd.count; k++) pg[mla_region_base(&d, fd.region, fd.byte_off + k) + t * (step ? step : token_stride)] = 0;
  }
}

__device__ __forceinline__ const unsigned char *chunk_ptr(const unsigned char *page, int64_t base, int32_t row, int64_t t,
                                                          int64_t token_stride) {
  return page + base + t * (row ? (int64_t)row : token_stride);
}

/* ---- raw loads and stores (vector when aligned, bytes otherwise) ---- */

__device__ __forceinline__ uint4 load16(const unsigned char *p) {
  if (((uintptr_t)p & 15) == 0) return __ldg(reinterpret_cast<const uint4 *>(p));
  uint4 r;
  unsigned char *b = reinterpret_cast<unsigned char *>(&r);
#pragma unroll
  for (int i = 0; i < 16; i++) b[i] = p[i];
  return r;
}
__device__ __forceinline__ uint2 load8(const unsigned char *p) {
  if (((uintptr_t)p & 7) == 0) return __ldg(reinterpret_cast<const uint2 *>(p));
  uint2 r;
  unsigned char *b = reinterpret_cast<unsigned char *>(&r);
#pragma unroll
  for (int i = 0; i < 8; i++) b[i] = p[i];
  return r;
}
__device__ __forceinline__ uint32_t load4(const unsigned char *p) {
  if (((uintptr_t)p & 3) == 0) return __ldg(reinterpret_cast<const uint32_t *>(p));
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
/* Misaligned stores byte by byte, out of line (rare; keeps the hot loops small). */
static __device__ __noinline__ void store_bytes(unsigned char *p, uint4 v, int n) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  for (int i = 0; i < n; i++) p[i] = (unsigned char)(w[i / 4] >> (8 * (i & 3)));
}
__device__ __forceinline__ void store16(unsigned char *p, uint4 v) {
  if (((uintptr_t)p & 15) == 0) *reinterpret_cast<uint4 *>(p) = v;
  else store_bytes(p, v, 16);
}
__device__ __forceinline__ void store8(unsigned char *p, uint2 v) {
  if (((uintptr_t)p & 7) == 0) *reinterpret_cast<uint2 *>(p) = v;
  else store_bytes(p, make_uint4(v.x, v.y, 0, 0), 8);
}
__device__ __forceinline__ void store4(unsigned char *p, uint32_t v) {
  if (((uintptr_t)p & 3) == 0) *reinterpret_cast<uint32_t *>(p) = v;
  else store_bytes(p, make_uint4(v, 0, 0, 0), 4);
}
__device__ __forceinline__ void store_le(unsigned char *p, uint32_t v, int n) {
  if (n == 4) store4(p, v);
  else if (n == 2 && ((uintptr_t)p & 1) == 0) *reinterpret_cast<uint16_t *>(p) = (uint16_t)v;
  else
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* Stored bytes of a chunk (8 elements of dtype) as raw bits; f32 chunks
 * (32 bytes) are read again by decode_chunk, so only their first half is here. */
__device__ __forceinline__ uint4 load_chunk_raw(int dtype, const unsigned char *p) {
  switch (dtype) {
  case MLA_E4M3:
  case MLA_E5M2: {
    uint2 v = load8(p);
    return make_uint4(v.x, v.y, 0, 0);
  }
  case MLA_E2M1: return make_uint4(load4(p), 0, 0, 0);
  default: return load16(p);
  }
}

__device__ __forceinline__ uint32_t load_scale_raw(int scale_dtype, const unsigned char *p) {
  switch (scale_dtype) {
  case MLA_F32: return load4(p);
  case MLA_BF16: return (uint32_t)p[0] | (uint32_t)p[1] << 8;
  default: return p[0];
  }
}

/* ---- packed conversions (exact; the scalar reference semantics) ---- */

/* 8 e4m3 codes (byte i = element i) -> fp32, two at a time through the
 * exact fp8x2 -> f16x2 conversion. */
__device__ __forceinline__ void e4m3x8_decode(uint2 raw, float (&x)[8]) {
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const uint32_t w = i < 2 ? raw.x : raw.y;
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)((i & 1) ? w >> 16 : w & 0xFFFFu), __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<__half2 *>(&h));
    x[2 * i] = f.x, x[2 * i + 1] = f.y;
  }
}

/* 4 e2m1 codes (nibbles of w16) -> the 4 e4m3 bytes of the same values (exact:
 * 0, 0.5, 1, 1.5, 2, 3, 4, 6 are e4m3 0x00 0x30 0x38 0x3c 0x40 0x44 0x48 0x4c),
 * a byte permute through that table plus the sign bits moved to bit 7. */
__device__ __forceinline__ uint32_t e2m1x4_to_e4m3x4(uint32_t w16) {
  uint32_t x = w16 & 0xFFFFu;
  x = (x | x << 8) & 0x00FF00FFu;
  x = (x | x << 4) & 0x0F0F0F0Fu; /* nibble i in byte i */
  return __byte_perm(0x3C383000u, 0x4C484440u, w16 & 0x7777u) | ((x << 4) & 0x80808080u);
}

/* 8 e2m1 codes (element i in nibble i: even element in the low nibble) -> fp32. */
__device__ __forceinline__ void e2m1x8_decode(uint32_t w, float (&x)[8]) {
  e4m3x8_decode(make_uint2(e2m1x4_to_e4m3x4(w), e2m1x4_to_e4m3x4(w >> 16)), x);
}

/* fp32 -> e2m1 code with cvt.rn.satfinite.e2m1x2.f32 semantics (ties to
 * even, saturate to +-6, sign kept for zeros) and NaN -> 0x7 (+6, as the
 * reference stores it). |v| < 1: round 2|v| to an integer (the fma lands on
 * 1.5 * 2^23, whose ulp is 1); |v| >= 1: round the fp32 bits to one mantissa
 * bit, then code = (bits >> 22) - 252. Checked against mla_double_to_e2m1 on
 * all 2^32 inputs. */
__device__ __forceinline__ uint32_t e2m1_encode(float v) {
  const uint32_t u = __float_as_uint(v), a = u & 0x7FFFFFFFu;
  const uint32_t small = __float_as_uint(__fmaf_rn(__uint_as_float(a), 2.0f, 12582912.0f)) - 0x4B400000u;
  const uint32_t big = min(((a + 0x1FFFFFu + ((a >> 22) & 1u)) >> 22) - 252u, 7u);
  const uint32_t c = a < 0x3F800000u ? small : big;
  return a > 0x7F800000u ? 7u : c | ((u >> 28) & 8u);
}

__device__ __forceinline__ uint32_t e2m1x8_encode(const float (&q)[8]) {
  uint32_t w = 0;
#pragma unroll
  for (int i = 0; i < 8; i++) w |= e2m1_encode(q[i]) << (4 * i);
  return w;
}

/* The e2m1 codes of x / s for the 8 bf16 x of w, without a division, on
 * packed f16 pairs: bit-identical to e2m1_encode(__fdiv_rn(x, s)) when s is
 * an e4m3 value in [2^-9, 448] and r = __frcp_rn(s) (mla/e2m1_div.h has the
 * argument; the CPU specs run that same source on every bf16 x and scale, and
 * spec/kv_convert_spec.lua checks the device code against __fdiv_rn +
 * e2m1_encode on the same domain). */
__device__ __forceinline__ uint32_t e2m1x8_encode_bf16_div(uint4 w, float s, float r) {
  return mla_e2m1x8_encode_bf16_div(w.x, w.y, w.z, w.w, s, r);
}

/* Bytes that are an e4m3 NaN (0x7f / 0xff) become 0x7f, the reference's one NaN. */
__device__ __forceinline__ uint32_t e4m3x4_canon_nan(uint32_t w) {
  return w & ~(((w & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u);
}

/* 8 floats -> 8 e4m3 codes (satfinite RNE, NaN -> 0x7f), two per conversion. */
__device__ __forceinline__ uint2 e4m3x8_encode(const float (&q)[8]) {
  uint32_t w[2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(q[4 * i], q[4 * i + 1]), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(q[4 * i + 2], q[4 * i + 3]), __NV_SATFINITE, __NV_E4M3);
    w[i] = e4m3x4_canon_nan((lo & 0xFFFFu) | hi << 16);
  }
  return make_uint2(w[0], w[1]);
}

/* Two bf16 in a word with NaNs made the canonical 0x7fff (what encoding a
 * float that came from bf16 gives back): a half is NaN iff (h & 0x7fff) >= 0x7f81. */
__device__ __forceinline__ uint32_t bf16x2_canon_nan(uint32_t w) {
  const uint32_t nan = ((w & 0x7FFF7FFFu) + 0x007F007Fu) & 0x80008000u; /* bit 15 of each NaN half */
  return (w | (nan - (nan >> 15))) & ~nan;
}
/* Eight bf16 (a 16-byte chunk), likewise. */
__device__ __forceinline__ uint4 bf16x8_canon_nan(uint4 v) {
  return make_uint4(bf16x2_canon_nan(v.x), bf16x2_canon_nan(v.y), bf16x2_canon_nan(v.z), bf16x2_canon_nan(v.w));
}

/* x / s for fp32, bit for bit the IEEE quotient (__fdiv_rn) that the
 * reference computes, at a lower cost per element:
 *  - s a power of two: x * (1 / s), exact;
 *  - |s| in [2^-60, 2^61): the hardware division's own fast path (rcp
 *    refined once, one Newton correction of the quotient) for every x with
 *    |x| in [2^-60, 2^61), where that path is exact; zeros keep their sign;
 *  - anything else (and any chunk holding other x): __fdiv_rn. */
struct divisor {
  float s, r;
  int mode; /* 0 multiply, 1 corrected reciprocal, 2 __fdiv_rn, 3 r = __frcp_rn(s) for e2m1x8_encode_bf16_div */
};

__device__ __forceinline__ divisor make_divisor(float s) {
  divisor v;
  v.s = s, v.r = 0.0f, v.mode = 2;
  const uint32_t u = __float_as_uint(s), e = (u >> 23) & 0xFFu;
  if ((u & 0x7FFFFFu) == 0 && e >= 1u && e <= 254u) {
    v.mode = 0; /* 1 / 2^(e-127) = 2^(127-e); 2^-127 is the subnormal 0x00400000 */
    v.r = __uint_as_float((u & 0x80000000u) | (e == 254u ? 0x00400000u : (254u - e) << 23));
  } else if (e - 67u <= 120u) {
    float r0;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(s));
    v.mode = 1;
    v.r = __fmaf_rn(r0, __fmaf_rn(r0, -s, 1.0f), r0);
  }
  return v;
}

/* The IEEE quotient, out of line (the rare path; keeps the hot loops small). */
static __device__ __noinline__ float fdiv_ieee(float x, float s) { return __fdiv_rn(x, s); }

/* One quotient x / v.s (bit-identical to __fdiv_rn). */
__device__ __forceinline__ float divide1(const divisor &v, float x) {
  if (v.mode == 0) return __fmul_rn(x, v.r);
  const uint32_t u = __float_as_uint(x);
  if (v.mode == 1 && ((u >> 23) & 0xFFu) - 67u <= 120u) {
    const float q = __fmul_rn(x, v.r);
    return __fmaf_rn(v.r, __fmaf_rn(q, -v.s, x), q);
  }
  if (v.mode == 1 && (u << 1) == 0u) return __fmul_rn(x, v.r);
  return fdiv_ieee(x, v.s);
}

__device__ __forceinline__ void divide8(const divisor &v, float (&x)[8]) {
  if (v.mode == 0) {
#pragma unroll
    for (int j = 0; j < 8; j++) x[j] = __fmul_rn(x[j], v.r);
    return;
  }
  if (v.mode == 1) {
    bool ok = true;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const uint32_t u = __float_as_uint(x[j]);
      ok = ok && (((u >> 23) & 0xFFu) - 67u <= 120u || (u << 1) == 0u);
    }
    if (ok) {
#pragma unroll
      for (int j = 0; j < 8; j++) {
        const float q = __fmul_rn(x[j], v.r);
        const float rem = __fmaf_rn(q, -v.s, x[j]);
        x[j] = (__float_as_uint(x[j]) << 1) == 0u ? q : __fmaf_rn(v.r, rem, q);
      }
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < 8; j++) x[j] = fdiv_ieee(x[j], v.s);
}

/* Decoded codes of a chunk, before scaling (exact in fp32). */
__device__ __forceinline__ void decode_chunk(int dtype, uint4 raw, const unsigned char *p, float (&x)[8]) {
  const unsigned char *b = reinterpret_cast<const unsigned char *>(&raw);
  switch (dtype) {
  case MLA_BF16:
#pragma unroll
    for (int i = 0; i < 8; i++) x[i] = bf16_bits_to_float((uint16_t)(b[2 * i] | b[2 * i + 1] << 8));
    break;
  case MLA_F16:
#pragma unroll
    for (int i = 0; i < 8; i++) x[i] = __half2float(__ushort_as_half((unsigned short)(b[2 * i] | b[2 * i + 1] << 8)));
    break;
  case MLA_E4M3: e4m3x8_decode(make_uint2(raw.x, raw.y), x); break;
  case MLA_E5M2:
#pragma unroll
    for (int i = 0; i < 8; i++) x[i] = e5m2_to_float(b[i]);
    break;
  case MLA_E2M1: e2m1x8_decode(raw.x, x); break;
  default: { /* f32: 32 bytes */
    uint4 hi = load16(p + 16);
    x[0] = __uint_as_float(raw.x), x[1] = __uint_as_float(raw.y), x[2] = __uint_as_float(raw.z), x[3] = __uint_as_float(raw.w);
    x[4] = __uint_as_float(hi.x), x[5] = __uint_as_float(hi.y), x[6] = __uint_as_float(hi.z), x[7] = __uint_as_float(hi.w);
    break;
  }
  }
}

/* Dequantized chunk in fp32: decode(q) * scale, the reference's product. */
__device__ __forceinline__ void dequant_chunk(const chunk_plan &p, uint4 raw, uint32_t sbits, const unsigned char *src,
                                              float tensor_scale, float (&x)[8]) {
  decode_chunk(p.dtype, raw, src, x);
  if (p.scale_kind == MLA_SCALE_NONE) return;
  float s = p.scale_kind == MLA_SCALE_TENSOR ? tensor_scale : mla_decode_scale(p.scale_dtype, sbits);
#pragma unroll
  for (int i = 0; i < 8; i++) x[i] = __fmul_rn(x[i], s);
}

/* 8 floats -> 8 bf16 (RNE; NaN becomes 0x7fff as on the CPU). */
__device__ __forceinline__ uint4 pack_bf16x8(const float (&x)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
    w[i] = *reinterpret_cast<uint32_t *>(&h);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ void unpack_bf16x8(uint4 raw, float (&x)[8]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    x[2 * i] = __uint_as_float(w[i] << 16);
    x[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

/* NaN-propagating max |x| of a chunk (mla_amax_update, order-free). */
__device__ __forceinline__ float amax_chunk(const float (&x)[8]) {
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; i++) m = mla_amax_update(m, x[i]);
  return m;
}

/* ---- encoding: the CPU's mla_store_double rules (satfinite RNE, one
 * canonical NaN per format) ---- */
__device__ __forceinline__ uint8_t enc_e4m3(float v) { return v != v ? 0x7F : float_to_e4m3(v); }
__device__ __forceinline__ uint8_t enc_e5m2(float v) {
  return v != v ? 0x7F : (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
}
__device__ __forceinline__ uint8_t enc_e2m1(float v) { return v != v ? 0x7 : (uint8_t)(float_to_e2m1(v) & 15); }
__device__ __forceinline__ uint16_t enc_bf16(float v) { return v != v ? 0x7FFF : float_to_bf16_bits(v); }
__device__ __forceinline__ uint16_t enc_f16(float v) { return v != v ? 0x7FFF : __half_as_ushort(__float2half_rn(v)); }
__device__ __forceinline__ uint32_t enc_f32(float v) { return v != v ? 0x7FFFFFFFu : __float_as_uint(v); }

/* Encodes 8 values into the chunk's dtype at dst (8, 16, 4 or 32 bytes). */
__device__ __forceinline__ void store_chunk(int dtype, unsigned char *dst, const float (&q)[8]) {
  switch (dtype) {
  case MLA_E4M3: store8(dst, e4m3x8_encode(q)); break;
  case MLA_E5M2: {
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; i++) w[i / 4] |= (uint32_t)enc_e5m2(q[i]) << (8 * (i & 3));
    store8(dst, make_uint2(w[0], w[1]));
    break;
  }
  case MLA_E2M1: store4(dst, e2m1x8_encode(q)); break;
  case MLA_BF16:
  case MLA_F16: {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      uint32_t lo = dtype == MLA_BF16 ? enc_bf16(q[2 * i]) : enc_f16(q[2 * i]);
      uint32_t hi = dtype == MLA_BF16 ? enc_bf16(q[2 * i + 1]) : enc_f16(q[2 * i + 1]);
      w[i] = lo | hi << 16;
    }
    store16(dst, make_uint4(w[0], w[1], w[2], w[3]));
    break;
  }
  default: /* f32 */
    store16(dst, make_uint4(enc_f32(q[0]), enc_f32(q[1]), enc_f32(q[2]), enc_f32(q[3])));
    store16(dst + 16, make_uint4(enc_f32(q[4]), enc_f32(q[5]), enc_f32(q[6]), enc_f32(q[7])));
    break;
  }
}

/* Bytes a chunk of dtype occupies. */
__device__ __forceinline__ int chunk_bytes(int dtype) { return (int)elem_bytes8(dtype, 8); }

} // namespace mla

#endif
