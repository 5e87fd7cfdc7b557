// Raw token rows of a cache view, in two addressing flavours, for
// experiments/cross_layer.lua:
//   token_rows<false>  page base = page * view.page_stride (the view's stride(0))
//   token_rows<true>   page base = page * block_size * entry bytes: the packed-page
//                      assumption of vLLM PR #45111's three kernels, deliberately wrong.
// On a contiguous cache both are right; on a per-layer view of a block-major
// cross-layer cache the second reads another layer's pages.
//
//   out: u8 [n, MLA_LAYOUT_TOKEN_BYTES]; slots < 0 and pages past the view are skipped.
//   grid: n blocks, block: any.
#include "mla_layout.h"

template <bool PACKED>
__global__ void token_rows(const mla_cache_view view, const int *slots, long long n, unsigned char *out) {
  const long long row = blockIdx.x;
  if (row >= n) return;
  const long long slot = slots[row];
  if (slot < 0) return;
  const long long page = slot / MLA_LAYOUT_BLOCK_SIZE, t = slot % MLA_LAYOUT_BLOCK_SIZE;
  if (page >= view.num_pages) return;
  const long long page_off = PACKED ? page * MLA_LAYOUT_BLOCK_SIZE * (long long)MLA_LAYOUT_TOKEN_BYTES
                                    : page * view.page_stride;
  const unsigned char *src = view.base + page_off + t * view.token_stride;
  for (int i = threadIdx.x; i < MLA_LAYOUT_TOKEN_BYTES; i += blockDim.x) out[row * MLA_LAYOUT_TOKEN_BYTES + i] = src[i];
}
