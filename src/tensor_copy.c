/* Data movement between tensors on any devices: copy with conversion, fill,
 * random numbers. Same-dtype copies move bytes (NaN payloads included);
 * conversions follow dtype.h on the CPU and convert.cuh on the GPU, which the
 * specs hold to the same bits. */
#include <string.h>

#include "device.h"
#include "kernels/tensor_kernels.h"
#include "mla/philox.h"
#include "mla_error.h"
#include "tensor.h"

static int bits_of(const mla_tensor *t) { return mla_dtype_info_of(t->dtype)->bits; }

static void to_desc(const mla_tensor *t, mla_strided_desc *d) {
  memset(d, 0, sizeof *d);
  d->base = t->storage->data, d->offset = t->offset, d->dtype = (int32_t)t->dtype, d->ndim = t->ndim;
  memcpy(d->sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
  memcpy(d->strides, t->strides, sizeof(int64_t) * (size_t)t->ndim);
}

/* Joint dims of two same-shaped tensors after dropping size-1 dims and
 * merging neighbours that are contiguous in both. */
typedef struct joint {
  int n;
  int64_t size[MLA_MAX_DIMS], sa[MLA_MAX_DIMS], sb[MLA_MAX_DIMS];
} joint;

static void collapse(const mla_tensor *a, const mla_tensor *b, joint *j) {
  j->n = 0;
  for (int i = 0; i < a->ndim; i++) {
    if (a->sizes[i] == 1) continue;
    if (j->n > 0 && j->sa[j->n - 1] == a->strides[i] * a->sizes[i] && j->sb[j->n - 1] == b->strides[i] * b->sizes[i]) {
      j->size[j->n - 1] *= a->sizes[i];
      j->sa[j->n - 1] = a->strides[i], j->sb[j->n - 1] = b->strides[i];
      continue;
    }
    j->size[j->n] = a->sizes[i], j->sa[j->n] = a->strides[i], j->sb[j->n] = b->strides[i];
    j->n++;
  }
}

/* Describe a same-dtype copy as rows of bytes; 0 if the layout allows it. */
static int rows_of(const mla_tensor *dst, const mla_tensor *src, mla_rows_desc *r) {
  joint j;
  int bits = bits_of(dst);
  collapse(dst, src, &j);
  memset(r, 0, sizeof *r);
  int inner_contig = j.n > 0 && j.sa[j.n - 1] == 1 && j.sb[j.n - 1] == 1;
  int64_t inner = inner_contig ? j.size[j.n - 1] : 1;
  if ((inner * bits) % 8 || (dst->offset * bits) % 8 || (src->offset * bits) % 8) return -1;
  int nouter = inner_contig ? j.n - 1 : j.n;
  for (int k = 0; k < nouter; k++) {
    if ((j.sa[k] * bits) % 8 || (j.sb[k] * bits) % 8) return -1;
    r->sizes[k] = j.size[k];
    r->dst_strides[k] = j.sa[k] * bits / 8;
    r->src_strides[k] = j.sb[k] * bits / 8;
  }
  r->nouter = nouter;
  r->row_bytes = inner * bits / 8;
  r->dst = (char *)dst->storage->data + dst->offset * bits / 8;
  r->src = (const char *)src->storage->data + src->offset * bits / 8;
  return 0;
}

static void cpu_copy_rows(const mla_rows_desc *r) {
  int64_t idx[MLA_MAX_DIMS] = {0}, rows = 1;
  for (int k = 0; k < r->nouter; k++) rows *= r->sizes[k];
  for (int64_t i = 0; i < rows; i++) {
    int64_t doff = 0, soff = 0;
    for (int k = 0; k < r->nouter; k++) doff += idx[k] * r->dst_strides[k], soff += idx[k] * r->src_strides[k];
    memmove(r->dst + doff, r->src + soff, (size_t)r->row_bytes);
    for (int k = r->nouter - 1; k >= 0; k--) {
      if (++idx[k] < r->sizes[k]) break;
      idx[k] = 0;
    }
  }
}

static int is_int(mla_dtype t) { return !mla_dtype_info_of(t)->is_float; }

static void cpu_copy_convert(mla_tensor *dst, const mla_tensor *src, const mla_cvt_opts *o) {
  mla_iter a, b;
  mla_iter_init(&a, dst), mla_iter_init(&b, src);
  int ints = is_int(dst->dtype) && is_int(src->dtype);
  for (; a.pos < a.n; mla_iter_next(&a), mla_iter_next(&b)) {
    int64_t di = mla_iter_elem(&a, dst), si = mla_iter_elem(&b, src);
    if (ints) {
      int64_t v = mla_load_int(src->dtype, src->storage->data, si);
      /* through double only when exact; saturate like the float path */
      mla_store_double(dst->dtype, dst->storage->data, di, (double)v, o);
      if (dst->dtype == MLA_I64) ((int64_t *)dst->storage->data)[di] = v;
    } else {
      mla_store_double(dst->dtype, dst->storage->data, di, mla_load_double(src->dtype, src->storage->data, si), o);
    }
  }
}

static int same_shape(const mla_tensor *a, const mla_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->sizes[i] != b->sizes[i]) return 0;
  return 1;
}

static int same_view(const mla_tensor *a, const mla_tensor *b) {
  if (a->dtype != b->dtype || a->offset != b->offset || !same_shape(a, b)) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->sizes[i] > 1 && a->strides[i] != b->strides[i]) return 0;
  return 1;
}

static int shape_str(const mla_tensor *t, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < t->ndim && k < n; i++) k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)t->sizes[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return 0;
}

static int gpu_rows(int dev, const mla_rows_desc *r, const char *what) {
  cudaStream_t s = mla_device_stream(dev);
  if (!s) return -1;
  if (r->nouter == 0) {
    if (mla_cuda_check(cudaMemcpyAsync(r->dst, r->src, (size_t)r->row_bytes, cudaMemcpyDeviceToDevice, s), what)) return -1;
    return 0;
  }
  if (mla_cuda_check(mla_cuda_copy_rows(r, s), what)) return -1;
  return mla_launch_check(dev, "mla_copy_rows");
}

/* A contiguous tensor like t (same dtype and shape) on `device`. */
static int temp_like(mla_tensor *tmp, const mla_tensor *t, mla_dtype dtype, int device) {
  return mla_tensor_empty(tmp, dtype, t->ndim, t->sizes, device);
}

static int e2m1_whole_bytes(const mla_tensor *t) {
  if (t->dtype != MLA_E2M1) return 1;
  int last = t->ndim - 1;
  return t->ndim > 0 && t->strides[last] == 1 && t->sizes[last] % 2 == 0 && t->offset % 2 == 0;
}

static int copy_impl(mla_tensor *dst, const mla_tensor *src, const mla_cvt_opts *o);

/* A CPU tensor over a host copy of the bytes t's view spans (same sizes and
 * strides, offset shifted into the copy). Used for e2m1 views the GPU
 * kernels cannot address (odd nibbles): no GPU kernel is involved, so this
 * never routes back into copy_via_host. `download` = 0 skips reading the
 * bytes when the caller overwrites all of them. */
static int host_mirror(const mla_tensor *t, mla_tensor *h, int64_t *lo_out, int download) {
  int64_t lo, hi;
  mla_tensor_byte_range(t, &lo, &hi);
  *h = *t;
  h->storage = NULL;
  if (mla_storage_new(MLA_CPU, hi > lo ? hi - lo : 1, &h->storage)) return -1;
  h->offset = t->offset - lo * 8 / bits_of(t);
  *lo_out = lo;
  if (download && hi > lo &&
      (mla_device_sync(mla_tensor_device(t)) ||
       mla_cuda_check(cudaMemcpy(h->storage->data, (char *)t->storage->data + lo, (size_t)(hi - lo), cudaMemcpyDeviceToHost),
                      "copy to host")))
    return -1;
  return 0;
}

/* Host to device on the device's stream. A cudaMemcpy from pageable memory
 * may return before its DMA has landed (CUDA's API synchronization notes),
 * and the kernels that read the bytes next run on a non-blocking stream,
 * which does not wait for the legacy one. Queued on the same stream, the copy
 * lands before them; the pageable source is staged before the call returns,
 * so the caller may free it. */
static int upload(int dev, void *dst, const void *src, size_t n) {
  cudaStream_t s = mla_device_stream(dev);
  if (!s) return -1;
  return mla_cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s), "copy to device");
}

static int host_mirror_upload(const mla_tensor *t, const mla_tensor *h, int64_t lo) {
  int64_t l, hi;
  mla_tensor_byte_range(t, &l, &hi);
  if (hi <= lo) return 0;
  return upload(mla_tensor_device(t), (char *)t->storage->data + lo, h->storage->data, (size_t)(hi - lo));
}

static int byte_dense(const mla_tensor *t) { return mla_tensor_is_contiguous(t) && t->offset * bits_of(t) % 8 == 0; }

/* Run a copy through host memory: correct for every layout, used for
 * cross-device transfers and the rare GPU layouts the kernels do not cover.
 * Non-contiguous GPU sides go through a contiguous GPU temporary (one kernel,
 * only the view's bytes cross PCIe), except e2m1, whose odd-nibble views
 * only the host can address: those use a mirror of the spanned bytes. */
static int copy_via_host(mla_tensor *dst, const mla_tensor *src, const mla_cvt_opts *o) {
  int sd = mla_tensor_device(src), dd = mla_tensor_device(dst);
  mla_tensor hs = {0}, hd = {0}, gs = {0}, gd = {0};
  int64_t lo;
  int rc = -1;
  if (sd != MLA_CPU) {
    if (src->dtype == MLA_E2M1 && !byte_dense(src)) {
      if (host_mirror(src, &hs, &lo, 1)) goto out;
    } else {
      const mla_tensor *cs = src;
      if (!byte_dense(src)) { /* GPU kernel to a contiguous temp: same dtype, never via host */
        if (temp_like(&gs, src, src->dtype, sd) || copy_impl(&gs, src, o)) goto out;
        cs = &gs;
      }
      void *p;
      if (temp_like(&hs, src, src->dtype, MLA_CPU) || mla_tensor_data(cs, &p) || mla_device_sync(sd) ||
          mla_cuda_check(cudaMemcpy(hs.storage->data, p, (size_t)hs.storage->nbytes, cudaMemcpyDeviceToHost), "copy to host"))
        goto out;
    }
    src = &hs;
  }
  if (dd == MLA_CPU) {
    rc = copy_impl(dst, src, o);
    goto out;
  }
  if (byte_dense(dst)) { /* convert on the host into dst's dtype, one upload */
    void *p;
    if (temp_like(&hd, dst, dst->dtype, MLA_CPU) || copy_impl(&hd, src, o) || mla_tensor_data(dst, &p) ||
        upload(dd, p, hd.storage->data, (size_t)hd.storage->nbytes))
      goto out;
    rc = 0;
  } else if (dst->dtype == MLA_E2M1) { /* read-modify-write of the spanned bytes */
    if (host_mirror(dst, &hd, &lo, 1) || copy_impl(&hd, src, o) || host_mirror_upload(dst, &hd, lo)) goto out;
    rc = 0;
  } else { /* upload contiguous, then a same-dtype GPU kernel places it */
    void *p;
    if (temp_like(&hd, dst, dst->dtype, MLA_CPU) || copy_impl(&hd, src, o) || temp_like(&gd, dst, dst->dtype, dd) ||
        mla_tensor_data(&gd, &p) || upload(dd, p, hd.storage->data, (size_t)hd.storage->nbytes))
      goto out;
    rc = copy_impl(dst, &gd, o);
  }
out:
  mla_tensor_release(&hs), mla_tensor_release(&hd), mla_tensor_release(&gs), mla_tensor_release(&gd);
  return rc;
}

static int copy_impl(mla_tensor *dst, const mla_tensor *src, const mla_cvt_opts *o) {
  int sd = mla_tensor_device(src), dd = mla_tensor_device(dst);
  mla_rows_desc r;
  if (mla_tensor_numel(dst) == 0) return 0;
  if (sd != dd) return copy_via_host(dst, src, o);
  if (dd == MLA_CPU) {
    if (dst->dtype == src->dtype && rows_of(dst, src, &r) == 0) cpu_copy_rows(&r);
    else cpu_copy_convert(dst, src, o);
    return 0;
  }
  if (dst->dtype == src->dtype && rows_of(dst, src, &r) == 0) return gpu_rows(dd, &r, "copy");
  if (dst->dtype == src->dtype && dst->dtype != MLA_E2M1) {
    /* same dtype but not expressible as rows: elementwise kernel moves values */
  } else if (!e2m1_whole_bytes(dst) || (dst->dtype == src->dtype)) {
    return copy_via_host(dst, src, o);
  }
  mla_strided_desc a, b;
  to_desc(dst, &a), to_desc(src, &b);
  cudaStream_t s = mla_device_stream(dd);
  if (!s || mla_cuda_check(mla_cuda_copy_convert(&a, &b, o->saturate, o->ue8m0_round_up, s), "copy")) return -1;
  return mla_launch_check(dd, "mla_copy_convert");
}

int mla_tensor_copy(mla_tensor *dst, const mla_tensor *src, const mla_cvt_opts *o) {
  if (!o) o = &mla_cvt_default;
  if (mla_tensor_validate(dst) || mla_tensor_validate(src)) return -1;
  if (!same_shape(dst, src)) {
    char a[128], b[128];
    shape_str(dst, a, sizeof a), shape_str(src, b, sizeof b);
    return mla_err("shape mismatch, destination %s, source %s", a, b);
  }
  if (dst->storage == src->storage) {
    int64_t dlo, dhi, slo, shi;
    mla_tensor_byte_range(dst, &dlo, &dhi), mla_tensor_byte_range(src, &slo, &shi);
    if (same_view(dst, src)) return 0; /* t:copy(t) */
    if (dlo < shi && slo < dhi) {
      /* overlapping ranges: read the whole source first, on every device */
      mla_tensor tmp;
      if (temp_like(&tmp, src, src->dtype, mla_tensor_device(src))) return -1;
      int rc = copy_impl(&tmp, src, o) || copy_impl(dst, &tmp, o) ? -1 : 0;
      mla_tensor_release(&tmp);
      return rc;
    }
  }
  return copy_impl(dst, src, o);
}

int mla_tensor_fill(mla_tensor *t, double v) {
  if (mla_tensor_validate(t)) return -1;
  int dev = mla_tensor_device(t);
  if (mla_tensor_numel(t) == 0) return 0;
  if (dev == MLA_CPU) {
    mla_iter it;
    for (mla_iter_init(&it, t); it.pos < it.n; mla_iter_next(&it))
      mla_store_double(t->dtype, t->storage->data, mla_iter_elem(&it, t), v, NULL);
    return 0;
  }
  if (!e2m1_whole_bytes(t)) return mla_err("fill: an e2m1 tensor on the GPU needs a contiguous, even last dim");
  mla_strided_desc d;
  to_desc(t, &d);
  cudaStream_t s = mla_device_stream(dev);
  if (!s || mla_cuda_check(mla_cuda_fill(&d, v, s), "fill")) return -1;
  return mla_launch_check(dev, "mla_fill");
}

static void cpu_random_bits(mla_tensor *t, int64_t e, uint64_t seed, int64_t i) {
  int bytes = mla_dtype_size(t->dtype);
  if (t->dtype == MLA_E2M1) {
    uint8_t *b = (uint8_t *)t->storage->data + (e >> 1);
    int sh = (int)(e & 1) * 4;
    *b = (uint8_t)((*b & ~(15 << sh)) | ((mla_rng_bits(seed, (uint64_t)i) & 15) << sh));
    return;
  }
  mla_philox_out w = mla_philox(seed, (uint64_t)i);
  unsigned char *p = (unsigned char *)t->storage->data + e * bytes;
  for (int k = 0; k < bytes; k++) p[k] = (unsigned char)((k < 4 ? w.v[0] >> (8 * k) : w.v[1] >> (8 * (k - 4))) & 0xFF);
}

int mla_tensor_random(mla_tensor *t, uint64_t seed, mla_rng_kind kind, double a, double b) {
  if (mla_tensor_validate(t)) return -1;
  int dev = mla_tensor_device(t);
  if (mla_tensor_numel(t) == 0) return 0;
  if (dev == MLA_CPU) {
    mla_iter it;
    for (mla_iter_init(&it, t); it.pos < it.n; mla_iter_next(&it)) {
      int64_t e = mla_iter_elem(&it, t);
      if (kind == MLA_RNG_BITS) cpu_random_bits(t, e, seed, it.pos);
      else mla_store_double(t->dtype, t->storage->data, e,
                            kind == MLA_RNG_UNIFORM ? mla_rng_uniform(seed, (uint64_t)it.pos, a, b)
                                                    : mla_rng_normal(seed, (uint64_t)it.pos, a, b), NULL);
    }
    return 0;
  }
  if (!e2m1_whole_bytes(t)) return mla_err("random: an e2m1 tensor on the GPU needs a contiguous, even last dim");
  mla_strided_desc d;
  to_desc(t, &d);
  cudaStream_t s = mla_device_stream(dev);
  if (!s || mla_cuda_check(mla_cuda_random(&d, seed, (int)kind, a, b, s), "random")) return -1;
  return mla_launch_check(dev, "mla_random");
}
