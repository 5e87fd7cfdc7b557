/* Launchers for the tensor kernels (copy, convert, fill, random). They take
 * plain descriptors so the C core needs no C++; each returns the launch's
 * cudaError_t and the caller checks it with mla_launch_check. */
#ifndef MLA_TENSOR_KERNELS_H
#define MLA_TENSOR_KERNELS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mla_strided_desc {
  void *base;     /* storage start */
  int64_t offset; /* in elements */
  int32_t dtype, ndim;
  int64_t sizes[8], strides[8]; /* elements */
} mla_strided_desc;

/* Rows of bytes: row r of dst is at dst + sum_k idx_k * dst_stride_k (bytes),
 * with the row index decomposed over `nouter` outer dims (sizes[0] outermost). */
typedef struct mla_rows_desc {
  char *dst;
  const char *src;
  int64_t row_bytes;
  int32_t nouter;
  int64_t sizes[8], dst_strides[8], src_strides[8]; /* bytes */
} mla_rows_desc;

cudaError_t mla_cuda_copy_rows(const mla_rows_desc *d, cudaStream_t s);
cudaError_t mla_cuda_copy_convert(const mla_strided_desc *dst, const mla_strided_desc *src, int saturate,
                                  int ue8m0_up, cudaStream_t s);
cudaError_t mla_cuda_fill(const mla_strided_desc *t, double v, cudaStream_t s);
cudaError_t mla_cuda_random(const mla_strided_desc *t, uint64_t seed, int kind, double a, double b,
                            cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
