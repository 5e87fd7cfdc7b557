// Index kernels: top-k transforms (PAGED, RAGGED) and the compaction of
// referenced pages (mark, rank, list, remap).
#include "kv_common.cuh"

namespace {

using namespace mla_kv;

constexpr int kTopkBatch = 4; // entries per lane loaded before any is used
constexpr int kVecBatch = 4;  // 16-byte loads per lane in flight on the vector path

// Request of query token t, -1 for a padding token past cu_q[B].
__device__ __forceinline__ int64_t request_of(const mla_kv_token_req &q, int64_t t) {
  if (q.token_req.n) return ivec_at(q.token_req, t);
  if (q.cu_q.n) {
    if (t < ivec_at(q.cu_q, 0) || t >= ivec_at(q.cu_q, q.cu_q.n - 1)) return -1;
    return find_segment(q.cu_q, t);
  }
  return t;
}

// A map runs in two steps so that a lane issues the loads of all its entries
// before it uses any: fetch(r, idx) -> the looked-up value (a block-table
// entry; -2 for a column past the table), finish(r, idx, fetched, out) -> ok.
struct PagedMap {
  mla_kv_imat bt;
  int64_t bs;
  int64_t out_max;
  int shift; // log2(bs) when bs is a power of two, else -1
  __device__ int64_t nreq() const { return bt.rows; }
  __device__ void split(int64_t idx, int64_t &j, int64_t &off) const {
    if (shift >= 0) j = idx >> shift, off = idx & (bs - 1);
    else split_slot(idx, (int)bs, j, off);
  }
  __device__ int64_t fetch(int64_t r, int64_t idx) const {
    int64_t j, off;
    split(idx, j, off);
    return j < bt.cols ? imat_at(bt, r, j) : -2;
  }
  __device__ bool finish(int64_t r, int64_t idx, int64_t page, int64_t &out) const {
    if (page < 0) return false;
    int64_t j, off;
    split(idx, j, off);
    out = page * bs + off;
    return out <= out_max;
  }
};

struct RaggedMap {
  mla_kv_ivec cu_k;
  int64_t out_max;
  __device__ int64_t nreq() const { return cu_k.n - 1; }
  __device__ int64_t fetch(int64_t r, int64_t) const { return ivec_at(cu_k, r); }
  __device__ bool finish(int64_t, int64_t idx, int64_t off, int64_t &out) const {
    out = idx + off;
    return out <= out_max;
  }
};

// One warp per query token row; TI / TO: the index types of topk and out.
template <class Map, typename TI, typename TO>
__global__ void __launch_bounds__(kThreads) topk_kernel(const mla_kv_imat topk, const mla_kv_token_req req, const Map m,
                                                        const mla_kv_omat out, const mla_kv_omat lens,
                                                        unsigned long long *bad) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  const int64_t K = topk.cols;
  const TI *in = (const TI *)topk.data;
  TO *o = (TO *)out.data;
  // 16-byte loads and stores when both are contiguous 32-bit rows on 16-byte boundaries
  const bool vec = sizeof(TI) == 4 && sizeof(TO) == 4 && topk.cs == 1 && out.cs == 1 && topk.rs % 4 == 0 &&
                   out.rs % 4 == 0 && ((uintptr_t)in & 15) == 0 && ((uintptr_t)o & 15) == 0;
  for (int64_t t = warp; t < topk.rows; t += nwarps) {
    int64_t r = request_of(req, t);
    bool pad = r < 0 && !req.token_req.n; // past cu_q[B]: a padding token
    bool rok = r >= 0 && r < m.nreq();
    if (!rok && !pad && lane == 0) count_bad(bad);
    const TI *row = in + t * topk.rs;
    TO *orow = o + t * out.rs;
    int nvalid = 0;
    int64_t kv = 0; // entries done by the 16-byte path
    if (vec) {
      for (; kv + 128 * kVecBatch <= K; kv += 128 * kVecBatch) {
        int4 q[kVecBatch];
#pragma unroll
        for (int j = 0; j < kVecBatch; j++) q[j] = __ldg(reinterpret_cast<const int4 *>(row + kv) + lane + 32 * j);
        int e[4 * kVecBatch];
        int64_t f[4 * kVecBatch];
#pragma unroll
        for (int j = 0; j < kVecBatch; j++) e[4 * j] = q[j].x, e[4 * j + 1] = q[j].y, e[4 * j + 2] = q[j].z, e[4 * j + 3] = q[j].w;
#pragma unroll
        for (int i = 0; i < 4 * kVecBatch; i++) f[i] = e[i] >= 0 && rok ? m.fetch(r, e[i]) : -1; // all lookups in flight
        int nbad = 0;
#pragma unroll
        for (int i = 0; i < 4 * kVecBatch; i++) {
          int64_t v = -1;
          if (e[i] >= 0 && rok) {
            nvalid++;
            if (!m.finish(r, e[i], f[i], v)) v = -1, nbad++;
          }
          e[i] = (int)v;
        }
        if (nbad) atomicAdd(bad, (unsigned long long)nbad);
#pragma unroll
        for (int j = 0; j < kVecBatch; j++)
          reinterpret_cast<int4 *>(orow + kv)[lane + 32 * j] = make_int4(e[4 * j], e[4 * j + 1], e[4 * j + 2], e[4 * j + 3]);
      }
    }
    for (int64_t k0 = kv; k0 < K; k0 += 32 * kTopkBatch) {
      TI idx[kTopkBatch];
#pragma unroll
      for (int j = 0; j < kTopkBatch; j++) {
        int64_t k = k0 + lane + 32 * j;
        idx[j] = k < K ? __ldg(row + k * topk.cs) : (TI)-1;
      }
      int64_t f[kTopkBatch];
#pragma unroll
      for (int j = 0; j < kTopkBatch; j++) f[j] = idx[j] >= 0 && rok ? m.fetch(r, (int64_t)idx[j]) : -1;
#pragma unroll
      for (int j = 0; j < kTopkBatch; j++) {
        int64_t k = k0 + lane + 32 * j;
        if (k >= K) continue;
        int64_t v = -1;
        if (idx[j] >= 0 && rok) {
          nvalid++;
          if (!m.finish(r, (int64_t)idx[j], f[j], v)) {
            v = -1;
            count_bad(bad);
          }
        }
        orow[k * out.cs] = (TO)v;
      }
    }
    if (lens.data) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) nvalid += __shfl_xor_sync(0xffffffffu, nvalid, off);
      if (lane == 0) omat_set(lens, t, 0, nvalid);
    }
  }
}

template <class Map, typename TI, typename TO>
void launch_topk_typed(const mla_kv_imat *topk, const mla_kv_token_req *req, const Map &m, const mla_kv_omat *out,
                       const mla_kv_omat &lens, unsigned long long *bad, cudaStream_t s) {
  int64_t work = (topk->rows + kThreads / 32 - 1) / (kThreads / 32);
  auto k = topk_kernel<Map, TI, TO>;
  k<<<grid_for(k, 0, work), kThreads, 0, s>>>(*topk, *req, m, *out, lens, bad);
}

template <class Map>
cudaError_t launch_topk(const mla_kv_imat *topk, const mla_kv_token_req *req, const Map &m, const mla_kv_omat *out,
                        const mla_kv_omat *lens, unsigned long long *bad, cudaStream_t s) {
  if (topk->rows == 0) return cudaSuccess;
  mla_kv_omat l = lens ? *lens : mla_kv_omat{};
  if (topk->is64 && out->is64) launch_topk_typed<Map, long long, long long>(topk, req, m, out, l, bad, s);
  else if (topk->is64) launch_topk_typed<Map, long long, int>(topk, req, m, out, l, bad, s);
  else if (out->is64) launch_topk_typed<Map, int, long long>(topk, req, m, out, l, bad, s);
  else launch_topk_typed<Map, int, int>(topk, req, m, out, l, bad, s);
  return cudaGetLastError();
}

int64_t out_max(const mla_kv_omat *out) { return out->is64 ? INT64_MAX : INT32_MAX; }

// ---- compaction ----

__global__ void mark_kernel(const mla_kv_imat idx, int64_t bs, int64_t num_pages, int32_t *flags,
                            unsigned long long *bad) {
  int64_t n = idx.rows * idx.cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / idx.cols, c = i - r * idx.cols;
    int64_t v = imat_at(idx, r, c);
    if (v < 0) continue;
    int64_t page = v / bs;
    if (page >= num_pages) count_bad(bad);
    else flags[page] = 1;
  }
}

constexpr int kScanThreads = 1024;

// Exclusive prefix sum of flags by one block: each thread sums a contiguous
// run, the block scans the run totals, each thread then writes its run.
__global__ void __launch_bounds__(kScanThreads) rank_kernel(const int32_t *flags, int64_t n, int32_t *rank,
                                                            int64_t *count) {
  __shared__ int64_t part[kScanThreads];
  int64_t per = (n + kScanThreads - 1) / kScanThreads;
  int64_t lo = threadIdx.x * per, hi = lo + per < n ? lo + per : n;
  int64_t sum = 0;
  for (int64_t i = lo; i < hi; i++) sum += flags[i];
  part[threadIdx.x] = sum;
  __syncthreads();
  for (int off = 1; off < kScanThreads; off <<= 1) { // Hillis-Steele inclusive scan
    int64_t v = threadIdx.x >= off ? part[threadIdx.x - off] : 0;
    __syncthreads();
    part[threadIdx.x] += v;
    __syncthreads();
  }
  int64_t run = part[threadIdx.x] - sum;
  for (int64_t i = lo; i < hi; i++) {
    rank[i] = (int32_t)run;
    run += flags[i];
  }
  if (threadIdx.x == kScanThreads - 1) *count = part[threadIdx.x];
}

__global__ void list_kernel(const int32_t *flags, const int32_t *rank, int64_t n, int64_t *pages) {
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < n; p += (int64_t)gridDim.x * blockDim.x)
    if (flags[p]) pages[rank[p]] = p;
}

__global__ void remap_kernel(const mla_kv_imat idx, const int32_t *rank, int64_t bs, int64_t num_pages,
                             const mla_kv_omat out) {
  int64_t n = idx.rows * idx.cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / idx.cols, c = i - r * idx.cols;
    int64_t v = imat_at(idx, r, c), o = -1;
    if (v >= 0) {
      int64_t page = v / bs;
      if (page < num_pages) o = (int64_t)rank[page] * bs + (v - page * bs);
    }
    omat_set(out, r, c, o);
  }
}

int elementwise_grid(int64_t n) {
  int64_t g = (n + kThreads - 1) / kThreads;
  if (g > 132 * 16) g = 132 * 16;
  return g < 1 ? 1 : (int)g;
}

} // namespace

extern "C" cudaError_t mla_cuda_kv_topk_paged(const mla_kv_imat *topk, const mla_kv_token_req *req,
                                              const mla_kv_imat *block_table, int64_t block_size,
                                              const mla_kv_omat *out, const mla_kv_omat *lens,
                                              unsigned long long *bad, cudaStream_t s) {
  int shift = -1;
  for (int k = 0; k < 31; k++)
    if ((int64_t)1 << k == block_size) shift = k;
  return launch_topk(topk, req, PagedMap{*block_table, block_size, out_max(out), shift}, out, lens, bad, s);
}

extern "C" cudaError_t mla_cuda_kv_topk_ragged(const mla_kv_imat *topk, const mla_kv_token_req *req,
                                               const mla_kv_ivec *cu_k, const mla_kv_omat *out,
                                               const mla_kv_omat *lens, unsigned long long *bad, cudaStream_t s) {
  return launch_topk(topk, req, RaggedMap{*cu_k, out_max(out)}, out, lens, bad, s);
}

extern "C" cudaError_t mla_cuda_kv_mark_pages(const mla_kv_imat *idx, int64_t block_size, int64_t num_pages,
                                              int32_t *flags, unsigned long long *bad, cudaStream_t s) {
  cudaError_t e = cudaMemsetAsync(flags, 0, (size_t)num_pages * sizeof(int32_t), s);
  if (e != cudaSuccess) return e;
  int64_t n = idx->rows * idx->cols;
  if (n == 0) return cudaSuccess;
  mark_kernel<<<elementwise_grid(n), kThreads, 0, s>>>(*idx, block_size, num_pages, flags, bad);
  return cudaGetLastError();
}

extern "C" cudaError_t mla_cuda_kv_rank_pages(const int32_t *flags, int64_t num_pages, int32_t *rank, int64_t *count,
                                              cudaStream_t s) {
  rank_kernel<<<1, kScanThreads, 0, s>>>(flags, num_pages, rank, count);
  return cudaGetLastError();
}

extern "C" cudaError_t mla_cuda_kv_list_pages(const int32_t *flags, const int32_t *rank, int64_t num_pages,
                                              int64_t *pages, cudaStream_t s) {
  if (num_pages == 0) return cudaSuccess;
  list_kernel<<<elementwise_grid(num_pages), kThreads, 0, s>>>(flags, rank, num_pages, pages);
  return cudaGetLastError();
}

extern "C" cudaError_t mla_cuda_kv_remap_compact(const mla_kv_imat *idx, const int32_t *rank, int64_t block_size,
                                                 int64_t num_pages, const mla_kv_omat *out, cudaStream_t s) {
  int64_t n = idx->rows * idx->cols;
  if (n == 0) return cudaSuccess;
  remap_kernel<<<elementwise_grid(n), kThreads, 0, s>>>(*idx, rank, block_size, num_pages, *out);
  return cudaGetLastError();
}
