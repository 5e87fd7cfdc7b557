// Helpers shared by the baked KV-cache kernels: index loads, request
// lookup, slot decomposition, launch geometry, work order, and the staging
// of token rows in shared memory with the per-chunk plans that dequantize them.
#ifndef MLA_KV_COMMON_CUH
#define MLA_KV_COMMON_CUH

#include <stdlib.h>

#include <cuda_runtime.h>

#include "kv_kernels.h"
#include "mla/mma.cuh"
#include "mla/token_access.cuh"

namespace mla_kv {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t ld_idx(const void *p, int64_t i, int is64) {
  return is64 ? __ldg((const long long *)p + i) : (int64_t)__ldg((const int *)p + i);
}
__device__ __forceinline__ int64_t ivec_at(const mla_kv_ivec &v, int64_t i) { return ld_idx(v.data, i * v.stride, v.is64); }
__device__ __forceinline__ int64_t imat_at(const mla_kv_imat &m, int64_t r, int64_t c) {
  return ld_idx(m.data, r * m.rs + c * m.cs, m.is64);
}
__device__ __forceinline__ void st_idx(void *p, int64_t i, int is64, int64_t v) {
  if (is64) ((long long *)p)[i] = v;
  else ((int *)p)[i] = (int)v;
}
__device__ __forceinline__ void omat_set(const mla_kv_omat &m, int64_t r, int64_t c, int64_t v) {
  st_idx(m.data, r * m.rs + c * m.cs, m.is64, v);
}

// Largest r with cu[r] <= x, for x in [cu[0], cu[n-1]); cu nondecreasing.
__device__ __forceinline__ int64_t find_segment(const mla_kv_ivec &cu, int64_t x) {
  int64_t lo = 0, hi = cu.n - 1; // answer in [lo, hi)
  while (hi - lo > 1) {
    int64_t mid = (lo + hi) >> 1;
    if (ivec_at(cu, mid) <= x) lo = mid;
    else hi = mid;
  }
  return lo;
}

// slot -> (page, offset) for slot >= 0: a 32-bit division when the slot fits,
// else a quotient estimated in double and corrected (no call to the 64-bit
// division routine, whose register saves would spill in the callers' loops).
__device__ __forceinline__ void split_slot(int64_t slot, int bs, int64_t &page, int64_t &t) {
  if ((uint64_t)slot < 0x80000000ull) {
    uint32_t s = (uint32_t)slot, p = s / (uint32_t)bs;
    page = p, t = s - p * (uint32_t)bs;
  } else {
    int64_t q = (int64_t)__ddiv_rz((double)slot, (double)bs), r = slot - q * bs;
    while (r < 0) q--, r += bs;
    while (r >= bs) q++, r -= bs;
    page = q, t = r;
  }
}

__device__ __forceinline__ void count_bad(unsigned long long *bad) { atomicAdd(bad, 1ull); }

inline int pow2_at_least(int n) {
  int l = 1;
  while (l < n) l <<= 1;
  return l;
}

// Lanes per token of the quantize-and-cache kernel (kv_write.cu): at most 5
// chunks per lane, 16 lanes for 512- and 576-dim rows (two tokens per warp
// pass); the launcher widens it to the widest scale group so a group's amax is
// a shuffle. MLALAB_KV_LPT=8|16|32 overrides the choice (for tuning; ignored
// when the row would need more than 16 chunks per lane).
inline int lanes_per_token(int nchunks) {
  static int env = -1;
  if (env < 0) {
    const char *s = getenv("MLALAB_KV_LPT");
    int v = s ? atoi(s) : 0;
    env = (v == 1 || v == 2 || v == 4 || v == 8 || v == 16 || v == 32) ? v : 0;
  }
  int lpt = pow2_at_least((nchunks + 4) / 5);
  int small = pow2_at_least(nchunks) < 8 ? pow2_at_least(nchunks) : 8;
  if (lpt < small) lpt = small;
  if (env && (nchunks + env - 1) / env <= 16) lpt = env;
  return lpt < 32 ? lpt : 32;
}

// A persistent grid: as many blocks as fit on the device at once, capped by the work.
template <typename K> int grid_for(K kernel, size_t smem, int64_t work_blocks) {
  int dev = 0, sms = 0, per_sm = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem);
  int64_t g = (int64_t)(sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
  if (work_blocks < g) g = work_blocks;
  return g < 1 ? 1 : (int)g;
}

// Contiguous share [lo, hi) of n work items for worker w of nw (sizes differ
// by at most one, so no worker runs a long tail).
__device__ __forceinline__ void share_of(int64_t n, int64_t w, int64_t nw, int64_t &lo, int64_t &hi) {
  const int64_t q = n / nw, r = n - q * nw;
  lo = w * q + (w < r ? w : r);
  hi = lo + q + (w < r ? 1 : 0);
}

// The items a warp owns among n: a contiguous share (order 0) or every nw-th
// item from w (order 1: all warps sweep the array together, which keeps the
// DRAM pages being touched at any moment close to one another).
struct warp_items {
  int64_t base, step, count;
  __device__ int64_t at(int64_t k) const { return base + k * step; }
};

__device__ __forceinline__ warp_items items_of(int64_t n, int64_t w, int64_t nw, int order) {
  warp_items r;
  if (order) {
    r.base = w, r.step = nw, r.count = n > w ? (n - w + nw - 1) / nw : 0;
  } else {
    int64_t lo, hi;
    share_of(n, w, nw, lo, hi);
    r.base = lo, r.step = 1, r.count = hi - lo;
  }
  return r;
}

// MLALAB_KV_ORDER=0|1 picks the work order (for tuning); interleaved by default.
inline int work_order() {
  static int v = -1;
  if (v < 0) {
    const char *e = getenv("MLALAB_KV_ORDER");
    v = e && e[0] == '0' ? 0 : 1;
  }
  return v;
}

__device__ __forceinline__ const unsigned char *shfl_ptr(const unsigned char *p, int src) {
  return reinterpret_cast<const unsigned char *>(
      __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(p), src));
}

// ---- staging token rows in shared memory (cp.async) ----
//
// A token's row of every region is copied to a "stage": region r at stage
// offset soff[r] (16-byte aligned), in row order (a chunked region's pieces
// put back together). The copy width of a region is the largest of 16, 8, 4
// that the view's base, page stride, row stride, region offset and row length
// (a chunked region: its piece) allow (1: plain byte copies, e.g. an
// odd-strided view).
struct stage_geom {
  int nregions;
  int pitch; // bytes of one staged token (multiple of 16)
  int bytes[MLA_LAYOUT_MAX_REGIONS];
  int soff[MLA_LAYOUT_MAX_REGIONS];
  int gran[MLA_LAYOUT_MAX_REGIONS];
  int upp[MLA_LAYOUT_MAX_REGIONS];    // chunked regions: gran-byte units a piece (0: rows whole) and
  int ushift[MLA_LAYOUT_MAX_REGIONS]; // its log2 (mla_piece_unit_off)
};

inline int copy_granularity(uintptr_t a, int64_t page_stride, int64_t row_stride, int64_t bytes) {
  for (int g = 16; g >= 4; g /= 2)
    if (a % g == 0 && page_stride % g == 0 && row_stride % g == 0 && bytes % g == 0) return g;
  return 1;
}

inline stage_geom make_stage_geom(const mla_layout_desc &d, const mla_cache_view &v) {
  stage_geom g = {};
  g.nregions = d.nregions;
  int off = 0;
  for (int r = 0; r < d.nregions && r < MLA_LAYOUT_MAX_REGIONS; r++) {
    g.bytes[r] = d.region_row_bytes[r];
    g.soff[r] = off;
    const int64_t step = mla_region_step(&d, r);
    g.gran[r] = copy_granularity((uintptr_t)v.base + (uintptr_t)d.region_off[r], v.page_stride, step ? step : v.token_stride,
                                 d.region_chunk[r] > 0 ? d.region_chunk[r] : d.region_row_bytes[r]);
    g.upp[r] = d.region_chunk[r] > 0 ? d.region_chunk[r] / g.gran[r] : 0;
    g.ushift[r] = mla_log2_exact(g.upp[r]);
    off += (d.region_row_bytes[r] + 15) / 16 * 16;
  }
  g.pitch = off > 0 ? off : 16;
  return g;
}

// Starts the copies of token t of the page at `page` into `stage` (the whole
// warp calls it; lanes take 16/8/4-byte pieces). Byte-granular regions are
// copied synchronously.
__device__ __forceinline__ void stage_token(const mla_layout_desc &d, const mla_cache_view &v, const stage_geom &g,
                                            const unsigned char *page, int64_t t, unsigned char *stage, int lane) {
  for (int r = 0; r < g.nregions; r++) {
    unsigned char *dst = stage + g.soff[r];
    const uint32_t sd = mla::smem_addr(dst);
    const int n = g.bytes[r];
    if (d.region_chunk[r] > 0) { // a chunked region: each gran-byte unit from its piece
      const int gr = g.gran[r], c = d.region_chunk[r];
      const unsigned char *row = page + d.region_off[r] + t * c;
      for (int i = lane; i < n / gr; i += 32) {
        const unsigned char *src = row + mla_piece_unit_off(i, gr, g.upp[r], g.ushift[r], (int64_t)c * d.block_size);
        if (gr == 16) mla::cp_async16(sd + 16 * i, src, 16);
        else if (gr == 8) mla::cp_async8(sd + 8 * i, src, 8);
        else if (gr == 4) mla::cp_async4(sd + 4 * i, src, 4);
        else dst[i] = *src;
      }
      continue;
    }
    const int64_t rs = r == 0 ? v.token_stride : (int64_t)g.bytes[r];
    const unsigned char *row = page + d.region_off[r] + t * rs;
    switch (g.gran[r]) {
    case 16:
      for (int i = lane; i < n / 16; i += 32) mla::cp_async16(sd + 16 * i, row + 16 * i, 16);
      break;
    case 8:
      for (int i = lane; i < n / 8; i += 32) mla::cp_async8(sd + 8 * i, row + 8 * i, 8);
      break;
    case 4:
      for (int i = lane; i < n / 4; i += 32) mla::cp_async4(sd + 4 * i, row + 4 * i, 4);
      break;
    default:
      for (int i = lane; i < n; i += 32) dst[i] = row[i];
    }
  }
}

// Where a chunk's bytes sit in a stage and how to rebuild it as bf16.
enum stage_kind : uint8_t { SK_ZERO = 0, SK_COPY, SK_E4M3, SK_E2M1, SK_GENERIC };
// How the multiplier of a fast-kind chunk is read: none, the tensor scale, an f32, a decoded byte / bf16.
enum stage_smode : uint8_t { SM_NONE = 0, SM_TENSOR, SM_F32, SM_CODE };

struct alignas(8) stage_chunk {
  int16_t src;  // byte offset of the chunk's data in the stage
  int16_t ssrc; // byte offset of its group scale; -1 none, -2 the per-tensor scale
  uint8_t kind, dtype, sdtype, smode;
};

// One 8-byte shared-memory load instead of one per field.
__device__ __forceinline__ stage_chunk load_stage_chunk(const stage_chunk *p) {
  const uint2 w = *reinterpret_cast<const uint2 *>(p);
  stage_chunk k;
  memcpy(&k, &w, sizeof k);
  return k;
}

__device__ __forceinline__ stage_chunk make_stage_chunk(const mla_layout_desc &d, const stage_geom &g, int c) {
  const mla::chunk_plan P = mla::plan_chunk(d, c);
  stage_chunk k;
  k.src = 0, k.ssrc = -1, k.kind = SK_ZERO, k.dtype = P.dtype, k.sdtype = P.scale_dtype, k.smode = SM_NONE;
  if (P.field < 0) return k;
  const mla_layout_field &fd = d.fields[P.field];
  // stages hold rows in row order: the chunk's byte in its row, not its place in a chunked page
  const int e = 8 * c - fd.dim_lo;
  k.src = (int16_t)(g.soff[fd.region] + fd.byte_off + mla::elem_bytes8(fd.dtype, e));
  if (P.scale_kind == MLA_SCALE_TENSOR) k.ssrc = -2;
  else if (P.scale_kind == MLA_SCALE_GROUP)
    k.ssrc = (int16_t)(g.soff[fd.scale_region] + fd.scale_off + (e / fd.group) * mla_scale_size(fd.scale_dtype));
  const bool scale_ok = k.ssrc < 0 || k.sdtype == MLA_UE8M0 || k.sdtype == MLA_E4M3 ||
                        (k.sdtype == MLA_F32 && k.ssrc % 4 == 0) || (k.sdtype == MLA_BF16 && k.ssrc % 2 == 0);
  if (P.dtype == MLA_BF16 && P.scale_kind == MLA_SCALE_NONE && k.src % 16 == 0) k.kind = SK_COPY;
  else if (P.dtype == MLA_E4M3 && k.src % 8 == 0 && scale_ok) k.kind = SK_E4M3;
  else if (P.dtype == MLA_E2M1 && k.src % 4 == 0 && scale_ok) k.kind = SK_E2M1;
  else k.kind = SK_GENERIC;
  k.smode = k.ssrc == -1 ? SM_NONE : k.ssrc == -2 ? SM_TENSOR : k.sdtype == MLA_F32 ? SM_F32 : SM_CODE;
  return k;
}

// Any chunk the fast kinds do not cover: bytes read one by one.
static __device__ __noinline__ uint4 stage_dequant_generic(const stage_chunk k, const unsigned char *row, float ts) {
  unsigned char b[32];
  const int n = mla::chunk_bytes(k.dtype);
  for (int i = 0; i < 32; i++) b[i] = i < n ? row[k.src + i] : 0;
  uint4 raw = make_uint4(b[0] | b[1] << 8 | b[2] << 16 | (uint32_t)b[3] << 24, b[4] | b[5] << 8 | b[6] << 16 | (uint32_t)b[7] << 24,
                         b[8] | b[9] << 8 | b[10] << 16 | (uint32_t)b[11] << 24,
                         b[12] | b[13] << 8 | b[14] << 16 | (uint32_t)b[15] << 24);
  float x[8];
  if (k.dtype == MLA_F32) {
#pragma unroll
    for (int i = 0; i < 8; i++)
      x[i] = __uint_as_float(b[4 * i] | b[4 * i + 1] << 8 | b[4 * i + 2] << 16 | (uint32_t)b[4 * i + 3] << 24);
  } else {
    mla::decode_chunk(k.dtype, raw, row, x); // p is only read for f32 chunks
  }
  if (k.ssrc != -1) {
    float s = ts;
    if (k.ssrc >= 0) {
      uint32_t bits = 0;
      for (int i = 0; i < mla_scale_size(k.sdtype); i++) bits |= (uint32_t)row[k.ssrc + i] << (8 * i);
      s = mla_decode_scale(k.sdtype, bits);
    }
#pragma unroll
    for (int i = 0; i < 8; i++) x[i] = __fmul_rn(x[i], s);
  }
  return mla::pack_bf16x8(x);
}

// 8 dims of the staged token `row` as 8 bf16: decode(q) * scale in fp32,
// rounded once (the reference's product).
__device__ __forceinline__ uint4 stage_dequant(const stage_chunk &k, const unsigned char *row, float ts) {
  if (k.kind == SK_COPY) { // bf16 -> fp32 -> bf16 as the reference: NaNs become the canonical 0x7fff
    return mla::bf16x8_canon_nan(*reinterpret_cast<const uint4 *>(row + k.src));
  }
  if (k.kind == SK_ZERO) return make_uint4(0, 0, 0, 0);
  if (k.kind == SK_GENERIC) return stage_dequant_generic(k, row, ts);
  float x[8];
  if (k.kind == SK_E4M3) mla::e4m3x8_decode(*reinterpret_cast<const uint2 *>(row + k.src), x);
  else mla::e2m1x8_decode(*reinterpret_cast<const uint32_t *>(row + k.src), x);
  if (k.smode != SM_NONE) {
    float s;
    if (k.smode == SM_F32) s = *reinterpret_cast<const float *>(row + k.ssrc);
    else if (k.smode == SM_TENSOR) s = ts;
    else {
      const unsigned char *sp = row + k.ssrc;
      s = k.sdtype == MLA_BF16 ? __uint_as_float((uint32_t)*reinterpret_cast<const uint16_t *>(sp) << 16)
                               : mla_decode_scale(k.sdtype, *sp);
    }
#pragma unroll
    for (int i = 0; i < 8; i++) x[i] = __fmul_rn(x[i], s);
  }
  return mla::pack_bf16x8(x);
}

template <int S> __device__ __forceinline__ void cp_async_wait_stages() { mla::cp_async_wait<S - 1>(); }

// Stages per warp (16, 8 or 4): these kernels are bound by the token rows in
// flight, so each warp keeps about 4.5 KB of them coming (S - 1 rows), and a
// block's ring stays small enough for four blocks per SM.
inline int stages_for(int pitch) { return pitch <= 320 ? 16 : pitch <= 704 ? 8 : 4; }

} // namespace mla_kv

#endif
