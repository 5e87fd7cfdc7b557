/* MLA decode attention: the problem as plain data, shared by the CPU
 * reference (src/ref/attn_ref.c), the baked kernels (src/kernels/attn_decode.cu)
 * and the bindings (src/l_attn.c). Absorbed MLA with one KV head: K is dims
 * [0, d_qk) of the dequantized cache row, V dims [0, d_v) (a prefix of K).
 *
 * Dense: request r has cache_lens[r] tokens; logical position p lives in page
 * block_table[r, p / block_size] at offset p % block_size. With `causal` and
 * s_q > 1, query i of s_q sees positions [0, s_k - s_q + i] (MTP).
 * Sparse: query (r, i) attends to the slots indices[r, i, 0 .. topk_len[r])
 * (slot = page * block_size + offset); -1 is "no key".
 * Softmax: lse = log sum exp(scale * q.k) (natural log); an optional sink
 * s_h per head multiplies the output by 1 / (1 + exp(s_h - lse)) and leaves
 * lse as it is (FlashMLA). A query with no key: lse = +inf, output 0.
 * Outputs: out [b, s_q, h_q, d_v], lse [b, h_q, s_q], both contiguous. */
#ifndef MLA_ATTN_H
#define MLA_ATTN_H

#include <stdint.h>

#include "mla/attn_split.h" /* mla_attn_split_align */
#include "mla/layout_desc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mla_attn_args {
  int64_t b, s_q, h_q, d_qk, d_v;
  const void *q;        /* bf16 [b, s_q, h_q, d_qk] */
  int64_t q_stride[4];  /* elements, any non-negative strides */
  int sparse;
  /* dense: block_table [b, max_blocks] and cache_lens [b], contiguous int32 */
  const int32_t *block_table;
  int64_t max_blocks;
  const int32_t *cache_lens;
  int causal;
  /* baked kernels: 1 skips the causal tail (params::causal_tail), as FlashMLA
   * does: faster, but a NaN or inf in one of a request's last s_q - 1 keys may
   * reach the outputs of its earlier queries, which do not see that key */
  int shared_causal_tiles;
  /* sparse: indices [b, s_q, topk] contiguous int32, topk_len [b] or NULL */
  const int32_t *indices;
  int64_t topk;
  const int32_t *topk_len;
  const float *sink; /* [h_q] or NULL */
  float scale;
} mla_attn_args;

/* Checks the index values (host copies of block_table / cache_lens /
 * indices / topk_len) against a cache of num_pages pages: every referenced
 * block-table entry names a page, every index is -1 or a slot, every length
 * fits. 0, or -1 with a message naming the first bad entry. */
int mla_attn_check_values(const mla_layout_desc *d, int64_t num_pages, const mla_attn_args *a);

/* Rows that share one K tile: s_q * h_q for dense (all queries of a
 * request), h_q for sparse (each query has its own keys). */
static inline int64_t mla_attn_rows(const mla_attn_args *a) { return a->sparse ? a->h_q : a->s_q * a->h_q; }
/* Independent problems: requests (dense) or (request, query) pairs (sparse). */
static inline int64_t mla_attn_problems(const mla_attn_args *a) { return a->sparse ? a->b * a->s_q : a->b; }

/* The kernel families the split count is modeled for: the 16-row wgmma
 * kernel (one CTA a SM), the 64-row wgmma kernels (dense and sparse), and
 * the two-CTA-a-SM ones (generic, V-slice). */
typedef enum { MLA_SPLIT_RS16, MLA_SPLIT_WG64, MLA_SPLIT_TWO_PER_SM } mla_split_family;

/* Number of KV splits: the count with the least modeled time for `ctas`
 * CTAs per split on sm_count x ctas_per_sm slots, at most max_tiles tiles of
 * keys per problem. Waves of CTAs (a partial last wave runs somewhat faster,
 * a CTA then having more of the memory system), each CTA its tiles plus its
 * family's fixed cost (prologue, epilogue, partial write), plus the
 * combine's cost when split: costs in tiles, measured on H100
 * (bench/RESULTS.md, twenty-sixth session). */
int mla_attn_num_splits(mla_split_family fam, int sm_count, int ctas_per_sm, int64_t ctas, int64_t max_tiles, int align);

#ifdef __cplusplus
}
#endif
#endif
