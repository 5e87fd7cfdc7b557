/* Tensor comparison for verdicts (exact bytes, allclose, cosine, NMSE): one
 * pass that gathers every statistic the Lua side needs. Runs on the GPU when
 * either tensor lives there (the other is copied over, never the GPU one to
 * the host), on the CPU otherwise; both give the same bits (see
 * kernels/compare_kernels.h for the fixed reduction order). */
#ifndef MLA_COMPARE_H
#define MLA_COMPARE_H

#include "kernels/compare_kernels.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mla_cmp_value {
  int64_t idx; /* logical (row-major) index, -1 when none */
  double a, b;
  uint64_t abits, bbits;
} mla_cmp_value;

typedef struct mla_cmp_result {
  mla_cmp_partial total;
  int64_t numel;
  int device; /* where the reduction ran */
  int nfirst;
  mla_cmp_value first[MLA_CMP_MAX_FIRST]; /* the first failing elements, in index order */
  mla_cmp_value at_max_abs, at_max_rel;
} mla_cmp_result;

/* Shapes must match; T_EXACT needs equal dtypes. first_k <= MLA_CMP_MAX_FIRST. */
int mla_compare(const mla_tensor *a, const mla_tensor *b, const mla_cmp_params *p, int first_k, mla_cmp_result *r);

#ifdef __cplusplus
}
#endif
#endif
