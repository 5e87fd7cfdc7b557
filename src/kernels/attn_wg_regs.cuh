// Register-fed K tiles of the Hopper decode kernel (attn_decode_wg.cuh,
// mode WG_REGS): how a built-in fp8 layout's token row maps onto the loader
// threads (rf_chunk, rf_ok), codes mode (rf_codes_ok: e4m3 codes times
// f16(s x 2^-E) in the K tile), and one thread's share of a key in registers
// (rf_key: load, then convert into the swizzled tile).
#ifndef MLA_ATTN_WG_REGS_CUH
#define MLA_ATTN_WG_REGS_CUH

#include <type_traits>

#include "attn_decode_kernel.cuh"
#include "attn_spec_layouts.cuh"
#include "mla/wgmma.cuh"

namespace mla_attn {
namespace wg {

// Thread lt of warpgroups 1 and 2 owns key n = lt / 4 of a tile; its quarter
// q = lt % 4 takes chunks 8i + 2q and 8i + 2q + 1 (i < DQK / 64), so a key's
// four quarters load 64 consecutive bytes of e4m3 codes (or 128 of bf16) per
// instruction: 16 e4m3 bytes in one 16-byte load, a bf16 chunk in one.
struct rf_chunk {
  int kind;      // mla_attn_spec::SK_*; SK_BAD: not register-fed
  int region;    // region of the data
  int src;       // first byte in the region's token row, quarter 0
  int sregion;   // scale's region and byte in its row (SK_FP8_F32, SK_FP8_UE8M0)
  int ssrc;
};

__host__ __device__ constexpr int rf_chunk_index(int i, int q, int h) { return 8 * i + 2 * q + h; }

// Region holding stage byte b of a layout, -1 none.
__host__ __device__ constexpr int region_at(const mla_layout_desc &d, int b) {
  for (int r = 0; r < d.nregions && r < MLA_LAYOUT_MAX_REGIONS; r++) {
    const int lo = mla_attn_spec::stage_off(d, r);
    if (b >= lo && b < lo + d.region_row_bytes[r]) return r;
  }
  return -1;
}

// Chunk c of a layout, in region coordinates.
__host__ __device__ constexpr rf_chunk rf_chunk_at(const mla_layout_desc &d, int c) {
  using namespace mla_attn_spec;
  const spec_chunk k = chunk_at(d, 8 * c);
  if (k.kind == SK_ZERO) return {SK_ZERO, 0, 0, 0, 0};
  if (k.kind == SK_BAD) return {SK_BAD, 0, 0, 0, 0};
  const int bytes = k.kind == SK_COPY ? 16 : 8;
  const int r = region_at(d, k.src);
  if (r < 0 || region_at(d, k.src + bytes - 1) != r) return {SK_BAD, 0, 0, 0, 0};
  const int sr = k.scale_src >= 0 ? region_at(d, k.scale_src) : 0;
  if (sr < 0) return {SK_BAD, 0, 0, 0, 0};
  return {k.kind, r, k.src - stage_off(d, r), sr, k.scale_src >= 0 ? k.scale_src - stage_off(d, sr) : 0};
}

// chunk h of pair i, quarter 0
__host__ __device__ constexpr rf_chunk rf_pair(const mla_layout_desc &d, int i, int h = 0) { return rf_chunk_at(d, rf_chunk_index(i, 0, h)); }

// A chunked region (layout_desc.h) is register-fed where a thread's loads
// stay in pieces and split additively: the offset of row byte src + 16 q
// (pair i's first byte src, quarter q) is that of src plus that of 16 q, so
// the quarter's part is one per-thread base and the pair's an immediate.
// True for pieces of 16 or 32 bytes that src starts, or multiples of 64 with
// src on a 64-byte boundary; bf16 (32-byte quarters) runs only in whole rows.
__host__ __device__ constexpr bool rf_pieces_ok(const mla_layout_desc &d, int r, int src, bool bf16) {
  const int c = d.region_chunk[r];
  if (c == 0) return true;
  if (bf16) return false;
  return (c == 16 || c == 32) ? src % c == 0 : c % 64 == 0 && src % 64 == 0;
}
// Offset of row byte b of region r from the key's first byte in it (its row
// start, or its first piece): b itself where rows are whole.
__host__ __device__ constexpr int64_t rf_piece_off(const mla_layout_desc &d, int r, int64_t b) {
  return mla_region_base(&d, r, b) - d.region_off[r];
}

// Whether a layout can be register-fed: every chunk known, the quarters of a
// key on consecutive bytes of one region with one scale, data regions 16-byte
// granular, and an e4m3 chunk pair (h = 0, 1) one 16-byte load.
__host__ __device__ constexpr bool rf_ok(const mla_layout_desc &d, int dqk) {
  using namespace mla_attn_spec;
  if (dqk % 64) return false;
  for (int i = 0; i < dqk / 64; i++) {
    const rf_chunk a0 = rf_pair(d, i, 0), a1 = rf_pair(d, i, 1);
    if (a0.kind == SK_BAD || a1.kind == SK_BAD) return false;
    if (is_fp8_kind(a0.kind) != is_fp8_kind(a1.kind) || (a0.kind == SK_ZERO) != (a1.kind == SK_ZERO)) return false;
    if (is_fp8_kind(a0.kind) && (a1.kind != a0.kind || a1.region != a0.region || a1.src != a0.src + 8 || a0.src % 16 ||
                                 a1.sregion != a0.sregion || a1.ssrc != a0.ssrc))
      return false;
    // an e4m3 pair is one 16-byte load from a0.src; bf16 halves are two loads, both in whole rows
    if (a0.kind != SK_ZERO && !rf_pieces_ok(d, a0.region, a0.src, a0.kind == SK_COPY)) return false;
    if (a1.kind == SK_COPY && !rf_pieces_ok(d, a1.region, a1.src, true)) return false;
    for (int h = 0; h < 2; h++) {
      const rf_chunk a = h ? a1 : a0;
      if (a.kind != SK_ZERO && region_gran(d, a.region) < 16) return false;
      for (int q = 1; q < 4; q++) {
        const rf_chunk b = rf_chunk_at(d, rf_chunk_index(i, q, h));
        if (b.kind != a.kind) return false;
        if (a.kind == SK_ZERO) continue;
        if (b.region != a.region || b.src != a.src + q * (a.kind == SK_COPY ? 32 : 16) || b.sregion != a.sregion ||
            b.ssrc != a.ssrc)
          return false;
      }
    }
  }
  return true;
}

// Scales of a thread's chunk pairs: whether pair i is the first with its
// scale, and how many distinct scales there are.
__host__ __device__ constexpr bool rf_scaled(int kind) {
  return kind == mla_attn_spec::SK_FP8_F32 || kind == mla_attn_spec::SK_FP8_UE8M0;
}
__host__ __device__ constexpr bool rf_same_scale(const rf_chunk &a, const rf_chunk &b) {
  return a.kind == b.kind && a.sregion == b.sregion && a.ssrc == b.ssrc;
}
__host__ __device__ constexpr bool rf_scale_first(const mla_layout_desc &d, int i) {
  if (!rf_scaled(rf_pair(d, i).kind)) return false;
  for (int j = 0; j < i; j++)
    if (rf_same_scale(rf_pair(d, j), rf_pair(d, i))) return false;
  return true;
}
__host__ __device__ constexpr int rf_scale_count(const mla_layout_desc &d, int dqk) {
  int n = 0;
  for (int i = 0; i < dqk / 64; i++) n += rf_scale_first(d, i);
  return n;
}

// Scales are read in aligned windows of their region, as wide as its
// granularity (up to 16 bytes; find_variant checks the view allows it), each
// window loaded once as one vector: fp8_v4's seven ue8m0 bytes are one 8-byte
// load (a load each took issue slots the memory-bound 16-row kernels lack:
// h16 3.7-5.4% faster). f32 scales only where f32w (the 64-row kernel, 1.5%
// faster): in rs16 fp8_ds_mla's four f32 scales as one 16-byte window (or two
// 8-byte ones) ran fewer instructions but 3% slower from DRAM
// (bench/RESULTS.md, twentieth session), so there each is one load.
__host__ __device__ constexpr int rf_window_bytes(const mla_layout_desc &d, int i, bool f32w) {
  const rf_chunk a = rf_pair(d, i);
  const bool f32 = a.kind == mla_attn_spec::SK_FP8_F32;
  if (f32 && !f32w) return 4;
  const int g = mla_attn_spec::region_gran(d, a.sregion);
  return g >= 4 ? g : f32 ? 4 : 1;
}
__host__ __device__ constexpr int rf_window_start(const mla_layout_desc &d, int i, bool f32w) {
  return rf_pair(d, i).ssrc / rf_window_bytes(d, i, f32w) * rf_window_bytes(d, i, f32w);
}
__host__ __device__ constexpr bool rf_same_window(const mla_layout_desc &d, int i, int j, bool f32w) {
  return rf_scaled(rf_pair(d, i).kind) && rf_scaled(rf_pair(d, j).kind) && rf_pair(d, i).sregion == rf_pair(d, j).sregion &&
         rf_window_bytes(d, i, f32w) == rf_window_bytes(d, j, f32w) && rf_window_start(d, i, f32w) == rf_window_start(d, j, f32w);
}
__host__ __device__ constexpr bool rf_window_first(const mla_layout_desc &d, int i, bool f32w) {
  if (!rf_scaled(rf_pair(d, i).kind)) return false;
  for (int j = 0; j < i; j++)
    if (rf_same_window(d, j, i, f32w)) return false;
  return true;
}
// slot of pair i's window among the windows of pairs 0..i (-1: no scale)
__host__ __device__ constexpr int rf_window_slot(const mla_layout_desc &d, int i, bool f32w) {
  int n = 0;
  for (int j = 0; j <= i; j++) {
    if (!rf_window_first(d, j, f32w)) continue;
    if (rf_same_window(d, j, i, f32w)) return n;
    n++;
  }
  return -1;
}
__host__ __device__ constexpr int rf_window_count(const mla_layout_desc &d, int dqk, bool f32w) {
  int n = 0;
  for (int i = 0; i < dqk / 64; i++) n += rf_window_first(d, i, f32w);
  return n;
}

// Codes mode: register-fed layouts whose dims are e4m3 or bf16. K tiles hold
// each e4m3 code times f16(s x 2^-E), E the split's running maximum scale
// exponent plus headroom, so a value pair costs one conversion and one f16
// multiply (the bf16 path: an f32 round trip, three instructions per value);
// bf16 dims are multiplied by 2^-E (exact). S runs on f16 operands (bf16 for
// bf16 dims) and P V on f16 P (a bf16 twin for bf16 value dims; the output is
// normalized by the f16-rounded sum); Q's power of two, 2^E and a tensor
// scale fold into the softmax factor and the output. Tensor-scaled and
// per-key-scaled blocks do not mix (one fold).
// e4m3 blocks leading P V warpgroup w's four value blocks
__host__ __device__ constexpr int rf_f16_lead(const mla_layout_desc &d, int w) {
  int n = 0;
  while (n < 4 && mla_attn_spec::is_fp8_kind(rf_pair(d, 4 * w + n).kind)) n++;
  return n;
}
// Value blocks [0, lead) of each P V warpgroup are f16 (n64 x lead), the
// rest bf16, the same split in both so that they run one instruction
// sequence (a wgmma shape chosen per warpgroup at run time makes ptxas
// serialize every wgmma): fp8_v4's RoPE block makes block 3 bf16 too.
__host__ __device__ constexpr int rf_codes_lead(const mla_layout_desc &d) {
  return rf_f16_lead(d, 0) < rf_f16_lead(d, 1) ? rf_f16_lead(d, 0) : rf_f16_lead(d, 1);
}
__host__ __device__ constexpr bool rf_codes_ok(const mla_layout_desc &d, int dqk) {
  using namespace mla_attn_spec;
  if (!rf_ok(d, dqk)) return false;
  int tensor = 0, other = 0;
  for (int i = 0; i < dqk / 64; i++) {
    const int k = rf_pair(d, i).kind;
    if (!is_fp8_kind(k) && k != SK_COPY) return false;
    if (is_fp8_kind(k)) (k == SK_FP8_TENSOR ? tensor : other)++;
    // bf16 value dims take P as bf16 too: a second P tile, which fits
    // beside 512-dim K only
    if (i < DV / 64 && k == SK_COPY && dqk != DV) return false;
  }
  const int lead = rf_codes_lead(d);
  return (lead == 3 || lead == 4) && !(tensor && other);
}
// bit i: 64-dim block i is f16 (e4m3 codes) in the K tile; other e4m3 blocks
// are converted to bf16 (code x s x 2^-E, rounded once)
__host__ __device__ constexpr unsigned rf_f16_blocks(const mla_layout_desc &d, int dqk) {
  unsigned m = 0;
  const int lead = rf_codes_lead(d);
  for (int i = 0; i < dqk / 64; i++)
    if (mla_attn_spec::is_fp8_kind(rf_pair(d, i).kind) && (i >= DV / 64 || i % 4 < lead)) m |= 1u << i;
  return m;
}
__host__ __device__ constexpr bool rf_tensor_scaled(const mla_layout_desc &d, int dqk) {
  for (int i = 0; i < dqk / 64; i++)
    if (rf_pair(d, i).kind == mla_attn_spec::SK_FP8_TENSOR) return true;
  return false;
}
// Headroom below the largest scale: codes (< 2^9) x f16(s x 2^-E) < 2^15.
constexpr int E_HEADROOM = 5, E_MIN = -64, E_MAX = 64;

// Codes mode, per tile: a warp's share of the tile's largest scale exponent
// field (x: the lane's), folded into *slot; after a barrier, tile_exponent
// turns the slot into the tile's E (the split's running maximum e_before
// raised to the field less the headroom, within [E_MIN, E_MAX]).
__device__ __forceinline__ void gather_scale_exp(int x, int *slot, int lane) {
  x = __reduce_max_sync(0xffffffffu, x);
  if (lane == 0) atomicMax(slot, x);
}
__device__ __forceinline__ int tile_exponent(int field, int e_before) {
  return max(e_before, field ? min(max(field - 127 - E_HEADROOM, E_MIN), E_MAX) : E_MIN);
}

// 2^x for an integer x in [-126, 127]
__device__ __forceinline__ float pow2i(int x) { return __uint_as_float((uint32_t)(127 + x) << 23); }

// One thread's share of a key: loaded into registers, then converted into a K tile.
// F32W: f32 scales in windows too (rf_window_bytes).
template <class LS, int DQK, bool F32W = false> struct rf_key {
  static constexpr int NI = DQK / 64, NW = rf_window_count(LS::host, DQK, F32W);
  uint4 d[NI][2];  // e4m3 pair in d[i][0]; bf16 chunks in d[i][0], d[i][1]
  uint32_t sw[NW > 0 ? NW : 1][4]; // scale windows (rf_window_bytes), byte 4k + j in bits 8j of word k
  bool ok;


  // Row byte B of region R as an offset from the key's row (or first piece) in it: B where rows are whole.
  template <int R, int B> static constexpr auto at_of() {
    if constexpr (LS::host.region_chunk[R] == 0) return B;
    else return rf_piece_off(LS::host, R, B);
  }

  // Starts the loads of key (page, off) for quarter q; a key without a page reads as zeros.
  __device__ __forceinline__ void load(const params &p, int page, int off, int q) {
    using namespace mla_attn_spec;
    ok = page >= 0;
    const unsigned char *pb = p.v.base + (ok ? (int64_t)page * p.v.page_stride : 0);
    // The key's row in each region, and the quarter's start in it for e4m3
    // (16 q) and bf16 (32 q) chunks: computed once, so that every load is a
    // constant offset from one of them (rebuilt per load, the 64-bit address
    // took about six instructions a load: ncu, nineteenth session).
    // A chunked region's "row" is the key's first piece, and offsets are pieces' (rf_piece_off).
    constexpr int NR = LS::host.nregions;
    const unsigned char *rows[NR], *rq16[NR], *rq32[NR];
    if constexpr (!mla_layout_chunked(&LS::host)) {
#pragma unroll
      for (int r = 0; r < NR; r++) {
        rows[r] = pb + p.d.region_off[r] + (int64_t)off * (r == 0 ? p.v.token_stride : (int64_t)p.d.region_row_bytes[r]);
        rq16[r] = rows[r] + 16 * q, rq32[r] = rows[r] + 32 * q;
      }
    } else {
      static_for<NR>([&](auto rc) {
        constexpr int r = decltype(rc)::value, c = LS::host.region_chunk[r];
        rows[r] = pb + p.d.region_off[r] + (int64_t)off * (c ? c : r == 0 ? p.v.token_stride : (int64_t)p.d.region_row_bytes[r]);
        constexpr int64_t PS = (int64_t)c * LS::host.block_size; // bytes between a token's pieces
        rq16[r] = rows[r] + (c ? (16 * q) / c * PS + (16 * q) % c : 16 * q);
        rq32[r] = rows[r] + 32 * q; // bf16 reads only whole rows (rf_pieces_ok)
      });
    }
    static_for<NI>([&](auto ic) {
      constexpr int i = decltype(ic)::value;
      constexpr rf_chunk a0 = rf_pair(LS::host, i, 0), a1 = rf_pair(LS::host, i, 1);
      constexpr int w = rf_window_slot(LS::host, i, F32W), wb = rf_window_bytes(LS::host, i, F32W);
      d[i][0] = d[i][1] = make_uint4(0, 0, 0, 0);
      if constexpr (rf_window_first(LS::host, i, F32W)) sw[w][0] = sw[w][1] = sw[w][2] = sw[w][3] = 0;
      if (!ok) return;
      if constexpr (is_fp8_kind(a0.kind)) {
        d[i][0] = __ldg(reinterpret_cast<const uint4 *>(rq16[a0.region] + at_of<a0.region, a0.src>()));
        if constexpr (rf_window_first(LS::host, i, F32W)) {
          const unsigned char *at = rows[a0.sregion] + at_of<a0.sregion, rf_window_start(LS::host, i, F32W)>();
          if constexpr (wb == 16) {
            const uint4 v = __ldg(reinterpret_cast<const uint4 *>(at));
            sw[w][0] = v.x, sw[w][1] = v.y, sw[w][2] = v.z, sw[w][3] = v.w;
          } else if constexpr (wb == 8) {
            const uint2 v = __ldg(reinterpret_cast<const uint2 *>(at));
            sw[w][0] = v.x, sw[w][1] = v.y;
          } else if constexpr (wb == 4) sw[w][0] = __ldg(reinterpret_cast<const unsigned int *>(at));
          else sw[w][0] = __ldg(at);
        }
      } else if constexpr (a0.kind == SK_COPY) {
        d[i][0] = __ldg(reinterpret_cast<const uint4 *>(rq32[a0.region] + a0.src));
        d[i][1] = __ldg(reinterpret_cast<const uint4 *>(rq32[a1.region] + a1.src));
      }
    });
  }

  // Pair I's scale from its window: f32 bits, or the ue8m0 byte.
  template <int I> __device__ __forceinline__ uint32_t scale_bits() const {
    constexpr rf_chunk a = rf_pair(LS::host, I);
    constexpr int off = a.ssrc - rf_window_start(LS::host, I, F32W);
    const uint32_t word = sw[rf_window_slot(LS::host, I, F32W)][off / 4];
    if constexpr (a.kind == mla_attn_spec::SK_FP8_F32) {
      static_assert(off % 4 == 0, "an f32 scale is 4-byte aligned in its window");
      return word;
    } else {
      return (word >> (8 * (off % 4))) & 0xffu;
    }
  }

  // Pair i's scale as f32 (tscale for a tensor scale, 1 where there is none).
  template <int I> __device__ __forceinline__ float pair_scale(float tscale) const {
    using namespace mla_attn_spec;
    constexpr int kind = rf_pair(LS::host, I).kind;
    if constexpr (kind == SK_FP8_TENSOR) return tscale;
    else if constexpr (kind == SK_FP8_F32) return __uint_as_float(scale_bits<I>());
    else if constexpr (kind == SK_FP8_UE8M0) return mla_ue8m0_scale(scale_bits<I>());
    else return 1.0f;
  }

  // Largest finite exponent field among this thread's scales (0: none, or
  // no key). Each field f as (f + 1) mod 256, so that the non-finite 255
  // drops to 0: a tree of independent maxima, not a chain of compare and
  // select (fp8_v4 h128 1% faster, thirty-third session).
  __device__ __forceinline__ int scale_exp() const {
    using namespace mla_attn_spec;
    int g[NI];
    static_for<NI>([&](auto ic) {
      constexpr int i = decltype(ic)::value;
      g[i] = 0;
      if constexpr (rf_scale_first(LS::host, i)) {
        const uint32_t v = scale_bits<i>();
        g[i] = (int)(((rf_pair(LS::host, i).kind == SK_FP8_F32 ? v >> 23 : v) + 1u) & 0xffu);
      }
    });
#pragma unroll
    for (int w = 1; w < NI; w *= 2)
#pragma unroll
      for (int i = 0; i + w < NI; i += 2 * w) g[i] = max(g[i], g[i + w]);
    return max(g[0] - 1, 0); // a key without a page has zeroed scale windows: 0
  }

  // Codes mode: converts into rows n of the swizzled K tile kt; ef = 2^-E.
  template <int KB, bool HAS_E> __device__ __forceinline__ void store_codes(unsigned char *kt, int n, int q, float ef) const {
    using namespace mla_attn_spec;
    const uint32_t eb = __float_as_uint(ef) >> 16, eb2 = eb | eb << 16; // bf16x2 of 2^-E, exact
    static_for<NI>([&](auto ic) {
      constexpr int i = decltype(ic)::value;
      constexpr rf_chunk a0 = rf_pair(LS::host, i);
      uint4 v0 = d[i][0], v1 = d[i][1];
      if constexpr (is_fp8_kind(a0.kind) && !((rf_f16_blocks(LS::host, DQK) >> i) & 1)) {
        // a bf16 value block of a mixed layout: code x s x 2^-E, rounded once
        // (a tensor scale is folded elsewhere in codes mode)
        const float s = pair_scale<i>(1.0f);
        v0 = mla::e4m3x8_scaled_bf16(make_uint2(d[i][0].x, d[i][0].y), s * ef);
        v1 = mla::e4m3x8_scaled_bf16(make_uint2(d[i][0].z, d[i][0].w), s * ef);
      } else if constexpr (is_fp8_kind(a0.kind)) {
        const uint32_t w[4] = {d[i][0].x, d[i][0].y, d[i][0].z, d[i][0].w};
        uint32_t h[8];
#pragma unroll
        for (int j = 0; j < 4; j++) h[2 * j] = mla::e4m3x2_f16(w[j]), h[2 * j + 1] = mla::e4m3x2_f16(w[j] >> 16);
        if constexpr (a0.kind == SK_FP8_F32 || a0.kind == SK_FP8_UE8M0 || (a0.kind == SK_FP8_ONE && HAS_E)) {
          const float s = pair_scale<i>(1.0f);
          const uint32_t s2 = mla::pack_f16x2(s * ef, s * ef);
#pragma unroll
          for (int j = 0; j < 8; j++) h[j] = mla::mul_f16x2(h[j], s2);
        }
        v0 = make_uint4(h[0], h[1], h[2], h[3]), v1 = make_uint4(h[4], h[5], h[6], h[7]);
      } else if constexpr (a0.kind == SK_COPY && HAS_E) {
        v0 = make_uint4(mla::mul_bf16x2(v0.x, eb2), mla::mul_bf16x2(v0.y, eb2), mla::mul_bf16x2(v0.z, eb2), mla::mul_bf16x2(v0.w, eb2));
        v1 = make_uint4(mla::mul_bf16x2(v1.x, eb2), mla::mul_bf16x2(v1.y, eb2), mla::mul_bf16x2(v1.z, eb2), mla::mul_bf16x2(v1.w, eb2));
      }
      *reinterpret_cast<uint4 *>(kt + mla::sw128_off(KB, n, rf_chunk_index(i, q, 0))) = v0;
      *reinterpret_cast<uint4 *>(kt + mla::sw128_off(KB, n, rf_chunk_index(i, q, 1))) = v1;
    });
  }

  // Codes mode, into registers: pair I's 16 dims of this quarter as 8 f16x2
  // (bf16x2 for a bf16 block), h[k] = dims 2k, 2k + 1; ef = 2^-E. Every e4m3
  // block becomes f16 codes here (rf_f16_blocks' lead split is the
  // shared-memory kernels').
  template <int I, bool HAS_E> __device__ __forceinline__ void frag(uint32_t (&h)[8], float ef) const {
    using namespace mla_attn_spec;
    constexpr rf_chunk a0 = rf_pair(LS::host, I);
    if constexpr (is_fp8_kind(a0.kind)) {
      const uint32_t w[4] = {d[I][0].x, d[I][0].y, d[I][0].z, d[I][0].w};
#pragma unroll
      for (int j = 0; j < 4; j++) h[2 * j] = mla::e4m3x2_f16(w[j]), h[2 * j + 1] = mla::e4m3x2_f16(w[j] >> 16);
      if constexpr (a0.kind == SK_FP8_F32 || a0.kind == SK_FP8_UE8M0 || (a0.kind == SK_FP8_ONE && HAS_E)) {
        const float s = pair_scale<I>(1.0f);
        const uint32_t s2 = mla::pack_f16x2(s * ef, s * ef);
#pragma unroll
        for (int j = 0; j < 8; j++) h[j] = mla::mul_f16x2(h[j], s2);
      }
    } else if constexpr (a0.kind == SK_COPY) {
      const uint32_t v[8] = {d[I][0].x, d[I][0].y, d[I][0].z, d[I][0].w, d[I][1].x, d[I][1].y, d[I][1].z, d[I][1].w};
      const uint32_t eb = __float_as_uint(ef) >> 16, eb2 = eb | eb << 16; // bf16x2 of 2^-E, exact
#pragma unroll
      for (int j = 0; j < 8; j++) h[j] = HAS_E ? mla::mul_bf16x2(v[j], eb2) : v[j];
    } else {
#pragma unroll
      for (int j = 0; j < 8; j++) h[j] = 0;
    }
  }

  // Converts into rows n of the swizzled K tile kt (KB rows).
  template <int KB> __device__ __forceinline__ void store(unsigned char *kt, int n, int q, float tscale) const {
    using namespace mla_attn_spec;
    static_for<NI>([&](auto ic) {
      constexpr int i = decltype(ic)::value;
      constexpr rf_chunk a0 = rf_pair(LS::host, i);
      uint4 v0 = d[i][0], v1 = d[i][1];
      if constexpr (is_fp8_kind(a0.kind)) {
        const float s = pair_scale<i>(tscale);
        v0 = mla::e4m3x8_scaled_bf16(make_uint2(d[i][0].x, d[i][0].y), s);
        v1 = mla::e4m3x8_scaled_bf16(make_uint2(d[i][0].z, d[i][0].w), s);
      }
      *reinterpret_cast<uint4 *>(kt + mla::sw128_off(KB, n, rf_chunk_index(i, q, 0))) = v0;
      *reinterpret_cast<uint4 *>(kt + mla::sw128_off(KB, n, rf_chunk_index(i, q, 1))) = v1;
    });
  }
};

// Codes mode, every thread of the CTA (one __syncthreads): Q x 2^-qk in the
// swizzled Q tile of MR rows, f16 in the f16 blocks (exact; every finite |q|
// below 2^15), bf16 elsewhere; qmx: the thread's largest finite |q| of the
// f16 blocks, as bits. Also clears the two tile scale-exponent maxima.
// Returns qk.
template <class CO, int MR, int NCH, int NT>
__device__ __forceinline__ int codes_q(unsigned char *Qs, uint32_t qmx, int *qmax_w, int *emax_s, int tid, int lane) {
  int qk;
  qmx = __reduce_max_sync(0xffffffffu, qmx);
  if (lane == 0) qmax_w[tid >> 5] = (int)qmx;
  if (tid == 0) emax_s[0] = emax_s[1] = 0;
  __syncthreads();
  int mx = 0;
#pragma unroll
  for (int i = 0; i < NT / 32; i++) mx = max(mx, qmax_w[i]);
  const int e = (mx >> 7) - 127;
  qk = e >= 15 ? e - 14 : 0;
  const float qs = pow2i(-qk);
  const uint32_t qb = __float_as_uint(qs) >> 16, qb2 = qb | qb << 16;
  for (int idx = tid; idx < MR * NCH; idx += NT) {
    const int row = idx / NCH, c = idx - row * NCH;
    uint4 *at = reinterpret_cast<uint4 *>(Qs + mla::sw128_off(MR, row, c));
    uint4 v = *at;
    if ((CO::f16_blocks >> (c / 8)) & 1)
      v = make_uint4(bf16x2_to_f16x2(v.x, qs), bf16x2_to_f16x2(v.y, qs), bf16x2_to_f16x2(v.z, qs), bf16x2_to_f16x2(v.w, qs));
    else if (qk)
      v = make_uint4(mla::mul_bf16x2(v.x, qb2), mla::mul_bf16x2(v.y, qb2), mla::mul_bf16x2(v.z, qb2), mla::mul_bf16x2(v.w, qb2));
    *at = v;
  }
  return qk;
}

template <class LS, int DQK> constexpr bool rf_allowed() {
  if constexpr (std::is_void<LS>::value) return false;
  else return rf_ok(LS::host, DQK);
}
// codes mode (see rf_codes_ok): layout facts, all false / 0 off it
template <class LS, int DQK, bool NONE = std::is_void<LS>::value> struct codes_of {
  static constexpr bool on = false, has_e = false, tensor = false, mixed = false;
  static constexpr unsigned f16_blocks = 0;
  static constexpr int lead = 4;
};
template <class LS, int DQK> struct codes_of<LS, DQK, false> {
  static constexpr bool on = rf_codes_ok(LS::host, DQK);
  static constexpr bool has_e = on && rf_scale_count(LS::host, DQK) > 0, tensor = on && rf_tensor_scaled(LS::host, DQK);
  static constexpr unsigned f16_blocks = on ? rf_f16_blocks(LS::host, DQK) : 0u;
  static constexpr int lead = on ? rf_codes_lead(LS::host) : 4;
  static constexpr bool mixed = on && lead < 4; // bf16 value dims: a bf16 twin of each P tile
};
// page size a specialized layout is compiled for (0: none)
template <class LS> constexpr int rf_block_size() {
  if constexpr (std::is_void<LS>::value) return 0;
  else return LS::host.block_size;
}
template <class LS, int DQK, bool ON> struct rf_holder { using type = rf_key<LS, DQK, true>; };
template <class LS, int DQK> struct rf_holder<LS, DQK, false> { struct type {}; };

} // namespace wg
} // namespace mla_attn

#endif
