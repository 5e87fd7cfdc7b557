// Index kernels: top-k transforms (PAGED, RAGGED) and the compaction of
// referenced pages (mark, rank, list, remap).
#include <cub/block/block_scan.cuh>
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
  int64_t page_max; // the largest page whose slots page * bs + off stay below INT64_MAX (an i64 table's page may not)
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
    if (page < 0 || page > page_max) return false;
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
    return off <= out_max - idx; // idx >= 0: out <= out_max without the sum's int64 overflow
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

// ---- the common case: 32-bit topk and out, contiguous 16-byte-aligned rows ----
//
// A warp owns a contiguous share of the (row, chunk) items (of whole rows when
// lens is written), chunks of 128 * C entries (C 16-byte loads per lane). The
// loads of the next chunk are issued before the current chunk is mapped, the
// request of a row comes from the cached cu_q bounds of the previous row (a
// binary search only when a row leaves them), and every entry is mapped with
// 32-bit arithmetic: RAGGED adds the row's cu_k offset (one load per row),
// PAGED reads the request's block-table row staged in shared memory (per warp,
// restaged when the request changes; a 32-bit table by cp.async as stored,
// all of a row's copies in flight at once) as page * bs or -1 (a bad page).
// MLALAB_KV_TOPK=0 runs the generic kernel, 2 / 4 pick C (tuning).
// H100, 16384 x top-2048 (256 MiB), % of memcpy: ragged C=4 92.7%, C=2 86.3%,
// generic 88.6%; paged C=4 78.5% with the table staged by a load-store loop
// (one latency per 32 columns), 90.7% by cp.async; generic 76.8%.
constexpr int kTopkSpecThreads = 128;
constexpr int kTopkSpecMaxCols = 4096; // block-table columns a warp stages (16 KiB)

template <bool Paged, int C>
__global__ void __launch_bounds__(kTopkSpecThreads, C == 2 ? 8 : 6)
    topk32_kernel(const mla_kv_imat topk, const mla_kv_token_req req, const mla_kv_imat bt, const int shift,
                  const mla_kv_ivec cu_k, const mla_kv_omat out, const mla_kv_omat lens, unsigned long long *bad) {
  extern __shared__ int topk_tab[];
  constexpr int W = kTopkSpecThreads / 32;
  constexpr int CE = 128 * C; // entries per chunk
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
  const int64_t warp = (int64_t)blockIdx.x * W + wib, nwarps = (int64_t)gridDim.x * W;
  const int K = (int)topk.cols;
  const int NC = (K + CE - 1) / CE;
  const int64_t nreq = Paged ? bt.rows : cu_k.n - 1;
  int *tab = topk_tab + (Paged ? wib * (int)bt.cols : 0);
  const unsigned cols = Paged ? (unsigned)bt.cols : 0u;
  const int mask = Paged ? (1 << shift) - 1 : 0;
  // a 32-bit table with unit column stride is copied as stored (cp.async, 16-byte
  // copies when its rows allow) and checked at lookup; a 64-bit one is
  // converted while staged
  const int pmax = INT32_MAX >> shift;
  const bool raw_tab = Paged && !bt.is64 && bt.cs == 1;
  const bool vec_tab = raw_tab && cols % 4 == 0 && bt.rs % 4 == 0 && ((uintptr_t)bt.data & 15) == 0;
  int64_t lo, hi;
  if (lens.data) share_of(topk.rows, warp, nwarps, lo, hi), lo *= NC, hi *= NC;
  else share_of(topk.rows * NC, warp, nwarps, lo, hi);
  if (lo >= hi) return;
  const int *in = (const int *)topk.data;
  int *o = (int *)out.data;
  auto load = [&](int64_t tr, int cc, int4 (&q)[C]) {
    const int4 *p = reinterpret_cast<const int4 *>(in + tr * topk.rs + cc * CE);
    const int n4 = (K - cc * CE) >> 2;
#pragma unroll
    for (int j = 0; j < C; j++) q[j] = lane + 32 * j < n4 ? __ldg(p + lane + 32 * j) : make_int4(-1, -1, -1, -1);
  };
  int64_t t = lo / NC;
  int c = (int)(lo - t * NC);
  int64_t qlo = 0, qhi = 0, rcur = -1, tab_r = -1;
  bool rok = false;
  unsigned off = 0;
  int lim = 0, nvalid = 0, nbad = 0;
  int4 cur[C];
  load(t, c, cur);
  for (int64_t i = lo; i < hi; i++) {
    int64_t tn = t;
    int cn = c + 1;
    if (cn == NC) tn++, cn = 0;
    int4 nxt[C];
    if (i + 1 < hi) load(tn, cn, nxt);
    else
#pragma unroll
      for (int j = 0; j < C; j++) nxt[j] = make_int4(-1, -1, -1, -1);
    if (c == 0 || i == lo) { // the row's request
      int64_t r = t;
      bool pad = false;
      if (req.cu_q.n) {
        if (t >= qlo && t < qhi) r = rcur;
        else if (t < ivec_at(req.cu_q, 0) || t >= ivec_at(req.cu_q, req.cu_q.n - 1)) r = -1, pad = true;
        else r = find_segment(req.cu_q, t), qlo = ivec_at(req.cu_q, r), qhi = ivec_at(req.cu_q, r + 1), rcur = r;
      }
      rok = r >= 0 && r < nreq;
      if (!rok && !pad && c == 0 && lane == 0) nbad++;
      if (rok) {
        if constexpr (Paged) {
          if (r != tab_r) {
            __syncwarp();
            if (raw_tab) { // page ids as stored, all copies in flight at once (one latency)
              const int *src = (const int *)bt.data + r * bt.rs;
              const uint32_t dst = mla::smem_addr(tab);
              if (vec_tab)
                for (int j = lane; j < (int)cols / 4; j += 32) mla::cp_async16(dst + 16 * j, src + 4 * j, 16);
              else
                for (int j = lane; j < (int)cols; j += 32) mla::cp_async4(dst + 4 * j, src + j, 4);
              mla::cp_async_commit();
              mla::cp_async_wait<0>();
            } else {
              for (int j = lane; j < (int)cols; j += 32) {
                const int64_t pg = imat_at(bt, r, j);
                tab[j] = pg >= 0 && pg <= (int64_t)pmax ? (int)(pg << shift) : -1;
              }
            }
            __syncwarp();
            tab_r = r;
          }
        } else {
          const int64_t k0 = ivec_at(cu_k, r), l = (int64_t)INT32_MAX - k0;
          off = (unsigned)k0;
          lim = l >= INT32_MAX ? INT32_MAX : l < 0 ? -1 : (int)l;
        }
      }
      if (c == 0) nvalid = 0;
    }
    int4 (&res)[C] = cur; // mapped in place
    if (rok) {
#pragma unroll
      for (int j = 0; j < C; j++) {
        int e[4] = {cur[j].x, cur[j].y, cur[j].z, cur[j].w};
#pragma unroll
        for (int u = 0; u < 4; u++) {
          int v = -1;
          if (e[u] >= 0) {
            nvalid++;
            if constexpr (Paged) {
              const unsigned jj = (unsigned)e[u] >> shift;
              int p = jj < cols ? tab[jj] : -1;
              if (raw_tab) p = (unsigned)p <= (unsigned)pmax ? p << shift : -1;
              if (p < 0) nbad++;
              else v = p | (e[u] & mask);
            } else {
              if (e[u] > lim) nbad++;
              else v = (int)((unsigned)e[u] + off);
            }
          }
          e[u] = v;
        }
        res[j] = make_int4(e[0], e[1], e[2], e[3]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < C; j++) res[j] = make_int4(-1, -1, -1, -1);
    }
    {
      int4 *op = reinterpret_cast<int4 *>(o + t * out.rs + c * CE);
      const int n4 = (K - c * CE) >> 2;
#pragma unroll
      for (int j = 0; j < C; j++)
        if (lane + 32 * j < n4) op[lane + 32 * j] = res[j];
    }
    if (lens.data && c == NC - 1) {
      int nv = nvalid;
#pragma unroll
      for (int s = 16; s > 0; s >>= 1) nv += __shfl_xor_sync(0xffffffffu, nv, s);
      if (lane == 0) omat_set(lens, t, 0, nv);
    }
#pragma unroll
    for (int j = 0; j < C; j++) cur[j] = nxt[j];
    t = tn, c = cn;
  }
  if (nbad) atomicAdd(bad, (unsigned long long)nbad);
}

int topk_spec_choice() {
  static int v = -1;
  if (v < 0) {
    const char *e = getenv("MLALAB_KV_TOPK");
    v = e && (e[0] == '0' || e[0] == '2' || e[0] == '4') && !e[1] ? e[0] - '0' : 4;
  }
  return v;
}

// Runs the specialized kernel when it applies (true), else leaves it to the generic one.
template <bool Paged>
bool launch_topk32(const mla_kv_imat *topk, const mla_kv_token_req *req, const mla_kv_imat *bt, int shift,
                   const mla_kv_ivec *cu_k, const mla_kv_omat *out, const mla_kv_omat *lens,
                   unsigned long long *bad, cudaStream_t s) {
  const int ch = topk_spec_choice();
  if (!ch || topk->is64 || out->is64 || topk->cs != 1 || out->cs != 1 || topk->cols < 4 || topk->cols % 4 ||
      topk->cols > INT32_MAX / 2 || topk->rs % 4 || out->rs % 4 || ((uintptr_t)topk->data & 15) ||
      ((uintptr_t)out->data & 15) || req->token_req.n)
    return false;
  if (lens && lens->rows < topk->rows) return false;
  size_t smem = 0;
  if (Paged) {
    if (shift < 0 || !req->cu_q.n || bt->cols < 1 || bt->cols > kTopkSpecMaxCols) return false;
    smem = (size_t)(kTopkSpecThreads / 32) * (size_t)bt->cols * sizeof(int);
  }
  mla_kv_omat l = lens ? *lens : mla_kv_omat{};
  mla_kv_ivec ck = cu_k ? *cu_k : mla_kv_ivec{};
  mla_kv_imat b = bt ? *bt : mla_kv_imat{};
  auto k = ch == 2 ? topk32_kernel<Paged, 2> : topk32_kernel<Paged, 4>;
  if (smem > 48 * 1024) cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  int dev = 0, sms = 0, per_sm = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kTopkSpecThreads, smem);
  const int64_t ce = 128 * ch, items = topk->rows * ((topk->cols + ce - 1) / ce);
  int64_t g = (int64_t)(sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
  const int64_t need = (items + kTopkSpecThreads / 32 - 1) / (kTopkSpecThreads / 32);
  if (need < g) g = need;
  k<<<(int)(g < 1 ? 1 : g), kTopkSpecThreads, smem, s>>>(*topk, *req, b, shift, ck, *out, l, bad);
  return true;
}

// ---- compaction ----

// Element offset of flat index i of an index matrix: one multiply for one row
// or packed rows (rs = cols x cs, e.g. any contiguous tensor), else the row /
// column split (a 64-bit division).
__device__ __forceinline__ int64_t flat_offset(int64_t i, int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  if (rows == 1 || rs == cols * cs) return i * cs;
  const int64_t r = i / cols;
  return r * rs + (i - r * cols) * cs;
}
// Flat element i of an index matrix (row-major order over its shape).
__device__ __forceinline__ int64_t imat_flat(const mla_kv_imat &m, int64_t i) {
  return ld_idx(m.data, flat_offset(i, m.rows, m.cols, m.rs, m.cs), m.is64);
}
__device__ __forceinline__ void omat_flat_set(const mla_kv_omat &m, int64_t i, int64_t v) {
  st_idx(m.data, flat_offset(i, m.rows, m.cols, m.rs, m.cs), m.is64, v);
}

constexpr int kMarkSharedPages = 48 * 1024; // one byte each, within the default dynamic shared memory
constexpr int kMarkBatch = 8;               // indices per thread loaded at once

// Marks a block's share of the indices: flags[page] = 1 for each index's
// page. Random indices hit each of a few thousand pages hundreds of times,
// and scattered 4-byte stores to the same sectors queue at L2 (ncu, 147 K
// indices over 4608 pages: 11.7 us). So the block first marks in shared
// memory (one byte per page), then stores its flags page-ordered: whole lines
// per warp. seen: num_pages bytes of shared memory.
__device__ __forceinline__ void mark_block(const mla_kv_imat &idx, int64_t bs, int64_t num_pages, int32_t *flags,
                                           unsigned long long *bad, unsigned char *seen) {
  const int np = (int)num_pages;
  for (int p = threadIdx.x; p < np; p += blockDim.x) seen[p] = 0;
  __syncthreads();
  const int64_t n = idx.rows * idx.cols;
  int64_t lo, hi;
  share_of(n, blockIdx.x, gridDim.x, lo, hi);
  for (int64_t i0 = lo + threadIdx.x; i0 < hi; i0 += kMarkBatch * (int64_t)blockDim.x) {
    int64_t v[kMarkBatch]; // all loads in flight before any is used
#pragma unroll
    for (int k = 0; k < kMarkBatch; k++) {
      const int64_t i = i0 + k * (int64_t)blockDim.x;
      v[k] = i < hi ? imat_flat(idx, i) : -1;
    }
#pragma unroll
    for (int k = 0; k < kMarkBatch; k++) {
      if (v[k] < 0) continue;
      int64_t page, t;
      split_slot(v[k], (int)bs, page, t); // 32-bit division below 2^31
      if (page >= num_pages) count_bad(bad);
      else seen[page] = 1;
    }
  }
  __syncthreads();
  for (int p = threadIdx.x; p < np; p += blockDim.x)
    if (seen[p]) flags[p] = 1;
}

__global__ void mark_shared_kernel(const mla_kv_imat idx, int64_t bs, int64_t num_pages, int32_t *flags,
                                   unsigned long long *bad) {
  extern __shared__ unsigned char seen[];
  mark_block(idx, bs, num_pages, flags, bad, seen);
}

// The same without the shared-memory pass, for pools of more pages than
// shared memory holds bytes.
__global__ void mark_kernel(const mla_kv_imat idx, int64_t bs, int64_t num_pages, int32_t *flags,
                            unsigned long long *bad) {
  const int64_t n = idx.rows * idx.cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t v = imat_flat(idx, i);
    if (v < 0) continue;
    int64_t page, t;
    split_slot(v, (int)bs, page, t);
    if (page >= num_pages) count_bad(bad);
    else flags[page] = 1;
  }
}

constexpr int kScanThreads = 1024, kScanItems = 8, kScanTile = kScanThreads * kScanItems;

using BlockScanT = cub::BlockScan<int, kScanThreads>;
struct RankShared {
  typename BlockScanT::TempStorage scan;
  short listed[kScanTile]; // a tile's referenced pages (offsets in the tile), in order
};

// Exclusive prefix sum of flags by one block of kScanThreads, tile by tile
// (kScanItems consecutive flags per thread, two 16-byte accesses where the
// tile is whole; cub::BlockScan across the threads; the running total
// carried). flags and rank must be 16-byte aligned. Flags are read at L2 (other blocks
// of a fused launch wrote them) and left zero, ready for the next call.
// pages (may be NULL): the page list too, gathered per tile in shared memory
// and written out contiguously; entries past cap dropped, [count, cap) = -1
// (the capacity mode: no host sync).
__device__ __forceinline__ void rank_block(int32_t *flags, int64_t n, int32_t *rank, int64_t *count, int64_t *pages,
                                           int64_t cap, RankShared &sh) {
  static_assert(kScanItems == 8, "two int4 per thread");
  int64_t done = 0; // referenced pages before this tile
  for (int64_t base = 0; base < n; base += kScanTile) {
    const int64_t lo = base + (int64_t)threadIdx.x * kScanItems;
    int f[kScanItems], r[kScanItems], total;
    if (lo + kScanItems <= n) {
      int4 *p = reinterpret_cast<int4 *>(flags + lo);
      const int4 a = __ldcg(p), b = __ldcg(p + 1);
      f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
      p[0] = p[1] = make_int4(0, 0, 0, 0);
    } else {
#pragma unroll
      for (int k = 0; k < kScanItems; k++) {
        f[k] = lo + k < n ? __ldcg(flags + lo + k) : 0;
        if (lo + k < n) flags[lo + k] = 0;
      }
    }
    BlockScanT(sh.scan).ExclusiveSum(f, r, total);
    if (pages) {
#pragma unroll
      for (int k = 0; k < kScanItems; k++)
        if (f[k]) sh.listed[r[k]] = (short)(threadIdx.x * kScanItems + k);
    }
#pragma unroll
    for (int k = 0; k < kScanItems; k++) r[k] += (int)done;
    if (lo + kScanItems <= n) {
      int4 *q = reinterpret_cast<int4 *>(rank + lo);
      q[0] = make_int4(r[0], r[1], r[2], r[3]), q[1] = make_int4(r[4], r[5], r[6], r[7]);
    } else {
#pragma unroll
      for (int k = 0; k < kScanItems; k++)
        if (lo + k < n) rank[lo + k] = r[k];
    }
    __syncthreads();
    if (pages)
      for (int j = threadIdx.x; j < total && done + j < cap; j += kScanThreads) pages[done + j] = base + sh.listed[j];
    done += total;
    __syncthreads(); // listed and the scan storage are reused by the next tile
  }
  if (pages)
    for (int64_t j = done + threadIdx.x; j < cap; j += kScanThreads) pages[j] = -1;
  if (threadIdx.x == 0) *count = done;
}

__global__ void __launch_bounds__(kScanThreads) rank_kernel(int32_t *flags, int64_t n, int32_t *rank, int64_t *count,
                                                            int64_t *pages, int64_t cap) {
  __shared__ RankShared sh;
  rank_block(flags, n, rank, count, pages, cap, sh);
}

// Marking and ranking in one launch: every block marks its share, and the
// last block to finish (a ticket counter, left at 0 for the next call and for
// graph replays) ranks. Flags must be zero on entry; ranking leaves them so.
__global__ void __launch_bounds__(kScanThreads)
    mark_rank_kernel(const mla_kv_imat idx, int64_t bs, int64_t num_pages, int32_t *flags, int32_t *rank,
                     int64_t *count, int64_t *pages, int64_t cap, unsigned int *ticket, unsigned long long *bad) {
  extern __shared__ unsigned char seen[];
  __shared__ RankShared sh;
  __shared__ bool last;
  mark_block(idx, bs, num_pages, flags, bad, seen);
  __threadfence(); // this block's flags visible before its ticket
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  rank_block(flags, num_pages, rank, count, pages, cap, sh);
  if (threadIdx.x == 0) *ticket = 0;
}

__global__ void remap_kernel(const mla_kv_imat idx, const int32_t *rank, int64_t bs, int64_t num_pages,
                             int64_t cap, const mla_kv_omat out) {
  const int64_t n = idx.rows * idx.cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t v = imat_flat(idx, i);
    int64_t o = -1;
    if (v >= 0) {
      int64_t page, t;
      split_slot(v, (int)bs, page, t);
      if (page < num_pages && rank[page] < cap) o = (int64_t)rank[page] * bs + t;
    }
    omat_flat_set(out, i, o);
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
  if (topk->rows == 0) return cudaSuccess;
  if (launch_topk32<true>(topk, req, block_table, shift, nullptr, out, lens, bad, s)) return cudaGetLastError();
  return launch_topk(topk, req, PagedMap{*block_table, block_size, out_max(out), (INT64_MAX - block_size) / block_size, shift}, out, lens, bad, s);
}

extern "C" cudaError_t mla_cuda_kv_topk_ragged(const mla_kv_imat *topk, const mla_kv_token_req *req,
                                               const mla_kv_ivec *cu_k, const mla_kv_omat *out,
                                               const mla_kv_omat *lens, unsigned long long *bad, cudaStream_t s) {
  if (topk->rows == 0) return cudaSuccess;
  if (launch_topk32<false>(topk, req, nullptr, 0, cu_k, out, lens, bad, s)) return cudaGetLastError();
  return launch_topk(topk, req, RaggedMap{*cu_k, out_max(out)}, out, lens, bad, s);
}

extern "C" cudaError_t mla_cuda_kv_mark_pages(const mla_kv_imat *idx, int64_t block_size, int64_t num_pages,
                                              int32_t *flags, unsigned long long *bad, cudaStream_t s) {
  cudaError_t e = cudaMemsetAsync(flags, 0, (size_t)num_pages * sizeof(int32_t), s);
  if (e != cudaSuccess) return e;
  int64_t n = idx->rows * idx->cols;
  if (n == 0) return cudaSuccess;
  if (num_pages <= kMarkSharedPages) {
    // ~1024 indices per block: enough blocks to read the indices at full
    // rate, few enough that the page-ordered flag stores stay cheap
    int64_t g = (n + 1023) / 1024;
    if (g > 264) g = 264;
    mark_shared_kernel<<<(int)g, kThreads, (size_t)num_pages, s>>>(*idx, block_size, num_pages, flags, bad);
  } else {
    mark_kernel<<<elementwise_grid(n), kThreads, 0, s>>>(*idx, block_size, num_pages, flags, bad);
  }
  return cudaGetLastError();
}

extern "C" cudaError_t mla_cuda_kv_rank_pages(int32_t *flags, int64_t num_pages, int32_t *rank, int64_t *count,
                                              int64_t *pages, int64_t cap, cudaStream_t s) {
  rank_kernel<<<1, kScanThreads, 0, s>>>(flags, num_pages, rank, count, pages, cap);
  return cudaGetLastError();
}

extern "C" int mla_cuda_kv_mark_rank_pages_max(void) { return kMarkSharedPages; }

extern "C" cudaError_t mla_cuda_kv_mark_rank_pages(const mla_kv_imat *idx, int64_t block_size, int64_t num_pages,
                                                   int32_t *flags, int32_t *rank, int64_t *count, int64_t *pages,
                                                   int64_t cap, unsigned int *ticket, unsigned long long *bad,
                                                   cudaStream_t s) {
  static const cudaError_t attr = cudaFuncSetAttribute(mark_rank_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       kMarkSharedPages);
  if (attr != cudaSuccess) return attr;
  const int64_t n = idx->rows * idx->cols;
  // ~4096 indices per block (4 per thread): enough blocks to read them at
  // full rate, few enough that the page-ordered flag stores stay cheap
  int64_t g = (n + 4095) / 4096;
  g = g < 1 ? 1 : g > 132 ? 132 : g;
  mark_rank_kernel<<<(int)g, kScanThreads, (size_t)(num_pages > 0 ? num_pages : 1), s>>>(
      *idx, block_size, num_pages, flags, rank, count, pages, cap, ticket, bad);
  return cudaGetLastError();
}

extern "C" cudaError_t mla_cuda_kv_remap_compact(const mla_kv_imat *idx, const int32_t *rank, int64_t block_size,
                                                 int64_t num_pages, int64_t cap, const mla_kv_omat *out,
                                                 cudaStream_t s) {
  int64_t n = idx->rows * idx->cols;
  if (n == 0) return cudaSuccess;
  remap_kernel<<<elementwise_grid(n), kThreads, 0, s>>>(*idx, rank, block_size, num_pages, cap, *out);
  return cudaGetLastError();
}
