// The Hopper decode kernel for 64-row tiles (h_q x s_q > 32, e.g. 128 heads):
// warpgroup MMA (wgmma) with both operands in shared memory, so the tensor
// cores read Q, K and P without register staging. One CTA of two warpgroups
// per (problem, 64-row chunk) x KV split, 64 keys per tile:
//   1. the tile's rows arrive by cp.async: plain bf16 rows straight into the
//      swizzled K tile (two tiles in flight), other layouts as raw bytes into
//      one stage that all 256 threads dequantize into the K tile;
//   2. S = Q K^T: warpgroup w takes keys 32w.., m64n32k16 over all d_qk;
//   3. online softmax in base 2, the row maxima of the two halves meeting in
//      shared memory; P (bf16) written to shared memory;
//   4. O = alpha O + P V: warpgroup w owns value dims 256w.., m64n256k16 with
//      V read MN-major from the same K tile.
// Everything around the tile loop (work split, masks, epilogue semantics) is
// the generic kernel's (attn_decode_kernel.cuh). sm_90a only: the launcher
// picks it on compute capability 9.0 when the binary carries sm_90a code.
#ifndef MLA_ATTN_DECODE_WG_CUH
#define MLA_ATTN_DECODE_WG_CUH

#include "attn_decode_kernel.cuh"
#include "mla/wgmma.cuh"

namespace mla_attn {
namespace wg {

constexpr int BN = 64;          // keys per tile
constexpr int MR = 64;          // query rows per CTA
constexpr int NT = 256;         // two warpgroups
constexpr int BLK = 64 * 128;   // one 64-row x 64-dim swizzled block of bf16
constexpr int TPK = NT / BN;    // loader threads per key row

struct smem_plan {
  int q, k, p, raw, plan, red_max, red_l, tok_ok, total;
};

// Offsets from the 1024-aligned start of the dynamic window; total includes
// the alignment slack.
template <int DQK> __host__ __device__ constexpr smem_plan make_smem_plan(int identity, int stage_pitch) {
  smem_plan s{};
  int o = 0;
  s.q = o, o += DQK / 64 * BLK;
  s.k = o, o += (identity ? 2 : 1) * (DQK / 64) * BLK;
  s.p = o, o += BLK;
  s.raw = o, o += identity ? 0 : (BN * stage_pitch + 15) / 16 * 16;
  s.plan = o, o += identity ? 0 : DQK / 8 * 16;
  s.red_max = o, o += 2 * MR * 4;
  s.red_l = o, o += 2 * MR * 4;
  s.tok_ok = o, o += 2 * BN * 4;
  s.total = o + 1024;
  return s;
}

// Starts the copies of key n's row (this thread's share: chunks j, j + TPK, ...)
// of a tile: plain bf16 into the swizzled K tile, or raw region rows into the stage.
template <int DQK>
__device__ __forceinline__ void issue_key(const params &p, unsigned char *kt, unsigned char *raw, int n, int j, int page,
                                          int off) {
  const bool ok = page >= 0;
  const unsigned char *base = p.v.base;
  const unsigned char *page_base = base + (ok ? (int64_t)page * p.v.page_stride : 0);
  if (p.identity) {
    const unsigned char *row = ok ? page_base + p.d.region_off[0] + (int64_t)off * p.v.token_stride + p.id_off : base;
#pragma unroll 6
    for (int c = j; c < DQK / 8; c += TPK) mla::cp_async16(mla::smem_addr(kt + mla::sw128_off(BN, n, c)), ok ? row + c * 16 : base, ok ? 16 : 0);
    return;
  }
  for (int r = 0; r < p.d.nregions; r++) {
    const int64_t rstride = r == 0 ? p.v.token_stride : (int64_t)p.d.region_row_bytes[r];
    const unsigned char *row = ok ? page_base + p.d.region_off[r] + (int64_t)off * rstride : base;
    unsigned char *dst = raw + n * p.stage_pitch + p.reg_stage_off[r];
    const int bytes = p.reg_bytes[r];
    switch (p.reg_gran[r]) {
    case 16:
      for (int c = j; c < bytes / 16; c += TPK) mla::cp_async16(mla::smem_addr(dst + c * 16), ok ? row + c * 16 : base, ok ? 16 : 0);
      break;
    case 8:
      for (int c = j; c < bytes / 8; c += TPK) mla::cp_async8(mla::smem_addr(dst + c * 8), ok ? row + c * 8 : base, ok ? 8 : 0);
      break;
    case 4:
      for (int c = j; c < bytes / 4; c += TPK) mla::cp_async4(mla::smem_addr(dst + c * 4), ok ? row + c * 4 : base, ok ? 4 : 0);
      break;
    default: // an unaligned view: plain byte copies
      for (int c = j; c < bytes; c += TPK) dst[c] = ok ? row[c] : 0;
    }
  }
}

template <int DQK>
__global__ void __launch_bounds__(NT, 1) attn_decode_wg_kernel(const __grid_constant__ params p) {
#if MLA_HAVE_WGMMA
  constexpr int NCH = DQK / 8;
  extern __shared__ __align__(16) unsigned char smem_window[];
  unsigned char *smem = smem_window + ((1024 - (mla::smem_addr(smem_window) & 1023)) & 1023);
  const smem_plan L = make_smem_plan<DQK>(p.identity, p.stage_pitch);
  unsigned char *Qs = smem + L.q, *Kbase = smem + L.k, *Ps = smem + L.p, *raw = smem + L.raw;
  mla::chunk_plan *plan = reinterpret_cast<mla::chunk_plan *>(smem + L.plan);
  float *red_max = reinterpret_cast<float *>(smem + L.red_max);
  float *red_l = reinterpret_cast<float *>(smem + L.red_l);
  int *tok_ok = reinterpret_cast<int *>(smem + L.tok_ok);

  const int tid = threadIdx.x, wgi = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const cta_work w = cta_work_of<MR, BN>(p);
  if (w.t_begin >= w.t_end) return write_empty_split<NT>(p, w, tid);
  const int r = w.r, qi = w.qi, nkeys = w.nkeys;

  // Setup: dequant plans, Q rows (zero past nrows), the first tile's copies.
  float tscale = 1.0f;
  if (!p.identity) {
    int soff[MLA_LAYOUT_MAX_REGIONS];
#pragma unroll
    for (int k = 0; k < MLA_LAYOUT_MAX_REGIONS; k++) soff[k] = p.reg_stage_off[k];
    for (int c = tid; c < NCH; c += NT) plan[c] = mla::make_chunk_plan(p.d, soff, c * 8);
    if (p.v.tensor_scale) tscale = __ldg(p.v.tensor_scale);
  }
  for (int idx = tid; idx < MR * NCH; idx += NT) {
    const int row = idx / NCH, c = idx - row * NCH;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row < w.nrows) {
      int i, h;
      row_coords(p, qi, w.row0 + row, i, h);
      val = load_q8(p, r, i, h, c);
    }
    *reinterpret_cast<uint4 *>(Qs + mla::sw128_off(MR, row, c)) = val;
  }
  const int kn = tid / TPK, kj = tid - kn * TPK; // the key row this thread loads, and its share
  int nx_page, nx_off;                           // slot of key kn in the next tile to issue
  token_of<BN>(p, r, qi, nkeys, w.t_begin, kn, nx_page, nx_off);
  issue_key<DQK>(p, Kbase, raw, kn, kj, nx_page, nx_off);
  if (kj == 0) tok_ok[kn] = nx_page >= 0;
  mla::cp_async_commit();
  token_of<BN>(p, r, qi, nkeys, w.t_begin + 1, kn, nx_page, nx_off);

  // This thread's rows of S and O, and their causal limits.
  const int rA = warp * 16 + g, rB = rA + 8;
  int lim[2] = {0x7fffffff, 0x7fffffff};
  if (!p.sparse && p.causal && p.s_q > 1) {
    lim[0] = w.s_k - p.s_q + (w.row0 + rA) / p.h_q;
    lim[1] = w.s_k - p.s_q + (w.row0 + rB) / p.h_q;
  }
  float o[128];
#pragma unroll
  for (int e = 0; e < 128; e++) o[e] = 0.f;
  float m_run[2] = {-CUDART_INF_F, -CUDART_INF_F}, l_run[2] = {0.f, 0.f};
  const uint32_t q_addr = mla::smem_addr(Qs), p_addr = mla::smem_addr(Ps);

  const int niter = w.t_end - w.t_begin;
  for (int u = 0; u < niter; u++) {
    const int t = w.t_begin + u;
    mla::cp_async_wait<0>();
    mla::fence_proxy_async();
    __syncthreads(); // tile t landed; every thread is done with tile t - 1
    unsigned char *Kt = Kbase + (p.identity ? (u & 1) * (DQK / 64) * BLK : 0);
    if (!p.identity) {
      static_assert(BN * NCH % NT == 0, "whole dequant rounds");
#pragma unroll 2
      for (int it = 0; it < BN * NCH / NT; it++) {
        const int idx = it * NT + tid, n = idx / NCH, c = idx - n * NCH;
        *reinterpret_cast<uint4 *>(Kt + mla::sw128_off(BN, n, c)) = mla::dequant_chunk_bf16(plan[c], raw + n * p.stage_pitch, tscale);
      }
      mla::fence_proxy_async();
      __syncthreads(); // K tile complete; the raw stage is free
    }
    if (t + 1 < w.t_end) {
      issue_key<DQK>(p, p.identity ? Kbase + ((u + 1) & 1) * (DQK / 64) * BLK : Kbase, raw, kn, kj, nx_page, nx_off);
      if (kj == 0) tok_ok[((u + 1) & 1) * BN + kn] = nx_page >= 0;
    }
    mla::cp_async_commit();
    token_of<BN>(p, r, qi, nkeys, t + 2, kn, nx_page, nx_off);

    // S = Q K^T for keys 32 wgi .. 32 wgi + 31
    float s[16];
#pragma unroll
    for (int e = 0; e < 16; e++) s[e] = 0.f;
    {
      const uint32_t k_addr = mla::smem_addr(Kt) + wgi * 32 * 128;
      mla::fence_regs(s);
      mla::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < DQK / 16; kk++) {
        const uint32_t off = (kk >> 2) * BLK + (kk & 3) * 32;
        mla::wgmma_m64n32k16_bf16(s, mla::wgmma_desc(q_addr + off, 16, 1024), mla::wgmma_desc(k_addr + off, 16, 1024), 1);
      }
      mla::wgmma_commit();
      mla::wgmma_wait<0>();
      mla::fence_regs(s);
    }

    // mask, scale, row maxima of this half
    const int *ok_t = tok_ok + (u & 1) * BN;
    float mx[2] = {-CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
    for (int e = 0; e < 16; e++) {
      const int col = wgi * 32 + (e >> 2) * 8 + 2 * t4 + (e & 1), hh = (e >> 1) & 1;
      const bool ok = ok_t[col] && t * BN + col <= lim[hh];
      s[e] = ok ? s[e] * p.scale_log2 : -CUDART_INF_F;
      mx[hh] = fmaxf(mx[hh], s[e]);
    }
    mx[0] = quad_max(mx[0]), mx[1] = quad_max(mx[1]);
    if (t4 == 0) red_max[wgi * MR + rA] = mx[0], red_max[wgi * MR + rB] = mx[1];
    __syncthreads();

    // online softmax: P = 2^(s - m) as bf16 into the swizzled P tile
    float alpha[2], base[2];
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int row = hh ? rB : rA;
      const float m = fmaxf(m_run[hh], fmaxf(red_max[row], red_max[MR + row]));
      alpha[hh] = m_run[hh] == -CUDART_INF_F ? 0.f : exp2f(m_run[hh] - m);
      base[hh] = m == -CUDART_INF_F ? 0.f : m;
      m_run[hh] = m;
    }
    float ps[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 4; j++) {
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        const float p0 = exp2f(s[4 * j + 2 * hh] - base[hh]), p1 = exp2f(s[4 * j + 2 * hh + 1] - base[hh]);
        ps[hh] += p0 + p1;
        const int row = hh ? rB : rA, c = wgi * 4 + j; // 16-byte chunk of the 64 keys
        *reinterpret_cast<uint32_t *>(Ps + mla::sw128_off(MR, row, c) + 4 * t4) = mla::pack_bf16x2(p0, p1);
      }
    }
    l_run[0] = l_run[0] * alpha[0] + ps[0], l_run[1] = l_run[1] * alpha[1] + ps[1];
    // once the row maxima settle every alpha is 1: skip the rescale (warp-uniform vote)
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int e = 0; e < 128; e++) o[e] *= alpha[(e >> 1) & 1];
    }
    mla::fence_proxy_async();
    __syncthreads(); // P complete

    // O += P V for value dims 256 wgi .. 256 wgi + 255
    {
      const uint32_t v_addr = mla::smem_addr(Kt) + wgi * 4 * BLK;
      mla::fence_regs(o);
      mla::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; kk++)
        mla::wgmma_m64n256k16_bf16_tb(o, mla::wgmma_desc(p_addr + kk * 32, 16, 1024),
                                      mla::wgmma_desc(v_addr + kk * 16 * 128, BLK, 1024), 1);
      mla::wgmma_commit();
      mla::wgmma_wait<0>();
      mla::fence_regs(o);
    }
  }
  mla::cp_async_wait<0>();

  // Epilogue: full row sums (quads, then the two halves), normalize, write.
  const float lq[2] = {quad_sum(l_run[0]), quad_sum(l_run[1])};
  if (t4 == 0) red_l[wgi * MR + rA] = lq[0], red_l[wgi * MR + rB] = lq[1];
  __syncthreads();
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int row = hh ? rB : rA;
    if (row >= w.nrows) continue;
    const float l = red_l[row] + red_l[MR + row];
    const float lse2 = l > 0.f ? m_run[hh] + log2f(l) : -CUDART_INF_F;
    float f = l > 0.f ? 1.0f / l : 0.f;
    int i, h;
    row_coords(p, qi, w.row0 + row, i, h);
    if (p.nsplits == 1 && p.sink && l > 0.f) f *= 1.0f / (1.0f + expf(__ldg(p.sink + h) - lse2 * 0.69314718055994531f));
#pragma unroll
    for (int j = 0; j < 32; j++) {
      const int col = wgi * 256 + j * 8 + 2 * t4;
      const float x0 = o[4 * j + 2 * hh] * f, x1 = o[4 * j + 2 * hh + 1] * f;
      if (p.nsplits > 1) *reinterpret_cast<float2 *>(p.o_acc + (w.part + w.row0 + row) * DV + col) = make_float2(x0, x1);
      else *reinterpret_cast<uint32_t *>(p.out + ((int64_t)w.prob * p.rows + w.row0 + row) * DV + col) = mla::pack_bf16x2(x0, x1);
    }
    if (wgi == 0 && t4 == 0) {
      if (p.nsplits > 1) p.lse_acc[w.part + w.row0 + row] = lse2;
      else p.lse[((int64_t)r * p.h_q + h) * p.s_q + i] = l > 0.f ? lse2 * 0.69314718055994531f : CUDART_INF_F;
    }
  }
#else
  __trap(); // the launcher only picks this kernel where sm_90a code exists
#endif
}

// Plain bf16 rows (identity tiles): the two warpgroups specialize, so the
// tensor cores always have work queued. Warpgroup 0 runs S = Q K^T over all
// 64 keys (m64n64k16), the softmax, and P V for value dims 0..255 with P from
// its registers; warpgroup 1 loads the K tiles (two in flight) and runs P V
// for dims 256..511 from P in shared memory, overlapping warpgroup 0's next S.
// Named barriers hand over the tiles and P (ids below; 0 is __syncthreads).
enum : int { BAR_FULL0 = 1, BAR_FULL1, BAR_EMPTY0, BAR_EMPTY1, BAR_P_FULL, BAR_P_EMPTY };

struct ws_plan {
  int q, k, p, alpha, fin, tok_ok, total;
};
template <int DQK> __host__ __device__ constexpr ws_plan make_ws_plan() {
  ws_plan s{};
  int o = 0;
  s.q = o, o += DQK / 64 * BLK;
  s.k = o, o += 2 * (DQK / 64) * BLK;
  s.p = o, o += BLK;
  s.alpha = o, o += MR * 4;
  s.fin = o, o += MR * 4;
  s.tok_ok = o, o += 2 * BN * 4;
  s.total = o + 1024;
  return s;
}

template <int DQK>
__global__ void __launch_bounds__(NT, 1) attn_decode_wg_ws_kernel(const __grid_constant__ params p) {
#if MLA_HAVE_WGMMA
  constexpr int NCH = DQK / 8, TILE = (DQK / 64) * BLK;
  extern __shared__ __align__(16) unsigned char smem_window[];
  unsigned char *smem = smem_window + ((1024 - (mla::smem_addr(smem_window) & 1023)) & 1023);
  constexpr ws_plan L = make_ws_plan<DQK>();
  unsigned char *Qs = smem + L.q, *Kbase = smem + L.k, *Ps = smem + L.p;
  float *alpha_s = reinterpret_cast<float *>(smem + L.alpha);
  float *fin_s = reinterpret_cast<float *>(smem + L.fin);
  int *tok_ok = reinterpret_cast<int *>(smem + L.tok_ok);

  const int tid = threadIdx.x, wgi = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const cta_work w = cta_work_of<MR, BN>(p);
  if (w.t_begin >= w.t_end) return write_empty_split<NT>(p, w, tid);
  const int r = w.r, qi = w.qi, nkeys = w.nkeys, niter = w.t_end - w.t_begin;

  // Prologue (both warpgroups): Q rows (zero past nrows) and the first tile.
  for (int idx = tid; idx < MR * NCH; idx += NT) {
    const int row = idx / NCH, c = idx - row * NCH;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row < w.nrows) {
      int i, h;
      row_coords(p, qi, w.row0 + row, i, h);
      val = load_q8(p, r, i, h, c);
    }
    *reinterpret_cast<uint4 *>(Qs + mla::sw128_off(MR, row, c)) = val;
  }
  {
    const int n = tid / TPK, j = tid - n * TPK;
    int page, off;
    token_of<BN>(p, r, qi, nkeys, w.t_begin, n, page, off);
    issue_key<DQK>(p, Kbase, nullptr, n, j, page, off);
    if (j == 0) tok_ok[n] = page >= 0;
    mla::cp_async_commit();
    mla::cp_async_wait<0>();
  }
  mla::fence_proxy_async();
  __syncthreads();

  const int rA = warp * 16 + g, rB = rA + 8;
  float o[128];
#pragma unroll
  for (int e = 0; e < 128; e++) o[e] = 0.f;

  if (wgi == 0) {
    int lim[2] = {0x7fffffff, 0x7fffffff};
    if (!p.sparse && p.causal && p.s_q > 1) {
      lim[0] = w.s_k - p.s_q + (w.row0 + rA) / p.h_q;
      lim[1] = w.s_k - p.s_q + (w.row0 + rB) / p.h_q;
    }
    float m_run[2] = {-CUDART_INF_F, -CUDART_INF_F}, l_run[2] = {0.f, 0.f};
    const uint32_t q_addr = mla::smem_addr(Qs);
    for (int u = 0; u < niter; u++) {
      const int t = w.t_begin + u, b = u & 1;
      if (u > 0) mla::bar_sync(BAR_FULL0 + b, NT);
      const uint32_t k_addr = mla::smem_addr(Kbase + b * TILE);
      float s[32];
#pragma unroll
      for (int e = 0; e < 32; e++) s[e] = 0.f;
      mla::fence_regs(s);
      mla::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < DQK / 16; kk++) {
        const uint32_t off = (kk >> 2) * BLK + (kk & 3) * 32;
        mla::wgmma_m64n64k16_bf16(s, mla::wgmma_desc(q_addr + off, 16, 1024), mla::wgmma_desc(k_addr + off, 16, 1024), 1);
      }
      mla::wgmma_commit();
      mla::wgmma_wait<0>();
      mla::fence_regs(s);

      // mask, scale; the quad holds whole rows
      const int *ok_t = tok_ok + b * BN;
      float mx[2] = {-CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
      for (int e = 0; e < 32; e++) {
        const int col = (e >> 2) * 8 + 2 * t4 + (e & 1), hh = (e >> 1) & 1;
        const bool ok = ok_t[col] && t * BN + col <= lim[hh];
        s[e] = ok ? s[e] * p.scale_log2 : -CUDART_INF_F;
        mx[hh] = fmaxf(mx[hh], s[e]);
      }
      float alpha[2], base[2];
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        const float m = fmaxf(m_run[hh], quad_max(mx[hh]));
        alpha[hh] = m_run[hh] == -CUDART_INF_F ? 0.f : exp2f(m_run[hh] - m);
        base[hh] = m == -CUDART_INF_F ? 0.f : m;
        m_run[hh] = m;
      }
      uint32_t pf[16]; // P as bf16 pairs: pf[2j + hh] = row hh, keys 8j + 2t4..
      float ps[2] = {0.f, 0.f};
#pragma unroll
      for (int j = 0; j < 8; j++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
          const float p0 = exp2f(s[4 * j + 2 * hh] - base[hh]), p1 = exp2f(s[4 * j + 2 * hh + 1] - base[hh]);
          ps[hh] += p0 + p1;
          pf[2 * j + hh] = mla::pack_bf16x2(p0, p1);
        }
      l_run[0] = l_run[0] * alpha[0] + ps[0], l_run[1] = l_run[1] * alpha[1] + ps[1];

      // hand P and alpha to warpgroup 1 once it is done with the previous ones
      if (u > 0) mla::bar_sync(BAR_P_EMPTY, NT);
#pragma unroll
      for (int j = 0; j < 8; j++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++)
          *reinterpret_cast<uint32_t *>(Ps + mla::sw128_off(MR, hh ? rB : rA, j) + 4 * t4) = pf[2 * j + hh];
      if (t4 == 0) alpha_s[rA] = alpha[0], alpha_s[rB] = alpha[1];
      mla::fence_proxy_async();
      mla::bar_arrive(BAR_P_FULL, NT);

      if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int e = 0; e < 128; e++) o[e] *= alpha[(e >> 1) & 1];
      }
      mla::fence_regs(o);
      mla::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; kk++) {
        // A fragment of keys 16kk..: (g, 2t4..), (g+8, 2t4..), (g, 2t4+8..), (g+8, 2t4+8..)
        const uint32_t a[4] = {pf[4 * kk], pf[4 * kk + 1], pf[4 * kk + 2], pf[4 * kk + 3]};
        mla::wgmma_m64n256k16_bf16_rs_tb(o, a, mla::wgmma_desc(k_addr + kk * 16 * 128, BLK, 1024), 1);
      }
      mla::wgmma_commit();
      mla::wgmma_wait<0>();
      mla::fence_regs(o);
      if (t + 2 < w.t_end) mla::bar_arrive(BAR_EMPTY0 + b, NT); // buffer b may take tile t + 2
    }
    // row sums, the normalization (and sink) factor for both halves, the LSE
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int row = hh ? rB : rA;
      const float l = quad_sum(l_run[hh]);
      const float lse2 = l > 0.f ? m_run[hh] + log2f(l) : -CUDART_INF_F;
      float f = l > 0.f ? 1.0f / l : 0.f;
      int i, h;
      row_coords(p, qi, w.row0 + row, i, h);
      if (p.nsplits == 1 && p.sink && l > 0.f && row < w.nrows)
        f *= 1.0f / (1.0f + expf(__ldg(p.sink + h) - lse2 * 0.69314718055994531f));
      if (t4 == 0) fin_s[row] = f;
      if (t4 == 0 && row < w.nrows) {
        if (p.nsplits > 1) p.lse_acc[w.part + w.row0 + row] = lse2;
        else p.lse[((int64_t)r * p.h_q + h) * p.s_q + i] = l > 0.f ? lse2 * 0.69314718055994531f : CUDART_INF_F;
      }
    }
  } else {
    const int lt = tid - 128, kn = lt >> 1, kj = lt & 1; // loader: key row kn, half kj
    int nx_page, nx_off;
    token_of<BN>(p, r, qi, nkeys, w.t_begin + 1, kn, nx_page, nx_off);
    const uint32_t p_addr = mla::smem_addr(Ps);
    for (int u = 0; u < niter; u++) {
      const int t = w.t_begin + u, b = u & 1, nb = b ^ 1;
      if (t + 1 < w.t_end) {
        if (u > 0) mla::bar_sync(BAR_EMPTY0 + nb, NT);
        const unsigned char *base = p.v.base;
        const bool ok = nx_page >= 0;
        const unsigned char *row = ok ? base + (int64_t)nx_page * p.v.page_stride + p.d.region_off[0] +
                                            (int64_t)nx_off * p.v.token_stride + p.id_off
                                      : base;
        unsigned char *kt = Kbase + nb * TILE;
#pragma unroll 6
        for (int c = kj; c < NCH; c += 2)
          mla::cp_async16(mla::smem_addr(kt + mla::sw128_off(BN, kn, c)), ok ? row + c * 16 : base, ok ? 16 : 0);
        mla::cp_async_commit();
        if (kj == 0) tok_ok[nb * BN + kn] = ok;
        token_of<BN>(p, r, qi, nkeys, t + 2, kn, nx_page, nx_off);
      }
      mla::bar_sync(BAR_P_FULL, NT);
      const float al[2] = {alpha_s[rA], alpha_s[rB]};
      if (__any_sync(0xffffffffu, al[0] != 1.f || al[1] != 1.f)) {
#pragma unroll
        for (int e = 0; e < 128; e++) o[e] *= al[(e >> 1) & 1];
      }
      const uint32_t v_addr = mla::smem_addr(Kbase + b * TILE) + 4 * BLK;
      mla::fence_regs(o);
      mla::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; kk++)
        mla::wgmma_m64n256k16_bf16_tb(o, mla::wgmma_desc(p_addr + kk * 32, 16, 1024),
                                      mla::wgmma_desc(v_addr + kk * 16 * 128, BLK, 1024), 1);
      mla::wgmma_commit();
      if (t + 1 < w.t_end) {
        mla::cp_async_wait<0>();
        mla::fence_proxy_async();
        mla::bar_arrive(BAR_FULL0 + nb, NT);
      }
      mla::wgmma_wait<0>();
      mla::fence_regs(o);
      if (u + 1 < niter) mla::bar_arrive(BAR_P_EMPTY, NT);
    }
  }
  __syncthreads(); // fin_s

  // Epilogue: warpgroup w writes value dims 256w..
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int row = hh ? rB : rA;
    if (row >= w.nrows) continue;
    const float f = fin_s[row];
#pragma unroll
    for (int j = 0; j < 32; j++) {
      const int col = wgi * 256 + j * 8 + 2 * t4;
      const float x0 = o[4 * j + 2 * hh] * f, x1 = o[4 * j + 2 * hh + 1] * f;
      if (p.nsplits > 1) *reinterpret_cast<float2 *>(p.o_acc + (w.part + w.row0 + row) * DV + col) = make_float2(x0, x1);
      else *reinterpret_cast<uint32_t *>(p.out + ((int64_t)w.prob * p.rows + w.row0 + row) * DV + col) = mla::pack_bf16x2(x0, x1);
    }
  }
#else
  __trap(); // the launcher only picks this kernel where sm_90a code exists
#endif
}

} // namespace wg
} // namespace mla_attn

#endif
