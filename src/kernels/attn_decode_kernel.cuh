// The baked MLA decode kernel: one CTA per (problem, row chunk) x KV split.
// MR query rows (heads x queries of one request, or heads of one sparse
// query) share every K tile of BN keys, which is what makes absorbed MLA
// compute-efficient. Per tile:
//   1. the tile's token rows arrive by cp.async (NSTAGES in flight; slot ids
//      of the next tiles are looked up one tile ahead);
//   2. layouts other than plain bf16 are dequantized to bf16 in shared memory
//      through per-chunk plans made from the layout descriptor;
//   3. S = Q K^T with mma.sync m16n8k16 (bf16 in, fp32 out), masked, scaled;
//   4. online softmax in base 2 (row maxima shared through shared memory),
//      P written to shared memory as bf16;
//   5. O = alpha O + P V, V being the first 512 dims of the same tile.
// Each split writes its normalized partial and base-2 LSE (combined by
// attn_combine.cu), or the final bf16 output when there is one split.
#ifndef MLA_ATTN_DECODE_KERNEL_CUH
#define MLA_ATTN_DECODE_KERNEL_CUH

#include <math_constants.h>

#include "attn_decode_params.cuh"
#include "attn_decode_rows.cuh"
#include "mla/attn_split.h"
#include "mla/dequant_chunk.cuh"
#include "mla/mma.cuh"

namespace mla_attn {

template <int MR> struct shape {
  static constexpr int NW = 8;                           // warps: enough to hide latencies at 1-2 CTAs per SM
  static constexpr int NT = NW * 32;
  static constexpr int SWN = MR == 64 ? 16 : 8;          // S columns per warp
  static constexpr int SCG = BN / SWN;                   // S column groups
  static constexpr int SW = (MR / 16) * SCG;             // warps computing S (the others wait for P)
  static constexpr int MT = MR / 16;                     // 16-row m-tiles in P V
  static constexpr int DVW = DV / NW;                    // output dims per warp in P V
  static constexpr int NTV = DVW / 8;                    // 8-dim n-tiles per warp
  static_assert(SW <= NW && SCG <= 4, "one 16-row S tile per S warp, at most 4 column groups");
};

// Lazy rescaling in the online softmax (FlashAttention-4's conditional
// rescale; the wgmma and slice kernels): the running max moves, and O is
// rescaled, only when a score passes it by more than this (log2), so the
// weights stay below 2^8.
constexpr float RESCALE_LOG2 = 8.0f;

// A row's running max m_run after a tile whose scores reach m (m_run
// included): returns the factor O and the row sum are rescaled by (0 before
// any key, 1 while the max stays) and sets base, what the tile's scores are
// weighted against.
__device__ __forceinline__ float online_max(float &m_run, float m, float &base) {
  if (m_run == -CUDART_INF_F || m > m_run + RESCALE_LOG2) {
    const float alpha = m_run == -CUDART_INF_F ? 0.f : exp2f(m_run - m);
    base = m == -CUDART_INF_F ? 0.f : m;
    m_run = m;
    return alpha;
  }
  base = m_run;
  return 1.f;
}

// One token row of `nch` chunks of G bytes, chunks j, j + 8, ... of it.
template <int G>
__device__ __forceinline__ void copy_row(uint32_t dst, const unsigned char *src, int nch, int j, bool ok) {
  for (int c = j; c < nch; c += 8) {
    const unsigned char *s = ok ? src + c * G : src;
    if constexpr (G == 16) mla::cp_async16(dst + c * G, s, ok ? G : 0);
    else if constexpr (G == 8) mla::cp_async8(dst + c * G, s, ok ? G : 0);
    else mla::cp_async4(dst + c * G, s, ok ? G : 0);
  }
}

// Region r's row of token `off` from a chunked page, in row order: units u =
// j, j + 8, ... of gran bytes, each from its piece (mla_piece_unit_off's
// rule, written out); a missing key (!ok) gives zeros.
__device__ __forceinline__ void stage_pieces(const params &p, int r, const unsigned char *page_base, int64_t off,
                                             unsigned char *dst, int j, bool ok) {
  const int gran = p.reg_gran[r], n = p.reg_bytes[r] / gran, upp = p.reg_upp[r], sh = p.reg_ushift[r];
  const int c = p.d.region_chunk[r];
  const unsigned char *row = page_base + p.d.region_off[r] + off * c;
  for (int u = j; u < n; u += 8) {
    const int b = u * gran;
    const unsigned piece = sh >= 0 ? (unsigned)u >> sh : (unsigned)u / (unsigned)upp;
    const unsigned char *src = ok ? row + (int64_t)piece * c * p.d.block_size + (u - (int)piece * upp) * gran : p.v.base;
    const uint32_t sd = mla::smem_addr(dst + b);
    if (gran == 16) mla::cp_async16(sd, src, ok ? 16 : 0);
    else if (gran == 8) mla::cp_async8(sd, src, ok ? 8 : 0);
    else if (gran == 4) mla::cp_async4(sd, src, ok ? 4 : 0);
    else dst[b] = ok ? *src : 0;
  }
}

// Starts the copies of one tile into a stage; missing keys become zero rows
// (never stale data: a NaN left in shared memory would survive 0 * NaN in P V).
// Eight threads share a token row, so each warp instruction moves whole lines
// and every thread computes its row address once.
template <int MR, int DQK>
__device__ __forceinline__ void issue_tile(const params &p, unsigned char *stage, const int *pg, const int *of) {
  constexpr int NT = shape<MR>::NT, KP = DQK + 8, TPP = NT / 8; // tokens per pass
  const int tid = threadIdx.x, j = tid & 7;
  const unsigned char *base = p.v.base;
#pragma unroll
  for (int pass = 0; pass < BN / TPP; pass++) {
    const int n = pass * TPP + (tid >> 3);
    const int page = pg[n];
    const bool ok = page >= 0;
    const unsigned char *page_base = base + (ok ? (int64_t)page * p.v.page_stride : 0);
    if (p.identity) {
      const unsigned char *row = ok ? page_base + p.d.region_off[0] + (int64_t)of[n] * p.v.token_stride + p.id_off : base;
      copy_row<16>(mla::smem_addr(stage + n * KP * 2), row, DQK / 8, j, ok);
      continue;
    }
    for (int r = 0; r < p.d.nregions; r++) {
      const int gran = p.reg_gran[r];
      unsigned char *dst = stage + n * p.stage_pitch + p.reg_stage_off[r];
      if (p.d.region_chunk[r] > 0) {
        stage_pieces(p, r, page_base, of[n], dst, j, ok);
        continue;
      }
      const int64_t rstride = r == 0 ? p.v.token_stride : (int64_t)p.d.region_row_bytes[r];
      const unsigned char *row = ok ? page_base + p.d.region_off[r] + (int64_t)of[n] * rstride : base;
      switch (gran) {
      case 16: copy_row<16>(mla::smem_addr(dst), row, p.reg_bytes[r] / 16, j, ok); break;
      case 8: copy_row<8>(mla::smem_addr(dst), row, p.reg_bytes[r] / 8, j, ok); break;
      case 4: copy_row<4>(mla::smem_addr(dst), row, p.reg_bytes[r] / 4, j, ok); break;
      default: // an unaligned view: plain byte copies
        for (int c = j; c < p.reg_bytes[r]; c += 8) dst[c] = ok ? row[c] : 0;
      }
    }
  }
}

__device__ __forceinline__ void wait_stages(int nstages) {
  // leave nstages - 2 groups in flight: the current tile's group has landed
  switch (nstages) {
  case 2: mla::cp_async_wait<0>(); break;
  case 3: mla::cp_async_wait<1>(); break;
  default: mla::cp_async_wait<2>(); break;
  }
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// dequant_chunk_bf16 with the e4m3 kinds sharing one conversion body (only
// the scale differs), so the fused loop carries one copy of it and few branches.
__device__ __forceinline__ uint4 fused_chunk(const mla::chunk_plan &c, const unsigned char *row, float tscale) {
  const int kind = c.kind;
  if (kind >= mla::CHUNK_FP8_ONE) {
    float s = kind == mla::CHUNK_FP8_TENSOR ? tscale : 1.0f;
    if (kind == mla::CHUNK_FP8_F32) s = *reinterpret_cast<const float *>(row + c.scale_src);
    else if (kind == mla::CHUNK_FP8_UE8M0) s = mla_decode_scale(MLA_UE8M0, row[c.scale_src]);
    return mla::e4m3x8_scaled_bf16(*reinterpret_cast<const uint2 *>(row + c.src), s);
  }
  if (kind == mla::CHUNK_COPY) return *reinterpret_cast<const uint4 *>(row + c.src);
  return mla::dequant_chunk_bf16(c, row, tscale);
}

// Fused path: Q rows g and g + 8 stored as ready mma A fragments, per 8-dim
// chunk c two 16-byte fragments (dims 0-3, dims 4-7); row pairs padded by 16
// bytes so lanes (g, t4) reading chunks c0 + t4 hit distinct banks.
template <int DQK> __device__ __forceinline__ int qfrag_off(int pair, int c) { return pair * (DQK / 8 * 32 + 16) + c * 32; }

__device__ __forceinline__ uint16_t to_bf16_bits(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }

// The larger finite magnitude of a bf16 pair, as bits (0 for inf and NaN).
__device__ __forceinline__ uint32_t bf16x2_absmax(uint32_t w) {
  const uint32_t a = w & 0x7FFFu, b = (w >> 16) & 0x7FFFu;
  return max(a < 0x7F80u ? a : 0u, b < 0x7F80u ? b : 0u);
}

// Two bf16 (lo, hi) times s as f16x2, round to nearest (exact for a power-of-two s
// that keeps the values in f16's normal range).
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t w, float s) {
  const __half2 h = __floats2half2_rn(__uint_as_float(w << 16) * s, __uint_as_float(w & 0xFFFF0000u) * s);
  return *reinterpret_cast<const uint32_t *>(&h);
}

// What one CTA works on (both decode kernels): the problem (a batch row, or a
// batch row x query for sparse), its chunk of rows, the keys it attends and
// the tiles of its KV split. Chunks of one problem are adjacent in x, so they
// meet its K tiles in L2.
struct cta_work {
  int prob, split, row0, nrows, r, qi;
  int s_k;   // cache length (dense), 0 for sparse
  int nkeys; // keys of the chunk: causal-trimmed for its last query, or first with the tail (dense); valid top-k entries (sparse)
  int t_begin, t_end;
  int64_t part; // first partial row of this split
};

template <int MR, int TB = BN> __device__ __forceinline__ cta_work cta_work_of(const params &p) {
  if (p.causal_tail) pdl_launch_dependents(); // every kernel calls this first: the tail may start
  cta_work w;
  w.prob = blockIdx.x / p.row_chunks, w.split = blockIdx.y, w.row0 = (blockIdx.x - w.prob * p.row_chunks) * MR;
  w.nrows = min(MR, p.rows - w.row0);
  w.r = p.sparse ? w.prob / p.s_q : w.prob, w.qi = p.sparse ? w.prob - (w.prob / p.s_q) * p.s_q : 0;
  w.s_k = 0;
  if (!p.sparse) {
    w.s_k = max(0, __ldg(p.cache_lens + w.r));
    w.nkeys = w.s_k;
    if (p.causal && p.s_q > 1) { // the chunk's last query sees the most keys; with the tail, its first query's
      const int i_lim = (p.causal_tail ? w.row0 : w.row0 + w.nrows - 1) / p.h_q;
      w.nkeys = max(0, min(w.s_k, w.s_k - p.s_q + i_lim + 1));
    }
  } else {
    w.nkeys = p.topk_len ? min(max(__ldg(p.topk_len + w.r), 0), p.topk) : p.topk;
  }
  // a split's tiles a multiple of a page's worth, as the launcher's split count assumes
  const int al = mla_attn_split_align(p.sparse, p.d.block_size, TB);
  const int ntiles = (w.nkeys + TB - 1) / TB, per = MLA_ATTN_SPLIT_TILES(ntiles, p.nsplits, al);
  w.t_begin = min(w.split * per, ntiles), w.t_end = min(w.t_begin + per, ntiles);
  w.part = ((int64_t)w.prob * p.nparts + w.split) * p.rows;
  return w;
}

// Output dims [4c, 4c + 4) of the chunk's row `row`, v times f: the split's
// f32 partial, or the final bf16 row when there is one split.
__device__ __forceinline__ void store_out4(const params &p, const cta_work &w, int row, int c, float4 v, float f) {
  if (p.nparts > 1)
    reinterpret_cast<float4 *>(p.o_acc + (w.part + w.row0 + row) * DV)[c] = make_float4(v.x * f, v.y * f, v.z * f, v.w * f);
  else
    reinterpret_cast<uint2 *>(p.out + ((int64_t)w.prob * p.rows + w.row0 + row) * DV)[c] =
        make_uint2(mla::pack_bf16x2(v.x * f, v.y * f), mla::pack_bf16x2(v.z * f, v.w * f));
}

// A split with nothing to attend: zero output rows and an empty LSE.
template <int NT> __device__ __forceinline__ void write_empty_split(const params &p, const cta_work &w, int tid) {
  for (int idx = tid; idx < w.nrows * (DV / 4); idx += NT) {
    const int row = idx / (DV / 4), c = idx - row * (DV / 4);
    if (p.nparts > 1) reinterpret_cast<float4 *>(p.o_acc + (w.part + w.row0 + row) * DV)[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    else reinterpret_cast<uint2 *>(p.out + ((int64_t)w.prob * p.rows + w.row0 + row) * DV)[c] = make_uint2(0, 0);
  }
  for (int row = tid; row < w.nrows; row += NT) {
    int i, h;
    row_coords(p, w.qi, w.row0 + row, i, h);
    if (p.nparts > 1) p.lse_acc[w.part + w.row0 + row] = -CUDART_INF_F;
    else p.lse[((int64_t)w.r * p.h_q + h) * p.s_q + i] = CUDART_INF_F;
  }
}

// Each row's LSE from its running max (base 2) and sum: the split's base-2
// partial, or the final natural-log LSE (+inf for a row with no key). A sum
// is empty only when it is 0: a NaN sum (a NaN score) gives a NaN LSE and
// output, as the reference does, instead of passing for an empty row.
template <int NT>
__device__ __forceinline__ void write_lse(const params &p, const cta_work &w, const float *m, const float *l_of, int tid) {
  for (int row = tid; row < w.nrows; row += NT) {
    const float l = l_of[row];
    const float lse2 = l != 0.f ? m[row] + log2f(l) : -CUDART_INF_F;
    int i, h;
    row_coords(p, w.qi, w.row0 + row, i, h);
    if (p.nparts > 1) p.lse_acc[w.part + w.row0 + row] = lse2;
    else p.lse[((int64_t)w.r * p.h_q + h) * p.s_q + i] = l != 0.f ? lse2 * 0.69314718055994531f : CUDART_INF_F;
  }
}

// Chunk plans of the K dims (staged layouts; all threads of the CTA share the
// work); returns the per-tensor scale (1 without one).
template <int NCH> __device__ __forceinline__ float setup_plans(const params &p, mla::chunk_plan *plan, int tid, int nt) {
  int soff[MLA_LAYOUT_MAX_REGIONS];
#pragma unroll
  for (int k = 0; k < MLA_LAYOUT_MAX_REGIONS; k++) soff[k] = p.reg_stage_off[k];
  for (int c = tid; c < NCH; c += nt) plan[c] = mla::make_chunk_plan(p.d, soff, c * 8);
  return p.v.tensor_scale ? __ldg(p.v.tensor_scale) : 1.0f;
}

// The chunk's Q rows in registers, 8 dims a chunk (zeros past nrows): chunks
// tid + (first + k) NT for k < NB, every load in flight before the first use
// (one after another, each queued behind the tiles' loads, the rs16 kernel's
// Q prologue took 8.7 us of a 128 us launch, batched 7.6: bench/RESULTS.md).
template <int MR, int NCH, int NT, int NB> struct q_chunks {
  uint4 v[NB];
  __device__ __forceinline__ void fetch(const params &p, const cta_work &w, int tid, int first) {
#pragma unroll
    for (int k = 0; k < NB; k++) {
      const int idx = tid + (first + k) * NT, row = idx / NCH, c = idx - row * NCH;
      v[k] = make_uint4(0, 0, 0, 0);
      if (idx < MR * NCH && row < w.nrows) {
        int i, h;
        row_coords(p, w.qi, w.row0 + row, i, h);
        v[k] = load_q8(p, w.r, i, h, c);
      }
    }
  }
  // store(row, c, val) for each chunk
  template <class Store> __device__ __forceinline__ void store(int tid, int first, Store &&st) const {
#pragma unroll
    for (int k = 0; k < NB; k++) {
      const int idx = tid + (first + k) * NT, row = idx / NCH, c = idx - row * NCH;
      if (idx < MR * NCH) st(row, c, v[k]);
    }
  }
};
template <int MR, int NCH, int NT> constexpr int q_chunks_per_thread() { return (MR * NCH + NT - 1) / NT; }

// The chunk's Q rows handed to store(row, c, val), in batches of up to six
// chunks a thread.
template <int MR, int NCH, int NT, class Store>
__device__ __forceinline__ void load_q_rows(const params &p, const cta_work &w, int tid, Store &&store) {
  constexpr int N = q_chunks_per_thread<MR, NCH, NT>(), NB = N < 6 ? N : 6;
#pragma unroll 1
  for (int b = 0; b < N; b += NB) {
    q_chunks<MR, NCH, NT, NB> q;
    q.fetch(p, w, tid, b);
    q.store(tid, b, store);
  }
}

template <int MR, int DQK>
__global__ void __launch_bounds__(shape<MR>::NT, MR == 64 ? 1 : 2) attn_decode_kernel(const __grid_constant__ params p) {
  using S = shape<MR>;
  constexpr int NT = S::NT, KP = DQK + 8, PP = BN + 8, NCH = DQK / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  const smem_plan L = make_smem_plan<MR, DQK>(p.identity, p.stage_pitch, p.nstages);
  uint16_t *Qs = reinterpret_cast<uint16_t *>(smem + L.q);
  uint16_t *Ps = reinterpret_cast<uint16_t *>(smem + L.p);
  unsigned char *stages = smem + L.stages;
  unsigned char *Kb = smem + L.kb;
  mla::chunk_plan *plan = reinterpret_cast<mla::chunk_plan *>(smem + L.plan);
  float *red_max = reinterpret_cast<float *>(smem + L.red_max);
  float *red_sum = reinterpret_cast<float *>(smem + L.red_sum);
  float *m_run = reinterpret_cast<float *>(smem + L.m_run);
  float *alpha_s = reinterpret_cast<float *>(smem + L.alpha);
  float *l_run = reinterpret_cast<float *>(smem + L.l_run);
  int *tok_page = reinterpret_cast<int *>(smem + L.tok_page);
  int *tok_off = reinterpret_cast<int *>(smem + L.tok_off);
  const int stage_bytes = p.identity ? BN * KP * 2 : BN * p.stage_pitch;
  const bool fused = fused_path<MR>(p.identity);
  const int QP = q_pitch<MR, DQK>(p.identity);
  float *s_part = reinterpret_cast<float *>(smem + L.s_part);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const cta_work w = cta_work_of<MR>(p);
  const int prob = w.prob, row0 = w.row0, nrows = w.nrows, r = w.r, qi = w.qi, s_k = w.s_k, nkeys = w.nkeys;
  const int t_begin = w.t_begin, t_end = w.t_end;
  const int64_t part = w.part;
  if (t_begin >= t_end) return write_empty_split<NT>(p, w, tid);

  // Setup: dequant plans, Q rows, running statistics, slots of the first tiles.
  const float tscale = p.identity ? 1.0f : setup_plans<NCH>(p, plan, tid, NT);
  load_q_rows<MR, NCH, NT>(p, w, tid, [&](int row, int c, uint4 val) {
    if (fused) {
      uint32_t *f = reinterpret_cast<uint32_t *>(reinterpret_cast<unsigned char *>(Qs) + qfrag_off<DQK>(row & 7, c));
      const int hi = row >> 3;
      f[hi] = val.x, f[2 + hi] = val.y, f[4 + hi] = val.z, f[6 + hi] = val.w;
    } else *reinterpret_cast<uint4 *>(Qs + row * QP + c * 8) = val;
  });
  for (int row = tid; row < MR; row += NT) {
    m_run[row] = m_run[MR + row] = -CUDART_INF_F;
    l_run[row] = 0.f;
  }
  const int nst = p.nstages;
  for (int st = 0; st < nst; st++)
    for (int n = tid; n < BN; n += NT) token_of(p, r, qi, nkeys, t_begin + st, n, tok_page[st * BN + n], tok_off[st * BN + n]);
  __syncthreads();
  for (int st = 0; st + 1 < nst; st++) {
    if (t_begin + st < t_end) issue_tile<MR, DQK>(p, stages + st * stage_bytes, tok_page + st * BN, tok_off + st * BN);
    mla::cp_async_commit();
  }

  // Row limits of the causal mask for the two rows this thread holds in S.
  const int srg = warp / S::SCG, scg = warp - (warp / S::SCG) * S::SCG;
  int lim[2] = {0x7fffffff, 0x7fffffff}; // no causal limit
  if (!p.sparse && p.causal && p.s_q > 1) {
#pragma unroll
    for (int hh = 0; hh < 2; hh++) lim[hh] = s_k - p.s_q + (row0 + srg * 16 + g + hh * 8) / p.h_q;
  }

  float o[S::MT][S::NTV][4];
#pragma unroll
  for (int mt = 0; mt < S::MT; mt++)
#pragma unroll
    for (int nt = 0; nt < S::NTV; nt++) o[mt][nt][0] = o[mt][nt][1] = o[mt][nt][2] = o[mt][nt][3] = 0.f;

  const int niter = t_end - t_begin;
  int st = 0; // stage of tile t
  for (int u = 0; u < niter; u++, st = st + 1 == nst ? 0 : st + 1) {
    const int t = t_begin + u;
    // slots of tile t + nst, looked up now and stored after this tile's P V
    int pf_page = -1, pf_off = 0;
    if (tid < BN) token_of(p, r, qi, nkeys, t + nst, tid, pf_page, pf_off);

    wait_stages(nst);
    __syncthreads();
    {
      const int ist = st == 0 ? nst - 1 : st - 1; // the stage tile t - 1 used
      if (t + nst - 1 < t_end) issue_tile<MR, DQK>(p, stages + ist * stage_bytes, tok_page + ist * BN, tok_off + ist * BN);
      mla::cp_async_commit();
    }
    const unsigned char *Kt = stages + st * stage_bytes;
    const bool s_warp = warp < S::SW;
    const int rA = srg * 16 + g, rB = rA + 8;
    float sacc[S::SWN / 8][4], sodd[S::SWN / 8][4];
#pragma unroll
    for (int j = 0; j < S::SWN / 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) sacc[j][e] = sodd[j][e] = 0.f;
    if constexpr (MR == 16) {
      if (fused) {
        // Warp (tg, half): tokens tg*8.., dims half*DQK/2... Lane (g, t4) rebuilds chunk
        // c = half*DQK/16 + 4j + t4 of token g: 8 dims that serve as the B fragments
        // of two k-steps (the sum over dims runs in a permuted order, the same for
        // Q, whose lane-held 8 dims of rows g and g+8 form the matching A fragments).
        static_assert(S::NW == 8 && S::SCG == 4 && S::SWN == 8, "fused path: 4 token groups x 2 dim halves");
        const int tg = warp & 3, half = warp >> 2, n = tg * 8 + g;
        const unsigned char *raw = Kt + n * p.stage_pitch;
        const unsigned char *qf = reinterpret_cast<const unsigned char *>(Qs) + qfrag_off<DQK>(g, half * (DQK / 16) + t4);
        unsigned char *kdst = Kb + n * KP * 2;
        const int c0 = half * (DQK / 16) + t4;
#pragma unroll 4
        for (int j = 0; j < DQK / 64; j++) {
          const int c = c0 + 4 * j;
          const uint4 kv = fused_chunk(plan[c], raw, tscale);
          if (c < DV / 8) *reinterpret_cast<uint4 *>(kdst + c * 16) = kv; // V dims, for P V
          const uint4 qa = *reinterpret_cast<const uint4 *>(qf + 128 * j), qb = *reinterpret_cast<const uint4 *>(qf + 128 * j + 16);
          const uint32_t a0[4] = {qa.x, qa.y, qa.z, qa.w}, a1[4] = {qb.x, qb.y, qb.z, qb.w};
          mla::mma_bf16_16816(sacc[0], a0, kv.x, kv.y);
          mla::mma_bf16_16816(sodd[0], a1, kv.z, kv.w);
        }
#pragma unroll
        for (int e = 0; e < 4; e++) sacc[0][e] += sodd[0][e];
        if (half) {
          const int col = tg * 8 + 2 * t4;
          *reinterpret_cast<float2 *>(s_part + g * BN + col) = make_float2(sacc[0][0], sacc[0][1]);
          *reinterpret_cast<float2 *>(s_part + (g + 8) * BN + col) = make_float2(sacc[0][2], sacc[0][3]);
        }
        __syncthreads();
        if (s_warp) {
          const int col = tg * 8 + 2 * t4;
          const float2 x = *reinterpret_cast<const float2 *>(s_part + g * BN + col);
          const float2 y = *reinterpret_cast<const float2 *>(s_part + (g + 8) * BN + col);
          sacc[0][0] += x.x, sacc[0][1] += x.y, sacc[0][2] += y.x, sacc[0][3] += y.y;
        }
        Kt = Kb;
      }
    }
    if (!p.identity && !fused) {
      const unsigned char *raw = Kt;
      static_assert(BN * NCH % NT == 0, "whole dequant rounds");
#pragma unroll 3
      for (int it = 0; it < BN * NCH / NT; it++) { // independent chunks: unrolled for loads in flight
        const int idx = it * NT + tid, n = idx / NCH, c = idx - n * NCH;
        *reinterpret_cast<uint4 *>(Kb + n * KP * 2 + c * 16) = mla::dequant_chunk_bf16(plan[c], raw + n * p.stage_pitch, tscale);
      }
      __syncthreads();
      Kt = Kb;
    }

    // S = Q K^T for rows srg*16.., keys scg*SWN.. (S warps only)
    // two accumulator sets (even and odd k-steps) halve the dependent mma chain
    if (s_warp && !fused) {
      const uint32_t qa = mla::smem_addr(Qs + (srg * 16 + (lane & 15)) * QP + (lane >> 4) * 8);
      uint32_t ka;
      if constexpr (S::SWN == 16) ka = mla::smem_addr(Kt + ((scg * 16 + (lane & 7) + (lane >> 4) * 8) * KP + ((lane >> 3) & 1) * 8) * 2);
      else ka = mla::smem_addr(Kt + ((scg * 8 + (lane & 7)) * KP + ((lane >> 3) & 1) * 8) * 2);
#pragma unroll 2
      for (int k = 0; k < DQK / 16; k += 2) {
#pragma unroll
        for (int half = 0; half < 2; half++) {
          float (&acc)[S::SWN / 8][4] = half ? sodd : sacc;
          uint32_t a[4];
          mla::ldmatrix_x4(a, qa + (k + half) * 32);
          if constexpr (S::SWN == 16) {
            uint32_t b[4];
            mla::ldmatrix_x4(b, ka + (k + half) * 32);
            mla::mma_bf16_16816(acc[0], a, b[0], b[1]);
            mla::mma_bf16_16816(acc[1], a, b[2], b[3]);
          } else {
            uint32_t b[2];
            mla::ldmatrix_x2(b, ka + (k + half) * 32);
            mla::mma_bf16_16816(acc[0], a, b[0], b[1]);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < S::SWN / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) sacc[j][e] += sodd[j][e];
    }
    // mask, scale, tile row maxima
    if (s_warp) {
    const int *pg = tok_page + st * BN;
    float mx[2] = {-CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
    for (int j = 0; j < S::SWN / 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int col = scg * S::SWN + j * 8 + 2 * t4 + (e & 1);
        const bool ok = pg[col] >= 0 && t * BN + col <= lim[e >> 1];
        const float s = ok ? sacc[j][e] * p.scale_log2 : -CUDART_INF_F;
        sacc[j][e] = s;
        mx[e >> 1] = fmaxf(mx[e >> 1], s);
      }
    mx[0] = quad_max(mx[0]), mx[1] = quad_max(mx[1]);
    if (t4 == 0) red_max[scg * MR + rA] = mx[0], red_max[scg * MR + rB] = mx[1];
    }
    __syncthreads();

    // online softmax: new maxima, P = 2^(s - m) in bf16, partial row sums
    if (s_warp) {
    const float *m_prev = m_run + ((u + 1) & 1) * MR;
    float *m_cur = m_run + (u & 1) * MR;
    float mnew[2], base[2], ps[2] = {0.f, 0.f};
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int row = hh ? rB : rA;
      float m = m_prev[row];
#pragma unroll
      for (int c = 0; c < S::SCG; c++) m = fmaxf(m, red_max[c * MR + row]);
      mnew[hh] = m;
      base[hh] = m == -CUDART_INF_F ? 0.f : m;
    }
#pragma unroll
    for (int j = 0; j < S::SWN / 8; j++) {
      const float p0 = exp2f(sacc[j][0] - base[0]), p1 = exp2f(sacc[j][1] - base[0]);
      const float p2 = exp2f(sacc[j][2] - base[1]), p3 = exp2f(sacc[j][3] - base[1]);
      ps[0] += p0 + p1, ps[1] += p2 + p3;
      const int col = scg * S::SWN + j * 8 + 2 * t4;
      *reinterpret_cast<uint32_t *>(Ps + rA * PP + col) = mla::pack_bf16x2(p0, p1);
      *reinterpret_cast<uint32_t *>(Ps + rB * PP + col) = mla::pack_bf16x2(p2, p3);
    }
    ps[0] = quad_sum(ps[0]), ps[1] = quad_sum(ps[1]);
    if (t4 == 0) {
      red_sum[scg * MR + rA] = ps[0], red_sum[scg * MR + rB] = ps[1];
      if (scg == 0) {
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
          const int row = hh ? rB : rA;
          const float mo = m_prev[row];
          m_cur[row] = mnew[hh];
          alpha_s[row] = mo == -CUDART_INF_F ? 0.f : exp2f(mo - mnew[hh]);
        }
      }
    }
    }
    __syncthreads();

    // O = alpha O + P V over this warp's DVW output dims
    for (int row = tid; row < MR; row += NT) {
      float l = l_run[row] * alpha_s[row];
#pragma unroll
      for (int c = 0; c < S::SCG; c++) l += red_sum[c * MR + row];
      l_run[row] = l;
    }
    {
      // once the row maxima settle every alpha is 1: skip the rescale (warp-uniform vote)
      float al[S::MT][2];
      bool moved = false;
#pragma unroll
      for (int mt = 0; mt < S::MT; mt++) {
        al[mt][0] = alpha_s[mt * 16 + g], al[mt][1] = alpha_s[mt * 16 + g + 8];
        moved |= al[mt][0] != 1.f || al[mt][1] != 1.f;
      }
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int mt = 0; mt < S::MT; mt++)
#pragma unroll
          for (int nt = 0; nt < S::NTV; nt++)
            o[mt][nt][0] *= al[mt][0], o[mt][nt][1] *= al[mt][0], o[mt][nt][2] *= al[mt][1], o[mt][nt][3] *= al[mt][1];
      }
    }
#pragma unroll
    for (int ks = 0; ks < BN / 16; ks++) {
      uint32_t pa[S::MT][4];
#pragma unroll
      for (int mt = 0; mt < S::MT; mt++)
        mla::ldmatrix_x4(pa[mt], mla::smem_addr(Ps + (mt * 16 + (lane & 15)) * PP + ks * 16 + (lane >> 4) * 8));
      const uint32_t va = mla::smem_addr(Kt + ((ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * KP + warp * S::DVW + (lane >> 4) * 8) * 2);
#pragma unroll
      for (int np = 0; np < S::NTV / 2; np++) {
        uint32_t vb[4];
        mla::ldmatrix_x4_trans(vb, va + np * 32);
#pragma unroll
        for (int mt = 0; mt < S::MT; mt++) {
          mla::mma_bf16_16816(o[mt][2 * np], pa[mt], vb[0], vb[1]);
          mla::mma_bf16_16816(o[mt][2 * np + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
    if (tid < BN) tok_page[st * BN + tid] = pf_page, tok_off[st * BN + tid] = pf_off;
  }
  mla::cp_async_wait<0>();
  __syncthreads();

  // Epilogue: normalize; final output (one split) or the split's partial.
  const float *m_fin = m_run + ((niter - 1) & 1) * MR;
#pragma unroll
  for (int mt = 0; mt < S::MT; mt++)
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int row = mt * 16 + g + hh * 8;
      if (row >= nrows) continue;
      const float l = l_run[row];
      float f = l != 0.f ? 1.0f / l : 0.f; // NaN stays NaN (write_lse)
      int i, h;
      row_coords(p, qi, row0 + row, i, h);
      if (p.nparts == 1 && p.sink && l != 0.f) {
        const float lse_nat = (m_fin[row] + log2f(l)) * 0.69314718055994531f;
        f *= 1.0f / (1.0f + expf(__ldg(p.sink + h) - lse_nat));
      }
#pragma unroll
      for (int nt = 0; nt < S::NTV; nt++) {
        const int col = warp * S::DVW + nt * 8 + 2 * t4;
        const float x0 = o[mt][nt][2 * hh] * f, x1 = o[mt][nt][2 * hh + 1] * f;
        if (p.nparts > 1) *reinterpret_cast<float2 *>(p.o_acc + (part + row0 + row) * DV + col) = make_float2(x0, x1);
        else *reinterpret_cast<uint32_t *>(p.out + ((int64_t)prob * p.rows + row0 + row) * DV + col) =
                 (uint32_t)to_bf16_bits(x0) | (uint32_t)to_bf16_bits(x1) << 16;
      }
    }
  write_lse<NT>(p, w, m_fin, l_run, tid);
}

} // namespace mla_attn

#endif
