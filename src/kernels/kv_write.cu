// Quantize-and-cache: bf16 token rows (whole, or k_nope + k_rope) into the
// slots of a slot mapping, for any layout descriptor. lpt lanes per token,
// each owning chunks of 8 dims; a group's amax is combined through shared
// memory (groups may span lanes and iterations), then every lane quantizes
// its chunks with the reference's arithmetic (mla/quant_math.h).
#include "kv_common.cuh"

namespace {

using namespace mla_kv;
using mla::chunk_plan;

__device__ __forceinline__ const unsigned char *src_chunk(const mla_kv_src_rows &s, int64_t tok, int c) {
  int64_t d0 = 8 * (int64_t)c;
  if (d0 < s.split) return (const unsigned char *)s.a.data + (tok * s.a.stride + d0) * 2;
  return (const unsigned char *)s.b.data + (tok * s.b.stride + d0 - s.split) * 2;
}

template <int ITERS>
__global__ void __launch_bounds__(kThreads) write_kernel(const __grid_constant__ mla_layout_desc d,
                                                         const __grid_constant__ mla_cache_view v,
                                                         const mla_kv_ivec slots, const mla_kv_src_rows src, int lpt,
                                                         unsigned long long *bad) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int nchunks = d.dim / 8;
  chunk_plan *plan = reinterpret_cast<chunk_plan *>(smem);
  mla::plan_chunks(d, plan, nchunks);
  __syncthreads();
  const int lane = threadIdx.x & 31, sub = lane & (lpt - 1), tpw = 32 / lpt;
  // per token slot of this warp: the amax of each chunk
  float *am = reinterpret_cast<float *>(plan + nchunks) + ((threadIdx.x >> 5) * tpw + lane / lpt) * nchunks;
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  const float ts = v.tensor_scale ? *v.tensor_scale : 1.0f;
  const int64_t ntok = slots.n;
  for (int64_t base = warp * tpw; base < ntok; base += nwarps * tpw) { // warp-uniform trip count
    const int64_t tok = base + lane / lpt;
    bool act = tok < ntok;
    int64_t page = 0, t = 0;
    if (act) {
      int64_t slot = ivec_at(slots, tok);
      act = slot >= 0;
      if (act) {
        split_slot(slot, d.block_size, page, t);
        if (page >= v.num_pages) {
          act = false;
          if (sub == 0) count_bad(bad);
        }
      }
    }
    uint4 raw[ITERS];
#pragma unroll
    for (int i = 0; i < ITERS; i++) {
      int c = sub + i * lpt;
      raw[i] = make_uint4(0, 0, 0, 0);
      if (act && c < nchunks) raw[i] = mla::load16(src_chunk(src, tok, c));
    }
#pragma unroll
    for (int i = 0; i < ITERS; i++) {
      int c = sub + i * lpt;
      if (act && c < nchunks && plan[c].scale_kind == MLA_SCALE_GROUP) {
        float x[8];
        mla::unpack_bf16x8(raw[i], x);
        am[c] = mla::amax_chunk(x);
      }
    }
    __syncwarp();
    unsigned char *pg = v.base + page * v.page_stride;
#pragma unroll
    for (int i = 0; i < ITERS; i++) {
      int c = sub + i * lpt;
      if (!act || c >= nchunks) continue;
      const chunk_plan &P = plan[c];
      float x[8];
      mla::unpack_bf16x8(raw[i], x);
      if (P.scale_kind == MLA_SCALE_GROUP) {
        float a = 0.0f, dec;
        for (int k = P.group_lo; k < P.group_lo + P.group_n; k++) a = mla_amax_update(a, am[k]);
        uint32_t code = mla_encode_scale(P.scale_dtype, mla_group_scale_value(&d.fields[P.field], a), &dec);
        if (c == P.group_lo)
          mla::store_le((unsigned char *)mla::chunk_ptr(pg, P.scale_base, P.scale_row, t, v.token_stride), code,
                        mla_scale_size(P.scale_dtype));
#pragma unroll
        for (int j = 0; j < 8; j++) x[j] = __fdiv_rn(x[j], dec);
      } else if (P.scale_kind == MLA_SCALE_TENSOR) {
#pragma unroll
        for (int j = 0; j < 8; j++) x[j] = __fdiv_rn(x[j], ts);
      }
      mla::store_chunk(P.dtype, (unsigned char *)mla::chunk_ptr(pg, P.data_base, P.data_row, t, v.token_stride), x);
    }
    if (act && sub == 0) { // padding bytes are written as zeros
      for (int f = 0; f < d.nfields; f++) {
        const mla_layout_field &fd = d.fields[f];
        if (fd.role != MLA_FIELD_PAD) continue;
        unsigned char *p = (unsigned char *)mla::chunk_ptr(pg, d.region_off[fd.region] + fd.byte_off,
                                                           fd.region == 0 ? 0 : d.region_row_bytes[fd.region], t,
                                                           v.token_stride);
        for (int k = 0; k < fd.count; k++) p[k] = 0;
      }
    }
    __syncwarp(); // the amax slots are reused by the next token
  }
}

} // namespace

extern "C" cudaError_t mla_cuda_kv_write(const mla_kv_cache *c, const mla_kv_ivec *slots, const mla_kv_src_rows *src,
                                         unsigned long long *bad, cudaStream_t s) {
  if (slots->n == 0) return cudaSuccess;
  int nchunks = c->desc.dim / 8;
  int lpt = lanes_per_token(nchunks), iters = iters_for(nchunks, lpt);
  int tpw = 32 / lpt;
  size_t smem = (size_t)nchunks * sizeof(chunk_plan) + (size_t)(kThreads / 32) * tpw * nchunks * sizeof(float);
  int64_t per_block = (int64_t)(kThreads / 32) * tpw;
  int64_t work = (slots->n + per_block - 1) / per_block;
  MLA_KV_DISPATCH_ITERS(iters, {
    auto k = write_kernel<ITERS>;
    k<<<grid_for(k, smem, work), kThreads, smem, s>>>(c->desc, c->view, *slots, *src, lpt, bad);
  })
  return cudaGetLastError();
}
