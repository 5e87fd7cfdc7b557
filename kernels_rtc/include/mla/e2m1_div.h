/* The e2m1 codes of x / s for 8 bf16 x, without a division and on packed
 * f16 pairs for most of the work (mla/f16x2.h): the same source for the
 * kernels (mla::e2m1x8_encode_bf16_div in token_access.cuh) and for the CPU
 * specs, which run it on every input of its domain against the reference
 * division and encoder (src/l_e2m1_check.c). Bit-identical to
 * e2m1(x / s) (fp32 division, satfinite ties-to-even e2m1) when s is an e4m3
 * value in [2^-9, 448] and r = 1 / s rounded to fp32, for every non-NaN bf16
 * x (a NaN in a group makes its scale NaN; a NaN s gives 0x7 everywhere, as
 * the reference does). w holds elements 2j (low half) and 2j + 1 of word j.
 *  - quotient: q = x * r in fp32, then rounded to f16 (two per cvt; past
 *    65504 it is inf). A bf16 x has 8 significant bits and s 4, so x / s is
 *    either exactly an e2m1 midpoint or >= 2^-9 (relative) away from every
 *    midpoint. Midpoints are f16 values and q is within 2^-22 of x / s, so the
 *    f16 rounding lands exactly on a midpoint when x / s is one, and never
 *    crosses one otherwise (f16 rounding moves by < 2^-11);
 *  - a = min(|q|, 6), then rounded to e2m1's grid (0.5 below 2, 1 in [2, 4),
 *    2 in [4, 8)) by adding and subtracting m = 512 * 2^max(e, 0) (e the
 *    exponent of a): a + m has ulp 2^(e - 1) and m is even in it, so the f16
 *    rounding of the sum is the ties-to-even rounding of a;
 *  - the rounded v times 2^-14 has the e2m1 code in bits 9..11 of each f16
 *    (exponent bias 15 - 14 = 1, as e2m1's; 0.5 becomes the subnormal 2^-15);
 *  - the sign is x's (all 8 signs moved into place by 4 byte permutes). */
#ifndef MLA_E2M1_DIV_H
#define MLA_E2M1_DIV_H

#include "f16x2.h"
#include "quant_math.h" /* mla_f2u, mla_u2f */

MLA_HD float mla_fmul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b); /* never contracted into an fma */
#else
  return a * b;
#endif
}

MLA_HD uint32_t mla_e2m1x8_encode_bf16_div(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, float s, float r) {
  if (s != s) return 0x77777777u;
  const uint32_t ws[4] = {w0, w1, w2, w3};
  uint32_t c[4];
  MLA_UNROLL
  for (int j = 0; j < 4; j++) {
    const float lo = mla_fmul_rn(mla_u2f(ws[j] << 16), r), hi = mla_fmul_rn(mla_u2f(ws[j] & 0xFFFF0000u), r);
    const uint32_t h = mla_f16x2_cvt(hi, lo);
    const uint32_t a = mla_f16x2_minmax(h & 0x7FFF7FFFu, 0x46004600u, 0); /* min(|q|, 6) */
    const uint32_t m = mla_f16x2_minmax(a & 0x7C007C00u, 0x3C003C00u, 1); /* 2^max(e, 0) */
    const uint32_t t = mla_f16x2_fma(m, 0x60006000u, a);             /* a + 512 m */
    c[j] = mla_f16x2_mul(mla_f16x2_fma(m, 0xE000E000u, t), 0x04000400u); /* (t - 512 m) * 2^-14 */
  }
  /* codes of elements 2j, 2j + 1 in bits 9 and 25 of c[j]: bytes of A are
   * elements 0, 2, 1, 3 (B: 4, 6, 5, 7); A | A >> 12 puts 0..3 in nibbles 0..3 */
  const uint32_t A = (c[0] >> 9) | (c[1] >> 1), B = (c[2] >> 9) | (c[3] >> 1);
  const uint32_t out = mla_prmt(A | (A >> 12), B | (B >> 12), 0x5410u);
  /* the sign of element k to bit 4k + 3 for all 8 at once: the high byte of
   * every bf16 gathered, then each replicated from its sign (prmt's msb mode) */
  const uint32_t lo = mla_prmt(w0, w1, 0x7351u), hi = mla_prmt(w2, w3, 0x7351u);
  const uint32_t ev = mla_prmt(lo, hi, 0xDC98u); /* byte j: 0xff if element 2j < 0 */
  const uint32_t od = mla_prmt(lo, hi, 0xFEBAu); /* byte j: 0xff if element 2j + 1 < 0 */
  return out | (((ev & 0x0F0F0F0Fu) | (od & 0xF0F0F0F0u)) & 0x88888888u);
}

#endif
