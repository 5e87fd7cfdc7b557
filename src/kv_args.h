/* Tensors -> the plain arguments of src/kv_types.h, with the checks every
 * KV operation shares. Each returns 0, or -1 with an mla_err message naming
 * the argument (`name`) and what was expected. A NULL tensor gives an empty
 * argument (n = 0 / data NULL) where the argument is optional. */
#ifndef MLA_KV_ARGS_H
#define MLA_KV_ARGS_H

#include <cuda_runtime_api.h>

#include "kv_types.h"
#include "tensor.h"

/* 1-dim i32/i64 index vector on dev. */
int mla_kv_arg_ivec(const mla_tensor *t, const char *name, int dev, mla_kv_ivec *out);
/* 2-dim i32/i64 index matrix on dev. */
int mla_kv_arg_imat(const mla_tensor *t, const char *name, int dev, mla_kv_imat *out);
/* Writable i32/i64 index matrix on dev (1-dim tensors are one column). */
int mla_kv_arg_omat(mla_tensor *t, const char *name, int dev, mla_kv_omat *out);
/* bf16 [rows, cols] on dev, contiguous last dim, cols a multiple of 8;
 * writable rows must not overlap. */
int mla_kv_arg_rows(const mla_tensor *t, const char *name, int dev, int writable, mla_kv_rows *out);
/* Every tensor on the same device as the cache. */
int mla_kv_same_device(const mla_tensor *t, const char *name, int dev);
const char *mla_kv_device_str(int dev, char *buf, int n);

/* A layout with per-tensor-scaled fields needs the view's tensor scale. */
int mla_kv_need_tensor_scale(const mla_kv_cache *c, const char *what);

/* Makes dev current and returns its stream and (bad != NULL) its bad-index counter. */
int mla_kv_cuda_ctx(int dev, cudaStream_t *s, unsigned long long **bad);
/* After a launch: its status, then mla_launch_check, naming the kernel. */
int mla_kv_launched(int dev, cudaError_t e, const char *kernel);

/* The device counter of skipped out-of-range indices (allocated and zeroed
 * on first use); NULL with an error if it cannot be allocated. */
unsigned long long *mla_kv_bad_counter(int dev);
/* A per-device scratch of at least `bytes` (*have: its size), zeroed when
 * (re)allocated, kept between calls (grown, never shrunk: a captured CUDA
 * graph keeps its address until a larger one is asked for); NULL with an
 * error if it cannot be allocated. */
void *mla_kv_scratch(int dev, int64_t bytes, int64_t *have);
/* A second stream of dev, with a fork and a join event, for independent work
 * that overlaps the main stream's (recorded and waited on like any stream
 * work, so CUDA-graph capture follows the fork and the join). */
int mla_kv_side_stream(int dev, cudaStream_t *side, cudaEvent_t *fork, cudaEvent_t *join);
/* One host round trip: waits for dev's stream, then gives *value (the
 * device i64 at value_at, when both are given) and the bad-index counter
 * (*nbad, which is zeroed on the device when it was not zero). */
int mla_kv_read_back(int dev, const int64_t *value_at, int64_t *value, int64_t *nbad);

#endif
