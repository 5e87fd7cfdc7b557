/* Tensor comparison: argument checks, device placement, the CPU path and the
 * orchestration of the GPU kernels. */
#include "compare.h"

#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "mla_error.h"

/* ---- element access on the CPU ------------------------------------------ */

static uint64_t cpu_bits(mla_dtype t, const void *base, int64_t e) {
  const unsigned char *p = (const unsigned char *)base;
  switch (t) {
  case MLA_I64: case MLA_F64: { uint64_t v; memcpy(&v, p + e * 8, 8); return v; }
  case MLA_I32: case MLA_F32: { uint32_t v; memcpy(&v, p + e * 4, 4); return v; }
  case MLA_U16: case MLA_I16: case MLA_F16: case MLA_BF16: { uint16_t v; memcpy(&v, p + e * 2, 2); return v; }
  case MLA_E2M1: return (p[e >> 1] >> ((e & 1) * 4)) & 15;
  default: return p[e];
  }
}

/* Row-major walk that keeps the element index without divisions. */
typedef struct odometer {
  const mla_tensor *t;
  int64_t idx[MLA_MAX_DIMS];
  int64_t e;
} odometer;

static void odo_init(odometer *o, const mla_tensor *t) {
  memset(o, 0, sizeof *o);
  o->t = t, o->e = t->offset;
}

static void odo_next(odometer *o) {
  const mla_tensor *t = o->t;
  for (int k = t->ndim - 1; k >= 0; k--) {
    o->e += t->strides[k];
    if (++o->idx[k] < t->sizes[k]) return;
    o->e -= t->strides[k] * t->sizes[k];
    o->idx[k] = 0;
  }
}

static int64_t elem_of_linear(const mla_tensor *t, int64_t i) {
  int64_t e = t->offset;
  for (int k = t->ndim - 1; k >= 0; k--) {
    e += (i % t->sizes[k]) * t->strides[k];
    i /= t->sizes[k];
  }
  return e;
}

static void cpu_value(const mla_tensor *a, const mla_tensor *b, int64_t i, mla_cmp_value *v) {
  int64_t ea = elem_of_linear(a, i), eb = elem_of_linear(b, i);
  v->idx = i;
  v->a = mla_load_double(a->dtype, a->storage->data, ea);
  v->b = mla_load_double(b->dtype, b->storage->data, eb);
  v->abits = cpu_bits(a->dtype, a->storage->data, ea);
  v->bbits = cpu_bits(b->dtype, b->storage->data, eb);
}

/* Same lanes, same order as the GPU kernel: lane t of a chunk takes the
 * elements base + j*256 + t for j = 0, 1, ...; chunks merge in order. */
static int cpu_compare(const mla_tensor *a, const mla_tensor *b, const mla_cmp_params *p, int first_k,
                       mla_cmp_result *r) {
  int64_t n = mla_tensor_numel(a);
  mla_cmp_partial *lanes = malloc(sizeof(mla_cmp_partial) * MLA_CMP_LANES);
  if (!lanes) return mla_err("compare: out of host memory");
  odometer oa, ob;
  odo_init(&oa, a), odo_init(&ob, b);
  const void *da = a->storage->data, *db = b->storage->data;
  for (int64_t base = 0; base < n; base += MLA_CMP_CHUNK) {
    for (int t = 0; t < MLA_CMP_LANES; t++) mla_cmp_init(&lanes[t]);
    int64_t end = base + MLA_CMP_CHUNK < n ? base + MLA_CMP_CHUNK : n;
    for (int64_t i = base; i < end; i++) {
      mla_cmp_partial *s = &lanes[(i - base) % MLA_CMP_LANES];
      int64_t bad_before = s->bad;
      mla_cmp_elem(p, s, mla_load_double(a->dtype, da, oa.e), mla_load_double(b->dtype, db, ob.e),
                   cpu_bits(a->dtype, da, oa.e), cpu_bits(b->dtype, db, ob.e), i);
      if (s->bad != bad_before && r->nfirst < first_k) cpu_value(a, b, i, &r->first[r->nfirst++]);
      odo_next(&oa), odo_next(&ob);
    }
    mla_cmp_tree(lanes);
    mla_cmp_merge(&r->total, &lanes[0]);
  }
  free(lanes);
  r->at_max_abs.idx = r->at_max_rel.idx = -1;
  if (r->total.max_abs_idx >= 0) cpu_value(a, b, r->total.max_abs_idx, &r->at_max_abs);
  if (r->total.max_rel_idx >= 0) cpu_value(a, b, r->total.max_rel_idx, &r->at_max_rel);
  return 0;
}

/* ---- GPU path ---------------------------------------------------------- */

static void to_desc(const mla_tensor *t, mla_strided_desc *d) {
  memset(d, 0, sizeof *d);
  d->base = t->storage->data, d->offset = t->offset, d->dtype = (int32_t)t->dtype, d->ndim = t->ndim;
  memcpy(d->sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
  memcpy(d->strides, t->strides, sizeof(int64_t) * (size_t)t->ndim);
}

typedef struct gpu_ctx {
  int dev;
  cudaStream_t s;
  mla_strided_desc da, db;
  int ca, cb;
  const mla_cmp_params *p;
  int64_t n;
} gpu_ctx;

/* Values at up to MLA_CMP_MAX_FIRST + 2 indices, one small kernel. */
static int gpu_probe(gpu_ctx *g, const int64_t *idx, int m, mla_cmp_value *out) {
  if (m == 0) return 0;
  int64_t bytes = (int64_t)m * (8 + 8 + 8 + 8 + 8);
  char *dbuf = NULL, *h = malloc((size_t)bytes);
  if (!h) return mla_err("compare: out of host memory");
  int rc = mla_device_alloc(g->dev, bytes, (void **)&dbuf);
  if (rc == 0) {
    int64_t *di = (int64_t *)dbuf;
    double *va = (double *)(dbuf + 8 * m), *vb = (double *)(dbuf + 16 * m);
    uint64_t *ba = (uint64_t *)(dbuf + 24 * m), *bb = (uint64_t *)(dbuf + 32 * m);
    rc = mla_cuda_check(cudaMemcpyAsync(di, idx, 8 * (size_t)m, cudaMemcpyHostToDevice, g->s), "compare: upload indices");
    if (rc == 0) {
      cudaError_t e = mla_cuda_compare_probe(&g->da, g->ca, &g->db, g->cb, di, m, va, vb, ba, bb, g->s);
      rc = e != cudaSuccess ? mla_cuda_check(e, "launch of kernel compare_probe") : mla_launch_check(g->dev, "compare_probe");
    }
    if (rc == 0) rc = mla_cuda_check(cudaMemcpyAsync(h, dbuf, (size_t)bytes, cudaMemcpyDeviceToHost, g->s), "compare: download values");
    if (rc == 0) rc = mla_device_sync(g->dev);
    if (rc == 0)
      for (int j = 0; j < m; j++) {
        out[j].idx = idx[j];
        memcpy(&out[j].a, h + 8 * m + 8 * j, 8), memcpy(&out[j].b, h + 16 * m + 8 * j, 8);
        memcpy(&out[j].abits, h + 24 * m + 8 * j, 8), memcpy(&out[j].bbits, h + 32 * m + 8 * j, 8);
      }
    mla_device_free(g->dev, dbuf, bytes);
  }
  free(h);
  return rc;
}

/* The first k failing indices: the chunks that hold them, scanned in order. */
static int gpu_first(gpu_ctx *g, const mla_cmp_partial *parts, int64_t nchunks, int k, int64_t *idx, int *m) {
  int64_t chunks[MLA_CMP_MAX_FIRST];
  int nc = 0;
  int64_t have = 0;
  for (int64_t c = 0; c < nchunks && have < k && nc < k; c++)
    if (parts[c].bad > 0) chunks[nc++] = c, have += parts[c].bad;
  *m = 0;
  if (nc == 0) return 0;
  int64_t out_n = (int64_t)nc * k, bytes = 8 * (nc + out_n);
  char *dbuf = NULL;
  int64_t *h = malloc((size_t)(8 * out_n));
  if (!h) return mla_err("compare: out of host memory");
  int rc = mla_device_alloc(g->dev, bytes, (void **)&dbuf);
  if (rc == 0) {
    rc = mla_cuda_check(cudaMemcpyAsync(dbuf, chunks, 8 * (size_t)nc, cudaMemcpyHostToDevice, g->s), "compare: upload chunks");
    if (rc == 0) {
      cudaError_t e = mla_cuda_compare_collect(&g->da, g->ca, &g->db, g->cb, g->p, g->n, (const int64_t *)dbuf, nc, k,
                                               (int64_t *)(dbuf + 8 * nc), g->s);
      rc = e != cudaSuccess ? mla_cuda_check(e, "launch of kernel compare_collect") : mla_launch_check(g->dev, "compare_collect");
    }
    if (rc == 0) rc = mla_cuda_check(cudaMemcpyAsync(h, dbuf + 8 * nc, 8 * (size_t)out_n, cudaMemcpyDeviceToHost, g->s), "compare: download indices");
    if (rc == 0) rc = mla_device_sync(g->dev);
    for (int64_t j = 0; rc == 0 && j < out_n && *m < k; j++)
      if (h[j] >= 0) idx[(*m)++] = h[j];
    mla_device_free(g->dev, dbuf, bytes);
  }
  free(h);
  return rc;
}

static int gpu_compare(const mla_tensor *a, const mla_tensor *b, const mla_cmp_params *p, int first_k,
                       mla_cmp_result *r) {
  gpu_ctx g = {.dev = mla_tensor_device(a), .p = p, .n = mla_tensor_numel(a)};
  g.s = mla_device_stream(g.dev);
  if (!g.s) return -1;
  to_desc(a, &g.da), to_desc(b, &g.db);
  g.ca = mla_tensor_is_contiguous(a), g.cb = mla_tensor_is_contiguous(b);
  int64_t nchunks = (g.n + MLA_CMP_CHUNK - 1) / MLA_CMP_CHUNK;
  int64_t bytes = nchunks * (int64_t)sizeof(mla_cmp_partial);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, g.dev);
  mla_cmp_partial *dparts = NULL, *parts = malloc((size_t)(bytes > 0 ? bytes : 1));
  if (!parts) return mla_err("compare: out of host memory (%lld chunk results)", (long long)nchunks);
  int rc = mla_device_alloc(g.dev, bytes, (void **)&dparts);
  if (rc == 0) {
    cudaError_t e = mla_cuda_compare_chunks(&g.da, g.ca, &g.db, g.cb, p, g.n, dparts, sms, g.s);
    rc = e != cudaSuccess ? mla_cuda_check(e, "launch of kernel compare_chunks") : mla_launch_check(g.dev, "compare_chunks");
    if (rc == 0 && bytes > 0)
      rc = mla_cuda_check(cudaMemcpyAsync(parts, dparts, (size_t)bytes, cudaMemcpyDeviceToHost, g.s), "compare: download chunk results");
    if (rc == 0) rc = mla_device_sync(g.dev);
    mla_device_free(g.dev, dparts, bytes);
  }
  if (rc == 0) {
    for (int64_t c = 0; c < nchunks; c++) mla_cmp_merge(&r->total, &parts[c]);
    int64_t idx[MLA_CMP_MAX_FIRST + 2];
    int m = 0;
    if (first_k > 0 && r->total.bad > 0) rc = gpu_first(&g, parts, nchunks, first_k, idx, &m);
    if (rc == 0) {
      int q = m;
      if (r->total.max_abs_idx >= 0) idx[q++] = r->total.max_abs_idx;
      if (r->total.max_rel_idx >= 0) idx[q++] = r->total.max_rel_idx;
      mla_cmp_value vals[MLA_CMP_MAX_FIRST + 2];
      rc = gpu_probe(&g, idx, q, vals);
      if (rc == 0) {
        memcpy(r->first, vals, sizeof(mla_cmp_value) * (size_t)m);
        r->nfirst = m;
        r->at_max_abs.idx = r->at_max_rel.idx = -1;
        int j = m;
        if (r->total.max_abs_idx >= 0) r->at_max_abs = vals[j++];
        if (r->total.max_rel_idx >= 0) r->at_max_rel = vals[j++];
      }
    }
  }
  free(parts);
  return rc;
}

/* ---- entry ---------------------------------------------------------------- */

static int same_shape(const mla_tensor *a, const mla_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->sizes[i] != b->sizes[i]) return 0;
  return 1;
}

static void shape_str(const mla_tensor *t, char *buf, size_t n) {
  size_t o = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < t->ndim && o < n; i++) o += (size_t)snprintf(buf + o, n - o, i ? ", %lld" : "%lld", (long long)t->sizes[i]);
  if (o < n) snprintf(buf + o, n - o, "]");
}

/* A contiguous copy of t on dev (same dtype). */
static int copy_to(const mla_tensor *t, int dev, mla_tensor *out) {
  if (mla_tensor_empty(out, t->dtype, t->ndim, t->sizes, dev)) return -1;
  if (mla_tensor_copy(out, t, NULL)) {
    mla_tensor_release(out);
    return -1;
  }
  return 0;
}

int mla_compare(const mla_tensor *a, const mla_tensor *b, const mla_cmp_params *p, int first_k, mla_cmp_result *r) {
  memset(r, 0, sizeof *r);
  mla_cmp_init(&r->total);
  r->at_max_abs.idx = r->at_max_rel.idx = -1;
  if (!same_shape(a, b)) {
    char sa[160], sb[160];
    shape_str(a, sa, sizeof sa), shape_str(b, sb, sizeof sb);
    return mla_err("compare: shapes differ (%s vs %s)", sa, sb);
  }
  if ((p->tests & MLA_CMP_T_EXACT) && a->dtype != b->dtype)
    return mla_err("compare: exact comparison needs equal dtypes (%s vs %s); compare values with allclose",
                   mla_dtype_name(a->dtype), mla_dtype_name(b->dtype));
  if (first_k < 0 || first_k > MLA_CMP_MAX_FIRST) return mla_err("compare: first must be 0..%d", MLA_CMP_MAX_FIRST);
  r->numel = mla_tensor_numel(a);
  int da = mla_tensor_device(a), db = mla_tensor_device(b);
  int dev = da != MLA_CPU ? da : db;
  r->device = dev;
  if (dev == MLA_CPU) return cpu_compare(a, b, p, first_k, r);
  /* one side elsewhere: bring it to dev (never the GPU tensor to the host) */
  mla_tensor ta = {0}, tb = {0};
  const mla_tensor *ua = a, *ub = b;
  int rc = 0;
  if (da != dev) rc = copy_to(a, dev, &ta), ua = &ta;
  if (rc == 0 && db != dev) rc = copy_to(b, dev, &tb), ub = &tb;
  if (rc == 0) rc = gpu_compare(ua, ub, p, first_k, r);
  mla_tensor_release(&ta), mla_tensor_release(&tb);
  if (rc) return mla_err_prefix("compare: ");
  return 0;
}
