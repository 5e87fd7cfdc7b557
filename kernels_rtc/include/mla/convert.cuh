/* Device-side element conversions, shared by the kernels baked in with nvcc
 * and JIT kernels. Built on CUDA's own intrinsics; src/dtype.c holds the CPU
 * formulas they are checked against, code by code. */
#ifndef MLA_CONVERT_CUH
#define MLA_CONVERT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>

#include "dtype_ids.h"
#include "platform.h"

namespace mla {

/* ---- scalar decode ---- */
__device__ __forceinline__ float e4m3_to_float(uint8_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3)));
}
__device__ __forceinline__ float e5m2_to_float(uint8_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E5M2)));
}
__device__ __forceinline__ float ue8m0_to_float(uint8_t b) {
  /* 2^(b-127); b = 0 is the subnormal 2^-127, 0xff NaN */
  if (b == 0xFF) return __int_as_float(0x7FFFFFFF);
  return b == 0 ? __int_as_float(0x00400000) : __int_as_float((int)b << 23);
}
__device__ __forceinline__ float e2m1_to_float(uint8_t nibble) {
  return __half2float(__half(__nv_cvt_fp4_to_halfraw((__nv_fp4_storage_t)(nibble & 15), __NV_E2M1)));
}
__device__ __forceinline__ float bf16_bits_to_float(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* ---- scalar encode from float (the hardware cvt paths quantizers use) ---- */
__device__ __forceinline__ uint8_t float_to_e4m3(float x) {
  return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ uint8_t float_to_ue8m0_up(float x) {
  return (uint8_t)__nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundPosInf);
}
__device__ __forceinline__ uint8_t float_to_e2m1(float x) {
  return (uint8_t)__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest);
}
__device__ __forceinline__ uint16_t float_to_bf16_bits(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

/* ---- generic element access by dtype id (tensor copies, fills, RNG) ---- */
__device__ __forceinline__ double load_double(int dtype, const void *base, int64_t i) {
  const unsigned char *p = (const unsigned char *)base;
  switch (dtype) {
  case MLA_U8: return p[i];
  case MLA_I8: return ((const signed char *)p)[i];
  case MLA_U16: return ((const unsigned short *)p)[i];
  case MLA_I16: return ((const short *)p)[i];
  case MLA_I32: return ((const int *)p)[i];
  case MLA_I64: return (double)((const long long *)p)[i];
  case MLA_F16: return __half2float(((const __half *)p)[i]);
  case MLA_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  case MLA_F32: return ((const float *)p)[i];
  case MLA_F64: return ((const double *)p)[i];
  case MLA_E4M3: return e4m3_to_float(p[i]);
  case MLA_E5M2: return e5m2_to_float(p[i]);
  case MLA_UE8M0: return ue8m0_to_float(p[i]);
  case MLA_E2M1: return e2m1_to_float((uint8_t)(p[i >> 1] >> ((i & 1) * 4)));
  default: return 0.0;
  }
}

__device__ __forceinline__ long long sat_ll(double v, double lo, double hi) {
  if (v != v) return 0;
  if (v <= lo) return (long long)lo;
  if (v >= hi) return (long long)hi;
  return (long long)v;
}

/* Mirrors mla_store_double (src/dtype.c): canonical positive NaN per format,
 * integers truncate and saturate, e2m1 written as a whole byte by the caller. */
__device__ __forceinline__ void store_double(int dtype, void *base, int64_t i, double v, int saturate,
                                             int ue8m0_up) {
  unsigned char *p = (unsigned char *)base;
  bool nan = v != v;
  switch (dtype) {
  case MLA_U8: p[i] = (unsigned char)sat_ll(v, 0, 255); break;
  case MLA_I8: ((signed char *)p)[i] = (signed char)sat_ll(v, -128, 127); break;
  case MLA_U16: ((unsigned short *)p)[i] = (unsigned short)sat_ll(v, 0, 65535); break;
  case MLA_I16: ((short *)p)[i] = (short)sat_ll(v, -32768, 32767); break;
  case MLA_I32: ((int *)p)[i] = (int)sat_ll(v, -2147483648.0, 2147483647.0); break;
  case MLA_I64:
    ((long long *)p)[i] = nan ? 0 : v <= -9223372036854775808.0 ? (long long)(-9223372036854775807LL - 1)
                      : v >= 9223372036854775808.0 ? 9223372036854775807LL : (long long)v;
    break;
  case MLA_F16: ((unsigned short *)p)[i] = nan ? 0x7FFF : __half_as_ushort(__double2half(v)); break;
  case MLA_BF16: ((unsigned short *)p)[i] = nan ? 0x7FFF : __bfloat16_as_ushort(__double2bfloat16(v)); break;
  case MLA_F32: ((unsigned *)p)[i] = nan ? 0x7FFFFFFFu : __float_as_uint(__double2float_rn(v)); break;
  case MLA_F64: ((unsigned long long *)p)[i] = nan ? 0x7FFFFFFFFFFFFFFFULL : (unsigned long long)__double_as_longlong(v); break;
  case MLA_E4M3: p[i] = nan ? 0x7F : (unsigned char)__nv_cvt_double_to_fp8(v, saturate ? __NV_SATFINITE : __NV_NOSAT, __NV_E4M3); break;
  case MLA_E5M2: p[i] = nan ? 0x7F : (unsigned char)__nv_cvt_double_to_fp8(v, saturate ? __NV_SATFINITE : __NV_NOSAT, __NV_E5M2); break;
  case MLA_UE8M0:
    p[i] = nan ? 0xFF : (unsigned char)__nv_cvt_double_to_e8m0(v, saturate ? __NV_SATFINITE : __NV_NOSAT,
                                                                ue8m0_up ? cudaRoundPosInf : cudaRoundZero);
    break;
  default: break;
  }
}

__device__ __forceinline__ uint8_t double_to_e2m1(double v) {
  return (uint8_t)__nv_cvt_double_to_fp4(v, __NV_E2M1, cudaRoundNearest);
}

} // namespace mla

#endif
