// Quantize-and-cache: bf16 token rows (whole, or k_nope + k_rope) into the
// slots of a slot mapping, for any layout descriptor.
//
// Each warp owns a contiguous share of the tokens and walks it in steps of
// `tps` tokens. The source rows (and slot ids) of a step stream into an
// S-stage ring in shared memory with cp.async while the warp quantizes the
// oldest staged step, so loads stay in flight during the arithmetic. In a
// step, lpt lanes own a token (lane j: chunks j, j + lpt, ... of 8 dims), U
// tokens after one another.
//
// A group scale needs the group's amax. When every group is a power-of-two
// number of chunks aligned to itself and no wider than lpt (all built-in
// layouts), the group's chunks sit in consecutive lanes of one pass and the
// amax is an xor-shuffle max (integer max of the bf16 magnitudes: a NaN's
// bits order above everything else); a NaN takes the reference's exact path
// (the group amax is its first NaN in dim order). Other layouts combine
// per-chunk amaxes through shared memory.
//
// Arithmetic is the reference's (mla/quant_math.h): the scale formula with the
// division by qmax done by mla::divide1, x / scale by mla::divide8 (both
// bit-identical to the IEEE quotient), packed fp8 and arithmetic e2m1 encoders
// (mla/token_access.cuh).
#include <algorithm>
#include <climits>

#include "kv_common.cuh"
#include "kv_write_spec.cuh"

namespace {

using namespace mla_kv;
using mla::chunk_plan;

constexpr int kWriteStages = 2;

struct write_geom {
  int lpt, tpw, U, tps; // lanes per token, lane groups per warp, tokens per lane group per step, tokens per step
  int iters;            // chunks per lane per token
  int gmax;             // widest group in chunks (shuffle span)
  int row_bytes;        // staged bytes of a token row (dim * 2, rounded to 16)
  int slot_bytes;       // staged slot ids of a step (tps * 8, rounded to 16)
  int stage_bytes;
  int gran_a, gran_b;   // copy widths of the two source parts (16, 8, 4; 1 = bytes)
  int bytes_a, bytes_b; // bytes of a token in each part
};

// Bytes before the stage ring: plans, qmax divisors, the group-lead list and
// its count, then per warp a [tps][nchunks] float array (amaxes, then divisors).
__host__ __device__ __forceinline__ int write_head_bytes(int nchunks, int tps) {
  const int h = nchunks * (int)sizeof(mla::chunk_plan) + MLA_LAYOUT_MAX_FIELDS * (int)sizeof(mla::divisor) +
                ((nchunks + 1) & ~1) * 2 + 16 + (kThreads / 32) * tps * nchunks * 4;
  return (h + 15) / 16 * 16;
}

// max |x| of 8 bf16 as bf16 magnitude bits (NaN bits > 0x7f80 > any other).
__device__ __forceinline__ uint32_t amax_bits_bf16x8(uint4 w) {
  const uint32_t M = 0x7FFF7FFFu;
  const uint32_t m3 = __vimax3_u16x2(w.x & M, w.y & M, w.z & M);
  const uint32_t m = __vimax3_u16x2(m3, w.w & M, m3);
  return max(m & 0xFFFFu, m >> 16);
}

// |first NaN| of the chunk as fp32 bits, 0 if none.
__device__ __forceinline__ uint32_t first_nan_bits(uint4 w) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
  uint32_t r = 0;
#pragma unroll
  for (int i = 7; i >= 0; i--) {
    const uint32_t h = (ws[i / 2] >> (16 * (i & 1))) & 0x7FFFu;
    if (h > 0x7F80u) r = h << 16;
  }
  return r;
}

// mla_group_scale_value (quant_math.h) with its division by qmax through qdiv.
__device__ __forceinline__ float group_scale(const mla_layout_field &f, const mla::divisor &qdiv, float amax) {
  if (mla_isnan(amax)) return amax;
  float v;
  if (f.eps_on_amax) v = mla::divide1(qdiv, mla_fmax_num(amax, f.eps));
  else v = mla_fmax_num(mla::divide1(qdiv, amax), f.eps);
  if (f.scale_policy == MLA_POLICY_POW2) v = mla_pow2_ceil(v);
  if (f.scale_min > 0.0f && v < f.scale_min) v = f.scale_min;
  if (f.scale_max > 0.0f && v > f.scale_max) v = f.scale_max;
  return v;
}

// n bytes from src into the stage at dst with copy width G (1: bytes, synchronous).
__device__ __forceinline__ void stage_bytes(unsigned char *dst, const unsigned char *src, int n, int G, int lane) {
  const uint32_t sd = mla::smem_addr(dst);
  switch (G) {
  case 16:
    for (int i = lane; i < n / 16; i += 32) mla::cp_async16(sd + 16 * i, src + 16 * i, 16);
    break;
  case 8:
    for (int i = lane; i < n / 8; i += 32) mla::cp_async8(sd + 8 * i, src + 8 * i, 8);
    break;
  case 4:
    for (int i = lane; i < n / 4; i += 32) mla::cp_async4(sd + 4 * i, src + 4 * i, 4);
    break;
  default:
    for (int i = lane; i < n; i += 32) dst[i] = src[i];
  }
}

// One step (tps tokens) is three passes over the staged rows:
//  A. every chunk's amax; group amaxes by xor-shuffles (SHFL) or per chunk into
//     shared memory;
//  B. one lane per (token, group): the group's scale (the reference's formula),
//     its stored code, and the decoded value the group divides by;
//  C. every chunk quantized and stored.
// Pass B runs the scale arithmetic once per group rather than in every lane of it.
template <bool SHFL>
__global__ void __launch_bounds__(kThreads, 4) write_kernel(const __grid_constant__ mla_layout_desc d,
                                                            const __grid_constant__ mla_cache_view v,
                                                            const mla_kv_ivec slots, const mla_kv_src_rows src,
                                                            const __grid_constant__ write_geom g, int order,
                                                            unsigned long long *bad) {
  constexpr int S = kWriteStages;
  extern __shared__ __align__(16) unsigned char smem[];
  const int nchunks = d.dim / 8;
  chunk_plan *plan = reinterpret_cast<chunk_plan *>(smem);
  mla::divisor *fdiv = reinterpret_cast<mla::divisor *>(plan + nchunks);
  int16_t *leads = reinterpret_cast<int16_t *>(fdiv + MLA_LAYOUT_MAX_FIELDS); // first chunk of every group, ascending
  int *nleads_s = reinterpret_cast<int *>(leads + ((nchunks + 1) & ~1));
  const int warp_in_block = threadIdx.x >> 5;
  float *gam = reinterpret_cast<float *>(nleads_s + 4) + warp_in_block * g.tps * nchunks; // [tps][nchunks]
  const int head = write_head_bytes(nchunks, g.tps);
  unsigned char *ring = smem + head + warp_in_block * S * g.stage_bytes;
  mla::plan_chunks(d, plan, nchunks);
  if (threadIdx.x < MLA_LAYOUT_MAX_FIELDS && threadIdx.x < d.nfields)
    fdiv[threadIdx.x] = mla::make_divisor(d.fields[threadIdx.x].qmax);
  __syncthreads();
  if (threadIdx.x == 0) {
    int n = 0;
    for (int c = 0; c < nchunks; c++)
      if (plan[c].scale_kind == MLA_SCALE_GROUP && plan[c].group_lo == c) leads[n++] = (int16_t)c;
    *nleads_s = n;
  }
  __syncthreads();
  const int nleads = *nleads_s;

  const int lane = threadIdx.x & 31, sub = lane & (g.lpt - 1), grp = lane / g.lpt;
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  const float ts = v.tensor_scale ? *v.tensor_scale : 1.0f;
  const mla::divisor tdiv = mla::make_divisor(ts);
  // the warp's steps: tps tokens each, interleaved over the warps or a contiguous share
  const int64_t ntok = slots.n;
  const warp_items W = items_of((ntok + g.tps - 1) / g.tps, warp, nwarps, order);
  const int64_t nsteps = W.count;
  const int slot_size = slots.is64 ? 8 : 4;
  auto step_end = [&](int64_t tb) { return tb + g.tps < ntok ? tb + g.tps : ntok; };

  // copies of step k's slot ids and rows into stage k % S
  auto issue = [&](int64_t k) {
    unsigned char *st = ring + (int)(k % S) * g.stage_bytes;
    const int64_t tb = W.at(k) * g.tps;
    const int n = (int)(step_end(tb) - tb);
    if (lane < n) {
      const unsigned char *sp = (const unsigned char *)slots.data + (tb + lane) * slots.stride * slot_size;
      if (slot_size == 8) mla::cp_async8(mla::smem_addr(st + 8 * lane), sp, 8);
      else mla::cp_async4(mla::smem_addr(st + 8 * lane), sp, 4);
    }
    for (int u = 0; u < n; u++) {
      unsigned char *row = st + g.slot_bytes + u * g.row_bytes;
      stage_bytes(row, (const unsigned char *)src.a.data + (tb + u) * src.a.stride * 2, g.bytes_a, g.gran_a, lane);
      if (g.bytes_b)
        stage_bytes(row + g.bytes_a, (const unsigned char *)src.b.data + (tb + u) * src.b.stride * 2, g.bytes_b,
                    g.gran_b, lane);
    }
  };
  // staged token tu: 1 = to be written at (page, t), 0 = no token or slot < 0, -1 = a slot past the cache
  auto token_of = [&](const unsigned char *st, int tu, bool live, int64_t &page, int64_t &t) {
    int64_t slot = -1;
    if (live) slot = slot_size == 8 ? *reinterpret_cast<const int64_t *>(st + 8 * tu)
                                    : (int64_t)*reinterpret_cast<const int32_t *>(st + 8 * tu);
    page = 0, t = 0;
    if (slot < 0) return 0;
    split_slot(slot, d.block_size, page, t);
    return page < v.num_pages ? 1 : -1;
  };

#pragma unroll 1
  for (int k = 0; k < S - 1; k++) {
    if (k < nsteps) issue(k);
    mla::cp_async_commit();
  }
#pragma unroll 1
  for (int64_t k = 0; k < nsteps; k++) {
    if (k + S - 1 < nsteps) issue(k + S - 1);
    mla::cp_async_commit();
    cp_async_wait_stages<S>();
    __syncwarp();
    const unsigned char *st = ring + (int)(k % S) * g.stage_bytes;
    const int64_t tb = W.at(k) * g.tps, te = step_end(tb);

    if (nleads) {
      // A: amaxes
#pragma unroll 1
      for (int u = 0; u < g.U; u++) {
        const int tu = grp * g.U + u;
        const unsigned char *row = st + g.slot_bytes + tu * g.row_bytes;
        float *tam = gam + tu * nchunks;
#pragma unroll 1
        for (int i = 0; i < g.iters; i++) {
          const int c = sub + i * g.lpt;
          const bool has = c < nchunks;
          const chunk_plan &P = plan[has ? c : nchunks - 1];
          const bool grouped = has && P.scale_kind == MLA_SCALE_GROUP;
          if (SHFL) {
            const uint4 w = has ? *reinterpret_cast<const uint4 *>(row + 16 * c) : make_uint4(0, 0, 0, 0);
            const int gn = grouped ? P.group_n : 1;
            uint32_t a = amax_bits_bf16x8(w);
            for (int off = 1; off < g.gmax; off <<= 1) {
              const uint32_t o = __shfl_xor_sync(0xffffffffu, a, off);
              if (off < gn) a = max(a, o);
            }
            float amax = __uint_as_float(a << 16);
            const bool nan = grouped && tb + tu < te && a > 0x7F80u;
            if (__any_sync(0xffffffffu, nan)) { // the reference's amax is the group's first NaN
              uint32_t fb = first_nan_bits(w);
              int key = fb ? c : 0x7FFFFFFF;
              for (int off = 1; off < g.gmax; off <<= 1) {
                const int ok = __shfl_xor_sync(0xffffffffu, key, off);
                const uint32_t ob = __shfl_xor_sync(0xffffffffu, fb, off);
                if (off < gn && ok < key) key = ok, fb = ob;
              }
              if (nan) amax = __uint_as_float(fb);
            }
            if (grouped && c == P.group_lo) tam[c] = amax;
          } else if (grouped) {
            float x[8];
            mla::unpack_bf16x8(*reinterpret_cast<const uint4 *>(row + 16 * c), x);
            tam[c] = mla::amax_chunk(x);
          }
        }
      }
      __syncwarp();
      // B: one lane per (token, group)
      for (int j = lane; j < g.tps * nleads; j += 32) {
        const int tu = j / nleads, c = leads[j - tu * nleads];
        int64_t page, t;
        if (token_of(st, tu, tb + tu < te, page, t) != 1) continue;
        const chunk_plan &P = plan[c];
        float *tam = gam + tu * nchunks;
        float a = tam[c];
        if (!SHFL) {
          a = 0.0f;
          for (int k2 = c; k2 < c + P.group_n; k2++) a = mla_amax_update(a, tam[k2]);
        }
        float dec;
        const uint32_t code = mla_encode_scale(P.scale_dtype, group_scale(d.fields[P.field], fdiv[P.field], a), &dec);
        unsigned char *pg = v.base + page * v.page_stride;
        mla::store_le((unsigned char *)mla::chunk_ptr(pg, P.scale_base, P.scale_row, t, v.token_stride), code,
                      mla_scale_size(P.scale_dtype));
        tam[c] = dec;
      }
      __syncwarp();
    }
    // C: quantize and store
#pragma unroll 1
    for (int u = 0; u < g.U; u++) {
      const int tu = grp * g.U + u;
      int64_t page, t;
      const int state = token_of(st, tu, tb + tu < te, page, t);
      if (state != 1) {
        if (state < 0 && sub == 0) count_bad(bad); // a slot past the cache: skipped, counted
        continue;
      }
      unsigned char *pg = v.base + page * v.page_stride;
      const unsigned char *row = st + g.slot_bytes + tu * g.row_bytes;
      const float *tam = gam + tu * nchunks;
#pragma unroll 1
      for (int i = 0; i < g.iters; i++) {
        const int c = sub + i * g.lpt;
        if (c >= nchunks) break;
        const chunk_plan &P = plan[c];
        const uint4 w = *reinterpret_cast<const uint4 *>(row + 16 * c);
        unsigned char *dst = (unsigned char *)mla::chunk_ptr(pg, P.data_base, P.data_row, t, v.token_stride);
        if (P.scale_kind == MLA_SCALE_NONE && P.dtype == MLA_BF16) { // bf16 -> bf16: the bits, NaNs canonical
          mla::store16(dst, make_uint4(mla::bf16x2_canon_nan(w.x), mla::bf16x2_canon_nan(w.y),
                                       mla::bf16x2_canon_nan(w.z), mla::bf16x2_canon_nan(w.w)));
          continue;
        }
        float x[8];
        mla::unpack_bf16x8(w, x);
        if (P.scale_kind == MLA_SCALE_GROUP) mla::divide8(mla::make_divisor(tam[P.group_lo]), x);
        else if (P.scale_kind == MLA_SCALE_TENSOR) mla::divide8(tdiv, x);
        mla::store_chunk(P.dtype, dst, x);
      }
      if (sub == 0) mla::zero_pads(d, pg, t, v.token_stride); // padding bytes are written as zeros
    }
    __syncwarp(); // the stage and the amax slots are refilled next
  }
  mla::cp_async_wait<0>();
}

// Group shape check: shuffles work when every group is 2^k chunks, aligned to
// itself, at most 32 wide. Returns the widest group (in chunks), or -1.
int shuffle_groups(const mla_layout_desc &d) {
  int widest = 1;
  for (int f = 0; f < d.nfields; f++) {
    const mla_layout_field &fd = d.fields[f];
    if (fd.role != MLA_FIELD_DATA || fd.scale_kind != MLA_SCALE_GROUP) continue;
    const int gn = fd.group / 8;
    if (gn < 1 || gn > 32 || (gn & (gn - 1)) || fd.group % 8 || fd.dim_lo % 8 || (fd.dim_lo / 8) % gn) return -1;
    if (gn > widest) widest = gn;
  }
  return widest;
}

int gran_of(const void *p, int64_t stride_bytes, int64_t bytes, int64_t dst_off) {
  for (int g = 16; g >= 4; g /= 2)
    if ((uintptr_t)p % g == 0 && stride_bytes % g == 0 && bytes % g == 0 && dst_off % g == 0) return g;
  return 1;
}

// ---- specialized variants (kv_write_spec.cuh) ----

// MLALAB_KV_WRITE_MB=3|4: register budget of the specialized variants, for 3
// or 4 blocks of 256 threads per SM (tuning).
int spec_mb() {
  static int v = -1;
  if (v < 0) {
    const char *e = getenv("MLALAB_KV_WRITE_MB");
    v = e && e[0] == '4' ? 4 : 3;
  }
  return v;
}

// MLALAB_KV_WRITE_STAGE=0|1: region-0 rows written straight from the lanes
// (0) or assembled in shared memory and copied out in whole sectors (1);
// unset: the layout's default (kvw_default_stage). MLALAB_KV_WRITE_UT=1|2:
// token sets per warp and tile for the layouts with at most 4 slots per lane
// (the 128-dim indexer keys); unset: the layout's default.
int env_choice(const char *name) {
  const char *e = getenv(name);
  return e && e[0] >= '0' && e[0] <= '9' ? e[0] - '0' : -1;
}
// an environment choice read once per process (-2: not read yet)
int env_choice_once(int &v, const char *name) {
  if (v == -2) v = env_choice(name);
  return v;
}
int spec_stage() {
  static int v = -2;
  return env_choice_once(v, "MLALAB_KV_WRITE_STAGE");
}
int spec_ut() {
  static int v = -2;
  return env_choice_once(v, "MLALAB_KV_WRITE_UT");
}
// Grid of the specialized writes: a block for every TPW x UT x 8 tokens, one
// tile a warp, and the hardware hands blocks to SMs as others retire. Against
// one persistent wave of resident blocks looping over the tiles this measured
// 2-5 points of memcpy faster for every built-in (H100, bench/RESULTS.md,
// twenty-third session). MLALAB_KV_WRITE_GRID=k (tuning): k x the resident
// blocks (1: the persistent wave); 9 or unset: a block for every tile set.
int write_grid_waves() {
  static int v = -2;
  const int k = env_choice_once(v, "MLALAB_KV_WRITE_GRID");
  return k >= 1 && k <= 8 ? k : 0;
}
// Defaults. Rows whose size is not a multiple of the 32-byte sector (656 B
// for fp8_ds_mla) are staged: direct 16-byte stores of odd tokens straddle
// sectors, and ncu counted 24% more L2 write sectors than bytes written
// (3.76 M vs the ideal 3.04 M; 103.2 -> 95.1 us staged, H100, 2026-11-23).
// So are region-0 rows of 512 B and more that hold e4m3 codes only, which the
// lanes write 8 bytes at a time: staged, fp8_pertensor +1.5 and fp8_v41 +1.7 to
// +2.5 points of memcpy at 256 MiB and 1 GiB (H100, 2026-11-24, two A/B runs).
// Other rows of whole sectors gain nothing or lose (fp8_v4, whose rows mix
// bf16: -2.5; indexer_fp8's 128-byte keys: -0.1 to -0.8; fp4_v41: -0.5).
// Every data field of L (in region `region`, or anywhere for -1) holds `dtype`.
template <class L> constexpr bool data_all(int dtype, int region) {
  for (int f = 0; f < L::host.nfields; f++) {
    const mla_layout_field &F = L::host.fields[f];
    if (F.role == MLA_FIELD_DATA && (region < 0 || F.region == region) && F.dtype != dtype) return false;
  }
  return true;
}
template <class L> constexpr bool wide_e4m3_rows() {
  return L::host.region_row_bytes[0] >= 512 && data_all<L>(MLA_E4M3, 0);
}
template <class L> constexpr int kvw_default_stage() {
  return kvw::stage_ok<L>() && (L::host.region_row_bytes[0] % 32 != 0 || wide_e4m3_rows<L>()) ? 1 : 0;
}
template <class L> constexpr int kvw_default_ut() { return 1; }
// Prefetch (MLALAB_KV_WRITE_PF=0/1; unset: the default below).
int spec_pf() {
  static int v = -2;
  return env_choice_once(v, "MLALAB_KV_WRITE_PF");
}
// On for layouts of bf16 fields only (a copy with NaN canonicalization: the
// prefetch keeps loads in flight while a warp stores): write bf16 +1.1 points
// of memcpy at 256 MiB and 1 GiB (H100, 2026-11-23, two runs). The quantizing
// layouts lose with it (fp8_v4 -8, indexer_fp8 -2.5, fp4_v41 -0.4 to -2 points).
template <class L> constexpr int kvw_default_pf() { return data_all<L>(MLA_BF16, -1) ? 1 : 0; }

template <class L, int MB, int ST, int UT, int PF = 0> cudaError_t launch_spec(const kvw::wargs &a, cudaStream_t s) {
  auto k = kvw::write_spec_kernel<L, MB, ST, UT, PF>;
  constexpr int64_t per_block = (int64_t)(kvw::kSpecThreads / 32) * (32 / kvw::lpt<L>()) * UT;
  constexpr size_t smem = PF ? kvw::prefetch_bytes<L>(UT) : 0;
  if constexpr (smem > 48 * 1024) {
    static cudaError_t opted = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (opted != cudaSuccess) return opted;
  }
  const int64_t work = (a.n + per_block - 1) / per_block;
  const int waves = write_grid_waves(); // 0: a block for every tile set (no occupancy query)
  int64_t g = waves ? std::min(work, (int64_t)grid_for(k, smem, work) * waves) : work;
  if (g > INT_MAX) g = INT_MAX; // the warps loop over what a grid of 2^31 - 1 blocks leaves
  k<<<(int)g, kvw::kSpecThreads, smem, s>>>(a);
  return cudaGetLastError();
}

template <class L> cudaError_t launch_spec_pick(const kvw::wargs &a, cudaStream_t s) {
  if (spec_mb() == 4) return launch_spec<L, 4, 0, 1>(a, s);
  int st = spec_stage(), ut = spec_ut(), pf = spec_pf();
  if (pf < 0) pf = kvw_default_pf<L>();
  // for layouts written unstaged; two tiles of rows per warp must leave room for 3 blocks per SM
  if constexpr (kvw_default_stage<L>() == 0 && kvw::prefetch_bytes<L>(1) <= 72 * 1024) {
    if (pf == 1) return launch_spec<L, 3, 0, 1, 1>(a, s);
  }
  if (st < 0) st = kvw_default_stage<L>();
  if (ut < 0) ut = kvw_default_ut<L>();
  if constexpr (kvw::stage_ok<L>() && kvw::nslots<L>() <= 4) {
    if (ut == 2) return st == 1 ? launch_spec<L, 3, 1, 2>(a, s) : launch_spec<L, 3, 0, 2>(a, s);
  }
  if constexpr (kvw::stage_ok<L>()) {
    if (st == 1) return launch_spec<L, 3, 1, 1>(a, s);
  }
  return launch_spec<L, 3, 0, 1>(a, s);
}

// Runs L's variant when the descriptor is L's and every address allows the
// variant's 16-byte accesses; false: not taken (the generic kernel runs).
template <class L>
bool try_spec(const mla_kv_cache *c, const mla_kv_ivec *slots, const mla_kv_src_rows *src, unsigned long long *bad,
              cudaStream_t s, cudaError_t *err) {
  if constexpr (!kvw::supported<L>()) {
    return false;
  } else {
    const mla_layout_desc &d = c->desc;
    if (!mla_layout_desc_same(&d, &L::host, 0)) return false;
    const mla_cache_view &v = c->view;
    const int64_t split = src->split < d.dim ? src->split : d.dim;
    const bool has_b = split < d.dim;
    if (((uintptr_t)v.base | (uint64_t)v.page_stride | (uint64_t)v.token_stride) % 16) return false;
    if (((uintptr_t)src->a.data | (uint64_t)(2 * src->a.stride)) % 16 || split % 8) return false;
    if (has_b && ((uintptr_t)src->b.data | (uint64_t)(2 * src->b.stride)) % 16) return false;
    kvw::wargs a;
    a.base = v.base, a.page_stride = v.page_stride, a.token_stride = v.token_stride, a.num_pages = v.num_pages;
    a.tscale = v.tensor_scale;
    a.slots = slots->data, a.n = slots->n, a.slot_stride = slots->stride, a.is64 = slots->is64;
    a.a = (const unsigned char *)src->a.data, a.a_stride = 2 * src->a.stride;
    a.b = has_b ? (const unsigned char *)src->b.data - 2 * split : a.a;
    a.b_stride = has_b ? 2 * src->b.stride : a.a_stride;
    a.splitc = (int)(split / 8);
    a.bad = bad;
    *err = launch_spec_pick<L>(a, s);
    mla_cuda_kv_note_variant(L::name);
    return true;
  }
}

} // namespace

extern "C" cudaError_t mla_cuda_kv_write(const mla_kv_cache *c, const mla_kv_ivec *slots, const mla_kv_src_rows *src,
                                         unsigned long long *bad, cudaStream_t s) {
  if (slots->n == 0) return cudaSuccess;
  if (mla_cuda_kv_specialize()) {
    cudaError_t err = cudaSuccess;
#define KVW_TRY(n, init) \
    if (try_spec<kvw::spec_##n>(c, slots, src, bad, s, &err)) return err;
    MLA_BUILTIN_LAYOUTS_ALL(KVW_TRY)
#undef KVW_TRY
  }
  mla_cuda_kv_note_variant("generic");
  const mla_layout_desc &d = c->desc;
  const int nchunks = d.dim / 8;
  write_geom g = {};
  g.lpt = lanes_per_token(nchunks);
  const int widest = shuffle_groups(d);
  bool shfl = widest > 0;
  if (shfl && widest > g.lpt) {
    if (getenv("MLALAB_KV_LPT")) shfl = false; // an explicit lane count wins; groups go through shared memory
    else g.lpt = widest;
  }
  g.tpw = 32 / g.lpt;
  g.iters = (nchunks + g.lpt - 1) / g.lpt;
  g.U = g.iters == 1 ? 4 : g.iters == 2 ? 2 : 1;
  g.tps = g.tpw * g.U;
  g.gmax = shfl ? widest : 1;
  g.row_bytes = (d.dim * 2 + 15) / 16 * 16;
  g.slot_bytes = (g.tps * 8 + 15) / 16 * 16;
  g.stage_bytes = g.slot_bytes + g.tps * g.row_bytes;
  const int64_t split = src->split < d.dim ? src->split : d.dim;
  g.bytes_a = (int)(2 * split);
  g.bytes_b = (int)(2 * (d.dim - split));
  g.gran_a = gran_of(src->a.data, 2 * src->a.stride, g.bytes_a, 0);
  g.gran_b = g.bytes_b ? gran_of(src->b.data, 2 * src->b.stride, g.bytes_b, g.bytes_a) : 16;

  const size_t smem = (size_t)write_head_bytes(nchunks, g.tps) + (size_t)(kThreads / 32) * kWriteStages * g.stage_bytes;
  const int64_t per_block = (int64_t)(kThreads / 32) * g.tps * 4; // >= 4 steps per warp
  const int64_t work = (slots->n + per_block - 1) / per_block;
  auto k = shfl ? write_kernel<true> : write_kernel<false>;
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
  }
  cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  k<<<grid_for(k, smem, work), kThreads, smem, s>>>(d, c->view, *slots, *src, g, work_order(), bad);
  return cudaGetLastError();
}
