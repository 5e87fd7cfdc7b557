// Requant (repack) of a whole layer pool, e.g. fp8 per-tensor 576 B ->
// V3.2 656 B: every token of src's pages into the same slot of dst. Chunk by
// chunk: a dst chunk with group scales takes the src codes unchanged and the
// tensor scale as its f32 scale (values preserved bit for bit), or, from a
// src chunk under the same group scales, the src scale's bits (a relayout,
// e.g. V3.2 656 B interleaved <-> page-blocked); a bf16 dst chunk without a
// scale takes bf16(decode * scale). The host checked the pairing
// (requant_check in src/kv.c).
//
// Source token rows stream through a per-warp ring in shared memory
// (cp.async, as the gathers in kv_gather.cu); each warp owns a contiguous
// share of the pool's tokens, lane j the chunks j, j + 32, ... of a token.
#include <stdio.h>
#include <string.h>

#include "kv_common.cuh"

namespace {

using namespace mla_kv;
using mla::chunk_plan;

// Where a destination chunk goes and how it is made, resolved once per block.
struct alignas(16) rq_chunk {
  int32_t dst;   // byte offset in the page of token 0's chunk
  int32_t drow;  // bytes between tokens (0: the view's token stride)
  int32_t sc;    // the chunk writes its group's f32 scale here (token 0), or -1
  int32_t srow;  // bytes between tokens' scales (0: the view's token stride)
  int16_t copy;  // bytes of codes copied unchanged (0: dequantized to bf16)
  int16_t vec;   // the destination of every token is aligned to the chunk's size
  int32_t ssz;   // bytes of the group scale written at sc
};

__device__ __forceinline__ rq_chunk make_rq_chunk(const mla_layout_desc &dd, const mla_cache_view &dv, int c) {
  const chunk_plan D = mla::plan_chunk(dd, c);
  rq_chunk q;
  q.dst = (int32_t)D.data_base, q.drow = D.data_row, q.sc = -1, q.srow = D.scale_row;
  q.ssz = D.scale_kind == MLA_SCALE_GROUP ? mla_scale_size(D.scale_dtype) : 0;
  q.copy = D.scale_kind == MLA_SCALE_GROUP ? (int16_t)mla::chunk_bytes(D.dtype) : 0;
  if (q.copy && c == D.group_lo) q.sc = (int32_t)D.scale_base;
  const int n = q.copy ? q.copy : 16;
  const int64_t rs = D.data_row ? D.data_row : dv.token_stride;
  const int64_t a = (int64_t)(uintptr_t)dv.base | dv.page_stride | rs | D.data_base;
  q.vec = (int16_t)((a & (n > 16 ? 15 : n - 1)) == 0);
  return q;
}

// n (4, 8, 16 or 32) staged bytes into the destination.
__device__ __forceinline__ void copy_chunk(int n, bool vec, unsigned char *dst, const unsigned char *src) {
  if (vec && n == 8) *reinterpret_cast<uint2 *>(dst) = *reinterpret_cast<const uint2 *>(src);
  else if (vec && n == 4) *reinterpret_cast<uint32_t *>(dst) = *reinterpret_cast<const uint32_t *>(src);
  else if (vec && n >= 16) {
    *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
    if (n == 32) *reinterpret_cast<uint4 *>(dst + 16) = *reinterpret_cast<const uint4 *>(src + 16);
  } else {
    for (int i = 0; i < n; i++) dst[i] = src[i];
  }
}

template <int S>
__global__ void __launch_bounds__(kThreads, 3) requant_kernel(const __grid_constant__ mla_layout_desc sd,
                                                              const __grid_constant__ mla_cache_view sv,
                                                              const __grid_constant__ mla_layout_desc dd,
                                                              const __grid_constant__ mla_cache_view dv,
                                                              const __grid_constant__ stage_geom g, int order) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int nchunks = dd.dim / 8;
  rq_chunk *dplan = reinterpret_cast<rq_chunk *>(smem);
  stage_chunk *splan = reinterpret_cast<stage_chunk *>(dplan + nchunks);
  for (int c = threadIdx.x; c < nchunks; c += blockDim.x) {
    dplan[c] = make_rq_chunk(dd, dv, c);
    splan[c] = make_stage_chunk(sd, g, c);
  }
  const int lane = threadIdx.x & 31;
  const int plan_bytes = (nchunks * (int)(sizeof(rq_chunk) + sizeof(stage_chunk)) + 15) / 16 * 16;
  unsigned char *ring = smem + plan_bytes + (threadIdx.x >> 5) * S * g.pitch;
  __syncthreads();
  const float ts = sv.tensor_scale ? *sv.tensor_scale : 1.0f;
  const int bs = sd.block_size;
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  const warp_items R = items_of(sv.num_pages * bs, warp, nwarps, order);
  auto issue = [&](int64_t k) {
    int64_t page, t;
    split_slot(R.at(k), bs, page, t);
    stage_token(sd, sv, g, sv.base + page * sv.page_stride, t, ring + (int)(k % S) * g.pitch, lane);
  };
#pragma unroll 1
  for (int k = 0; k < S - 1; k++) {
    if (k < R.count) issue(k);
    mla::cp_async_commit();
  }
#pragma unroll 1
  for (int64_t k = 0; k < R.count; k++) {
    if (k + S - 1 < R.count) issue(k + S - 1);
    mla::cp_async_commit();
    cp_async_wait_stages<S>();
    __syncwarp();
    int64_t page, t;
    split_slot(R.at(k), bs, page, t);
    const unsigned char *row = ring + (int)(k % S) * g.pitch;
    unsigned char *dp = dv.base + page * dv.page_stride;
    auto one = [&](const rq_chunk &q, const stage_chunk &K) {
      unsigned char *dst = dp + q.dst + t * (q.drow ? (int64_t)q.drow : dv.token_stride);
      if (q.copy) {
        copy_chunk(q.copy, q.vec, dst, row + K.src);
        if (q.sc >= 0) {
          unsigned char *sp = dp + q.sc + t * (q.srow ? (int64_t)q.srow : dv.token_stride);
          if (K.ssrc >= 0) { // the source's scale under the same group: its bits
            uint32_t bits = 0;
            for (int i = 0; i < q.ssz; i++) bits |= (uint32_t)row[K.ssrc + i] << (8 * i);
            mla::store_le(sp, bits, q.ssz);
          } else {
            mla::store4(sp, __float_as_uint(K.ssrc == -2 ? ts : 1.0f));
          }
        }
      } else {
        const uint4 o = stage_dequant(K, row, ts);
        if (q.vec) *reinterpret_cast<uint4 *>(dst) = o;
        else mla::store16(dst, o);
      }
    };
    for (int c = lane; c < nchunks; c += 32) one(dplan[c], load_stage_chunk(splan + c));
    if (lane == 0) mla::zero_pads(dd, dp, t, dv.token_stride);
    __syncwarp();
  }
  mla::cp_async_wait<0>();
}

} // namespace

namespace {

template <int S>
void requant_launch(const mla_kv_cache *src, const mla_kv_cache *dst, const stage_geom &g, size_t smem, int64_t ntok,
                    cudaStream_t s) {
  auto k = requant_kernel<S>;
  if (smem > 48 * 1024) cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  const int grid = grid_for(k, smem, (ntok + 16 * (kThreads / 32) - 1) / (16 * (kThreads / 32)));
  k<<<grid, kThreads, smem, s>>>(src->desc, src->view, dst->desc, dst->view, g, work_order());
}

} // namespace

// ---- compile-time-specialized variants for pairs of built-ins ----
//
// A warp repacks RR consecutive tokens per step (warps sweep the pool
// together): lane j of each destination field's pass k handles chunk
// j + 32 k of the field, loads the source chunk holding the same dims (the
// pair is checked at compile time: each pass reads one source field), then
// copies the codes (+ the group's scale from its first chunk's lane: the
// tensor scale as f32, or a relayout's source scale bits) or stores
// bf16(decode * tensor scale). PAD fields are zeroed. Chunked layouts address
// their pieces (chunk_addr, scale_addr). Direct loads and stores, no staging.
#include "kv_gather_spec.cuh"

namespace {

using namespace mla_kvs;

constexpr int kRqThreads = 256;

// Source field holding dims [lo, hi) (DATA), or -1.
constexpr int src_field_for(const mla_layout_desc &d, int lo, int hi) {
  for (int f = 0; f < d.nfields; f++) {
    const mla_layout_field &fd = d.fields[f];
    if (fd.role == MLA_FIELD_DATA && lo >= fd.dim_lo && hi <= fd.dim_lo + fd.count) return f;
  }
  return -1;
}

// The pass's source field: the one holding all dims of destination slot S's chunks.
template <class LS, class LD, int S> struct rq_slot {
  using Fd = fld<LD, slot<LD, S>::f>;
  static constexpr int k = slot<LD, S>::k;
  static constexpr int lo = Fd::dim_lo + 256 * k;
  static constexpr int hi = lo + 256 < Fd::dim_lo + Fd::count ? lo + 256 : Fd::dim_lo + Fd::count;
  static constexpr int fs = src_field_for(LS::host, lo, hi);
};

// requant_check (src/kv.c) as a constant expression, plus: same block size,
// each destination pass reads one source field, aligned direct access.
template <class LS, class LD, int... S> constexpr bool rq_slots_ok(std::integer_sequence<int, S...>) {
  return ((rq_slot<LS, LD, S>::fs >= 0) && ...);
}

constexpr bool rq_fields_ok(const mla_layout_desc &sd, const mla_layout_desc &dd) {
  if (sd.dim != dd.dim || sd.block_size != dd.block_size) return false;
  for (int c0 = 0; c0 < dd.dim; c0 += 8) {
    const int a = src_field_for(sd, c0, c0 + 8), b = src_field_for(dd, c0, c0 + 8);
    if (a < 0 || b < 0) return false;
    const mla_layout_field &fs = sd.fields[a], &fd = dd.fields[b];
    if (fs.scale_kind == MLA_SCALE_GROUP && fd.scale_kind == MLA_SCALE_GROUP) {
      // a relayout: codes and scale bits move unchanged (same types, groups and group phase)
      if (fd.dtype != fs.dtype || fd.group != fs.group || fd.scale_dtype != fs.scale_dtype ||
          (c0 - fs.dim_lo) % fs.group != (c0 - fd.dim_lo) % fd.group)
        return false;
      continue;
    }
    if (fs.scale_kind == MLA_SCALE_GROUP) return false; // dequantized to bf16: the generic kernel
    if (fd.scale_kind == MLA_SCALE_GROUP) {
      if (fd.dtype != fs.dtype || fd.scale_dtype != MLA_F32) return false;
      const int g0 = fd.dim_lo + (c0 - fd.dim_lo) / fd.group * fd.group;
      const int first = src_field_for(sd, g0, g0 + 8);
      if (first < 0 || sd.fields[first].scale_kind != fs.scale_kind) return false;
    } else if (fd.scale_kind != MLA_SCALE_NONE || fd.dtype != MLA_BF16) {
      return false;
    }
  }
  return true;
}

// Pads are zeroed as runs of a row: none may lie in a chunked region.
constexpr bool pads_whole(const mla_layout_desc &d) {
  for (int f = 0; f < d.nfields; f++)
    if (d.fields[f].role == MLA_FIELD_PAD && d.region_chunk[d.fields[f].region] != 0) return false;
  return true;
}

template <class LS, class LD> constexpr bool requant_ok() {
  if constexpr (!pads_whole(LD::host) || !rq_fields_ok(LS::host, LD::host)) return false;
  else return rq_slots_ok<LS, LD>(std::make_integer_sequence<int, lay<LD>::nslots>{});
}

template <class LS, class LD, int RR>
__global__ void __launch_bounds__(kRqThreads, 4)
    spec_requant_kernel(const __grid_constant__ mla_cache_view sv, const __grid_constant__ mla_cache_view dv) {
  constexpr int NS = lay<LD>::nslots;
  constexpr int BS = lay<LS>::bs;
  const int lane = threadIdx.x & 31;
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  const int64_t n = sv.num_pages * BS;
  const float ts = sv.tensor_scale ? *sv.tensor_scale : 1.0f;
  for (int64_t b = warp * RR; b < n; b += nwarps * RR) {
    const unsigned char *sp[RR];
    unsigned char *dp[RR];
    int tt[RR];
    bool ok[RR];
#pragma unroll
    for (int r = 0; r < RR; r++) {
      const int64_t i = b + r, page = i / BS;
      ok[r] = i < n, tt[r] = (int)(i - page * BS);
      sp[r] = sv.base + page * sv.page_stride, dp[r] = dv.base + page * dv.page_stride;
    }
    uint4 raw[RR][NS > 0 ? NS : 1];
    static_for<NS>([&](auto Sc) {
      constexpr int s = decltype(Sc)::value;
      using Q = rq_slot<LS, LD, s>;
      using Fd = typename Q::Fd;
      using Fs = fld<LS, Q::fs>;
      const int j = lane + 32 * Q::k;
      const int js = Fd::c0 + j - Fs::c0; // the same dims' chunk in the source field
#pragma unroll
      for (int r = 0; r < RR; r++) {
        raw[r][s] = make_uint4(0, 0, 0, 0);
        if (ok[r] && (Fd::nch % 32 == 0 || j < Fd::nch)) raw[r][s] = load_raw<Fs>(chunk_addr<Fs>(sp[r], tt[r], sv.token_stride, js));
      }
    });
    static_for<NS>([&](auto Sc) {
      constexpr int s = decltype(Sc)::value;
      using Q = rq_slot<LS, LD, s>;
      using Fd = typename Q::Fd;
      using Fs = fld<LS, Q::fs>;
      const int j = lane + 32 * Q::k;
      const int js = Fd::c0 + j - Fs::c0;
#pragma unroll
      for (int r = 0; r < RR; r++) {
        if (!ok[r] || !(Fd::nch % 32 == 0 || j < Fd::nch)) continue;
        unsigned char *d = const_cast<unsigned char *>(chunk_addr<Fd>(dp[r], tt[r], dv.token_stride, j));
        if constexpr (Fd::skind == MLA_SCALE_GROUP) { // the codes, and the group's scale from its first chunk
          const uint4 q = raw[r][s];
          if constexpr (Fd::vec && Fd::cb == 8) *reinterpret_cast<uint2 *>(d) = make_uint2(q.x, q.y);
          else if constexpr (Fd::vec && Fd::cb == 4) *reinterpret_cast<uint32_t *>(d) = q.x;
          else if constexpr (Fd::vec && Fd::cb == 16) *reinterpret_cast<uint4 *>(d) = q;
          else copy_chunk(Fd::cb, false, d, chunk_addr<Fs>(sp[r], tt[r], sv.token_stride, js));
          if (j % Fd::gch == 0) {
            unsigned char *sd = const_cast<unsigned char *>(scale_addr<Fd>(dp[r], tt[r], dv.token_stride, j));
            if constexpr (Fs::skind == MLA_SCALE_GROUP) { // a relayout: the source scale's bits
              const unsigned char *ss = scale_addr<Fs>(sp[r], tt[r], sv.token_stride, js);
              if constexpr (Fd::ss == 4 && Fd::svec && Fs::svec)
                *reinterpret_cast<uint32_t *>(sd) = __ldg(reinterpret_cast<const uint32_t *>(ss));
              else
                for (int i = 0; i < Fd::ss; i++) sd[i] = ss[i];
            } else {
              mla::store4(sd, __float_as_uint(Fs::skind == MLA_SCALE_TENSOR ? ts : 1.0f));
            }
          }
        } else { // bf16: the dequantized value
          const uint4 o = dequant<Fs>(raw[r][s], 0, ts, chunk_addr<Fs>(sp[r], tt[r], sv.token_stride, js));
          if constexpr (Fd::vec) *reinterpret_cast<uint4 *>(d) = o;
          else mla::store16(d, o);
        }
      }
    });
    static_for<LD::host.nfields>([&](auto Fc) { // padding
      using Fp = fld<LD, decltype(Fc)::value>;
      if constexpr (!Fp::data) {
#pragma unroll
        for (int r = 0; r < RR; r++) {
          if (!ok[r]) continue;
          unsigned char *d = const_cast<unsigned char *>(chunk_addr<Fp>(dp[r], tt[r], dv.token_stride, 0));
          for (int i = lane; i < Fp::count; i += 32) d[i] = 0;
        }
      }
    });
  }
}

// ---- relayouts with a chunked side: a page at a time through shared memory ----
//
// Between an interleaved and a page-blocked layout (fp8_ds_mla <->
// fp8_ds_mla_blocked) a token's bytes scatter over the page: the per-token
// kernel above moved 8-byte halves of 16-byte pieces 1 KB apart and reached
// 51-56% of memcpy (bench/RESULTS.md). Here a block stages the whole source
// page in shared memory (each region one contiguous run of 16-byte copies;
// region 0's token rows at the view's token stride), then walks the
// destination page in its own byte order, each unit (a field's chunk or a
// group scale) gathered from the staged copy: both sides' global accesses are
// whole consecutive runs. A staged chunked region keeps 16 bytes between
// pieces, so that a warp reading one token's consecutive pieces (1 KB apart
// in the page) spreads over the banks. Only moves: every destination field's
// dims lie in one source field of the same dtype and scale grouping (codes
// and scale bits copied as they are).

// Units of a destination field or its scales in memory order: unit i ->
// (token t, unit j of the token), where a chunked region orders its pieces
// (piece, token, unit within the piece) and whole rows (token, unit). A
// chunked field starts on a piece (page_field_ok).
template <int BS, int PC, int UB> struct unit_order {
  __device__ __forceinline__ static void at(int i, int n, int &t, int &j) {
    if constexpr (PC == 0) {
      t = i / n, j = i - t * n;
    } else {
      constexpr int M = PC / UB; // units a piece
      const int pp = i / (BS * M), r = i - pp * (BS * M);
      t = r / M, j = pp * M + (r - t * M);
    }
  }
};

// The staged copy: region r at st_off, a chunked region's pieces st_pstride apart.
constexpr int64_t st_pstride(const mla_layout_desc &d, int r) {
  return d.region_chunk[r] ? (int64_t)d.region_chunk[r] * d.block_size + 16 : 0;
}
constexpr int64_t st_size(const mla_layout_desc &d, int r) {
  return d.region_chunk[r] ? d.region_row_bytes[r] / d.region_chunk[r] * st_pstride(d, r)
                           : (int64_t)d.block_size * d.region_row_bytes[r];
}
constexpr int64_t st_off(const mla_layout_desc &d, int r) {
  int64_t o = 0;
  for (int k = 0; k < r; k++) o += st_size(d, k);
  return o;
}
// Chunk j of field Fs, and the scale of chunk j's group, of token t in the staged copy.
template <class Fs, class L> __device__ __forceinline__ const unsigned char *staged_chunk(const unsigned char *pg, int t, int j) {
  constexpr int r = Fs::region;
  constexpr int64_t so = st_off(L::host, r), ps = st_pstride(L::host, r), rowb = L::host.region_row_bytes[r];
  const int b = Fs::byte_off + j * Fs::cb;
  if constexpr (Fs::pc == 0) return pg + so + b + (int64_t)t * rowb;
  else return pg + so + (b / Fs::pc) * ps + b % Fs::pc + t * Fs::pc;
}
template <class Fs, class L> __device__ __forceinline__ const unsigned char *staged_scale(const unsigned char *pg, int t, int j) {
  constexpr int r = Fs::f.scale_region;
  constexpr int64_t so = st_off(L::host, r), ps = st_pstride(L::host, r), rowb = L::host.region_row_bytes[r];
  const int b = Fs::f.scale_off + (j / Fs::gch) * Fs::ss;
  if constexpr (Fs::spc == 0) return pg + so + b + (int64_t)t * rowb;
  else return pg + so + (b / Fs::spc) * ps + b % Fs::spc + t * Fs::spc;
}

constexpr bool page_regions_ok(const mla_layout_desc &d) {
  for (int r = 0; r < d.nregions; r++) {
    if (d.region_off[r] % 16 || ((int64_t)d.block_size * d.region_row_bytes[r]) % 16) return false;
    if (d.region_chunk[r] && (d.region_row_bytes[r] % d.region_chunk[r] || (d.region_chunk[r] * d.block_size) % 16)) return false;
    if (r == 0 && d.region_chunk[0] == 0 && d.region_row_bytes[0] % 16) return false;
  }
  return st_off(d, d.nregions) <= 96 * 1024;
}
constexpr int64_t mod_or0(int64_t a, int64_t b) { return b ? a % b : 0; }
template <class LS, class LD, int F> constexpr bool page_field_ok() {
  using Fd = fld<LD, F>;
  if constexpr (!Fd::data) return true;
  else {
    constexpr int fs = src_field_for(LS::host, Fd::dim_lo, Fd::dim_lo + Fd::count);
    if constexpr (fs < 0) return false;
    else {
      using Fs = fld<LS, fs>;
      if (Fs::dtype != Fd::dtype || Fs::skind != Fd::skind || !Fd::vec || !Fs::vec) return false;
      if (Fd::dtype == MLA_BF16 && (Fd::cb != 16 || Fd::skind != MLA_SCALE_NONE)) return false;
      if (Fd::skind == MLA_SCALE_GROUP &&
          (Fs::f.group != Fd::f.group || Fs::sdtype != Fd::sdtype || mod_or0(Fd::dim_lo - Fs::dim_lo, Fd::f.group)))
        return false;
      if (Fd::skind != MLA_SCALE_GROUP && Fd::skind != MLA_SCALE_NONE) return false;
      if (Fd::pc && (mod_or0(Fd::pc, Fd::cb) || mod_or0(Fd::byte_off, Fd::pc) || mod_or0(Fd::nch * Fd::cb, Fd::pc))) return false;
      if (Fd::skind == MLA_SCALE_GROUP && Fd::spc &&
          (mod_or0(Fd::spc, Fd::ss) || mod_or0(Fd::f.scale_off, Fd::spc) ||
           mod_or0(Fd::count / (Fd::f.group ? Fd::f.group : 1) * Fd::ss, Fd::spc)))
        return false;
      return true;
    }
  }
}
template <class LS, class LD, int... F> constexpr bool page_fields_ok(std::integer_sequence<int, F...>) {
  return (page_field_ok<LS, LD, F>() && ...);
}
template <class LS, class LD> constexpr bool page_requant_ok() {
  if constexpr (!requant_ok<LS, LD>()) return false;
  else
    return (mla_layout_chunked(&LS::host) || mla_layout_chunked(&LD::host)) && page_regions_ok(LS::host) &&
           page_fields_ok<LS, LD>(std::make_integer_sequence<int, LD::host.nfields>{});
}

// A destination of whole rows in one region (fp8_ds_mla) is written a row at a
// time instead of field by field, each 16-byte unit of a row made from the
// staged source by a recipe fixed at compile time: one aligned 16-byte run
// (codes; bf16 with its NaNs made canonical), or four 4-byte words (the group
// scales, from four pieces), so each row goes out as consecutive 16-byte
// stores rather than as three passes of a field each.
constexpr int kRowUnits = 64; // 16-byte units a row, at most
enum { RU_RUN = 1, RU_CANON = 2 };
struct row_unit {
  int off[4];  // staged offset of word k for token 0
  int tstride; // staged bytes between tokens
  int flags;   // RU_RUN: words k at off[0] + 4k, 16-byte aligned; RU_CANON: bf16 words
};
struct row_table {
  row_unit u[kRowUnits];
  int n;  // units a row
  bool ok;
};
// Where dst row byte b (a multiple of 4) comes from in the staged source: data of a field
// (kind 1, bf16 kind 2) or a group scale (kind 3); false if the word has no single source.
constexpr bool row_word(const mla_layout_desc &sd, const mla_layout_desc &dd, int b, int &off, int &ts, int &kind) {
  auto staged = [&](int r, int sb) {
    const int pc = sd.region_chunk[r];
    if (pc) {
      if (sb % pc + 4 > pc) return false;
      off = (int)st_off(sd, r) + sb / pc * (int)st_pstride(sd, r) + sb % pc, ts = pc;
    } else {
      off = (int)st_off(sd, r) + sb, ts = sd.region_row_bytes[r];
    }
    return true;
  };
  for (int f = 0; f < dd.nfields; f++) {
    const mla_layout_field &F = dd.fields[f];
    if (F.role != MLA_FIELD_DATA || F.region != 0) continue;
    const int esz = F.dtype == MLA_E4M3 ? 1 : F.dtype == MLA_BF16 ? 2 : 0;
    if (esz && b >= F.byte_off && b < F.byte_off + F.count * esz) {
      const int d = F.dim_lo + (b - F.byte_off) / esz, fs = src_field_for(sd, d, d + 4 / esz);
      if (fs < 0 || sd.fields[fs].dtype != F.dtype || (b - F.byte_off) % esz) return false;
      kind = esz == 2 ? 2 : 1;
      return staged(sd.fields[fs].region, sd.fields[fs].byte_off + (d - sd.fields[fs].dim_lo) * esz);
    }
    if (F.scale_kind == MLA_SCALE_GROUP && F.scale_region == 0 && scale_bytes_of(F.scale_dtype) == 4 && b >= F.scale_off &&
        b < F.scale_off + F.count / F.group * 4) {
      const int d = F.dim_lo + (b - F.scale_off) / 4 * F.group, fs = src_field_for(sd, d, d + 8);
      if (fs < 0 || (b - F.scale_off) % 4 || sd.fields[fs].scale_kind != MLA_SCALE_GROUP) return false;
      kind = 3;
      return staged(sd.fields[fs].scale_region, sd.fields[fs].scale_off + (d - sd.fields[fs].dim_lo) / sd.fields[fs].group * 4);
    }
  }
  return false; // a pad or a byte no field describes: not written here
}
constexpr row_table make_row_table(const mla_layout_desc &sd, const mla_layout_desc &dd) {
  row_table T{};
  const int R = dd.region_row_bytes[0];
  T.ok = dd.nregions == 1 && dd.region_chunk[0] == 0 && R % 16 == 0 && R / 16 <= kRowUnits;
  T.n = T.ok ? R / 16 : 0;
  for (int u = 0; u < T.n && T.ok; u++) {
    row_unit &U = T.u[u];
    int kinds[4] = {0, 0, 0, 0}, ts[4] = {0, 0, 0, 0};
    for (int k = 0; k < 4 && T.ok; k++) T.ok = row_word(sd, dd, 16 * u + 4 * k, U.off[k], ts[k], kinds[k]);
    if (!T.ok) break;
    bool run = U.off[0] % 16 == 0 && ts[0] % 16 == 0, same = true;
    for (int k = 1; k < 4; k++) {
      run = run && U.off[k] == U.off[0] + 4 * k && kinds[k] == kinds[0];
      same = same && ts[k] == ts[0];
    }
    bool bf16 = false;
    for (int k = 0; k < 4; k++) bf16 = bf16 || kinds[k] == 2;
    T.ok = same && (run || !bf16); // bf16 words only in whole runs
    U.tstride = ts[0], U.flags = (run ? RU_RUN : 0) | (bf16 ? RU_CANON : 0);
  }
  return T;
}
template <class LS, class LD> constexpr row_table kRowTable = make_row_table(LS::host, LD::host);

template <class LS, class LD, bool ROWS>
__global__ void __launch_bounds__(kThreads) page_requant_kernel(const __grid_constant__ mla_cache_view sv,
                                                                   const __grid_constant__ mla_cache_view dv,
                                                                   const __grid_constant__ row_table rt) {
  constexpr int BS = LS::host.block_size;
  constexpr int64_t STAGED = st_off(LS::host, LS::host.nregions);
  static_assert(STAGED % 16 == 0, "the staged page is 16-byte granular (cp.async), so the recipes after it are aligned");
  extern __shared__ __align__(16) unsigned char pg[];
  const uint32_t pg_addr = mla::smem_addr(pg);
  // ROWS: the recipes as arrays of fields (off k at [k n], tstride at [4 n], flags at [5 n]): lanes on
  // consecutive units read consecutive words (as an array of 32-byte structs each field load met an 8-way
  // bank conflict: bench/RESULTS.md, thirty-eighth session)
  int *soa = reinterpret_cast<int *>(pg + STAGED);
  if constexpr (ROWS) {
    for (int u = threadIdx.x; u < rt.n; u += kThreads) {
#pragma unroll
      for (int k = 0; k < 4; k++) soa[k * rt.n + u] = rt.u[u].off[k];
      soa[4 * rt.n + u] = rt.u[u].tstride, soa[5 * rt.n + u] = rt.u[u].flags;
    }
  }
  for (int64_t page = blockIdx.x; page < sv.num_pages; page += gridDim.x) {
    const unsigned char *sp = sv.base + page * sv.page_stride;
    unsigned char *dp = dv.base + page * dv.page_stride;
    // stage: region r's run of BS rows (pieces) at its offset in the page
    static_for<LS::host.nregions>([&](auto Rc) {
      constexpr int r = decltype(Rc)::value;
      constexpr int64_t off = LS::host.region_off[r];
      constexpr int rb = LS::host.region_row_bytes[r], n16 = BS * rb / 16;
      constexpr bool rows = r == 0 && LS::host.region_chunk[0] == 0; // at the view's token stride
      constexpr int64_t ps = (int64_t)LS::host.region_chunk[r] * BS;  // a chunked region's piece run
      constexpr int64_t sps = st_pstride(LS::host, r), so = st_off(LS::host, r);
      for (int u = threadIdx.x; u < n16; u += kThreads) {
        const int64_t at = rows ? (int64_t)(u / (rb / 16)) * sv.token_stride + (u % (rb / 16)) * 16 : (int64_t)u * 16;
        const int64_t to = ps ? (16 * (int64_t)u) / ps * sps + (16 * (int64_t)u) % ps : 16 * (int64_t)u;
        mla::cp_async16(pg_addr + (uint32_t)(so + to), sp + off + at, 16);
      }
    });
    mla::cp_async_commit();
    mla::cp_async_wait<0>();
    __syncthreads();
    if constexpr (ROWS) {
      constexpr int64_t RO = LD::host.region_off[0];
      const int n = rt.n;
      for (int i = threadIdx.x; i < BS * n; i += kThreads) {
        const int t = i / n, u = i - t * n;
        const int flags = soa[5 * n + u], o = t * soa[4 * n + u], o0 = soa[u] + o;
        uint4 v;
        if (flags & RU_RUN) {
          v = *reinterpret_cast<const uint4 *>(pg + o0);
          if (flags & RU_CANON) v = mla::bf16x8_canon_nan(v);
        } else {
          v = make_uint4(*reinterpret_cast<const uint32_t *>(pg + o0), *reinterpret_cast<const uint32_t *>(pg + soa[n + u] + o),
                         *reinterpret_cast<const uint32_t *>(pg + soa[2 * n + u] + o), *reinterpret_cast<const uint32_t *>(pg + soa[3 * n + u] + o));
        }
        *reinterpret_cast<uint4 *>(dp + RO + (int64_t)t * dv.token_stride + 16 * u) = v;
      }
      __syncthreads(); // the staged page is read before the next one lands
      continue;
    }
    static_for<LD::host.nfields>([&](auto Fc) {
      using Fd = fld<LD, decltype(Fc)::value>;
      if constexpr (Fd::data) {
        using Fs = fld<LS, src_field_for(LS::host, Fd::dim_lo, Fd::dim_lo + Fd::count)>;
        constexpr int dj = Fd::c0 - Fs::c0; // a destination chunk's source chunk, less j
        // 8-byte chunks move in pairs where both sides keep a pair's 16 bytes together and aligned
        constexpr bool PAIR = Fd::cb == 8 && Fd::nch % 2 == 0 && Fd::off % 16 == 0 && (Fd::row == 0 || Fd::row % 16 == 0) &&
                              (Fd::pc == 0 || Fd::pc % 16 == 0) && (Fs::byte_off + 8 * dj) % 16 == 0 &&
                              (Fs::pc == 0 || Fs::pc % 16 == 0) && LS::host.region_row_bytes[Fs::region] % 16 == 0;
        constexpr int U = PAIR ? 2 : 1, UB = U * Fd::cb, NU = Fd::nch / U;
        for (int i = threadIdx.x; i < BS * NU; i += kThreads) {
          int t, ju;
          unit_order<BS, Fd::pc, UB>::at(i, NU, t, ju);
          unsigned char *d = const_cast<unsigned char *>(chunk_addr<Fd>(dp, t, dv.token_stride, U * ju));
          const unsigned char *src = staged_chunk<Fs, LS>(pg, t, U * ju + dj);
          if constexpr (Fd::dtype == MLA_BF16) // unscaled bf16: NaNs become the canonical 0x7fff, as in every requant
            *reinterpret_cast<uint4 *>(d) = mla::bf16x8_canon_nan(*reinterpret_cast<const uint4 *>(src));
          else
            copy_chunk(UB, true, d, src);
        }
        if constexpr (Fd::skind == MLA_SCALE_GROUP) {
          constexpr int NG = Fd::count / Fd::f.group;
          for (int i = threadIdx.x; i < BS * NG; i += kThreads) {
            int t, gi;
            unit_order<BS, Fd::spc, Fd::ss>::at(i, NG, t, gi);
            const int j = gi * Fd::gch; // the group's first chunk
            copy_chunk(Fd::ss, true, const_cast<unsigned char *>(scale_addr<Fd>(dp, t, dv.token_stride, j)), staged_scale<Fs, LS>(pg, t, j + dj));
          }
        }
      } else { // padding, in whole rows (pads_whole)
        for (int i = threadIdx.x; i < BS * Fd::count; i += kThreads) {
          const int t = i / Fd::count;
          const_cast<unsigned char *>(chunk_addr<Fd>(dp, t, dv.token_stride, 0))[i - t * Fd::count] = 0;
        }
      }
    });
    __syncthreads(); // the staged page is read before the next one lands
  }
}

static_assert(page_requant_ok<spec_fp8_ds_mla, spec_fp8_ds_mla_blocked>() && page_requant_ok<spec_fp8_ds_mla_blocked, spec_fp8_ds_mla>(),
              "the V3.2 relayouts run a page at a time");
static_assert(kRowTable<spec_fp8_ds_mla_blocked, spec_fp8_ds_mla>.ok && kRowTable<spec_fp8_ds_mla_blocked, spec_fp8_ds_mla>.n == 41 &&
                  !kRowTable<spec_fp8_ds_mla, spec_fp8_ds_mla_blocked>.ok,
              "into fp8_ds_mla a row at a time; into the page-blocked layout field by field");

// Pair names ("fp8_pertensor->fp8_ds_mla"), static for mla_cuda_kv_note_variant.
const char *pair_name(const char *a, const char *b) {
  static char names[kNumBuiltins * kNumBuiltins][80];
  static int used = 0;
  char want[80];
  snprintf(want, sizeof want, "%s->%s", a, b);
  for (int i = 0; i < used; i++)
    if (strcmp(names[i], want) == 0) return names[i];
  if (used == kNumBuiltins * kNumBuiltins) return "specialized";
  memcpy(names[used], want, sizeof want);
  return names[used++];
}

// The specialized variant of the pair, or false (run the generic kernel).
bool spec_requant(const mla_kv_cache *src, const mla_kv_cache *dst, int64_t ntok, cudaStream_t s, const char **name) {
  bool ran = false;
  const char *dn = nullptr;
  const char *sn = with_builtin(src->desc, src->view, [&](auto sspec) {
    using LS = decltype(sspec);
    dn = with_builtin(dst->desc, dst->view, [&](auto dspec) {
      using LD = decltype(dspec);
      if constexpr (page_requant_ok<LS, LD>()) {
        constexpr row_table rt = kRowTable<LS, LD>;
        auto k = page_requant_kernel<LS, LD, rt.ok>;
        constexpr int smem = (int)st_off(LS::host, LS::host.nregions) + (rt.ok ? 6 * rt.n * (int)sizeof(int) : 0);
        if (smem > 48 * 1024) cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
        const int64_t pages = src->view.num_pages; // eight waves of resident blocks, a page at a time
        const int grid = (int)std::min(pages, (int64_t)grid_for(k, smem, pages) * 8);
        k<<<grid, kThreads, smem, s>>>(src->view, dst->view, rt);
        ran = true;
      } else if constexpr (requant_ok<LS, LD>()) {
        constexpr int RR = 2;
        auto k = spec_requant_kernel<LS, LD, RR>;
        // 64 waves of resident blocks: 4 waves measured 5-7% slower (H100, 256 MiB and 1 GiB,
        // bench/RESULTS.md, twenty-third session)
        k<<<spec_grid(k, kRqThreads, (ntok + RR - 1) / RR, 64), kRqThreads, 0, s>>>(src->view, dst->view);
        ran = true;
      }
    });
  });
  if (ran) *name = pair_name(sn, dn);
  return ran;
}

} // namespace

extern "C" cudaError_t mla_cuda_kv_requant(const mla_kv_cache *src, const mla_kv_cache *dst, cudaStream_t s) {
  int64_t ntok = src->view.num_pages * src->desc.block_size;
  const char *name = "generic";
  const bool spec = ntok > 0 && spec_requant(src, dst, ntok, s, &name);
  mla_cuda_kv_note_variant(name);
  if (spec) return cudaGetLastError();
  if (ntok == 0) return cudaSuccess;
  const int nchunks = dst->desc.dim / 8;
  const stage_geom g = make_stage_geom(src->desc, src->view);
  const int S = stages_for(g.pitch);
  const size_t smem = (size_t)(nchunks * (sizeof(rq_chunk) + sizeof(stage_chunk)) + 15) / 16 * 16 +
                      (size_t)(kThreads / 32) * S * g.pitch;
  if (S == 16) requant_launch<16>(src, dst, g, smem, ntok, s);
  else if (S == 8) requant_launch<8>(src, dst, g, smem, ntok, s);
  else requant_launch<4>(src, dst, g, smem, ntok, s);
  return cudaGetLastError();
}
