/* MLA decode attention: host-side checks of index values and the split
 * heuristic (see attn.h). */
#include "attn.h"

#include <math.h>

#include "mla_error.h"

static int check_dense(const mla_layout_desc *d, int64_t num_pages, const mla_attn_args *a) {
  const int64_t bs = d->block_size;
  for (int64_t r = 0; r < a->b; r++) {
    int64_t len = a->cache_lens[r];
    if (len < 0) return mla_err("cache_lens[%lld] = %lld is negative", (long long)r, (long long)len);
    int64_t blocks = (len + bs - 1) / bs;
    if (blocks > a->max_blocks)
      return mla_err("cache_lens[%lld] = %lld needs %lld blocks of %lld tokens but block_table has %lld columns",
                     (long long)r, (long long)len, (long long)blocks, (long long)bs, (long long)a->max_blocks);
    for (int64_t j = 0; j < blocks; j++) {
      int64_t page = a->block_table[r * a->max_blocks + j];
      if (page < 0 || page >= num_pages)
        return mla_err("block_table[%lld, %lld] = %lld is not a page of the cache (0 .. %lld)", (long long)r,
                       (long long)j, (long long)page, (long long)num_pages - 1);
    }
  }
  return 0;
}

static int check_sparse(const mla_layout_desc *d, int64_t num_pages, const mla_attn_args *a) {
  const int64_t slots = num_pages * d->block_size;
  for (int64_t r = 0; r < a->b; r++) {
    int64_t len = a->topk;
    if (a->topk_len) {
      len = a->topk_len[r];
      if (len < 0 || len > a->topk)
        return mla_err("topk_len[%lld] = %lld is outside [0, topk = %lld]", (long long)r, (long long)len,
                       (long long)a->topk);
    }
    for (int64_t i = 0; i < a->s_q; i++) {
      const int32_t *row = a->indices + (r * a->s_q + i) * a->topk;
      for (int64_t j = 0; j < len; j++)
        if (row[j] != -1 && (row[j] < 0 || row[j] >= slots))
          return mla_err("indices[%lld, %lld, %lld] = %d is neither -1 nor a slot of the cache (0 .. %lld)",
                         (long long)r, (long long)i, (long long)j, row[j], (long long)slots - 1);
    }
  }
  return 0;
}

int mla_attn_check_values(const mla_layout_desc *d, int64_t num_pages, const mla_attn_args *a) {
  return a->sparse ? check_sparse(d, num_pages, a) : check_dense(d, num_pages, a);
}

/* Fixed cost of a CTA and the combine's, in the family's tiles of keys
 * (fits of forced-split launches of exactly one wave on H100: rs16 9.5-9.8 /
 * 7.5-9.2, 64-row 14.8-17.9 / 4.8-12.2, two a SM 2.3-3.1 / 1.7-3.2), and the
 * time of a partial last wave as a fraction of a full one (0.81-0.89). */
static const struct {
  double fixed, combine;
} split_costs[] = {[MLA_SPLIT_RS16] = {10, 8}, [MLA_SPLIT_WG64] = {17, 8}, [MLA_SPLIT_TWO_PER_SM] = {3, 2.5}};
#define SPLIT_TAIL 0.85

int mla_attn_num_splits(mla_split_family fam, int sm_count, int ctas_per_sm, int64_t ctas, int64_t max_tiles, int align) {
  const int64_t slots = (int64_t)(sm_count > 0 ? sm_count : 1) * (ctas_per_sm > 0 ? ctas_per_sm : 1);
  const double fixed = split_costs[fam].fixed, combine = split_costs[fam].combine;
  if (align < 1) align = 1;
  if (ctas < 1) ctas = 1;
  if (max_tiles < 1) return 1;
  int best = 1;
  double best_cost = -1;
  for (int64_t ns = 1; ns <= 64 && ns <= max_tiles; ns++) {
    const int64_t per = MLA_ATTN_SPLIT_TILES(max_tiles, ns, align);
    if (ns > 1 && (ns - 1) * per >= max_tiles) continue; /* a split left empty: the same as fewer */
    const int64_t n = ctas * ns, full = n / slots, rem = n - full * slots;
    const double waves = (double)full + (rem ? fmax((double)rem / (double)slots, SPLIT_TAIL) : 0.0);
    const double cost = waves * ((double)per + fixed) + (ns > 1 ? combine : 0.0);
    if (best_cost < 0 || cost < best_cost - 1e-9) best_cost = cost, best = (int)ns;
  }
  return best;
}
