/* Counter-based random numbers (Philox4x32-10), identical on the CPU and the
 * GPU: element i of a tensor draws from counter (i, 0, 0, 0) under the seed,
 * and the normal transform uses only correctly rounded + - * / sqrt in a fixed
 * order (no FMA contraction: host files build with -ffp-contract=off, device
 * code uses the _rn intrinsics), so both sides produce the same bits. */
#ifndef MLA_PHILOX_H
#define MLA_PHILOX_H

#include "platform.h"

#if defined(__CUDA_ARCH__)
#define MLA_DADD(a, b) __dadd_rn((a), (b))
#define MLA_DMUL(a, b) __dmul_rn((a), (b))
#define MLA_DDIV(a, b) __ddiv_rn((a), (b))
#define MLA_DSQRT(a) __dsqrt_rn(a)
#elif defined(__CUDACC_RTC__)
#error "philox.h: device code must see __CUDA_ARCH__"
#else
#include <math.h>
#define MLA_DADD(a, b) ((a) + (b))
#define MLA_DMUL(a, b) ((a) * (b))
#define MLA_DDIV(a, b) ((a) / (b))
#define MLA_DSQRT(a) sqrt(a)
#endif

typedef struct mla_philox_out { uint32_t v[4]; } mla_philox_out;

MLA_HD uint32_t mla_mulhilo(uint32_t a, uint32_t b, uint32_t *hi) {
  uint64_t p = (uint64_t)a * (uint64_t)b;
  *hi = (uint32_t)(p >> 32);
  return (uint32_t)p;
}

MLA_HD mla_philox_out mla_philox(uint64_t seed, uint64_t counter) {
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    uint32_t hi0, hi1;
    uint32_t lo0 = mla_mulhilo(0xD2511F53u, c0, &hi0);
    uint32_t lo1 = mla_mulhilo(0xCD9E8D57u, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
  mla_philox_out o;
  o.v[0] = c0, o.v[1] = c1, o.v[2] = c2, o.v[3] = c3;
  return o;
}

/* [0, 1) with 53 random bits from two words */
MLA_HD double mla_u01(uint32_t a, uint32_t b) {
  uint64_t m = ((uint64_t)(a >> 5) << 26) | (uint64_t)(b >> 6);
  return (double)m * (1.0 / 9007199254740992.0);
}

/* ln(x) for x > 0 finite, from exact range reduction and an atanh series. */
MLA_HD double mla_log_det(double x) {
  int e = 0;
  /* x = m * 2^e with m in [1, 2): exact scaling by powers of two */
  while (x >= 2.0) x = MLA_DMUL(x, 0.5), e++;
  while (x < 1.0) x = MLA_DMUL(x, 2.0), e--;
  if (x > 1.4142135623730951) x = MLA_DMUL(x, 0.5), e++;
  double s = MLA_DDIV(MLA_DADD(x, -1.0), MLA_DADD(x, 1.0));
  double s2 = MLA_DMUL(s, s), term = s, sum = s;
  for (int k = 3; k <= 31; k += 2) {
    term = MLA_DMUL(term, s2);
    sum = MLA_DADD(sum, MLA_DDIV(term, (double)k));
  }
  return MLA_DADD(MLA_DMUL((double)e, 0.6931471805599453), MLA_DMUL(2.0, sum));
}

/* cos(2*pi*t) for t in [0, 1): exact quadrant reduction on t, Taylor series. */
MLA_HD double mla_cos2pi_det(double t) {
  int q = (int)(t * 4.0);
  double r = MLA_DADD(t, -0.25 * q); /* exact: t and q/4 share the binade grid */
  double x = MLA_DMUL(r, 6.283185307179586), x2 = MLA_DMUL(x, x);
  double c = 1.0, s = x, tc = 1.0, ts = x;
  for (int k = 1; k <= 12; k++) {
    tc = MLA_DDIV(MLA_DMUL(tc, -x2), (double)((2 * k - 1) * (2 * k)));
    ts = MLA_DDIV(MLA_DMUL(ts, -x2), (double)((2 * k) * (2 * k + 1)));
    c = MLA_DADD(c, tc), s = MLA_DADD(s, ts);
  }
  switch (q & 3) {
  case 0: return c;
  case 1: return -s;
  case 2: return -c;
  default: return s;
  }
}

/* The value element `i` gets: uniform in [a, b) or normal(mean a, std b). */
MLA_HD double mla_rng_uniform(uint64_t seed, uint64_t i, double a, double b) {
  mla_philox_out o = mla_philox(seed, i);
  return MLA_DADD(a, MLA_DMUL(MLA_DADD(b, -a), mla_u01(o.v[0], o.v[1])));
}

MLA_HD double mla_rng_normal(uint64_t seed, uint64_t i, double mean, double std) {
  mla_philox_out o = mla_philox(seed, i);
  double u1 = MLA_DADD(1.0, -mla_u01(o.v[0], o.v[1])); /* (0, 1] */
  double u2 = mla_u01(o.v[2], o.v[3]);
  double r = MLA_DSQRT(MLA_DMUL(-2.0, mla_log_det(u1)));
  return MLA_DADD(mean, MLA_DMUL(std, MLA_DMUL(r, mla_cos2pi_det(u2))));
}

MLA_HD uint32_t mla_rng_bits(uint64_t seed, uint64_t i) { return mla_philox(seed, i).v[0]; }

#endif
