/* Packed f16 pairs for code shared by the device and the C host: PTX's
 * cvt.rn.f16x2.f32, min / max / fma.rn / mul.rn .f16x2 and prmt.b32. On the
 * device they are those instructions; on the host the same IEEE operations
 * in software (round to nearest even, subnormals kept, overflow to inf, NaN
 * canonical 0x7fff), so that an algorithm built on them (mla/e2m1_div.h)
 * runs bit for bit the same in the CPU specs as in the kernels. The high
 * half of a word is the first operand of cvt, as in PTX. */
#ifndef MLA_F16X2_H
#define MLA_F16X2_H

#include "platform.h"

#if !defined(__CUDA_ARCH__)
#include <math.h>

/* f16 bits -> its exact value */
static inline double mla_h2d(uint32_t h) {
  const int e = (int)((h >> 10) & 31u), m = (int)(h & 1023u);
  const double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
  return (h & 0x8000u) ? -v : v;
}

/* v rounded to f16 (ties to even), where the exact value is v plus a
 * residual below v's own precision of sign rs (-1, 0, 1): it decides only
 * when v is exactly halfway between two f16 values. */
static inline uint32_t mla_d2h(double v, int rs) {
  if (v != v) return 0x7FFFu;
  const uint32_t sign = signbit(v) ? 0x8000u : 0u;
  const double a = fabs(v);
  if (sign) rs = -rs;
  if (isinf(a)) return sign | 0x7C00u;
  int ex;
  frexp(a, &ex); /* a in [2^(ex-1), 2^ex) */
  const int qe = ex - 11 < -24 ? -24 : ex - 11; /* the f16 spacing there (subnormal: 2^-24) */
  const double n = ldexp(a, -qe), fr = n - floor(n);
  double k = floor(n);
  if (fr > 0.5 || (fr == 0.5 && (rs > 0 || (rs == 0 && fmod(k, 2.0) != 0.0)))) k += 1.0;
  const double r = ldexp(k, qe);
  if (r >= 65536.0) return sign | 0x7C00u;
  if (r < 0x1p-14) return sign | (uint32_t)ldexp(r, 24);
  frexp(r, &ex);
  return sign | (uint32_t)(ex + 14) << 10 | ((uint32_t)ldexp(r, 11 - ex) - 1024u);
}

/* x * y + z on f16 values, rounded once: the product is exact in double, and
 * TwoSum recovers what the double sum dropped */
static inline uint32_t mla_h_fma(uint32_t a, uint32_t b, uint32_t c) {
  const double x = mla_h2d(a), y = mla_h2d(b), z = mla_h2d(c), p = x * y, s = p + z;
  if (s != s) return 0x7FFFu;
  if (isinf(s) || isinf(p) || isinf(z)) return mla_d2h(s, 0);
  const double bp = s - p, e = (p - (s - bp)) + (z - bp);
  return mla_d2h(s, e > 0 ? 1 : e < 0 ? -1 : 0);
}

/* PTX min / max.f16: a NaN operand yields the other one (two NaNs: the
 * canonical NaN); -0 counts as below +0 */
static inline uint32_t mla_h_minmax(uint32_t a, uint32_t b, int want_max) {
  const double x = mla_h2d(a), y = mla_h2d(b);
  if (x != x) return y != y ? 0x7FFFu : b;
  if (y != y) return a;
  if (x == y) return ((a & 0x8000u) != 0) == (want_max != 0) ? b : a;
  return (x < y) == (want_max != 0) ? b : a;
}

#define MLA_H2_LO(w) ((w) & 0xFFFFu)
#define MLA_H2_HI(w) ((w) >> 16)
#endif

/* (f16(hi), f16(lo)) */
MLA_HD uint32_t mla_f16x2_cvt(float hi, float lo) {
#if defined(__CUDA_ARCH__)
  uint32_t h;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(hi), "f"(lo));
  return h;
#else
  return mla_d2h((double)hi, 0) << 16 | mla_d2h((double)lo, 0);
#endif
}

/* min (want_max 0) or max of each half */
MLA_HD uint32_t mla_f16x2_minmax(uint32_t a, uint32_t b, int want_max) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  if (want_max) asm("max.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  else asm("min.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  return mla_h_minmax(MLA_H2_HI(a), MLA_H2_HI(b), want_max) << 16 | mla_h_minmax(MLA_H2_LO(a), MLA_H2_LO(b), want_max);
#endif
}

/* a * b + c, rounded once */
MLA_HD uint32_t mla_f16x2_fma(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  return mla_h_fma(MLA_H2_HI(a), MLA_H2_HI(b), MLA_H2_HI(c)) << 16 | mla_h_fma(MLA_H2_LO(a), MLA_H2_LO(b), MLA_H2_LO(c));
#endif
}

MLA_HD uint32_t mla_f16x2_mul(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  return mla_d2h(mla_h2d(MLA_H2_HI(a)) * mla_h2d(MLA_H2_HI(b)), 0) << 16 |
         mla_d2h(mla_h2d(MLA_H2_LO(a)) * mla_h2d(MLA_H2_LO(b)), 0);
#endif
}

/* prmt.b32 d, a, b, sel (default mode): byte i of d is byte sel[4i..4i+2]
 * of b:a (a's bytes 0-3, b's 4-7), or its sign replicated when sel's bit
 * 4i+3 is set */
MLA_HD uint32_t mla_prmt(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
#else
  const uint64_t x = (uint64_t)b << 32 | a;
  uint32_t d = 0;
  for (int i = 0; i < 4; i++) {
    const uint32_t s = (sel >> (4 * i)) & 15u;
    uint32_t byte = (uint32_t)(x >> (8 * (s & 7u))) & 0xFFu;
    if (s & 8u) byte = (byte & 0x80u) ? 0xFFu : 0u;
    d |= byte << (8 * i);
  }
  return d;
#endif
}

#endif
