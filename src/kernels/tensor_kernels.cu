// Tensor copy, conversion, fill and random kernels.
#include "tensor_kernels.h"

#include "mla/convert.cuh"
#include "mla/philox.h"

namespace {

constexpr int kThreads = 256;

int grid_for(int64_t n, int per_thread = 1) {
  int64_t blocks = (n + (int64_t)kThreads * per_thread - 1) / ((int64_t)kThreads * per_thread);
  if (blocks > 132 * 32) blocks = 132 * 32; // grid-stride beyond this
  return blocks < 1 ? 1 : (int)blocks;
}

// Element index (storage elements) of logical index i under a strided descriptor.
__device__ __forceinline__ int64_t elem_of(const mla_strided_desc &d, int64_t i) {
  int64_t e = d.offset;
  for (int k = d.ndim - 1; k >= 0; k--) {
    int64_t sz = d.sizes[k];
    e += (i % sz) * d.strides[k];
    i /= sz;
  }
  return e;
}

template <typename V>
__global__ void copy_rows_kernel(const __grid_constant__ mla_rows_desc d, int64_t vec_per_row, int64_t total) {
  for (int64_t v = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; v < total; v += (int64_t)gridDim.x * blockDim.x) {
    int64_t row = v / vec_per_row, col = v - row * vec_per_row;
    int64_t doff = 0, soff = 0;
    for (int k = d.nouter - 1; k > 0; k--) {
      int64_t sz = d.sizes[k], ix = row % sz;
      row /= sz;
      doff += ix * d.dst_strides[k];
      soff += ix * d.src_strides[k];
    }
    doff += row * d.dst_strides[0]; // the outermost index needs no division (nouter >= 1)
    soff += row * d.src_strides[0];
    const V *s = reinterpret_cast<const V *>(d.src + soff) + col;
    V *t = reinterpret_cast<V *>(d.dst + doff) + col;
    *t = __ldg(s);
  }
}

// 32-bit index variant for the common case: fewer divisions per element.
template <typename V>
__global__ void copy_rows_kernel32(const __grid_constant__ mla_rows_desc d, uint32_t vec_per_row, uint32_t total) {
  for (uint32_t v = blockIdx.x * blockDim.x + threadIdx.x; v < total; v += gridDim.x * blockDim.x) {
    uint32_t row = v / vec_per_row, col = v - row * vec_per_row;
    int64_t doff = 0, soff = 0;
    for (int k = d.nouter - 1; k > 0; k--) {
      uint32_t sz = (uint32_t)d.sizes[k], ix = row % sz;
      row /= sz;
      doff += (int64_t)ix * d.dst_strides[k];
      soff += (int64_t)ix * d.src_strides[k];
    }
    doff += (int64_t)row * d.dst_strides[0];
    soff += (int64_t)row * d.src_strides[0];
    const V *s = reinterpret_cast<const V *>(d.src + soff) + col;
    V *t = reinterpret_cast<V *>(d.dst + doff) + col;
    *t = __ldg(s);
  }
}

// The kernels take the outermost row index without a division: nouter >= 1.
template <typename V> cudaError_t launch_rows(const mla_rows_desc *d, cudaStream_t s) {
  if (d->nouter < 1) return cudaErrorInvalidValue;
  int64_t rows = 1;
  for (int k = 0; k < d->nouter; k++) rows *= d->sizes[k];
  int64_t vpr = d->row_bytes / (int64_t)sizeof(V), total = rows * vpr;
  if (total == 0) return cudaSuccess;
  if (total < (1LL << 31)) copy_rows_kernel32<V><<<grid_for(total, 4), kThreads, 0, s>>>(*d, (uint32_t)vpr, (uint32_t)total);
  else copy_rows_kernel<V><<<grid_for(total, 4), kThreads, 0, s>>>(*d, vpr, total);
  return cudaGetLastError();
}

__global__ void copy_convert_kernel(const __grid_constant__ mla_strided_desc dst,
                                    const __grid_constant__ mla_strided_desc src, int64_t n, int sat, int up) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    double v = mla::load_double(src.dtype, src.base, elem_of(src, i));
    mla::store_double(dst.dtype, dst.base, elem_of(dst, i), v, sat, up);
  }
}

// e2m1 destinations: each thread owns one destination byte (two consecutive
// elements of a contiguous, even-aligned innermost dim), so no two threads
// write the same byte.
__global__ void copy_convert_e2m1_kernel(const __grid_constant__ mla_strided_desc dst,
                                         const __grid_constant__ mla_strided_desc src, int64_t npairs) {
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < npairs; p += (int64_t)gridDim.x * blockDim.x) {
    int64_t i = 2 * p;
    uint8_t lo = mla::double_to_e2m1(mla::load_double(src.dtype, src.base, elem_of(src, i)));
    uint8_t hi = mla::double_to_e2m1(mla::load_double(src.dtype, src.base, elem_of(src, i + 1)));
    ((uint8_t *)dst.base)[elem_of(dst, i) >> 1] = (uint8_t)((lo & 15) | (hi << 4));
  }
}

__global__ void fill_kernel(const __grid_constant__ mla_strided_desc t, int64_t n, double v) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    mla::store_double(t.dtype, t.base, elem_of(t, i), v, 1, 1);
}

__global__ void fill_e2m1_kernel(const __grid_constant__ mla_strided_desc t, int64_t npairs, double v) {
  uint8_t c = mla::double_to_e2m1(v);
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < npairs; p += (int64_t)gridDim.x * blockDim.x)
    ((uint8_t *)t.base)[elem_of(t, 2 * p) >> 1] = (uint8_t)(c | (c << 4));
}

__device__ __forceinline__ double rng_value(uint64_t seed, int64_t i, int kind, double a, double b) {
  if (kind == 0) return mla_rng_uniform(seed, (uint64_t)i, a, b);
  if (kind == 1) return mla_rng_normal(seed, (uint64_t)i, a, b);
  return 0.0;
}

__global__ void random_kernel(const __grid_constant__ mla_strided_desc t, int64_t n, uint64_t seed, int kind,
                              double a, double b) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t e = elem_of(t, i);
    if (kind == 2) { // raw bits: the low bytes of the word, whatever the dtype
      uint32_t w = mla_rng_bits(seed, (uint64_t)i);
      int bytes = t.dtype == MLA_I64 || t.dtype == MLA_F64 ? 8 : t.dtype == MLA_I32 || t.dtype == MLA_F32 ? 4
                : t.dtype <= MLA_I8 || t.dtype >= MLA_E4M3 ? 1 : 2;
      unsigned char *p = (unsigned char *)t.base + e * bytes;
      uint32_t w2 = mla_philox(seed, (uint64_t)i).v[1];
      for (int k = 0; k < bytes; k++) p[k] = (unsigned char)((k < 4 ? w >> (8 * k) : w2 >> (8 * (k - 4))) & 0xFF);
    } else {
      mla::store_double(t.dtype, t.base, e, rng_value(seed, i, kind, a, b), 1, 1);
    }
  }
}

__global__ void random_e2m1_kernel(const __grid_constant__ mla_strided_desc t, int64_t npairs, uint64_t seed,
                                   int kind, double a, double b) {
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < npairs; p += (int64_t)gridDim.x * blockDim.x) {
    int64_t i = 2 * p;
    uint8_t lo, hi;
    if (kind == 2) {
      lo = (uint8_t)(mla_rng_bits(seed, (uint64_t)i) & 15), hi = (uint8_t)(mla_rng_bits(seed, (uint64_t)i + 1) & 15);
    } else {
      lo = mla::double_to_e2m1(rng_value(seed, i, kind, a, b));
      hi = mla::double_to_e2m1(rng_value(seed, i + 1, kind, a, b));
    }
    ((uint8_t *)t.base)[elem_of(t, i) >> 1] = (uint8_t)((lo & 15) | (hi << 4));
  }
}

int64_t numel(const mla_strided_desc *d) {
  int64_t n = 1;
  for (int k = 0; k < d->ndim; k++) n *= d->sizes[k];
  return n;
}

} // namespace

extern "C" cudaError_t mla_cuda_copy_rows(const mla_rows_desc *d, cudaStream_t s) {
  uintptr_t align = (uintptr_t)d->dst | (uintptr_t)d->src | (uintptr_t)d->row_bytes;
  for (int k = 0; k < d->nouter; k++) align |= (uintptr_t)d->dst_strides[k] | (uintptr_t)d->src_strides[k];
  if (align % 16 == 0) return launch_rows<uint4>(d, s);
  if (align % 8 == 0) return launch_rows<uint2>(d, s);
  if (align % 4 == 0) return launch_rows<unsigned>(d, s);
  if (align % 2 == 0) return launch_rows<unsigned short>(d, s);
  return launch_rows<unsigned char>(d, s);
}

extern "C" cudaError_t mla_cuda_copy_convert(const mla_strided_desc *dst, const mla_strided_desc *src, int sat,
                                             int up, cudaStream_t s) {
  int64_t n = numel(dst);
  if (n == 0) return cudaSuccess;
  if (dst->dtype == MLA_E2M1) copy_convert_e2m1_kernel<<<grid_for(n / 2), kThreads, 0, s>>>(*dst, *src, n / 2);
  else copy_convert_kernel<<<grid_for(n), kThreads, 0, s>>>(*dst, *src, n, sat, up);
  return cudaGetLastError();
}

extern "C" cudaError_t mla_cuda_fill(const mla_strided_desc *t, double v, cudaStream_t s) {
  int64_t n = numel(t);
  if (n == 0) return cudaSuccess;
  if (t->dtype == MLA_E2M1) fill_e2m1_kernel<<<grid_for(n / 2), kThreads, 0, s>>>(*t, n / 2, v);
  else fill_kernel<<<grid_for(n), kThreads, 0, s>>>(*t, n, v);
  return cudaGetLastError();
}

extern "C" cudaError_t mla_cuda_random(const mla_strided_desc *t, uint64_t seed, int kind, double a, double b,
                                       cudaStream_t s) {
  int64_t n = numel(t);
  if (n == 0) return cudaSuccess;
  if (t->dtype == MLA_E2M1) random_e2m1_kernel<<<grid_for(n / 2), kThreads, 0, s>>>(*t, n / 2, seed, kind, a, b);
  else random_kernel<<<grid_for(n), kThreads, 0, s>>>(*t, n, seed, kind, a, b);
  return cudaGetLastError();
}
