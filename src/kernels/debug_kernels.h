/* Deliberately failing kernels for isolation tests. */
#ifndef MLA_DEBUG_KERNELS_H
#define MLA_DEBUG_KERNELS_H
#include <cuda_runtime_api.h>
#ifdef __cplusplus
extern "C" {
#endif
enum { MLA_DEBUG_OOB_STORE = 0, MLA_DEBUG_TRAP = 1, MLA_DEBUG_SPIN = 2 };
/* buf: a small device buffer (zeroed for SPIN: the kernel waits for a nonzero word) */
cudaError_t mla_debug_launch(int kind, void *buf, cudaStream_t s);
#ifdef __cplusplus
}
#endif
#endif
