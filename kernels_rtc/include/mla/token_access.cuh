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
#include "layout_access.cuh"
#include "layout_desc.h"
#include "quant_math.h"

namespace mla {

/* Where dims [8c, 8c + 8) of a token live. 32 bytes. */
struct chunk_plan {
  int64_t data_base;  /* byte offset from the page base to the chunk of token 0 */
  int64_t scale_base; /* same for the chunk's group scale (group scales only) */
  int32_t data_row;   /* bytes between tokens; 0 = the view's token stride (region 0) */
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
    p.data_base = d.region_off[fd.region] + fd.byte_off + elem_bytes8(fd.dtype, e);
    p.data_row = fd.region == 0 ? 0 : d.region_row_bytes[fd.region];
    if (fd.scale_kind == MLA_SCALE_GROUP) {
      int g = e / fd.group;
      p.scale_dtype = (uint8_t)fd.scale_dtype;
      p.scale_base = d.region_off[fd.scale_region] + fd.scale_off + (int64_t)g * mla_scale_size(fd.scale_dtype);
      p.scale_row = fd.scale_region == 0 ? 0 : d.region_row_bytes[fd.scale_region];
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
__device__ __forceinline__ void store16(unsigned char *p, uint4 v) {
  if (((uintptr_t)p & 15) == 0) {
    *reinterpret_cast<uint4 *>(p) = v;
    return;
  }
  const unsigned char *b = reinterpret_cast<const unsigned char *>(&v);
#pragma unroll
  for (int i = 0; i < 16; i++) p[i] = b[i];
}
__device__ __forceinline__ void store8(unsigned char *p, uint2 v) {
  if (((uintptr_t)p & 7) == 0) {
    *reinterpret_cast<uint2 *>(p) = v;
    return;
  }
  const unsigned char *b = reinterpret_cast<const unsigned char *>(&v);
#pragma unroll
  for (int i = 0; i < 8; i++) p[i] = b[i];
}
__device__ __forceinline__ void store4(unsigned char *p, uint32_t v) {
  if (((uintptr_t)p & 3) == 0) {
    *reinterpret_cast<uint32_t *>(p) = v;
    return;
  }
#pragma unroll
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
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
  case MLA_E4M3:
#pragma unroll
    for (int i = 0; i < 8; i++) x[i] = e4m3_to_float(b[i]);
    break;
  case MLA_E5M2:
#pragma unroll
    for (int i = 0; i < 8; i++) x[i] = e5m2_to_float(b[i]);
    break;
  case MLA_E2M1:
#pragma unroll
    for (int i = 0; i < 8; i++) x[i] = e2m1_to_float((uint8_t)(b[i / 2] >> (4 * (i & 1))));
    break;
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
  case MLA_E4M3:
  case MLA_E5M2: {
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; i++) w[i / 4] |= (uint32_t)(dtype == MLA_E4M3 ? enc_e4m3(q[i]) : enc_e5m2(q[i])) << (8 * (i & 3));
    store8(dst, make_uint2(w[0], w[1]));
    break;
  }
  case MLA_E2M1: {
    uint32_t w = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) w |= (uint32_t)enc_e2m1(q[i]) << (4 * i);
    store4(dst, w);
    break;
  }
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
