// The Hopper decode kernel for 64-row tiles (h_q x s_q > 32, e.g. 128 heads):
// warpgroup MMA (wgmma) with operands in shared memory, so the tensor cores
// read Q, K and P without register staging, and specialized warpgroups so
// that they always have work queued. One CTA per (problem, 64-row chunk) x KV
// split, K tiles of KB keys, three warpgroups:
//   warpgroup 0: S = Q K^T (m64nKBk16 over all d_qk), the online softmax in
//     base 2 (a quad holds whole rows), P and the rescale factors handed over
//     through shared memory; then the next tile's S;
//   warpgroups 1 and 2: fill the K tiles, and O = alpha O + P V for value dims
//     0..255 and 256..511 (m64n256k16, V read MN-major from the same K tile)
//     while warpgroup 0 is on the next tile's S.
// How the K tiles are filled (the mode):
//   WG_BF16: plain bf16 rows, copied by cp.async straight into the swizzled
//     tile (KB = 64, two tiles).
//   WG_REGS: a built-in fp8 layout on a 16-byte aligned view: each thread
//     loads its share of one key's token row into registers a tile ahead and
//     converts it into the other K buffer: before waiting for P, so that the
//     conversion of tile u + 1 overlaps S(u) and P V(u) overlaps S(u + 1); or,
//     for layouts without scale exponents (pv_first), once P V(u) is issued,
//     so that the tensor cores run P V(u) during the conversion
//     (KB = 64, two tiles, no raw stage; attn_wg_regs.cuh). The fp8
//     built-ins run in codes mode (rf_codes_ok): f16 K blocks of code x
//     f16(s / 2^E), f16 Q and P; bf16 RoPE blocks (and for fp8_v4 one e4m3
//     block, see rf_codes_lead) stay bf16, with a bf16 twin of P for those
//     value dims.
//   WG_STAGED: other layouts: raw bytes in a stage (KB = 32, three bf16
//     tiles) dequantized through the layout's chunk plans (mla/dequant_chunk.cuh).
// setmaxnreg moves registers from warpgroup 0 to the accumulator holders.
// Named barriers hand over the tiles and P. Work split, masks and epilogue
// semantics are the generic kernel's (attn_decode_kernel.cuh). sm_90a only:
// the launcher picks it on compute capability 9.0 when the binary carries
// sm_90a code.
#ifndef MLA_ATTN_DECODE_WG_CUH
#define MLA_ATTN_DECODE_WG_CUH

#include <type_traits>

#include "attn_decode_kernel.cuh"
#include "attn_spec_layouts.cuh"
#include "attn_wg_regs.cuh" // register-fed tiles: rf_key, codes mode
#include "mla/wgmma.cuh"

namespace mla_attn {
namespace wg {

constexpr int MR = 64;  // query rows per CTA
constexpr int NT = 384; // three warpgroups: S and softmax; P V (and loads) for each half of the value dims
// Per-thread registers after setmaxnreg. An increase is served only from what
// warpgroups of the same CTA released: 128 (168 - REG_S) >= 256 (REG_PV - 168),
// 168 being the launch budget of 384 threads; else the increase waits forever.
constexpr int REG_LAUNCH = 168, REG_S = 104, REG_PV = 200;
static_assert(128 * (REG_LAUNCH - REG_S) >= 256 * (REG_PV - REG_LAUNCH), "setmaxnreg: more registers asked than released");
constexpr int BLK_Q = MR * 128; // one 64-row x 64-dim swizzled block of bf16

// Keys per unit of the KV split: a split's first tile may start mid-way
// through a 64-key tile, so short problems split as finely as with 32-key tiles.
constexpr int SPLIT_KEYS = 32;

enum wg_mode : int { WG_BF16 = 0, WG_STAGED = 1, WG_REGS = 2 };
// Keys per tile: 64, or 32 for staged layouts, whose raw stage and third K
// buffer must fit too.
__host__ __device__ constexpr int tile_keys(int mode) { return mode == WG_STAGED ? 32 : 64; }
// bf16 K buffers and P tiles: plain bf16 rows 2 and 1; staged layouts 3 and
// 2, so that dequantizing tile u + 1 never waits for the P V of tile u - 1;
// register-fed 2 and 2, so that the softmax of tile u + 1 never waits for
// P V(u).
__host__ __device__ constexpr int k_buffers(int mode) { return mode == WG_STAGED ? 3 : 2; }
__host__ __device__ constexpr int p_buffers(int mode) { return mode == WG_BF16 ? 1 : 2; }
// Register-fed 576-dim K: P(u) lives in K buffer u's last 64-dim block (the
// RoPE dims, which only S(u) reads), so its two P tiles take no shared memory
// of their own (two separate ones would not fit beside Q and the K buffers).
__host__ __device__ constexpr bool p_in_k(int mode, int dqk) { return mode == WG_REGS && dqk == DV + 64; }

enum : int { BAR_FULL0 = 1, BAR_P_FULL0 = 4, BAR_P_EMPTY0 = 6, BAR_LOADER = 8 }; // 3 FULL, 2 P_FULL, 2 P_EMPTY

struct smem_plan {
  int q, k, p, raw, raw_ok, plan, alpha, fin, tok_ok, misc, total;
};

// Offsets from the 1024-aligned start of the dynamic window; total includes
// the alignment slack. Staged layouts have one raw stage.
template <int DQK> __host__ __device__ constexpr smem_plan make_smem_plan(int mode, int stage_pitch) {
  const int kb = tile_keys(mode);
  const bool staged = mode == WG_STAGED;
  smem_plan s{};
  int o = 0;
  s.q = o, o += DQK / 64 * BLK_Q;
  s.k = o, o += k_buffers(mode) * (DQK / 64) * kb * 128;
  // 64 rows x 128 bytes (kb = 32 uses half of each row); register-fed: a bf16
  // twin of each P tile for layouts with bf16 value dims (codes_of::mixed)
  s.p = o, o += p_in_k(mode, DQK) ? 0 : p_buffers(mode) * BLK_Q * (mode == WG_REGS ? 2 : 1);
  s.raw = o, o += staged ? (kb * stage_pitch + 15) / 16 * 16 : 0;
  s.raw_ok = o, o += staged ? kb * 4 : 0;
  s.plan = o, o += staged ? DQK / 8 * 16 : 0;
  s.alpha = o, o += 2 * MR * 4; // tile u's rescale factors at (u % 2) * MR
  s.fin = o, o += MR * 4;
  s.tok_ok = o, o += k_buffers(mode) * kb * 4;
  s.misc = o, o += 32 * 4; // codes mode: Q's warp maxima [0, 12), tile scale-exponent maxima [16, 18), tile E [18, 20)
  s.total = o + 1024;
  return s;
}

// Starts the copies of key n's row, this thread's share (16-byte chunks j, j + 8, ...):
// plain bf16 into the swizzled K tile (kb rows), or each region's raw row into the stage.
template <int DQK, int KB>
__device__ __forceinline__ void issue_key(const params &p, unsigned char *kt, unsigned char *stage, int n, int j, int page,
                                          int off) {
  const bool ok = page >= 0;
  const unsigned char *base = p.v.base;
  const unsigned char *page_base = base + (ok ? (int64_t)page * p.v.page_stride : 0);
  if (p.identity) {
    const unsigned char *row = ok ? page_base + p.d.region_off[0] + (int64_t)off * p.v.token_stride + p.id_off : base;
#pragma unroll
    for (int c = j; c < DQK / 8; c += 8) mla::cp_async16(mla::smem_addr(kt + mla::sw128_off(KB, n, c)), ok ? row + c * 16 : base, ok ? 16 : 0);
    return;
  }
  for (int r = 0; r < p.d.nregions; r++) {
    unsigned char *dst = stage + n * p.stage_pitch + p.reg_stage_off[r];
    if (p.d.region_chunk[r] > 0) {
      stage_pieces(p, r, page_base, off, dst, j, ok);
      continue;
    }
    const int64_t rstride = r == 0 ? p.v.token_stride : (int64_t)p.d.region_row_bytes[r];
    const unsigned char *row = ok ? page_base + p.d.region_off[r] + (int64_t)off * rstride : base;
    const int bytes = p.reg_bytes[r];
    switch (p.reg_gran[r]) {
    case 16:
      for (int c = j; c < bytes / 16; c += 8) mla::cp_async16(mla::smem_addr(dst + c * 16), ok ? row + c * 16 : base, ok ? 16 : 0);
      break;
    case 8:
      for (int c = j; c < bytes / 8; c += 8) mla::cp_async8(mla::smem_addr(dst + c * 8), ok ? row + c * 8 : base, ok ? 8 : 0);
      break;
    case 4:
      for (int c = j; c < bytes / 4; c += 8) mla::cp_async4(mla::smem_addr(dst + c * 4), ok ? row + c * 4 : base, ok ? 4 : 0);
      break;
    default: // an unaligned view: plain byte copies
      for (int c = j; c < bytes; c += 8) dst[c] = ok ? row[c] : 0;
    }
  }
}

// S accumulators of one tile: m64n32k16 or m64n64k16 by the tile's key count.
template <int KB> __device__ __forceinline__ void wgmma_s(float (&s)[KB / 2], uint64_t da, uint64_t db) {
  if constexpr (KB == 64) mla::wgmma_m64n64k16_bf16(s, da, db, 1);
  else mla::wgmma_m64n32k16_bf16(s, da, db, 1);
}

// 2^x for the softmax weights (x <= 0): one MUFU.EX2; exp2f adds a range fix-up
// (three instructions) for results below 2^-126, weights that vanish next to
// the row's 1.0 anyway.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The 16-row kernels (keys on M): the maxima over a tile's keys of the four
// queries a thread holds (mx[j][e1], query 8j + 2 t4 + e1), over the warp's
// lanes of one t4, then per warp into sm[query * 4 + warp]; after a barrier
// of the warpgroup, keys_max reads a query's maximum over its four warps.
__device__ __forceinline__ void share_keys_max(const float (&mx)[2][2], float *sm, int warp, int g, int t4) {
#pragma unroll
  for (int j = 0; j < 2; j++)
#pragma unroll
    for (int e1 = 0; e1 < 2; e1++) {
      float x = mx[j][e1];
      x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
      x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
      x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
      if (g == 0) sm[(8 * j + 2 * t4 + e1) * 4 + warp] = x;
    }
}
__device__ __forceinline__ float keys_max(const float *sm, int query) {
  const float4 t = *reinterpret_cast<const float4 *>(sm + query * 4);
  return fmaxf(fmaxf(t.x, t.y), fmaxf(t.z, t.w));
}

// The 16-row kernels' softmax state of a thread's four queries (query
// 8j + 2 t4 + e1 at [j][e1]): the causal key limit, the running max, and the
// row sums over this thread's keys of the weights (l) and of the f16-rounded
// weights P V uses (lr).
struct rows16 {
  int lim[2][2];
  float m[2][2], l[2][2], lr[2][2];
  __device__ __forceinline__ rows16(const params &p, const cta_work &w, int t4) {
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
      for (int e1 = 0; e1 < 2; e1++) {
        lim[j][e1] = !p.sparse && p.causal && p.s_q > 1 ? w.s_k - p.s_q + (w.row0 + 8 * j + 2 * t4 + e1) / p.h_q : 0x7fffffff;
        m[j][e1] = -CUDART_INF_F, l[j][e1] = lr[j][e1] = 0.f;
      }
  }
  // A tile's step of the running max (lazy rescaling, online_max): from the
  // tile's maxima in sm (share_keys_max, after the warpgroup's barrier), each
  // query's factor on the old sums and O, and the base its weights take.
  __device__ __forceinline__ void next_max(const float *sm, int t4, float (&alpha)[2][2], float (&base)[2][2]) {
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
      for (int e1 = 0; e1 < 2; e1++)
        alpha[j][e1] = online_max(m[j][e1], fmaxf(m[j][e1], keys_max(sm, 8 * j + 2 * t4 + e1)), base[j][e1]);
  }
  // The sums over the warp's lanes of one t4, per warp into ls[warp * 16 + query]
  // (l) and ls[64 + warp * 16 + query] (lr).
  __device__ __forceinline__ void share_sums(float *ls, int warp, int g, int t4) const {
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
      for (int e1 = 0; e1 < 2; e1++) {
        float a = l[j][e1], b = lr[j][e1];
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) a += __shfl_xor_sync(0xffffffffu, a, o), b += __shfl_xor_sync(0xffffffffu, b, o);
        const int q = 8 * j + 2 * t4 + e1;
        if (g == 0) ls[warp * 16 + q] = a, ls[64 + warp * 16 + q] = b;
      }
  }
};

// MODE: wg_mode. LS: the built-in layout's spec type (WG_REGS), else void.
template <int DQK, int MODE, class LS>
__global__ void __launch_bounds__(NT, 1) attn_decode_wg_kernel(const __grid_constant__ params p) {
#if MLA_HAVE_WGMMA
  constexpr bool STAGED = MODE == WG_STAGED, REGS = MODE == WG_REGS;
  static_assert(REGS ? rf_allowed<LS, DQK>() : std::is_void<LS>::value, "register-fed tiles need a built-in layout that allows them");
  constexpr int KB = tile_keys(MODE);
  constexpr int NCH = DQK / 8, BLK_K = KB * 128, TILE = (DQK / 64) * BLK_K, NPASS = KB / 32; // keys per loader pass: 32
  constexpr int NKB = k_buffers(MODE), NPB = p_buffers(MODE);
  constexpr bool PK = p_in_k(MODE, DQK);
  // register-fed: P tile u % 2 is free again by the time warpgroup 0 reaches
  // tile u + 2 (see p_tile), so no P_EMPTY hand-over
  constexpr bool P_FREE = REGS;
  constexpr bool RSUM = MODE != WG_BF16; // normalize by the sum of the rounded P (plain bf16 rows: no dequant error to leave room for)
  using CO = codes_of<LS, DQK>;
  constexpr bool CODES = CO::on, HAS_E = CO::has_e, MIXED = CO::mixed; // see rf_codes_ok
  // Register-fed tiles converted once P V is issued: the tensor cores then run
  // P V(u) while tile u + 1 converts, instead of idling until S(u + 1)
  // (fp8_pertensor h128 8-9% faster). Not with scale exponents: there every
  // form tried (tile u + 1's exponents gathered behind the loaders' barrier,
  // from its scale windows loaded a tile ahead, or one E for the whole split)
  // was even to 11% slower, the scaled conversion (HMUL2) apparently competing
  // with P V (bench/RESULTS.md, thirty-second session).
  constexpr bool PV_FIRST = REGS && !HAS_E;
  static_assert(!MIXED || !PK, "a bf16 P twin needs P tiles of its own");
  extern __shared__ __align__(16) unsigned char smem_window[];
  unsigned char *smem = smem_window + ((1024 - (mla::smem_addr(smem_window) & 1023)) & 1023);
  const smem_plan L = make_smem_plan<DQK>(MODE, p.stage_pitch);
  unsigned char *Qs = smem + L.q, *Kbase = smem + L.k, *Pbase = smem + L.p, *raw = smem + L.raw;
  int *raw_ok = reinterpret_cast<int *>(smem + L.raw_ok);
  mla::chunk_plan *plan = reinterpret_cast<mla::chunk_plan *>(smem + L.plan);
  float *alpha_s = reinterpret_cast<float *>(smem + L.alpha);
  // Tile u's P: its K buffer's RoPE block, or P buffer u % NPB. Register-fed
  // tiles skip P_EMPTY: warpgroup 0 writes P(u + 2) after S(u + 2), which needs
  // FULL(u + 2), which warpgroups 1 and 2 arrive on after P V(u) completed. So
  // P_FULL alternates between two barriers, each arrived on again only after
  // its previous phase completed (P_FULL(u + 2) needs FULL(u + 2), arrived on
  // after the sync on P_FULL(u)).
  auto p_tile = [&](int u) {
    return PK ? Kbase + (u % NKB) * TILE + (DV / 64) * BLK_K : Pbase + (u % NPB) * BLK_Q;
  };
  auto p_twin = [&](int u) { return Pbase + (NPB + u % NPB) * BLK_Q; }; // MIXED: bf16 P
  float *fin_s = reinterpret_cast<float *>(smem + L.fin);
  int *tok_ok = reinterpret_cast<int *>(smem + L.tok_ok);
  int *qmax_w = reinterpret_cast<int *>(smem + L.misc), *emax_s = qmax_w + 16, *e_s = qmax_w + 18;

  const int tid = threadIdx.x, wgi = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const cta_work w = cta_work_of<MR, SPLIT_KEYS>(p);
  if (w.t_begin >= w.t_end) return write_empty_split<NT>(p, w, tid);
  // this split's keys [k0, k1), in tiles of KB from k0
  const int r = w.r, qi = w.qi, k0 = w.t_begin * SPLIT_KEYS, k1 = min(w.t_end * SPLIT_KEYS, w.nkeys);
  const int niter = (k1 - k0 + KB - 1) / KB;
  // slot of key n of tile u (page -1: none)
  auto key_slot = [&](int u, int n, int &page, int &off) { token_of<1>(p, r, qi, k1, k0 + u * KB, n, page, off); };

  // Prologue (all): plans, Q rows (zero past nrows).
  const float tscale = STAGED ? setup_plans<NCH>(p, plan, tid, NT) : REGS && p.v.tensor_scale ? __ldg(p.v.tensor_scale) : 1.0f;
  uint32_t qmx = 0; // codes mode: largest finite |q| of the f16 blocks, bits
  load_q_rows<MR, NCH, NT>(p, w, tid, [&](int row, int c, uint4 val) {
    *reinterpret_cast<uint4 *>(Qs + mla::sw128_off(MR, row, c)) = val;
    if (CODES && ((CO::f16_blocks >> (c / 8)) & 1))
      qmx = max(qmx, max(max(bf16x2_absmax(val.x), bf16x2_absmax(val.y)), max(bf16x2_absmax(val.z), bf16x2_absmax(val.w))));
  });
  // Codes mode: Q x 2^-qk, f16 in the f16 blocks (exact; every finite |q|
  // below 2^15), bf16 elsewhere.
  int qk = 0;
  if constexpr (CODES) qk = codes_q<CO, MR, NCH, NT>(Qs, qmx, qmax_w, emax_s, tid, lane);

  const int rA = warp * 16 + g, rB = rA + 8;
  if (wgi == 0) {
    // Warpgroup 0: S, softmax, P.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REG_S));
    mla::fence_proxy_async(); // this thread's Q rows, for the tensor cores
    __syncthreads();          // Q, plans
    __syncthreads();          // tile 0
    int lim[2] = {0x7fffffff, 0x7fffffff};
    if (!p.sparse && p.causal && p.s_q > 1) {
      lim[0] = w.s_k - p.s_q + (w.row0 + rA) / p.h_q;
      lim[1] = w.s_k - p.s_q + (w.row0 + rB) / p.h_q;
    }
    // running max; row sums of P (for the LSE) and of P as rounded for P V (the normalization)
    float m_run[2] = {-CUDART_INF_F, -CUDART_INF_F}, l_run[2] = {0.f, 0.f}, lr_run[2] = {0.f, 0.f};
    const mla::wgmma_sdesc qd = mla::wgmma_sdesc_of(mla::smem_addr(Qs), 16, 1024);
    const float s_fac = p.scale_log2 * pow2i(qk) * (CO::tensor ? tscale : 1.0f);
    for (int u = 0; u < niter; u++) {
      const int kb = u % NKB, pb = u % NPB;
      if (u > 0) mla::bar_sync(BAR_FULL0 + kb, NT);
      // descriptor bases (mla::wgmma_sdesc): one add a wgmma
      const mla::wgmma_sdesc kd = mla::wgmma_sdesc_of(mla::smem_addr(Kbase + kb * TILE), 16, 1024), qdu = qd.fresh();
      float s[KB / 2];
#pragma unroll
      for (int e = 0; e < KB / 2; e++) s[e] = 0.f;
      mla::fence_regs(s);
      mla::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < DQK / 16; kk++) {
        const mla::wgmma_sdesc da = qdu + ((kk >> 2) * BLK_Q + (kk & 3) * 32), db = kd + ((kk >> 2) * BLK_K + (kk & 3) * 32);
        if constexpr (CODES) {
          if ((CO::f16_blocks >> (kk >> 2)) & 1) mla::wgmma_m64n64k16_f16(s, da, db, 1);
          else wgmma_s<KB>(s, da, db);
        } else wgmma_s<KB>(s, da, db);
      }
      mla::wgmma_commit();
      // codes mode: S is in units of 2^(qk + E(u)) (and of the tensor scale)
      const float fac = CODES ? s_fac * (HAS_E ? pow2i(e_s[u & 1]) : 1.0f) : p.scale_log2;
      mla::wgmma_wait<0>();
      mla::fence_regs(s);

      // mask, scale; the quad holds whole rows
      const int *ok_t = tok_ok + kb * KB;
      float mx[2] = {-CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
      for (int e = 0; e < KB / 2; e++) {
        const int col = (e >> 2) * 8 + 2 * t4 + (e & 1), hh = (e >> 1) & 1;
        const bool ok = ok_t[col] && k0 + u * KB + col <= lim[hh];
        s[e] = ok ? s[e] * fac : -CUDART_INF_F;
        mx[hh] = fmaxf(mx[hh], s[e]);
      }
      // lazy rescaling (online_max): most tiles leave O alone (alpha = 1
      // skips the P V warpgroups' 128 multiplies); P reaches up to
      // 2^RESCALE_LOG2, exact enough in f16 / bf16 and far from their range
      float alpha[2], base[2];
#pragma unroll
      for (int hh = 0; hh < 2; hh++) alpha[hh] = online_max(m_run[hh], fmaxf(m_run[hh], quad_max(mx[hh])), base[hh]);
      uint32_t pf[KB / 4]; // P as bf16 pairs: pf[2j + hh] = row hh, keys 8j + 2t4..
      float ps[2] = {0.f, 0.f}, pr[2] = {0.f, 0.f};
#pragma unroll
      for (int j = 0; j < KB / 8; j++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
          const float p0 = exp2_ftz(s[4 * j + 2 * hh] - base[hh]), p1 = exp2_ftz(s[4 * j + 2 * hh + 1] - base[hh]);
          // dequantized layouts: the output divides by the sum of the weights P V
          // uses (bf16), so it is their exact average (rows near FlashMLA's cosine
          // bound need it); the LSE keeps the unrounded sum
          const uint32_t pk = CODES ? mla::pack_f16x2(p0, p1) : mla::pack_bf16x2(p0, p1);
          if constexpr (MIXED) // P tile u's twin is free as the tile is (P_FREE)
            *reinterpret_cast<uint32_t *>(p_twin(u) + mla::sw128_off(MR, hh ? rB : rA, j) + 4 * t4) = mla::pack_bf16x2(p0, p1);
          ps[hh] += p0 + p1;
          if constexpr (CODES) {
            const float2 pq = __half22float2(*reinterpret_cast<const __half2 *>(&pk));
            pr[hh] += pq.x + pq.y;
          } else if constexpr (RSUM) pr[hh] += __uint_as_float(pk << 16) + __uint_as_float(pk & 0xFFFF0000u);
          pf[2 * j + hh] = pk;
        }
#pragma unroll
      for (int hh = 0; hh < 2; hh++) l_run[hh] = l_run[hh] * alpha[hh] + ps[hh], lr_run[hh] = lr_run[hh] * alpha[hh] + pr[hh];

      // hand P and alpha over once the P V warpgroups are done with this buffer's previous P
      if (!P_FREE && u >= NPB) mla::bar_sync(BAR_P_EMPTY0 + pb, NT);
      unsigned char *Ps = p_tile(u);
#pragma unroll
      for (int j = 0; j < KB / 8; j++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++)
          *reinterpret_cast<uint32_t *>(Ps + mla::sw128_off(MR, hh ? rB : rA, j) + 4 * t4) = pf[2 * j + hh];
      if (t4 == 0) alpha_s[(u & 1) * MR + rA] = alpha[0], alpha_s[(u & 1) * MR + rB] = alpha[1];
      mla::fence_proxy_async();
      mla::bar_arrive(BAR_P_FULL0 + pb, NT);
    }
    // row sums, the normalization (and sink) factor, the LSE
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int row = hh ? rB : rA;
      const float l = quad_sum(l_run[hh]), lr = RSUM ? quad_sum(lr_run[hh]) : l;
      // empty only at 0: a NaN sum stays NaN (write_lse)
      const float lse2 = l != 0.f ? m_run[hh] + log2f(l) : -CUDART_INF_F;
      float f = l != 0.f && lr != 0.f ? 1.0f / lr : 0.f;
      int i = 0, h = 0;
      if (row < w.nrows) row_coords(p, qi, w.row0 + row, i, h);
      if (p.nparts == 1 && p.sink && l != 0.f && row < w.nrows)
        f *= 1.0f / (1.0f + expf(__ldg(p.sink + h) - lse2 * 0.69314718055994531f));
      if (t4 == 0) fin_s[row] = f;
      if (t4 == 0 && row < w.nrows) {
        if (p.nparts > 1) p.lse_acc[w.part + w.row0 + row] = lse2;
        else p.lse[((int64_t)r * p.h_q + h) * p.s_q + i] = l != 0.f ? lse2 * 0.69314718055994531f : CUDART_INF_F;
      }
    }
    __syncthreads(); // fin_s
    return;
  }

  // Warpgroups 1 and 2: K tiles (copies, dequant) and O = alpha O + P V for
  // value dims 256 (wgi - 1)..
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REG_PV));
  const int lt = tid - 128, lj = lt & 7, ln = lt >> 3; // loader: chunk lane lj of keys ln + 32 i
  const int wgi_u = __shfl_sync(0xffffffffu, wgi, 0);  // warp-uniform, for the descriptor bases
  int next = 0, nx_page[NPASS], nx_off[NPASS];     // the next tile to issue, its keys' slots
  auto lookup = [&]() {
#pragma unroll
    for (int i = 0; i < NPASS; i++) key_slot(next, ln + 32 * i, nx_page[i], nx_off[i]);
  };
  // Starts the next tile's copies: into its K buffer, or into the raw stage.
  auto issue_next = [&]() {
    if (next < niter) {
      unsigned char *kt = Kbase + (next % NKB) * TILE;
#pragma unroll
      for (int i = 0; i < NPASS; i++) {
        const int n = ln + 32 * i;
        issue_key<DQK, KB>(p, kt, raw, n, lj, nx_page[i], nx_off[i]);
        if (lj == 0) (STAGED ? raw_ok : tok_ok + (next % NKB) * KB)[n] = nx_page[i] >= 0;
      }
    }
    mla::cp_async_commit();
    next++;
    lookup();
  };
  // Dequantizes tile u from the raw stage into its K buffer: lane = key, and
  // warp w of the eight takes chunks w, w + 8, ..., so every chunk plan (and
  // its branch) is uniform across the warp.
  auto dequant_tile = [&](int u) {
    if constexpr (STAGED) {
      const int n = lt & 31, wq = lt >> 5;
      const unsigned char *row = raw + n * p.stage_pitch;
      unsigned char *kt = Kbase + (u % NKB) * TILE;
#pragma unroll
      for (int i = 0; i < NCH / 8; i++) {
        const int c = wq + 8 * i;
        *reinterpret_cast<uint4 *>(kt + mla::sw128_off(KB, n, c)) = mla::dequant_chunk_bf16(plan[c], row, tscale);
      }
      if (lt < KB) tok_ok[(u % NKB) * KB + lt] = raw_ok[lt];
    }
  };

  // Register-fed tiles: this thread's quarter q4 of key n4, the next tile's in flight.
  typename rf_holder<LS, DQK, REGS>::type rf;
  const int n4 = lt >> 2, q4 = lt & 3;
  // rf_load(u) resolves tile u's slot, fetched one tile earlier, and fetches tile u + 1's
  slot_entry rf_next{-1, -1};
  auto rf_load = [&](int u) {
    if constexpr (REGS) {
      int page, off;
      slot_resolve<rf_block_size<LS>()>(p, rf_next, page, off);
      rf.load(p, page, off, q4);
      rf_next = slot_fetch<1, rf_block_size<LS>()>(p, r, qi, k1, k0 + (u + 1) * KB, n4);
    }
  };
  // Codes mode: E of tiles u - 1, u and u + 1 at iteration u (the split's
  // running maximum, so O's units only shrink); each tile's largest scale
  // exponent gathered by atomicMax one tile ahead.
  int e_prev = E_MIN, e_cur = E_MIN, e_nx = E_MIN;
  auto e_gather = [&](int u) {
    if constexpr (HAS_E) gather_scale_exp(rf.scale_exp(), emax_s + (u & 1), lane);
  };
  auto e_of = [&](int u, int e_before) { return tile_exponent(emax_s[u & 1], e_before); }; // after the barrier that follows e_gather(u)
  auto rf_store = [&](int u, int e) {
    if constexpr (REGS) {
      if constexpr (CODES) {
        rf.template store_codes<KB, HAS_E>(Kbase + (u % NKB) * TILE, n4, q4, pow2i(-e));
        if (HAS_E && lt == 0) e_s[u & 1] = e;
      } else rf.template store<KB>(Kbase + (u % NKB) * TILE, n4, q4, tscale);
      if (q4 == 0) tok_ok[(u % NKB) * KB + n4] = rf.ok;
    }
  };

  if constexpr (REGS) {
    rf_next = slot_fetch<1, rf_block_size<LS>()>(p, r, qi, k1, k0, n4);
    rf_load(0);
    e_gather(0);
    __syncthreads(); // Q
    if (HAS_E) e_cur = e_prev = e_nx = e_of(0, E_MIN);
    rf_store(0, e_cur);
    if (niter > 1) rf_load(1);
  } else {
    lookup();
    issue_next(); // tile 0
    mla::cp_async_wait<0>();
    __syncthreads(); // plans, tile 0's rows
    if (STAGED) {
      dequant_tile(0);
      mla::bar_sync(BAR_LOADER, 256); // the raw stage is free
      issue_next();                   // tile 1's raw rows
    }
  }
  mla::fence_proxy_async();
  __syncthreads(); // tile 0 ready

  float o[128];
#pragma unroll
  for (int e = 0; e < 128; e++) o[e] = 0.f;
  for (int u = 0; u < niter; u++) {
    const int kb = u % NKB, pb = u % NPB, nkb = (u + 1) % NKB;
    if (REGS) {
      // Tile u + 1, in registers since last iteration, into the buffer of tile
      // u - 1, whose S (P_FULL(u - 1) seen) and P V (waited for by both
      // warpgroups) are done; then tile u + 2's loads, while S(u) runs
      // (PV_FIRST: once P V(u) is issued, below).
      if (!PV_FIRST && u + 1 < niter) {
        // tile 1's scale maxima are gathered here, not in the prologue, so
        // that S(0) does not wait for tile 1's loads
        if (HAS_E && u == 0) e_gather(1);
        if (u > 0 || HAS_E) mla::bar_sync(BAR_LOADER, 256);
        if constexpr (HAS_E) {
          e_nx = e_of(u + 1, e_cur);
          // tile u's slot was read at iteration u - 1; tile u + 2's maxima
          // arrive after P_FULL(u), which thread 0 reaches after this
          if (lt == 0) emax_s[u & 1] = 0;
        }
        rf_store(u + 1, e_nx);
        mla::fence_proxy_async();
        mla::bar_arrive(BAR_FULL0 + nkb, NT);
        if (u + 2 < niter) rf_load(u + 2);
      }
    } else if (STAGED) {
      // Tile u + 1: its raw rows landed; its K buffer held tile u - 2, whose S and
      // P V are done (P_FULL(u - 2) seen, P V(u - 2) waited for last iteration).
      mla::cp_async_wait<0>();
      mla::bar_sync(BAR_LOADER, 256);
      if (u + 1 < niter) {
        dequant_tile(u + 1);
        mla::fence_proxy_async();
        mla::bar_arrive(BAR_FULL0 + nkb, NT);
      }
      mla::bar_sync(BAR_LOADER, 256); // the raw stage is free
      issue_next();                   // tile u + 2's raw rows
    } else if (u + 1 < niter) {
      // Tile u + 1 into the buffer of tile u - 1, whose S and P V are done.
      if (u > 0) mla::bar_sync(BAR_LOADER, 256);
      issue_next();
    }
    mla::bar_sync(BAR_P_FULL0 + pb, NT);
    if (STAGED) { // P V(u - 1), left running last iteration, must be done before the rescale
      mla::wgmma_wait<0>();
      mla::fence_regs(o);
      if (u >= 1 && u - 1 + NPB < niter) mla::bar_arrive(BAR_P_EMPTY0 + (u - 1) % NPB, NT);
    }
    // codes mode: O was in units of 2^E(u - 1), now of 2^E(u)
    const float eal = HAS_E ? pow2i(max(e_prev - e_cur, -126)) : 1.0f;
    const float al[2] = {alpha_s[(u & 1) * MR + rA] * eal, alpha_s[(u & 1) * MR + rB] * eal};
    if (__any_sync(0xffffffffu, al[0] != 1.f || al[1] != 1.f)) {
#pragma unroll
      for (int e = 0; e < 128; e++) o[e] *= al[(e >> 1) & 1];
    }
    // descriptor bases from warp-uniform values (mla::wgmma_sdesc), one add a
    // wgmma: each descriptor built whole took five ALU instructions in the
    // P V warpgroups' critical path (fp8_pertensor h128 2-3% faster, thirty-third session)
    const mla::wgmma_sdesc pd = mla::wgmma_sdesc_of(mla::smem_addr(p_tile(u)), 16, 1024),
                           vd = mla::wgmma_sdesc_of(mla::smem_addr(Kbase + kb * TILE) + (wgi_u - 1) * 4 * BLK_K, BLK_K, 1024),
                           td = mla::wgmma_sdesc_of(mla::smem_addr(p_twin(u)), 16, 1024); // MIXED: P's bf16 twin
    mla::fence_regs(o);
    mla::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KB / 16; kk++) {
      const uint64_t da = pd + kk * 32, db = vd + kk * 16 * 128;
      if constexpr (MIXED) {
        // codes mode with bf16 value dims: e4m3 blocks lead, bf16 ones take the twin P
        if constexpr (CO::lead == 4) mla::wgmma_m64n256k16_f16_tb(o, da, db, 1);
        else {
          mla::wgmma_m64n192k16_f16_tb<0>(o, da, db, 1);
          mla::wgmma_m64n64k16_bf16_tb<96>(o, td + kk * 32, vd + (3 * BLK_K + kk * 16 * 128), 1);
        }
      } else if constexpr (CODES) mla::wgmma_m64n256k16_f16_tb(o, da, db, 1);
      else mla::wgmma_m64n256k16_bf16_tb(o, da, db, 1);
    }
    mla::wgmma_commit();
    if (PV_FIRST && u + 1 < niter) {
      // Tile u + 1 into the buffer of tile u - 1 while the tensor cores run
      // P V(u): S(u - 1) is done (P_FULL(u - 1) seen) and so is every thread's
      // P V(u - 1) (each waited for its own before the P_FULL(u) barrier); then
      // tile u + 2's loads.
      rf_store(u + 1, e_nx);
      mla::fence_proxy_async();
      mla::bar_arrive(BAR_FULL0 + nkb, NT);
      if (u + 2 < niter) rf_load(u + 2);
    }
    if (!STAGED) {
      if (!REGS && u + 1 < niter) {
        mla::cp_async_wait<0>();
        mla::fence_proxy_async();
        mla::bar_arrive(BAR_FULL0 + nkb, NT);
      }
      mla::wgmma_wait<0>();
      mla::fence_regs(o);
      if (!P_FREE && u + NPB < niter) mla::bar_arrive(BAR_P_EMPTY0 + pb, NT);
    }
    if (HAS_E && u + 2 < niter) e_gather(u + 2);
    e_prev = e_cur, e_cur = e_nx;
  }
  mla::wgmma_wait<0>();
  mla::fence_regs(o);
  mla::cp_async_wait<0>();
  __syncthreads(); // fin_s

  // Epilogue: value dims 256 (wgi - 1).. The rows are staged in the K
  // buffers (free now), 32 at a time, and written whole, 16 bytes a thread:
  // straight from the accumulators a warp's stores spread over 8 rows, which
  // took 5.7-7.5 us a CTA, now 2.5-2.8 (a globaltimer trace, bench/RESULTS.md,
  // twenty-seventh session). bf16 output rows, or a split's f32 partials; the
  // pitches put each warp's stores in distinct banks.
  constexpr int PASS = MR / 2;
  static_assert(PASS * (DV * 4 + 32) <= NKB * TILE, "the output staging fits the K buffers");
  const bool split = p.nparts > 1;
  const int esz = split ? 4 : 2, pitch = DV * esz + (split ? 32 : 16), chunks = DV * esz / 16;
  // the CTA's rows are consecutive in out and in the partials
  unsigned char *dst = split ? reinterpret_cast<unsigned char *>(p.o_acc + (w.part + w.row0) * DV)
                             : reinterpret_cast<unsigned char *>(p.out + ((int64_t)w.prob * p.rows + w.row0) * DV);
#pragma unroll
  for (int pass = 0; pass < 2; pass++) {
    const int lo = pass * PASS;
    if (lo >= w.nrows) break;
    if (pass) mla::bar_sync(BAR_LOADER, 256); // the first pass's rows are out
    if (warp / 2 == pass) { // this warp's rows rA, rB lie in the pass
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        const int row = hh ? rB : rA;
        if (row >= w.nrows) continue;
        // codes mode: O in units of 2^E(last tile) and of the tensor scale
        const float f = fin_s[row] * (HAS_E ? pow2i(e_prev) : 1.0f) * (CO::tensor ? tscale : 1.0f);
        unsigned char *st = Kbase + (row - lo) * pitch;
#pragma unroll
        for (int j = 0; j < 32; j++) {
          const int col = (wgi - 1) * 256 + j * 8 + 2 * t4;
          const float x0 = o[4 * j + 2 * hh] * f, x1 = o[4 * j + 2 * hh + 1] * f;
          if (split) *reinterpret_cast<float2 *>(st + col * 4) = make_float2(x0, x1);
          else *reinterpret_cast<uint32_t *>(st + col * 2) = mla::pack_bf16x2(x0, x1);
        }
      }
    }
    mla::bar_sync(BAR_LOADER, 256); // the pass's rows staged by both halves
    const int n = min(PASS, w.nrows - lo) * chunks;
    for (int idx = lt; idx < n; idx += 256) {
      const int row = idx / chunks, c = idx - row * chunks;
      *reinterpret_cast<uint4 *>(dst + (int64_t)(lo + row) * DV * esz + c * 16) = *reinterpret_cast<const uint4 *>(Kbase + row * pitch + c * 16);
    }
  }
#else
  __trap(); // the launcher only picks this kernel where sm_90a code exists
#endif
}

} // namespace wg
} // namespace mla_attn

#endif
