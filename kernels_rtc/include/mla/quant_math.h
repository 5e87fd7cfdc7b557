/* Quantization arithmetic shared by the CPU references (C11), the baked
 * kernels (nvcc) and JIT kernels (NVRTC): the same source on both sides, so a
 * scale computed on the GPU has the bits of the one computed on the CPU.
 * Only exactly rounded IEEE operations appear here (fp32 + - * /, bit
 * manipulation); element encoders call CUDA's intrinsics on the device and
 * src/dtype.c's formulas on the host, which the GPU specs prove identical. */
#ifndef MLA_QUANT_MATH_H
#define MLA_QUANT_MATH_H

#include "dtype_ids.h"
#include "layout_desc.h"
#include "platform.h"

#if defined(__CUDA_ARCH__)
#include "convert.cuh"
#define MLA_FDIV(a, b) __fdiv_rn((a), (b))
#else
#include <string.h>
#include "dtype.h" /* src/dtype.h: the host-side formulas */
#define MLA_FDIV(a, b) ((a) / (b))
#endif

MLA_HD uint32_t mla_f2u(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
#endif
}

MLA_HD float mla_u2f(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  memcpy(&x, &u, 4);
  return x;
#endif
}

MLA_HD int mla_isnan(float x) { return x != x; }

/* max |x| that propagates NaN (fmaxf would drop it) */
MLA_HD float mla_amax_update(float m, float x) {
  float a = mla_u2f(mla_f2u(x) & 0x7FFFFFFFu);
  return (a > m || mla_isnan(a)) && !mla_isnan(m) ? a : m;
}

MLA_HD float mla_fmax_num(float a, float b) { return a > b ? a : b; } /* NaN in a stays NaN */

/* 2^ceil(log2 v) for finite v > 0, from the bits: exact, no libm. Values
 * below the fp32 normal range are treated through the exponent as well. */
MLA_HD float mla_pow2_ceil(float v) {
  uint32_t u = mla_f2u(v);
  int e = (int)((u >> 23) & 0xFF);
  uint32_t m = u & 0x7FFFFFu;
  if (e == 0) { /* subnormal: normalise */
    if (m == 0) return 0.0f;
    int k = 0;
    while (!(m & 0x800000u)) m <<= 1, k++;
    m &= 0x7FFFFFu;
    e = 1 - k;
  }
  int p = e - 127 + (m != 0); /* ceil(log2 v) */
  if (p > 127) return mla_u2f(0x7F800000u);
  if (p >= -126) return mla_u2f((uint32_t)(p + 127) << 23);
  if (p >= -149) return mla_u2f(1u << (p + 149));
  return 0.0f;
}

/* Scale value of a group (before encoding into scale_dtype). */
MLA_HD float mla_group_scale_value(const mla_layout_field *f, float amax) {
  float v;
  if (mla_isnan(amax)) return amax;
  if (f->eps_on_amax) v = MLA_FDIV(mla_fmax_num(amax, f->eps), f->qmax);
  else v = mla_fmax_num(MLA_FDIV(amax, f->qmax), f->eps);
  if (f->scale_policy == MLA_POLICY_POW2) v = mla_pow2_ceil(v);
  if (f->scale_min > 0.0f && v < f->scale_min) v = f->scale_min;
  if (f->scale_max > 0.0f && v > f->scale_max) v = f->scale_max;
  return v;
}

/* Encode a scale value into the bits stored for scale_dtype (f32: its bits,
 * ue8m0 / e4m3: one byte, bf16: two bytes) and return the decoded value
 * that quantization divides by. */
MLA_HD uint32_t mla_encode_scale(int scale_dtype, float v, float *decoded) {
  uint32_t code;
  switch (scale_dtype) {
  case MLA_UE8M0:
#if defined(__CUDA_ARCH__)
    code = mla::float_to_ue8m0_up(v);
    *decoded = mla::ue8m0_to_float((uint8_t)code);
#else
    code = mla_double_to_ue8m0((double)v, 1, 1);
    *decoded = (float)mla_ue8m0_to_double((uint8_t)code);
#endif
    return code;
  case MLA_E4M3:
#if defined(__CUDA_ARCH__)
    code = mla::float_to_e4m3(v);
    *decoded = mla::e4m3_to_float((uint8_t)code);
#else
    code = mla_double_to_e4m3((double)v, 1);
    *decoded = (float)mla_e4m3_to_double((uint8_t)code);
#endif
    return code;
  case MLA_BF16:
#if defined(__CUDA_ARCH__)
    code = mla::float_to_bf16_bits(v);
#else
    code = mla_double_to_bf16((double)v);
#endif
    *decoded = mla_u2f(code << 16);
    return code;
  default: /* MLA_F32 */
    *decoded = v;
    return mla_f2u(v);
  }
}

/* A ue8m0 byte's multiplier 2^(b - 127): 0xFF is NaN, 0 the subnormal 2^-127.
 * One expression, so that it compiles to selects rather than a branch (a
 * branch a block cost the register-fed decode kernels issue slots). */
MLA_HD float mla_ue8m0_scale(uint32_t b) {
  b &= 0xFFu;
  return mla_u2f(b == 0xFFu ? 0x7FFFFFFFu : b ? b << 23 : 0x00400000u);
}

/* Decode stored scale bits (as read from the cache) into the multiplier. */
MLA_HD float mla_decode_scale(int scale_dtype, uint32_t code) {
  switch (scale_dtype) {
  case MLA_UE8M0: return mla_ue8m0_scale(code);
#if defined(__CUDA_ARCH__)
  case MLA_E4M3: return mla::e4m3_to_float((uint8_t)code);
#else
  case MLA_E4M3: return (float)mla_e4m3_to_double((uint8_t)code);
#endif
  case MLA_BF16: return mla_u2f((code & 0xFFFF) << 16);
  default: return mla_u2f(code);
  }
}

MLA_HD int mla_scale_size(int scale_dtype) {
  return scale_dtype == MLA_F32 ? 4 : scale_dtype == MLA_BF16 ? 2 : 1;
}

#endif
