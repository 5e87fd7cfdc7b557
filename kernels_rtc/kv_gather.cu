// JIT twin of the baked sparse gather-dequant (src/kernels/kv_gather.cu):
// slot ids -> bf16 rows, for the layout of the generated header. Each value
// is decode(q) * scale in fp32 rounded once to bf16 (RNE), the reference's
// product (src/ref/layout_ref.c), through mla/token_access.cuh's chunk
// operations shared with the baked kernel.
//
// One warp per row; lane j owns the 8-dim chunks j, j + 32, ... and issues
// all its loads before converting.
//
//   slots[i] < 0: no load and no store (row i keeps its contents); a slot
//   past the cache is skipped too and counted in *bad (when bad is not null).
//   out: bf16, row i at out + i * out_stride elements, its first ncols dims
//   (ncols a multiple of 8, at most the layout's dim).
//   grid: any (a grid-stride loop over rows), block = 128.
/* mlalab-rtc
  names = { "kv_gather<int>", "kv_gather<long long>" },
*/
#include "mla_layout.h"
#include "mla/token_access.cuh"

namespace {

constexpr int NCH = MLA_LAYOUT_DIM / 8;
constexpr int ITERS = (NCH + 31) / 32;
constexpr int WARPS = 4;

} // namespace

template <typename Idx>
__global__ void __launch_bounds__(WARPS * 32)
    kv_gather(const mla_cache_view view, const Idx *slots, long long n, unsigned short *out, long long out_stride,
              int ncols, unsigned long long *bad) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nch = min(ncols, MLA_LAYOUT_DIM) / 8;
  const float ts = view.tensor_scale ? *view.tensor_scale : 1.0f;
  for (long long row = (long long)blockIdx.x * WARPS + warp; row < n; row += (long long)gridDim.x * WARPS) {
    const long long slot = (long long)slots[row];
    if (slot < 0) continue;
    const long long page = slot / MLA_LAYOUT_BLOCK_SIZE, t = slot % MLA_LAYOUT_BLOCK_SIZE;
    if (page >= view.num_pages) {
      if (lane == 0 && bad) atomicAdd(bad, 1ull);
      continue;
    }
    const unsigned char *pg = view.base + page * view.page_stride;
    uint4 raw[ITERS];
    uint32_t sbits[ITERS];
#pragma unroll
    for (int i = 0; i < ITERS; i++) {
      const int c = lane + 32 * i;
      raw[i] = make_uint4(0, 0, 0, 0);
      sbits[i] = 0;
      if (c < nch) {
        const mla::chunk_plan P = mla::plan_chunk(mla_layout, c);
        raw[i] = mla::load_chunk_raw(P.dtype, mla::chunk_ptr(pg, P.data_base, P.data_row, t, view.token_stride));
        if (P.scale_kind == MLA_SCALE_GROUP)
          sbits[i] = mla::load_scale_raw(P.scale_dtype, mla::chunk_ptr(pg, P.scale_base, P.scale_row, t, view.token_stride));
      }
    }
    unsigned char *orow = reinterpret_cast<unsigned char *>(out + row * out_stride);
#pragma unroll
    for (int i = 0; i < ITERS; i++) {
      const int c = lane + 32 * i;
      if (c >= nch) continue;
      const mla::chunk_plan P = mla::plan_chunk(mla_layout, c);
      float x[8];
      mla::dequant_chunk(P, raw[i], sbits[i], mla::chunk_ptr(pg, P.data_base, P.data_row, t, view.token_stride), ts, x);
      mla::store16(orow + 16 * (long long)c, mla::pack_bf16x8(x));
    }
  }
}
