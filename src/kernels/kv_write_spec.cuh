// Quantize-and-cache variants specialized at compile time on the built-in
// layouts (kernels_rtc/include/mla/builtin_layouts.h). Included by
// kv_write.cu; the launcher there picks a variant when the runtime descriptor
// equals a built-in's (mla_layout_desc_same, for_reading = 0) and the
// addresses allow 16-byte accesses, else the generic kernel.
//
// With the descriptor a constant, every per-chunk decision (field, dtype,
// scale kind, destination offset, group membership) is made by the compiler.
// LPT lanes own a token: lane `sub` owns chunks sub + LPT * i (i < NS), so
// slot i of every lane lies in the same field. A group either spans all LPT
// lanes (group >= LPT chunks: one "item" per group, the lane-local max over
// its slots, then xor-shuffles over the LPT lanes) or lies inside gn lanes
// (group < LPT chunks: shuffles over gn lanes). Group maxima are integer
// maxima of the bf16 magnitudes, two groups per 32-bit shuffle; a NaN (bits
// > 0x7f80) sends the warp through the reference's first-NaN rule. The scale
// of each group is computed by one lane (the reference's formula,
// mla/quant_math.h, division by qmax through mla::divide1) and its decoded
// value broadcast; x / scale by mla::divide8 and the packed e4m3 / e2m1
// encoders of mla/token_access.cuh (e2m1 with e4m3 group scales by
// e2m1x8_encode_bf16_div, no division): bit-identical to the CPU reference.
//
// Source rows are read straight from global memory with 16-byte loads, every
// load of a tile issued before any use; the slot ids one tile ahead. The warps
// loop over tiles, but the launcher's default grid gives each warp one tile
// (kv_write.cu, write_grid_waves). MB: the blocks per SM the registers are budgeted
// for (__launch_bounds__).
#ifndef MLA_KV_WRITE_SPEC_CUH
#define MLA_KV_WRITE_SPEC_CUH

#include "kv_common.cuh"
#include "mla/builtin_spec.cuh"
#include "mla/layout_match.h"

namespace kvw {

MLA_BUILTIN_LAYOUTS_ALL(MLA_BUILTIN_SPEC)

// ---- compile-time geometry -------------------------------------------------------------

template <class L> constexpr int nch() { return L::host.dim / 8; }
template <class L> constexpr int lpt() { return nch<L>() >= 64 ? 8 : 4; }
template <class L> constexpr int nslots() { return nch<L>() / lpt<L>(); }

constexpr int chunk_bytes_of(int dtype) { return dtype == MLA_E2M1 ? 4 : dtype == MLA_E4M3 ? 8 : 16; }
constexpr int scale_bytes_of(int sdtype) { return sdtype == MLA_F32 ? 4 : sdtype == MLA_BF16 ? 2 : 1; }

// DATA field holding chunk c, -1 none.
template <class L> constexpr int field_of(int c) {
  for (int f = 0; f < L::host.nfields && f < MLA_LAYOUT_MAX_FIELDS; f++) {
    const mla_layout_field &F = L::host.fields[f];
    if (F.role == MLA_FIELD_DATA && 8 * c >= F.dim_lo && 8 * c < F.dim_lo + F.count) return f;
  }
  return -1;
}
template <class L> constexpr int fld_dtype(int f) { return L::host.fields[f].dtype; }
template <class L> constexpr int fld_skind(int f) { return L::host.fields[f].scale_kind; }
template <class L> constexpr int fld_gn(int f) { return L::host.fields[f].group / 8; }
template <class L> constexpr int fld_lo8(int f) { return L::host.fields[f].dim_lo / 8; }
template <class L> constexpr int fld_region(int f) { return L::host.fields[f].region; }
template <class L> constexpr int fld_sdtype(int f) { return L::host.fields[f].scale_dtype; }
template <class L> constexpr int fld_sregion(int f) { return L::host.fields[f].scale_region; }
template <class L> constexpr int fld_soff(int f) { return L::host.fields[f].scale_off; }
template <class L> constexpr int fld_policy(int f) { return L::host.fields[f].scale_policy; }
template <class L> constexpr int fld_eps_on_amax(int f) { return L::host.fields[f].eps_on_amax; }
template <class L> constexpr float fld_qmax(int f) { return L::host.fields[f].qmax; }
template <class L> constexpr float fld_eps(int f) { return L::host.fields[f].eps; }
template <class L> constexpr float fld_smin(int f) { return L::host.fields[f].scale_min; }
template <class L> constexpr float fld_smax(int f) { return L::host.fields[f].scale_max; }
template <class L> constexpr int fld_count(int f) { return L::host.fields[f].count; }
template <class L> constexpr int fld_role(int f) { return L::host.fields[f].role; }
template <class L> constexpr int fld_byte_off(int f) { return L::host.fields[f].byte_off; }
template <class L> constexpr int nfields() { return L::host.nfields; }
template <class L> constexpr int nregions() { return L::host.nregions; }
template <class L> constexpr int block_size() { return L::host.block_size; }
template <class L> constexpr int64_t reg_off(int r) { return L::host.region_off[r]; }
template <class L> constexpr int reg_row(int r) { return L::host.region_row_bytes[r]; }
template <class L> constexpr int reg_chunk(int r) { return L::host.region_chunk[r]; }
// Byte b of a token's row in region R from `row` (its row start, or for a
// chunked region its first piece: layout_desc.h, mla_region_base).
template <class L, int R> __device__ __forceinline__ unsigned char *row_at(unsigned char *row, int b) {
  constexpr int c = reg_chunk<L>(R);
  if constexpr (c == 0) return row + b;
  else return row + (int64_t)(b / c) * ((int64_t)c * L::host.block_size) + b % c;
}

// Slot i (chunks LPT * i + sub) of a lane.
template <class L> constexpr int slot_field(int i) { return field_of<L>(lpt<L>() * i); }
template <class L> constexpr bool slot_grouped(int i) {
  return slot_field<L>(i) >= 0 && fld_skind<L>(slot_field<L>(i)) == MLA_SCALE_GROUP;
}
// the group spans all LPT lanes (one item per group) rather than gn lanes
template <class L> constexpr bool slot_cross(int i) {
  return slot_grouped<L>(i) && fld_gn<L>(slot_field<L>(i)) >= lpt<L>();
}
// byte offset, in its region's token row, of chunk LPT * i (lane sub adds sub * chunk bytes)
template <class L> constexpr int slot_dst(int i) {
  const int f = slot_field<L>(i);
  const int e = 8 * (lpt<L>() * i - fld_lo8<L>(f));
  const int dt = fld_dtype<L>(f);
  return L::host.fields[f].byte_off + (dt == MLA_E2M1 ? e / 2 : dt == MLA_E4M3 ? e : 2 * e);
}
// Cross items: the groups of fields whose groups span the lanes, numbered in
// field order, then group order.
template <class L> constexpr int n_items() {
  int n = 0;
  for (int f = 0; f < L::host.nfields; f++) {
    const mla_layout_field &F = L::host.fields[f];
    if (F.role == MLA_FIELD_DATA && F.scale_kind == MLA_SCALE_GROUP && F.group / 8 >= lpt<L>()) n += F.count / F.group;
  }
  return n;
}
template <class L> constexpr int item_first(int f) { // first item of field f
  int n = 0;
  for (int g = 0; g < f; g++) {
    const mla_layout_field &F = L::host.fields[g];
    if (F.role == MLA_FIELD_DATA && F.scale_kind == MLA_SCALE_GROUP && F.group / 8 >= lpt<L>()) n += F.count / F.group;
  }
  return n;
}
template <class L> constexpr int slot_item(int i) {
  const int f = slot_field<L>(i);
  return item_first<L>(f) + (lpt<L>() * i - fld_lo8<L>(f)) / fld_gn<L>(f);
}
template <class L> constexpr int item_field(int k) {
  for (int i = 0; i < nslots<L>(); i++)
    if (slot_cross<L>(i) && slot_item<L>(i) == k) return slot_field<L>(i);
  return -1;
}
template <class L> constexpr int item_group(int k) { return k - item_first<L>(item_field<L>(k)); }
// every cross item belongs to one field: items are spread over the lanes, one scale per lane
template <class L> constexpr bool items_one_field() {
  for (int k = 0; k < n_items<L>(); k++)
    if (item_field<L>(k) != item_field<L>(0)) return false;
  return true;
}
// e2m1 with e4m3 group scales clamped to >= 2^-9: quantized by
// mla::e2m1x8_encode_bf16_div (no division; its preconditions hold)
template <class L> constexpr bool fast_e2m1(int f) {
  return f >= 0 && fld_dtype<L>(f) == MLA_E2M1 && fld_skind<L>(f) == MLA_SCALE_GROUP && fld_sdtype<L>(f) == MLA_E4M3 &&
         fld_smin<L>(f) >= 0x1p-9f;
}
template <class L> constexpr bool has_tensor_scale() {
  for (int f = 0; f < L::host.nfields; f++)
    if (L::host.fields[f].role == MLA_FIELD_DATA && L::host.fields[f].scale_kind == MLA_SCALE_TENSOR) return true;
  return false;
}

// What the variant handles; any other built-in falls back to the generic kernel.
template <class L> constexpr bool supported() {
  const mla_layout_desc &d = L::host;
  const int P = lpt<L>();
  if (d.dim % (8 * P) || nslots<L>() > 12 || d.nregions > MLA_LAYOUT_MAX_REGIONS) return false;
  for (int r = 0; r < d.nregions; r++)
    if (d.region_off[r] % 16 || (r > 0 && d.region_row_bytes[r] % 4)) return false;
  if (d.block_size <= 0 || (d.block_size & (d.block_size - 1))) return false;
  for (int f = 0; f < d.nfields; f++) {
    const mla_layout_field &F = d.fields[f];
    if (F.role == MLA_FIELD_PAD) continue;
    if (F.dim_lo % (8 * P) || F.count % (8 * P)) return false;
    if (F.dtype != MLA_BF16 && F.dtype != MLA_E4M3 && F.dtype != MLA_E2M1) return false;
    if (F.dtype == MLA_BF16 && F.scale_kind != MLA_SCALE_NONE) return false;
    const int cb = chunk_bytes_of(F.dtype);
    if (F.byte_off % cb || (F.region > 0 && d.region_row_bytes[F.region] % cb)) return false;
    if (F.scale_kind == MLA_SCALE_GROUP) {
      const int gn = F.group / 8;
      if (F.group % 8 || gn < 1 || F.count % F.group) return false;
      if (gn >= P ? gn % P : (P % gn || (F.count / 8 / P) % gn)) return false;
      const int ss = scale_bytes_of(F.scale_dtype);
      if (F.scale_off % ss || (F.scale_region > 0 && d.region_row_bytes[F.scale_region] % ss)) return false;
      if (F.scale_dtype != MLA_F32 && F.scale_dtype != MLA_UE8M0 && F.scale_dtype != MLA_E4M3 &&
          F.scale_dtype != MLA_BF16)
        return false;
    }
  }
  return true;
}

// Region 0's token row is fully covered by the layout's data fields, its
// region-0 scales and its region-0 padding (every byte of a staged row is
// written before the row is copied out), and is a 16-byte multiple.
template <class L> constexpr bool stage_ok() {
  const mla_layout_desc &d = L::host;
  const int R0 = d.region_row_bytes[0];
  if (R0 <= 0 || R0 % 16 || d.region_chunk[0]) return false; // a chunked row is no contiguous copy
  int covered = 0;
  for (int f = 0; f < d.nfields; f++) {
    const mla_layout_field &F = d.fields[f];
    if (F.role == MLA_FIELD_PAD) {
      if (F.region == 0) covered += F.count;
      continue;
    }
    if (F.role != MLA_FIELD_DATA) return false;
    if (F.region == 0)
      covered += F.dtype == MLA_E2M1 ? F.count / 2 : F.dtype == MLA_E4M3 ? F.count : 2 * F.count;
    if (F.scale_kind == MLA_SCALE_GROUP && F.scale_region == 0) covered += F.count / F.group * scale_bytes_of(F.scale_dtype);
  }
  return covered == R0;
}

// ---- device helpers ----------------------------------------------------------------

// |x| max of 8 bf16 (16-bit magnitudes; a NaN's bits exceed 0x7f80).
__device__ __forceinline__ uint32_t amax16(uint4 w) {
  const uint32_t M = 0x7FFF7FFFu;
  const uint32_t m3 = __vimax3_u16x2(w.x & M, w.y & M, w.z & M);
  const uint32_t m = __vmaxu2(m3, w.w & M);
  return max(m & 0xFFFFu, m >> 16);
}

// Key (8 * chunk + element) and |bits| (fp32) of the chunk's first NaN; key 0x7fffffff if none.
__device__ __forceinline__ void first_nan(uint4 w, int c, int &key, uint32_t &bits) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int e = 7; e >= 0; e--) {
    const uint32_t h = (ws[e / 2] >> (16 * (e & 1))) & 0x7FFFu;
    if (h > 0x7F80u) key = 8 * c + e, bits = h << 16;
  }
}

// x / s for the 8 bf16 of chunk w, s > 0 or NaN (a group scale): mla::divide8's
// arithmetic with its range test made once per chunk from the bf16 bits (every
// |x| in [2^-60, 2^61) or 0: bf16 magnitudes 0 or in [0x2180, 0x5e00)), and the
// sign of x put back by an OR (the quotient of -0 is -0; for x != 0 the
// quotient already has x's sign). Other chunks take mla::divide8.
__device__ __forceinline__ void divide8_group(const mla::divisor &v, uint4 w, float (&x)[8]) {
  if (v.mode == 1) {
    const uint32_t M = 0x7FFF7FFFu;
    const uint32_t m0 = w.x & M, m1 = w.y & M, m2 = w.z & M, m3 = w.w & M;
    const uint32_t mx = __vmaxu2(__vimax3_u16x2(m0, m1, m2), m3);
    const uint32_t mn = __vminu2(__vimin3_u16x2((m0 + M) & M, (m1 + M) & M, (m2 + M) & M), (m3 + M) & M);
    if (max(mx & 0xFFFFu, mx >> 16) < 0x5E00u && min(mn & 0xFFFFu, mn >> 16) >= 0x217Fu) {
#pragma unroll
      for (int j = 0; j < 8; j++) {
        const float q = __fmul_rn(x[j], v.r);
        const float r = __fmaf_rn(v.r, __fmaf_rn(q, -v.s, x[j]), q);
        x[j] = __uint_as_float(__float_as_uint(r) | (__float_as_uint(x[j]) & 0x80000000u));
      }
      return;
    }
  }
  mla::divide8(v, x);
}

// The divisor of a group scale: the quotient code's (s, 1 / s) for fast e2m1
// fields, mla::divide8's otherwise. A scale computed by one lane reaches the
// others through shared_divisor: s and the reciprocal the owner computed once
// (owner_rcp), or s alone, the divisor then made by each lane.
template <bool FAST> __device__ __forceinline__ mla::divisor group_divisor(float dec) {
  if constexpr (FAST) return mla::divisor{dec, __frcp_rn(dec), 3};
  else return mla::make_divisor(dec);
}
template <bool FAST> __device__ __forceinline__ float owner_rcp(float dec) {
  if constexpr (FAST) return __frcp_rn(dec);
  else return 0.0f;
}
template <bool FAST> __device__ __forceinline__ mla::divisor shared_divisor(float dec, float rc, int src) {
  if constexpr (FAST) return mla::divisor{__shfl_sync(0xffffffffu, dec, src), __shfl_sync(0xffffffffu, rc, src), 3};
  else return mla::make_divisor(__shfl_sync(0xffffffffu, dec, src));
}

// mla_group_scale_value for field F of L, the division by qmax through qdiv.
template <class L, int F> __device__ __forceinline__ float group_scale(float amax, const mla::divisor &qdiv) {
  if (mla_isnan(amax)) return amax;
  constexpr float eps = fld_eps<L>(F), smin = fld_smin<L>(F), smax = fld_smax<L>(F);
  float v;
  if constexpr (fld_eps_on_amax<L>(F)) v = mla::divide1(qdiv, mla_fmax_num(amax, eps));
  else v = mla_fmax_num(mla::divide1(qdiv, amax), eps);
  if constexpr (fld_policy<L>(F) == MLA_POLICY_POW2) v = mla_pow2_ceil(v);
  if constexpr (smin > 0.0f) v = v < smin ? smin : v;
  if constexpr (smax > 0.0f) v = v > smax ? smax : v;
  return v;
}

template <int SD> __device__ __forceinline__ void store_scale(unsigned char *p, uint32_t code) {
  if constexpr (SD == MLA_F32) *reinterpret_cast<uint32_t *>(p) = code;
  else if constexpr (SD == MLA_BF16) *reinterpret_cast<uint16_t *>(p) = (uint16_t)code;
  else *p = (unsigned char)code;
}

template <int N> struct ic { static constexpr int value = N; };
template <int N, int I = 0, class F> __device__ __forceinline__ void static_for(F &&f) {
  if constexpr (I < N) {
    f(ic<I>{});
    static_for<N, I + 1>(f);
  }
}

struct wargs {
  unsigned char *base;
  int64_t page_stride, token_stride, num_pages;
  const float *tscale;
  const void *slots;
  int64_t n, slot_stride;
  int is64;
  const unsigned char *a, *b; // b already moved back by split * 2 bytes
  int64_t a_stride, b_stride; // bytes
  int splitc;                 // chunks from a
  unsigned long long *bad;
};

constexpr int kSpecThreads = 256;

// ST (stage): region-0 token rows are assembled in shared memory and copied
// out with 16-byte stores, the TPW rows of a lane-group set as one contiguous
// range when their slots are consecutive in one page (whole 32-byte sectors
// per store instruction, e.g. for the 656-byte fp8_ds_mla rows), else row by
// row. UT: token sets (TPW tokens each) per warp and tile.
// PF (prefetch): the source rows of the warp's next tile are copied into a
// warp-private shared-memory buffer (cp.async, two tiles per warp) while the
// current tile is quantized, so every warp keeps a tile of loads in flight
// (the kernel is latency-bound: without it a warp's loads wait for its math).
template <class L> constexpr int prefetch_bytes(int ut) { return (kSpecThreads / 32) * 2 * ut * nslots<L>() * 32 * 16; }

template <class L, int MB, int ST, int UT, int PF>
__global__ void __launch_bounds__(kSpecThreads, MB) write_spec_kernel(const __grid_constant__ wargs A) {
  constexpr int P = lpt<L>(), NS = nslots<L>(), TPW = 32 / P, NI = n_items<L>();
  constexpr int BS = block_size<L>();
  constexpr int R0 = reg_row<L>(0);
  static_assert(!ST || stage_ok<L>(), "staged rows must be fully covered");
  __shared__ __align__(16) unsigned char sbuf[ST ? (kSpecThreads / 32) * UT * TPW * R0 : 16];
  const int lane = threadIdx.x & 31, sub = lane & (P - 1), grp = lane / P;
  const int lbase = lane & ~(P - 1);
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;

  // loop-invariant divisors: qmax of each grouped field, the tensor scale
  mla::divisor qdiv[MLA_LAYOUT_MAX_FIELDS];
  static_for<MLA_LAYOUT_MAX_FIELDS>([&](auto fc) {
    constexpr int f = decltype(fc)::value;
    if constexpr (f < nfields<L>()) {
      if constexpr (fld_role<L>(f) == MLA_FIELD_DATA && fld_skind<L>(f) == MLA_SCALE_GROUP)
      {
        constexpr float qm = fld_qmax<L>(f);
        qdiv[f] = mla::make_divisor(qm);
      }
    }
  });
  mla::divisor tdiv;
  if constexpr (has_tensor_scale<L>()) tdiv = mla::make_divisor(A.tscale ? __ldg(A.tscale) : 1.0f);

  const int64_t per_tile = (int64_t)TPW * UT;
  const int64_t ntiles = (A.n + per_tile - 1) / per_tile;
  // slot ids of the warp's next tile are loaded one tile ahead (the data
  // loads of a tile depend on them: one latency per tile instead of two)
  auto load_slot = [&](int64_t tile, int u) -> int64_t {
    const int64_t t = tile * per_tile + u * TPW + grp;
    if (tile >= ntiles || t >= A.n) return -1;
    return A.is64 ? (int64_t)__ldg((const long long *)A.slots + t * A.slot_stride)
                  : (int64_t)__ldg((const int *)A.slots + t * A.slot_stride);
  };
  // PF: slot (b, u, i) of this lane at pf_warp + ((b * UT + u) * NS + i) * 512 + lane * 16
  extern __shared__ __align__(16) unsigned char pf_buf[];
  const uint32_t pf_warp = PF ? (threadIdx.x >> 5) * (2 * UT * NS * 512) + lane * 16 : 0;
  auto pf_issue = [&](int64_t tile, int b) {
    if (tile < ntiles) {
#pragma unroll
      for (int u = 0; u < UT; u++) {
        const int64_t t = tile * per_tile + u * TPW + grp;
        if (t < A.n) {
          const unsigned char *ar = A.a + t * A.a_stride, *br = A.b + t * A.b_stride;
          const uint32_t d = (uint32_t)__cvta_generic_to_shared(pf_buf) + pf_warp + (b * UT + u) * NS * 512;
#pragma unroll
          for (int i = 0; i < NS; i++) {
            const int c = P * i + sub;
            mla::cp_async16(d + i * 512, (c < A.splitc ? ar : br) + 16 * c, 16);
          }
        }
      }
    }
    mla::cp_async_commit();
  };
  int pb = 0;
  if constexpr (PF) pf_issue(warp, 0);
  int64_t next[UT];
#pragma unroll
  for (int u = 0; u < UT; u++) next[u] = load_slot(warp, u);
#pragma unroll 1
  for (int64_t tile = warp; tile < ntiles; tile += nwarps) {
    int64_t tok[UT], slotv[UT];
    int state[UT]; // 1 write, 0 nothing, -1 slot past the cache
    unsigned char *pg[UT];
    int tt[UT];
#pragma unroll
    for (int u = 0; u < UT; u++) {
      tok[u] = tile * per_tile + u * TPW + grp;
      const int64_t slot = next[u];
      slotv[u] = slot;
      next[u] = load_slot(tile + nwarps, u);
      const int64_t page = (int64_t)((uint64_t)slot / (uint64_t)BS);
      state[u] = slot < 0 ? 0 : page < A.num_pages ? 1 : -1;
      tt[u] = (int)((uint64_t)slot & (uint64_t)(BS - 1));
      pg[u] = A.base + (state[u] == 1 ? page : 0) * A.page_stride;
    }
    uint4 w[UT][NS];
    if constexpr (PF) {
      // the next tile's copies go out before this tile's are waited for; a
      // lane reads only what it copied, so its own wait is enough
      pf_issue(tile + nwarps, pb ^ 1);
      mla::cp_async_wait<1>();
#pragma unroll
      for (int u = 0; u < UT; u++)
#pragma unroll
        for (int i = 0; i < NS; i++)
          w[u][i] = state[u] == 1 ? *reinterpret_cast<const uint4 *>(pf_buf + pf_warp + ((pb * UT + u) * NS + i) * 512)
                                  : make_uint4(0, 0, 0, 0);
      pb ^= 1;
    } else {
#pragma unroll
      for (int u = 0; u < UT; u++) {
        const unsigned char *ar = A.a + tok[u] * A.a_stride, *br = A.b + tok[u] * A.b_stride;
#pragma unroll
        for (int i = 0; i < NS; i++) {
          const int c = P * i + sub;
          if (state[u] == 1) w[u][i] = __ldg(reinterpret_cast<const uint4 *>((c < A.splitc ? ar : br) + 16 * c));
          else w[u][i] = make_uint4(0, 0, 0, 0);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < UT; u++) {
      const bool live = state[u] == 1;
      if (state[u] < 0 && sub == 0) mla_kv::count_bad(A.bad);
      // token rows of the regions (every descriptor value below is a constexpr:
      // a runtime call of the accessors would read the host-side descriptor)
      unsigned char *row[MLA_LAYOUT_MAX_REGIONS];
      static_for<MLA_LAYOUT_MAX_REGIONS>([&](auto rc) {
        constexpr int r = decltype(rc)::value;
        if constexpr (r >= nregions<L>()) {
          row[r] = nullptr;
        } else {
          constexpr int64_t ro = reg_off<L>(r);
          constexpr int rb = reg_row<L>(r), rc = reg_chunk<L>(r);
          if constexpr (rc) row[r] = pg[u] + ro + tt[u] * rc; // the token's first piece (row_at)
          else if constexpr (r == 0) {
            if constexpr (ST) row[r] = sbuf + (((threadIdx.x >> 5) * UT + u) * TPW + grp) * R0;
            else row[r] = pg[u] + ro + (int64_t)tt[u] * A.token_stride;
          }
          else row[r] = pg[u] + ro + tt[u] * rb;
        }
      });

      // ---- group maxima ----
      uint32_t am[NS];    // per slot: |x| max bits (grouped slots)
      uint32_t im[NI > 0 ? NI : 1]; // per cross item
#pragma unroll
      for (int k = 0; k < (NI > 0 ? NI : 1); k++) im[k] = 0;
      static_for<NS>([&](auto ii) {
        constexpr int i = decltype(ii)::value;
        if constexpr (slot_grouped<L>(i)) {
          am[i] = amax16(w[u][i]);
          if constexpr (slot_cross<L>(i)) im[slot_item<L>(i)] = max(im[slot_item<L>(i)], am[i]);
        } else {
          am[i] = 0;
        }
      });
      // cross items: two per shuffle, over the P lanes
      static_for<(NI + 1) / 2>([&](auto kk) {
        constexpr int k = 2 * decltype(kk)::value;
        uint32_t p = im[k] | (k + 1 < NI ? im[k + 1 < NI ? k + 1 : k] << 16 : 0u);
#pragma unroll
        for (int off = 1; off < P; off <<= 1) p = __vmaxu2(p, __shfl_xor_sync(0xffffffffu, p, off));
        im[k] = p & 0xFFFFu;
        if constexpr (k + 1 < NI) im[k + 1 < NI ? k + 1 : k] = p >> 16;
      });
      // sub-lane groups: slot i's group over gn lanes, two slots of a field per shuffle
      static_for<NS>([&](auto ii) {
        constexpr int i = decltype(ii)::value;
        if constexpr (slot_grouped<L>(i) && !slot_cross<L>(i)) {
          constexpr int f = slot_field<L>(i), gn = fld_gn<L>(f);
          constexpr int s0 = fld_lo8<L>(f) / P, s1 = (fld_lo8<L>(f) + fld_count<L>(f) / 8) / P;
          constexpr int i1 = i + 1 < s1 ? i + 1 : i; // the pair's second slot
          if constexpr ((i - s0) % 2 == 0) {
            uint32_t p = am[i] | (i1 != i ? am[i1] << 16 : 0u);
#pragma unroll
            for (int off = 1; off < gn; off <<= 1) p = __vmaxu2(p, __shfl_xor_sync(0xffffffffu, p, off));
            am[i] = p & 0xFFFFu;
            if constexpr (i1 != i) am[i1] = p >> 16;
          }
        }
      });
      float gam[NI > 0 ? NI : 1], sam[NS];
#pragma unroll
      for (int k = 0; k < NI; k++) gam[k] = __uint_as_float(im[k] << 16);
#pragma unroll
      for (int i = 0; i < NS; i++) sam[i] = __uint_as_float(am[i] << 16);

      // a NaN: the group's amax is its first NaN in dim order (the reference's scan)
      bool nan = false;
#pragma unroll
      for (int k = 0; k < NI; k++) nan |= im[k] > 0x7F80u;
#pragma unroll
      for (int i = 0; i < NS; i++) nan |= am[i] > 0x7F80u;
      if (__any_sync(0xffffffffu, live && nan)) {
        static_for<(NI > 0 ? NI : 0)>([&](auto kk) {
          constexpr int k = decltype(kk)::value;
          int key = 0x7FFFFFFF;
          uint32_t bits = 0;
          static_for<NS>([&](auto ii) {
            constexpr int i = decltype(ii)::value;
            if constexpr (slot_cross<L>(i) && slot_item<L>(i) == k) {
              if (key == 0x7FFFFFFF) first_nan(w[u][i], P * i + sub, key, bits);
            }
          });
#pragma unroll
          for (int off = 1; off < P; off <<= 1) {
            const int ok = __shfl_xor_sync(0xffffffffu, key, off);
            const uint32_t ob = __shfl_xor_sync(0xffffffffu, bits, off);
            if (ok < key) key = ok, bits = ob;
          }
          if (key != 0x7FFFFFFF) gam[k] = __uint_as_float(bits);
        });
        static_for<NS>([&](auto ii) {
          constexpr int i = decltype(ii)::value;
          if constexpr (slot_grouped<L>(i) && !slot_cross<L>(i)) {
            constexpr int gn = fld_gn<L>(slot_field<L>(i));
            int key = 0x7FFFFFFF;
            uint32_t bits = 0;
            first_nan(w[u][i], P * i + sub, key, bits);
#pragma unroll
            for (int off = 1; off < gn; off <<= 1) {
              const int ok = __shfl_xor_sync(0xffffffffu, key, off);
              const uint32_t ob = __shfl_xor_sync(0xffffffffu, bits, off);
              if (ok < key) key = ok, bits = ob;
            }
            if (key != 0x7FFFFFFF) sam[i] = __uint_as_float(bits);
          }
        });
      }

      // ---- scales ----
      mla::divisor idiv[NI > 0 ? NI : 1];
      if constexpr (NI == 1 || (NI > 0 && !items_one_field<L>())) {
        // every lane computes every item's scale (one item, or items of several fields)
        static_for<NI>([&](auto kk) {
          constexpr int k = decltype(kk)::value;
          constexpr int f = item_field<L>(k), sd = fld_sdtype<L>(f);
          float dec;
          const uint32_t code = mla_encode_scale(sd, group_scale<L, f>(gam[k], qdiv[f]), &dec);
          constexpr int sreg = fld_sregion<L>(f), so = fld_soff<L>(f) + item_group<L>(k) * scale_bytes_of(sd);
          if (live && sub == 0) store_scale<sd>(row_at<L, sreg>(row[sreg], so), code);
          idiv[k] = group_divisor<fast_e2m1<L>(f)>(dec);
        });
      } else if constexpr (NI > 1) {
        // item k's scale by lane k % P in round k / P, broadcast over the token's lanes
        constexpr int f = item_field<L>(0), sd = fld_sdtype<L>(f);
        constexpr int R = (NI + P - 1) / P;
        static_for<R>([&](auto rr) {
          constexpr int r = decltype(rr)::value;
          const int k = r * P + sub;
          float a = gam[r * P < NI ? r * P : 0];
          static_for<P>([&](auto jj) {
            constexpr int j = decltype(jj)::value;
            if constexpr (j > 0 && r * P + j < NI) {
              if (sub == j) a = gam[r * P + j];
            }
          });
          float dec;
          const uint32_t code = mla_encode_scale(sd, group_scale<L, f>(a, qdiv[f]), &dec);
          constexpr int sreg = fld_sregion<L>(f), so = fld_soff<L>(f), ss = scale_bytes_of(sd);
          if (live && k < NI) store_scale<sd>(row_at<L, sreg>(row[sreg], so + k * ss), code);
          const float rc = owner_rcp<fast_e2m1<L>(f)>(dec);
          static_for<P>([&](auto jj) {
            constexpr int j = decltype(jj)::value;
            if constexpr (r * P + j < NI) idiv[r * P + j] = shared_divisor<fast_e2m1<L>(f)>(dec, rc, lbase + j);
          });
        });
      }
      // sub-lane groups: in each run of gn slots, lane sub % gn computes slot run + sub % gn
      mla::divisor sdiv[NS];
      static_for<NS>([&](auto ii) {
        constexpr int i = decltype(ii)::value;
        if constexpr (slot_grouped<L>(i) && !slot_cross<L>(i)) {
          constexpr int f = slot_field<L>(i), gn = fld_gn<L>(f), sd = fld_sdtype<L>(f);
          constexpr int s0 = fld_lo8<L>(f) / P; // first slot of the field
          if constexpr ((i - s0) % gn == 0) {
            const int r = sub % gn;
            float a = sam[i];
            static_for<gn>([&](auto jj) {
              constexpr int j = decltype(jj)::value;
              if constexpr (j > 0) {
                if (r == j) a = sam[i + j];
              }
            });
            float dec;
            const uint32_t code = mla_encode_scale(sd, group_scale<L, f>(a, qdiv[f]), &dec);
            // group of chunk P * (i + r) + sub within the field
            constexpr int lo8 = fld_lo8<L>(f), sreg = fld_sregion<L>(f), so = fld_soff<L>(f), ss = scale_bytes_of(sd);
            const int g = (P * (i + r) - lo8) / gn + sub / gn;
            if (live) store_scale<sd>(row_at<L, sreg>(row[sreg], so + g * ss), code);
            const int src = lane & ~(gn - 1);
            const float rc = owner_rcp<fast_e2m1<L>(f)>(dec);
            static_for<gn>([&](auto jj) {
              constexpr int j = decltype(jj)::value;
              sdiv[i + j] = shared_divisor<fast_e2m1<L>(f)>(dec, rc, src + j);
            });
          }
        }
      });

      // ---- quantize and store ----
      if (live) {
        static_for<NS>([&](auto ii) {
          constexpr int i = decltype(ii)::value;
          constexpr int f = slot_field<L>(i), dt = fld_dtype<L>(f), sk = fld_skind<L>(f);
          constexpr int cb = chunk_bytes_of(dt);
          constexpr int reg = fld_region<L>(f), doff = slot_dst<L>(i);
          unsigned char *dst = row_at<L, reg>(row[reg], doff + sub * cb);
          const uint4 x = w[u][i];
          if constexpr (dt == MLA_BF16) {
            *reinterpret_cast<uint4 *>(dst) = mla::bf16x8_canon_nan(x);
          } else if constexpr (fast_e2m1<L>(f)) {
            if constexpr (slot_cross<L>(i)) {
              const mla::divisor &v = idiv[slot_item<L>(i)];
              *reinterpret_cast<uint32_t *>(dst) = mla::e2m1x8_encode_bf16_div(x, v.s, v.r);
            } else {
              *reinterpret_cast<uint32_t *>(dst) = mla::e2m1x8_encode_bf16_div(x, sdiv[i].s, sdiv[i].r);
            }
          } else {
            float q[8];
            mla::unpack_bf16x8(x, q);
            if constexpr (sk == MLA_SCALE_TENSOR) mla::divide8(tdiv, q);
            else if constexpr (sk == MLA_SCALE_GROUP) {
              if constexpr (slot_cross<L>(i)) divide8_group(idiv[slot_item<L>(i)], x, q);
              else divide8_group(sdiv[i], x, q);
            }
            if constexpr (dt == MLA_E4M3) *reinterpret_cast<uint2 *>(dst) = mla::e4m3x8_encode(q);
            else *reinterpret_cast<uint32_t *>(dst) = mla::e2m1x8_encode(q);
          }
        });
        if (sub == 0) { // padding bytes are written as zeros
          static_for<MLA_LAYOUT_MAX_FIELDS>([&](auto fc) {
            constexpr int f = decltype(fc)::value;
            if constexpr (f < nfields<L>()) {
              if constexpr (fld_role<L>(f) == MLA_FIELD_PAD) {
                constexpr int reg = fld_region<L>(f), boff = fld_byte_off<L>(f), cnt = fld_count<L>(f);
#pragma unroll
                for (int b = 0; b < cnt; b++) *row_at<L, reg>(row[reg], boff + b) = 0;
              }
            }
          });
        }
      }
      if constexpr (ST) {
        // ---- copy the staged region-0 rows out ----
        __syncwarp();
        constexpr int64_t ro = reg_off<L>(0);
        const int64_t s0 = __shfl_sync(0xffffffffu, slotv[u], 0);
        const bool run = live && slotv[u] == s0 + grp && (int64_t)(s0 & (BS - 1)) <= BS - TPW;
        const uint4 *srcs = reinterpret_cast<const uint4 *>(row[0]);
        if (__all_sync(0xffffffffu, run) && A.token_stride == R0) {
          const uint4 *sw = reinterpret_cast<const uint4 *>(sbuf + ((threadIdx.x >> 5) * UT + u) * TPW * R0);
          uint4 *g = reinterpret_cast<uint4 *>(A.base + (int64_t)((uint64_t)s0 / (uint64_t)BS) * A.page_stride + ro +
                                               (int64_t)(s0 & (BS - 1)) * R0);
          constexpr int N16 = TPW * R0 / 16;
#pragma unroll
          for (int k = lane; k < N16; k += 32) g[k] = sw[k];
        } else if (live) {
          uint4 *g = reinterpret_cast<uint4 *>(pg[u] + ro + (int64_t)tt[u] * A.token_stride);
#pragma unroll
          for (int k = sub; k < R0 / 16; k += P) g[k] = srcs[k];
        }
        __syncwarp();
      }
    }
  }
}

} // namespace kvw

#endif
