// Helpers shared by the baked KV-cache kernels: index loads, request
// lookup, slot decomposition, launch geometry.
#ifndef MLA_KV_COMMON_CUH
#define MLA_KV_COMMON_CUH

#include <stdlib.h>

#include <cuda_runtime.h>

#include "kv_kernels.h"
#include "mla/token_access.cuh"

namespace mla_kv {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t ld_idx(const void *p, int64_t i, int is64) {
  return is64 ? __ldg((const long long *)p + i) : (int64_t)__ldg((const int *)p + i);
}
__device__ __forceinline__ int64_t ivec_at(const mla_kv_ivec &v, int64_t i) { return ld_idx(v.data, i * v.stride, v.is64); }
__device__ __forceinline__ int64_t imat_at(const mla_kv_imat &m, int64_t r, int64_t c) {
  return ld_idx(m.data, r * m.rs + c * m.cs, m.is64);
}
__device__ __forceinline__ void omat_set(const mla_kv_omat &m, int64_t r, int64_t c, int64_t v) {
  int64_t e = r * m.rs + c * m.cs;
  if (m.is64) ((long long *)m.data)[e] = v;
  else ((int *)m.data)[e] = (int)v;
}

// Largest r with cu[r] <= x, for x in [cu[0], cu[n-1]); cu nondecreasing.
__device__ __forceinline__ int64_t find_segment(const mla_kv_ivec &cu, int64_t x) {
  int64_t lo = 0, hi = cu.n - 1; // answer in [lo, hi)
  while (hi - lo > 1) {
    int64_t mid = (lo + hi) >> 1;
    if (ivec_at(cu, mid) <= x) lo = mid;
    else hi = mid;
  }
  return lo;
}

// slot -> (page, offset) with a 32-bit division when the slot fits.
__device__ __forceinline__ void split_slot(int64_t slot, int bs, int64_t &page, int64_t &t) {
  if ((uint64_t)slot < 0x80000000ull) {
    uint32_t s = (uint32_t)slot, p = s / (uint32_t)bs;
    page = p, t = s - p * (uint32_t)bs;
  } else {
    page = slot / bs, t = slot - page * bs;
  }
}

__device__ __forceinline__ void count_bad(unsigned long long *bad) { atomicAdd(bad, 1ull); }

inline int pow2_at_least(int n) {
  int l = 1;
  while (l < n) l <<= 1;
  return l;
}

// Lanes per token. Fewer lanes per token put more tokens (and bytes) in
// flight per warp, which a latency-bound gather needs; at most 5 chunks per
// lane keeps registers near 64 (ptxas: 9 chunks cost ~100, halving the warps
// an SM holds): 576-dim rows get 16 lanes x 5 chunks (2 tokens per warp),
// 512-dim 16 x 4, the 128-dim indexer key 8 x 2 (4 tokens per warp).
// MLALAB_KV_LPT=8|16|32 overrides the choice (for tuning; ignored when the row
// would need more than 16 chunks per lane).
inline int lanes_per_token(int nchunks) {
  static int env = -1;
  if (env < 0) {
    const char *s = getenv("MLALAB_KV_LPT");
    int v = s ? atoi(s) : 0;
    env = (v == 1 || v == 2 || v == 4 || v == 8 || v == 16 || v == 32) ? v : 0;
  }
  int lpt = pow2_at_least((nchunks + 4) / 5);
  int small = pow2_at_least(nchunks) < 8 ? pow2_at_least(nchunks) : 8;
  if (lpt < small) lpt = small;
  if (env && (nchunks + env - 1) / env <= 16) lpt = env;
  return lpt < 32 ? lpt : 32;
}

// Chunks per lane, rounded up to an instantiated count.
inline int iters_for(int nchunks, int lpt) {
  int need = (nchunks + lpt - 1) / lpt;
  const int inst[] = {1, 2, 3, 4, 5, 8, 9, 16};
  for (int v : inst)
    if (v >= need) return v;
  return -1;
}

// A persistent grid: as many blocks as fit on the device at once, capped by the work.
template <typename K> int grid_for(K kernel, size_t smem, int64_t work_blocks) {
  int dev = 0, sms = 0, per_sm = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem);
  int64_t g = (int64_t)(sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
  if (work_blocks < g) g = work_blocks;
  return g < 1 ? 1 : (int)g;
}

} // namespace mla_kv

// Instantiates `body` with ITERS bound to each supported chunks-per-lane count.
#define MLA_KV_DISPATCH_ITERS(iters, ...)                                 \
  switch (iters) {                                                        \
  case 1: { constexpr int ITERS = 1; __VA_ARGS__; } break;                \
  case 2: { constexpr int ITERS = 2; __VA_ARGS__; } break;                \
  case 3: { constexpr int ITERS = 3; __VA_ARGS__; } break;                \
  case 4: { constexpr int ITERS = 4; __VA_ARGS__; } break;                \
  case 5: { constexpr int ITERS = 5; __VA_ARGS__; } break;                \
  case 9: { constexpr int ITERS = 9; __VA_ARGS__; } break;                \
  case 8: { constexpr int ITERS = 8; __VA_ARGS__; } break;                \
  case 16: { constexpr int ITERS = 16; __VA_ARGS__; } break;              \
  default: return cudaErrorInvalidValue;                                  \
  }

#endif
