// Requant (repack) of a whole layer pool, e.g. fp8 per-tensor 576 B ->
// V3.2 656 B: every token of src's pages into the same slot of dst. Chunk by
// chunk: a dst chunk with group scales takes the src codes unchanged and the
// tensor scale as its f32 scale (values preserved bit for bit); a bf16 dst
// chunk without a scale takes bf16(decode * tensor scale). The host checked
// the pairing (requant_check in src/kv.c).
#include "kv_common.cuh"

namespace {

using namespace mla_kv;
using mla::chunk_plan;

__device__ __forceinline__ void copy_chunk(int dtype, unsigned char *dst, uint4 raw, const unsigned char *src) {
  switch (mla::chunk_bytes(dtype)) {
  case 4: mla::store4(dst, raw.x); break;
  case 8: mla::store8(dst, make_uint2(raw.x, raw.y)); break;
  case 16: mla::store16(dst, raw); break;
  default:
    mla::store16(dst, raw);
    mla::store16(dst + 16, mla::load16(src + 16));
    break;
  }
}

template <int ITERS>
__global__ void __launch_bounds__(kThreads) requant_kernel(const __grid_constant__ mla_layout_desc sd,
                                                           const __grid_constant__ mla_cache_view sv,
                                                           const __grid_constant__ mla_layout_desc dd,
                                                           const __grid_constant__ mla_cache_view dv, int lpt) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int nchunks = dd.dim / 8;
  chunk_plan *splan = reinterpret_cast<chunk_plan *>(smem), *dplan = splan + nchunks;
  mla::plan_chunks(sd, splan, nchunks);
  mla::plan_chunks(dd, dplan, nchunks);
  __syncthreads();
  const int lane = threadIdx.x & 31, sub = lane & (lpt - 1), tpw = 32 / lpt;
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  const float ts = sv.tensor_scale ? *sv.tensor_scale : 1.0f;
  const int bs = sd.block_size;
  const int64_t ntok = sv.num_pages * bs;
  for (int64_t tok = warp * tpw + lane / lpt; tok < ntok; tok += nwarps * tpw) {
    int64_t page, t;
    split_slot(tok, bs, page, t);
    const unsigned char *sp = sv.base + page * sv.page_stride;
    unsigned char *dp = dv.base + page * dv.page_stride;
    uint4 raw[ITERS];
#pragma unroll
    for (int i = 0; i < ITERS; i++) {
      int c = sub + i * lpt;
      raw[i] = make_uint4(0, 0, 0, 0);
      if (c < nchunks)
        raw[i] = mla::load_chunk_raw(splan[c].dtype, mla::chunk_ptr(sp, splan[c].data_base, splan[c].data_row, t, sv.token_stride));
    }
#pragma unroll
    for (int i = 0; i < ITERS; i++) {
      int c = sub + i * lpt;
      if (c >= nchunks) continue;
      const chunk_plan &S = splan[c], &D = dplan[c];
      const unsigned char *src = mla::chunk_ptr(sp, S.data_base, S.data_row, t, sv.token_stride);
      unsigned char *dst = (unsigned char *)mla::chunk_ptr(dp, D.data_base, D.data_row, t, dv.token_stride);
      if (D.scale_kind == MLA_SCALE_GROUP) {
        copy_chunk(D.dtype, dst, raw[i], src);
        if (c == D.group_lo) {
          float s = S.scale_kind == MLA_SCALE_TENSOR ? ts : 1.0f;
          mla::store4((unsigned char *)mla::chunk_ptr(dp, D.scale_base, D.scale_row, t, dv.token_stride), __float_as_uint(s));
        }
      } else {
        float x[8];
        mla::dequant_chunk(S, raw[i], 0, src, ts, x);
        mla::store16(dst, mla::pack_bf16x8(x));
      }
    }
    if (sub == 0) {
      for (int f = 0; f < dd.nfields; f++) {
        const mla_layout_field &fd = dd.fields[f];
        if (fd.role != MLA_FIELD_PAD) continue;
        unsigned char *p = (unsigned char *)mla::chunk_ptr(dp, dd.region_off[fd.region] + fd.byte_off,
                                                           fd.region == 0 ? 0 : dd.region_row_bytes[fd.region], t,
                                                           dv.token_stride);
        for (int k = 0; k < fd.count; k++) p[k] = 0;
      }
    }
  }
}

} // namespace

extern "C" cudaError_t mla_cuda_kv_requant(const mla_kv_cache *src, const mla_kv_cache *dst, cudaStream_t s) {
  int64_t ntok = src->view.num_pages * src->desc.block_size;
  if (ntok == 0) return cudaSuccess;
  int nchunks = dst->desc.dim / 8;
  int lpt = lanes_per_token(nchunks), iters = iters_for(nchunks, lpt);
  size_t smem = 2 * (size_t)nchunks * sizeof(chunk_plan);
  int64_t per_block = (int64_t)(kThreads / 32) * (32 / lpt);
  int64_t work = (ntok + per_block - 1) / per_block;
  MLA_KV_DISPATCH_ITERS(iters, {
    auto k = requant_kernel<ITERS>;
    k<<<grid_for(k, smem, work), kThreads, smem, s>>>(src->desc, src->view, dst->desc, dst->view, lpt);
  })
  return cudaGetLastError();
}
