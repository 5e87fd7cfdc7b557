/* Comparison of two tensors element by element, shared by the CPU path
 * (src/compare.c) and the GPU kernels (compare_kernels.cu).
 *
 * Both paths reduce in the same fixed order, so they return the same bits:
 * the logical index range is cut into chunks of MLA_CMP_CHUNK elements;
 * inside a chunk, "lane" t (0..255) accumulates elements t, t+256, ... in
 * order, then lanes are combined by the same pairwise tree (128, 64, ..., 1);
 * chunk results are summed on the host in chunk order. Arithmetic goes
 * through MLA_DMUL/MLA_DADD/MLA_DSUB/MLA_DDIV, which never contract to FMA. */
#ifndef MLA_COMPARE_KERNELS_H
#define MLA_COMPARE_KERNELS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "tensor_kernels.h"

#ifdef __CUDACC__
#define MLA_CMP_FN __device__ __forceinline__ /* the CUDA file needs only the device side */
#define MLA_DMUL(a, b) __dmul_rn(a, b)
#define MLA_DADD(a, b) __dadd_rn(a, b)
#define MLA_DSUB(a, b) __dsub_rn(a, b)
#define MLA_DDIV(a, b) __ddiv_rn(a, b)
#else
#define MLA_CMP_FN static inline
#define MLA_DMUL(a, b) ((a) * (b)) /* the C core builds with -ffp-contract=off */
#define MLA_DADD(a, b) ((a) + (b))
#define MLA_DSUB(a, b) ((a) - (b))
#define MLA_DDIV(a, b) ((a) / (b))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define MLA_CMP_LANES 256
#define MLA_CMP_PER_LANE 32
#define MLA_CMP_CHUNK (MLA_CMP_LANES * MLA_CMP_PER_LANE)
#define MLA_CMP_MAX_FIRST 64

/* Element tests (bit mask) */
enum {
  MLA_CMP_T_EXACT = 1,   /* the element's bits must be identical */
  MLA_CMP_T_CLOSE = 2,   /* finite pairs within atol or rtol */
  MLA_CMP_T_SPECIAL = 4, /* NaN, +inf, -inf at the same positions */
  MLA_CMP_T_NO_NAN = 8,  /* any NaN fails (ggml) */
};

typedef struct mla_cmp_params {
  int32_t tests;
  int32_t pad_;
  double atol, rtol;
} mla_cmp_params;

/* The reduction state of one lane, one chunk, or the whole tensor. */
typedef struct mla_cmp_partial {
  double sum_ab, sum_aa, sum_bb, sum_dd; /* over pairs where both are finite */
  double max_abs, max_rel;               /* -1 when no finite pair was seen */
  int64_t max_abs_idx, max_rel_idx;      /* logical index, -1 when none */
  int64_t count;                         /* elements visited */
  int64_t bad;                           /* elements failing any enabled test */
  int64_t bits_diff;                     /* elements whose bits differ */
  int64_t close_fail;                    /* finite pairs outside atol and rtol */
  int64_t class_diff;                    /* positions where NaN/+inf/-inf differ */
  int64_t nan_a, nan_b, inf_a, inf_b;
  int64_t first_bad;                     /* smallest failing index, -1 when none */
} mla_cmp_partial;

MLA_CMP_FN void mla_cmp_init(mla_cmp_partial *p) {
  p->sum_ab = p->sum_aa = p->sum_bb = p->sum_dd = 0.0;
  p->max_abs = p->max_rel = -1.0;
  p->max_abs_idx = p->max_rel_idx = -1;
  p->count = p->bad = p->bits_diff = p->close_fail = p->class_diff = 0;
  p->nan_a = p->nan_b = p->inf_a = p->inf_b = 0;
  p->first_bad = -1;
}

/* 0 finite, 1 NaN, 2 +inf, 3 -inf */
MLA_CMP_FN int mla_cmp_class(double v) {
  if (v != v) return 1;
  if (v == __builtin_inf()) return 2;
  if (v == -__builtin_inf()) return 3;
  return 0;
}

MLA_CMP_FN void mla_cmp_take_max(double *m, int64_t *mi, double v, int64_t vi) {
  if (v > *m || (v == *m && vi >= 0 && (*mi < 0 || vi < *mi))) *m = v, *mi = vi;
}

/* One element: a and b decoded exactly to double, their raw bits, its logical index. */
MLA_CMP_FN void mla_cmp_elem(const mla_cmp_params *p, mla_cmp_partial *s, double a, double b, uint64_t abits,
                         uint64_t bbits, int64_t idx) {
  int ca = mla_cmp_class(a), cb = mla_cmp_class(b);
  int bad = 0;
  s->count++;
  if (abits != bbits) {
    s->bits_diff++;
    if (p->tests & MLA_CMP_T_EXACT) bad = 1;
  }
  s->nan_a += ca == 1, s->nan_b += cb == 1;
  s->inf_a += ca >= 2, s->inf_b += cb >= 2;
  if (ca != cb) {
    s->class_diff++;
    if (p->tests & (MLA_CMP_T_SPECIAL | MLA_CMP_T_CLOSE)) bad = 1;
  }
  if ((p->tests & MLA_CMP_T_NO_NAN) && (ca == 1 || cb == 1)) bad = 1;
  if (ca == 0 && cb == 0) {
    double d = MLA_DSUB(a, b), ad = d < 0 ? -d : d, ab = b < 0 ? -b : b;
    /* equal values have no relative error, whatever b is */
    double rel = ad == 0.0 ? 0.0 : ab == 0.0 ? __builtin_inf() : MLA_DDIV(ad, ab);
    s->sum_ab = MLA_DADD(s->sum_ab, MLA_DMUL(a, b));
    s->sum_aa = MLA_DADD(s->sum_aa, MLA_DMUL(a, a));
    s->sum_bb = MLA_DADD(s->sum_bb, MLA_DMUL(b, b));
    s->sum_dd = MLA_DADD(s->sum_dd, MLA_DMUL(d, d));
    mla_cmp_take_max(&s->max_abs, &s->max_abs_idx, ad, idx);
    mla_cmp_take_max(&s->max_rel, &s->max_rel_idx, rel, idx);
    /* FlashMLA's rule, strict as stated: |a-b| < atol or |a-b|/|b| < rtol */
    if (ad != 0.0 && !(ad < p->atol || rel < p->rtol)) {
      s->close_fail++;
      if (p->tests & MLA_CMP_T_CLOSE) bad = 1;
    }
  }
  if (bad) {
    s->bad++;
    if (s->first_bad < 0 || idx < s->first_bad) s->first_bad = idx;
  }
}

/* s += o (sums in the order s, o) */
MLA_CMP_FN void mla_cmp_merge(mla_cmp_partial *s, const mla_cmp_partial *o) {
  s->sum_ab = MLA_DADD(s->sum_ab, o->sum_ab);
  s->sum_aa = MLA_DADD(s->sum_aa, o->sum_aa);
  s->sum_bb = MLA_DADD(s->sum_bb, o->sum_bb);
  s->sum_dd = MLA_DADD(s->sum_dd, o->sum_dd);
  mla_cmp_take_max(&s->max_abs, &s->max_abs_idx, o->max_abs, o->max_abs_idx);
  mla_cmp_take_max(&s->max_rel, &s->max_rel_idx, o->max_rel, o->max_rel_idx);
  s->count += o->count, s->bad += o->bad, s->bits_diff += o->bits_diff;
  s->close_fail += o->close_fail, s->class_diff += o->class_diff;
  s->nan_a += o->nan_a, s->nan_b += o->nan_b, s->inf_a += o->inf_a, s->inf_b += o->inf_b;
  if (o->first_bad >= 0 && (s->first_bad < 0 || o->first_bad < s->first_bad)) s->first_bad = o->first_bad;
}

/* The fixed lane tree: lane t takes lane t+s for s = 128, 64, ..., 1. */
MLA_CMP_FN void mla_cmp_tree(mla_cmp_partial *lanes) {
  for (int s = MLA_CMP_LANES / 2; s > 0; s >>= 1)
    for (int t = 0; t < s; t++) mla_cmp_merge(&lanes[t], &lanes[t + s]);
}

/* Launchers (GPU). Each returns the launch's status; the caller checks it
 * with mla_launch_check. Descriptors as in tensor_kernels.h; `contig` says
 * the element index is offset + logical index. */
cudaError_t mla_cuda_compare_chunks(const mla_strided_desc *a, int a_contig, const mla_strided_desc *b,
                                    int b_contig, const mla_cmp_params *p, int64_t n,
                                    mla_cmp_partial *out /* device, one per chunk */, int sm_count,
                                    cudaStream_t s);
/* For each listed chunk, the logical indices of its first `k` failing
 * elements in order (out[c*k + j], -1 past the end). One thread per chunk. */
cudaError_t mla_cuda_compare_collect(const mla_strided_desc *a, int a_contig, const mla_strided_desc *b,
                                     int b_contig, const mla_cmp_params *p, int64_t n, const int64_t *chunks,
                                     int nchunks, int k, int64_t *out, cudaStream_t s);
/* Decoded values and raw bits of a and b at the given logical indices. */
cudaError_t mla_cuda_compare_probe(const mla_strided_desc *a, int a_contig, const mla_strided_desc *b,
                                   int b_contig, const int64_t *idx, int n, double *va, double *vb,
                                   uint64_t *ba, uint64_t *bb, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
