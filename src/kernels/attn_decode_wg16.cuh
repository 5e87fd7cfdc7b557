// The Hopper decode kernel for 16-row tiles (h_q x s_q <= 16, the
// memory-bound shapes) over a built-in fp8 layout in codes mode: the 64-row
// wgmma kernel's roles and register-fed K tiles (attn_decode_wg.cuh,
// attn_wg_regs.cuh), with keys and value dims on the M side so that 16 query
// rows waste no tensor work:
//   warpgroup 0: S^T = K Q^T (m64n16k16, A = the tile's 64 keys, B = Q),
//     the online softmax over keys (the tile's maxima shared among its four
//     warps through shared memory), P^T handed over as a 16-row K-major tile;
//   warpgroups 1 and 2: each thread loads a quarter of one key's token row
//     into registers up to two tiles ahead and converts it into the swizzled
//     f16 K tile (codes mode: e4m3 code x f16(s x 2^-E)); then O^T += V^T P^T
//     (m64n16k16, A = value dims read MN-major from the same K tile) for
//     value dims 256 (wgi - 1)..+256, four m-tiles of 64 dims.
// Work split, masks, codes-mode units (Q x 2^-qk, the split's running scale
// exponent E) and the epilogue's semantics are the 64-row kernel's. sm_90a
// only; the launcher picks it on compute capability 9.0 for 16-row tiles of
// a built-in fp8 layout.
#ifndef MLA_ATTN_DECODE_WG16_CUH
#define MLA_ATTN_DECODE_WG16_CUH

#include "attn_decode_wg.cuh"

namespace mla_attn {
namespace wg16 {

using wg::E_MIN;
using wg::pow2i;

constexpr int MR = 16, NT = 384, KB = 64, NKB = 2, NPB = 2;
// Per-thread registers after setmaxnreg (see wg::REG_*): warpgroup 0 needs
// few; the loaders hold two tiles' shares of token rows.
constexpr int REG_S = 88, REG_PV = 208;
static_assert(128 * (wg::REG_LAUNCH - REG_S) >= 256 * (REG_PV - wg::REG_LAUNCH), "setmaxnreg: more registers asked than released");
constexpr int BLK_Q = MR * 128, BLK_K = KB * 128; // one 64-dim block of Q rows / of K rows
constexpr int OP = DV + 4;                        // output staging pitch (f32)

enum : int { BAR_FULL0 = 1, BAR_P_FULL0 = 4, BAR_LOADER = 8, BAR_S = 9 }; // 2 FULL, 2 P_FULL; BAR_S: warpgroup 0

// Whether a layout runs here: a register-fed built-in in codes mode.
template <class LS> constexpr bool allowed() { return wg::codes_of<LS, LS::host.k_dims>::on; }

struct smem_plan {
  int q, k, p, alpha, smax, lsum, fin, tok_ok, misc, total;
};
// Offsets from the 1024-aligned start of the dynamic window; total includes
// the alignment slack. P tiles: 16 rows x 64 keys, f16 (and a bf16 twin
// after it for layouts with bf16 value dims).
template <int DQK, bool MIXED> __host__ __device__ constexpr smem_plan make_smem_plan() {
  smem_plan s{};
  int o = 0;
  s.q = o, o += DQK / 64 * BLK_Q;
  s.k = o, o += NKB * (DQK / 64) * BLK_K;
  s.p = o, o += NPB * BLK_Q * (MIXED ? 2 : 1);
  s.alpha = o, o += 2 * MR * 4;    // tile u's rescale factors at (u % 2) x MR
  s.smax = o, o += 2 * MR * 4 * 4; // tile u's per-warp maxima: [(u % 2)][query][warp]
  s.lsum = o, o += 2 * 4 * MR * 4; // row sums per warp: l, then the rounded sum
  s.fin = o, o += MR * 4;
  s.tok_ok = o, o += NKB * KB * 4;
  s.misc = o, o += 32 * 4; // Q's warp maxima [0, 12), tile scale-exponent maxima [16, 18), tile E [18, 20)
  s.total = o + 1024;
  return s;
}
template <class LS> constexpr int smem_bytes() {
  return make_smem_plan<LS::host.k_dims, wg::codes_of<LS, LS::host.k_dims>::mixed>().total;
}

template <int DQK, class LS>
__global__ void __launch_bounds__(NT, 1) attn_decode_wg16_kernel(const __grid_constant__ params p) {
#if MLA_HAVE_WGMMA
  using CO = wg::codes_of<LS, DQK>;
  static_assert(CO::on && DQK == LS::host.k_dims, "the 16-row wgmma kernel runs built-in layouts in codes mode");
  static_assert(MR * OP * 4 <= NKB * (DQK / 64) * BLK_K, "the output staging reuses the K buffers");
  constexpr bool HAS_E = CO::has_e, MIXED = CO::mixed;
  constexpr int NCH = DQK / 8, TILE = (DQK / 64) * BLK_K, PT = BLK_Q * (MIXED ? 2 : 1);
  extern __shared__ __align__(16) unsigned char smem_window[];
  unsigned char *smem = smem_window + ((1024 - (mla::smem_addr(smem_window) & 1023)) & 1023);
  constexpr smem_plan L = make_smem_plan<DQK, MIXED>();
  unsigned char *Qs = smem + L.q, *Kbase = smem + L.k, *Pbase = smem + L.p;
  float *alpha_s = reinterpret_cast<float *>(smem + L.alpha);
  float *smax_s = reinterpret_cast<float *>(smem + L.smax);
  float *lsum_s = reinterpret_cast<float *>(smem + L.lsum);
  float *fin_s = reinterpret_cast<float *>(smem + L.fin);
  int *tok_ok = reinterpret_cast<int *>(smem + L.tok_ok);
  int *qmax_w = reinterpret_cast<int *>(smem + L.misc), *emax_s = qmax_w + 16, *e_s = qmax_w + 18;
  // P(u) in tile u % 2 (free again when warpgroup 0 reaches tile u + 2: it
  // writes P(u + 2) after S(u + 2), which needs FULL(u + 2), arrived on by
  // warpgroups 1 and 2 after their P V(u) completed); its bf16 twin after it.
  auto p_tile = [&](int u) { return Pbase + (u % NPB) * PT; };

  const int tid = threadIdx.x, wgi = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const cta_work w = cta_work_of<MR, wg::SPLIT_KEYS>(p);
  if (w.t_begin >= w.t_end) return write_empty_split<NT>(p, w, tid);
  const int r = w.r, qi = w.qi, k0 = w.t_begin * wg::SPLIT_KEYS, k1 = min(w.t_end * wg::SPLIT_KEYS, w.nkeys);
  const int niter = (k1 - k0 + KB - 1) / KB;
  const float tscale = p.v.tensor_scale ? __ldg(p.v.tensor_scale) : 1.0f;

  // Q rows (zero past nrows); codes mode: Q x 2^-qk, f16 in the f16 blocks
  // (exact; every finite |q| below 2^15), bf16 elsewhere.
  uint32_t qmx = 0;
  load_q_rows<MR, NCH, NT>(p, w, tid, [&](int row, int c, uint4 val) {
    *reinterpret_cast<uint4 *>(Qs + mla::sw128_off(MR, row, c)) = val;
    if ((CO::f16_blocks >> (c / 8)) & 1)
      qmx = max(qmx, max(max(bf16x2_absmax(val.x), bf16x2_absmax(val.y)), max(bf16x2_absmax(val.z), bf16x2_absmax(val.w))));
  });
  const int qk = wg::codes_q<CO, MR, NCH, NT>(Qs, qmx, qmax_w, emax_s, tid, lane);

  // Accumulator element e of an m64n16 tile: row 16 warp + g + 8 ((e >> 1) & 1),
  // column 8 (e >> 2) + 2 t4 + (e & 1). S^T: rows are keys, columns queries;
  // O^T: rows are value dims. The thread's queries, by (e >> 2, e & 1):
  auto qcol = [&](int j, int e1) { return 8 * j + 2 * t4 + e1; };

  if (wgi == 0) {
    // Warpgroup 0: S^T, softmax, P^T.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REG_S));
    mla::fence_proxy_async(); // this thread's Q rows, for the tensor cores
    __syncthreads();          // Q
    __syncthreads();          // tile 0
    wg::rows16 st(p, w, t4);
    const uint32_t q_addr = mla::smem_addr(Qs);
    const float s_fac = p.scale_log2 * pow2i(qk) * (CO::tensor ? tscale : 1.0f);
    const int kr0 = 16 * warp + g; // this thread's keys kr0, kr0 + 8
    for (int u = 0; u < niter; u++) {
      const int kb = u % NKB;
      if (u > 0) mla::bar_sync(BAR_FULL0 + kb, NT);
      const uint32_t k_addr = mla::smem_addr(Kbase + kb * TILE);
      float s[8];
#pragma unroll
      for (int e = 0; e < 8; e++) s[e] = 0.f;
      mla::fence_regs(s);
      mla::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < DQK / 16; kk++) {
        const uint64_t da = mla::wgmma_desc(k_addr + (kk >> 2) * BLK_K + (kk & 3) * 32, 16, 1024);
        const uint64_t db = mla::wgmma_desc(q_addr + (kk >> 2) * BLK_Q + (kk & 3) * 32, 16, 1024);
        if ((CO::f16_blocks >> (kk >> 2)) & 1) mla::wgmma_m64n16k16<true, 0>(s, da, db, 1);
        else mla::wgmma_m64n16k16<false, 0>(s, da, db, 1);
      }
      mla::wgmma_commit();
      // S is in units of 2^(qk + E(u)) (and of the tensor scale)
      const float fac = s_fac * (HAS_E ? pow2i(e_s[u & 1]) : 1.0f);
      mla::wgmma_wait<0>();
      mla::fence_regs(s);

      const int *ok_t = tok_ok + kb * KB;
      const int key0 = k0 + u * KB;
      float mx[2][2] = {{-CUDART_INF_F, -CUDART_INF_F}, {-CUDART_INF_F, -CUDART_INF_F}};
#pragma unroll
      for (int e = 0; e < 8; e++) {
        const int j = e >> 2, e1 = e & 1, kr = kr0 + 8 * ((e >> 1) & 1);
        const bool ok = ok_t[kr] && key0 + kr <= st.lim[j][e1];
        s[e] = ok ? s[e] * fac : -CUDART_INF_F;
        mx[j][e1] = fmaxf(mx[j][e1], s[e]);
      }
      // the tile's maxima: over the warp's 16 keys (lanes of one t4), then its four warps
      float *sm = smax_s + (u & 1) * MR * 4;
      wg::share_keys_max(mx, sm, warp, g, t4);
      mla::bar_sync(BAR_S, 128);
      // lazy rescaling (online_max), as in the 64-row kernel
      float alpha[2][2], base[2][2];
      st.next_max(sm, t4, alpha, base);
      unsigned char *Ps = p_tile(u);
      float ps[2][2] = {{0.f, 0.f}, {0.f, 0.f}}, pr[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
      for (int e = 0; e < 8; e++) {
        const int j = e >> 2, e1 = e & 1, kr = kr0 + 8 * ((e >> 1) & 1);
        const float pv = wg::exp2_ftz(s[e] - base[j][e1]);
        // the output divides by the sum of the weights P V uses (f16), so it
        // is their exact average; the LSE keeps the unrounded sum
        const __half ph = __float2half_rn(pv);
        ps[j][e1] += pv, pr[j][e1] += __half2float(ph);
        const int at = mla::sw128_off(MR, qcol(j, e1), kr >> 3) + (kr & 7) * 2;
        *reinterpret_cast<__half *>(Ps + at) = ph;
        if constexpr (MIXED) *reinterpret_cast<__nv_bfloat16 *>(Ps + BLK_Q + at) = __float2bfloat16_rn(pv);
      }
#pragma unroll
      for (int j = 0; j < 2; j++)
#pragma unroll
        for (int e1 = 0; e1 < 2; e1++) {
          st.l[j][e1] = st.l[j][e1] * alpha[j][e1] + ps[j][e1];
          st.lr[j][e1] = st.lr[j][e1] * alpha[j][e1] + pr[j][e1];
          if (warp == 0 && g == 0) alpha_s[(u & 1) * MR + qcol(j, e1)] = alpha[j][e1];
        }
      mla::fence_proxy_async();
      mla::bar_arrive(BAR_P_FULL0 + u % NPB, NT);
    }
    // row sums over the keys of every lane and warp; the normalization (and sink) factor, the LSE
    st.share_sums(lsum_s, warp, g, t4);
    mla::bar_sync(BAR_S, 128);
    if (warp == 0 && g == 0)
#pragma unroll
      for (int j = 0; j < 2; j++)
#pragma unroll
        for (int e1 = 0; e1 < 2; e1++) {
          const int row = qcol(j, e1);
          float l = 0.f, lr = 0.f;
#pragma unroll
          for (int k = 0; k < 4; k++) l += lsum_s[k * MR + row], lr += lsum_s[4 * MR + k * MR + row];
          const float lse2 = l > 0.f ? st.m[j][e1] + log2f(l) : -CUDART_INF_F;
          float f = l > 0.f && lr > 0.f ? 1.0f / lr : 0.f;
          int i = 0, h = 0;
          if (row < w.nrows) row_coords(p, qi, w.row0 + row, i, h);
          if (p.nsplits == 1 && p.sink && l > 0.f && row < w.nrows)
            f *= 1.0f / (1.0f + expf(__ldg(p.sink + h) - lse2 * 0.69314718055994531f));
          fin_s[row] = f;
          if (row < w.nrows) {
            if (p.nsplits > 1) p.lse_acc[w.part + w.row0 + row] = lse2;
            else p.lse[((int64_t)r * p.h_q + h) * p.s_q + i] = l > 0.f ? lse2 * 0.69314718055994531f : CUDART_INF_F;
          }
        }
    __syncthreads(); // fin_s
    return;
  }

  // Warpgroups 1 and 2: K tiles (register-fed) and O^T = alpha O^T + V^T P^T
  // for value dims 256 (wgi - 1)..
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REG_PV));
  const int lt = tid - 128, n4 = lt >> 2, q4 = lt & 3; // this thread's quarter q4 of key n4
  // Two register sets: tile u in set u % 2; its loads are issued at
  // iteration u - 2, right after the gather that waits for tile u - 1's, so
  // that they are in flight across tile u - 1's conversion and P V(u - 2)
  // (EARLY; measured: fp8_ds_mla -6%, fp8_v4 -9%, but fp8_pertensor, which
  // has no scale exponents to gather, +8%: it issues them after the
  // conversion, as with one set).
  constexpr bool EARLY = HAS_E;
  wg::rf_key<LS, DQK> rf0, rf1;
  slot_entry rf_next{-1, -1};
  auto rf_load = [&](wg::rf_key<LS, DQK> &rf, int u) {
    int page, off;
    slot_resolve<LS::host.block_size>(p, rf_next, page, off);
    rf.load(p, page, off, q4);
    rf_next = slot_fetch<1, LS::host.block_size>(p, r, qi, k1, k0 + (u + 1) * KB, n4);
  };
  int e_prev = E_MIN, e_cur = E_MIN, e_nx = E_MIN;
  auto e_gather = [&](const wg::rf_key<LS, DQK> &rf, int u) {
    if constexpr (HAS_E) wg::gather_scale_exp(rf.scale_exp(), emax_s + (u & 1), lane);
  };
  auto e_of = [&](int u, int e_before) { return wg::tile_exponent(emax_s[u & 1], e_before); }; // after the barrier that follows e_gather(u)
  auto rf_store = [&](const wg::rf_key<LS, DQK> &rf, int u, int e) {
    rf.template store_codes<KB, HAS_E>(Kbase + (u % NKB) * TILE, n4, q4, pow2i(-e));
    if (HAS_E && lt == 0) e_s[u & 1] = e;
    if (q4 == 0) tok_ok[(u % NKB) * KB + n4] = rf.ok;
  };

  rf_next = slot_fetch<1, LS::host.block_size>(p, r, qi, k1, k0, n4);
  rf_load(rf0, 0);
  e_gather(rf0, 0);
  __syncthreads(); // Q
  if (HAS_E) e_cur = e_prev = e_nx = e_of(0, E_MIN);
  rf_store(rf0, 0, e_cur);
  if (niter > 1) rf_load(rf1, 1);
  mla::fence_proxy_async();
  __syncthreads(); // tile 0 ready

  float o[4][8]; // m-tile mt: value dims 256 (wgi - 1) + 64 mt..
#pragma unroll
  for (int mt = 0; mt < 4; mt++)
#pragma unroll
    for (int e = 0; e < 8; e++) o[mt][e] = 0.f;
  // Iteration u: rs holds tile u + 1, rl takes tile u + 2's loads.
  auto iteration = [&](int u, wg::rf_key<LS, DQK> &rl, const wg::rf_key<LS, DQK> &rs) {
    const int kb = u % NKB, nkb = (u + 1) % NKB;
    if (u + 1 < niter) {
      e_gather(rs, u + 1);
      if (EARLY && u + 2 < niter) rf_load(rl, u + 2); // rl held tile u, converted last iteration
      if (u > 0 || HAS_E) mla::bar_sync(BAR_LOADER, 256);
      if constexpr (HAS_E) {
        e_nx = e_of(u + 1, e_cur);
        if (lt == 0) emax_s[u & 1] = 0; // tile u's slot, read last iteration; tile u + 2 gathers into it
      }
      rf_store(rs, u + 1, e_nx);
      mla::fence_proxy_async();
      mla::bar_arrive(BAR_FULL0 + nkb, NT);
      if (!EARLY && u + 2 < niter) rf_load(rl, u + 2);
    }
    mla::bar_sync(BAR_P_FULL0 + u % NPB, NT);
    // codes mode: O was in units of 2^E(u - 1), now of 2^E(u)
    const float eal = HAS_E ? pow2i(max(e_prev - e_cur, -126)) : 1.0f;
    float al[2][2];
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
      for (int e1 = 0; e1 < 2; e1++) al[j][e1] = alpha_s[(u & 1) * MR + qcol(j, e1)] * eal;
    if (__any_sync(0xffffffffu, al[0][0] != 1.f || al[0][1] != 1.f || al[1][0] != 1.f || al[1][1] != 1.f)) {
#pragma unroll
      for (int mt = 0; mt < 4; mt++)
#pragma unroll
        for (int e = 0; e < 8; e++) o[mt][e] *= al[e >> 2][e & 1];
    }
    // descriptor bases (mla::wgmma_sdesc); the S warpgroup keeps building its
    // own per wgmma: with bases it ran ahead of these two and the kernel got
    // 4% slower (bench/RESULTS.md, nineteenth session)
    const mla::wgmma_sdesc pd = mla::wgmma_sdesc_of(mla::smem_addr(p_tile(u)), 16, 1024).fresh(),
                           vd = mla::wgmma_sdesc_of(mla::smem_addr(Kbase + kb * TILE) + (wgi - 1) * 4 * BLK_K, BLK_K, 1024).fresh();
#pragma unroll
    for (int mt = 0; mt < 4; mt++) mla::fence_regs(o[mt]);
    mla::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KB / 16; kk++) {
      const mla::wgmma_sdesc db = pd + kk * 32;
#pragma unroll
      for (int mt = 0; mt < 4; mt++) {
        const mla::wgmma_sdesc da = vd + (mt * BLK_K + kk * 16 * 128);
        if (mt < CO::lead) mla::wgmma_m64n16k16<true, 1>(o[mt], da, db, 1);
        else mla::wgmma_m64n16k16<false, 1>(o[mt], da, pd + (BLK_Q + kk * 32), 1);
      }
    }
    mla::wgmma_commit();
    mla::wgmma_wait<0>();
#pragma unroll
    for (int mt = 0; mt < 4; mt++) mla::fence_regs(o[mt]);
    e_prev = e_cur, e_cur = e_nx;
  };
  for (int u = 0; u < niter; u += 2) {
    iteration(u, rf0, rf1);
    if (u + 1 < niter) iteration(u + 1, rf1, rf0);
  }
  __syncthreads(); // fin_s; every S and P V is done, the K buffers become the output staging

  // O^T to rows of f32 (dims back in order), then whole rows out.
  float *ob = reinterpret_cast<float *>(Kbase);
#pragma unroll
  for (int mt = 0; mt < 4; mt++)
#pragma unroll
    for (int e = 0; e < 8; e++) {
      const int dim = (wgi - 1) * 256 + 64 * mt + 16 * warp + g + 8 * ((e >> 1) & 1);
      ob[qcol(e >> 2, e & 1) * OP + dim] = o[mt][e];
    }
  mla::bar_sync(BAR_LOADER, 256);
  // O in units of 2^E(last tile) and of the tensor scale
  const float unit = (HAS_E ? pow2i(e_prev) : 1.0f) * (CO::tensor ? tscale : 1.0f);
  for (int idx = lt; idx < w.nrows * (DV / 4); idx += 256) {
    const int row = idx / (DV / 4), c = idx - row * (DV / 4);
    store_out4(p, w, row, c, *reinterpret_cast<const float4 *>(ob + row * OP + 4 * c), fin_s[row] * unit);
  }
#else
  __trap(); // the launcher only picks this kernel where sm_90a code exists
#endif
}

} // namespace wg16
} // namespace mla_attn

#endif
