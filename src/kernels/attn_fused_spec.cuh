// Compile-time-specialized decode kernel for the memory-bound shape: 16 query
// rows per CTA on a staged (non-bf16) layout whose descriptor equals one of the
// built-in descriptors (kernels_rtc/include/mla/builtin_layouts.h, selected by
// mla_layout_desc_same in attn_decode.cu, never by name). The descriptor is a
// compile-time constant here, so staging (region copies) and conversion (field,
// dtype, scale position of every 8-dim chunk) are straight-line code with
// immediate offsets: no chunk plans, no per-chunk dispatch. Page / token
// strides, region base offsets of the view and the tensor scale stay runtime.
//
// Per 32-key tile (3 CTA barriers):
//   1. cp.async of the tile's token rows (8 threads per row, 16-byte copies);
//   2. S partials: the K dims are cut into 32-dim quads, scheduled over the 8
//      warps (fp8 quads first, round robin, then the cheap bf16 ones), each warp
//      keeping its quads' Q A fragments in registers for the whole kernel. Lane
//      (g, t4) rebuilds chunk 4q + t4 of tokens g, g + 8, g + 16, g + 24: 8 bf16
//      that serve directly as the B fragments of two k-steps (the dot product
//      runs over a permuted dim order, the same for Q); V dims also go to the
//      bf16 V tile. Each warp's 16 x 32 partial S goes to shared memory;
//   3. softmax row-wise: warp w owns rows 2w, 2w + 1 (lane = key), sums the 8
//      partials, keeps the running max and sum in registers; P (bf16) and the
//      rescale factors to shared memory;
//   4. O = alpha O + P V, each warp 64 output dims.
// Semantics are the generic kernel's: same dequantization (fp32 product
// rounded once to bf16), P rounded to bf16 before P V, same outputs; except
// on layouts whose K is e4m3 under one tensor scale (unscaled_f16): there the
// codes themselves are multiplied as f16 (exact), Q (scaled by 2^-k) and P
// are f16, and the scale is applied to the scores and to O.
#ifndef MLA_ATTN_FUSED_SPEC_CUH
#define MLA_ATTN_FUSED_SPEC_CUH

#include <utility>

#include "attn_decode_kernel.cuh"
#include "mla/builtin_spec.cuh"

namespace mla_attn_spec {

using mla_attn::BN;
using mla_attn::DV;
using mla_attn::params;

constexpr int NW = 8, NT = NW * 32, MR = 16;
constexpr int PP = BN + 8;   // P pitch (bf16)
constexpr int VP = DV + 8;   // V tile pitch (bf16): rows 16 B apart mod 128 for ldmatrix
constexpr int SP = BN + 8;   // S partial pitch (f32): float2 stores of 4 rows x 4 lanes hit distinct banks

enum spec_kind { SK_ZERO, SK_COPY, SK_FP8_ONE, SK_FP8_TENSOR, SK_FP8_F32, SK_FP8_UE8M0, SK_BAD };

struct spec_chunk {
  int kind, src, scale_src, esize;
};

// Byte offset of region r's token row in a stage row (the launcher's rule: rows rounded to 16).
__host__ __device__ constexpr int stage_off(const mla_layout_desc &d, int r) {
  int o = 0;
  for (int k = 0; k < r && k < MLA_LAYOUT_MAX_REGIONS; k++) o += (d.region_row_bytes[k] + 15) / 16 * 16;
  return o;
}

// Stage pitch: all regions, padded to 32 bytes past a multiple of 128 (the fused path's rule).
__host__ __device__ constexpr int stage_pitch(const mla_layout_desc &d) {
  const int o = stage_off(d, d.nregions);
  return o + (32 - o % 128 + 128) % 128;
}

// cp.async size for region r of a spec (the row bytes allow it; the launcher checks the view).
__host__ __device__ constexpr int region_gran(const mla_layout_desc &d, int r) {
  return d.region_row_bytes[r] % 16 == 0 ? 16 : d.region_row_bytes[r] % 8 == 0 ? 8 : d.region_row_bytes[r] % 4 == 0 ? 4 : 1;
}

// How dims [d0, d0 + 8) are rebuilt from a stage row.
__host__ __device__ constexpr spec_chunk chunk_at(const mla_layout_desc &d, int d0) {
  for (int f = 0; f < d.nfields && f < MLA_LAYOUT_MAX_FIELDS; f++) {
    const mla_layout_field &fd = d.fields[f];
    if (fd.role != MLA_FIELD_DATA || d0 < fd.dim_lo || d0 >= fd.dim_lo + fd.count) continue;
    if (d0 + 8 > fd.dim_lo + fd.count) return {SK_BAD, 0, 0, 0};
    const int e = d0 - fd.dim_lo;
    const int base = stage_off(d, fd.region) + fd.byte_off;
    if (fd.dtype == MLA_BF16) {
      if (fd.scale_kind != MLA_SCALE_NONE || (base + 2 * e) % 16) return {SK_BAD, 0, 0, 0};
      return {SK_COPY, base + 2 * e, -1, 2};
    }
    if (fd.dtype != MLA_E4M3 || (base + e) % 8) return {SK_BAD, 0, 0, 0};
    if (fd.scale_kind == MLA_SCALE_NONE) return {SK_FP8_ONE, base + e, -1, 1};
    if (fd.scale_kind == MLA_SCALE_TENSOR) return {SK_FP8_TENSOR, base + e, -1, 1};
    if (e / fd.group != (e + 7) / fd.group) return {SK_BAD, 0, 0, 0};
    const int ss = stage_off(d, fd.scale_region) + fd.scale_off;
    if (fd.scale_dtype == MLA_F32) {
      const int at = ss + (e / fd.group) * 4;
      return at % 4 ? spec_chunk{SK_BAD, 0, 0, 0} : spec_chunk{SK_FP8_F32, base + e, at, 1};
    }
    if (fd.scale_dtype == MLA_UE8M0) return {SK_FP8_UE8M0, base + e, ss + e / fd.group, 1};
    return {SK_BAD, 0, 0, 0};
  }
  return {SK_ZERO, 0, -1, 0};
}

// The specialized kernel's assumptions: K of 512 or 576 dims, V = 512, every
// run of 4 chunks (lanes t4 = 0..3 of a quad) of one kind with one scale and
// contiguous bytes, at most two regions, region rows copyable by cp.async.
__host__ __device__ constexpr bool spec_ok(const mla_layout_desc &d) {
  if ((d.k_dims != 512 && d.k_dims != 576) || d.v_dims != DV || d.nregions < 1 || d.nregions > 2) return false;
  if (d.region_row_bytes[0] % 16 || (d.nregions == 2 && d.region_row_bytes[1] % 4)) return false;
  for (int c = 0; c < d.k_dims / 8; c += 4) {
    const spec_chunk a = chunk_at(d, c * 8);
    if (a.kind == SK_BAD || a.kind == SK_ZERO) return false;
    for (int t = 1; t < 4; t++) {
      const spec_chunk b = chunk_at(d, (c + t) * 8);
      if (b.kind != a.kind || b.scale_src != a.scale_src || (a.kind != SK_ZERO && b.src != a.src + t * 8 * a.esize))
        return false;
    }
  }
  return true;
}

__host__ __device__ constexpr bool is_fp8_kind(int k) { return k >= SK_FP8_ONE && k <= SK_FP8_UE8M0; }

// The k-th 32-dim quad of the S schedule: fp8 quads first, then the others;
// warp w takes entries w, w + 8, w + 16 (so the bf16 quads land on the warps
// with fewer fp8 quads). -1 past the end.
__host__ __device__ constexpr int quad_at(const mla_layout_desc &d, int k) {
  int n = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int q = 0; q < d.k_dims / 32; q++)
      if (is_fp8_kind(chunk_at(d, q * 32).kind) == (pass == 0)) {
        if (n == k) return q;
        n++;
      }
  return -1;
}

__host__ __device__ constexpr bool has_kind(const mla_layout_desc &d, int kind) {
  for (int q = 0; q < d.k_dims / 32; q++)
    if (chunk_at(d, q * 32).kind == kind) return true;
  return false;
}

// Every K chunk e4m3 under one scale for the whole tensor (or none): the
// kernel multiplies the codes themselves, as f16 (every e4m3 value is exactly
// an f16: one conversion per pair, no scale product, no bf16 rounding), with Q
// and P in f16, and applies the tensor scale once to the scores and once to O.
__host__ __device__ constexpr bool unscaled_f16(const mla_layout_desc &d) {
  const int k0 = chunk_at(d, 0).kind;
  if (k0 != SK_FP8_TENSOR && k0 != SK_FP8_ONE) return false;
  for (int q = 0; q < d.k_dims / 32; q++)
    if (chunk_at(d, q * 32).kind != k0) return false;
  return true;
}

// Shared-memory plan (host and device agree).
struct spec_smem {
  int p, stages, vb, s_part, alpha, m_fin, l_fin, tok_page, tok_off, total;
};

__host__ __device__ inline spec_smem make_spec_smem(int dqk, int pitch, int nstages) {
  spec_smem s{};
  int o = 0;
  auto take = [&](int bytes) {
    const int at = o;
    o += (bytes + 15) / 16 * 16;
    return at;
  };
  (void)dqk;
  s.p = take(MR * PP * 2);
  s.stages = take(nstages * BN * pitch);
  s.vb = take(BN * VP * 2);
  s.s_part = take(NW * MR * SP * 4);
  s.alpha = take(MR * 4);
  s.m_fin = take(MR * 4);
  s.l_fin = take(MR * 4);
  s.tok_page = take(nstages * BN * 4);
  s.tok_off = take(nstages * BN * 4);
  s.total = o;
  return s;
}

// The built-in layouts as types (mla/builtin_spec.cuh). Only the read-distinct
// fp8 layouts get a kernel (fp8_ds_mla_amax and fp8_v4_vllm read the same
// bytes the same way).
MLA_BUILTIN_SPEC(fp8_pertensor, MLA_BUILTIN_DESC_fp8_pertensor)
MLA_BUILTIN_SPEC(fp8_ds_mla, MLA_BUILTIN_DESC_fp8_ds_mla)
MLA_BUILTIN_SPEC(fp8_v4, MLA_BUILTIN_DESC_fp8_v4)

static_assert(spec_ok(spec_fp8_pertensor::host) && spec_ok(spec_fp8_ds_mla::host) && spec_ok(spec_fp8_v4::host),
              "built-in fp8 layouts fit the specialized decode kernel");

template <int... J, class F> __device__ __forceinline__ void static_for_(std::integer_sequence<int, J...>, F &&f) {
  (f(std::integral_constant<int, J>{}), ...);
}
template <int N, class F> __device__ __forceinline__ void static_for(F &&f) {
  static_for_(std::make_integer_sequence<int, N>{}, f);
}

// Starts the copies of one tile: 8 threads per token row, compile-time chunk
// counts and offsets; missing keys become zero rows (zero-fill).
template <class LS>
__device__ __forceinline__ void issue_tile(const params &p, unsigned char *stage, const int *pg, const int *of) {
  constexpr mla_layout_desc D = LS::host;
  constexpr int PITCH = stage_pitch(D);
  const int tid = threadIdx.x, n = tid >> 3, j = tid & 7;
  const int page = pg[n];
  const bool ok = page >= 0;
  const unsigned char *base = p.v.base;
  const unsigned char *page_base = base + (ok ? (int64_t)page * p.v.page_stride : 0);
  const int off = of[n];
  const uint32_t dst = mla::smem_addr(stage + n * PITCH);
  {
    constexpr int NC = D.region_row_bytes[0] / 16;
    constexpr int64_t RO = D.region_off[0];
    const unsigned char *row = ok ? page_base + RO + (int64_t)off * p.v.token_stride + j * 16 : base;
    const int sz = ok ? 16 : 0;
#pragma unroll
    for (int k = 0; k < (NC + 7) / 8; k++)
      if (k < NC / 8 || j + 8 * k < NC) mla::cp_async16(dst + (j + 8 * k) * 16, ok ? row + k * 128 : base, sz);
  }
  if constexpr (D.nregions == 2) {
    constexpr int R1 = D.region_row_bytes[1], G = region_gran(D, 1), NC = R1 / G, S1 = stage_off(D, 1);
    constexpr int64_t RO = D.region_off[1];
    const unsigned char *row = ok ? page_base + RO + (int64_t)off * R1 : base;
#pragma unroll
    for (int k = 0; k < (NC + 7) / 8; k++) {
      const int c = j + 8 * k;
      if (c < NC) {
        const unsigned char *s = ok ? row + c * G : base;
        if constexpr (G == 16) mla::cp_async16(dst + S1 + c * G, s, ok ? G : 0);
        else if constexpr (G == 8) mla::cp_async8(dst + S1 + c * G, s, ok ? G : 0);
        else mla::cp_async4(dst + S1 + c * G, s, ok ? G : 0);
      }
    }
  }
}

// One quad slot of a warp: quad q (chunks 4q..4q+3, lane t4 takes 4q + t4),
// its chunk kind, the lane's byte offsets of the 8 values and of the scale in
// a stage row, and whether its dims are V dims.
struct slot {
  int q, kind, src, ssrc, is_v;
};

template <int KIND, bool F16>
__device__ __forceinline__ uint4 convert(const unsigned char *row, const slot &s, float tscale) {
  if constexpr (F16) return mla::e4m3x8_f16(*reinterpret_cast<const uint2 *>(row + s.src));
  else if constexpr (KIND == SK_COPY) return *reinterpret_cast<const uint4 *>(row + s.src);
  else {
    float sc = 1.0f;
    if constexpr (KIND == SK_FP8_TENSOR) sc = tscale;
    else if constexpr (KIND == SK_FP8_F32) sc = *reinterpret_cast<const float *>(row + s.ssrc);
    else if constexpr (KIND == SK_FP8_UE8M0) sc = mla_decode_scale(MLA_UE8M0, row[s.ssrc]);
    return mla::e4m3x8_scaled_bf16(*reinterpret_cast<const uint2 *>(row + s.src), sc);
  }
}

// The slot's chunks of the 4 token groups of a tile: B fragments for S, V to the V tile.
template <int KIND, class LS>
__device__ __forceinline__ void run_slot(const unsigned char *rows, unsigned char *vrow, const slot &s, const uint32_t (&qa)[4],
                                         const uint32_t (&qb)[4], float tscale, float (&acc)[4][4]) {
  constexpr int PITCH = stage_pitch(LS::host);
  constexpr bool F16 = unscaled_f16(LS::host);
#pragma unroll
  for (int nt = 0; nt < 4; nt++) {
    const uint4 kv = convert<KIND, F16>(rows + nt * 8 * PITCH, s, tscale);
    if (s.is_v) *reinterpret_cast<uint4 *>(vrow + nt * 8 * VP * 2) = kv;
    mla::mma_16816<F16>(acc[nt], qa, kv.x, kv.y);
    mla::mma_16816<F16>(acc[nt], qb, kv.z, kv.w);
  }
}

template <class LS>
__device__ __forceinline__ void dispatch_slot(const unsigned char *rows, unsigned char *vrow, const slot &s, const uint32_t (&qa)[4],
                                              const uint32_t (&qb)[4], float tscale, float (&acc)[4][4]) {
  constexpr mla_layout_desc D = LS::host;
  if constexpr (has_kind(D, SK_FP8_F32))
    if (s.kind == SK_FP8_F32) return run_slot<SK_FP8_F32, LS>(rows, vrow, s, qa, qb, tscale, acc);
  if constexpr (has_kind(D, SK_FP8_UE8M0))
    if (s.kind == SK_FP8_UE8M0) return run_slot<SK_FP8_UE8M0, LS>(rows, vrow, s, qa, qb, tscale, acc);
  if constexpr (has_kind(D, SK_FP8_TENSOR))
    if (s.kind == SK_FP8_TENSOR) return run_slot<SK_FP8_TENSOR, LS>(rows, vrow, s, qa, qb, tscale, acc);
  if constexpr (has_kind(D, SK_FP8_ONE))
    if (s.kind == SK_FP8_ONE) return run_slot<SK_FP8_ONE, LS>(rows, vrow, s, qa, qb, tscale, acc);
  if constexpr (has_kind(D, SK_COPY))
    if (s.kind == SK_COPY) return run_slot<SK_COPY, LS>(rows, vrow, s, qa, qb, tscale, acc);
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

template <class LS>
__global__ void __launch_bounds__(NT, 2) attn_decode_spec_kernel(const __grid_constant__ params p) {
  constexpr mla_layout_desc D = LS::host;
  constexpr int DQK = D.k_dims, PITCH = stage_pitch(D), NQ = DQK / 32, NS = (NQ + NW - 1) / NW;
  static_assert(spec_ok(D), "layout outside the specialized kernel's assumptions");
  extern __shared__ __align__(16) unsigned char smem[];
  const spec_smem L = make_spec_smem(DQK, PITCH, p.nstages);
  uint16_t *Ps = reinterpret_cast<uint16_t *>(smem + L.p);
  unsigned char *stages = smem + L.stages;
  unsigned char *Vb = smem + L.vb;
  float *s_part = reinterpret_cast<float *>(smem + L.s_part);
  float *alpha_s = reinterpret_cast<float *>(smem + L.alpha);
  float *m_fin = reinterpret_cast<float *>(smem + L.m_fin);
  float *l_fin = reinterpret_cast<float *>(smem + L.l_fin);
  int *tok_page = reinterpret_cast<int *>(smem + L.tok_page);
  int *tok_off = reinterpret_cast<int *>(smem + L.tok_off);
  constexpr int STAGE_BYTES = BN * PITCH;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const mla_attn::cta_work w = mla_attn::cta_work_of<MR>(p);
  const int prob = w.prob, row0 = w.row0, nrows = w.nrows, r = w.r, qi = w.qi, s_k = w.s_k, nkeys = w.nkeys;
  const int t_begin = w.t_begin, t_end = w.t_end;
  const int64_t part = w.part;
  if (t_begin >= t_end) return mla_attn::write_empty_split<NT>(p, w, tid);

  // Setup: this warp's quad slots and their Q A fragments (registers), slots of the first tiles.
  constexpr bool F16 = unscaled_f16(D);
  const float tscale = p.v.tensor_scale ? __ldg(p.v.tensor_scale) : 1.0f;
  slot sl[NS];
  uint32_t qa[NS][4], qb[NS][4];
  static_for<NS>([&](auto ic) {
    constexpr int I = decltype(ic)::value;
    slot s{-1, SK_ZERO, 0, 0, 0};
    static_for<NW>([&](auto wc) {
      constexpr int W = decltype(wc)::value, Q = quad_at(LS::host, W + NW * I);
      if constexpr (Q >= 0) {
        constexpr spec_chunk C = chunk_at(LS::host, Q * 32);
        if (warp == W) s = slot{Q, C.kind, C.src + t4 * 8 * C.esize, C.scale_src, Q * 4 < DV / 8};
      }
    });
    sl[I] = s;
    uint4 v[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int row = g + 8 * hh;
      if (s.q < 0 || row >= nrows) continue;
      int i, h;
      mla_attn::row_coords(p, qi, row0 + row, i, h);
      v[hh] = mla_attn::load_q8(p, r, i, h, s.q * 4 + t4);
    }
    qa[I][0] = v[0].x, qa[I][1] = v[1].x, qa[I][2] = v[0].y, qa[I][3] = v[1].y;
    qb[I][0] = v[0].z, qb[I][1] = v[1].z, qb[I][2] = v[0].w, qb[I][3] = v[1].w;
  });
  // f16 operands: the CTA's largest finite |q| (bf16 magnitude bits) through
  // alpha_s, which the main loop first writes after its second barrier
  uint32_t *qmax_w = reinterpret_cast<uint32_t *>(alpha_s);
  if constexpr (F16) {
    uint32_t mx = 0;
#pragma unroll
    for (int i = 0; i < NS; i++)
#pragma unroll
      for (int j = 0; j < 4; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const uint32_t a = (qa[i][j] >> (16 * h)) & 0x7FFFu, b = (qb[i][j] >> (16 * h)) & 0x7FFFu;
          mx = max(mx, max(a < 0x7F80u ? a : 0u, b < 0x7F80u ? b : 0u));
        }
    mx = __reduce_max_sync(0xffffffffu, mx);
    if (lane == 0) qmax_w[warp] = mx;
  }
  const int nst = p.nstages;
  for (int st = 0; st < nst; st++)
    for (int n = tid; n < BN; n += NT)
      mla_attn::token_of(p, r, qi, nkeys, t_begin + st, n, tok_page[st * BN + n], tok_off[st * BN + n]);
  __syncthreads();
  // Q to f16, scaled by 2^-k (exact) so that every finite |q| stays below 2^15;
  // the scores take the 2^k back with the tensor scale (sl2), O the tensor scale.
  float sl2 = p.scale_log2, oscale = 1.0f;
  if constexpr (F16) {
    uint32_t mx = 0;
#pragma unroll
    for (int i = 0; i < NW; i++) mx = max(mx, qmax_w[i]);
    const int e = (int)(mx >> 7) - 127; // exponent of the largest |q|
    const int k = e >= 15 ? e - 14 : 0;
    const float qs = __uint_as_float((uint32_t)(127 - k) << 23);
    const float ts = chunk_at(D, 0).kind == SK_FP8_TENSOR ? tscale : 1.0f;
    sl2 = p.scale_log2 * ts * __uint_as_float((uint32_t)(127 + k) << 23);
    oscale = ts;
#pragma unroll
    for (int i = 0; i < NS; i++)
#pragma unroll
      for (int j = 0; j < 4; j++) {
        qa[i][j] = mla_attn::bf16x2_to_f16x2(qa[i][j], qs);
        qb[i][j] = mla_attn::bf16x2_to_f16x2(qb[i][j], qs);
      }
  }
  for (int st = 0; st + 1 < nst; st++) {
    if (t_begin + st < t_end) issue_tile<LS>(p, stages + st * STAGE_BYTES, tok_page + st * BN, tok_off + st * BN);
    mla::cp_async_commit();
  }

  // Softmax rows of this warp: 2w and 2w + 1 (running max and sum in registers).
  const bool causal = !p.sparse && p.causal && p.s_q > 1;
  int lim[2];
  float m_run[2] = {-CUDART_INF_F, -CUDART_INF_F}, l_run[2] = {0.f, 0.f};
#pragma unroll
  for (int rr = 0; rr < 2; rr++) lim[rr] = causal ? s_k - p.s_q + (row0 + 2 * warp + rr) / p.h_q : 0x7fffffff;

  float o[DV / NW / 8][4];
#pragma unroll
  for (int nt = 0; nt < DV / NW / 8; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;

  unsigned char *vrow[NS];
#pragma unroll
  for (int i = 0; i < NS; i++) vrow[i] = Vb + g * VP * 2 + (sl[i].q * 4 + t4) * 16;

  const int niter = t_end - t_begin;
  int st = 0;
  for (int u = 0; u < niter; u++, st = st + 1 == nst ? 0 : st + 1) {
    const int t = t_begin + u;
    int pf_page = -1, pf_off = 0;
    if (tid < BN) mla_attn::token_of(p, r, qi, nkeys, t + nst, tid, pf_page, pf_off);

    mla_attn::wait_stages(nst);
    __syncthreads(); // B1: tile t landed; tile t - 1 is done with its stage, V tile, P and alpha
    {
      const int ist = st == 0 ? nst - 1 : st - 1;
      if (t + nst - 1 < t_end) issue_tile<LS>(p, stages + ist * STAGE_BYTES, tok_page + ist * BN, tok_off + ist * BN);
      mla::cp_async_commit();
    }
    {
      const unsigned char *rows = stages + st * STAGE_BYTES + g * PITCH;
      float acc[4][4];
#pragma unroll
      for (int nt = 0; nt < 4; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
      static_for<NS>([&](auto ic) {
        constexpr int I = decltype(ic)::value;
        if (sl[I].q >= 0) dispatch_slot<LS>(rows, vrow[I], sl[I], qa[I], qb[I], tscale, acc);
      });
      float *sp = s_part + warp * MR * SP + g * SP + 2 * t4;
#pragma unroll
      for (int nt = 0; nt < 4; nt++) {
        *reinterpret_cast<float2 *>(sp + nt * 8) = make_float2(acc[nt][0], acc[nt][1]);
        *reinterpret_cast<float2 *>(sp + nt * 8 + 8 * SP) = make_float2(acc[nt][2], acc[nt][3]);
      }
    }
    __syncthreads(); // B2: S partials and the V tile are complete

    {
      const bool key_ok = tok_page[st * BN + lane] >= 0;
#pragma unroll
      for (int rr = 0; rr < 2; rr++) {
        const int row = 2 * warp + rr;
        float s = s_part[row * SP + lane];
#pragma unroll
        for (int w = 1; w < NW; w++) s += s_part[w * MR * SP + row * SP + lane];
        s = key_ok && t * BN + lane <= lim[rr] ? s * sl2 : -CUDART_INF_F;
        const float mnew = fmaxf(m_run[rr], warp_max(s));
        const float base = mnew == -CUDART_INF_F ? 0.f : mnew;
        const float pv = exp2f(s - base);
        Ps[row * PP + lane] = F16 ? __half_as_ushort(__float2half_rn(pv)) : mla_attn::to_bf16_bits(pv);
        const float alpha = m_run[rr] == -CUDART_INF_F ? 0.f : exp2f(m_run[rr] - mnew);
        l_run[rr] = l_run[rr] * alpha + warp_sum(pv);
        m_run[rr] = mnew;
        if (lane == 0) alpha_s[row] = alpha;
      }
    }
    __syncthreads(); // B3: P and alpha are complete

    {
      const float al0 = alpha_s[g], al1 = alpha_s[g + 8];
      if (__any_sync(0xffffffffu, al0 != 1.f || al1 != 1.f)) {
#pragma unroll
        for (int nt = 0; nt < DV / NW / 8; nt++) o[nt][0] *= al0, o[nt][1] *= al0, o[nt][2] *= al1, o[nt][3] *= al1;
      }
    }
#pragma unroll
    for (int ks = 0; ks < BN / 16; ks++) {
      uint32_t pa[4];
      mla::ldmatrix_x4(pa, mla::smem_addr(Ps + (lane & 15) * PP + ks * 16 + (lane >> 4) * 8));
      const uint32_t va = mla::smem_addr(Vb + ((ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * VP + warp * (DV / NW) + (lane >> 4) * 8) * 2);
#pragma unroll
      for (int np = 0; np < DV / NW / 16; np++) {
        uint32_t vb[4];
        mla::ldmatrix_x4_trans(vb, va + np * 32);
        mla::mma_16816<F16>(o[2 * np], pa, vb[0], vb[1]);
        mla::mma_16816<F16>(o[2 * np + 1], pa, vb[2], vb[3]);
      }
    }
    if (tid < BN) tok_page[st * BN + tid] = pf_page, tok_off[st * BN + tid] = pf_off;
  }
  mla::cp_async_wait<0>();
  if (lane == 0) {
#pragma unroll
    for (int rr = 0; rr < 2; rr++) m_fin[2 * warp + rr] = m_run[rr], l_fin[2 * warp + rr] = l_run[rr];
  }
  __syncthreads();

#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int row = g + hh * 8;
    if (row >= nrows) continue;
    const float l = l_fin[row];
    float f = l > 0.f ? 1.0f / l : 0.f;
    int i, h;
    mla_attn::row_coords(p, qi, row0 + row, i, h);
    if (p.nsplits == 1 && p.sink && l > 0.f) {
      const float lse_nat = (m_fin[row] + log2f(l)) * 0.69314718055994531f;
      f *= 1.0f / (1.0f + expf(__ldg(p.sink + h) - lse_nat));
    }
    f *= oscale;
#pragma unroll
    for (int nt = 0; nt < DV / NW / 8; nt++) {
      const int col = warp * (DV / NW) + nt * 8 + 2 * t4;
      const float x0 = o[nt][2 * hh] * f, x1 = o[nt][2 * hh + 1] * f;
      if (p.nsplits > 1) *reinterpret_cast<float2 *>(p.o_acc + (part + row0 + row) * DV + col) = make_float2(x0, x1);
      else *reinterpret_cast<uint32_t *>(p.out + ((int64_t)prob * p.rows + row0 + row) * DV + col) =
               (uint32_t)mla_attn::to_bf16_bits(x0) | (uint32_t)mla_attn::to_bf16_bits(x1) << 16;
    }
  }
  mla_attn::write_lse<NT>(p, w, m_fin, l_fin, tid);
}

} // namespace mla_attn_spec

#endif
