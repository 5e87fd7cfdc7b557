/* CPU references of the KV-cache operations (see kv_ref.h). */
#include "kv_ref.h"

#include <string.h>

#include "dtype.h"
#include "layout_check.h"
#include "mla/quant_math.h"
#include "mla_error.h"
#include "ref/layout_ref.h"

/* ---- index access ------------------------------------------------------- */

static int64_t ld_idx(const void *p, int64_t e, int is64) {
  return is64 ? ((const int64_t *)p)[e] : (int64_t)((const int32_t *)p)[e];
}
static int64_t ivec_at(const mla_kv_ivec *v, int64_t i) { return ld_idx(v->data, i * v->stride, v->is64); }
static int64_t imat_at(const mla_kv_imat *m, int64_t r, int64_t c) { return ld_idx(m->data, r * m->rs + c * m->cs, m->is64); }
static void omat_set(const mla_kv_omat *m, int64_t r, int64_t c, int64_t v) {
  int64_t e = r * m->rs + c * m->cs;
  if (m->is64) ((int64_t *)m->data)[e] = v;
  else ((int32_t *)m->data)[e] = (int32_t)v;
}

/* Largest r with cu[r] <= x (x inside [cu[0], cu[n-1])). */
static int64_t find_segment(const mla_kv_ivec *cu, int64_t x) {
  int64_t lo = 0, hi = cu->n - 1;
  while (hi - lo > 1) {
    int64_t mid = (lo + hi) >> 1;
    if (ivec_at(cu, mid) <= x) lo = mid;
    else hi = mid;
  }
  return lo;
}

static uint16_t *row_ptr(const mla_kv_rows *r, int64_t i) { return (uint16_t *)r->data + i * r->stride; }

/* Dequantizes slot into the first cols of a bf16 row (fp32 product, one RNE). */
static void dequant_to_bf16(const mla_kv_cache *c, int64_t slot, uint16_t *dst, int64_t cols) {
  float row[MLA_LAYOUT_MAX_DIM];
  mla_ref_dequant_token(&c->desc, &c->view, slot, row);
  for (int64_t i = 0; i < cols; i++) dst[i] = mla_float_to_bf16(row[i]);
}

/* ---- write -------------------------------------------------------------- */

int mla_ref_kv_write(const mla_kv_cache *c, const mla_kv_ivec *slots, const mla_kv_src_rows *src) {
  const mla_layout_desc *d = &c->desc;
  float x[MLA_LAYOUT_MAX_DIM];
  for (int64_t i = 0; i < slots->n; i++) {
    int64_t slot = ivec_at(slots, i);
    if (slot < 0) continue;
    if (slot / d->block_size >= c->view.num_pages)
      return mla_err("slot_mapping[%lld] = %lld is past the cache (%lld pages of %d tokens)", (long long)i,
                     (long long)slot, (long long)c->view.num_pages, d->block_size);
    const uint16_t *a = row_ptr(&src->a, i), *b = src->split < d->dim ? row_ptr(&src->b, i) : NULL;
    for (int64_t k = 0; k < d->dim; k++) x[k] = mla_bf16_to_float(k < src->split ? a[k] : b[k - src->split]);
    mla_ref_quantize_token(d, &c->view, slot, x);
  }
  return 0;
}

/* ---- gathers ------------------------------------------------------------ */

int mla_ref_kv_gather_sparse(const mla_kv_cache *c, const mla_kv_ivec *slots, const mla_kv_rows *out,
                             const mla_kv_omat *remap) {
  for (int64_t i = 0; i < slots->n; i++) {
    int64_t slot = ivec_at(slots, i);
    if (remap) omat_set(remap, i, 0, slot >= 0 ? i : -1);
    if (slot < 0) continue;
    if (slot / c->desc.block_size >= c->view.num_pages)
      return mla_err("slots[%lld] = %lld is past the cache (%lld pages of %d tokens)", (long long)i, (long long)slot,
                     (long long)c->view.num_pages, c->desc.block_size);
    dequant_to_bf16(c, slot, row_ptr(out, i), out->cols);
  }
  return 0;
}

/* Slot of dense output row `row`: 1 found, 0 past the requests, -1 error. */
static int locate_dense(const mla_kv_cache *c, const mla_kv_dense *g, int64_t row, int64_t *slot) {
  int64_t bs = c->desc.block_size;
  if (row >= ivec_at(&g->cu, g->cu.n - 1) || row < ivec_at(&g->cu, 0)) return 0;
  int64_t r = find_segment(&g->cu, row);
  int64_t p = row - ivec_at(&g->cu, r) + (g->starts.n ? ivec_at(&g->starts, r) : 0);
  if (p < 0) return mla_err("request %lld: position %lld is negative (check seq_starts)", (long long)r, (long long)p);
  int64_t j = p / bs;
  if (j >= g->block_table.cols)
    return mla_err("request %lld: position %lld needs block_table column %lld, the table has %lld", (long long)r,
                   (long long)p, (long long)j, (long long)g->block_table.cols);
  int64_t page = imat_at(&g->block_table, r, j);
  if (page < 0 || page >= c->view.num_pages)
    return mla_err("block_table[%lld, %lld] = %lld is not a page of the cache (%lld pages)", (long long)r, (long long)j,
                   (long long)page, (long long)c->view.num_pages);
  *slot = page * bs + (p - j * bs);
  return 1;
}

int mla_ref_kv_gather_dense(const mla_kv_cache *c, const mla_kv_dense *g, const mla_kv_rows *out) {
  if (g->cu.n < 2) return 0;
  for (int64_t row = 0; row < out->rows; row++) {
    int64_t slot;
    int rc = locate_dense(c, g, row, &slot);
    if (rc < 0) return -1;
    if (rc) dequant_to_bf16(c, slot, row_ptr(out, row), out->cols);
  }
  return 0;
}

int mla_ref_kv_gather_pages(const mla_kv_cache *c, const mla_kv_ivec *pages, const mla_kv_rows *out) {
  int64_t bs = c->desc.block_size;
  for (int64_t j = 0; j < pages->n; j++) {
    int64_t page = ivec_at(pages, j);
    if (page < 0 || page >= c->view.num_pages)
      return mla_err("pages[%lld] = %lld is not a page of the cache (%lld pages)", (long long)j, (long long)page,
                     (long long)c->view.num_pages);
    for (int64_t t = 0; t < bs; t++) dequant_to_bf16(c, page * bs + t, row_ptr(out, j * bs + t), out->cols);
  }
  return 0;
}

/* Byte b of token t's row in region r of page `page`. */
static unsigned char *region_byte(const mla_kv_cache *c, int64_t page, int64_t t, int r, int64_t b) {
  return mla_view_byte(&c->desc, &c->view, page, t, r, b);
}

int mla_ref_kv_gather_raw(const mla_kv_cache *c, const mla_kv_dense *g, unsigned char *const *out,
                          const int64_t *out_stride, int64_t rows) {
  if (g->cu.n < 2) return 0;
  int64_t bs = c->desc.block_size;
  for (int64_t row = 0; row < rows; row++) {
    int64_t slot;
    int rc = locate_dense(c, g, row, &slot);
    if (rc < 0) return -1;
    if (!rc) continue;
    for (int r = 0; r < c->desc.nregions; r++) { /* in row order: a chunked region's pieces put back together */
      const int64_t n = c->desc.region_row_bytes[r], piece = c->desc.region_chunk[r] > 0 ? c->desc.region_chunk[r] : n;
      for (int64_t b = 0; b < n; b += piece)
        memcpy(out[r] + row * out_stride[r] + b, region_byte(c, slot / bs, slot % bs, r, b), (size_t)piece);
    }
  }
  return 0;
}

/* ---- requant ------------------------------------------------------------ */

static const mla_layout_field *field_of(const mla_layout_desc *d, int dim) {
  for (int f = 0; f < d->nfields; f++) {
    const mla_layout_field *fd = &d->fields[f];
    if (fd->role == MLA_FIELD_DATA && dim >= fd->dim_lo && dim < fd->dim_lo + fd->count) return fd;
  }
  return NULL;
}

int mla_ref_kv_requant(const mla_kv_cache *src, const mla_kv_cache *dst) {
  const mla_layout_desc *sd = &src->desc, *dd = &dst->desc;
  float ts = src->view.tensor_scale ? *src->view.tensor_scale : 1.0f;
  float row[MLA_LAYOUT_MAX_DIM];
  int64_t bs = sd->block_size;
  for (int64_t page = 0; page < src->view.num_pages; page++) {
    for (int64_t t = 0; t < bs; t++) {
      mla_ref_dequant_token(sd, &src->view, page * bs + t, row);
      for (int f = 0; f < dd->nfields; f++) {
        const mla_layout_field *fd = &dd->fields[f];
        if (fd->role == MLA_FIELD_PAD) {
          for (int i = 0; i < fd->count; i++) *region_byte(dst, page, t, fd->region, fd->byte_off + i) = 0;
          continue;
        }
        /* 8 dims at a time: each lies inside one piece of a chunked region (layout_check) */
        for (int c0 = fd->dim_lo; c0 < fd->dim_lo + fd->count; c0 += 8) {
          int64_t e = c0 - fd->dim_lo;
          unsigned char *dq = region_byte(dst, page, t, fd->region, fd->byte_off + mla_layout_elem_bytes(fd->dtype, e));
          if (fd->scale_kind != MLA_SCALE_GROUP) { /* bf16 (checked): the dequantized value */
            for (int i = 0; i < 8; i++) {
              uint16_t h = mla_float_to_bf16(row[c0 + i]);
              memcpy(dq + 2 * i, &h, 2);
            }
            continue;
          }
          const mla_layout_field *fs = field_of(sd, c0);
          memcpy(dq, region_byte(src, page, t, fs->region, fs->byte_off + mla_layout_elem_bytes(fs->dtype, c0 - fs->dim_lo)),
                 (size_t)mla_layout_elem_bytes(fd->dtype, 8));
          if (e % fd->group == 0) {
            unsigned char *ds = region_byte(dst, page, t, fd->scale_region,
                                            fd->scale_off + (e / fd->group) * mla_scale_size(fd->scale_dtype));
            if (fs->scale_kind == MLA_SCALE_GROUP) { /* a relayout: the scale's bits as stored (kv.c checked the pairing) */
              int64_t es = c0 - fs->dim_lo;
              memcpy(ds, region_byte(src, page, t, fs->scale_region, fs->scale_off + (es / fs->group) * mla_scale_size(fs->scale_dtype)),
                     (size_t)mla_scale_size(fd->scale_dtype));
            } else {
              float s = fs->scale_kind == MLA_SCALE_TENSOR ? ts : 1.0f;
              memcpy(ds, &s, 4);
            }
          }
        }
      }
    }
  }
  return 0;
}

/* ---- compaction of referenced pages -------------------------------------- */

int mla_ref_kv_rank_pages(const mla_kv_imat *idx, int64_t block_size, int64_t num_pages, int32_t *flags,
                          int32_t *rank, int64_t *count) {
  memset(flags, 0, (size_t)num_pages * sizeof *flags);
  for (int64_t r = 0; r < idx->rows; r++)
    for (int64_t c = 0; c < idx->cols; c++) {
      int64_t v = imat_at(idx, r, c);
      if (v < 0) continue;
      if (v / block_size >= num_pages)
        return mla_err("indices[%lld, %lld] = %lld is past the cache (%lld pages of %lld tokens)", (long long)r,
                       (long long)c, (long long)v, (long long)num_pages, (long long)block_size);
      flags[v / block_size] = 1;
    }
  int64_t run = 0;
  for (int64_t p = 0; p < num_pages; p++) rank[p] = (int32_t)run, run += flags[p];
  *count = run;
  return 0;
}

void mla_ref_kv_list_pages(const int32_t *flags, const int32_t *rank, int64_t num_pages, int64_t count, int64_t cap,
                           int64_t *pages) {
  for (int64_t p = 0; p < num_pages; p++)
    if (flags[p] && rank[p] < cap) pages[rank[p]] = p;
  for (int64_t j = count; j < cap; j++) pages[j] = -1;
}

void mla_ref_kv_remap_compact(const mla_kv_imat *idx, const int32_t *rank, int64_t block_size, int64_t num_pages,
                              int64_t cap, const mla_kv_omat *out) {
  for (int64_t r = 0; r < idx->rows; r++)
    for (int64_t c = 0; c < idx->cols; c++) {
      int64_t v = imat_at(idx, r, c), o = -1;
      if (v >= 0 && v / block_size < num_pages && rank[v / block_size] < cap)
        o = (int64_t)rank[v / block_size] * block_size + v % block_size;
      omat_set(out, r, c, o);
    }
}

/* ---- top-k transforms ----------------------------------------------------- */

/* Request of query token t: 1 found, 0 padding token (past cu_q[B]), -1 error. */
static int request_of(const mla_kv_token_req *q, int64_t t, int64_t nreq, int64_t *r) {
  if (q->token_req.n) *r = ivec_at(&q->token_req, t);
  else if (q->cu_q.n) {
    if (t < ivec_at(&q->cu_q, 0) || t >= ivec_at(&q->cu_q, q->cu_q.n - 1)) return 0;
    *r = find_segment(&q->cu_q, t);
  } else *r = t;
  if (*r < 0 || *r >= nreq)
    return mla_err("query token %lld belongs to request %lld, outside the %lld requests", (long long)t, (long long)*r,
                   (long long)nreq);
  return 1;
}

typedef int (*topk_map)(const void *ctx, int64_t t, int64_t k, int64_t r, int64_t idx, int64_t *out);

static int topk_rows(const mla_kv_imat *topk, const mla_kv_token_req *req, int64_t nreq, topk_map map,
                     const void *ctx, const mla_kv_omat *out, const mla_kv_omat *lens) {
  for (int64_t t = 0; t < topk->rows; t++) {
    int64_t r = -1, nvalid = 0;
    int rc = request_of(req, t, nreq, &r);
    if (rc < 0) return -1;
    for (int64_t k = 0; k < topk->cols; k++) {
      int64_t idx = imat_at(topk, t, k), o = -1;
      if (rc && idx >= 0) {
        nvalid++;
        if (map(ctx, t, k, r, idx, &o)) return -1;
      }
      omat_set(out, t, k, o);
    }
    if (lens) omat_set(lens, t, 0, nvalid);
  }
  return 0;
}

typedef struct paged_ctx { const mla_kv_imat *bt; int64_t bs, max; } paged_ctx;

static int map_paged(const void *p, int64_t t, int64_t k, int64_t r, int64_t idx, int64_t *out) {
  const paged_ctx *c = p;
  int64_t j = idx / c->bs;
  if (j >= c->bt->cols)
    return mla_err("topk[%lld, %lld] = %lld needs block_table column %lld, the table has %lld", (long long)t,
                   (long long)k, (long long)idx, (long long)j, (long long)c->bt->cols);
  int64_t page = imat_at(c->bt, r, j);
  if (page < 0) return mla_err("block_table[%lld, %lld] = %lld is negative", (long long)r, (long long)j, (long long)page);
  const int64_t off = idx - j * c->bs;
  if (page > (c->max - off) / c->bs) /* the slot would pass the output's range; checked before the product overflows */
    return mla_err("block_table[%lld, %lld] = %lld: its slot (topk[%lld, %lld]) does not fit the %s output", (long long)r,
                   (long long)j, (long long)page, (long long)t, (long long)k, c->max == INT64_MAX ? "i64" : "i32");
  *out = page * c->bs + off; /* <= c->max by the check above */
  return 0;
}

int mla_ref_kv_topk_paged(const mla_kv_imat *topk, const mla_kv_token_req *req, const mla_kv_imat *block_table,
                          int64_t block_size, const mla_kv_omat *out, const mla_kv_omat *lens) {
  paged_ctx c = {block_table, block_size, out->is64 ? INT64_MAX : INT32_MAX};
  return topk_rows(topk, req, block_table->rows, map_paged, &c, out, lens);
}

typedef struct ragged_ctx { const mla_kv_ivec *cu_k; int64_t max; } ragged_ctx;

static int map_ragged(const void *p, int64_t t, int64_t k, int64_t r, int64_t idx, int64_t *out) {
  const ragged_ctx *c = p;
  const int64_t base = ivec_at(c->cu_k, r);
  if (base > c->max - idx) /* idx >= 0 here: checked before the sum, which could overflow int64 */
    return mla_err("cu_k[%lld] = %lld + topk[%lld, %lld] = %lld does not fit the %s output", (long long)r, (long long)base,
                   (long long)t, (long long)k, (long long)idx, c->max == INT64_MAX ? "i64" : "i32");
  *out = idx + base;
  return 0;
}

int mla_ref_kv_topk_ragged(const mla_kv_imat *topk, const mla_kv_token_req *req, const mla_kv_ivec *cu_k,
                           const mla_kv_omat *out, const mla_kv_omat *lens) {
  ragged_ctx c = {cu_k, out->is64 ? INT64_MAX : INT32_MAX};
  return topk_rows(topk, req, cu_k->n - 1, map_ragged, &c, out, lens);
}
