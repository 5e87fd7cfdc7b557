/* KV index operations over tensors (see kv.h): compaction of referenced
 * pages, top-k transforms, and the bad-index counter readout. */
#include <stdlib.h>

#include "device.h"
#include "kernels/kv_kernels.h"
#include "kv.h"
#include "kv_args.h"
#include "mla_error.h"
#include "ref/kv_ref.h"

int mla_kv_take_bad(int dev, int64_t *n) {
  *n = 0;
  if (dev == MLA_CPU) return 0;
  unsigned long long *bad = mla_kv_bad_counter(dev), host = 0;
  if (!bad) return -1;
  cudaStream_t s = mla_device_stream(dev);
  if (!s || mla_cuda_check(cudaMemcpyAsync(&host, bad, sizeof host, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync") ||
      mla_device_sync(dev) || mla_cuda_check(cudaMemsetAsync(bad, 0, sizeof host, s), "cudaMemsetAsync"))
    return -1;
  *n = (int64_t)host;
  return 0;
}

/* Indices of any 1- or 2-dim shape as a matrix (1-dim: one row). */
static int index_matrix(const mla_tensor *t, const char *name, int dev, mla_kv_imat *m) {
  if (t->ndim != 1) return mla_kv_arg_imat(t, name, dev, m);
  mla_kv_ivec v;
  if (mla_kv_arg_ivec(t, name, dev, &v)) return -1;
  *m = (mla_kv_imat){v.data, 1, v.n, 0, v.stride, v.is64};
  return 0;
}

/* ---- compaction ------------------------------------------------------------ */

static int compact_outputs(const mla_kv_cache *c, int dev, const mla_tensor *indices, int64_t count, int64_t ncols,
                           mla_tensor *rows, mla_tensor *remap, mla_tensor *pages) {
  int64_t rs[2] = {count * c->desc.block_size, ncols}, ps[1] = {count};
  if (mla_tensor_empty(rows, MLA_BF16, 2, rs, dev) || mla_tensor_empty(remap, indices->dtype, indices->ndim, indices->sizes, dev) ||
      mla_tensor_empty(pages, MLA_I64, 1, ps, dev))
    return -1;
  return 0;
}

static int compact_cpu(const mla_kv_cache *c, const mla_tensor *indices, const mla_kv_imat *idx, int64_t ncols,
                       mla_tensor *rows, mla_tensor *remap, mla_tensor *pages) {
  int64_t np = c->view.num_pages, count = 0;
  int32_t *flags = malloc((size_t)(np ? np : 1) * sizeof *flags), *rank = malloc((size_t)(np ? np : 1) * sizeof *rank);
  int rc = flags && rank ? 0 : mla_err("out of host memory (%lld pages)", (long long)np);
  if (!rc) rc = mla_ref_kv_rank_pages(idx, c->desc.block_size, np, flags, rank, &count);
  if (!rc) rc = compact_outputs(c, MLA_CPU, indices, count, ncols, rows, remap, pages);
  if (!rc) {
    mla_kv_ivec pl = {pages->storage->data, count, 1, 1};
    mla_kv_rows out = {rows->storage->data, rows->sizes[0], ncols, ncols};
    mla_kv_omat rm;
    mla_ref_kv_list_pages(flags, rank, np, pages->storage->data);
    rc = mla_ref_kv_gather_pages(c, &pl, &out);
    if (!rc) rc = mla_kv_arg_omat(remap, "remap", MLA_CPU, &rm);
    if (!rc) {
      if (remap->ndim == 1) rm = (mla_kv_omat){rm.data, 1, rm.rows, 0, rm.rs, rm.is64};
      mla_ref_kv_remap_compact(idx, rank, c->desc.block_size, np, &rm);
    }
  }
  free(flags);
  free(rank);
  return rc;
}

static int compact_cuda(const mla_kv_cache *c, int dev, const mla_tensor *indices, const mla_kv_imat *idx,
                        int64_t ncols, mla_tensor *rows, mla_tensor *remap, mla_tensor *pages) {
  int64_t np = c->view.num_pages, count = 0, nbad = 0;
  int64_t scratch = 2 * (np ? np : 1) * (int64_t)sizeof(int32_t) + (int64_t)sizeof(int64_t);
  unsigned long long *bad = mla_kv_bad_counter(dev);
  cudaStream_t s = mla_device_stream(dev);
  void *buf = NULL;
  if (!bad || !s || mla_device_alloc(dev, scratch, &buf)) return -1;
  int64_t *dcount = buf;
  int32_t *flags = (int32_t *)(dcount + 1), *rank = flags + (np ? np : 1);
  int rc = mla_kv_launched(dev, mla_cuda_kv_mark_pages(idx, c->desc.block_size, np, flags, bad, s), "mla_kv_mark_pages");
  if (!rc) rc = mla_kv_launched(dev, mla_cuda_kv_rank_pages(flags, np, rank, dcount, s), "mla_kv_rank_pages");
  if (!rc) rc = mla_cuda_check(cudaMemcpyAsync(&count, dcount, sizeof count, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
  if (!rc) rc = mla_kv_take_bad(dev, &nbad); /* synchronizes: count is valid after it */
  if (!rc && nbad)
    rc = mla_err("%lld indices are past the cache (%lld pages of %d tokens; counted since the last check)", (long long)nbad,
                 (long long)np, c->desc.block_size);
  if (!rc) rc = compact_outputs(c, dev, indices, count, ncols, rows, remap, pages);
  if (!rc) rc = mla_kv_launched(dev, mla_cuda_kv_list_pages(flags, rank, np, pages->storage->data, s), "mla_kv_list_pages");
  if (!rc) {
    mla_kv_ivec pl = {pages->storage->data, count, 1, 1};
    mla_kv_rows out = {rows->storage->data, rows->sizes[0], ncols, ncols};
    rc = mla_kv_launched(dev, mla_cuda_kv_gather_pages(c, &pl, &out, bad, s), "mla_kv_gather_pages");
  }
  if (!rc) {
    mla_kv_omat rm;
    rc = mla_kv_arg_omat(remap, "remap", dev, &rm);
    if (remap->ndim == 1) rm = (mla_kv_omat){rm.data, 1, rm.rows, 0, rm.rs, rm.is64};
    if (!rc) rc = mla_kv_launched(dev, mla_cuda_kv_remap_compact(idx, rank, c->desc.block_size, np, &rm, s), "mla_kv_remap_compact");
  }
  if (!rc) rc = mla_device_sync(dev); /* the scratch goes back to the allocator */
  mla_device_free(dev, buf, scratch);
  return rc;
}

int mla_kv_compact(const mla_kv_cache *c, int dev, const mla_tensor *indices, int64_t ncols, mla_tensor *rows,
                   mla_tensor *remap, mla_tensor *pages) {
  mla_kv_imat idx;
  if (index_matrix(indices, "indices", dev, &idx)) return -1;
  if (ncols < 8 || ncols > c->desc.dim || ncols % 8)
    return mla_err("ncols = %lld must be a multiple of 8 in [8, %d] (the layout's dims)", (long long)ncols, c->desc.dim);
  if (mla_kv_need_tensor_scale(c, "compact")) return -1;
  if (dev == MLA_CPU) return compact_cpu(c, indices, &idx, ncols, rows, remap, pages);
  if (mla_device_use(dev)) return -1;
  return compact_cuda(c, dev, indices, &idx, ncols, rows, remap, pages);
}

/* ---- top-k transforms -------------------------------------------------------- */

static int topk_args(int dev, const mla_tensor *topk, const mla_tensor *token_req, const mla_tensor *cu_q,
                     mla_tensor *out, mla_tensor *lens, mla_kv_imat *tk, mla_kv_token_req *req, mla_kv_omat *o,
                     mla_kv_omat *l) {
  if (mla_kv_arg_imat(topk, "topk", dev, tk) || mla_kv_arg_omat(out, "out", dev, o) ||
      mla_kv_arg_omat(lens, "lens", dev, l) || mla_kv_arg_ivec(token_req, "token_req", dev, &req->token_req) ||
      mla_kv_arg_ivec(cu_q, "cu_q", dev, &req->cu_q))
    return -1;
  if (token_req && cu_q) return mla_err("give the request of each query token as token_req or as cu_q, not both");
  if (o->rows != tk->rows || o->cols != tk->cols)
    return mla_err("out is [%lld, %lld], topk is [%lld, %lld]; expected the same shape", (long long)o->rows,
                   (long long)o->cols, (long long)tk->rows, (long long)tk->cols);
  if (lens && (l->rows != tk->rows || l->cols != 1))
    return mla_err("lens must hold one entry per topk row (%lld), got [%lld, %lld]", (long long)tk->rows,
                   (long long)l->rows, (long long)l->cols);
  if (token_req && req->token_req.n < tk->rows)
    return mla_err("token_req has %lld entries for %lld query tokens", (long long)req->token_req.n, (long long)tk->rows);
  if (cu_q && req->cu_q.n < 1) return mla_err("cu_q needs B + 1 entries, got 0");
  return 0;
}

int mla_kv_topk_paged(int dev, const mla_tensor *topk, const mla_tensor *block_table, int64_t block_size,
                      const mla_tensor *token_req, const mla_tensor *cu_q, mla_tensor *out, mla_tensor *lens) {
  mla_kv_imat tk, bt;
  mla_kv_token_req req;
  mla_kv_omat o, l;
  if (topk_args(dev, topk, token_req, cu_q, out, lens, &tk, &req, &o, &l) ||
      mla_kv_arg_imat(block_table, "block_table", dev, &bt))
    return -1;
  if (block_size < 1) return mla_err("block_size = %lld must be positive", (long long)block_size);
  if (dev == MLA_CPU) return mla_ref_kv_topk_paged(&tk, &req, &bt, block_size, &o, lens ? &l : NULL);
  unsigned long long *bad = NULL;
  if (mla_device_use(dev) || !(bad = mla_kv_bad_counter(dev))) return -1;
  return mla_kv_launched(dev, mla_cuda_kv_topk_paged(&tk, &req, &bt, block_size, &o, lens ? &l : NULL, bad, mla_device_stream(dev)),
                  "mla_kv_topk_paged");
}

int mla_kv_topk_ragged(int dev, const mla_tensor *topk, const mla_tensor *cu_k, const mla_tensor *token_req,
                       const mla_tensor *cu_q, mla_tensor *out, mla_tensor *lens) {
  mla_kv_imat tk;
  mla_kv_token_req req;
  mla_kv_omat o, l;
  mla_kv_ivec ck;
  if (topk_args(dev, topk, token_req, cu_q, out, lens, &tk, &req, &o, &l) || mla_kv_arg_ivec(cu_k, "cu_k", dev, &ck))
    return -1;
  if (ck.n < 1) return mla_err("cu_k needs B + 1 entries, got 0");
  if (dev == MLA_CPU) return mla_ref_kv_topk_ragged(&tk, &req, &ck, &o, lens ? &l : NULL);
  unsigned long long *bad = NULL;
  if (mla_device_use(dev) || !(bad = mla_kv_bad_counter(dev))) return -1;
  return mla_kv_launched(dev, mla_cuda_kv_topk_ragged(&tk, &req, &ck, &o, lens ? &l : NULL, bad, mla_device_stream(dev)),
                  "mla_kv_topk_ragged");
}
