// Compile-time-specialized decode kernel for the memory-bound shape: 16 query
// rows per CTA on a staged (non-bf16) layout whose descriptor equals one of the
// built-in descriptors (kernels_rtc/include/mla/builtin_layouts.h, selected by
// mla_layout_desc_same in attn_decode.cu, never by name). The descriptor is a
// compile-time constant here, so staging (region copies), conversion and the
// whole work split are straight-line code with immediate offsets. Page / token
// strides, region base offsets of the view and the tensor scale stay runtime.
//
// The scale is kept out of the per-element conversion: e4m3 codes are turned
// into f16 exactly (cvt e4m3x2 -> f16x2, one instruction per pair; every e4m3
// value is an f16 normal or zero) and the scales are applied per token and
// scale group to fp32 partial sums:
//   S[r, n] = (scale * 2^e_r) * sum_p c_p[n] * S_p[r, n]
// where S_p is one warp's partial (f16 x f16 mma of codes, or bf16 x bf16 of a
// bf16 RoPE field) over dims of one scale group, c_p[n] the group's scale of
// token n (or the tensor scale, or 1), and Q is held as Q * 2^-e_r: a power of
// two per row that puts the row's largest |q| in [2^14, 2^15), so the bf16
// values of Q are exact in f16 (values below 2^-28 of the row's largest go
// subnormal). For P V each warp's 64 V dims lie in one scale group (static
// assert); P is stored once in f16 and the warp multiplies it by the f16 table
// c_g[n] = s_g[n] / 2^E_g, E_g the running maximum of the group's scale
// exponents (so the factor stays below 2), rescaling its O when E_g grows and
// multiplying by 2^E_g at the end (the tensor scale likewise at the end).
// Rounding therefore differs from the generic kernel: there is no per-element
// bf16 product (codes are exact; products and sums are fp32), P is rounded to
// f16 (11 bits) and P * c_g once more to f16 instead of P to bf16 (8 bits); a
// P * c_g below 2^-14 loses bits (only when token scales of a group differ by
// more than ~2^14 within a request). The bf16 RoPE V dims of fp8_v4 keep bf16
// P and bf16 mma. ue8m0 scale bytes decode as 2^(e - 127) for e in 1..254, 0
// as 0 (the reference's 2^-127 times a code is below 2^-118) and 255 as inf
// (NaN in the reference: either way the output is not finite). Everything is
// judged against the double-precision reference with the FlashMLA tolerances.
//
// Per 32-key tile (3 CTA barriers):
//   1. cp.async of the tile's token rows (8 threads per row, 16-byte copies);
//   2. S partials: the K dims are cut into 32-dim quads; the fp8 quads go to
//      the warps in contiguous runs of one scale group, the bf16 quads to the
//      warps with the fewest quads; each warp keeps its quads' Q A fragments
//      in registers for the whole kernel. Lane (g, t4) rebuilds chunk 4q + t4
//      of tokens g, g + 8, g + 16, g + 24: 8 values that serve directly as the
//      B fragments of two k-steps (the dot product runs over a permuted dim
//      order, the same for Q); V dims also go to the V tile (f16 codes or
//      bf16). Each warp's 16 x 32 partial S (or two: codes, then bf16) goes
//      to shared memory;
//   3. softmax row-wise: warp w owns rows 2w, 2w + 1 (lane = key), sums the
//      partials times the key's scales, keeps the running max and sum in
//      registers; P (f16, stored key-major) and the rescale factors to shared
//      memory; warp j < groups builds the f16 scale table of V group j;
//   4. O = alpha O + (P * c_g) V, each warp 64 output dims.
#ifndef MLA_ATTN_FUSED_SPEC_CUH
#define MLA_ATTN_FUSED_SPEC_CUH

#include <cuda_fp16.h>

#include <utility>

#include "attn_decode_kernel.cuh"
#include "mla/builtin_layouts.h"

namespace mla_attn_spec {

using mla_attn::BN;
using mla_attn::DV;
using mla_attn::params;

constexpr int NW = 8, NT = NW * 32, MR = 16;
constexpr int PP = BN + 8;    // bf16 P pitch (row-major, for bf16 V dims)
constexpr int PTP = MR + 8;   // f16 P pitch (key-major): 48-byte rows, ldmatrix.trans without conflicts
constexpr int VP = DV + 8;    // V tile pitch (16 bits): rows 16 B apart mod 128 for ldmatrix
constexpr int SP = BN + 8;    // S partial pitch (f32): float2 stores of 4 rows x 4 lanes hit distinct banks
constexpr int NPMAX = NW + 2; // S partials: one per warp, plus the bf16 partials of at most 2 mixed warps
constexpr int NSMAX = 4;      // quads per warp

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

// How a partial S or a warp's V dims are scaled: absent (no partial), 1, the
// tensor scale, an f32 or a ue8m0 scale per token at a stage-row offset.
enum { PK_ABSENT, PK_NONE, PK_TENSOR, PK_F32, PK_UE8M0 };
// How a warp computes P V: f16 (codes; scale 1 or the tensor scale at the end),
// f16 with the group table, bf16 (bf16 V dims).
enum { VK_F16, VK_F16_GROUP, VK_BF16 };

__host__ __device__ constexpr int scale_pk(int kind) {
  return kind == SK_FP8_TENSOR ? PK_TENSOR : kind == SK_FP8_F32 ? PK_F32 : kind == SK_FP8_UE8M0 ? PK_UE8M0
       : kind == SK_FP8_ONE ? PK_NONE : PK_ABSENT;
}

// The work split of a descriptor, all compile time.
struct spec_plan {
  int ok;
  int nf[NW], ns[NW], quad[NW][NSMAX]; // fp8 quads, all quads (fp8 first) of each warp
  int fpart[NW], bpart[NW], np;        // partial index of the warp's fp8 / bf16 sums, partial count
  int pkind[NPMAX], psrc[NPMAX];       // scale of each partial
  int vk[NW], vpk[NW], vgrp[NW];       // P V of each warp: VK_*, its PK_*, its table
  int ng, gkind[NW], gsrc[NW];         // V scale groups (tables): PK_F32 / PK_UE8M0, stage offset
  int nsmax, has_bf16_v, has_fp8, has_copy;
};

__host__ __device__ constexpr bool same_scale(const mla_layout_desc &d, int qa, int qb) {
  return chunk_at(d, qa * 32).kind == chunk_at(d, qb * 32).kind && chunk_at(d, qa * 32).scale_src == chunk_at(d, qb * 32).scale_src;
}

__host__ __device__ constexpr spec_plan make_plan(const mla_layout_desc &d) {
  spec_plan P{};
  P.ok = spec_ok(d) ? 1 : 0;
  if (!P.ok) return P;
  int fq[32] = {}, bq[32] = {}, F = 0, B = 0;
  for (int q = 0; q < d.k_dims / 32; q++) {
    if (is_fp8_kind(chunk_at(d, q * 32).kind)) fq[F++] = q;
    else bq[B++] = q;
  }
  // fp8 quads in contiguous runs of one scale: balanced if that holds, else ceil(F / NW) per warp
  int lo[NW + 1] = {};
  for (int mode = 0; mode < 2; mode++) {
    const int per = (F + NW - 1) / NW;
    for (int w = 0; w <= NW; w++) lo[w] = mode == 0 ? w * F / NW : (w * per < F ? w * per : F);
    bool fine = true;
    for (int w = 0; w < NW; w++)
      for (int k = lo[w] + 1; k < lo[w + 1]; k++) fine = fine && same_scale(d, fq[lo[w]], fq[k]);
    if (fine) break;
    if (mode == 1) P.ok = 0;
  }
  for (int w = 0; w < NW; w++) {
    P.nf[w] = P.ns[w] = lo[w + 1] - lo[w];
    if (P.nf[w] > NSMAX) P.ok = 0;
    for (int k = 0; k < P.nf[w] && k < NSMAX; k++) P.quad[w][k] = fq[lo[w] + k];
  }
  for (int b = 0; b < B; b++) { // bf16 quads: to the warp with the fewest quads
    int best = 0;
    for (int w = 1; w < NW; w++)
      if (P.ns[w] < P.ns[best]) best = w;
    if (P.ns[best] >= NSMAX) P.ok = 0;
    else P.quad[best][P.ns[best]++] = bq[b];
  }
  P.np = NW;
  for (int w = 0; w < NW; w++) {
    P.nsmax = P.ns[w] > P.nsmax ? P.ns[w] : P.nsmax;
    P.pkind[w] = PK_ABSENT;
    if (P.nf[w] > 0) {
      const spec_chunk c = chunk_at(d, P.quad[w][0] * 32);
      P.fpart[w] = w, P.pkind[w] = scale_pk(c.kind), P.psrc[w] = c.scale_src;
    }
    if (P.ns[w] > P.nf[w]) {
      if (P.nf[w] == 0) P.bpart[w] = w, P.pkind[w] = PK_NONE;
      else if (P.np < NPMAX) P.bpart[w] = P.np, P.pkind[P.np] = PK_NONE, P.np++;
      else P.ok = 0;
    }
  }
  // V: each warp's DV / NW dims of one kind and one scale
  for (int w = 0; w < NW; w++) {
    const spec_chunk c = chunk_at(d, w * (DV / NW));
    for (int k = 1; k < DV / NW / 8; k++) {
      const spec_chunk e = chunk_at(d, w * (DV / NW) + 8 * k);
      if (e.kind != c.kind || e.scale_src != c.scale_src) P.ok = 0;
    }
    if (c.kind == SK_COPY) P.vk[w] = VK_BF16, P.vpk[w] = PK_NONE, P.has_bf16_v = 1;
    else if (c.kind == SK_FP8_F32 || c.kind == SK_FP8_UE8M0) {
      int j = 0;
      while (j < P.ng && P.gsrc[j] != c.scale_src) j++;
      if (j == P.ng) P.gkind[j] = scale_pk(c.kind), P.gsrc[j] = c.scale_src, P.ng++;
      P.vk[w] = VK_F16_GROUP, P.vpk[w] = scale_pk(c.kind), P.vgrp[w] = j;
    } else if (c.kind == SK_FP8_TENSOR || c.kind == SK_FP8_ONE) P.vk[w] = VK_F16, P.vpk[w] = scale_pk(c.kind);
    else P.ok = 0;
  }
  P.has_fp8 = F > 0, P.has_copy = B > 0;
  return P;
}

template <class LS> struct spec_traits {
  static constexpr spec_plan plan = make_plan(LS::host);
};

// Shared-memory plan (host and device agree).
struct spec_smem {
  int pt, pb, stages, vb, s_part, alpha, beta, desc, m_fin, l_fin, qmax, ctab, tok_page, tok_off, total;
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
  s.pt = take(BN * PTP * 2);
  s.pb = take(MR * PP * 2);
  s.stages = take(nstages * BN * pitch);
  s.vb = take(BN * VP * 2);
  s.s_part = take(NPMAX * MR * SP * 4);
  s.alpha = take(MR * 4);
  s.beta = take(NW * 4);
  s.desc = take(NW * 4);
  s.m_fin = take(MR * 4);
  s.l_fin = take(MR * 4);
  s.qmax = take(NW * MR * 4);
  s.ctab = take(NW * BN * 2);
  s.tok_page = take(nstages * BN * 4);
  s.tok_off = take(nstages * BN * 4);
  s.total = o;
  return s;
}

// The built-in layouts: a __device__ constexpr descriptor and a class naming it
// (the lead's pattern: a reference template parameter to a __device__ variable
// does not survive the host stub). Only the read-distinct fp8 layouts get a
// kernel (fp8_ds_mla_amax and fp8_v4_vllm read the same bytes the same way).
#define MLA_ATTN_SPEC_DEF(n, init)                                                                                    \
  __device__ constexpr mla_layout_desc dev_##n = init;                                                              \
  struct spec_##n {                                                                                                 \
    static constexpr mla_layout_desc host = init;                                                                   \
    static constexpr const char *name = #n;                                                                         \
    static __device__ __forceinline__ const mla_layout_desc &d() { return dev_##n; }                                \
  };
MLA_ATTN_SPEC_DEF(fp8_pertensor, MLA_BUILTIN_DESC_fp8_pertensor)
MLA_ATTN_SPEC_DEF(fp8_ds_mla, MLA_BUILTIN_DESC_fp8_ds_mla)
MLA_ATTN_SPEC_DEF(fp8_v4, MLA_BUILTIN_DESC_fp8_v4)
#undef MLA_ATTN_SPEC_DEF

static_assert(spec_traits<spec_fp8_pertensor>::plan.ok && spec_traits<spec_fp8_ds_mla>::plan.ok &&
                  spec_traits<spec_fp8_v4>::plan.ok,
              "built-in fp8 layouts fit the specialized decode kernel (one scale per warp's quads and V dims)");

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

// Exact e4m3 -> f16 of 4 codes (byte i = element i): two f16x2 words.
__device__ __forceinline__ uint2 e4m3x4_f16(uint32_t w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t a, b;
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(a), "=r"(b)
      : "r"(w));
  return make_uint2(a, b);
#else
  const __half2_raw l = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3);
  return make_uint2((uint32_t)l.x | (uint32_t)l.y << 16, (uint32_t)h.x | (uint32_t)h.y << 16);
#endif
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// d += a * b, f16 inputs, fp32 accumulators
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The scale of a token (stage row) for a PK_F32 / PK_UE8M0 source.
template <int PK, int SRC> __device__ __forceinline__ float token_scale(const unsigned char *row) {
  if constexpr (PK == PK_F32) return *reinterpret_cast<const float *>(row + SRC);
  else return __uint_as_float((uint32_t)row[SRC] << 23);
}

// One quad slot of a warp: quad q (chunks 4q..4q+3, lane t4 takes 4q + t4),
// f16 codes (SK_FP8_ONE) or a bf16 copy (SK_COPY), the lane's byte offset of
// the 8 values in a stage row, and whether its dims are V dims.
struct slot {
  int q, kind, src, is_v;
};

// The slot's chunks of the 4 token groups of a tile: B fragments for S, V to the V tile.
template <int KIND, int PITCH>
__device__ __forceinline__ void run_slot(const unsigned char *rows, unsigned char *vrow, const slot &s, const uint32_t (&qa)[4],
                                         const uint32_t (&qb)[4], float (&acc)[4][4]) {
#pragma unroll
  for (int nt = 0; nt < 4; nt++) {
    uint4 kv;
    if constexpr (KIND == SK_COPY) kv = *reinterpret_cast<const uint4 *>(rows + nt * 8 * PITCH + s.src);
    else {
      const uint2 raw = *reinterpret_cast<const uint2 *>(rows + nt * 8 * PITCH + s.src);
      const uint2 a = e4m3x4_f16(raw.x), b = e4m3x4_f16(raw.y);
      kv = make_uint4(a.x, a.y, b.x, b.y);
    }
    if (s.is_v) *reinterpret_cast<uint4 *>(vrow + nt * 8 * VP * 2) = kv;
    if constexpr (KIND == SK_COPY) {
      mla::mma_bf16_16816(acc[nt], qa, kv.x, kv.y);
      mla::mma_bf16_16816(acc[nt], qb, kv.z, kv.w);
    } else {
      mma_f16_16816(acc[nt], qa, kv.x, kv.y);
      mma_f16_16816(acc[nt], qb, kv.z, kv.w);
    }
  }
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

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// 2^k per row that puts the row's largest |q| (m) in [2^14, 2^15): k = 141 - exponent(m), clamped.
__device__ __forceinline__ int q_shift(float m) {
  const int e = (int)(__float_as_uint(m) >> 23);
  return min(max(141 - e, -126), 126);
}

template <class LS>
__global__ void __launch_bounds__(NT, 2) attn_decode_spec_kernel(const __grid_constant__ params p) {
  constexpr mla_layout_desc D = LS::host;
  using TR = spec_traits<LS>; // TR::plan: the work split (a local constexpr object would be captured)
  constexpr int PITCH = stage_pitch(D), NS = TR::plan.nsmax, NP = TR::plan.np, NG = TR::plan.ng, HBV = TR::plan.has_bf16_v;
  static_assert(TR::plan.ok, "layout outside the specialized kernel's assumptions");
  static_assert(DV / NW == 64 && NG <= NW, "each warp's P V dims lie in one scale group");
  extern __shared__ __align__(16) unsigned char smem[];
  const spec_smem L = make_spec_smem(D.k_dims, PITCH, p.nstages);
  uint16_t *Pt = reinterpret_cast<uint16_t *>(smem + L.pt);
  uint16_t *Ps = reinterpret_cast<uint16_t *>(smem + L.pb);
  unsigned char *stages = smem + L.stages;
  unsigned char *Vb = smem + L.vb;
  float *s_part = reinterpret_cast<float *>(smem + L.s_part);
  float *alpha_s = reinterpret_cast<float *>(smem + L.alpha);
  float *beta_s = reinterpret_cast<float *>(smem + L.beta);
  float *desc_s = reinterpret_cast<float *>(smem + L.desc);
  float *m_fin = reinterpret_cast<float *>(smem + L.m_fin);
  float *l_fin = reinterpret_cast<float *>(smem + L.l_fin);
  float *qmax_s = reinterpret_cast<float *>(smem + L.qmax);
  uint16_t *ctab = reinterpret_cast<uint16_t *>(smem + L.ctab);
  int *tok_page = reinterpret_cast<int *>(smem + L.tok_page);
  int *tok_off = reinterpret_cast<int *>(smem + L.tok_off);
  constexpr int STAGE_BYTES = BN * PITCH;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int prob = blockIdx.x / p.row_chunks, split = blockIdx.y, row0 = (blockIdx.x - prob * p.row_chunks) * MR;
  const int nrows = min(MR, p.rows - row0);
  const int r = p.sparse ? prob / p.s_q : prob, qi = p.sparse ? prob - (prob / p.s_q) * p.s_q : 0;

  int s_k = 0, nkeys;
  if (!p.sparse) {
    s_k = max(0, __ldg(p.cache_lens + r));
    nkeys = s_k;
    if (p.causal && p.s_q > 1) {
      const int i_max = (row0 + nrows - 1) / p.h_q;
      nkeys = max(0, min(s_k, s_k - p.s_q + i_max + 1));
    }
  } else {
    nkeys = p.topk_len ? min(max(__ldg(p.topk_len + r), 0), p.topk) : p.topk;
  }
  const int ntiles = (nkeys + BN - 1) / BN, per = (ntiles + p.nsplits - 1) / p.nsplits;
  const int t_begin = min(split * per, ntiles), t_end = min(t_begin + per, ntiles);
  const int64_t part = ((int64_t)prob * p.nsplits + split) * p.rows;

  if (t_begin >= t_end) {
    for (int idx = tid; idx < nrows * (DV / 4); idx += NT) {
      const int row = idx / (DV / 4), c = idx - row * (DV / 4);
      if (p.nsplits > 1) reinterpret_cast<float4 *>(p.o_acc + (part + row0 + row) * DV)[c] = make_float4(0.f, 0.f, 0.f, 0.f);
      else reinterpret_cast<uint2 *>(p.out + ((int64_t)prob * p.rows + row0 + row) * DV)[c] = make_uint2(0, 0);
    }
    for (int row = tid; row < nrows; row += NT) {
      int i, h;
      mla_attn::row_coords(p, qi, row0 + row, i, h);
      if (p.nsplits > 1) p.lse_acc[part + row0 + row] = -CUDART_INF_F;
      else p.lse[((int64_t)r * p.h_q + h) * p.s_q + i] = CUDART_INF_F;
    }
    return;
  }

  // Setup: this warp's share of the plan, its quad slots and their Q A fragments (registers).
  const float tscale = p.v.tensor_scale ? __ldg(p.v.tensor_scale) : 1.0f;
  int nsw = 0, nfw = 0, fpart = 0, bpart = 0, vk = VK_F16, vpk = PK_NONE, vgrp = 0;
  static_for<NW>([&](auto wc) {
    constexpr int W = decltype(wc)::value;
    constexpr int A0 = TR::plan.ns[W], A1 = TR::plan.nf[W], A2 = TR::plan.fpart[W], A3 = TR::plan.bpart[W];
    constexpr int A4 = TR::plan.vk[W], A5 = TR::plan.vpk[W], A6 = TR::plan.vgrp[W];
    if (warp == W) nsw = A0, nfw = A1, fpart = A2, bpart = A3, vk = A4, vpk = A5, vgrp = A6;
  });
  slot sl[NS];
  uint32_t qa[NS][4], qb[NS][4];
  float qm[2] = {0.f, 0.f};
  static_for<NS>([&](auto ic) {
    constexpr int I = decltype(ic)::value;
    slot s{-1, SK_ZERO, 0, 0};
    static_for<NW>([&](auto wc) {
      constexpr int W = decltype(wc)::value, Q = I < TR::plan.ns[W] ? TR::plan.quad[W][I] : -1;
      if constexpr (Q >= 0) {
        constexpr spec_chunk C = chunk_at(LS::host, Q * 32);
        if (warp == W) s = slot{Q, C.kind == SK_COPY ? SK_COPY : SK_FP8_ONE, C.src + t4 * 8 * C.esize, Q * 4 < DV / 8};
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
      const int c = s.q * 4 + t4;
      const uint16_t *src = p.q + (int64_t)r * p.qs0 + (int64_t)i * p.qs1 + (int64_t)h * p.qs2 + (int64_t)c * 8 * p.qs3;
      if (p.q_vec) v[hh] = __ldg(reinterpret_cast<const uint4 *>(src));
      else {
        uint16_t e[8];
#pragma unroll
        for (int k = 0; k < 8; k++) e[k] = __ldg(src + k * p.qs3);
        v[hh] = make_uint4(e[0] | (uint32_t)e[1] << 16, e[2] | (uint32_t)e[3] << 16, e[4] | (uint32_t)e[5] << 16,
                           e[6] | (uint32_t)e[7] << 16);
      }
      const uint32_t w4[4] = {v[hh].x, v[hh].y, v[hh].z, v[hh].w};
#pragma unroll
      for (int k = 0; k < 4; k++) qm[hh] = fmaxf(qm[hh], fmaxf(fabsf(bf16_lo(w4[k])), fabsf(bf16_hi(w4[k]))));
    }
    qa[I][0] = v[0].x, qa[I][1] = v[1].x, qa[I][2] = v[0].y, qa[I][3] = v[1].y;
    qb[I][0] = v[0].z, qb[I][1] = v[1].z, qb[I][2] = v[0].w, qb[I][3] = v[1].w;
  });
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    qm[hh] = fmaxf(qm[hh], __shfl_xor_sync(0xffffffffu, qm[hh], 1));
    qm[hh] = fmaxf(qm[hh], __shfl_xor_sync(0xffffffffu, qm[hh], 2));
    if (t4 == 0) qmax_s[warp * MR + g + 8 * hh] = qm[hh];
  }
  const int nst = p.nstages;
  for (int st = 0; st < nst; st++)
    for (int n = tid; n < BN; n += NT)
      mla_attn::token_of(p, r, qi, nkeys, t_begin + st, n, tok_page[st * BN + n], tok_off[st * BN + n]);
  __syncthreads();
  for (int st = 0; st + 1 < nst; st++) {
    if (t_begin + st < t_end) issue_tile<LS>(p, stages + st * STAGE_BYTES, tok_page + st * BN, tok_off + st * BN);
    mla::cp_async_commit();
  }
  // Q * 2^k_row: f16 for the code quads, bf16 for the bf16 quads (both exact); S is scaled back by 2^-k_row.
  float rowf[2];
  {
    float fac[2];
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      float m = 0.f, m2 = 0.f;
#pragma unroll
      for (int w = 0; w < NW; w++) m = fmaxf(m, qmax_s[w * MR + g + 8 * hh]), m2 = fmaxf(m2, qmax_s[w * MR + 2 * warp + hh]);
      fac[hh] = __uint_as_float((uint32_t)(q_shift(m) + 127) << 23);
      rowf[hh] = p.scale_log2 * __uint_as_float((uint32_t)(127 - q_shift(m2)) << 23);
    }
    static_for<NS>([&](auto ic) {
      constexpr int I = decltype(ic)::value;
      const bool f16 = sl[I].kind != SK_COPY;
#pragma unroll
      for (int k = 0; k < 4; k++) {
        const float f = fac[k & 1]; // registers 0, 2: row g; 1, 3: row g + 8
        const float a0 = bf16_lo(qa[I][k]) * f, a1 = bf16_hi(qa[I][k]) * f;
        const float b0 = bf16_lo(qb[I][k]) * f, b1 = bf16_hi(qb[I][k]) * f;
        qa[I][k] = f16 ? pack_f16x2(a0, a1) : mla::pack_bf16x2(a0, a1);
        qb[I][k] = f16 ? pack_f16x2(b0, b1) : mla::pack_bf16x2(b0, b1);
      }
    });
  }

  // Softmax rows of this warp: 2w and 2w + 1 (running max and sum in registers).
  const bool causal = !p.sparse && p.causal && p.s_q > 1;
  int lim[2];
  float m_run[2] = {-CUDART_INF_F, -CUDART_INF_F}, l_run[2] = {0.f, 0.f};
#pragma unroll
  for (int rr = 0; rr < 2; rr++) lim[rr] = causal ? s_k - p.s_q + (row0 + 2 * warp + rr) / p.h_q : 0x7fffffff;
  int e_run = 0; // warp j < NG: running maximum exponent of V group j's scales

  float o[DV / NW / 8][4];
#pragma unroll
  for (int nt = 0; nt < DV / NW / 8; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;

  unsigned char *vrow[NS];
#pragma unroll
  for (int i = 0; i < NS; i++) vrow[i] = Vb + g * VP * 2 + (sl[i].q * 4 + t4) * 16;

  auto store_part = [&](int pi, float (&acc)[4][4]) {
    float *sp = s_part + pi * MR * SP + g * SP + 2 * t4;
#pragma unroll
    for (int nt = 0; nt < 4; nt++) {
      *reinterpret_cast<float2 *>(sp + nt * 8) = make_float2(acc[nt][0], acc[nt][1]);
      *reinterpret_cast<float2 *>(sp + nt * 8 + 8 * SP) = make_float2(acc[nt][2], acc[nt][3]);
      acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    }
  };

  const int niter = t_end - t_begin;
  int st = 0;
  for (int u = 0; u < niter; u++, st = st + 1 == nst ? 0 : st + 1) {
    const int t = t_begin + u;
    int pf_page = -1, pf_off = 0;
    if (tid < BN) mla_attn::token_of(p, r, qi, nkeys, t + nst, tid, pf_page, pf_off);

    mla_attn::wait_stages(nst);
    __syncthreads(); // B1: tile t landed; tile t - 1 is done with its stage, V tile, P, tables and factors
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
        if constexpr (NP > NW) // a warp with code and bf16 quads: the code sum is one partial, the bf16 sum another
          if (I == nfw && nfw > 0 && nsw > nfw) store_part(fpart, acc);
        if (I < nsw) {
          if constexpr (TR::plan.has_fp8 && TR::plan.has_copy) {
            if (sl[I].kind == SK_COPY) run_slot<SK_COPY, PITCH>(rows, vrow[I], sl[I], qa[I], qb[I], acc);
            else run_slot<SK_FP8_ONE, PITCH>(rows, vrow[I], sl[I], qa[I], qb[I], acc);
          } else if constexpr (TR::plan.has_fp8) run_slot<SK_FP8_ONE, PITCH>(rows, vrow[I], sl[I], qa[I], qb[I], acc);
          else run_slot<SK_COPY, PITCH>(rows, vrow[I], sl[I], qa[I], qb[I], acc);
        }
      });
      if (nsw > 0) store_part(nsw > nfw ? bpart : fpart, acc);
    }
    __syncthreads(); // B2: S partials and the V tile are complete

    {
      const unsigned char *krow = stages + st * STAGE_BYTES + lane * PITCH;
      const bool key_ok = tok_page[st * BN + lane] >= 0;
      float pv[2];
#pragma unroll
      for (int rr = 0; rr < 2; rr++) {
        const int row = 2 * warp + rr;
        float s = 0.f;
        static_for<NP>([&](auto pc) {
          constexpr int PI = decltype(pc)::value, K = TR::plan.pkind[PI], SRC = TR::plan.psrc[PI];
          if constexpr (K != PK_ABSENT) {
            const float x = s_part[PI * MR * SP + row * SP + lane];
            if constexpr (K == PK_NONE) s += x;
            else if constexpr (K == PK_TENSOR) s = fmaf(x, tscale, s);
            else s = fmaf(x, token_scale<K, SRC>(krow), s);
          }
        });
        s = key_ok && t * BN + lane <= lim[rr] ? s * rowf[rr] : -CUDART_INF_F;
        const float mnew = fmaxf(m_run[rr], warp_max(s));
        const float base = mnew == -CUDART_INF_F ? 0.f : mnew;
        pv[rr] = exp2f(s - base);
        if constexpr (TR::plan.has_bf16_v) Ps[row * PP + lane] = mla_attn::to_bf16_bits(pv[rr]);
        const float alpha = m_run[rr] == -CUDART_INF_F ? 0.f : exp2f(m_run[rr] - mnew);
        l_run[rr] = l_run[rr] * alpha + warp_sum(pv[rr]);
        m_run[rr] = mnew;
        if (lane == 0) alpha_s[row] = alpha;
      }
      *reinterpret_cast<uint32_t *>(Pt + lane * PTP + 2 * warp) = pack_f16x2(pv[0], pv[1]);
      if constexpr (NG > 0) {
        if (warp < NG) { // the f16 scale table of V group j = warp: s / 2^(E_j - 127) < 2
          float sj = 0.f;
          static_for<NG>([&](auto jc) {
            constexpr int J = decltype(jc)::value;
            if (warp == J) sj = token_scale<TR::plan.gkind[J], TR::plan.gsrc[J]>(krow);
          });
          const int emax = (int)__reduce_max_sync(0xffffffffu, (__float_as_uint(sj) >> 23) & 0xffu);
          const int e_new = min(max(e_run, emax), 253);
          ctab[warp * BN + lane] = __half_as_ushort(__float2half_rn(sj * __uint_as_float((uint32_t)(254 - e_new) << 23)));
          if (lane == 0) {
            const int d = 127 + e_run - e_new;
            beta_s[warp] = d >= 1 ? __uint_as_float((uint32_t)d << 23) : 0.f;
            desc_s[warp] = __uint_as_float(e_new >= 1 ? (uint32_t)e_new << 23 : 0x00400000u);
          }
          e_run = e_new;
        }
      }
    }
    __syncthreads(); // B3: P, tables and factors are complete

    {
      float al0 = alpha_s[g], al1 = alpha_s[g + 8];
      if (vk == VK_F16_GROUP) {
        const float b = beta_s[vgrp];
        al0 *= b, al1 *= b;
      }
      if (__any_sync(0xffffffffu, al0 != 1.f || al1 != 1.f)) {
#pragma unroll
        for (int nt = 0; nt < DV / NW / 8; nt++) o[nt][0] *= al0, o[nt][1] *= al0, o[nt][2] *= al1, o[nt][3] *= al1;
      }
    }
    if (HBV && vk == VK_BF16) {
#pragma unroll
      for (int ks = 0; ks < BN / 16; ks++) {
        uint32_t pa[4];
        mla::ldmatrix_x4(pa, mla::smem_addr(Ps + (lane & 15) * PP + ks * 16 + (lane >> 4) * 8));
        const uint32_t va = mla::smem_addr(Vb + ((ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * VP + warp * (DV / NW) + (lane >> 4) * 8) * 2);
#pragma unroll
        for (int np = 0; np < DV / NW / 16; np++) {
          uint32_t vb[4];
          mla::ldmatrix_x4_trans(vb, va + np * 32);
          mla::mma_bf16_16816(o[2 * np], pa, vb[0], vb[1]);
          mla::mma_bf16_16816(o[2 * np + 1], pa, vb[2], vb[3]);
        }
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < BN / 16; ks++) {
        uint32_t pa[4];
        mla::ldmatrix_x4_trans(pa, mla::smem_addr(Pt + (ks * 16 + (lane & 7) + ((lane >> 4) & 1) * 8) * PTP + ((lane >> 3) & 1) * 8));
        if (NG > 0 && vk == VK_F16_GROUP) {
          const uint32_t c0 = *reinterpret_cast<const uint32_t *>(ctab + vgrp * BN + ks * 16 + 2 * t4);
          const uint32_t c1 = *reinterpret_cast<const uint32_t *>(ctab + vgrp * BN + ks * 16 + 8 + 2 * t4);
          pa[0] = hmul2(pa[0], c0), pa[1] = hmul2(pa[1], c0), pa[2] = hmul2(pa[2], c1), pa[3] = hmul2(pa[3], c1);
        }
        const uint32_t va = mla::smem_addr(Vb + ((ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * VP + warp * (DV / NW) + (lane >> 4) * 8) * 2);
#pragma unroll
        for (int np = 0; np < DV / NW / 16; np++) {
          uint32_t vb[4];
          mla::ldmatrix_x4_trans(vb, va + np * 32);
          mma_f16_16816(o[2 * np], pa, vb[0], vb[1]);
          mma_f16_16816(o[2 * np + 1], pa, vb[2], vb[3]);
        }
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

  // The scale of this warp's V dims: 2^E of its group, the tensor scale, or 1.
  const float vscale = vk == VK_F16_GROUP ? desc_s[vgrp] : vpk == PK_TENSOR ? tscale : 1.0f;
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
    f *= vscale;
#pragma unroll
    for (int nt = 0; nt < DV / NW / 8; nt++) {
      const int col = warp * (DV / NW) + nt * 8 + 2 * t4;
      const float x0 = o[nt][2 * hh] * f, x1 = o[nt][2 * hh + 1] * f;
      if (p.nsplits > 1) *reinterpret_cast<float2 *>(p.o_acc + (part + row0 + row) * DV + col) = make_float2(x0, x1);
      else *reinterpret_cast<uint32_t *>(p.out + ((int64_t)prob * p.rows + row0 + row) * DV + col) =
               (uint32_t)mla_attn::to_bf16_bits(x0) | (uint32_t)mla_attn::to_bf16_bits(x1) << 16;
    }
  }
  for (int row = tid; row < nrows; row += NT) {
    const float l = l_fin[row];
    const float lse2 = l > 0.f ? m_fin[row] + log2f(l) : -CUDART_INF_F;
    int i, h;
    mla_attn::row_coords(p, qi, row0 + row, i, h);
    if (p.nsplits > 1) p.lse_acc[part + row0 + row] = lse2;
    else p.lse[((int64_t)r * p.h_q + h) * p.s_q + i] = l > 0.f ? lse2 * 0.69314718055994531f : CUDART_INF_F;
  }
}

} // namespace mla_attn_spec

#endif
