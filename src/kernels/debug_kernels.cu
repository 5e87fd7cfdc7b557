// Kernels that fail on purpose, for the isolation specs and experiments:
// an out-of-bounds store (illegal address), a trap, and a spin that never
// returns. Never launched by anything but tests.
#include <cuda_runtime.h>

#include "debug_kernels.h"

namespace {

__global__ void oob_store_kernel(float *p, long long offset) { p[offset] = 1.0f; }

__global__ void trap_kernel() { __trap(); }

__global__ void spin_kernel(volatile int *never_set) {
  while (*never_set == 0) {
    __nanosleep(1000);
  }
}

} // namespace

extern "C" cudaError_t mla_debug_launch(int kind, void *buf, cudaStream_t s) {
  switch (kind) {
  case MLA_DEBUG_OOB_STORE:
    // 1 TiB past a small allocation: far outside anything mapped
    oob_store_kernel<<<1, 1, 0, s>>>((float *)buf, 1LL << 38);
    break;
  case MLA_DEBUG_TRAP: trap_kernel<<<1, 1, 0, s>>>(); break;
  default: spin_kernel<<<1, 1, 0, s>>>((volatile int *)buf); break;
  }
  return cudaGetLastError();
}
