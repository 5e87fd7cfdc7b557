// Requant (repack) of a whole layer pool, e.g. fp8 per-tensor 576 B ->
// V3.2 656 B: every token of src's pages into the same slot of dst. Chunk by
// chunk: a dst chunk with group scales takes the src codes unchanged and the
// tensor scale as its f32 scale (values preserved bit for bit); a bf16 dst
// chunk without a scale takes bf16(decode * tensor scale). The host checked
// the pairing (requant_check in src/kv.c).
//
// Source token rows stream through a per-warp ring in shared memory
// (cp.async, as the gathers in kv_gather.cu); each warp owns a contiguous
// share of the pool's tokens, lane j the chunks j, j + 32, ... of a token.
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
  int32_t pad;
};

__device__ __forceinline__ rq_chunk make_rq_chunk(const mla_layout_desc &dd, const mla_cache_view &dv, int c) {
  const chunk_plan D = mla::plan_chunk(dd, c);
  rq_chunk q;
  q.dst = (int32_t)D.data_base, q.drow = D.data_row, q.sc = -1, q.srow = D.scale_row, q.pad = 0;
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
        if (q.sc >= 0)
          mla::store4(dp + q.sc + t * (q.srow ? (int64_t)q.srow : dv.token_stride),
                      __float_as_uint(K.ssrc == -2 ? ts : 1.0f));
      } else {
        const uint4 o = stage_dequant(K, row, ts);
        if (q.vec) *reinterpret_cast<uint4 *>(dst) = o;
        else mla::store16(dst, o);
      }
    };
    for (int c = lane; c < nchunks; c += 32) one(dplan[c], load_stage_chunk(splan + c));
    if (lane == 0) {
      for (int f = 0; f < dd.nfields; f++) {
        const mla_layout_field &fd = dd.fields[f];
        if (fd.role != MLA_FIELD_PAD) continue;
        unsigned char *p = (unsigned char *)mla::chunk_ptr(dp, dd.region_off[fd.region] + fd.byte_off,
                                                           fd.region == 0 ? 0 : dd.region_row_bytes[fd.region], t,
                                                           dv.token_stride);
        for (int k2 = 0; k2 < fd.count; k2++) p[k2] = 0;
      }
    }
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

extern "C" cudaError_t mla_cuda_kv_requant(const mla_kv_cache *src, const mla_kv_cache *dst, cudaStream_t s) {
  int64_t ntok = src->view.num_pages * src->desc.block_size;
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
