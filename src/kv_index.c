/* KV index operations over tensors (see kv.h): compaction of referenced
 * pages, top-k transforms, and the bad-index counter readout. */
#include <stdint.h>
#include <stdlib.h>

#include "device.h"
#include "kernels/kv_kernels.h"
#include "kv.h"
#include "kv_args.h"
#include "mla_error.h"
#include "ref/kv_ref.h"

int mla_kv_take_bad(int dev, int64_t *n) {
  *n = 0;
  return dev == MLA_CPU ? 0 : mla_kv_read_back(dev, NULL, NULL, n);
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

/* The outputs of one compaction. Exact mode: allocated once the count is
 * known (cap = count). Capacity mode: given by the caller, cap pages. */
typedef struct {
  mla_tensor *rows, *remap, *pages, *count; /* count: NULL in exact mode */
  int64_t cap, ncols;
  int64_t *page_list, *count_at; /* the data of pages and count (storage offsets applied) */
} compact_out;

static int resolve_outputs(compact_out *o) {
  void *p = NULL, *c = NULL;
  if (mla_tensor_data(o->pages, &p)) return mla_err_prefix("pages: ");
  if (o->count && mla_tensor_data(o->count, &c)) return mla_err_prefix("count: ");
  o->page_list = p, o->count_at = c;
  return 0;
}

static int alloc_exact(const mla_kv_cache *c, int dev, const mla_tensor *indices, int64_t count, compact_out *o) {
  int64_t rs[2] = {count * c->desc.block_size, o->ncols}, ps[1] = {count};
  o->cap = count;
  if (mla_tensor_empty(o->rows, MLA_BF16, 2, rs, dev) ||
      mla_tensor_empty(o->remap, indices->dtype, indices->ndim, indices->sizes, dev) ||
      mla_tensor_empty(o->pages, MLA_I64, 1, ps, dev))
    return -1;
  return resolve_outputs(o);
}

static int remap_arg(mla_tensor *remap, int dev, mla_kv_omat *rm) {
  if (mla_kv_arg_omat(remap, "remap", dev, rm)) return -1;
  if (remap->ndim == 1) *rm = (mla_kv_omat){rm->data, 1, rm->rows, 0, rm->rs, rm->is64};
  return 0;
}

static int compact_cpu(const mla_kv_cache *c, const mla_tensor *indices, const mla_kv_imat *idx, compact_out *o) {
  int64_t np = c->view.num_pages, count = 0;
  int32_t *flags = malloc((size_t)(np ? np : 1) * sizeof *flags), *rank = malloc((size_t)(np ? np : 1) * sizeof *rank);
  int rc = flags && rank ? 0 : mla_err("out of host memory (%lld pages)", (long long)np);
  if (!rc) rc = mla_ref_kv_rank_pages(idx, c->desc.block_size, np, flags, rank, &count);
  if (!rc && !o->count) rc = alloc_exact(c, MLA_CPU, indices, count, o);
  if (!rc) {
    const int64_t listed = count < o->cap ? count : o->cap;
    mla_kv_ivec pl = {o->page_list, listed, 1, 1};
    mla_kv_rows out;
    mla_kv_omat rm;
    mla_ref_kv_list_pages(flags, rank, np, count, o->cap, o->page_list);
    rc = mla_kv_arg_rows(o->rows, "out", MLA_CPU, 1, &out);
    if (!rc) out.cols = o->ncols, rc = mla_ref_kv_gather_pages(c, &pl, &out);
    if (!rc) rc = remap_arg(o->remap, MLA_CPU, &rm);
    if (!rc) mla_ref_kv_remap_compact(idx, rank, c->desc.block_size, np, o->cap, &rm);
    if (!rc && o->count) *o->count_at = count;
  }
  free(flags);
  free(rank);
  return rc;
}

/* The CUDA steps both modes share. Marking and ranking use the per-device
 * scratch: a 32-byte header (the ranking's ticket, then the exact mode's
 * count), then flags, ranks (F entries each) and a page list (F i64), F as
 * large as the scratch allows (fixed offsets, so a call with fewer pages
 * finds zero flags); zero when allocated, and every call leaves its flags and
 * the ticket zero. The list goes to pages when given (capacity mode: cap
 * entries, -1 tail), else to the scratch's list. */
typedef struct {
  cudaStream_t s;
  unsigned long long *bad;
  int32_t *rank;
  int64_t *count, *list; /* the scratch's count slot and page list */
} compact_run;

static int compact_mark_rank(const mla_kv_cache *c, int dev, const mla_kv_imat *idx, int64_t *count, int64_t *pages,
                             int64_t cap, compact_run *r) {
  int64_t np = c->view.num_pages, have = 0;
  if (mla_kv_cuda_ctx(dev, &r->s, &r->bad)) return -1;
  const int64_t npa = (np + 4) & ~(int64_t)3;
  unsigned int *ticket = mla_kv_scratch(dev, 32 + 16 * npa, &have);
  if (!ticket) return -1;
  const int64_t F = ((have - 32) / 16) & ~(int64_t)3; /* keeps every region 16-byte aligned */
  int32_t *flags = (int32_t *)((char *)ticket + 32);
  r->rank = flags + F;
  r->list = (int64_t *)(r->rank + F);
  r->count = (int64_t *)((char *)ticket + 16);
  if (!count) count = r->count;
  if (!pages) pages = r->list, cap = np;
  if (np <= mla_cuda_kv_mark_rank_pages_max())
    return mla_kv_launched(dev,
                           mla_cuda_kv_mark_rank_pages(idx, c->desc.block_size, np, flags, r->rank, count, pages, cap,
                                                       ticket, r->bad, r->s),
                           "mla_kv_mark_rank_pages");
  if (mla_kv_launched(dev, mla_cuda_kv_mark_pages(idx, c->desc.block_size, np, flags, r->bad, r->s), "mla_kv_mark_pages"))
    return -1;
  return mla_kv_launched(dev, mla_cuda_kv_rank_pages(flags, np, r->rank, count, pages, cap, r->s), "mla_kv_rank_pages");
}

/* Gathers the listed pages into out and remaps the indices; the remap needs
 * only the ranks, so it runs on the side stream beside the gather (both read
 * what the ranking wrote, neither writes what the other reads). */
static int compact_gather_remap(const mla_kv_cache *c, int dev, const mla_kv_imat *idx, const compact_run *r,
                                const mla_kv_ivec *list, const mla_kv_rows *out, mla_tensor *remap, int64_t cap) {
  cudaStream_t side;
  cudaEvent_t fork, join;
  mla_kv_omat rm;
  if (remap_arg(remap, dev, &rm) || mla_kv_side_stream(dev, &side, &fork, &join)) return -1;
  /* the fork is recorded before the gather, so the remap does not wait for it;
   * the gather is queued first, so the GPU starts on it at once */
  int rc = mla_cuda_check(cudaEventRecord(fork, r->s), "cudaEventRecord");
  if (!rc) rc = mla_kv_launched(dev, mla_cuda_kv_gather_pages(c, list, out, r->bad, r->s), "mla_kv_gather_pages");
  if (!rc) rc = mla_cuda_check(cudaStreamWaitEvent(side, fork, 0), "cudaStreamWaitEvent");
  if (!rc)
    rc = mla_kv_launched(dev, mla_cuda_kv_remap_compact(idx, r->rank, c->desc.block_size, c->view.num_pages, cap, &rm, side),
                         "mla_kv_remap_compact");
  if (!rc) rc = mla_cuda_check(cudaEventRecord(join, side), "cudaEventRecord");
  if (!rc) rc = mla_cuda_check(cudaStreamWaitEvent(r->s, join, 0), "cudaStreamWaitEvent");
  return rc;
}

/* Exact mode: marks, ranks and lists into the scratch, reads the count and
 * the bad-index counter back (the one host sync), allocates the rows and
 * starts their gather from the scratch's list at once (the GPU idles only
 * for that), then copies the list out and remaps; nothing waits at the end. */
static int compact_cuda_exact(const mla_kv_cache *c, int dev, const mla_tensor *indices, const mla_kv_imat *idx,
                              compact_out *o) {
  int64_t np = c->view.num_pages, count = 0, nbad = 0;
  compact_run r;
  if (compact_mark_rank(c, dev, idx, NULL, NULL, 0, &r) || mla_kv_read_back(dev, r.count, &count, &nbad)) return -1;
  if (nbad)
    return mla_err("%lld indices are past the cache (%lld pages of %d tokens; counted since the last check)",
                   (long long)nbad, (long long)np, c->desc.block_size);
  if (alloc_exact(c, dev, indices, count, o)) return -1;
  mla_kv_ivec list = {r.list, count, 1, 1};
  mla_kv_rows out = {o->rows->storage->data, o->rows->sizes[0], o->ncols, o->ncols};
  if (compact_gather_remap(c, dev, idx, &r, &list, &out, o->remap, INT64_MAX)) return -1;
  return count ? mla_cuda_check(cudaMemcpyAsync(o->page_list, r.list, (size_t)count * sizeof(int64_t),
                                                cudaMemcpyDeviceToDevice, r.s),
                                "cudaMemcpyAsync (page list)")
               : 0;
}

/* Capacity mode: every step on the stream, no host sync (CUDA-graph safe
 * once the per-device scratch has its size). The gather runs over all cap
 * pages; the list's -1 tail leaves their rows untouched. */
static int compact_cuda_into(const mla_kv_cache *c, int dev, const mla_kv_imat *idx, compact_out *o) {
  mla_kv_rows out;
  compact_run r;
  if (mla_kv_arg_rows(o->rows, "out", dev, 1, &out)) return -1;
  out.cols = o->ncols;
  if (compact_mark_rank(c, dev, idx, o->count_at, o->page_list, o->cap, &r)) return -1;
  mla_kv_ivec list = {o->page_list, o->cap, 1, 1};
  return compact_gather_remap(c, dev, idx, &r, &list, &out, o->remap, o->cap);
}

static int compact_check(const mla_kv_cache *c, int dev, const mla_tensor *indices, mla_kv_imat *idx, int64_t ncols) {
  if (index_matrix(indices, "indices", dev, idx)) return -1;
  if (ncols < 8 || ncols > c->desc.dim || ncols % 8)
    return mla_err("ncols = %lld must be a multiple of 8 in [8, %d] (the layout's dims)", (long long)ncols, c->desc.dim);
  if (mla_kv_need_tensor_scale(c, "compact")) return -1;
  if (dev != MLA_CPU && mla_device_use(dev)) return -1;
  return 0;
}

int mla_kv_compact(const mla_kv_cache *c, int dev, const mla_tensor *indices, int64_t ncols, mla_tensor *rows,
                   mla_tensor *remap, mla_tensor *pages) {
  mla_kv_imat idx;
  compact_out o = {rows, remap, pages, NULL, 0, ncols, NULL, NULL};
  if (compact_check(c, dev, indices, &idx, ncols)) return -1;
  return dev == MLA_CPU ? compact_cpu(c, indices, &idx, &o) : compact_cuda_exact(c, dev, indices, &idx, &o);
}

/* The capacity mode's outputs: rows bf16 [>= cap * bs, ncols], pages i64
 * [cap] contiguous, count i64 [1], remap of the shape of indices. */
static int into_args(const mla_kv_cache *c, int dev, const mla_tensor *indices, compact_out *o) {
  mla_kv_rows out;
  if (mla_kv_arg_rows(o->rows, "out", dev, 1, &out)) return -1;
  o->ncols = out.cols;
  if (o->pages->dtype != MLA_I64 || o->pages->ndim != 1 || !mla_tensor_is_contiguous(o->pages))
    return mla_err("pages must be a contiguous 1-dim i64 tensor (the page list, one entry per page of capacity)");
  if (mla_kv_same_device(o->pages, "pages", dev)) return -1;
  o->cap = o->pages->sizes[0];
  if (out.rows < o->cap * c->desc.block_size)
    return mla_err("out has %lld rows, fewer than pages' capacity of %lld pages x block size %d", (long long)out.rows,
                   (long long)o->cap, c->desc.block_size);
  if (o->count->dtype != MLA_I64 || mla_tensor_numel(o->count) != 1 || !mla_tensor_is_contiguous(o->count))
    return mla_err("count must be an i64 tensor of 1 element");
  if (mla_kv_same_device(o->count, "count", dev)) return -1;
  if (mla_tensor_numel(o->remap) != mla_tensor_numel(indices) || o->remap->ndim != indices->ndim)
    return mla_err("remap must have the shape of indices (%d dims, %lld elements)", indices->ndim,
                   (long long)mla_tensor_numel(indices));
  for (int i = 0; i < indices->ndim; i++)
    if (o->remap->sizes[i] != indices->sizes[i]) return mla_err("remap must have the shape of indices (dim %d differs)", i);
  return resolve_outputs(o);
}

int mla_kv_compact_into(const mla_kv_cache *c, int dev, const mla_tensor *indices, mla_tensor *rows, mla_tensor *remap,
                        mla_tensor *pages, mla_tensor *count) {
  mla_kv_imat idx;
  compact_out o = {rows, remap, pages, count, 0, 0, NULL, NULL};
  if (into_args(c, dev, indices, &o) || compact_check(c, dev, indices, &idx, o.ncols)) return -1;
  return dev == MLA_CPU ? compact_cpu(c, indices, &idx, &o) : compact_cuda_into(c, dev, &idx, &o);
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
  /* the CUDA kernel divides by block_size as a 32-bit int */
  if (block_size < 1 || block_size > INT32_MAX)
    return mla_err("block_size = %lld must be in [1, 2^31 - 1]", (long long)block_size);
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
