// Launcher of the baked decode kernels: picks the rows per CTA, the staging
// (plain bf16 rows or raw bytes + dequant), the pipeline depth from shared
// memory, the split count from the SM count and the batch; runs the split
// kernel, the causal tail where chunks straddle queries, and, with several
// splits, the combine.
#include "attn_decode.h"

#include <string.h>

#include "attn_decode_kernel.cuh"
#include "attn_decode_wg.cuh"
#include "attn_decode_rs16.cuh"
#include "attn_slice_spec.cuh"
#include "device.h"
#include "mla/layout_match.h"
#include "mla_error.h"

namespace {

using namespace mla_attn;

int64_t round16(int64_t x) { return (x + 15) / 16 * 16; }

// Byte offset of dim 0 when dims [0, dqk) are plain bf16 (no scale) laid out
// contiguously in region 0 (one field or several, e.g. NoPE then RoPE), with
// 16-byte aligned rows everywhere: then tiles are plain copies. Else -1.
int identity_offset(const mla_layout_desc &d, const mla_cache_view &v, int dqk) {
  if (d.region_chunk[0] > 0) return -1; // rows in pieces: staged
  int64_t off0 = -1;
  for (int c = 0; c < dqk; c += 8) {
    int f = -1;
    for (int k = 0; k < d.nfields && f < 0; k++) {
      const mla_layout_field &fd = d.fields[k];
      if (fd.role == MLA_FIELD_DATA && c >= fd.dim_lo && c < fd.dim_lo + fd.count) f = k;
    }
    if (f < 0) return -1;
    const mla_layout_field &fd = d.fields[f];
    if (fd.dtype != MLA_BF16 || fd.scale_kind != MLA_SCALE_NONE || fd.region != 0) return -1;
    const int64_t at = fd.byte_off + 2 * (int64_t)(c - fd.dim_lo); // byte of dim c in the row
    if (c == 0) off0 = at;
    else if (at != off0 + 2 * c) return -1;
  }
  const uintptr_t a = (uintptr_t)v.base + (uintptr_t)d.region_off[0] + (uintptr_t)off0;
  if (off0 % 16 || a % 16 || v.page_stride % 16 || v.token_stride % 16) return -1;
  return (int)off0;
}

// Largest cp.async size (16, 8, 4) every token row (a chunked region: every
// piece) of a region allows; 1 = byte copies.
int region_granularity(const mla_layout_desc &d, const mla_cache_view &v, int r) {
  const uintptr_t a = (uintptr_t)v.base + (uintptr_t)d.region_off[r];
  const int64_t step = mla_region_step(&d, r), rs = step ? step : v.token_stride;
  const int64_t run = d.region_chunk[r] > 0 ? d.region_chunk[r] : d.region_row_bytes[r];
  for (int g = 16; g >= 4; g /= 2)
    if (a % g == 0 && v.page_stride % g == 0 && rs % g == 0 && run % g == 0) return g;
  return 1;
}

template <int MR, int DQK> const void *kernel_fn() { return (const void *)attn_decode_kernel<MR, DQK>; }

const void *kernel_for(int mr, int dqk) {
  if (dqk == 576) return mr == 16 ? kernel_fn<16, 576>() : mr == 32 ? kernel_fn<32, 576>() : kernel_fn<64, 576>();
  return mr == 16 ? kernel_fn<16, 512>() : mr == 32 ? kernel_fn<32, 512>() : kernel_fn<64, 512>();
}

int smem_total(int mr, int dqk, int identity, int pitch, int nst) {
  if (dqk == 576)
    return mr == 16 ? make_smem_plan<16, 576>(identity, pitch, nst).total
         : mr == 32 ? make_smem_plan<32, 576>(identity, pitch, nst).total : make_smem_plan<64, 576>(identity, pitch, nst).total;
  return mr == 16 ? make_smem_plan<16, 512>(identity, pitch, nst).total
       : mr == 32 ? make_smem_plan<32, 512>(identity, pitch, nst).total : make_smem_plan<64, 512>(identity, pitch, nst).total;
}

int threads_for(int mr) { return mr == 64 ? shape<64>::NT : mr == 32 ? shape<32>::NT : shape<16>::NT; }

// Deepest pipeline (2 to 4 tiles) that fits `budget` bytes; 0 if none does.
int stages_within(int mr, int dqk, int identity, int pitch, int64_t budget) {
  for (int n = 4; n >= 2; n--)
    if (smem_total(mr, dqk, identity, pitch, n) <= budget) return n;
  return 0;
}

// The built-in layouts with compile-time-specialized kernels, matched by
// descriptor equality (for reading): the 16-row kernels (on Hopper
// attn_decode_rs16.cuh, the V-slice one, attn_slice_spec.cuh, 48- and 64-key
// tiles, elsewhere) and the wgmma kernel's register-fed tiles.
struct spec_variant {
  const char *name;
  const mla_layout_desc *desc;
  const void *slice_fn[2]; // 16-row kernel: 48-, 64-key tiles; null if the layout does not allow it
  const void *wg_regs_fn;  // wgmma kernel, register-fed tiles (16-byte aligned views); null if the layout does not allow them
  const void *rs16_fn;     // the 16-row wgmma kernel (attn_decode_rs16.cuh, codes mode); null if the layout does not allow it
  int rs16_smem;
};
template <class LS> const void *wg_regs_of() {
  if constexpr (wg::rf_ok(LS::host, LS::host.k_dims)) return (const void *)wg::attn_decode_wg_kernel<LS::host.k_dims, wg::WG_REGS, LS>;
  else return nullptr;
}
template <class LS> const void *rs16_of() {
  if constexpr (rs16::allowed<LS>()) return (const void *)rs16::attn_decode_rs16_kernel<LS::host.k_dims, LS>;
  else return nullptr;
}
// The V-slice kernel takes whole rows in one or two regions (slice_ok); null elsewhere.
template <class LS, int BK> const void *slice_of() {
  if constexpr (mla_attn_slice::slice_ok(LS::host) && !mla_layout_chunked(&LS::host))
    return (const void *)mla_attn_slice::attn_decode_slice_kernel<LS, BK>;
  else return nullptr;
}
template <class LS> spec_variant variant_of() {
  return {LS::name, &LS::host, {slice_of<LS, 48>(), slice_of<LS, 64>()}, wg_regs_of<LS>(), rs16_of<LS>(),
          rs16::smem_bytes<LS>()};
}
const spec_variant *find_layout_spec(const mla_layout_desc &d) {
  static const spec_variant all[] = {variant_of<mla_attn_spec::spec_fp8_pertensor>(), variant_of<mla_attn_spec::spec_fp8_ds_mla>(),
                                     variant_of<mla_attn_spec::spec_fp8_v4>(), variant_of<mla_attn_spec::spec_fp8_ds_mla_blocked>()};
  for (const spec_variant &v : all)
    if (mla_layout_desc_same(&d, v.desc, 1)) return &v;
  return nullptr;
}
// The built-in's variants, if the view also allows their loads (alignment of base and strides).
const spec_variant *find_variant(const mla_layout_desc &d, const params &p) {
  const spec_variant *v = find_layout_spec(d);
  if (!v) return nullptr;
  for (int r = 0; r < d.nregions; r++)
    if (p.reg_gran[r] < mla_attn_spec::region_gran(*v->desc, r)) return nullptr;
  return v;
}
int slice_stages_within(int pitch, int bk, int nregions, int64_t budget) {
  for (int n = 4; n >= 2; n--)
    if (mla_attn_slice::make_slice_smem(pitch, n, bk, nregions).total <= budget) return n;
  return 0;
}

// The wgmma kernel (attn_decode_wg.cuh) serves 64-row tiles on compute
// capability 9.0 when this binary carries sm_90a code (MLALAB_HAVE_SM90A,
// set by CMake from the architecture list) and its shared memory fits.
int wg_smem(int dqk, int mode, int pitch) {
  return dqk == 576 ? wg::make_smem_plan<576>(mode, pitch).total : wg::make_smem_plan<512>(mode, pitch).total;
}
// How the wgmma kernel fills its K tiles for a launch (wg::wg_mode): plain
// bf16 rows; a built-in fp8 layout's register-fed tiles (v: the built-in's
// variants where the view allows their loads); else staged tiles dequantized
// through chunk plans.
int wg_mode_for(int identity, const spec_variant *v) {
  return identity ? wg::WG_BF16 : v && v->wg_regs_fn ? wg::WG_REGS : wg::WG_STAGED;
}
const void *wg_kernel(const spec_variant *v, int dqk, int mode) {
  if (mode == wg::WG_BF16)
    return dqk == 576 ? (const void *)wg::attn_decode_wg_kernel<576, wg::WG_BF16, void> : (const void *)wg::attn_decode_wg_kernel<512, wg::WG_BF16, void>;
  if (mode == wg::WG_REGS) return v->wg_regs_fn;
  return dqk == 576 ? (const void *)wg::attn_decode_wg_kernel<576, wg::WG_STAGED, void> : (const void *)wg::attn_decode_wg_kernel<512, wg::WG_STAGED, void>;
}
// K tiles in flight in the wgmma kernel (bf16 tiles, or the raw stage); 0 if it does not fit.
int wg_stages(int dqk, int mode, int pitch, int budget) {
  return wg_smem(dqk, mode, pitch) <= budget ? (mode == wg::WG_STAGED ? 1 : 2) : 0;
}
bool wg_available(const mla_device_props &props) {
#ifdef MLALAB_HAVE_SM90A
  return props.major == 9 && props.minor == 0;
#else
  (void)props;
  return false;
#endif
}

const char *last_variant = "none";

} // namespace

extern "C" const char *mla_attn_last_variant(void) { return last_variant; }

extern "C" int mla_attn_baked_supports(const mla_layout_desc *d, const mla_attn_args *a) {
  if (a->d_qk != 512 && a->d_qk != 576)
    return mla_err("the baked decode kernels take d_qk = 512 or 576, got %lld (impl='jit' or 'ref' take any)", (long long)a->d_qk);
  if (a->d_v != DV) return mla_err("the baked decode kernels take d_v = %d, got %lld", DV, (long long)a->d_v);
  if (d->k_dims != a->d_qk || d->v_dims != a->d_v)
    return mla_err("the layout has k_dims %d / v_dims %d but q implies %lld / %lld", d->k_dims, d->v_dims,
                   (long long)a->d_qk, (long long)a->d_v);
  return 1;
}

extern "C" int mla_cuda_attn_decode(const mla_layout_desc *d, const mla_cache_view *v, const mla_attn_args *a,
                                    int64_t max_keys, int splits, int specialize, void *out, float *lse, int dev,
                                    mla_attn_plan *plan) {
  if (mla_attn_baked_supports(d, a) != 1) return -1;
  if (mla_device_use(dev)) return -1;
  cudaStream_t stream = mla_device_stream(dev);
  mla_device_props props;
  if (mla_device_props_get(dev, &props)) return -1;

  const int64_t rows = mla_attn_rows(a), problems = mla_attn_problems(a);
  if (rows < 1 || problems < 1) return 0; // nothing to compute (empty batch)
  const int dqk = (int)a->d_qk;
  const int id_off = identity_offset(*d, *v, dqk);
  // Dense bf16 rows (an identity view) of 32 query rows or fewer: on Hopper
  // the 64-row wgmma kernel, its unused rows masked, streams the cache faster
  // than the 16/32-row generic kernel (b128 h16 1.27-1.28x, s2 h16 2.3x on
  // the H200; sparse even: bench/RESULTS.md, thirty-seventh session).
  const bool wide_bf16 = specialize == MLA_ATTN_SPECIALIZED && !a->sparse && id_off >= 0 && wg_available(props);
  const int mr = specialize == MLA_ATTN_WIDE || wide_bf16 ? 64 : rows <= 16 ? 16 : rows <= 32 ? 32 : 64;
  const int64_t row_chunks = (rows + mr - 1) / mr;

  params p;
  memset(&p, 0, sizeof p);
  p.d = *d, p.v = *v;
  p.q = (const uint16_t *)a->q;
  p.qs0 = a->q_stride[0], p.qs1 = a->q_stride[1], p.qs2 = a->q_stride[2], p.qs3 = a->q_stride[3];
  p.b = (int)a->b, p.s_q = (int)a->s_q, p.h_q = (int)a->h_q, p.rows = (int)rows, p.row_chunks = (int)row_chunks;
  p.sparse = a->sparse, p.causal = a->causal;
  p.block_table = a->block_table, p.max_blocks = (int)a->max_blocks, p.cache_lens = a->cache_lens;
  p.indices = a->indices, p.topk = (int)a->topk, p.topk_len = a->topk_len, p.sink = a->sink;
  p.scale_log2 = a->scale * 1.4426950408889634f;
  p.q_vec = p.qs3 == 1 && p.qs0 % 8 == 0 && p.qs1 % 8 == 0 && p.qs2 % 8 == 0 && (uintptr_t)a->q % 16 == 0;

  p.identity = id_off >= 0, p.id_off = id_off >= 0 ? id_off : 0;
  int64_t pitch = 0;
  for (int r = 0; r < d->nregions; r++) {
    p.reg_stage_off[r] = (int)pitch;
    p.reg_bytes[r] = d->region_row_bytes[r];
    p.reg_gran[r] = region_granularity(*d, *v, r);
    p.reg_upp[r] = d->region_chunk[r] > 0 ? d->region_chunk[r] / p.reg_gran[r] : 0;
    p.reg_ushift[r] = mla_log2_exact(p.reg_upp[r]);
    pitch += round16(d->region_row_bytes[r]);
  }
  if (!p.identity && pitch * BN > (int64_t)props.max_smem_optin)
    return mla_err("token rows of %lld bytes (all regions) do not fit a %d-key tile in shared memory (%d bytes); "
                   "use impl='jit' or 'ref'", (long long)pitch, BN, props.max_smem_optin);
  if (!p.identity && mr == 16) pitch += (32 - pitch % 128 + 128) % 128; // fused path: see attn_decode_params.cuh
  p.stage_pitch = (int)pitch;

  // Pipeline depth: two CTAs per SM for the small row counts (memory-bound
  // shapes overlap one CTA's math with the other's loads), one for 64 rows.
  int per_sm = 0;
  cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  const spec_variant *bv = p.identity ? nullptr : find_variant(*d, p); // a built-in fp8 layout's kernels
  // 16-row tiles of a built-in: on Hopper the rs16 wgmma kernel (MLA_ATTN_SLICE: the V-slice kernel
  // instead), else the V-slice kernel
  const bool rs16k = specialize == MLA_ATTN_SPECIALIZED && mr == 16 && bv && bv->rs16_fn && wg_available(props) &&
                     bv->rs16_smem <= props.max_smem_optin;
  const spec_variant *sv = specialize != MLA_ATTN_GENERIC && mr == 16 && !rs16k && bv && bv->slice_fn[0] ? bv : nullptr;
  const int wg_mode = wg_mode_for(p.identity, bv);
  const int wg_nst = specialize != MLA_ATTN_GENERIC && mr == 64 && wg_available(props) ? wg_stages(dqk, wg_mode, p.stage_pitch, props.max_smem_optin) : 0;
  const bool wgk = wg_nst > 0;
  int ctas_per_sm = mr <= 32 ? 2 : 1, nst = 0, smem = 0, tile = BN, tile_keys = BN; // tile: unit of the KV split
  const void *fn = nullptr;
  if (rs16k) {
    ctas_per_sm = 1, nst = 1, smem = bv->rs16_smem, tile = wg::SPLIT_KEYS, tile_keys = rs16::KB, fn = bv->rs16_fn;
  } else if (wgk) {
    nst = wg_nst, smem = wg_smem(dqk, wg_mode, p.stage_pitch), tile = wg::SPLIT_KEYS, tile_keys = wg::tile_keys(wg_mode);
    fn = wg_kernel(bv, dqk, wg_mode);
  } else if (sv) {
    // 64-key tiles where two CTAs per SM still fit (fewer barriers per key), else 48
    const int nr = sv->desc->nregions;
    p.stage_pitch = mla_attn_slice::slice_pitch(*sv->desc);
    int bk = 64;
    nst = slice_stages_within(p.stage_pitch, bk, nr, per_sm / 2 - 1024);
    if (!nst) bk = 48, nst = slice_stages_within(p.stage_pitch, bk, nr, per_sm / 2 - 1024);
    if (!nst) ctas_per_sm = 1, nst = slice_stages_within(p.stage_pitch, bk, nr, props.max_smem_optin);
    if (nst) smem = mla_attn_slice::make_slice_smem(p.stage_pitch, nst, bk, nr).total, fn = sv->slice_fn[bk == 64], tile = tile_keys = bk;
    else sv = nullptr, ctas_per_sm = 2; // cannot happen on sm_80+; the generic path decides
  }
  if (!sv && !wgk && !rs16k) {
    nst = ctas_per_sm == 2 ? stages_within(mr, dqk, p.identity, p.stage_pitch, per_sm / 2 - 1024) : 0;
    if (!nst) ctas_per_sm = 1, nst = stages_within(mr, dqk, p.identity, p.stage_pitch, props.max_smem_optin);
    if (!nst)
      return mla_err("the decode tile for %d rows and %lld-byte token rows needs %d bytes of shared memory, the device "
                     "offers %d; use impl='jit' or 'ref'", mr, (long long)pitch, smem_total(mr, dqk, p.identity, p.stage_pitch, 2),
                     props.max_smem_optin);
    smem = smem_total(mr, dqk, p.identity, p.stage_pitch, nst);
    fn = kernel_for(mr, dqk);
  }
  p.nstages = nst;
  if (mla_cuda_check(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "attn_decode: shared memory size"))
    return -1;

  const int64_t ctas = row_chunks * problems;
  if (ctas > 0x7fffffff) return mla_err("attn_decode: %lld CTAs per split exceed the grid", (long long)ctas);
  const int64_t max_tiles = (max_keys + tile - 1) / tile;
  // the split model's costs: 64-row CTAs, two small CTAs a SM, else one small CTA a SM (as rs16)
  const mla_split_family fam = mr == 64 ? MLA_SPLIT_WG64 : ctas_per_sm == 2 ? MLA_SPLIT_TWO_PER_SM : MLA_SPLIT_RS16;
  int ns = splits > 0 ? splits
                      : mla_attn_num_splits(fam, props.sm_count, ctas_per_sm, ctas, max_tiles,
                                            mla_attn_split_align(p.sparse, d->block_size, tile));
  if (ns > 65535) ns = 65535;
  p.nsplits = ns, p.mr = mr;
  // chunks that straddle queries under the causal mask (rows are query-major,
  // heads inner): their later queries' last keys go to the causal tail
  p.causal_tail = !p.sparse && p.causal && p.s_q > 1 && p.h_q % mr != 0 && !a->shared_causal_tiles;
  p.nparts = ns + p.causal_tail;

  void *ws = NULL;
  int64_t ws_bytes = 0;
  if (p.nparts > 1) {
    const int64_t partial_rows = problems * p.nparts * rows;
    ws_bytes = partial_rows * DV * 4 + round16(partial_rows * 4);
    if (mla_device_alloc(dev, ws_bytes, &ws)) return -1;
    p.o_acc = (float *)ws;
    p.lse_acc = (float *)((char *)ws + partial_rows * DV * 4);
  }
  p.out = (uint16_t *)out, p.lse = lse;

  dim3 grid((unsigned)ctas, (unsigned)ns);
  const int nt = rs16k ? rs16::NT : wgk ? wg::NT : sv ? mla_attn_slice::NT : threads_for(mr);
  const char *variant = rs16k ? "wgmma16rs" : wgk ? "wgmma" : sv ? sv->name : "generic";
  void *args[] = {&p};
  cudaError_t e = cudaLaunchKernel(fn, grid, dim3(nt), args, (size_t)smem, stream);
  int rc = e != cudaSuccess ? mla_cuda_check(e, "launch of kernel attn_decode") : mla_launch_check(dev, "attn_decode");
  last_variant = variant;
  if (!rc && p.causal_tail) {
    e = launch_causal_tail(p, stream);
    rc = e != cudaSuccess ? mla_cuda_check(e, "launch of kernel attn_causal_tail") : mla_launch_check(dev, "attn_causal_tail");
  }
  if (!rc && ns > 1) { // (one split and the tail: the tail kernel merged the two)
    combine_params c;
    c.o_acc = p.o_acc, c.lse_acc = p.lse_acc, c.nsplits = p.nparts, c.rows = (int)rows, c.problems = (int)problems;
    c.h_q = p.h_q, c.s_q = p.s_q, c.sparse = p.sparse, c.sink = a->sink, c.out = (uint16_t *)out, c.lse = lse;
    e = launch_combine(c, stream);
    rc = e != cudaSuccess ? mla_cuda_check(e, "launch of kernel attn_combine") : mla_launch_check(dev, "attn_combine");
  }
  if (ws) mla_device_free(dev, ws, ws_bytes); // stream-ordered: the next user queues behind these kernels
  if (plan) {
    plan->splits = ns, plan->rows_per_cta = mr, plan->ctas = (int)(ctas * ns), plan->stages = nst;
    plan->ctas_per_sm = ctas_per_sm, plan->identity = p.identity, plan->smem = smem, plan->tile_keys = tile_keys;
    plan->variant = variant, plan->causal_tail = p.causal_tail;
  }
  return rc;
}
