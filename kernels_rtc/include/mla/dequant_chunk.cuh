/* Dequantization of 8 consecutive dims of a token whose bytes were staged in
 * shared memory (every region's token row copied to a known offset of one
 * "stage row"). A chunk_plan, made once per kernel from the layout
 * descriptor, says where the 8 values and their scale sit in that row, so the
 * inner loop does no field lookup. Semantics are layout_desc.h's: fp32
 * product decode(q) * scale, rounded once to bf16. */
#ifndef MLA_DEQUANT_CHUNK_CUH
#define MLA_DEQUANT_CHUNK_CUH

#include "convert.cuh"
#include "layout_access.cuh"
#include "layout_desc.h"
#include "mma.cuh"
#include "quant_math.h"

namespace mla {

/* How a chunk is rebuilt: the common cases get straight-line code, the
 * rest the generic path (any dtype, scale dtype and alignment). */
enum chunk_kind : int16_t {
  CHUNK_GENERIC = 0,
  CHUNK_ZERO,       /* no field stores these dims */
  CHUNK_COPY,       /* bf16 without scale, 16-byte aligned: the bits themselves */
  CHUNK_FP8_ONE,    /* e4m3, 8-byte aligned, no scale */
  CHUNK_FP8_TENSOR, /* e4m3 x the per-tensor scale */
  CHUNK_FP8_F32,    /* e4m3 x an f32 group scale (4-byte aligned) */
  CHUNK_FP8_UE8M0,  /* e4m3 x a ue8m0 group scale byte */
};

struct chunk_plan {
  int32_t src;         /* byte offset of the 8 values in the stage row; -1: no field stores them (zeros) */
  int16_t kind;        /* chunk_kind */
  int16_t dtype;       /* stored element type */
  int32_t scale_src;   /* group: byte offset of the scale; -1 none; -2 the per-tensor scale */
  int32_t scale_dtype; /* group scales */
};

/* Plan for dims [d0, d0 + 8): stage_off[r] is where region r's token row starts in the stage row. */
__device__ __forceinline__ chunk_plan make_chunk_plan(const mla_layout_desc &d, const int (&stage_off)[MLA_LAYOUT_MAX_REGIONS],
                                                      int d0) {
  chunk_plan c;
  c.src = -1, c.kind = CHUNK_ZERO, c.dtype = MLA_BF16, c.scale_src = -1, c.scale_dtype = MLA_F32;
  int f = field_of(d, d0);
  if (f < 0) return c;
  const mla_layout_field &fd = d.fields[f];
  int e = d0 - fd.dim_lo;
  int eb = fd.dtype == MLA_E2M1 ? e / 2 : e * (fd.dtype == MLA_F32 ? 4 : (fd.dtype == MLA_BF16 || fd.dtype == MLA_F16) ? 2 : 1);
  c.src = stage_off[fd.region] + fd.byte_off + eb;
  c.dtype = fd.dtype;
  if (fd.scale_kind == MLA_SCALE_TENSOR) c.scale_src = -2;
  else if (fd.scale_kind == MLA_SCALE_GROUP) {
    c.scale_src = stage_off[fd.scale_region] + fd.scale_off + (e / fd.group) * mla_scale_size(fd.scale_dtype);
    c.scale_dtype = fd.scale_dtype;
  }
  /* stage rows start 16-byte aligned, so offsets decide alignment */
  c.kind = CHUNK_GENERIC;
  if (c.dtype == MLA_BF16 && c.scale_src == -1 && c.src % 16 == 0) c.kind = CHUNK_COPY;
  else if (c.dtype == MLA_E4M3 && c.src % 8 == 0) {
    if (c.scale_src == -1) c.kind = CHUNK_FP8_ONE;
    else if (c.scale_src == -2) c.kind = CHUNK_FP8_TENSOR;
    else if (c.scale_dtype == MLA_F32 && c.scale_src % 4 == 0) c.kind = CHUNK_FP8_F32;
    else if (c.scale_dtype == MLA_UE8M0) c.kind = CHUNK_FP8_UE8M0;
  }
  return c;
}

/* Two e4m3 codes (the low 16 bits of w) as f16x2: exact, one conversion. */
__device__ __forceinline__ uint32_t e4m3x2_f16(uint32_t w) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
  return (uint32_t)h.x | (uint32_t)h.y << 16;
}

/* 8 e4m3 codes times s, each product rounded once to bf16: packed fp8x2 ->
 * f16x2 conversions (exact), fp32 multiplies, packed bf16 conversions. */
__device__ __forceinline__ uint4 e4m3x8_scaled_bf16(uint2 raw, float s) {
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const uint32_t w = i < 2 ? raw.x : raw.y, h = e4m3x2_f16((i & 1) ? w >> 16 : w);
    const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&h));
    o[i] = pack_bf16x2(__fmul_rn(f.x, s), __fmul_rn(f.y, s));
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

/* N bytes of shared memory into registers; vector loads when aligned (fields
 * of one-byte types may start at any byte). */
template <int N> __device__ __forceinline__ void smem_bytes(const unsigned char *p, unsigned char (&b)[N]) {
  if (((uintptr_t)p & (N - 1)) == 0) {
    if constexpr (N == 16) *reinterpret_cast<uint4 *>(b) = *reinterpret_cast<const uint4 *>(p);
    else if constexpr (N == 8) *reinterpret_cast<uint2 *>(b) = *reinterpret_cast<const uint2 *>(p);
    else *reinterpret_cast<uint32_t *>(b) = *reinterpret_cast<const uint32_t *>(p);
  } else {
#pragma unroll
    for (int i = 0; i < N; i++) b[i] = p[i];
  }
}

__device__ __forceinline__ uint32_t smem_scale_bits(const unsigned char *p, int scale_dtype) {
  int n = mla_scale_size(scale_dtype);
  uint32_t v = 0;
  for (int i = 0; i < n; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}

/* Any chunk the fast kinds do not cover. */
static __device__ __noinline__ uint4 dequant_chunk_generic(const chunk_plan c, const unsigned char *row, float tensor_scale);

/* 8 dims of the staged row `row` as 8 bf16 (a uint4), per the plan. */
__device__ __forceinline__ uint4 dequant_chunk_bf16(const chunk_plan &c, const unsigned char *row, float tensor_scale) {
  switch (c.kind) {
  case CHUNK_ZERO: return make_uint4(0, 0, 0, 0);
  case CHUNK_COPY: return *reinterpret_cast<const uint4 *>(row + c.src);
  case CHUNK_FP8_ONE: return e4m3x8_scaled_bf16(*reinterpret_cast<const uint2 *>(row + c.src), 1.0f);
  case CHUNK_FP8_TENSOR: return e4m3x8_scaled_bf16(*reinterpret_cast<const uint2 *>(row + c.src), tensor_scale);
  case CHUNK_FP8_F32:
    return e4m3x8_scaled_bf16(*reinterpret_cast<const uint2 *>(row + c.src), *reinterpret_cast<const float *>(row + c.scale_src));
  case CHUNK_FP8_UE8M0:
    return e4m3x8_scaled_bf16(*reinterpret_cast<const uint2 *>(row + c.src), mla_decode_scale(MLA_UE8M0, row[c.scale_src]));
  default: return dequant_chunk_generic(c, row, tensor_scale);
  }
}

static __device__ __noinline__ uint4 dequant_chunk_generic(const chunk_plan c, const unsigned char *row, float tensor_scale) {
  uint4 out;
  if (c.src < 0) return make_uint4(0, 0, 0, 0);
  const unsigned char *p = row + c.src;
  if (c.dtype == MLA_BF16 && c.scale_src == -1) { /* stored bf16, no scale: the bits themselves */
    unsigned char b[16];
    smem_bytes<16>(p, b);
    return *reinterpret_cast<uint4 *>(b);
  }
  float x[8];
  switch (c.dtype) {
  case MLA_E4M3: case MLA_E5M2: { /* pairs through the packed fp8x2 -> f16x2 conversion (exact) */
    unsigned char b[8];
    smem_bytes<8>(p, b);
    const __nv_fp8_interpretation_t kind = c.dtype == MLA_E4M3 ? __NV_E4M3 : __NV_E5M2;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(b[2 * i] | b[2 * i + 1] << 8), kind);
      const float2 f = __half22float2(*reinterpret_cast<__half2 *>(&h));
      x[2 * i] = f.x, x[2 * i + 1] = f.y;
    }
    break;
  }
  case MLA_E2M1: {
    unsigned char b[4];
    smem_bytes<4>(p, b);
#pragma unroll
    for (int i = 0; i < 8; i++) x[i] = e2m1_to_float((uint8_t)(b[i / 2] >> (4 * (i & 1))));
    break;
  }
  case MLA_BF16: case MLA_F16: {
    unsigned char b[16];
    smem_bytes<16>(p, b);
#pragma unroll
    for (int i = 0; i < 8; i++) {
      uint16_t h = (uint16_t)(b[2 * i] | b[2 * i + 1] << 8);
      x[i] = c.dtype == MLA_BF16 ? bf16_bits_to_float(h) : __half2float(__ushort_as_half(h));
    }
    break;
  }
  default: { /* f32 */
    unsigned char b[16], e[16];
    smem_bytes<16>(p, b);
    smem_bytes<16>(p + 16, e);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      x[i] = __uint_as_float((uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 | (uint32_t)b[4 * i + 2] << 16 | (uint32_t)b[4 * i + 3] << 24);
      x[i + 4] = __uint_as_float((uint32_t)e[4 * i] | (uint32_t)e[4 * i + 1] << 8 | (uint32_t)e[4 * i + 2] << 16 | (uint32_t)e[4 * i + 3] << 24);
    }
    break;
  }
  }
  if (c.scale_src != -1) {
    float s = c.scale_src == -2 ? tensor_scale : mla_decode_scale(c.scale_dtype, smem_scale_bits(row + c.scale_src, c.scale_dtype));
#pragma unroll
    for (int i = 0; i < 8; i++) x[i] = __fmul_rn(x[i], s);
  }
  out.x = pack_bf16x2(x[0], x[1]);
  out.y = pack_bf16x2(x[2], x[3]);
  out.z = pack_bf16x2(x[4], x[5]);
  out.w = pack_bf16x2(x[6], x[7]);
  return out;
}

} // namespace mla

#endif
