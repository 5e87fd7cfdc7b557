// Gather-dequant kernels: sparse (flat slot ids), dense (block table +
// cumulative lengths), whole pages (compaction). One generic kernel over a
// row source; lpt lanes per token, each lane owning chunks of 8 dims, all
// loads of a token issued before any conversion or store.
#include "kv_common.cuh"

namespace {

using namespace mla_kv;
using mla::chunk_plan;

// Row sources: locate(row) -> page and offset, or false (no load, no store).
struct SparseSrc {
  mla_kv_ivec slots;
  mla_kv_omat remap; // data NULL: none
  __device__ int64_t rows() const { return slots.n; }
  __device__ bool locate(int64_t row, int bs, int64_t num_pages, int64_t &page, int64_t &t, unsigned long long *bad,
                         bool leader) const {
    int64_t slot = ivec_at(slots, row);
    bool ok = slot >= 0;
    if (ok) {
      split_slot(slot, bs, page, t);
      if (page >= num_pages) {
        ok = false;
        if (leader) count_bad(bad);
      }
    }
    if (leader && remap.data) omat_set(remap, row, 0, ok ? row : -1);
    return ok;
  }
};

// Request r's logical position p = starts[r] + (row - cu[r]) -> block_table[r, p / bs].
__device__ __forceinline__ bool locate_dense(const mla_kv_dense &g, int64_t row, int bs, int64_t num_pages,
                                             int64_t &page, int64_t &t, unsigned long long *bad, bool leader) {
  if (row >= ivec_at(g.cu, g.cu.n - 1) || row < ivec_at(g.cu, 0)) return false; // past the last request: untouched
  int64_t r = find_segment(g.cu, row);
  int64_t p = row - ivec_at(g.cu, r) + (g.starts.n ? ivec_at(g.starts, r) : 0);
  int64_t j = p >= 0 ? p / bs : -1;
  if (j < 0 || j >= g.block_table.cols) {
    if (leader) count_bad(bad);
    return false;
  }
  page = imat_at(g.block_table, r, j);
  t = p - j * bs;
  if (page < 0 || page >= num_pages) {
    if (leader) count_bad(bad);
    return false;
  }
  return true;
}

struct DenseSrc {
  mla_kv_dense g;
  int64_t nrows;
  __device__ int64_t rows() const { return nrows; }
  __device__ bool locate(int64_t row, int bs, int64_t num_pages, int64_t &page, int64_t &t, unsigned long long *bad,
                         bool leader) const {
    return locate_dense(g, row, bs, num_pages, page, t, bad, leader);
  }
};

struct PagesSrc {
  mla_kv_ivec pages;
  int bs;
  __device__ int64_t rows() const { return pages.n * bs; }
  __device__ bool locate(int64_t row, int bs_, int64_t num_pages, int64_t &page, int64_t &t, unsigned long long *bad,
                         bool leader) const {
    int64_t j = row / bs_;
    page = ivec_at(pages, j);
    t = row - j * bs_;
    if (page < 0 || page >= num_pages) {
      if (leader) count_bad(bad);
      return false;
    }
    return true;
  }
};

template <int ITERS, class Src>
__global__ void __launch_bounds__(kThreads) gather_kernel(const __grid_constant__ mla_layout_desc d,
                                                          const __grid_constant__ mla_cache_view v, const Src src,
                                                          const mla_kv_rows out, int lpt, unsigned long long *bad) {
  extern __shared__ chunk_plan plan[];
  const int nchunks = (int)(out.cols / 8);
  mla::plan_chunks(d, plan, nchunks);
  __syncthreads();
  const int lane = threadIdx.x & 31, sub = lane & (lpt - 1), tpw = 32 / lpt;
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  const float ts = v.tensor_scale ? *v.tensor_scale : 1.0f;
  const int64_t nrows = src.rows();
  for (int64_t row = warp * tpw + lane / lpt; row < nrows; row += nwarps * tpw) {
    int64_t page, t;
    if (!src.locate(row, d.block_size, v.num_pages, page, t, bad, sub == 0)) continue;
    const unsigned char *pg = v.base + page * v.page_stride;
    uint4 raw[ITERS];
    uint32_t sb[ITERS];
#pragma unroll
    for (int i = 0; i < ITERS; i++) {
      int c = sub + i * lpt;
      sb[i] = 0;
      raw[i] = make_uint4(0, 0, 0, 0);
      if (c < nchunks) {
        const chunk_plan &P = plan[c];
        raw[i] = mla::load_chunk_raw(P.dtype, mla::chunk_ptr(pg, P.data_base, P.data_row, t, v.token_stride));
        if (P.scale_kind == MLA_SCALE_GROUP)
          sb[i] = mla::load_scale_raw(P.scale_dtype, mla::chunk_ptr(pg, P.scale_base, P.scale_row, t, v.token_stride));
      }
    }
    unsigned char *orow = (unsigned char *)out.data + row * out.stride * 2;
#pragma unroll
    for (int i = 0; i < ITERS; i++) {
      int c = sub + i * lpt;
      if (c < nchunks) {
        const chunk_plan &P = plan[c];
        float x[8];
        mla::dequant_chunk(P, raw[i], sb[i], mla::chunk_ptr(pg, P.data_base, P.data_row, t, v.token_stride), ts, x);
        mla::store16(orow + (int64_t)c * 16, mla::pack_bf16x8(x));
      }
    }
  }
}

template <class Src>
cudaError_t launch_gather(const mla_kv_cache *c, const Src &src, int64_t rows, const mla_kv_rows *out,
                          unsigned long long *bad, cudaStream_t s) {
  if (rows == 0 || out->cols == 0) return cudaSuccess;
  int nchunks = (int)(out->cols / 8);
  int lpt = lanes_per_token(nchunks), iters = iters_for(nchunks, lpt);
  size_t smem = (size_t)nchunks * sizeof(chunk_plan);
  int64_t rows_per_block = (int64_t)(kThreads / 32) * (32 / lpt);
  int64_t work = (rows + rows_per_block - 1) / rows_per_block;
  MLA_KV_DISPATCH_ITERS(iters, {
    auto k = gather_kernel<ITERS, Src>;
    k<<<grid_for(k, smem, work), kThreads, smem, s>>>(c->desc, c->view, src, *out, lpt, bad);
  })
  return cudaGetLastError();
}

// Raw region rows (the indexer's fp8 keys and scales as stored).
struct RawOut {
  unsigned char *p[MLA_LAYOUT_MAX_REGIONS];
  int64_t stride[MLA_LAYOUT_MAX_REGIONS];
};

__device__ __forceinline__ void copy_bytes_warp(unsigned char *dst, const unsigned char *src, int64_t n, int lane) {
  uintptr_t a = (uintptr_t)dst | (uintptr_t)src | (uintptr_t)n;
  if ((a & 15) == 0) {
    for (int64_t i = lane; i < n / 16; i += 32)
      reinterpret_cast<uint4 *>(dst)[i] = __ldg(reinterpret_cast<const uint4 *>(src) + i);
  } else if ((a & 3) == 0) {
    for (int64_t i = lane; i < n / 4; i += 32)
      reinterpret_cast<uint32_t *>(dst)[i] = __ldg(reinterpret_cast<const uint32_t *>(src) + i);
  } else {
    for (int64_t i = lane; i < n; i += 32) dst[i] = src[i];
  }
}

__global__ void __launch_bounds__(kThreads) gather_raw_kernel(const __grid_constant__ mla_layout_desc d,
                                                              const __grid_constant__ mla_cache_view v,
                                                              const mla_kv_dense g, const RawOut out, int64_t nrows,
                                                              unsigned long long *bad) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  for (int64_t row = warp; row < nrows; row += nwarps) {
    int64_t page, t;
    if (!locate_dense(g, row, d.block_size, v.num_pages, page, t, bad, lane == 0)) continue;
    const unsigned char *pg = v.base + page * v.page_stride;
    for (int r = 0; r < d.nregions; r++) {
      int64_t rb = d.region_row_bytes[r];
      const unsigned char *srow = mla::chunk_ptr(pg, d.region_off[r], r == 0 ? 0 : (int32_t)rb, t, v.token_stride);
      copy_bytes_warp(out.p[r] + row * out.stride[r], srow, rb, lane);
    }
  }
}

} // namespace

extern "C" cudaError_t mla_cuda_kv_gather_sparse(const mla_kv_cache *c, const mla_kv_ivec *slots,
                                                 const mla_kv_rows *out, const mla_kv_omat *remap,
                                                 unsigned long long *bad, cudaStream_t s) {
  SparseSrc src{*slots, {}};
  if (remap) src.remap = *remap;
  return launch_gather(c, src, slots->n, out, bad, s);
}

extern "C" cudaError_t mla_cuda_kv_gather_dense(const mla_kv_cache *c, const mla_kv_dense *g, const mla_kv_rows *out,
                                                unsigned long long *bad, cudaStream_t s) {
  if (g->cu.n < 2) return cudaSuccess;
  return launch_gather(c, DenseSrc{*g, out->rows}, out->rows, out, bad, s);
}

extern "C" cudaError_t mla_cuda_kv_gather_pages(const mla_kv_cache *c, const mla_kv_ivec *pages,
                                                const mla_kv_rows *out, unsigned long long *bad, cudaStream_t s) {
  return launch_gather(c, PagesSrc{*pages, c->desc.block_size}, pages->n * c->desc.block_size, out, bad, s);
}

extern "C" cudaError_t mla_cuda_kv_gather_raw(const mla_kv_cache *c, const mla_kv_dense *g, unsigned char *const *out,
                                              const int64_t *out_stride, int64_t rows, unsigned long long *bad,
                                              cudaStream_t s) {
  if (rows == 0 || g->cu.n < 2) return cudaSuccess;
  RawOut o = {};
  for (int r = 0; r < c->desc.nregions; r++) o.p[r] = out[r], o.stride[r] = out_stride[r];
  int64_t work = (rows + kThreads / 32 - 1) / (kThreads / 32);
  gather_raw_kernel<<<grid_for(gather_raw_kernel, 0, work), kThreads, 0, s>>>(c->desc, c->view, *g, o, rows, bad);
  return cudaGetLastError();
}
