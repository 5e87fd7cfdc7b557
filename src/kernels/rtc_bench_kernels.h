/* The baseline of bench/rtc_bench.lua's launch-overhead figure: an empty
 * kernel baked in with nvcc, with the parameter list of the JIT empty kernel
 * the bench launches from Lua, and a C loop of plain cudaLaunchKernel calls. */
#ifndef MLA_RTC_BENCH_KERNELS_H
#define MLA_RTC_BENCH_KERNELS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* n launches of the empty kernel (grid x block threads, arguments p, a, b) on
 * stream s. *seconds: host wall time of the launch loop alone; the stream is
 * synchronized before the clock starts and after it stops. */
cudaError_t mla_cuda_time_empty_launches(int64_t n, unsigned grid, unsigned block, float *p, int32_t a, int64_t b,
                                         cudaStream_t s, double *seconds);

#ifdef __cplusplus
}
#endif
#endif
