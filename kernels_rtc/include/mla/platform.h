/* Qualifiers for code shared by C11 host files, nvcc and NVRTC. */
#ifndef MLA_PLATFORM_H
#define MLA_PLATFORM_H

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define MLA_HD __host__ __device__ __forceinline__
#define MLA_DEVICE_CODE 1
#else
#define MLA_HD static inline
#endif

/* A loop the device compiler should unroll (nothing for host compilers). */
#if defined(__CUDA_ARCH__) || defined(__CUDACC_RTC__)
#define MLA_UNROLL _Pragma("unroll")
#else
#define MLA_UNROLL
#endif

/* Functions shared with C that C++ callers may also evaluate at compile time. */
#ifdef __cplusplus
#define MLA_CONSTEXPR constexpr
#else
#define MLA_CONSTEXPR
#endif

#if defined(__CUDACC_RTC__)
/* NVRTC has no <stdint.h> without the toolkit's include path; mlalab passes
 * it, but keep the fixed-width names available either way. */
#include <cuda/std/cstdint>
using cuda::std::int32_t; using cuda::std::int64_t; using cuda::std::uint8_t;
using cuda::std::uint16_t; using cuda::std::uint32_t; using cuda::std::uint64_t;
#else
#include <stdint.h>
#endif

#endif
