/* How a decode launch splits a problem's keys, shared by the launcher's
 * split count (src/attn.c) and the kernels' key ranges (cta_work_of). */
#ifndef MLA_ATTN_SPLIT_H
#define MLA_ATTN_SPLIT_H

#include "platform.h"

/* Tiles a split's key range is a multiple of: a page's worth (dense, pages
 * a whole number of tiles), so that no tile of a split straddles two pages
 * where the unsplit launch has none. */
MLA_HD MLA_CONSTEXPR int mla_attn_split_align(int sparse, int block_size, int tile_keys) {
  return !sparse && tile_keys > 0 && block_size > tile_keys && block_size % tile_keys == 0 ? block_size / tile_keys : 1;
}

/* Tiles of each of `nsplits` splits of `ntiles`: the ceiling share, rounded
 * up to the alignment. A macro so that the launcher's int64 count and the
 * kernels' int one share it without a 64-bit division in the kernels. */
#define MLA_ATTN_SPLIT_TILES(ntiles, nsplits, align) ((((ntiles) + (nsplits) - 1) / (nsplits) + (align) - 1) / (align) * (align))

#endif
