/* Launchers of the bench harness kernels (timing_kernels.cu). */
#ifndef MLA_TIMING_KERNELS_H
#define MLA_TIMING_KERNELS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* flag and timed_out are device pointers to mapped host memory. */
cudaError_t mla_cuda_block_stream(const int32_t *flag, int32_t *timed_out, double timeout_s, cudaStream_t s);
/* Reads `bytes` of p (a multiple of 16, 16-aligned) through L2. */
cudaError_t mla_cuda_l2_read(const void *p, int64_t bytes, uint32_t *sink, int sm_count, cudaStream_t s);
/* Writes zeros over `bytes` of p (a multiple of 16, 16-aligned) through L2. */
cudaError_t mla_cuda_l2_fill(void *p, int64_t bytes, int sm_count, cudaStream_t s);
/* out[0] = global timer (ns), out[1] = SM 0's cycle counter. */
cudaError_t mla_cuda_clock_stamp(uint64_t *out, int sm_count, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
