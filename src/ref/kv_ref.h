/* CPU references of the KV-cache operations (the baked kernels'
 * semantics, src/kernels/kv_kernels.h, argument for argument), generic over
 * the layout descriptor through src/ref/layout_ref.h. Where a kernel skips
 * and counts an out-of-range index, the reference stops with an error that
 * names the entry (returns -1, message in mla_errmsg()). */
#ifndef MLA_KV_REF_H
#define MLA_KV_REF_H

#include "kv_types.h"

#ifdef __cplusplus
extern "C" {
#endif

int mla_ref_kv_write(const mla_kv_cache *c, const mla_kv_ivec *slots, const mla_kv_src_rows *src);
int mla_ref_kv_gather_sparse(const mla_kv_cache *c, const mla_kv_ivec *slots, const mla_kv_rows *out,
                             const mla_kv_omat *remap);
int mla_ref_kv_gather_dense(const mla_kv_cache *c, const mla_kv_dense *g, const mla_kv_rows *out);
int mla_ref_kv_gather_pages(const mla_kv_cache *c, const mla_kv_ivec *pages, const mla_kv_rows *out);
int mla_ref_kv_gather_raw(const mla_kv_cache *c, const mla_kv_dense *g, unsigned char *const *out,
                          const int64_t *out_stride, int64_t rows);
int mla_ref_kv_requant(const mla_kv_cache *src, const mla_kv_cache *dst);

/* Compaction: flags / rank over num_pages, *count referenced pages. The
 * list holds the pages of rank < cap, then -1 up to cap; remap gives -1 for
 * pages of rank >= cap (cap = count: everything, the exact-size outputs). */
int mla_ref_kv_rank_pages(const mla_kv_imat *idx, int64_t block_size, int64_t num_pages, int32_t *flags,
                          int32_t *rank, int64_t *count);
void mla_ref_kv_list_pages(const int32_t *flags, const int32_t *rank, int64_t num_pages, int64_t count, int64_t cap,
                           int64_t *pages);
void mla_ref_kv_remap_compact(const mla_kv_imat *idx, const int32_t *rank, int64_t block_size, int64_t num_pages,
                              int64_t cap, const mla_kv_omat *out);

int mla_ref_kv_topk_paged(const mla_kv_imat *topk, const mla_kv_token_req *req, const mla_kv_imat *block_table,
                          int64_t block_size, const mla_kv_omat *out, const mla_kv_omat *lens);
int mla_ref_kv_topk_ragged(const mla_kv_imat *topk, const mla_kv_token_req *req, const mla_kv_ivec *cu_k,
                           const mla_kv_omat *out, const mla_kv_omat *lens);

#ifdef __cplusplus
}
#endif
#endif
