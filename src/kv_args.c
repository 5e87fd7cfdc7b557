/* Argument conversion and checks shared by the KV operations (kv_args.h). */
#include "kv_args.h"

#include <stdio.h>

#include "device.h"
#include "layout_check.h"
#include "mla_error.h"

const char *mla_kv_device_str(int dev, char *buf, int n) {
  if (dev == MLA_CPU) snprintf(buf, (size_t)n, "cpu");
  else snprintf(buf, (size_t)n, "cuda:%d", dev);
  return buf;
}

int mla_kv_same_device(const mla_tensor *t, const char *name, int dev) {
  int td = mla_tensor_device(t);
  if (td == dev) return 0;
  char a[32], b[32];
  return mla_err("%s is on %s but the cache is on %s (move it with :to())", name, mla_kv_device_str(td, a, 32),
                 mla_kv_device_str(dev, b, 32));
}

static int is_index(mla_dtype dt) { return dt == MLA_I32 || dt == MLA_I64; }

static int index_tensor(const mla_tensor *t, const char *name, int dev, int lo_dims, int hi_dims, const void **data) {
  if (!is_index(t->dtype) || t->ndim < lo_dims || t->ndim > hi_dims)
    return mla_err("%s must be a %s i32 or i64 tensor, got %s with %d dims", name,
                   lo_dims == hi_dims ? (lo_dims == 1 ? "1-dim" : "2-dim") : "1- or 2-dim", mla_dtype_name(t->dtype),
                   t->ndim);
  if (mla_kv_same_device(t, name, dev)) return -1;
  void *p;
  if (mla_tensor_data(t, &p)) return mla_err_prefix("%s: ", name);
  *data = p;
  return 0;
}

int mla_kv_arg_ivec(const mla_tensor *t, const char *name, int dev, mla_kv_ivec *out) {
  *out = (mla_kv_ivec){0};
  if (!t) return 0;
  if (index_tensor(t, name, dev, 1, 1, &out->data)) return -1;
  out->n = t->sizes[0], out->stride = t->strides[0], out->is64 = t->dtype == MLA_I64;
  return 0;
}

int mla_kv_arg_imat(const mla_tensor *t, const char *name, int dev, mla_kv_imat *out) {
  *out = (mla_kv_imat){0};
  if (!t) return 0;
  if (index_tensor(t, name, dev, 2, 2, &out->data)) return -1;
  out->rows = t->sizes[0], out->cols = t->sizes[1], out->rs = t->strides[0], out->cs = t->strides[1];
  out->is64 = t->dtype == MLA_I64;
  return 0;
}

int mla_kv_arg_omat(mla_tensor *t, const char *name, int dev, mla_kv_omat *out) {
  *out = (mla_kv_omat){0};
  if (!t) return 0;
  const void *p;
  if (index_tensor(t, name, dev, 1, 2, &p)) return -1;
  out->data = (void *)p;
  out->rows = t->sizes[0], out->rs = t->strides[0], out->is64 = t->dtype == MLA_I64;
  out->cols = t->ndim == 2 ? t->sizes[1] : 1;
  out->cs = t->ndim == 2 ? t->strides[1] : 0;
  if (out->rows > 1 && out->cols > 0 && out->rs == 0) return mla_err("%s has overlapping rows (stride 0)", name);
  if (out->cols > 1 && out->cs == 0) return mla_err("%s has overlapping columns (stride 0)", name);
  return 0;
}

int mla_kv_arg_rows(const mla_tensor *t, const char *name, int dev, int writable, mla_kv_rows *out) {
  *out = (mla_kv_rows){0};
  if (t->dtype != MLA_BF16 || t->ndim != 2)
    return mla_err("%s must be a 2-dim bf16 tensor, got %s with %d dims", name, mla_dtype_name(t->dtype), t->ndim);
  if (mla_kv_same_device(t, name, dev)) return -1;
  if (t->sizes[1] > 1 && t->strides[1] != 1)
    return mla_err("%s must have contiguous rows (stride(1) = 1, got %lld)", name, (long long)t->strides[1]);
  if (t->sizes[1] % 8)
    return mla_err("%s has %lld columns; kernels move 8 dims at a time, so a multiple of 8 is expected", name,
                   (long long)t->sizes[1]);
  if (writable && t->sizes[0] > 1 && t->strides[0] < t->sizes[1])
    return mla_err("%s rows overlap (stride(0) = %lld < %lld columns)", name, (long long)t->strides[0],
                   (long long)t->sizes[1]);
  void *p;
  if (mla_tensor_data(t, &p)) return mla_err_prefix("%s: ", name);
  out->data = p, out->rows = t->sizes[0], out->cols = t->sizes[1], out->stride = t->strides[0];
  return 0;
}

#define MLA_KV_MAX_DEVICES 64
static unsigned long long *bad_counters[MLA_KV_MAX_DEVICES];

unsigned long long *mla_kv_bad_counter(int dev) {
  if (dev < 0 || dev >= MLA_KV_MAX_DEVICES) {
    mla_err("device %d: at most %d devices are supported", dev, MLA_KV_MAX_DEVICES);
    return NULL;
  }
  if (!bad_counters[dev]) {
    void *p;
    if (mla_device_alloc(dev, sizeof(unsigned long long), &p)) return NULL;
    if (mla_cuda_check(cudaMemsetAsync(p, 0, sizeof(unsigned long long), mla_device_stream(dev)), "cudaMemsetAsync")) {
      mla_device_free(dev, p, sizeof(unsigned long long));
      return NULL;
    }
    bad_counters[dev] = p;
  }
  return bad_counters[dev];
}

static void *scratch[MLA_KV_MAX_DEVICES];
static int64_t scratch_bytes[MLA_KV_MAX_DEVICES];

void *mla_kv_scratch(int dev, int64_t bytes, int64_t *have) {
  if (dev < 0 || dev >= MLA_KV_MAX_DEVICES) {
    mla_err("device %d: at most %d devices are supported", dev, MLA_KV_MAX_DEVICES);
    return NULL;
  }
  if (scratch_bytes[dev] < bytes) {
    void *p;
    if (mla_device_alloc(dev, bytes, &p)) return NULL;
    if (mla_cuda_check(cudaMemsetAsync(p, 0, (size_t)bytes, mla_device_stream(dev)), "cudaMemsetAsync")) {
      mla_device_free(dev, p, bytes);
      return NULL;
    }
    /* stream-ordered: work queued on the old block finishes before any reuse */
    if (scratch[dev]) mla_device_free(dev, scratch[dev], scratch_bytes[dev]);
    scratch[dev] = p, scratch_bytes[dev] = bytes;
  }
  if (have) *have = scratch_bytes[dev];
  return scratch[dev];
}

static struct {
  cudaStream_t stream;
  cudaEvent_t fork, join;
} sides[MLA_KV_MAX_DEVICES];

int mla_kv_side_stream(int dev, cudaStream_t *side, cudaEvent_t *fork, cudaEvent_t *join) {
  if (dev < 0 || dev >= MLA_KV_MAX_DEVICES)
    return mla_err("device %d: at most %d devices are supported", dev, MLA_KV_MAX_DEVICES);
  if (!sides[dev].stream) {
    cudaStream_t st;
    cudaEvent_t a, b;
    int lo = 0, hi = 0; /* the highest priority: its blocks are dispatched before those of a long kernel beside it */
    cudaDeviceGetStreamPriorityRange(&lo, &hi);
    if (mla_cuda_check(cudaStreamCreateWithPriority(&st, cudaStreamNonBlocking, hi), "cudaStreamCreate (side stream)"))
      return -1;
    if (mla_cuda_check(cudaEventCreateWithFlags(&a, cudaEventDisableTiming), "cudaEventCreate")) {
      cudaStreamDestroy(st);
      return -1;
    }
    if (mla_cuda_check(cudaEventCreateWithFlags(&b, cudaEventDisableTiming), "cudaEventCreate")) {
      cudaEventDestroy(a);
      cudaStreamDestroy(st);
      return -1;
    }
    sides[dev].stream = st, sides[dev].fork = a, sides[dev].join = b;
  }
  *side = sides[dev].stream, *fork = sides[dev].fork, *join = sides[dev].join;
  return 0;
}

/* pinned, so that both copies are queued and one sync waits for them */
static unsigned long long *host_slots[MLA_KV_MAX_DEVICES];

int mla_kv_read_back(int dev, const int64_t *value_at, int64_t *value, int64_t *nbad) {
  unsigned long long *bad = mla_kv_bad_counter(dev);
  cudaStream_t s = mla_device_stream(dev);
  if (!bad || !s) return -1;
  if (!host_slots[dev]) {
    void *h = NULL;
    if (mla_cuda_check(cudaMallocHost(&h, 2 * sizeof(unsigned long long)), "cudaMallocHost (read-back slots)")) return -1;
    host_slots[dev] = h;
  }
  unsigned long long *h = host_slots[dev];
  if (mla_cuda_check(cudaMemcpyAsync(&h[0], bad, sizeof h[0], cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync")) return -1;
  if (value_at &&
      mla_cuda_check(cudaMemcpyAsync(&h[1], value_at, sizeof h[1], cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync"))
    return -1;
  if (mla_device_sync(dev)) return -1;
  *nbad = (int64_t)h[0];
  if (value_at) *value = (int64_t)h[1];
  if (h[0] && mla_cuda_check(cudaMemsetAsync(bad, 0, sizeof h[0], s), "cudaMemsetAsync")) return -1;
  return 0;
}

int mla_kv_need_tensor_scale(const mla_kv_cache *c, const char *what) {
  if (mla_layout_has_tensor_scale(&c->desc) && !c->view.tensor_scale)
    return mla_err("%s: the layout stores fields under a per-tensor scale; pass tensor_scale (an f32 tensor of 1 element)",
                   what);
  return 0;
}

int mla_kv_cuda_ctx(int dev, cudaStream_t *s, unsigned long long **bad) {
  if (mla_device_use(dev)) return -1;
  *s = mla_device_stream(dev);
  if (!*s) return -1;
  if (bad && !(*bad = mla_kv_bad_counter(dev))) return -1;
  return 0;
}

int mla_kv_launched(int dev, cudaError_t e, const char *kernel) {
  if (e != cudaSuccess) {
    char what[128];
    snprintf(what, sizeof what, "launch of kernel %s", kernel);
    return mla_cuda_check(e, what);
  }
  return mla_launch_check(dev, kernel);
}
