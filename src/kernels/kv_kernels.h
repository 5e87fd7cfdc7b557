/* Launchers of the baked KV-cache kernels (kv_write.cu, kv_gather.cu,
 * kv_requant.cu, kv_index.cu). Same semantics as the CPU references in
 * src/ref/kv_ref.h, argument for argument. Each returns the launch's
 * cudaError_t; the caller checks it with mla_launch_check.
 *
 * Out-of-range indices (a slot past the cache, a block-table column past its
 * row, a page id outside the cache) are skipped and counted into *bad (a
 * device counter, never NULL), so a kernel never touches memory outside its
 * tensors and the host can turn the count into an error without a sync in
 * the launch path (CUDA-graph safe). */
#ifndef MLA_KV_KERNELS_H
#define MLA_KV_KERNELS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "kv_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Variants. A launcher whose descriptor equals one of builtin_layouts.h's
 * (mla_layout_desc_same) may run a variant compiled for it with the
 * descriptor as compile-time constants; any other descriptor, or
 * specialization switched off, runs the generic kernel. Each launcher records
 * what it ran ("generic" or the built-in's name; a static string). */
int mla_cuda_kv_set_specialize(int on); /* returns the previous setting */
int mla_cuda_kv_specialize(void);
void mla_cuda_kv_note_variant(const char *name);
const char *mla_cuda_kv_last_variant(void);

/* Quantize-and-cache: token i (i < slots->n) goes to slot slots[i]; < 0 skipped. */
cudaError_t mla_cuda_kv_write(const mla_kv_cache *c, const mla_kv_ivec *slots, const mla_kv_src_rows *src,
                              unsigned long long *bad, cudaStream_t s);

/* Sparse gather-dequant: out row i <- slot slots[i]; slot < 0: no load, no
 * store. remap (may be NULL): remap[i] = slots[i] >= 0 ? i : -1. */
cudaError_t mla_cuda_kv_gather_sparse(const mla_kv_cache *c, const mla_kv_ivec *slots, const mla_kv_rows *out,
                                      const mla_kv_omat *remap, unsigned long long *bad, cudaStream_t s);

/* Dense gather-dequant by block table and cumulative lengths; output rows
 * at or past cu[B] are left untouched. */
cudaError_t mla_cuda_kv_gather_dense(const mla_kv_cache *c, const mla_kv_dense *g, const mla_kv_rows *out,
                                     unsigned long long *bad, cudaStream_t s);

/* Whole pages: out row j <- token j % block_size of page pages[j / block_size]. */
cudaError_t mla_cuda_kv_gather_pages(const mla_kv_cache *c, const mla_kv_ivec *pages, const mla_kv_rows *out,
                                     unsigned long long *bad, cudaStream_t s);

/* Raw bytes of each region row: out[r] is u8 [rows, region_row_bytes[r]]
 * (row stride out_stride[r] bytes), rows addressed as in the dense gather. */
cudaError_t mla_cuda_kv_gather_raw(const mla_kv_cache *c, const mla_kv_dense *g, unsigned char *const *out,
                                   const int64_t *out_stride, int64_t rows, unsigned long long *bad, cudaStream_t s);

/* Repack every token of src's pages into dst (same block size, as many
 * pages or more): chunks stored with group f32 scales copy the codes and
 * take the tensor scale as their scale; bf16 chunks without a scale get
 * bf16(decode * tensor scale); padding is zeroed. The pairing is checked by
 * requant_check (src/kv.c) before launch. */
cudaError_t mla_cuda_kv_requant(const mla_kv_cache *src, const mla_kv_cache *dst, cudaStream_t s);

/* Compaction of referenced pages: flags[p] = 1 for every page an index >= 0
 * refers to (flags zeroed here first); rank = exclusive prefix sum of flags,
 * *count = total (ranking leaves the flags zero); remap of the indices into
 * the compact numbering (rank[page] * bs + offset, -1 kept).
 * rank_pages also lists the pages when pages != NULL: pages[rank[p]] = p for
 * referenced p, those of rank >= cap dropped, [count, cap) = -1; remap gives
 * -1 for ranks >= cap.
 * mark_rank_pages marks and ranks in one launch (num_pages up to
 * mark_rank_pages_max()); flags and *ticket must be zero on entry and are
 * left zero. */
cudaError_t mla_cuda_kv_mark_pages(const mla_kv_imat *idx, int64_t block_size, int64_t num_pages, int32_t *flags,
                                   unsigned long long *bad, cudaStream_t s);
cudaError_t mla_cuda_kv_rank_pages(int32_t *flags, int64_t num_pages, int32_t *rank, int64_t *count, int64_t *pages,
                                   int64_t cap, cudaStream_t s);
int mla_cuda_kv_mark_rank_pages_max(void);
cudaError_t mla_cuda_kv_mark_rank_pages(const mla_kv_imat *idx, int64_t block_size, int64_t num_pages, int32_t *flags,
                                        int32_t *rank, int64_t *count, int64_t *pages, int64_t cap,
                                        unsigned int *ticket, unsigned long long *bad, cudaStream_t s);
cudaError_t mla_cuda_kv_remap_compact(const mla_kv_imat *idx, const int32_t *rank, int64_t block_size,
                                      int64_t num_pages, int64_t cap, const mla_kv_omat *out, cudaStream_t s);

/* Top-k transforms, row t of topk [T, K] (request of t from req):
 * PAGED  out = idx < 0 ? -1 : block_table[r, idx / bs] * bs + idx % bs
 * RAGGED out = idx < 0 ? -1 : idx + cu_k[r]
 * lens (may be NULL) [T]: number of entries >= 0 in the row. */
cudaError_t mla_cuda_kv_topk_paged(const mla_kv_imat *topk, const mla_kv_token_req *req, const mla_kv_imat *block_table,
                                   int64_t block_size, const mla_kv_omat *out, const mla_kv_omat *lens,
                                   unsigned long long *bad, cudaStream_t s);
cudaError_t mla_cuda_kv_topk_ragged(const mla_kv_imat *topk, const mla_kv_token_req *req, const mla_kv_ivec *cu_k,
                                    const mla_kv_omat *out, const mla_kv_omat *lens, unsigned long long *bad,
                                    cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
