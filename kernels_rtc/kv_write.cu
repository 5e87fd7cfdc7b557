// JIT twin of the baked quantize-and-cache kernel (src/kernels/kv_write.cu):
// bf16 token rows into the slots of a slot mapping, for the layout of the
// generated header (`mla_layout`, constexpr: every field lookup folds away).
// Semantics and arithmetic: src/ref/layout_ref.c (mla_ref_quantize_token)
// through the chunk operations of mla/token_access.cuh, which the baked
// kernel uses too, so the bytes are identical.
//
// One warp per token; lane j owns the 8-dim chunks j, j + 32, ... A group
// scale's amax is combined through shared memory (a group may span lanes and
// iterations), then every lane quantizes its chunks.
//
//   slots[i] < 0: row i is skipped; a slot past the cache is skipped and
//   counted in *bad (when bad is not null).
//   rows: bf16 [>= n, dim], row i at rows + i * row_stride elements.
//   grid: any (a grid-stride loop over tokens), block = 128.
/* mlalab-rtc
  names = { "kv_write<int>", "kv_write<long long>" },
*/
#include "mla_layout.h"
#include "mla/token_access.cuh"

namespace {

constexpr int NCH = MLA_LAYOUT_DIM / 8;      // 8-dim chunks of a token
constexpr int ITERS = (NCH + 31) / 32;       // chunks per lane
constexpr int WARPS = 4;
static_assert(MLA_LAYOUT_DIM % 8 == 0, "layouts come in 8-dim chunks");

} // namespace

template <typename Idx>
__global__ void __launch_bounds__(WARPS * 32)
    kv_write(const mla_cache_view view, const Idx *slots, long long n, const unsigned short *rows, long long row_stride,
             unsigned long long *bad) {
  __shared__ float amax[WARPS][NCH];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float ts = view.tensor_scale ? *view.tensor_scale : 1.0f;
  for (long long tok = (long long)blockIdx.x * WARPS + warp; tok < n; tok += (long long)gridDim.x * WARPS) {
    const long long slot = (long long)slots[tok];
    if (slot < 0) continue; // warp-uniform: the whole warp moves on
    const long long page = slot / MLA_LAYOUT_BLOCK_SIZE, t = slot % MLA_LAYOUT_BLOCK_SIZE;
    if (page >= view.num_pages) {
      if (lane == 0 && bad) atomicAdd(bad, 1ull);
      continue;
    }
    const unsigned char *src = reinterpret_cast<const unsigned char *>(rows + tok * row_stride);
    uint4 raw[ITERS];
#pragma unroll
    for (int i = 0; i < ITERS; i++) {
      const int c = lane + 32 * i;
      raw[i] = c < NCH ? mla::load16(src + 16 * (long long)c) : make_uint4(0, 0, 0, 0);
      if (c < NCH && mla::plan_chunk(mla_layout, c).scale_kind == MLA_SCALE_GROUP) {
        float x[8];
        mla::unpack_bf16x8(raw[i], x);
        amax[warp][c] = mla::amax_chunk(x);
      }
    }
    __syncwarp();
    unsigned char *pg = view.base + page * view.page_stride;
#pragma unroll
    for (int i = 0; i < ITERS; i++) {
      const int c = lane + 32 * i;
      if (c >= NCH) continue;
      const mla::chunk_plan P = mla::plan_chunk(mla_layout, c);
      float x[8];
      mla::unpack_bf16x8(raw[i], x);
      if (P.scale_kind == MLA_SCALE_GROUP) {
        float a = 0.0f, dec;
        for (int k = P.group_lo; k < P.group_lo + P.group_n; k++) a = mla_amax_update(a, amax[warp][k]);
        const uint32_t code = mla_encode_scale(P.scale_dtype, mla_group_scale_value(&mla_layout.fields[P.field], a), &dec);
        if (c == P.group_lo) // one lane per group stores the scale
          mla::store_le(pg + P.scale_base + t * (P.scale_row ? (long long)P.scale_row : view.token_stride), code,
                        mla_scale_size(P.scale_dtype));
#pragma unroll
        for (int j = 0; j < 8; j++) x[j] = __fdiv_rn(x[j], dec);
      } else if (P.scale_kind == MLA_SCALE_TENSOR) {
#pragma unroll
        for (int j = 0; j < 8; j++) x[j] = __fdiv_rn(x[j], ts);
      }
      mla::store_chunk(P.dtype, pg + P.data_base + t * (P.data_row ? (long long)P.data_row : view.token_stride), x);
    }
    if (lane == 0) mla::zero_pads(mla_layout, pg, t, view.token_stride); // as the reference does
    __syncwarp(); // the amax slots are reused by the warp's next token
  }
}
