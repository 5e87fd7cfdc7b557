/* Device-side access to a cache through a layout descriptor: token
 * addresses, scale reads and dequantization of 8 consecutive dims. Used by
 * the baked kernels (descriptor passed as a __grid_constant__ parameter) and
 * by JIT kernels (descriptor as a constexpr from the generated layout
 * header, so every branch folds away). Semantics: layout_desc.h. */
#ifndef MLA_LAYOUT_ACCESS_CUH
#define MLA_LAYOUT_ACCESS_CUH

#include "convert.cuh"
#include "layout_desc.h"
#include "quant_math.h"

namespace mla {

/* Byte b of token t's row in region r of page p (64-bit throughout; a
 * chunked region's piece holding b: mla_region_base). */
__device__ __forceinline__ unsigned char *row_byte(const mla_layout_desc &d, const mla_cache_view &v, int64_t page,
                                                   int64_t t, int r, int64_t b) {
  return mla_view_byte(&d, &v, page, t, r, b);
}

/* N bytes from p into a register array, with a vector load when aligned. */
template <int N> __device__ __forceinline__ void load_bytes(const unsigned char *p, unsigned char (&out)[N]) {
  static_assert(N == 4 || N == 8 || N == 16, "load_bytes: 4, 8 or 16 bytes");
  if (((uintptr_t)p & (N - 1)) == 0) {
    if constexpr (N == 16) *reinterpret_cast<uint4 *>(out) = __ldg(reinterpret_cast<const uint4 *>(p));
    else if constexpr (N == 8) *reinterpret_cast<uint2 *>(out) = __ldg(reinterpret_cast<const uint2 *>(p));
    else *reinterpret_cast<unsigned *>(out) = __ldg(reinterpret_cast<const unsigned *>(p));
  } else {
#pragma unroll
    for (int i = 0; i < N; i++) out[i] = p[i];
  }
}

__device__ __forceinline__ uint32_t load_scale_bits(const unsigned char *p, int scale_dtype) {
  switch (scale_dtype) {
  case MLA_F32: return ((uintptr_t)p & 3) == 0 ? *reinterpret_cast<const uint32_t *>(p)
                                               : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
  case MLA_BF16: return (uint32_t)p[0] | (uint32_t)p[1] << 8;
  default: return p[0];
  }
}

/* Field that stores logical dim `dim` (fields are sorted by dim_lo in practice;
 * a linear scan over at most 8 folds away for constexpr descriptors). */
__device__ __forceinline__ int field_of(const mla_layout_desc &d, int dim) {
#pragma unroll
  for (int f = 0; f < MLA_LAYOUT_MAX_FIELDS; f++) {
    if (f >= d.nfields) break;
    const mla_layout_field &fd = d.fields[f];
    if (fd.role == MLA_FIELD_DATA && dim >= fd.dim_lo && dim < fd.dim_lo + fd.count) return f;
  }
  return -1;
}

/* Multiplier for the group holding dim d0 of field fd. */
__device__ __forceinline__ float field_scale(const mla_layout_desc &d, const mla_cache_view &v,
                                             const mla_layout_field &fd, int64_t page, int64_t t, int d0) {
  if (fd.scale_kind == MLA_SCALE_TENSOR) return v.tensor_scale ? *v.tensor_scale : 1.0f;
  if (fd.scale_kind != MLA_SCALE_GROUP) return 1.0f;
  int g = (d0 - fd.dim_lo) / fd.group;
  const unsigned char *sp = row_byte(d, v, page, t, fd.scale_region, fd.scale_off + g * mla_scale_size(fd.scale_dtype));
  return mla_decode_scale(fd.scale_dtype, load_scale_bits(sp, fd.scale_dtype));
}

/* Dequantize dims [d0, d0 + 8) of token t of page `page` into fp32.
 * Requires d0 % 8 == 0 and the 8 dims inside one field and one group
 * (layout validation guarantees dims and groups are multiples of 8). */
__device__ __forceinline__ void dequant8(const mla_layout_desc &d, const mla_cache_view &v, int64_t page, int64_t t,
                                         int d0, float (&out)[8]) {
  int f = field_of(d, d0);
  const mla_layout_field &fd = d.fields[f < 0 ? 0 : f];
  const int e = d0 - fd.dim_lo;
  // the 8 dims' first byte (one piece of a chunked region holds all of them)
  const int64_t qb = fd.dtype == MLA_E2M1 ? e / 2 : fd.dtype == MLA_F32 ? 4 * e : fd.dtype == MLA_BF16 || fd.dtype == MLA_F16 ? 2 * e : e;
  const unsigned char *q = row_byte(d, v, page, t, fd.region, fd.byte_off + qb);
  float s = field_scale(d, v, fd, page, t, d0);
  switch (fd.dtype) {
  case MLA_BF16: {
    unsigned char b[16];
    load_bytes<16>(q, b);
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = bf16_bits_to_float((uint16_t)(b[2 * i] | b[2 * i + 1] << 8));
    break;
  }
  case MLA_E4M3: {
    unsigned char b[8];
    load_bytes<8>(q, b);
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = e4m3_to_float(b[i]);
    break;
  }
  case MLA_E5M2: {
    unsigned char b[8];
    load_bytes<8>(q, b);
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = e5m2_to_float(b[i]);
    break;
  }
  case MLA_E2M1: {
    unsigned char b[4];
    load_bytes<4>(q, b);
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = e2m1_to_float((uint8_t)(b[i / 2] >> (4 * (i & 1))));
    break;
  }
  case MLA_F16: {
    unsigned char b[16];
    load_bytes<16>(q, b);
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = __half2float(__ushort_as_half((unsigned short)(b[2 * i] | b[2 * i + 1] << 8)));
    break;
  }
  default: { /* f32 */
    unsigned char b[16], c[16];
    load_bytes<16>(q, b);
    load_bytes<16>(q + 16, c);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      out[i] = __uint_as_float((uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 | (uint32_t)b[4 * i + 2] << 16 | (uint32_t)b[4 * i + 3] << 24);
      out[i + 4] = __uint_as_float((uint32_t)c[4 * i] | (uint32_t)c[4 * i + 1] << 8 | (uint32_t)c[4 * i + 2] << 16 | (uint32_t)c[4 * i + 3] << 24);
    }
    break;
  }
  }
  if (fd.scale_kind != MLA_SCALE_NONE) {
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = __fmul_rn(out[i], s);
  }
}

} // namespace mla

#endif
