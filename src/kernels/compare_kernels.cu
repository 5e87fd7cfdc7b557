// Tensor comparison on the GPU: one block per chunk, lanes reduced by the
// fixed tree of compare_kernels.h, so the CPU path returns the same bits.
#include "compare_kernels.h"

#include "mla/convert.cuh"

namespace {

__device__ __forceinline__ int64_t elem_at(const mla_strided_desc &d, int contig, int64_t i) {
  if (contig) return d.offset + i;
  int64_t e = d.offset;
  for (int k = d.ndim - 1; k >= 0; k--) {
    int64_t sz = d.sizes[k];
    e += (i % sz) * d.strides[k];
    i /= sz;
  }
  return e;
}

// Raw bits of one element (a nibble for e2m1), so NaN payloads and -0 count.
__device__ __forceinline__ uint64_t bits_at(int dtype, const void *base, int64_t e) {
  const unsigned char *p = (const unsigned char *)base;
  switch (dtype) {
  case MLA_I64: case MLA_F64: return ((const unsigned long long *)p)[e];
  case MLA_I32: case MLA_F32: return ((const unsigned *)p)[e];
  case MLA_U16: case MLA_I16: case MLA_F16: case MLA_BF16: return ((const unsigned short *)p)[e];
  case MLA_E2M1: return (p[e >> 1] >> ((e & 1) * 4)) & 15;
  default: return p[e];
  }
}

struct pair_reader {
  mla_strided_desc a, b;
  int ac, bc;
  __device__ __forceinline__ void read(int64_t i, double &va, double &vb, uint64_t &ba, uint64_t &bb) const {
    int64_t ea = elem_at(a, ac, i), eb = elem_at(b, bc, i);
    va = mla::load_double(a.dtype, a.base, ea);
    vb = mla::load_double(b.dtype, b.base, eb);
    ba = bits_at(a.dtype, a.base, ea);
    bb = bits_at(b.dtype, b.base, eb);
  }
};

__global__ void __launch_bounds__(MLA_CMP_LANES)
    compare_chunks_kernel(const __grid_constant__ pair_reader r, const mla_cmp_params p, int64_t n, int64_t nchunks,
                          mla_cmp_partial *out) {
  __shared__ mla_cmp_partial lanes[MLA_CMP_LANES];
  const int t = threadIdx.x;
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    mla_cmp_partial s;
    mla_cmp_init(&s);
    const int64_t base = c * (int64_t)MLA_CMP_CHUNK;
    for (int j = 0; j < MLA_CMP_PER_LANE; j++) {
      int64_t i = base + (int64_t)j * MLA_CMP_LANES + t;
      if (i >= n) break;
      double va, vb;
      uint64_t ba, bb;
      r.read(i, va, vb, ba, bb);
      mla_cmp_elem(&p, &s, va, vb, ba, bb, i);
    }
    lanes[t] = s;
    __syncthreads();
    for (int st = MLA_CMP_LANES / 2; st > 0; st >>= 1) {
      if (t < st) mla_cmp_merge(&lanes[t], &lanes[t + st]);
      __syncthreads();
    }
    if (t == 0) out[c] = lanes[0];
    __syncthreads();
  }
}

__global__ void compare_collect_kernel(const __grid_constant__ pair_reader r, const mla_cmp_params p, int64_t n,
                                       const int64_t *chunks, int nchunks, int k, int64_t *out) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= nchunks) return;
  int found = 0;
  const int64_t lo = chunks[c] * (int64_t)MLA_CMP_CHUNK;
  const int64_t hi = lo + MLA_CMP_CHUNK < n ? lo + MLA_CMP_CHUNK : n;
  for (int64_t i = lo; i < hi && found < k; i++) {
    double va, vb;
    uint64_t ba, bb;
    r.read(i, va, vb, ba, bb);
    mla_cmp_partial s;
    mla_cmp_init(&s);
    mla_cmp_elem(&p, &s, va, vb, ba, bb, i);
    if (s.bad) out[(int64_t)c * k + found++] = i;
  }
  for (int j = found; j < k; j++) out[(int64_t)c * k + j] = -1;
}

__global__ void compare_probe_kernel(const __grid_constant__ pair_reader r, const int64_t *idx, int n, double *va,
                                     double *vb, uint64_t *ba, uint64_t *bb) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < n) r.read(idx[j], va[j], vb[j], ba[j], bb[j]);
}

pair_reader make_reader(const mla_strided_desc *a, int ac, const mla_strided_desc *b, int bc) {
  pair_reader r;
  r.a = *a, r.b = *b, r.ac = ac, r.bc = bc;
  return r;
}

} // namespace

extern "C" cudaError_t mla_cuda_compare_chunks(const mla_strided_desc *a, int a_contig, const mla_strided_desc *b,
                                               int b_contig, const mla_cmp_params *p, int64_t n,
                                               mla_cmp_partial *out, int sm_count, cudaStream_t s) {
  int64_t nchunks = (n + MLA_CMP_CHUNK - 1) / MLA_CMP_CHUNK;
  if (nchunks == 0) return cudaSuccess;
  int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 132) * 8; // 8 resident blocks of 256 per SM
  int grid = (int)(nchunks < cap ? nchunks : cap);
  compare_chunks_kernel<<<grid, MLA_CMP_LANES, 0, s>>>(make_reader(a, a_contig, b, b_contig), *p, n, nchunks, out);
  return cudaGetLastError();
}

extern "C" cudaError_t mla_cuda_compare_collect(const mla_strided_desc *a, int a_contig, const mla_strided_desc *b,
                                                int b_contig, const mla_cmp_params *p, int64_t n,
                                                const int64_t *chunks, int nchunks, int k, int64_t *out,
                                                cudaStream_t s) {
  if (nchunks <= 0) return cudaSuccess;
  compare_collect_kernel<<<(nchunks + 63) / 64, 64, 0, s>>>(make_reader(a, a_contig, b, b_contig), *p, n, chunks,
                                                          nchunks, k, out);
  return cudaGetLastError();
}

extern "C" cudaError_t mla_cuda_compare_probe(const mla_strided_desc *a, int a_contig, const mla_strided_desc *b,
                                              int b_contig, const int64_t *idx, int n, double *va, double *vb,
                                              uint64_t *ba, uint64_t *bb, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  compare_probe_kernel<<<(n + 63) / 64, 64, 0, s>>>(make_reader(a, a_contig, b, b_contig), idx, n, va, vb, ba, bb);
  return cudaGetLastError();
}
