// Gather-dequant kernels: sparse (flat slot ids), dense (block table +
// cumulative lengths), whole pages (compaction), and the raw region bytes.
//
// Dequantizing gathers are latency-bound (an index, then a scattered token
// row), so each warp keeps S - 1 token rows in flight: it takes every nw-th
// output row (all warps sweep the rows together; MLALAB_KV_ORDER=0: a
// contiguous share each), resolves 32 rows at a time (one index load per lane,
// kept as 32-bit page index + offset so nothing spills), and streams their
// token rows into an S-stage ring in shared memory with cp.async while it
// dequantizes the oldest staged row into bf16 (lane j owns chunks j, j + 32,
// ... of 8 dims). How a chunk is rebuilt comes from a per-block plan made from
// the layout descriptor (kv_common.cuh), so any layout works; common shapes
// (bf16 copies, e4m3 / e2m1 codes with f32 / ue8m0 / e4m3 / tensor scales) get
// straight-line code. The raw gather copies 32 rows per batch through
// registers, all loads of a pass group before the stores.
#include "kv_common.cuh"

namespace {

using namespace mla_kv;

// Row sources: locate(row) -> page and offset, or false (no load, no store).
struct SparseSrc {
  mla_kv_ivec slots;
  mla_kv_omat remap; // data NULL: none
  __device__ int64_t rows() const { return slots.n; }
  __device__ bool locate(int64_t row, int bs, int64_t num_pages, int64_t &page, int64_t &t,
                         unsigned long long *bad) const {
    int64_t slot = ivec_at(slots, row);
    bool ok = slot >= 0;
    if (ok) {
      split_slot(slot, bs, page, t);
      if (page >= num_pages) {
        ok = false;
        count_bad(bad);
      }
    }
    if (remap.data) omat_set(remap, row, 0, ok ? row : -1);
    return ok;
  }
};

// Request r's logical position p = starts[r] + (row - cu[r]) -> block_table[r, p / bs].
__device__ __forceinline__ bool locate_dense(const mla_kv_dense &g, int64_t row, int bs, int64_t num_pages,
                                             int64_t &page, int64_t &t, unsigned long long *bad) {
  if (row >= ivec_at(g.cu, g.cu.n - 1) || row < ivec_at(g.cu, 0)) return false; // past the last request: untouched
  int64_t r = find_segment(g.cu, row);
  int64_t p = row - ivec_at(g.cu, r) + (g.starts.n ? ivec_at(g.starts, r) : 0);
  int64_t j = p >= 0 ? p / bs : -1;
  if (j < 0 || j >= g.block_table.cols) {
    count_bad(bad);
    return false;
  }
  page = imat_at(g.block_table, r, j);
  t = p - j * bs;
  if (page < 0 || page >= num_pages) {
    count_bad(bad);
    return false;
  }
  return true;
}

struct DenseSrc {
  mla_kv_dense g;
  int64_t nrows;
  __device__ int64_t rows() const { return nrows; }
  __device__ bool locate(int64_t row, int bs, int64_t num_pages, int64_t &page, int64_t &t,
                         unsigned long long *bad) const {
    return locate_dense(g, row, bs, num_pages, page, t, bad);
  }
};

struct PagesSrc {
  mla_kv_ivec pages;
  int bs;
  __device__ int64_t rows() const { return pages.n * bs; }
  __device__ bool locate(int64_t row, int bs_, int64_t num_pages, int64_t &page, int64_t &t,
                         unsigned long long *bad) const {
    int64_t j = row / bs_;
    page = ivec_at(pages, j);
    t = row - j * bs_;
    if (page < 0) return false; // the -1 tail of a capacity-mode list: rows untouched
    if (page >= num_pages) {
      count_bad(bad);
      return false;
    }
    return true;
  }
};

template <class Src, int S, int MB>
__global__ void __launch_bounds__(kThreads, MB) gather_kernel(const __grid_constant__ mla_layout_desc d,
                                                          const __grid_constant__ mla_cache_view v, const Src src,
                                                          const mla_kv_rows out, const __grid_constant__ stage_geom g,
                                                          int order, unsigned long long *bad) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int nchunks = (int)(out.cols / 8);
  stage_chunk *plan = reinterpret_cast<stage_chunk *>(smem);
  for (int c = threadIdx.x; c < nchunks; c += blockDim.x) plan[c] = make_stage_chunk(d, g, c);
  const int lane = threadIdx.x & 31;
  unsigned char *ring = smem + (nchunks * (int)sizeof(stage_chunk) + 15) / 16 * 16 + (threadIdx.x >> 5) * S * g.pitch;
  __syncthreads();
  const float ts = v.tensor_scale ? *v.tensor_scale : 1.0f;
  const bool ovec = ((uintptr_t)out.data & 15) == 0 && (out.stride & 7) == 0; // 16-byte output chunks
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  const warp_items R = items_of(src.rows(), warp, nwarps, order);
  for (int64_t kb = 0; kb < R.count; kb += 32) {
    const int nb = (int)(R.count - kb < 32 ? R.count - kb : 32);
    // lane j resolves the batch's row j: its page (-1: no load, no store) and offset
    // (32-bit: a page index and an offset in a page fit an int, and keep registers free)
    int pgi = -1, tt = 0;
    if (lane < nb) {
      int64_t page, t;
      if (src.locate(R.at(kb + lane), d.block_size, v.num_pages, page, t, bad)) pgi = (int)page, tt = (int)t;
    }
    auto issue = [&](int kk) {
      const int p = __shfl_sync(0xffffffffu, pgi, kk);
      const int t = __shfl_sync(0xffffffffu, tt, kk);
      if (p >= 0) stage_token(d, v, g, v.base + (int64_t)p * v.page_stride, t, ring + (kk % S) * g.pitch, lane);
    };
#pragma unroll 1
    for (int k = 0; k < S - 1; k++) {
      if (k < nb) issue(k);
      mla::cp_async_commit();
    }
#pragma unroll 1
    for (int k = 0; k < nb; k++) {
      if (k + S - 1 < nb) issue(k + S - 1); // into the stage row k - 1 used
      mla::cp_async_commit();
      cp_async_wait_stages<S>(); // row k has landed (this lane's copies) ...
      __syncwarp();              // ... and every lane's
      if (__shfl_sync(0xffffffffu, pgi, k) >= 0) {
        const unsigned char *row = ring + (k % S) * g.pitch;
        unsigned char *orow = (unsigned char *)out.data + R.at(kb + k) * out.stride * 2;
        for (int c = lane; c < nchunks; c += 32) {
          const uint4 o = stage_dequant(load_stage_chunk(plan + c), row, ts);
          if (ovec) *reinterpret_cast<uint4 *>(orow + 16 * c) = o;
          else mla::store16(orow + 16 * (int64_t)c, o);
        }
      }
      __syncwarp(); // the stage is refilled next iteration
    }
  }
  mla::cp_async_wait<0>();
}

template <class Src, int S, int MB>
void launch_gather_k(const mla_kv_cache *c, const Src &src, int64_t rows, const mla_kv_rows *out, const stage_geom &g,
                     size_t smem, unsigned long long *bad, cudaStream_t s) {
  auto k = gather_kernel<Src, S, MB>;
  if (smem > 48 * 1024) cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  const int grid = grid_for(k, smem, (rows + 16 * (kThreads / 32) - 1) / (16 * (kThreads / 32))); // >= 16 rows per warp
  k<<<grid, kThreads, smem, s>>>(c->desc, c->view, src, *out, g, work_order(), bad);
}

// MB: blocks per SM the register budget is cut for (3: 80 registers, 24 warps,
// no spills; 4: 64 registers, 32 warps). 3 measured 2-4% faster on the H100
// (bench/RESULTS.md); MLALAB_KV_GATHER_MB=4 selects the other (tuning).
template <class Src, int S>
void launch_gather_s(const mla_kv_cache *c, const Src &src, int64_t rows, const mla_kv_rows *out, const stage_geom &g,
                     size_t smem, unsigned long long *bad, cudaStream_t s) {
  static const int mb = getenv("MLALAB_KV_GATHER_MB") && atoi(getenv("MLALAB_KV_GATHER_MB")) == 4 ? 4 : 3;
  if (mb == 3) launch_gather_k<Src, S, 3>(c, src, rows, out, g, smem, bad, s);
  else launch_gather_k<Src, S, 4>(c, src, rows, out, g, smem, bad, s);
}

template <class Src>
cudaError_t launch_gather(const mla_kv_cache *c, const Src &src, int64_t rows, const mla_kv_rows *out,
                          unsigned long long *bad, cudaStream_t s) {
  if (rows == 0 || out->cols == 0) return cudaSuccess;
  const int nchunks = (int)(out->cols / 8);
  const stage_geom g = make_stage_geom(c->desc, c->view);
  const int S = stages_for(g.pitch);
  const size_t smem = (size_t)(nchunks * sizeof(stage_chunk) + 15) / 16 * 16 + (size_t)(kThreads / 32) * S * g.pitch;
  if (S == 16) launch_gather_s<Src, 16>(c, src, rows, out, g, smem, bad, s);
  else if (S == 8) launch_gather_s<Src, 8>(c, src, rows, out, g, smem, bad, s);
  else launch_gather_s<Src, 4>(c, src, rows, out, g, smem, bad, s);
  return cudaGetLastError();
}

// ---- raw region rows (the indexer's fp8 keys and scales as stored) ----

struct RawOut {
  unsigned char *p[MLA_LAYOUT_MAX_REGIONS];
  int64_t stride[MLA_LAYOUT_MAX_REGIONS];
  int gran[MLA_LAYOUT_MAX_REGIONS]; // copy width every source and destination row allows
  int upp[MLA_LAYOUT_MAX_REGIONS], ushift[MLA_LAYOUT_MAX_REGIONS]; // chunked regions (stage_geom)
};

template <int G> struct piece;
template <> struct piece<16> { using T = uint4; };
template <> struct piece<8> { using T = uint2; };
template <> struct piece<4> { using T = uint32_t; };

// Region r of the batch's rows, G bytes per lane and load: 32 / per_tok rows
// per pass, K passes loaded before any store.
template <int G>
__device__ __forceinline__ void copy_region_batch(const unsigned char *pg, int tt, int nb, const warp_items &R, int64_t kb,
                                                  int64_t roff, int64_t rs, int per_tok, unsigned char *o, int64_t os,
                                                  int lane) {
  using T = typename piece<G>::T;
  constexpr int K = 4;
  const int tpp = 32 / per_tok, sub = lane / per_tok, pc = lane - sub * per_tok;
  for (int k0 = 0; k0 < nb; k0 += tpp * K) {
    T buf[K];
    uint32_t ok = 0;
#pragma unroll
    for (int q = 0; q < K; q++) {
      const int k = k0 + q * tpp + sub;
      const unsigned char *p = shfl_ptr(pg, k & 31);
      const int t = __shfl_sync(0xffffffffu, tt, k & 31);
      if (k < nb && p) {
        buf[q] = *reinterpret_cast<const T *>(p + roff + t * rs + (int64_t)pc * G);
        ok |= 1u << q;
      }
    }
#pragma unroll
    for (int q = 0; q < K; q++)
      if (ok >> q & 1u) *reinterpret_cast<T *>(o + R.at(kb + k0 + q * tpp + sub) * os + (int64_t)pc * G) = buf[q];
  }
}

__global__ void __launch_bounds__(kThreads, 4) gather_raw_kernel(const __grid_constant__ mla_layout_desc d,
                                                              const __grid_constant__ mla_cache_view v,
                                                              const mla_kv_dense g, const __grid_constant__ RawOut out, int64_t nrows,
                                                              int order, unsigned long long *bad) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  const warp_items R = items_of(nrows, warp, nwarps, order);
  for (int64_t kb = 0; kb < R.count; kb += 32) {
    const int nb = (int)(R.count - kb < 32 ? R.count - kb : 32);
    const unsigned char *pg = nullptr;
    int tt = 0;
    if (lane < nb) {
      int64_t page, t;
      if (locate_dense(g, R.at(kb + lane), d.block_size, v.num_pages, page, t, bad)) pg = v.base + page * v.page_stride, tt = (int)t;
    }
    for (int r = 0; r < d.nregions; r++) {
      const int rb = d.region_row_bytes[r];
      const int64_t rs = r == 0 ? v.token_stride : (int64_t)rb;
      const int64_t roff = d.region_off[r];
      const int G = out.gran[r], per_tok = rb / (G > 1 ? G : 1);
      if (d.region_chunk[r] > 0) { // a chunked region, row by row: each G-byte unit from its piece, in row order
        for (int k = 0; k < nb; k++) {
          const unsigned char *p = shfl_ptr(pg, k);
          const int t = __shfl_sync(0xffffffffu, tt, k);
          if (!p) continue;
          unsigned char *orow = out.p[r] + R.at(kb + k) * out.stride[r];
          const int c = d.region_chunk[r];
          const unsigned char *srow = p + d.region_off[r] + (int64_t)t * c;
          for (int i = lane; i < per_tok; i += 32) {
            const unsigned char *src = srow + mla_piece_unit_off(i, G > 1 ? G : 1, out.upp[r], out.ushift[r], (int64_t)c * d.block_size);
            if (G == 16) reinterpret_cast<uint4 *>(orow)[i] = *reinterpret_cast<const uint4 *>(src);
            else if (G == 8) reinterpret_cast<uint2 *>(orow)[i] = *reinterpret_cast<const uint2 *>(src);
            else if (G == 4) reinterpret_cast<uint32_t *>(orow)[i] = *reinterpret_cast<const uint32_t *>(src);
            else orow[i] = *src;
          }
        }
      } else if (G > 1 && per_tok <= 32 && (per_tok & (per_tok - 1)) == 0) {
        if (G == 16) copy_region_batch<16>(pg, tt, nb, R, kb, roff, rs, per_tok, out.p[r], out.stride[r], lane);
        else if (G == 8) copy_region_batch<8>(pg, tt, nb, R, kb, roff, rs, per_tok, out.p[r], out.stride[r], lane);
        else copy_region_batch<4>(pg, tt, nb, R, kb, roff, rs, per_tok, out.p[r], out.stride[r], lane);
      } else { // any other row, row by row: G-byte pieces (bytes when nothing else is aligned)
        for (int k = 0; k < nb; k++) {
          const unsigned char *p = shfl_ptr(pg, k);
          const int t = __shfl_sync(0xffffffffu, tt, k);
          if (!p) continue;
          const unsigned char *srow = p + d.region_off[r] + t * rs;
          unsigned char *orow = out.p[r] + R.at(kb + k) * out.stride[r];
          if (G == 16)
            for (int i = lane; i < rb / 16; i += 32) reinterpret_cast<uint4 *>(orow)[i] = reinterpret_cast<const uint4 *>(srow)[i];
          else if (G == 8)
            for (int i = lane; i < rb / 8; i += 32) reinterpret_cast<uint2 *>(orow)[i] = reinterpret_cast<const uint2 *>(srow)[i];
          else if (G == 4)
            for (int i = lane; i < rb / 4; i += 32) reinterpret_cast<uint32_t *>(orow)[i] = reinterpret_cast<const uint32_t *>(srow)[i];
          else
            for (int i = lane; i < rb; i += 32) orow[i] = srow[i];
        }
      }
    }
  }
}

} // namespace

// ---- compile-time-specialized variants (kv_gather_spec.cuh) ----
//
// The structure of the JIT twin (kernels_rtc/kv_gather.cu) with the
// descriptor as constants: a warp takes RR consecutive output rows per step
// (warps sweep the rows together), lane r < RR resolves row r's index (the
// next step's index loads are issued before this step's rows are converted),
// every lane issues the loads of all its chunks of the RR rows, then
// dequantizes and stores them. No shared memory, no plan.
#include "kv_gather_spec.cuh"

namespace {

using namespace mla_kvs;

constexpr int kSpecThreads = 256;

template <class L, class Src, int RR>
__global__ void __launch_bounds__(kSpecThreads, 4)
    spec_gather_kernel(const __grid_constant__ mla_cache_view v, const Src src, const mla_kv_rows out,
                       unsigned long long *bad) {
  constexpr int NS = lay<L>::nslots;
  const int lane = threadIdx.x & 31;
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  const int64_t n = src.rows();
  const int nch_out = (int)(out.cols / 8);
  const bool ovec = ((uintptr_t)out.data & 15) == 0 && (out.stride & 7) == 0;
  float ts = 1.0f;
  if constexpr (lay<L>::tensor) ts = v.tensor_scale ? *v.tensor_scale : 1.0f;
  const int64_t token_stride = v.token_stride;
  auto resolve = [&](int64_t b, const unsigned char *&pg, int &tt) {
    pg = nullptr, tt = 0;
    if (lane < RR && b + lane < n) {
      int64_t page, t;
      if (src.locate(b + lane, lay<L>::bs, v.num_pages, page, t, bad)) pg = v.base + page * v.page_stride, tt = (int)t;
    }
  };
  const unsigned char *pg_next;
  int tt_next;
  resolve(warp * RR, pg_next, tt_next);
  for (int64_t b = warp * RR; b < n; b += nwarps * RR) {
    const unsigned char *pg[RR];
    int tt[RR];
#pragma unroll
    for (int r = 0; r < RR; r++) pg[r] = shfl_ptr(pg_next, r), tt[r] = __shfl_sync(0xffffffffu, tt_next, r);
    uint4 raw[RR][NS > 0 ? NS : 1];
    uint32_t sb[RR][NS > 0 ? NS : 1];
    static_for<NS>([&](auto S) {
      constexpr int s = decltype(S)::value;
      using Fd = fld<L, slot<L, s>::f>;
      const int j = lane + 32 * slot<L, s>::k;
      const bool in = (Fd::nch % 32 == 0 || j < Fd::nch) && Fd::c0 + j < nch_out;
#pragma unroll
      for (int r = 0; r < RR; r++) {
        raw[r][s] = make_uint4(0, 0, 0, 0), sb[r][s] = 0;
        if (pg[r] && in) {
          raw[r][s] = load_raw<Fd>(chunk_addr<Fd>(pg[r], tt[r], token_stride, j));
          if constexpr (Fd::skind == MLA_SCALE_GROUP) sb[r][s] = load_scale<Fd>(scale_addr<Fd>(pg[r], tt[r], token_stride, j));
        }
      }
    });
    resolve(b + nwarps * RR, pg_next, tt_next); // in flight with this step's rows
    static_for<NS>([&](auto S) {
      constexpr int s = decltype(S)::value;
      using Fd = fld<L, slot<L, s>::f>;
      const int j = lane + 32 * slot<L, s>::k;
      const int c = Fd::c0 + j;
      const bool in = (Fd::nch % 32 == 0 || j < Fd::nch) && c < nch_out;
#pragma unroll
      for (int r = 0; r < RR; r++) {
        if (pg[r] && in) {
          const uint4 o = dequant<Fd>(raw[r][s], sb[r][s], ts, chunk_addr<Fd>(pg[r], tt[r], token_stride, j));
          unsigned char *orow = (unsigned char *)out.data + (b + r) * out.stride * 2;
          if (ovec) *reinterpret_cast<uint4 *>(orow + 16 * c) = o;
          else mla::store16(orow + 16 * (int64_t)c, o);
        }
      }
    });
  }
}

template <class L, class Src, int RR>
void spec_gather_launch(const mla_kv_cache *c, const Src &src, int64_t rows, const mla_kv_rows *out,
                        unsigned long long *bad, cudaStream_t s) {
  auto k = spec_gather_kernel<L, Src, RR>;
  k<<<spec_grid(k, kSpecThreads, (rows + RR - 1) / RR, 16), kSpecThreads, 0, s>>>(c->view, src, *out, bad);
}

// The specialized variant when one serves c's descriptor (records its name),
// else the generic kernel. Rows per warp step: 2 (fp4_v41 measured 91.7% of
// memcpy with 2, 90.4% with 4); MLALAB_KV_SPEC_ROWS=1|2|4 overrides (tuning;
// 4 only for rows of at most 320 bytes, more would spill).
template <class Src>
cudaError_t gather_any(const mla_kv_cache *c, const Src &src, int64_t rows, const mla_kv_rows *out,
                       unsigned long long *bad, cudaStream_t s) {
  static const int rr = env_int("MLALAB_KV_SPEC_ROWS", 2);
  const char *name = with_builtin(c->desc, c->view, [&](auto spec) {
    using L = decltype(spec);
    if (rows == 0 || out->cols == 0) return;
    if (rr == 1) spec_gather_launch<L, Src, 1>(c, src, rows, out, bad, s);
    else if constexpr (L::host.page_bytes / L::host.block_size <= 320) {
      if (rr == 4) spec_gather_launch<L, Src, 4>(c, src, rows, out, bad, s);
      else spec_gather_launch<L, Src, 2>(c, src, rows, out, bad, s);
    } else spec_gather_launch<L, Src, 2>(c, src, rows, out, bad, s);
  });
  mla_cuda_kv_note_variant(name ? name : "generic");
  if (name) return cudaGetLastError();
  return launch_gather(c, src, rows, out, bad, s);
}

// Raw rows of a built-in: region r's rows copied in pieces of G_r bytes (the
// widest its row length and offset allow), 32 rows per warp step. PF: the
// first pass group of every region is loaded, then the next step's 32 indices
// are resolved (their dependent loads in flight with this step's copies), then
// the stores; without PF each region loads and stores in turn and a step
// resolves its own indices first (MLALAB_KV_RAW_PF=0, for comparison).
// H100, indexer_fp8 at 256 MiB: PF 92.8% of memcpy, without 86.7%; PF with
// one wave (MLALAB_KV_SPEC_GRID=1) 91.2%, so 4 waves stay.
template <class L> struct rawreg {
  template <int R> static constexpr int rb() { return L::host.region_row_bytes[R]; }
  template <int R> static constexpr int64_t off() { return L::host.region_off[R]; }
  template <int R> static constexpr int gran() { return min_i(min_i(pow2_div16(rb<R>()), pow2_div16(off<R>())), 16); }
  template <int R> static constexpr int per() { return rb<R>() / gran<R>(); } // pieces per row
  template <int R> static constexpr bool batched() {
    return gran<R>() >= 4 && per<R>() <= 32 && (per<R>() & (per<R>() - 1)) == 0;
  }
  template <int R> static constexpr int qb() { return per<R>() < 8 ? per<R>() : 8; } // passes loaded before their stores
};

template <class L, bool PF>
__global__ void __launch_bounds__(kSpecThreads, PF ? 3 : 4)
    spec_raw_kernel(const __grid_constant__ mla_cache_view v, const mla_kv_dense g, const __grid_constant__ RawOut out,
                    int64_t nrows, unsigned long long *bad) {
  constexpr int NR = lay<L>::nregions;
  const int lane = threadIdx.x & 31;
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  auto resolve = [&](int64_t b, const unsigned char *&pg, int &tt) {
    pg = nullptr, tt = 0;
    if (b + lane < nrows) {
      int64_t page, t;
      if (locate_dense(g, b + lane, lay<L>::bs, v.num_pages, page, t, bad)) pg = v.base + page * v.page_stride, tt = (int)t;
    }
  };
  const unsigned char *pg_next = nullptr;
  int tt_next = 0;
  if (PF) resolve(warp * 32, pg_next, tt_next);
  for (int64_t b = warp * 32; b < nrows; b += nwarps * 32) {
    const unsigned char *pg;
    int tt;
    if (PF) pg = pg_next, tt = tt_next;
    else resolve(b, pg, tt);
    // pass q0 + q of batched region r: rows (q0 + q) * rpp + sub, piece pc of each
    auto load_group = [&](auto Rc, int q0, uint4 (&buf)[8], bool (&ok)[8]) {
      constexpr int r = decltype(Rc)::value;
      constexpr int RB = rawreg<L>::template rb<r>(), G = rawreg<L>::template gran<r>(), per = rawreg<L>::template per<r>();
      constexpr int64_t OFF = rawreg<L>::template off<r>();
      constexpr int rpp = 32 / per, QB = rawreg<L>::template qb<r>();
      using T = typename piece<G >= 4 ? G : 4>::T;
      const int sub = lane / per, pc = lane % per;
#pragma unroll
      for (int q = 0; q < QB; q++) {
        const int k = (q0 + q) * rpp + sub;
        const unsigned char *p = shfl_ptr(pg, k);
        const int t = __shfl_sync(0xffffffffu, tt, k);
        ok[q] = p != nullptr;
        if (ok[q]) {
          const int64_t rs = r == 0 ? v.token_stride : (int64_t)RB;
          *reinterpret_cast<T *>(&buf[q]) = __ldg(reinterpret_cast<const T *>(p + OFF + t * rs + pc * G));
        }
      }
    };
    auto store_group = [&](auto Rc, int q0, const uint4 (&buf)[8], const bool (&ok)[8]) {
      constexpr int r = decltype(Rc)::value;
      constexpr int G = rawreg<L>::template gran<r>(), per = rawreg<L>::template per<r>();
      constexpr int rpp = 32 / per, QB = rawreg<L>::template qb<r>();
      using T = typename piece<G >= 4 ? G : 4>::T;
      const int sub = lane / per, pc = lane % per;
      unsigned char *o = out.p[r];
      const int64_t os = out.stride[r];
#pragma unroll
      for (int q = 0; q < QB; q++)
        if (ok[q]) *reinterpret_cast<T *>(o + (b + (q0 + q) * rpp + sub) * os + pc * G) = *reinterpret_cast<const T *>(&buf[q]);
    };
    uint4 buf[NR][8];
    bool ok[NR][8];
    if constexpr (PF) {
      static_for<NR>([&](auto Rc) {
        constexpr int r = decltype(Rc)::value;
        if constexpr (rawreg<L>::template batched<r>()) load_group(Rc, 0, buf[r], ok[r]);
      });
      resolve(b + nwarps * 32, pg_next, tt_next); // in flight with this step's copies
    }
    static_for<NR>([&](auto Rc) {
      constexpr int r = decltype(Rc)::value;
      constexpr int RB = rawreg<L>::template rb<r>(), per = rawreg<L>::template per<r>();
      constexpr int64_t OFF = rawreg<L>::template off<r>();
      constexpr int QB = rawreg<L>::template qb<r>();
      if constexpr (rawreg<L>::template batched<r>()) {
#pragma unroll
        for (int q0 = 0; q0 < per; q0 += QB) {
          if (!PF || q0 > 0) load_group(Rc, q0, buf[r], ok[r]);
          store_group(Rc, q0, buf[r], ok[r]);
        }
      } else { // any other row: row by row, bytes
        unsigned char *o = out.p[r];
        const int64_t os = out.stride[r];
        for (int k = 0; k < 32; k++) {
          const unsigned char *p = shfl_ptr(pg, k);
          const int t = __shfl_sync(0xffffffffu, tt, k);
          if (!p) continue;
          const unsigned char *srow = p + OFF + t * (r == 0 ? v.token_stride : (int64_t)RB);
          for (int i = lane; i < RB; i += 32) o[(b + k) * os + i] = srow[i];
        }
      }
    });
  }
}

// The specialized raw copy needs each output region aligned to its piece width.
template <class L> bool raw_out_ok(const RawOut &o) {
  bool ok = true;
  static_for<lay<L>::nregions>([&](auto Rc) {
    constexpr int r = decltype(Rc)::value;
    constexpr int G = rawreg<L>::template gran<r>();
    if ((((uintptr_t)o.p[r] | (uintptr_t)o.stride[r]) % G) != 0) ok = false;
  });
  return ok;
}

} // namespace

extern "C" cudaError_t mla_cuda_kv_gather_sparse(const mla_kv_cache *c, const mla_kv_ivec *slots,
                                                 const mla_kv_rows *out, const mla_kv_omat *remap,
                                                 unsigned long long *bad, cudaStream_t s) {
  SparseSrc src{*slots, {}};
  if (remap) src.remap = *remap;
  return gather_any(c, src, slots->n, out, bad, s);
}

extern "C" cudaError_t mla_cuda_kv_gather_dense(const mla_kv_cache *c, const mla_kv_dense *g, const mla_kv_rows *out,
                                                unsigned long long *bad, cudaStream_t s) {
  if (g->cu.n < 2) return cudaSuccess;
  return gather_any(c, DenseSrc{*g, out->rows}, out->rows, out, bad, s);
}

extern "C" cudaError_t mla_cuda_kv_gather_pages(const mla_kv_cache *c, const mla_kv_ivec *pages,
                                                const mla_kv_rows *out, unsigned long long *bad, cudaStream_t s) {
  return gather_any(c, PagesSrc{*pages, c->desc.block_size}, pages->n * c->desc.block_size, out, bad, s);
}

extern "C" cudaError_t mla_cuda_kv_gather_raw(const mla_kv_cache *c, const mla_kv_dense *g, unsigned char *const *out,
                                              const int64_t *out_stride, int64_t rows, unsigned long long *bad,
                                              cudaStream_t s) {
  if (rows == 0 || g->cu.n < 2) return cudaSuccess;
  RawOut o = {};
  for (int r = 0; r < c->desc.nregions; r++) {
    o.p[r] = out[r], o.stride[r] = out_stride[r];
    const int64_t step = mla_region_step(&c->desc, r);
    const int gs = copy_granularity((uintptr_t)c->view.base + (uintptr_t)c->desc.region_off[r], c->view.page_stride,
                                    step ? step : c->view.token_stride,
                                    c->desc.region_chunk[r] > 0 ? c->desc.region_chunk[r] : c->desc.region_row_bytes[r]);
    const int gd = copy_granularity((uintptr_t)out[r], out_stride[r], out_stride[r], c->desc.region_row_bytes[r]);
    o.gran[r] = gs < gd ? gs : gd;
    o.upp[r] = c->desc.region_chunk[r] > 0 ? c->desc.region_chunk[r] / o.gran[r] : 0;
    o.ushift[r] = mla_log2_exact(o.upp[r]);
  }
  bool ran = false;
  const char *name = with_builtin(c->desc, c->view, [&](auto spec) {
    using L = decltype(spec);
    if constexpr (!mla_layout_chunked(&L::host)) { // whole region rows only: a chunked layout's run generic
      if (!raw_out_ok<L>(o)) return;
      static const bool pf = [] {
        const char *e = getenv("MLALAB_KV_RAW_PF");
        return !(e && e[0] == '0');
      }();
      auto k = pf ? spec_raw_kernel<L, true> : spec_raw_kernel<L, false>;
      k<<<spec_grid(k, kSpecThreads, (rows + 31) / 32, 4), kSpecThreads, 0, s>>>(c->view, *g, o, rows, bad);
      ran = true;
    }
  });
  mla_cuda_kv_note_variant(ran ? name : "generic");
  if (ran) return cudaGetLastError();
  int64_t work = (rows + 31) / 32 / (kThreads / 32) + 1;
  // rows in contiguous shares: a batch is 32 consecutive tokens of a request, read as whole lines
  gather_raw_kernel<<<grid_for(gather_raw_kernel, 0, work), kThreads, 0, s>>>(c->desc, c->view, *g, o, rows, 0, bad);
  return cudaGetLastError();
}
