/* CPU reference of MLA decode attention: double precision over the
 * dequantized cache (see attn_ref.h and attn.h for the semantics). */
#include "attn_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "layout_ref.h"
#include "mla_error.h"

typedef struct ref_work {
  float *keys;          /* [kmax, dim] dequantized rows */
  unsigned char *valid; /* [kmax] */
  double *q, *score, *acc;
} ref_work;

static void work_free(ref_work *w) {
  free(w->keys), free(w->valid), free(w->q), free(w->score), free(w->acc);
}

static int work_alloc(ref_work *w, int64_t kmax, int64_t dim, int64_t dk, int64_t dv) {
  memset(w, 0, sizeof *w);
  int64_t k = kmax > 0 ? kmax : 1;
  w->keys = malloc((size_t)(k * dim) * sizeof(float));
  w->valid = malloc((size_t)k);
  w->q = malloc((size_t)dk * sizeof(double));
  w->score = malloc((size_t)k * sizeof(double));
  w->acc = malloc((size_t)(dv > 0 ? dv : 1) * sizeof(double));
  if (!w->keys || !w->valid || !w->q || !w->score || !w->acc) {
    work_free(w);
    return mla_err("attention reference: out of host memory for %lld keys of %lld dims", (long long)k, (long long)dim);
  }
  return 0;
}

/* One query row (request r, query i, head h) over the keys marked valid. */
static void attend_row(const mla_attn_args *a, const ref_work *w, int64_t dim, int64_t nkeys, int64_t r, int64_t i,
                       int64_t h, float *out, float *lse) {
  const uint16_t *q = (const uint16_t *)a->q;
  const int64_t dk = a->d_qk, dv = a->d_v;
  const int64_t qoff = r * a->q_stride[0] + i * a->q_stride[1] + h * a->q_stride[2];
  for (int64_t c = 0; c < dk; c++) w->q[c] = (double)mla_bf16_to_float(q[qoff + c * a->q_stride[3]]);
  double m = -INFINITY;
  for (int64_t j = 0; j < nkeys; j++) {
    if (!w->valid[j]) continue;
    const float *k = w->keys + j * dim;
    double s = 0.0;
    for (int64_t c = 0; c < dk; c++) s += w->q[c] * (double)k[c];
    s *= (double)a->scale;
    w->score[j] = s;
    if (s > m) m = s;
  }
  float *o = out + ((r * a->s_q + i) * a->h_q + h) * dv;
  float *l_out = lse + (r * a->h_q + h) * a->s_q + i;
  if (m == -INFINITY) { /* no key: FlashMLA's lse = +inf, output 0 */
    for (int64_t c = 0; c < dv; c++) o[c] = 0.0f;
    *l_out = INFINITY;
    return;
  }
  double l = 0.0;
  for (int64_t j = 0; j < nkeys; j++)
    if (w->valid[j]) l += exp(w->score[j] - m);
  double lse_d = m + log(l);
  for (int64_t c = 0; c < dv; c++) w->acc[c] = 0.0;
  for (int64_t j = 0; j < nkeys; j++) {
    if (!w->valid[j]) continue;
    double p = exp(w->score[j] - lse_d);
    const float *k = w->keys + j * dim;
    for (int64_t c = 0; c < dv; c++) w->acc[c] += p * (double)k[c];
  }
  double f = a->sink ? 1.0 / (1.0 + exp((double)a->sink[h] - lse_d)) : 1.0;
  for (int64_t c = 0; c < dv; c++) o[c] = (float)(w->acc[c] * f);
  *l_out = (float)lse_d;
}

static void dense_request(const mla_layout_desc *d, const mla_cache_view *v, const mla_attn_args *a, ref_work *w,
                          int64_t r, float *out, float *lse) {
  const int64_t bs = d->block_size, dim = d->dim;
  const int64_t s_k = a->cache_lens[r];
  for (int64_t p = 0; p < s_k; p++) {
    int64_t page = a->block_table[r * a->max_blocks + p / bs];
    mla_ref_dequant_token(d, v, page * bs + p % bs, w->keys + p * dim);
  }
  for (int64_t i = 0; i < a->s_q; i++) {
    /* query i of s_q sees positions [0, s_k - s_q + i] (tril(s_k - s_q)) */
    int64_t last = a->causal && a->s_q > 1 ? s_k - a->s_q + i : s_k - 1;
    for (int64_t p = 0; p < s_k; p++) w->valid[p] = p <= last;
    for (int64_t h = 0; h < a->h_q; h++) attend_row(a, w, dim, s_k, r, i, h, out, lse);
  }
}

static void sparse_query(const mla_layout_desc *d, const mla_cache_view *v, const mla_attn_args *a, ref_work *w,
                         int64_t r, int64_t i, float *out, float *lse) {
  const int64_t dim = d->dim, slots = v->num_pages * d->block_size;
  const int64_t n = a->topk_len ? a->topk_len[r] : a->topk;
  const int32_t *idx = a->indices + (r * a->s_q + i) * a->topk;
  for (int64_t j = 0; j < n; j++) {
    w->valid[j] = idx[j] >= 0 && idx[j] < slots;
    if (w->valid[j]) mla_ref_dequant_token(d, v, idx[j], w->keys + j * dim);
  }
  for (int64_t h = 0; h < a->h_q; h++) attend_row(a, w, dim, n, r, i, h, out, lse);
}

int mla_ref_attn_decode(const mla_layout_desc *d, const mla_cache_view *v, const mla_attn_args *a, float *out,
                        float *lse) {
  /* keys held at once: a sparse row's top-k, or the longest request (not the
   * block table's width, which may be far wider than any request) */
  int64_t kmax = a->sparse ? a->topk : 0;
  if (!a->sparse)
    for (int64_t r = 0; r < a->b; r++)
      if (a->cache_lens[r] > kmax) kmax = a->cache_lens[r];
  ref_work w;
  if (work_alloc(&w, kmax, d->dim, a->d_qk, a->d_v)) return -1;
  for (int64_t r = 0; r < a->b; r++) {
    if (a->sparse)
      for (int64_t i = 0; i < a->s_q; i++) sparse_query(d, v, a, &w, r, i, out, lse);
    else
      dense_request(d, v, a, &w, r, out, lse);
  }
  work_free(&w);
  return 0;
}
