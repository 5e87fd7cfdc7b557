/* Element types and bit-exact conversions on the CPU.
 * Every narrow format follows CUDA's own conversion intrinsics (cuda_fp8.h,
 * cuda_bf16.h, cuda_fp4.h): round-to-nearest-even, the same saturation and
 * NaN rules. The GPU specs compare these formulas with the intrinsics over
 * every code. */
#ifndef MLA_DTYPE_H
#define MLA_DTYPE_H

#include <stdint.h>

#include "mla/dtype_ids.h"

#ifdef __cplusplus
extern "C" {
#endif

/* mla_dtype: the ids shared with device code */


typedef struct mla_dtype_info {
  const char *name;
  int bits;      /* storage bits per element (4 for e2m1) */
  int is_float;  /* decodes to a real number with a fraction */
  int is_signed;
} mla_dtype_info;

const mla_dtype_info *mla_dtype_info_of(mla_dtype t);
const char *mla_dtype_name(mla_dtype t);
/* Accepts canonical names and common aliases ("float32", "bfloat16",
 * "float8_e4m3fn", "fp8", "fp4"...). Returns 0 on success. */
int mla_dtype_parse(const char *name, mla_dtype *out);
/* Bytes per element, or 0 for sub-byte types. */
int mla_dtype_size(mla_dtype t);

/* Conversion options for narrowing stores. */
typedef struct mla_cvt_opts {
  int saturate;     /* fp8: 1 = satfinite (CUDA kernels), 0 = overflow to NaN/inf (torch .to) */
  int ue8m0_round_up; /* ue8m0: 1 = cudaRoundPosInf, 0 = cudaRoundZero */
} mla_cvt_opts;
extern const mla_cvt_opts mla_cvt_default; /* {saturate=1, ue8m0_round_up=1} */

/* Decoding: every narrow code to double, exactly. */
double mla_e4m3_to_double(uint8_t b);
double mla_e5m2_to_double(uint8_t b);
double mla_ue8m0_to_double(uint8_t b);
double mla_e2m1_to_double(uint8_t nibble);
float mla_bf16_to_float(uint16_t h);
float mla_f16_to_float(uint16_t h);

/* Encoding from double (which holds any float exactly). */
uint8_t mla_double_to_e4m3(double x, int saturate);
uint8_t mla_double_to_e5m2(double x, int saturate);
uint8_t mla_double_to_ue8m0(double x, int saturate, int round_up);
uint8_t mla_double_to_e2m1(double x); /* satfinite, NaN -> +6 */
uint16_t mla_double_to_bf16(double x);
uint16_t mla_double_to_f16(double x);
float mla_double_to_f32(double x);    /* RNE, NaN canonical 0x7fffffff */
static inline uint16_t mla_float_to_bf16(float x) { return mla_double_to_bf16((double)x); }

/* Element access through a byte base pointer and an element index
 * (sub-byte types address nibbles). */
double mla_load_double(mla_dtype t, const void *base, int64_t idx);
void mla_store_double(mla_dtype t, void *base, int64_t idx, double v, const mla_cvt_opts *o);
/* Integers keep their exact value through int64 (u64 is not a dtype). */
int64_t mla_load_int(mla_dtype t, const void *base, int64_t idx);

#ifdef __cplusplus
}
#endif
#endif
