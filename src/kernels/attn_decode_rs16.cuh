// The Hopper decode kernel for 16-row tiles of the fp8 built-ins (codes
// mode: fp8_ds_mla, fp8_pertensor, fp8_v4): two symmetric
// warpgroups, each an independent split of the CTA's keys (tiles wgi,
// wgi + 2, ...), merged in the epilogue. Per tile a warpgroup
//   - holds its 64 keys' token rows in registers, loaded one tile ahead:
//     thread (warp w, g, t) owns quarter t of keys 16w + g and 16w + g + 8,
//     i.e. dims 64i + 16t .. + 16 of every 64-dim block i;
//   - converts them to f16 codes (codes mode) straight into the A fragments
//     of S^T = K Q^T (m64n16k16, A in registers), so no K tile is stored or
//     read back for S; Q's dims are permuted within each 64-dim block so that
//     k-step s of block i takes dims 16t + 4s .. + 4 from quarter t;
//   - stores the value dims' f16 codes once into its V tile, the A operand of
//     O^T += V^T P^T (m64n16k16 from shared memory, eight 64-dim m-tiles),
//     straight from the A fragments with stmatrix (each fragment quad is four
//     8x8 matrices), so O^T's rows come out permuted within each 64-dim
//     block (v_row) and the epilogue puts them back. bf16 value dims (fp8_v4's
//     RoPE block) stay bf16 in the V tile and take a bf16 twin of P.
// The tile ran at its instruction rate, not the memory's (with every page
// L2-resident it was no faster: bench/attn_l2_resident.lua), so each
// instruction in the loop counts (descriptors from one base, one address a
// key, no register moves for the V and P stores: bench/RESULTS.md, nineteenth
// and twentieth sessions); now L2-resident runs are 12-19% faster. Loads
// stay issued a key row at a time after the conversion: spread over the tile
// or prefetched to L2 a row at a time they cost more than they hid (twentieth
// session). Dense: one thread a warpgroup sends the page of the tile after
// next to L2 in one bulk prefetch a region, right after the next tile's loads
// go out (4-9% faster; issued before them, or a tile further ahead, slower:
// bench/RESULTS.md, twenty-first session).
// Units: key k's codes carry f16(s x 2^-E_k), E_k from the key's own largest
// scale exponent less headroom (no reduction before the conversion); S is
// corrected per key in f32, P V takes P x 2^(E_k - E_run), E_run the
// warpgroup's running maximum (O^T in units of 2^E_run).
// Masks, Q's power of two and the epilogue's semantics are the other wgmma
// kernels'. Against the three-warpgroup 16-row kernel it replaced (K tiles
// through shared memory, removed in the twentieth session) it stores 64 KB
// instead of 73.7 KB per tile and reads no K tile back (an m64n16k16 with A in
// shared memory takes 20 cycles, bound by the 2 KB A read; with A in
// registers 16.5: bench/probes/wgmma_n16_rate.cu). fp8_v4 was the last layout
// on that kernel: here it runs 7-11% faster (bench/RESULTS.md).
// sm_90a only.
#ifndef MLA_ATTN_DECODE_RS16_CUH
#define MLA_ATTN_DECODE_RS16_CUH

#include "attn_decode_wg.cuh"

namespace mla_attn {
namespace rs16 {

using wg::E_MIN;
using wg::pow2i;

constexpr int MR = 16, NT = 256, KB = 64, NPB = 2;
// S accumulators, k-step k into k % SACC: two dependent wgmma chains instead
// of one (measured: fp8_ds_mla -10%, fp8_pertensor even)
constexpr int SACC = 2;
constexpr int BLK_Q = MR * 128, BLK_K = KB * 128; // one 64-dim block of Q rows / of V rows
constexpr int OP = DV + 4;                        // output staging pitch (f32)
constexpr int VT = (DV / 64) * BLK_K;             // one warpgroup's V tile

// Named barriers per warpgroup w: its vote (and tile maxima), its P and V tiles, its V tile free again.
constexpr int bar_max(int w) { return 1 + w; }
constexpr int bar_pv(int w) { return 3 + w; }
constexpr int bar_free(int w) { return 5 + w; }

// Codes mode here: every e4m3 block as f16 codes (P V picks each m-tile's
// type at compile time, so the other wgmma kernels' lead split does not
// apply), bf16 blocks as bf16; bf16 value blocks take a bf16 twin of P.
template <class LS> struct rs_codes {
  using CO = wg::codes_of<LS, LS::host.k_dims>;
  static constexpr bool on = CO::on, has_e = CO::has_e, tensor = CO::tensor;
  static constexpr unsigned fp8_blocks() {
    unsigned m = 0;
    for (int i = 0; i < LS::host.k_dims / 64; i++)
      if (mla_attn_spec::is_fp8_kind(wg::rf_pair(LS::host, i).kind)) m |= 1u << i;
    return m;
  }
  static constexpr unsigned f16_blocks = on ? fp8_blocks() : 0u;
  static constexpr unsigned bf16_values = on ? ~f16_blocks & ((1u << (DV / 64)) - 1) : 0u;
  static constexpr bool mixed = bf16_values != 0;
};

// Whether a layout runs here: codes mode.
template <class LS> constexpr bool allowed() { return rs_codes<LS>::on; }

struct smem_plan {
  int q, v, p, smax, rows, lsum, fin, misc, pages, total;
};
// Dense: block-table entries kept in shared memory for the L2 prefetches
// (tiles past them are not prefetched)
constexpr int PF_BLOCKS = 1024;
// P tiles: [warpgroup][buffer] f16, then as many bf16 twins (MIXED)
template <int DQK, bool MIXED> __host__ __device__ constexpr smem_plan make_smem_plan() {
  smem_plan s{};
  int o = 0;
  s.q = o, o += DQK / 64 * BLK_Q;
  s.v = o, o += 2 * VT;
  s.p = o, o += 2 * NPB * BLK_Q * (MIXED ? 2 : 1);
  s.smax = o, o += 2 * (MR + 1) * 4 * 4; // per warpgroup: [query][warp] tile maxima, then [warp] key exponents
  s.rows = o, o += 2 * 3 * MR * 4;       // per warpgroup: m, E_run (bits), merge factor of each query
  s.lsum = o, o += 2 * 2 * 4 * MR * 4;   // per warpgroup: row sums per warp, l then the rounded sum
  s.fin = o, o += MR * 4;
  s.misc = o, o += 16 * 4; // Q's warp maxima [0, 8); [8, 10) the exponent slots codes_q clears, unused here; [10, 14) the vote words [warpgroup][tile parity]
  s.pages = o, o += PF_BLOCKS * 4;
  s.total = o + 1024;
  return s;
}
template <class LS> constexpr int smem_bytes() { return make_smem_plan<LS::host.k_dims, rs_codes<LS>::mixed>().total; }

// Byte offset of dim d of Q row `row` in the swizzled Q tile, dims permuted
// within each 64-dim block: dim 16t + 4s + j of a block sits in k-step s at
// column 2t + j % 2 + 8 (j / 2), where quarter t's A fragments expect it.
__device__ __forceinline__ int q_perm_off(int row, int d) {
  const int i = d >> 6, dd = d & 63, t = dd >> 4, s = (dd >> 2) & 3, j = dd & 3;
  const int col = 16 * s + 2 * t + (j & 1) + 8 * (j >> 1);
  return mla::sw128_off(MR, row, 8 * i + (col >> 3)) + (col & 7) * 2;
}

// The V tile's layout. K-step s of a 64-dim block gives quarter t the dims
// 16t + 4s + 0..3 (q_perm_off); its A quad {a0, a1, a2, a3} is four 8x8
// matrices: keys ka (a0, a2) and ka + 8 (a1, a3), columns 2t + e of dims
// 16t + 4s + e (a0, a1) and 16t + 4s + 2 + e (a2, a3). stmatrix stores matrix
// j's rows as chunk 2s + j / 2 of the keys' V-tile rows, so V^T's row
// m = 16s + 8h + 2t + e of a block holds value dim 16t + 4s + 2h + e.
// (16-byte stores of f16x2 pairs in natural order cost four register moves
// a store: 128 instructions a tile, measured with cuobjdump.)
// The inverse: the row m of value dim d within its block.
__device__ __forceinline__ int v_row(int d) { return 16 * ((d >> 2) & 3) + 8 * ((d >> 1) & 1) + 2 * (d >> 4) + (d & 1); }

// Dense: asks L2 for block `blk` (counted from the CTA's first, b0) of the
// request, each region's rows of its page in one bulk prefetch (16-byte
// granular, within the page; none where the rows lie far apart). One thread
// a page: the register loads a warpgroup issues a tile ahead then find their
// rows in L2.
template <class LS> __device__ __forceinline__ void prefetch_page_l2(const params &p, int page) {
  if (page < 0 || page >= p.v.num_pages) return;
  const unsigned char *pb = p.v.base + (int64_t)page * p.v.page_stride;
  mla_attn_spec::static_for<LS::host.nregions>([&](auto rc) {
    constexpr int rg = decltype(rc)::value, bytes = LS::host.region_row_bytes[rg];
    const int64_t stride = rg == 0 ? p.v.token_stride : bytes, span = (LS::host.block_size - 1) * stride + bytes;
    // rows far apart (a token-interleaved cross-layer view): the span is mostly other layers' bytes
    if (span > 2 * LS::host.block_size * bytes) return;
    const uintptr_t a = (uintptr_t)(pb + LS::host.region_off[rg]);
    const uintptr_t s = a & ~(uintptr_t)15, e = (a + span) & ~(uintptr_t)15;
    if (e > s) mla::prefetch_l2_bulk((const void *)s, (uint32_t)(e - s));
  });
}
template <class LS> __device__ __forceinline__ void prefetch_block_l2(const params &p, const int *pages, int blk) {
  if (blk >= 0 && blk < PF_BLOCKS) prefetch_page_l2<LS>(p, pages[blk]);
}
// The blocks of tile t (keys k0 + 64 t ..): one, or two where the tile starts mid-page (a split's first key).
template <class LS> __device__ __forceinline__ void prefetch_tile_l2(const params &p, const int *pages, int k0, int k1, int b0, int t) {
  constexpr int BS = LS::host.block_size;
  const int k = k0 + t * KB, ke = min(k + KB, k1) - 1;
  if (k > ke) return;
  prefetch_block_l2<LS>(p, pages, k / BS - b0);
  if (ke / BS != k / BS) prefetch_block_l2<LS>(p, pages, ke / BS - b0);
}
// Tiles ahead of a warpgroup's current one whose pages it sends to L2: its
// next (cur + 2) is loading into registers, so cur + 4 has one iteration.
constexpr int PF_AHEAD = 4;

template <int DQK, class LS>
__global__ void __launch_bounds__(NT, 1) attn_decode_rs16_kernel(const __grid_constant__ params p) {
#if MLA_HAVE_WGMMA
  using CO = rs_codes<LS>;
  static_assert(CO::on && DQK == LS::host.k_dims, "the register-A 16-row kernel runs built-ins in codes mode");
  static_assert(2 * MR * OP * 4 <= 2 * VT, "the output staging reuses the V tiles");
  constexpr bool HAS_E = CO::has_e, MIXED = CO::mixed;
  constexpr int NCH = DQK / 8, NI = DQK / 64, BS = LS::host.block_size, TWIN = 2 * NPB * BLK_Q; // f16 P to its bf16 twin
  extern __shared__ __align__(16) unsigned char smem_window[];
  unsigned char *smem = smem_window + ((1024 - (mla::smem_addr(smem_window) & 1023)) & 1023);
  constexpr smem_plan L = make_smem_plan<DQK, MIXED>();
  unsigned char *Qs = smem + L.q;
  int *qmax_w = reinterpret_cast<int *>(smem + L.misc);

  const int tid = threadIdx.x, wgi = tid >> 7, wt = tid & 127, warp = wt >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  unsigned char *Vt = smem + L.v + wgi * VT;
  float *smax_s = reinterpret_cast<float *>(smem + L.smax) + wgi * (MR + 1) * 4;
  int *kexp_s = reinterpret_cast<int *>(smax_s + MR * 4);
  float *rows_s = reinterpret_cast<float *>(smem + L.rows);
  float *lsum_s = reinterpret_cast<float *>(smem + L.lsum);
  float *fin_s = reinterpret_cast<float *>(smem + L.fin);

  const cta_work w = cta_work_of<MR, wg::SPLIT_KEYS>(p);
  if (w.t_begin >= w.t_end) return write_empty_split<NT>(p, w, tid);
  const int r = w.r, qi = w.qi, k0 = w.t_begin * wg::SPLIT_KEYS, k1 = min(w.t_end * wg::SPLIT_KEYS, w.nkeys);
  const int niter = (k1 - k0 + KB - 1) / KB;
  const float tscale = p.v.tensor_scale ? __ldg(p.v.tensor_scale) : 1.0f;

  // Q's loads go out first (they need no index), then the first tile's.
  q_chunks<MR, NCH, NT, q_chunks_per_thread<MR, NCH, NT>()> qv;
  qv.fetch(p, w, tid, 0);
  // This thread's keys of a tile: ka and ka + 8, quarter t4.
  const int ka = 16 * warp + g;
  wg::rf_key<LS, DQK> ra, rb;
  // The tile in work and the next (rows loading). Carried as two variables
  // rather than u and u + 2: the same tiles, but ptxas schedules this form
  // 1.5-2.4% faster for fp8_ds_mla (bench/RESULTS.md, eighteenth session).
  int cur = wgi, nx = wgi + 2;
  slot_entry na = slot_fetch<1, BS>(p, r, qi, k1, k0 + cur * KB, ka), nb = slot_fetch<1, BS>(p, r, qi, k1, k0 + cur * KB, ka + 8);
  // the rows whose slots na, nb hold; then the slots of tile `after`
  auto load_tile = [&](int after) {
    int page, off;
    slot_resolve<BS>(p, na, page, off);
    ra.load(p, page, off, t4);
    slot_resolve<BS>(p, nb, page, off);
    rb.load(p, page, off, t4);
    na = slot_fetch<1, BS>(p, r, qi, k1, k0 + after * KB, ka), nb = slot_fetch<1, BS>(p, r, qi, k1, k0 + after * KB, ka + 8);
  };
  if (cur < niter) load_tile(nx);
  // dense: the request's block-table entries from the CTA's first block, for the L2 prefetches.
  // Each warpgroup's next tile (2, 3: loaded in the first iteration) goes to L2 as soon as its
  // entries arrive rather than after Q is staged, and the tile after it (PF_AHEAD, + 1) once Q is:
  // the startup's DRAM idles less (fp8_v4 h16 L4096 0.8-1.5% faster, fp8_pertensor 0.8-1.0%:
  // bench/RESULTS.md, twenty-ninth session).
  int *pages = reinterpret_cast<int *>(smem + L.pages);
  const int b0 = k0 / BS;
  if (!p.sparse)
    for (int i = tid; i < PF_BLOCKS && b0 + i < p.max_blocks && (b0 + i) * BS < k1; i += NT) {
      const int page = __ldg(p.block_table + (int64_t)r * p.max_blocks + b0 + i), lo = (b0 + i) * BS;
      pages[i] = page;
      if (lo < min(k0 + PF_AHEAD * KB, k1) && lo + BS > k0 + 2 * KB) prefetch_page_l2<LS>(p, page);
    }

  // Q rows, dims permuted (q_perm_off); codes mode: Q x 2^-qk.
  uint32_t qmx = 0;
  qv.store(tid, 0, [&](int row, int c, uint4 val) {
    const uint32_t v4[4] = {val.x, val.y, val.z, val.w};
#pragma unroll
    for (int e = 0; e < 8; e++)
      *reinterpret_cast<uint16_t *>(Qs + q_perm_off(row, 8 * c + e)) = (uint16_t)(v4[e >> 1] >> (16 * (e & 1)));
    if ((CO::f16_blocks >> (c / 8)) & 1)
      qmx = max(qmx, max(max(bf16x2_absmax(val.x), bf16x2_absmax(val.y)), max(bf16x2_absmax(val.z), bf16x2_absmax(val.w))));
  });
  const int qk = wg::codes_q<CO, MR, NCH, NT>(Qs, qmx, qmax_w, qmax_w + 8, tid, lane);
  mla::fence_proxy_async(); // this thread's Q rows, for the tensor cores
  __syncthreads();
  // tiles PF_AHEAD, + 1, which the first iteration asks L2 for again (a hit); 2 more as well was slower
  if (!p.sparse && tid < 2) prefetch_tile_l2<LS>(p, pages, k0, k1, b0, PF_AHEAD + tid);

  // Accumulator element e of an m64n16 tile: row 16 warp + g + 8 ((e >> 1) & 1),
  // column 8 (e >> 2) + 2 t4 + (e & 1). S^T: rows are keys, columns queries;
  // O^T: rows are value dims.
  auto qcol = [&](int j, int e1) { return 8 * j + 2 * t4 + e1; };
  wg::rows16 st(p, w, t4);
  float o[DV / 64][8];
#pragma unroll
  for (int mt = 0; mt < DV / 64; mt++)
#pragma unroll
    for (int e = 0; e < 8; e++) o[mt][e] = 0.f;
  int e_run = E_MIN;
  // descriptor bases (mla::wgmma_sdesc), the warpgroup's from its index broadcast: warp-uniform
  const int wgu = __shfl_sync(0xffffffffu, wgi, 0);
  const uint32_t v_addr = mla::smem_addr(Vt);
  const mla::wgmma_sdesc qd = mla::wgmma_sdesc_of(mla::smem_addr(Qs), 16, 1024),
                         vd = mla::wgmma_sdesc_of(mla::smem_addr(smem + L.v + wgu * VT), BLK_K, 1024),
                         pd = mla::wgmma_sdesc_of(mla::smem_addr(smem + L.p + wgu * NPB * BLK_Q), 16, 1024);
  // this lane's stmatrix row: matrix j = lane / 8 is key row 16 warp + lane % 8 (+ 8 for odd j), chunk
  // c = 2s + j / 2 at swizzled position c ^ (lane % 8): k-step s's address is vst ^ 32 s (bits 5, 6 of
  // vst hold (lane % 8) & 6; the base is 1024-aligned), block i's BLK_K on
  const int r8 = lane & 7, jm = lane >> 3;
  const uint32_t vst = v_addr + (16 * warp + r8 + 8 * (jm & 1)) * 128 + ((((jm >> 1) ^ r8) & 1) << 4) + ((r8 & 6) << 4);
  const float s_fac = p.scale_log2 * pow2i(qk) * (CO::tensor ? tscale : 1.0f);
  // P^T's stores: S^T's accumulator fragments (keys x queries) stored transposed with stmatrix, matrix
  // m = 2j + hi holding keys 16 warp + 8 hi.. + 8 and queries 8j.. + 8; this lane addresses stored row
  // (query) 8j + lane % 8 of matrix lane / 8, the 16 bytes of its keys
  const uint32_t p_addr = mla::smem_addr(smem + L.p + wgi * NPB * BLK_Q);
  const int pst = mla::sw128_off(MR, 8 * (lane >> 4) + (lane & 7), 2 * warp + ((lane >> 3) & 1));

  for (int it = 0; cur < niter; it++) {
    // E_k of the two keys (codes x f16(s x 2^-E_k) stays below 2^15)
    const int ea = HAS_E ? wg::tile_exponent(ra.scale_exp(), E_MIN) : 0, eb = HAS_E ? wg::tile_exponent(rb.scale_exp(), E_MIN) : 0;
    const bool oka = ra.ok, okb = rb.ok;
    // S^T = K Q^T, A converted block by block; value blocks also into the V tile
    float sa[SACC][8];
#pragma unroll
    for (int x = 0; x < SACC; x++) {
#pragma unroll
      for (int e = 0; e < 8; e++) sa[x][e] = 0.f;
      mla::fence_regs(sa[x]);
    }
    mla_attn_spec::static_for<NI>([&](auto ic) {
      constexpr int i = decltype(ic)::value;
      uint32_t ha[8], hb[8];
      ra.template frag<i, HAS_E>(ha, pow2i(-ea));
      rb.template frag<i, HAS_E>(hb, pow2i(-eb));
      if constexpr (i == 0) {
        // the previous tile's P V ran behind this block's conversion (0.5-1% faster than waiting
        // at the tile's end: bench/RESULTS.md, twenty-eighth session); every warp's part of it
        // has read the V tile before any warp overwrites it
        mla::wgmma_wait<0>();
#pragma unroll
        for (int mt = 0; mt < DV / 64; mt++) mla::fence_regs(o[mt]);
        mla::bar_sync(bar_free(wgi), 128);
      }
      if constexpr (i < DV / 64) {
#pragma unroll
        for (int ks = 0; ks < 4; ks++) mla::stmatrix_x4((vst ^ (32 * ks)) + i * BLK_K, ha[2 * ks], hb[2 * ks], ha[2 * ks + 1], hb[2 * ks + 1]);
      }
      mla::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ks++) {
        mla::wgmma_m64n16k16_rs<((CO::f16_blocks >> i) & 1) != 0>(sa[(4 * i + ks) % SACC], ha[2 * ks], hb[2 * ks], ha[2 * ks + 1], hb[2 * ks + 1], qd + (i * BLK_Q + ks * 32), 1);
      }
      // one group per block: waiting for the one before frees its fragments
      // while this block's products run and the next block converts
      mla::wgmma_commit();
      mla::wgmma_wait<1>();
    });
    const int nxx = nx + 2;
    if (nx < niter) load_tile(nxx); // the raw rows are converted: the next tile's loads take their registers
    if (!p.sparse && wt == 32) prefetch_tile_l2<LS>(p, pages, k0, k1, b0, cur + PF_AHEAD);
    mla::wgmma_wait<0>();
    float s[8];
#pragma unroll
    for (int x = 0; x < SACC; x++) mla::fence_regs(sa[x]);
#pragma unroll
    for (int e = 0; e < 8; e++) {
      s[e] = sa[0][e];
#pragma unroll
      for (int x = 1; x < SACC; x++) s[e] += sa[x][e];
    }

    // scores (log2 units): S x 2^(qk + E_k) x the softmax factor. This step is
    // on the tile's critical path: a few shared or local loads here (the mask
    // limits moved out of registers) cost fp8_ds_mla 12-14% (bench/RESULTS.md,
    // eighteenth session), so its state stays in registers.
    const int key0 = k0 + cur * KB;
    const float fa = s_fac * (HAS_E ? pow2i(ea) : 1.0f), fb = s_fac * (HAS_E ? pow2i(eb) : 1.0f);
#pragma unroll
    for (int e = 0; e < 8; e++) {
      const int j = e >> 2, e1 = e & 1, hi = (e >> 1) & 1, kr = ka + 8 * hi;
      const bool ok = (hi ? okb : oka) && key0 + kr <= st.lim[j][e1];
      s[e] = ok ? s[e] * (hi ? fb : fa) : -CUDART_INF_F;
    }
    // The running max and exponent usually hold for a tile (lazy rescaling:
    // no score past the max by 2^8, no key exponent past E_run). The warps
    // vote on that in a flag word of the warpgroup instead of exchanging
    // their maxima first; only where some warp says no (the first tile, a
    // max or exponent that moves, a NaN score) do they exchange them as
    // online_max needs. The weights are the same, bit for bit, and most
    // tiles skip the exchange's shuffles, shared stores and loads (fp8_v4 h16
    // L4096 1.9% faster: bench/RESULTS.md, thirty-first session).
    bool keep = true;
#pragma unroll
    for (int e = 0; e < 8; e++) {
      const int j = e >> 2, e1 = e & 1;
      keep = keep && st.m[j][e1] != -CUDART_INF_F && s[e] <= st.m[j][e1] + RESCALE_LOG2; // a NaN score says no
    }
    if constexpr (HAS_E) keep = keep && (oka ? ea : E_MIN) <= e_run && (okb ? eb : E_MIN) <= e_run;
    keep = __all_sync(0xffffffffu, keep);
    // byte `warp` of the warpgroup's word for this tile's parity
    unsigned char *flag = reinterpret_cast<unsigned char *>(qmax_w + 10 + 2 * wgi + (it & 1));
    if (lane == 0) flag[warp] = keep ? 0 : 1;
    const uint32_t ps_addr = p_addr + (it % NPB) * BLK_Q;
    float ps[2][2], pr[2][2];
    // P^T (f16): weights times 2^(E_k - E_run), so that P V sums in units of 2^E_run
    auto weights = [&](const float (&base)[2][2], int e_new) {
      const float pa = HAS_E ? pow2i(max(ea - e_new, -126)) : 1.0f, pb = HAS_E ? pow2i(max(eb - e_new, -126)) : 1.0f;
      const float ia = HAS_E ? pow2i(min(e_new - ea, 126)) : 1.0f, ib = HAS_E ? pow2i(min(e_new - eb, 126)) : 1.0f;
      uint32_t ph[4], pt[4]; // f16x2 (and bf16x2) of elements 2m, 2m + 1: fragment matrix m of P^T's stmatrix
#pragma unroll
      for (int j = 0; j < 2; j++)
#pragma unroll
        for (int e1 = 0; e1 < 2; e1++) ps[j][e1] = pr[j][e1] = 0.f;
#pragma unroll
      for (int m = 0; m < 4; m++) {
        const int j = m >> 1, hi = m & 1;
        float pv[2], pw[2];
#pragma unroll
        for (int e1 = 0; e1 < 2; e1++) {
          pv[e1] = wg::exp2_ftz(s[2 * m + e1] - base[j][e1]);
          pw[e1] = pv[e1] * (hi ? pb : pa);
        }
        // the output divides by the sum of the weights P V uses (f16), so it
        // is their exact average; the LSE keeps the unrounded sum
        const __half2 h = __floats2half2_rn(pw[0], pw[1]);
        const float2 hf = __half22float2(h);
        ph[m] = *reinterpret_cast<const uint32_t *>(&h);
        if constexpr (MIXED) {
          const __nv_bfloat162 b = __floats2bfloat162_rn(pw[0], pw[1]);
          pt[m] = *reinterpret_cast<const uint32_t *>(&b);
        }
        ps[j][0] += pv[0], ps[j][1] += pv[1];
        pr[j][0] += hf.x * (hi ? ib : ia), pr[j][1] += hf.y * (hi ? ib : ia);
      }
      mla::stmatrix_x4_trans(ps_addr + pst, ph[0], ph[1], ph[2], ph[3]);
      if constexpr (MIXED) mla::stmatrix_x4_trans(ps_addr + TWIN + pst, pt[0], pt[1], pt[2], pt[3]);
      mla::fence_proxy_async();
    };
    mla::bar_sync(bar_max(wgi), 128); // the votes
    float alpha[2][2] = {{1.f, 1.f}, {1.f, 1.f}};
    int e_new = e_run;
    const bool slow = *reinterpret_cast<const volatile int *>(flag) != 0;
    if (slow) {
      // the tile's maxima (and largest key exponent) over the warpgroup's four warps
      float mx[2][2] = {{-CUDART_INF_F, -CUDART_INF_F}, {-CUDART_INF_F, -CUDART_INF_F}};
#pragma unroll
      for (int e = 0; e < 8; e++) mx[e >> 2][e & 1] = fmaxf(mx[e >> 2][e & 1], s[e]);
      wg::share_keys_max(mx, smax_s, warp, g, t4);
      if constexpr (HAS_E) {
        const int ek = __reduce_max_sync(0xffffffffu, max(oka ? ea : E_MIN, okb ? eb : E_MIN));
        if (lane == 0) kexp_s[warp] = ek;
      }
      mla::bar_sync(bar_max(wgi), 128);
      float base[2][2];
      st.next_max(smax_s, t4, alpha, base);
      if constexpr (HAS_E) e_new = max(e_run, max(max(kexp_s[0], kexp_s[1]), max(kexp_s[2], kexp_s[3])));
      weights(base, e_new);
    } else weights(st.m, e_run);
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
      for (int e1 = 0; e1 < 2; e1++) {
        st.l[j][e1] = st.l[j][e1] * alpha[j][e1] + ps[j][e1];
        st.lr[j][e1] = st.lr[j][e1] * alpha[j][e1] + pr[j][e1];
      }
    mla::bar_sync(bar_pv(wgi), 128); // P^T and the V tile complete
    if (slow) {
      // O^T = alpha 2^(E_old - E_new) O^T + V^T P^T
      const float eal = HAS_E ? pow2i(max(e_run - e_new, -126)) : 1.0f;
      float al[2][2];
#pragma unroll
      for (int j = 0; j < 2; j++)
#pragma unroll
        for (int e1 = 0; e1 < 2; e1++) al[j][e1] = alpha[j][e1] * eal;
      if (__any_sync(0xffffffffu, al[0][0] != 1.f || al[0][1] != 1.f || al[1][0] != 1.f || al[1][1] != 1.f)) {
#pragma unroll
        for (int mt = 0; mt < DV / 64; mt++)
#pragma unroll
          for (int e = 0; e < 8; e++) o[mt][e] *= al[e >> 2][e & 1];
      }
      e_run = e_new;
    }
    const mla::wgmma_sdesc pdi = pd.fresh() + (it % NPB) * BLK_Q, vdi = vd.fresh();
#pragma unroll
    for (int mt = 0; mt < DV / 64; mt++) mla::fence_regs(o[mt]);
    mla::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KB / 16; kk++)
#pragma unroll
      for (int mt = 0; mt < DV / 64; mt++) {
        if ((CO::bf16_values >> mt) & 1) mla::wgmma_m64n16k16<false, 1>(o[mt], vdi + (mt * BLK_K + kk * 16 * 128), pdi + (TWIN + kk * 32), 1);
        else mla::wgmma_m64n16k16<true, 1>(o[mt], vdi + (mt * BLK_K + kk * 16 * 128), pdi + kk * 32, 1);
      }
    mla::wgmma_commit(); // waited for in the next tile's first block, or below
    cur = nx, nx = nxx;
  }
  mla::wgmma_wait<0>();
#pragma unroll
  for (int mt = 0; mt < DV / 64; mt++) mla::fence_regs(o[mt]);

  // Per warpgroup: row sums over its threads' keys, its running max and unit.
  float *lw = lsum_s + wgi * 2 * 4 * MR, *rw = rows_s + wgi * 3 * MR;
  st.share_sums(lw, warp, g, t4);
#pragma unroll
  for (int j = 0; j < 2; j++)
#pragma unroll
    for (int e1 = 0; e1 < 2; e1++)
      if (warp == 0 && g == 0) rw[qcol(j, e1)] = st.m[j][e1], rw[MR + qcol(j, e1)] = __int_as_float(e_run);
  __syncthreads(); // every P V is done: the V tiles become the output staging
  // One thread per query merges the two warpgroups (factors, LSE,
  // normalization) while every thread stages its warpgroup's O^T below.
  if (tid < MR) {
    const int row = tid;
    float m[2], l[2], lr[2];
    int e[2];
#pragma unroll
    for (int x = 0; x < 2; x++) {
      const float *lx = lsum_s + x * 2 * 4 * MR, *rx = rows_s + x * 3 * MR;
      m[x] = rx[row], e[x] = __float_as_int(rx[MR + row]), l[x] = lr[x] = 0.f;
#pragma unroll
      for (int k = 0; k < 4; k++) l[x] += lx[k * MR + row], lr[x] += lx[4 * MR + k * MR + row];
    }
    const float mm = fmaxf(m[0], m[1]);
    const int eref = max(e[0], e[1]);
    float lt = 0.f, lrt = 0.f;
#pragma unroll
    for (int x = 0; x < 2; x++) {
      const float c = m[x] == -CUDART_INF_F ? 0.f : exp2f(m[x] - mm);
      lt += c * l[x], lrt += c * lr[x];
      rows_s[x * 3 * MR + 2 * MR + row] = c * pow2i(max(e[x] - eref, -126)); // O^T of warpgroup x into units of 2^eref
    }
    // empty only at 0: a NaN sum stays NaN (write_lse)
    const float lse2 = lt != 0.f ? mm + log2f(lt) : -CUDART_INF_F;
    float f = lt != 0.f && lrt != 0.f ? 1.0f / lrt : 0.f;
    int i = 0, h = 0;
    if (row < w.nrows) row_coords(p, qi, w.row0 + row, i, h);
    if (p.nparts == 1 && p.sink && lt != 0.f && row < w.nrows)
      f *= 1.0f / (1.0f + expf(__ldg(p.sink + h) - lse2 * 0.69314718055994531f));
    // O in units of 2^eref and of the tensor scale
    fin_s[row] = f * (HAS_E ? pow2i(eref) : 1.0f) * (CO::tensor ? tscale : 1.0f);
    if (row < w.nrows) {
      if (p.nparts > 1) p.lse_acc[w.part + w.row0 + row] = lse2;
      else p.lse[((int64_t)r * p.h_q + h) * p.s_q + i] = lt != 0.f ? lse2 * 0.69314718055994531f : CUDART_INF_F;
    }
  }

  // Each warpgroup's O^T to rows of f32 as the accumulators hold them: in
  // block mt, column 64 mt + m for accumulator row m, so a warp's 32 stores
  // hit 32 banks (in value-dim order they met 4-way conflicts: the staging
  // took 1.3 us of the epilogue in the seventeenth session's trace).
  float *ob = reinterpret_cast<float *>(smem + L.v) + wgi * MR * OP;
#pragma unroll
  for (int mt = 0; mt < DV / 64; mt++)
#pragma unroll
    for (int e = 0; e < 8; e++) ob[qcol(e >> 2, e & 1) * OP + 64 * mt + 16 * warp + g + 8 * ((e >> 1) & 1)] = o[mt][e];
  __syncthreads(); // the staging and the merge factors
  // Whole rows out: value dims 4c'.. 4c' + 3 of a block sit at rows
  // v_row(4c') + 0, 1, 8, 9; warpgroup x's O^T scaled into the common unit by
  // its factor.
  const float *ob0 = reinterpret_cast<const float *>(smem + L.v), *ob1 = ob0 + MR * OP;
  const float *fx0 = rows_s + 2 * MR, *fx1 = rows_s + 3 * MR + 2 * MR;
  for (int idx = tid; idx < w.nrows * (DV / 4); idx += NT) {
    const int row = idx / (DV / 4), c = idx - row * (DV / 4);
    const int at = row * OP + 64 * (c >> 4) + v_row(4 * (c & 15));
    const float2 a0 = *reinterpret_cast<const float2 *>(ob0 + at), a1 = *reinterpret_cast<const float2 *>(ob0 + at + 8);
    const float2 b0 = *reinterpret_cast<const float2 *>(ob1 + at), b1 = *reinterpret_cast<const float2 *>(ob1 + at + 8);
    const float f0 = fx0[row], f1 = fx1[row];
    store_out4(p, w, row, c, make_float4(a0.x * f0 + b0.x * f1, a0.y * f0 + b0.y * f1, a1.x * f0 + b1.x * f1, a1.y * f0 + b1.y * f1), fin_s[row]);
  }
#else
  __trap(); // the launcher only picks this kernel where sm_90a code exists
#endif
}

} // namespace rs16
} // namespace mla_attn

#endif
