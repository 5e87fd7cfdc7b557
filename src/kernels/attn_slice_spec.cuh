// Memory-bound decode kernel for 16 query rows over a built-in fp8 layout
// (descriptor a compile-time constant, attn_spec_layouts.cuh), built so
// that each key costs few instructions:
//   * warp w owns V dims [64w, 64w + 64) (one scale group: a static_assert)
//     and, for 576-dim K, 16 of the 64 S-only dims (warps 0-3);
//   * S is computed transposed, S^T = K Q^T, with K as the mma A operand
//     read straight from the raw stage: lane (g, t4) reads 16 bytes of keys
//     g and g + 8, and the dims run in a permuted order (the same for Q,
//     whose B fragments stay in registers), so e4m3 codes become operands
//     with one conversion per pair and no shuffling;
//   * fp8 codes enter unscaled as f16 (exact); Q is f16 scaled by 2^-k. The
//     key's scale multiplies the warp's S partial (a group scale per key,
//     fp32) and, for P V, the warp's P column: P' = P x s / 2^E in f16, E the
//     running maximum scale exponent of the warp (O rescaled when it grows,
//     times 2^E at the end). bf16 slices run bf16 mma with bf16 Q and P;
//   * P V reuses the converted K fragments as V^T through movmatrix
//     (O^T = V^T P^T), so no V tile is written to shared memory;
//   * per tile (48 or 64 keys), two CTA barriers: the 8 S partials, then P.
// Rounding: K and V enter exactly (no bf16 rounding of code x scale); P is
// rounded to f16 (bf16 on bf16 slices) after the scale factor. Outputs go
// through shared memory so the global stores are whole rows.
#ifndef MLA_ATTN_SLICE_SPEC_CUH
#define MLA_ATTN_SLICE_SPEC_CUH

#include "attn_spec_layouts.cuh"

namespace mla_attn_slice {

using mla_attn::BN;
using mla_attn::DV;
using mla_attn::params;
using namespace mla_attn_spec;

constexpr int NW = 8, NT = NW * 32, MR = 16;
constexpr int VW = DV / NW; // V dims per warp
constexpr int OP = DV + 4;  // output staging pitch (f32)
// Keys per tile BK (48 or 64): S partial pitch (f32) = 4 or 20 mod 32, so
// lanes (g, t4) storing key g, row 2t4 hit 32 banks; P pitch = 8 or 24 mod
// 32, so float2 reads of rows g, keys 2t4 hit distinct banks.
__host__ __device__ constexpr int s_pitch(int bk) { return bk + 4; }
__host__ __device__ constexpr int p_pitch(int bk) { return bk + 8; }
// Threads per key row in the copies (NT / BK rounded down to a power of two).
__host__ __device__ constexpr int copy_tpr(int bk) { return bk <= 32 ? 8 : 4; }

// Stage row: every region, padded to 64 past a multiple of 128, so the 16-byte
// reads of keys g and g + 1 by lanes t4 = 0..3 (one phase) cover all banks.
__host__ __device__ constexpr int slice_pitch(const mla_layout_desc &d) {
  const int o = stage_off(d, d.nregions);
  return o + (64 - o % 128 + 128) % 128;
}

// Dims [d0, d0 + n) as one run: one kind, one scale, contiguous bytes.
__host__ __device__ constexpr bool run_ok(const mla_layout_desc &d, int d0, int n) {
  const spec_chunk a = chunk_at(d, d0);
  if (a.kind == SK_BAD || a.kind == SK_ZERO) return false;
  if (a.kind != SK_COPY && !is_fp8_kind(a.kind)) return false;
  for (int c = 1; c < n / 8; c++) {
    const spec_chunk b = chunk_at(d, d0 + 8 * c);
    if (b.kind != a.kind || b.scale_src != a.scale_src || b.src != a.src + 8 * c * a.esize) return false;
  }
  return a.src % 16 == 0 || (a.esize == 1 && a.src % 4 == 0 && n == 16);
}

// The kernel's assumptions: K of 512 or 576 dims, V = 512, every 64-dim V
// slice and every 16-dim S-only run one kind and scale in contiguous bytes.
__host__ __device__ constexpr bool slice_ok(const mla_layout_desc &d) {
  if ((d.k_dims != 512 && d.k_dims != 576) || d.v_dims != DV || d.nregions < 1 || d.nregions > 2) return false;
  if (d.region_row_bytes[0] % 16 || (d.nregions == 2 && d.region_row_bytes[1] % 4)) return false;
  for (int w = 0; w < NW; w++)
    if (!run_ok(d, w * VW, VW)) return false;
  for (int x = 0; x < (d.k_dims - DV) / 16; x++)
    if (!run_ok(d, DV + 16 * x, 16)) return false;
  return true;
}

static_assert(slice_ok(spec_fp8_pertensor::host) && slice_ok(spec_fp8_ds_mla::host) && slice_ok(spec_fp8_v4::host),
              "built-in fp8 layouts fit the slice kernel");

__host__ __device__ constexpr bool scaled_per_key(int kind) { return kind == SK_FP8_F32 || kind == SK_FP8_UE8M0; }

// Up to two kinds of V slices (warps [0, split) one kind, the rest another):
// each warp runs one code path, and few exist.
__host__ __device__ constexpr int slice_kind(const mla_layout_desc &d, int w) { return chunk_at(d, w * VW).kind; }
__host__ __device__ constexpr int kind_split(const mla_layout_desc &d) {
  int s = NW;
  for (int w = NW - 1; w >= 0 && slice_kind(d, w) != slice_kind(d, 0); w--) s = w;
  return s;
}
__host__ __device__ constexpr bool two_runs(const mla_layout_desc &d) {
  for (int w = 0; w < NW; w++)
    if (slice_kind(d, w) != (w < kind_split(d) ? slice_kind(d, 0) : slice_kind(d, NW - 1))) return false;
  return true;
}

struct slice_smem {
  int stages, s_part, p, alpha, m_fin, l_fin, rowf, qmax, tok_ok, tok_src, total;
};

// tok_src: per key of each stage, the global address of its region-0 row
// (and of its region-1 row after them), 0 for no key.
__host__ __device__ inline slice_smem make_slice_smem(int pitch, int nstages, int bk, int nregions) {
  slice_smem s{};
  int o = 0;
  auto take = [&](int bytes) {
    const int at = o;
    o += (bytes + 15) / 16 * 16;
    return at;
  };
  const int stage_bytes = nstages * bk * pitch, out_bytes = MR * OP * 4; // the output staging reuses the stages
  s.stages = take(stage_bytes > out_bytes ? stage_bytes : out_bytes);
  s.s_part = take(NW * MR * s_pitch(bk) * 4);
  s.p = take(MR * p_pitch(bk) * 4);
  s.alpha = take(MR * 4);
  s.m_fin = take(MR * 4);
  s.l_fin = take(MR * 4);
  s.rowf = take(MR * 4);
  s.qmax = take(NW * 4);
  s.tok_ok = take(nstages * bk * 4);
  s.tok_src = take(nstages * bk * nregions * 8);
  s.total = o;
  return s;
}

// K A fragments of one 16-key m-tile (keys g, g + 8 at rows r0, r1) for the 4
// k-steps of a 64-dim run (src: the lane's first byte), and of one k-step of a
// 16-dim run. Dim order: k-step j, fragment columns 2t4 + {0, 1} are the lane's
// dims 4j + {0, 1}, columns 2t4 + 8 + {0, 1} its dims 4j + {2, 3}.
template <int KIND>
__device__ __forceinline__ void k_frags4(const unsigned char *r0, const unsigned char *r1, int src, uint32_t (&a)[4][4]) {
  if constexpr (KIND == SK_COPY) {
    const uint4 x0 = *reinterpret_cast<const uint4 *>(r0 + src), x1 = *reinterpret_cast<const uint4 *>(r0 + src + 16);
    const uint4 y0 = *reinterpret_cast<const uint4 *>(r1 + src), y1 = *reinterpret_cast<const uint4 *>(r1 + src + 16);
    const uint32_t xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    const uint32_t ys[8] = {y0.x, y0.y, y0.z, y0.w, y1.x, y1.y, y1.z, y1.w};
#pragma unroll
    for (int j = 0; j < 4; j++) a[j][0] = xs[2 * j], a[j][1] = ys[2 * j], a[j][2] = xs[2 * j + 1], a[j][3] = ys[2 * j + 1];
  } else {
    const uint4 x = *reinterpret_cast<const uint4 *>(r0 + src), y = *reinterpret_cast<const uint4 *>(r1 + src);
    const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
      a[j][0] = mla::e4m3x2_f16(xs[j]), a[j][1] = mla::e4m3x2_f16(ys[j]);
      a[j][2] = mla::e4m3x2_f16(xs[j] >> 16), a[j][3] = mla::e4m3x2_f16(ys[j] >> 16);
    }
  }
}
template <int KIND>
__device__ __forceinline__ void k_frags1(const unsigned char *r0, const unsigned char *r1, int src, uint32_t (&a)[4]) {
  if constexpr (KIND == SK_COPY) {
    const uint2 x = *reinterpret_cast<const uint2 *>(r0 + src), y = *reinterpret_cast<const uint2 *>(r1 + src);
    a[0] = x.x, a[1] = y.x, a[2] = x.y, a[3] = y.y;
  } else {
    const uint32_t x = *reinterpret_cast<const uint32_t *>(r0 + src), y = *reinterpret_cast<const uint32_t *>(r1 + src);
    a[0] = mla::e4m3x2_f16(x), a[1] = mla::e4m3x2_f16(y), a[2] = mla::e4m3x2_f16(x >> 16), a[3] = mla::e4m3x2_f16(y >> 16);
  }
}

// The per-key scale of a stage row (1 for kinds without one).
template <int KIND> __device__ __forceinline__ float key_scale(const unsigned char *row, int ssrc) {
  if constexpr (KIND == SK_FP8_F32) return *reinterpret_cast<const float *>(row + ssrc);
  else if constexpr (KIND == SK_FP8_UE8M0) return mla_decode_scale(MLA_UE8M0, row[ssrc]);
  else return 1.0f;
}

// What a warp knows of its runs: byte offsets (the lane's first byte) and the
// scale's offset in a stage row, and the factor on its S partial for kinds
// scaled per tensor (or 2^k for f16 operands).
struct warp_run {
  int src, ssrc;
  float smul;
};

// S^T partials of the warp over one tile, stored per 16-key m-tile (keys
// 16 kt + (g, g + 8), rows 8 nb + 2 t4 + (0, 1)) in score units: the V slice
// (kind K) plus, on warps with S-only dims (X), their 16 dims.
template <int K, int X, int PITCH, int BK>
__device__ __forceinline__ void s_phase(const unsigned char *stage, int g, int t4, const warp_run &rv, const uint32_t (&qf)[2][8],
                                        bool has_x, const warp_run &rx, const uint32_t (&qx)[2][2], float *sp) {
#pragma unroll
  for (int kt = 0; kt < BK / 16; kt++) {
    const unsigned char *r0 = stage + (16 * kt + g) * PITCH, *r1 = r0 + 8 * PITCH;
    float acc[2][4];
    {
      uint32_t a[4][4];
      k_frags4<K>(r0, r1, rv.src, a);
#pragma unroll
      for (int nb = 0; nb < 2; nb++) {
        acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.f;
#pragma unroll
        for (int j = 0; j < 4; j++) mla::mma_16816<K != SK_COPY>(acc[nb], a[j], qf[nb][2 * j], qf[nb][2 * j + 1]);
      }
      const float s0 = key_scale<K>(r0, rv.ssrc) * rv.smul, s1 = key_scale<K>(r1, rv.ssrc) * rv.smul;
#pragma unroll
      for (int nb = 0; nb < 2; nb++) acc[nb][0] *= s0, acc[nb][1] *= s0, acc[nb][2] *= s1, acc[nb][3] *= s1;
    }
    if constexpr (X >= 0)
      if (has_x) {
      uint32_t a[4];
      k_frags1<X>(r0, r1, rx.src, a);
      const float s0 = key_scale<X>(r0, rx.ssrc) * rx.smul, s1 = key_scale<X>(r1, rx.ssrc) * rx.smul;
#pragma unroll
      for (int nb = 0; nb < 2; nb++) {
        float x[4] = {0.f, 0.f, 0.f, 0.f};
        mla::mma_16816<X != SK_COPY>(x, a, qx[nb][0], qx[nb][1]);
        acc[nb][0] += x[0] * s0, acc[nb][1] += x[1] * s0, acc[nb][2] += x[2] * s1, acc[nb][3] += x[3] * s1;
      }
    }
#pragma unroll
    for (int nb = 0; nb < 2; nb++) {
      float *q = sp + (8 * nb + 2 * t4) * s_pitch(BK) + 16 * kt + g;
      q[0] = acc[nb][0], q[s_pitch(BK)] = acc[nb][1], q[8] = acc[nb][2], q[s_pitch(BK) + 8] = acc[nb][3];
    }
  }
}

// O^T += V^T P'^T for the warp's slice over one tile. P' = P x s / 2^E (per-key
// scaled kinds; E the warp's running scale exponent, O rescaled when it grows),
// P otherwise; f16 operands for fp8 slices, bf16 for bf16 ones.
template <int KIND, int PITCH, int BK>
__device__ __forceinline__ void pv_phase(const unsigned char *stage, const float *Ps, const float *alpha_s, int g, int t4,
                                         const warp_run &r, int &e_run, float (&o)[4][2][4]) {
  constexpr bool F16 = KIND != SK_COPY;
  constexpr int KT = BK / 16, PP = p_pitch(BK);
  float f[KT][4];
  float resc = 1.f;
  if constexpr (scaled_per_key(KIND)) {
    float mx = 0.f;
#pragma unroll
    for (int c = 0; c < KT; c++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        f[c][i] = key_scale<KIND>(stage + (16 * c + 2 * t4 + (i & 1) + 8 * (i >> 1)) * PITCH, r.ssrc);
        mx = fmaxf(mx, fabsf(f[c][i]));
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const int et = mx > 0.f ? min(max((int)((__float_as_uint(mx) >> 23) & 0xFF) - 127, -126), 126) : -1000;
    if (et > e_run) {
      resc = e_run == -1000 ? 0.f : exp2f((float)(e_run - et)); // O holds nothing yet, or O x 2^E_old / 2^E_new
      e_run = et;
    }
    const float inv = __uint_as_float((uint32_t)(127 - (e_run == -1000 ? 0 : e_run)) << 23);
#pragma unroll
    for (int c = 0; c < KT; c++)
#pragma unroll
      for (int i = 0; i < 4; i++) f[c][i] *= inv;
  }
  {
    float al[2][2];
#pragma unroll
    for (int nb = 0; nb < 2; nb++) al[nb][0] = alpha_s[8 * nb + 2 * t4] * resc, al[nb][1] = alpha_s[8 * nb + 2 * t4 + 1] * resc;
    if (__any_sync(0xffffffffu, al[0][0] != 1.f || al[0][1] != 1.f || al[1][0] != 1.f || al[1][1] != 1.f)) {
#pragma unroll
      for (int j = 0; j < 4; j++)
#pragma unroll
        for (int nb = 0; nb < 2; nb++)
          o[j][nb][0] *= al[nb][0], o[j][nb][1] *= al[nb][1], o[j][nb][2] *= al[nb][0], o[j][nb][3] *= al[nb][1];
    }
  }
#pragma unroll
  for (int c = 0; c < KT; c++) {
    uint32_t pb[2][2];
#pragma unroll
    for (int nb = 0; nb < 2; nb++) {
      const float *pr = Ps + (8 * nb + g) * PP + 16 * c + 2 * t4;
      const float2 lo = *reinterpret_cast<const float2 *>(pr), hi = *reinterpret_cast<const float2 *>(pr + 8);
      if constexpr (scaled_per_key(KIND)) {
        pb[nb][0] = mla::pack_f16x2(lo.x * f[c][0], lo.y * f[c][1]);
        pb[nb][1] = mla::pack_f16x2(hi.x * f[c][2], hi.y * f[c][3]);
      } else if constexpr (F16) {
        pb[nb][0] = mla::pack_f16x2(lo.x, lo.y), pb[nb][1] = mla::pack_f16x2(hi.x, hi.y);
      } else {
        pb[nb][0] = mla::pack_bf16x2(lo.x, lo.y), pb[nb][1] = mla::pack_bf16x2(hi.x, hi.y);
      }
    }
    const unsigned char *r0 = stage + (16 * c + g) * PITCH, *r1 = r0 + 8 * PITCH;
    uint32_t a[4][4];
    k_frags4<KIND>(r0, r1, r.src, a);
#pragma unroll
    for (int j = 0; j < 4; j++) {
      // V^T tile: dims of k-step j x keys 16c..16c+15, the four 8x8 blocks of K transposed
      const uint32_t vt[4] = {mla::movmatrix_trans(a[j][0]), mla::movmatrix_trans(a[j][2]), mla::movmatrix_trans(a[j][1]),
                              mla::movmatrix_trans(a[j][3])};
#pragma unroll
      for (int nb = 0; nb < 2; nb++) mla::mma_16816<F16>(o[j][nb], vt, pb[nb][0], pb[nb][1]);
    }
  }
}

// Key n of tile `tile`: whether it exists, and the global addresses of its
// region rows (computed once per key, so the copies are address + offset).
template <class LS, int BK>
__device__ __forceinline__ void key_rows(const params &p, const mla_attn::cta_work &w, int tile, int n, int &ok, int64_t &a0,
                                         int64_t &a1) {
  constexpr mla_layout_desc D = LS::host;
  int page, off;
  mla_attn::token_of<BK, LS::host.block_size>(p, w.r, w.qi, w.nkeys, tile, n, page, off); // specialized: compiled for its page size
  ok = page >= 0;
  const int64_t pb = (int64_t)(uintptr_t)p.v.base + (ok ? (int64_t)page * p.v.page_stride : 0);
  a0 = ok ? pb + D.region_off[0] + (int64_t)off * p.v.token_stride : 0;
  a1 = ok && D.nregions == 2 ? pb + D.region_off[D.nregions - 1] + (int64_t)off * D.region_row_bytes[D.nregions - 1] : 0;
}

// Copies of one tile: NT / BK threads per key row, compile-time chunk counts
// and offsets; missing keys become zero rows (zero-fill, nothing read).
template <class LS, int PITCH, int BK>
__device__ __forceinline__ void issue_tile(const params &p, unsigned char *stage, const int64_t *src) {
  constexpr mla_layout_desc D = LS::host;
  constexpr int TPR = copy_tpr(BK);
  const int tid = threadIdx.x, n = tid / TPR, j = tid % TPR;
  if (TPR * BK < NT && n >= BK) return;
  const int64_t a0 = src[n];
  const bool ok = a0 != 0;
  const unsigned char *fallback = p.v.base;
  const uint32_t dst = mla::smem_addr(stage + n * PITCH);
  {
    constexpr int NC = D.region_row_bytes[0] / 16;
    const unsigned char *row = ok ? reinterpret_cast<const unsigned char *>(a0) : fallback;
#pragma unroll
    for (int k = 0; k < (NC + TPR - 1) / TPR; k++) {
      const int c = j + TPR * k;
      if (k < NC / TPR || c < NC) mla::cp_async16(dst + c * 16, ok ? row + c * 16 : fallback, ok ? 16 : 0);
    }
  }
  if constexpr (D.nregions == 2) {
    constexpr int R1 = D.region_row_bytes[1], G = region_gran(D, 1), NC = R1 / G, S1 = stage_off(D, 1);
    const int64_t a1 = src[BK + n];
    const unsigned char *row = ok ? reinterpret_cast<const unsigned char *>(a1) : fallback;
#pragma unroll
    for (int k = 0; k < (NC + TPR - 1) / TPR; k++) {
      const int c = j + TPR * k;
      if (c < NC) {
        const unsigned char *s = ok ? row + c * G : fallback;
        if constexpr (G == 16) mla::cp_async16(dst + S1 + c * G, s, ok ? G : 0);
        else if constexpr (G == 8) mla::cp_async8(dst + S1 + c * G, s, ok ? G : 0);
        else mla::cp_async4(dst + S1 + c * G, s, ok ? G : 0);
      }
    }
  }
}

// Q of rows g and g + 8 for dims [d0, d0 + 16) (the lane's run): B fragments
// of 4 k-steps in the kernel's dim order, bf16 bits.
__device__ __forceinline__ void load_q16(const params &p, const mla_attn::cta_work &w, int g, int d0, uint32_t (&qf)[2][8]) {
#pragma unroll
  for (int nb = 0; nb < 2; nb++) {
    uint4 v0 = make_uint4(0, 0, 0, 0), v1 = v0;
    const int row = 8 * nb + g;
    if (row < w.nrows) {
      int i, h;
      mla_attn::row_coords(p, w.qi, w.row0 + row, i, h);
      v0 = mla_attn::load_q8(p, w.r, i, h, d0 / 8), v1 = mla_attn::load_q8(p, w.r, i, h, d0 / 8 + 1);
    }
    qf[nb][0] = v0.x, qf[nb][1] = v0.y, qf[nb][2] = v0.z, qf[nb][3] = v0.w;
    qf[nb][4] = v1.x, qf[nb][5] = v1.y, qf[nb][6] = v1.z, qf[nb][7] = v1.w;
  }
}

template <class LS, int BK>
__global__ void __launch_bounds__(NT, 2) attn_decode_slice_kernel(const __grid_constant__ params p) {
  constexpr mla_layout_desc D = LS::host;
  constexpr int PITCH = slice_pitch(D), NX = (D.k_dims - DV) / 16, STAGE = BK * PITCH, NR = D.nregions;
  constexpr int SPK = s_pitch(BK), PPK = p_pitch(BK), KPL = (BK + 31) / 32; // keys per lane in the softmax
  static_assert(slice_ok(D) && two_runs(D), "layout outside the slice kernel's assumptions");
  static_assert(BK % 16 == 0 && BK >= 32 && BK <= 64, "tiles of 32 to 64 keys, whole m-tiles");
  constexpr int SPLIT = kind_split(D), KA = slice_kind(D, 0), KB = slice_kind(D, NW - 1);
  constexpr int KX = NX ? chunk_at(D, DV).kind : -1;
  extern __shared__ __align__(16) unsigned char smem[];
  const slice_smem L = make_slice_smem(PITCH, p.nstages, BK, NR);
  unsigned char *stages = smem + L.stages;
  float *s_part = reinterpret_cast<float *>(smem + L.s_part);
  float *Ps = reinterpret_cast<float *>(smem + L.p);
  float *alpha_s = reinterpret_cast<float *>(smem + L.alpha);
  float *m_fin = reinterpret_cast<float *>(smem + L.m_fin);
  float *l_fin = reinterpret_cast<float *>(smem + L.l_fin);
  float *rowf = reinterpret_cast<float *>(smem + L.rowf);
  uint32_t *qmax_w = reinterpret_cast<uint32_t *>(smem + L.qmax);
  int *tok_ok = reinterpret_cast<int *>(smem + L.tok_ok);
  int64_t *tok_src = reinterpret_cast<int64_t *>(smem + L.tok_src);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const mla_attn::cta_work w = mla_attn::cta_work_of<MR, BK>(p);
  if (w.t_begin >= w.t_end) return mla_attn::write_empty_split<NT>(p, w, tid);
  const bool in_a = warp < SPLIT, has_x = warp < NX;
  const int kind = in_a ? KA : KB;

  // This warp's runs: its V slice, and the S-only dims of warps 0..NX-1.
  warp_run rv{0, 0, 1.f}, rx{0, 0, 1.f};
  static_for<NW>([&](auto wc) {
    constexpr int W = decltype(wc)::value;
    constexpr spec_chunk C = chunk_at(LS::host, W * VW);
    if (warp == W) rv.src = C.src + 16 * t4 * C.esize, rv.ssrc = C.scale_src;
    if constexpr (W < NX) {
      constexpr spec_chunk X = chunk_at(LS::host, DV + 16 * W);
      if (warp == W) rx.src = X.src + 4 * t4 * X.esize, rx.ssrc = X.scale_src;
    }
  });

  // Q: B fragments in registers for the whole kernel; f16 (scaled by 2^-k,
  // exact, so every finite |q| stays below 2^15) where the run is e4m3.
  uint32_t qf[2][8], qx[2][2] = {{0u, 0u}, {0u, 0u}};
  load_q16(p, w, g, warp * VW + 16 * t4, qf);
  if (has_x) // the lane's 4 dims: half of an 8-dim chunk
#pragma unroll
    for (int nb = 0; nb < 2; nb++) {
      const int row = 8 * nb + g;
      if (row >= w.nrows) continue;
      int i, h;
      mla_attn::row_coords(p, w.qi, w.row0 + row, i, h);
      const uint4 v = mla_attn::load_q8(p, w.r, i, h, (DV + 16 * warp + 4 * t4) / 8);
      qx[nb][0] = t4 & 1 ? v.z : v.x, qx[nb][1] = t4 & 1 ? v.w : v.y;
    }
  {
    uint32_t mx = 0;
    if (kind != SK_COPY)
#pragma unroll
      for (int nb = 0; nb < 2; nb++)
#pragma unroll
        for (int i = 0; i < 8; i++) mx = max(mx, mla_attn::bf16x2_absmax(qf[nb][i]));
    if (has_x && KX != SK_COPY)
#pragma unroll
      for (int nb = 0; nb < 2; nb++) mx = max(mx, max(mla_attn::bf16x2_absmax(qx[nb][0]), mla_attn::bf16x2_absmax(qx[nb][1])));
    mx = __reduce_max_sync(0xffffffffu, mx);
    if (lane == 0) qmax_w[warp] = mx;
  }
  const int nst = p.nstages;
  for (int i = tid; i < nst * BK; i += NT) {
    int ok;
    int64_t a0, a1;
    key_rows<LS, BK>(p, w, w.t_begin + i / BK, i % BK, ok, a0, a1);
    const int st = i / BK, n = i % BK;
    tok_ok[st * BK + n] = ok, tok_src[st * BK * NR + n] = a0;
    if (NR == 2) tok_src[st * BK * NR + BK + n] = a1;
  }
  __syncthreads();
  const float tscale = p.v.tensor_scale ? __ldg(p.v.tensor_scale) : 1.0f;
  {
    uint32_t mx = 0;
#pragma unroll
    for (int i = 0; i < NW; i++) mx = max(mx, qmax_w[i]);
    const int e = (int)(mx >> 7) - 127; // exponent of the largest f16-bound |q|
    const int k = e >= 15 ? e - 14 : 0;
    const float qs = __uint_as_float((uint32_t)(127 - k) << 23), qk = __uint_as_float((uint32_t)(127 + k) << 23);
    if (kind != SK_COPY) {
#pragma unroll
      for (int nb = 0; nb < 2; nb++)
#pragma unroll
        for (int i = 0; i < 8; i++) qf[nb][i] = mla_attn::bf16x2_to_f16x2(qf[nb][i], qs);
      rv.smul = (kind == SK_FP8_TENSOR ? tscale : 1.0f) * qk;
    }
    if (has_x && KX != SK_COPY) {
#pragma unroll
      for (int nb = 0; nb < 2; nb++) qx[nb][0] = mla_attn::bf16x2_to_f16x2(qx[nb][0], qs), qx[nb][1] = mla_attn::bf16x2_to_f16x2(qx[nb][1], qs);
      rx.smul = (KX == SK_FP8_TENSOR ? tscale : 1.0f) * qk;
    }
  }
  for (int st = 0; st + 1 < nst; st++) {
    if (w.t_begin + st < w.t_end) issue_tile<LS, PITCH, BK>(p, stages + st * STAGE, tok_src + st * BK * NR);
    mla::cp_async_commit();
  }

  // Softmax rows of this warp: 2w and 2w + 1 (running max and sum in registers).
  const bool causal = !p.sparse && p.causal && p.s_q > 1;
  int lim[2];
  float m_run[2] = {-CUDART_INF_F, -CUDART_INF_F}, l_run[2] = {0.f, 0.f};
#pragma unroll
  for (int rr = 0; rr < 2; rr++) lim[rr] = causal ? w.s_k - p.s_q + (w.row0 + 2 * warp + rr) / p.h_q : 0x7fffffff;

  float o[4][2][4];
#pragma unroll
  for (int j = 0; j < 4; j++)
#pragma unroll
    for (int nb = 0; nb < 2; nb++) o[j][nb][0] = o[j][nb][1] = o[j][nb][2] = o[j][nb][3] = 0.f;
  int e_run = -1000; // the warp's running scale exponent (per-key scaled slices)

  mla_attn::wait_stages(nst);
  __syncthreads(); // tile 0 landed

  const int niter = w.t_end - w.t_begin;
  int st = 0;
  for (int u = 0; u < niter; u++, st = st + 1 == nst ? 0 : st + 1) {
    const int t = w.t_begin + u;
    const unsigned char *stage = stages + st * STAGE;
    // rows of tile t + nst, for the ring slot this tile frees (written after
    // B2), by the last warp: the S-only dims load the first ones
    int pf_ok[KPL];
    int64_t pf0[KPL], pf1[KPL];
    if (warp == NW - 1)
#pragma unroll
      for (int i = 0; i < KPL; i++)
        if (lane + 32 * i < BK) key_rows<LS, BK>(p, w, t + nst, lane + 32 * i, pf_ok[i], pf0[i], pf1[i]);

    if (in_a) s_phase<KA, KX, PITCH, BK>(stage, g, t4, rv, qf, has_x, rx, qx, s_part + warp * MR * SPK);
    else s_phase<KB, KX, PITCH, BK>(stage, g, t4, rv, qf, has_x, rx, qx, s_part + warp * MR * SPK);
    __syncthreads(); // B1: S partials complete; every warp is past the previous tile's P V
    {
      const int ist = st == 0 ? nst - 1 : st - 1;
      if (t + nst - 1 < w.t_end) issue_tile<LS, PITCH, BK>(p, stages + ist * STAGE, tok_src + ist * BK * NR);
      mla::cp_async_commit();
    }
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
      const int row = 2 * warp + rr;
      float s[KPL];
      float mx = -CUDART_INF_F;
#pragma unroll
      for (int i = 0; i < KPL; i++) {
        const int key = lane + 32 * i;
        s[i] = -CUDART_INF_F;
        if (BK % 32 == 0 || key < BK) {
          float v = s_part[row * SPK + key];
#pragma unroll
          for (int k = 1; k < NW; k++) v += s_part[k * MR * SPK + row * SPK + key];
          if (tok_ok[st * BK + key] && t * BK + key <= lim[rr]) s[i] = v * p.scale_log2;
        }
        mx = fmaxf(mx, s[i]);
      }
      float base; // lazy rescaling (mla_attn::online_max)
      const float alpha = mla_attn::online_max(m_run[rr], fmaxf(m_run[rr], warp_max(mx)), base);
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < KPL; i++) {
        const float pv = exp2f(s[i] - base);
        if (BK % 32 == 0 || lane + 32 * i < BK) Ps[row * PPK + lane + 32 * i] = pv;
        sum += pv;
      }
      l_run[rr] = l_run[rr] * alpha + warp_sum(sum);
      if (lane == 0) alpha_s[row] = alpha;
    }
    mla_attn::wait_stages(nst);
    __syncthreads(); // B2: P and alpha complete; the next tile landed

    if (in_a) pv_phase<KA, PITCH, BK>(stage, Ps, alpha_s, g, t4, rv, e_run, o);
    else pv_phase<KB, PITCH, BK>(stage, Ps, alpha_s, g, t4, rv, e_run, o);
    if (warp == NW - 1)
#pragma unroll
      for (int i = 0; i < KPL; i++) {
        const int n = lane + 32 * i;
        if (BK % 32 && n >= BK) continue;
        tok_ok[st * BK + n] = pf_ok[i], tok_src[st * BK * NR + n] = pf0[i];
        if (NR == 2) tok_src[st * BK * NR + BK + n] = pf1[i];
      }
  }
  mla::cp_async_wait<0>();
  if (lane == 0) {
#pragma unroll
    for (int rr = 0; rr < 2; rr++) m_fin[2 * warp + rr] = m_run[rr], l_fin[2 * warp + rr] = l_run[rr];
  }
  __syncthreads(); // every warp is past its last P V: the stages become the output staging

  // O^T fragments to rows of f32 in shared memory, times the warp's factor
  // (2^E for per-key scaled slices, the tensor scale); dims back in order.
  {
    float wf = 1.f;
    if (scaled_per_key(kind) && e_run != -1000) wf = __uint_as_float((uint32_t)(127 + e_run) << 23);
    if (kind == SK_FP8_TENSOR) wf = tscale;
    float *ob = reinterpret_cast<float *>(stages);
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int da = warp * VW + 16 * (g >> 1) + 4 * j + (g & 1);
#pragma unroll
      for (int nb = 0; nb < 2; nb++) {
        const int row = 8 * nb + 2 * t4;
        ob[row * OP + da] = o[j][nb][0] * wf, ob[(row + 1) * OP + da] = o[j][nb][1] * wf;
        ob[row * OP + da + 2] = o[j][nb][2] * wf, ob[(row + 1) * OP + da + 2] = o[j][nb][3] * wf;
      }
    }
  }
  if (tid < MR) {
    const int row = tid;
    const float l = l_fin[row];
    float f = l != 0.f ? 1.0f / l : 0.f; // NaN stays NaN (write_lse)
    if (p.nparts == 1 && p.sink && l != 0.f && row < w.nrows) {
      int i, h;
      mla_attn::row_coords(p, w.qi, w.row0 + row, i, h);
      const float lse_nat = (m_fin[row] + log2f(l)) * 0.69314718055994531f;
      f *= 1.0f / (1.0f + expf(__ldg(p.sink + h) - lse_nat));
    }
    rowf[row] = f;
  }
  __syncthreads();
  {
    const float *ob = reinterpret_cast<const float *>(stages);
    for (int idx = tid; idx < w.nrows * (DV / 4); idx += NT) {
      const int row = idx / (DV / 4), c = idx - row * (DV / 4);
      mla_attn::store_out4(p, w, row, c, *reinterpret_cast<const float4 *>(ob + row * OP + 4 * c), rowf[row]);
    }
  }
  mla_attn::write_lse<NT>(p, w, m_fin, l_fin, tid);
}

} // namespace mla_attn_slice

#endif
