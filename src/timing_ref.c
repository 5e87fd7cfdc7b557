/* Reference rates measured on the device in hand, so reports can say what
 * fraction of an achievable rate a kernel reaches (not only of a datasheet
 * formula): cudaMemcpy device to device, and a cuBLAS bf16 GEMM. */
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>

#include "device.h"
#include "dtype.h"
#include "kernels/tensor_kernels.h"
#include "mla_error.h"
#include "timing.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Times `reps` runs of op(ctx) on the device stream, one event pair each. */
typedef int (*timed_op)(void *ctx, cudaStream_t s);

static int time_reps(int dev, timed_op op, void *ctx, int warmup, int reps, double *med_s) {
  cudaStream_t s = mla_device_stream(dev);
  if (!s) return -1;
  if (reps < 1 || reps > 1000) return mla_err("reps must be 1..1000 (got %d)", reps);
  cudaEvent_t e0 = NULL, e1 = NULL;
  double *t = calloc((size_t)reps, sizeof *t);
  int rc = t ? 0 : mla_err("out of host memory");
  if (rc == 0) rc = mla_cuda_check(cudaEventCreate(&e0), "cudaEventCreate") || mla_cuda_check(cudaEventCreate(&e1), "cudaEventCreate");
  for (int i = 0; rc == 0 && i < warmup; i++) rc = op(ctx, s);
  if (rc == 0) rc = mla_device_sync(dev);
  for (int i = 0; rc == 0 && i < reps; i++) {
    float ms = 0;
    rc = mla_cuda_check(cudaEventRecord(e0, s), "cudaEventRecord");
    if (rc == 0) rc = op(ctx, s);
    if (rc == 0) rc = mla_cuda_check(cudaEventRecord(e1, s), "cudaEventRecord");
    if (rc == 0) rc = mla_device_sync(dev);
    if (rc == 0) rc = mla_cuda_check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
    t[i] = ms * 1e-3;
  }
  if (rc == 0) *med_s = median(t, reps);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  free(t);
  return rc;
}

/* ---- memcpy ------------------------------------------------------------- */

typedef struct copy_ctx { void *dst, *src; size_t bytes; } copy_ctx;

static int copy_op(void *p, cudaStream_t s) {
  copy_ctx *c = p;
  return mla_cuda_check(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync D2D");
}

/* ---- GEMM ------------------------------------------------------------------- */

typedef struct gemm_ctx { cublasHandle_t h; void *a, *b, *c; int n; } gemm_ctx;

static int cublas_check(cublasStatus_t st, const char *what) {
  return st == CUBLAS_STATUS_SUCCESS ? 0 : mla_err("cuBLAS %s failed (status %d)", what, (int)st);
}

static int gemm_op(void *p, cudaStream_t s) {
  gemm_ctx *g = p;
  const float alpha = 1.0f, beta = 0.0f;
  (void)s; /* the handle is bound to the device stream */
  return cublas_check(cublasGemmEx(g->h, CUBLAS_OP_N, CUBLAS_OP_N, g->n, g->n, g->n, &alpha, g->a, CUDA_R_16BF, g->n,
                                   g->b, CUDA_R_16BF, g->n, &beta, g->c, CUDA_R_16BF, g->n, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT),
                      "GemmEx bf16");
}

/* Random normal bf16: a GEMM on zeros runs at clocks real data never sees. */
static int fill_normal(int dev, void *p, int64_t n, uint64_t seed) {
  mla_strided_desc d;
  memset(&d, 0, sizeof d);
  d.base = p, d.dtype = MLA_BF16, d.ndim = 1, d.sizes[0] = n, d.strides[0] = 1;
  cudaError_t e = mla_cuda_random(&d, seed, 1, 0.0, 1.0, mla_device_stream(dev));
  if (e != cudaSuccess) return mla_cuda_check(e, "launch of kernel random (gemm reference)");
  return mla_launch_check(dev, "random");
}

/* ---- reference operations ------------------------------------------------ */

struct mla_ref_op {
  int dev;
  mla_ref_kind kind;
  copy_ctx copy;
  gemm_ctx gemm;
};

void mla_ref_op_free(mla_ref_op *op) {
  if (!op) return;
  if (op->gemm.h) cublasDestroy(op->gemm.h);
  void *bufs[] = {op->copy.src, op->copy.dst, op->gemm.a, op->gemm.b, op->gemm.c};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i]) cudaFree(bufs[i]);
  cudaGetLastError();
  free(op);
}

static int alloc_ref(void **p, size_t bytes) { return mla_cuda_check(cudaMalloc(p, bytes), "cudaMalloc (reference operation)"); }

int mla_ref_op_new(int dev, mla_ref_kind kind, int64_t size, mla_ref_op **out) {
  *out = NULL;
  if (mla_device_use(dev)) return -1;
  if (kind == MLA_REF_MEMCPY && size < (1 << 20)) return mla_err("memcpy reference: use at least 1 MiB (got %lld bytes)", (long long)size);
  if (kind == MLA_REF_GEMM && (size < 256 || size > 32768 || size % 64))
    return mla_err("gemm reference: n must be a multiple of 64 in 256..32768 (got %lld)", (long long)size);
  mla_ref_op *op = calloc(1, sizeof *op);
  if (!op) return mla_err("out of host memory");
  op->dev = dev, op->kind = kind;
  int rc = 0;
  if (kind == MLA_REF_MEMCPY) {
    op->copy.bytes = (size_t)size;
    rc = alloc_ref(&op->copy.src, op->copy.bytes);
    if (rc == 0) rc = alloc_ref(&op->copy.dst, op->copy.bytes);
    if (rc == 0) rc = mla_cuda_check(cudaMemsetAsync(op->copy.src, 0x5a, op->copy.bytes, mla_device_stream(dev)), "cudaMemsetAsync");
  } else {
    gemm_ctx *g = &op->gemm;
    const size_t bytes = (size_t)size * (size_t)size * 2;
    g->n = (int)size;
    rc = cublas_check(cublasCreate(&g->h), "create");
    if (rc == 0) rc = cublas_check(cublasSetStream(g->h, mla_device_stream(dev)), "set stream");
    if (rc == 0) rc = alloc_ref(&g->a, bytes);
    if (rc == 0) rc = alloc_ref(&g->b, bytes);
    if (rc == 0) rc = alloc_ref(&g->c, bytes);
    if (rc == 0) rc = fill_normal(dev, g->a, (int64_t)size * size, 0x6e6d1);
    if (rc == 0) rc = fill_normal(dev, g->b, (int64_t)size * size, 0x6e6d2);
  }
  if (rc == 0) rc = mla_device_sync(dev);
  if (rc) {
    mla_ref_op_free(op);
    return rc;
  }
  *out = op;
  return 0;
}

int mla_ref_op_launch(mla_ref_op *op) {
  if (mla_device_use(op->dev)) return -1;
  cudaStream_t s = mla_device_stream(op->dev);
  return op->kind == MLA_REF_MEMCPY ? copy_op(&op->copy, s) : gemm_op(&op->gemm, s);
}

static int ref_op_timed(void *op, cudaStream_t s) {
  (void)s; /* the operation runs on its device's stream */
  return mla_ref_op_launch(op);
}

/* One burst of `reps` event-timed runs after 3 warm-up runs (the median). */
static int burst(int dev, mla_ref_kind kind, int64_t size, int reps, double *med_s) {
  mla_ref_op *op = NULL;
  int rc = mla_ref_op_new(dev, kind, size, &op);
  if (rc == 0) rc = time_reps(dev, ref_op_timed, op, 3, reps, med_s);
  mla_ref_op_free(op);
  return rc;
}

int mla_memcpy_bandwidth(int dev, int64_t bytes, int reps, double *gbs) {
  double t = 0;
  int rc = burst(dev, MLA_REF_MEMCPY, bytes, reps, &t);
  if (rc == 0) *gbs = 2.0 * (double)bytes / t / 1e9; /* read + written */
  return rc;
}

int mla_gemm_rate(int dev, int n, int reps, double *tflops) {
  double t = 0;
  int rc = burst(dev, MLA_REF_GEMM, n, reps, &t);
  if (rc == 0) *tflops = 2.0 * (double)n * n * n / t / 1e12;
  return rc;
}
