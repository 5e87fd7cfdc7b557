/* KV-cache write, gathers and requant over tensors (see kv.h): checks, then
 * the CPU reference or the baked kernel. */
#include "kv.h"

#include "device.h"
#include "kernels/kv_kernels.h"
#include "kv_args.h"
#include "mla_error.h"
#include "ref/kv_ref.h"

static int out_cols_ok(const mla_kv_cache *c, const mla_kv_rows *out, const char *name) {
  if (out->cols < 8 || out->cols > c->desc.dim)
    return mla_err("%s has %lld columns, expected 8 to the layout's %d dims (the first dims of each row)", name,
                   (long long)out->cols, c->desc.dim);
  return 0;
}

int mla_kv_write(const mla_kv_cache *c, int dev, const mla_tensor *slots, const mla_tensor *rows_a,
                 const mla_tensor *rows_b) {
  mla_kv_ivec sl;
  mla_kv_src_rows src = {0};
  int dim = c->desc.dim;
  if (mla_kv_arg_ivec(slots, "slot_mapping", dev, &sl) || mla_kv_need_tensor_scale(c, "write")) return -1;
  if (mla_kv_arg_rows(rows_a, rows_b ? "k_nope" : "rows", dev, 0, &src.a)) return -1;
  if (rows_b && mla_kv_arg_rows(rows_b, "k_rope", dev, 0, &src.b)) return -1;
  src.split = src.a.cols;
  if (!rows_b && src.a.cols != dim)
    return mla_err("rows has %lld columns, the layout's row has %d dims", (long long)src.a.cols, dim);
  if (rows_b && src.a.cols + src.b.cols != dim)
    return mla_err("k_nope (%lld columns) + k_rope (%lld columns) make %lld dims, the layout's row has %d",
                   (long long)src.a.cols, (long long)src.b.cols, (long long)(src.a.cols + src.b.cols), dim);
  if (src.a.rows < sl.n || (rows_b && src.b.rows < sl.n))
    return mla_err("slot_mapping maps %lld tokens but %s has only %lld rows", (long long)sl.n,
                   src.a.rows < sl.n ? (rows_b ? "k_nope" : "rows") : "k_rope",
                   (long long)(src.a.rows < sl.n ? src.a.rows : src.b.rows));
  if (!rows_b) src.b = src.a;
  if (dev == MLA_CPU) return mla_ref_kv_write(c, &sl, &src);
  cudaStream_t s;
  unsigned long long *bad;
  if (mla_kv_cuda_ctx(dev, &s, &bad)) return -1;
  return mla_kv_launched(dev, mla_cuda_kv_write(c, &sl, &src, bad, s), "mla_kv_write");
}

int mla_kv_gather_sparse(const mla_kv_cache *c, int dev, const mla_tensor *slots, mla_tensor *out, mla_tensor *remap) {
  mla_kv_ivec sl;
  mla_kv_rows o;
  mla_kv_omat rm;
  if (mla_kv_arg_ivec(slots, "slots", dev, &sl) || mla_kv_arg_rows(out, "out", dev, 1, &o) ||
      mla_kv_arg_omat(remap, "remap", dev, &rm) || out_cols_ok(c, &o, "out") || mla_kv_need_tensor_scale(c, "gather_sparse"))
    return -1;
  if (o.rows < sl.n) return mla_err("out has %lld rows, slots has %lld entries", (long long)o.rows, (long long)sl.n);
  if (remap && (rm.rows != sl.n || rm.cols != 1))
    return mla_err("remap must have one entry per slot (%lld), got [%lld, %lld]", (long long)sl.n, (long long)rm.rows,
                   (long long)rm.cols);
  if (dev == MLA_CPU) return mla_ref_kv_gather_sparse(c, &sl, &o, remap ? &rm : NULL);
  cudaStream_t s;
  unsigned long long *bad;
  if (mla_kv_cuda_ctx(dev, &s, &bad)) return -1;
  return mla_kv_launched(dev, mla_cuda_kv_gather_sparse(c, &sl, &o, remap ? &rm : NULL, bad, s), "mla_kv_gather_sparse");
}

static int dense_args(int dev, const mla_tensor *bt, const mla_tensor *cu, const mla_tensor *starts, mla_kv_dense *g) {
  if (mla_kv_arg_imat(bt, "block_table", dev, &g->block_table) || mla_kv_arg_ivec(cu, "cu_seq_lens", dev, &g->cu) ||
      mla_kv_arg_ivec(starts, "seq_starts", dev, &g->starts))
    return -1;
  int64_t nreq = g->cu.n - 1;
  if (nreq < 0) return mla_err("cu_seq_lens needs B + 1 entries (at least 1), got 0");
  if (g->block_table.rows < nreq)
    return mla_err("block_table has %lld rows for %lld requests (cu_seq_lens has %lld entries)",
                   (long long)g->block_table.rows, (long long)nreq, (long long)g->cu.n);
  if (starts && g->starts.n < nreq)
    return mla_err("seq_starts has %lld entries for %lld requests", (long long)g->starts.n, (long long)nreq);
  return 0;
}

int mla_kv_gather_dense(const mla_kv_cache *c, int dev, const mla_tensor *block_table, const mla_tensor *cu_seq_lens,
                        const mla_tensor *seq_starts, mla_tensor *out) {
  mla_kv_dense g;
  mla_kv_rows o;
  if (dense_args(dev, block_table, cu_seq_lens, seq_starts, &g) || mla_kv_arg_rows(out, "out", dev, 1, &o) ||
      out_cols_ok(c, &o, "out") || mla_kv_need_tensor_scale(c, "gather_dense"))
    return -1;
  if (dev == MLA_CPU) return mla_ref_kv_gather_dense(c, &g, &o);
  cudaStream_t s;
  unsigned long long *bad;
  if (mla_kv_cuda_ctx(dev, &s, &bad)) return -1;
  return mla_kv_launched(dev, mla_cuda_kv_gather_dense(c, &g, &o, bad, s), "mla_kv_gather_dense");
}

int mla_kv_gather_raw(const mla_kv_cache *c, int dev, const mla_tensor *block_table, const mla_tensor *cu_seq_lens,
                      const mla_tensor *seq_starts, mla_tensor *const *out, int nout) {
  mla_kv_dense g;
  if (dense_args(dev, block_table, cu_seq_lens, seq_starts, &g)) return -1;
  if (nout != c->desc.nregions)
    return mla_err("the layout has %d page regions, so %d output tensors are expected (one per region), got %d",
                   c->desc.nregions, c->desc.nregions, nout);
  unsigned char *ptr[MLA_LAYOUT_MAX_REGIONS];
  int64_t stride[MLA_LAYOUT_MAX_REGIONS], rows = 0;
  for (int r = 0; r < nout; r++) {
    const mla_tensor *t = out[r];
    char name[32];
    snprintf(name, sizeof name, "out[%d]", r + 1);
    if (t->dtype != MLA_U8 || t->ndim != 2 || (t->sizes[1] > 1 && t->strides[1] != 1))
      return mla_err("%s must be a 2-dim u8 tensor with contiguous rows, got %s with %d dims", name,
                     mla_dtype_name(t->dtype), t->ndim);
    if (mla_kv_same_device(t, name, dev)) return -1;
    if (t->sizes[1] != c->desc.region_row_bytes[r])
      return mla_err("%s has rows of %lld bytes, region %d of the layout has %d-byte token rows", name,
                     (long long)t->sizes[1], r, c->desc.region_row_bytes[r]);
    if (r > 0 && t->sizes[0] != rows)
      return mla_err("%s has %lld rows, out[1] has %lld", name, (long long)t->sizes[0], (long long)rows);
    void *p;
    if (mla_tensor_data(t, &p)) return -1;
    ptr[r] = p, stride[r] = t->strides[0], rows = t->sizes[0];
  }
  if (dev == MLA_CPU) return mla_ref_kv_gather_raw(c, &g, ptr, stride, rows);
  cudaStream_t s;
  unsigned long long *bad;
  if (mla_kv_cuda_ctx(dev, &s, &bad)) return -1;
  return mla_kv_launched(dev, mla_cuda_kv_gather_raw(c, &g, ptr, stride, rows, bad, s), "mla_kv_gather_raw");
}

/* ---- requant ------------------------------------------------------------ */

static const mla_layout_field *field_at(const mla_layout_desc *d, int dim) {
  for (int f = 0; f < d->nfields; f++) {
    const mla_layout_field *fd = &d->fields[f];
    if (fd->role == MLA_FIELD_DATA && dim >= fd->dim_lo && dim < fd->dim_lo + fd->count) return fd;
  }
  return NULL;
}

/* The pairing requant relies on, checked chunk by chunk from the two
 * descriptors (by data, not by format name). */
static int requant_check(const mla_layout_desc *sd, const mla_layout_desc *dd) {
  if (sd->dim != dd->dim)
    return mla_err("requant: the source row has %d dims, the destination %d; both layouts must store the same row", sd->dim,
                   dd->dim);
  if (sd->block_size != dd->block_size)
    return mla_err("requant: block sizes differ (%d vs %d); pages map one to one", sd->block_size, dd->block_size);
  for (int c0 = 0; c0 < dd->dim; c0 += 8) {
    const mla_layout_field *fs = field_at(sd, c0), *fd = field_at(dd, c0);
    if (fs->scale_kind == MLA_SCALE_GROUP && fd->scale_kind == MLA_SCALE_GROUP) {
      /* a relayout: codes and scale bits move unchanged, so groups and types must be the same */
      if (fd->dtype != fs->dtype || fd->group != fs->group || fd->scale_dtype != fs->scale_dtype ||
          (c0 - fs->dim_lo) % fs->group != (c0 - fd->dim_lo) % fd->group)
        return mla_err("requant: dims [%d, %d) carry group scales on both sides but as %s in groups of %d under %s scales "
                       "(source) and %s in groups of %d under %s (destination); group-scaled dims move as they are, so "
                       "element type, group and scale type must match", c0, c0 + 8, mla_dtype_name((mla_dtype)fs->dtype),
                       fs->group, mla_dtype_name((mla_dtype)fs->scale_dtype), mla_dtype_name((mla_dtype)fd->dtype),
                       fd->group, mla_dtype_name((mla_dtype)fd->scale_dtype));
      continue;
    }
    if (fd->scale_kind == MLA_SCALE_GROUP) {
      if (fd->dtype != fs->dtype)
        return mla_err("requant: destination dims [%d, %d) store %s under group scales but the source stores %s; codes are "
                       "copied, so the element types must match", c0, c0 + 8, mla_dtype_name((mla_dtype)fd->dtype),
                       mla_dtype_name((mla_dtype)fs->dtype));
      if (fd->scale_dtype != MLA_F32)
        return mla_err("requant: destination dims [%d, %d) have %s group scales; only f32 holds any tensor scale exactly",
                       c0, c0 + 8, mla_dtype_name((mla_dtype)fd->scale_dtype));
      int g0 = fd->dim_lo + (c0 - fd->dim_lo) / fd->group * fd->group;
      const mla_layout_field *first = field_at(sd, g0);
      if (first->scale_kind == MLA_SCALE_GROUP || fs->scale_kind == MLA_SCALE_GROUP)
        return mla_err("requant: destination group at dims [%d, %d) takes source dims under group scales and dims without", g0,
                       g0 + fd->group);
      if (first->scale_kind != fs->scale_kind)
        return mla_err("requant: destination group at dims [%d, %d) mixes source dims with and without the tensor scale", g0,
                       g0 + fd->group);
    } else if (fd->scale_kind != MLA_SCALE_NONE || fd->dtype != MLA_BF16) {
      return mla_err("requant: destination dims [%d, %d) are %s%s; a destination chunk is either the source codes under f32 "
                     "group scales or unscaled bf16", c0, c0 + 8, mla_dtype_name((mla_dtype)fd->dtype),
                     fd->scale_kind == MLA_SCALE_TENSOR ? " under a per-tensor scale" : "");
    }
  }
  return 0;
}

int mla_kv_requant(const mla_kv_cache *src, const mla_kv_cache *dst, int dev) {
  if (requant_check(&src->desc, &dst->desc) || mla_kv_need_tensor_scale(src, "requant (source)")) return -1;
  if (dst->view.num_pages < src->view.num_pages)
    return mla_err("requant: the destination has %lld pages, the source %lld", (long long)dst->view.num_pages,
                   (long long)src->view.num_pages);
  if (dev == MLA_CPU) return mla_ref_kv_requant(src, dst);
  cudaStream_t s;
  if (mla_kv_cuda_ctx(dev, &s, NULL)) return -1;
  return mla_kv_launched(dev, mla_cuda_kv_requant(src, dst, s), "mla_kv_requant");
}
