/* KV-cache operations over tensors: argument checks (every message names
 * the argument and what was expected), then the CPU reference
 * (src/ref/kv_ref.c) for CPU tensors or the baked kernels
 * (src/kernels/kv_*.cu) for CUDA tensors. The cache comes as a checked
 * descriptor + view (l_layout.c's mla_check_cache_view) and its device.
 *
 * Index tensors are i32 or i64 with any strides; bf16 row tensors need a
 * contiguous last dim. On CUDA, out-of-range indices are skipped and counted
 * per device (see mla_kv_take_bad) so that launches never synchronize; on the
 * CPU they are an immediate error. */
#ifndef MLA_KV_H
#define MLA_KV_H

#include "kv_types.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* rows_b may be NULL (rows_a then holds whole rows). */
int mla_kv_write(const mla_kv_cache *c, int dev, const mla_tensor *slots, const mla_tensor *rows_a,
                 const mla_tensor *rows_b);
/* remap may be NULL. */
int mla_kv_gather_sparse(const mla_kv_cache *c, int dev, const mla_tensor *slots, mla_tensor *out, mla_tensor *remap);
/* seq_starts may be NULL. */
int mla_kv_gather_dense(const mla_kv_cache *c, int dev, const mla_tensor *block_table, const mla_tensor *cu_seq_lens,
                        const mla_tensor *seq_starts, mla_tensor *out);
/* out[r] for each region r: u8 [rows, region_row_bytes[r]] (rows equal). */
int mla_kv_gather_raw(const mla_kv_cache *c, int dev, const mla_tensor *block_table, const mla_tensor *cu_seq_lens,
                      const mla_tensor *seq_starts, mla_tensor *const *out, int nout);
/* Whole-pool repack src -> dst (e.g. fp8 per-tensor 576 -> V3.2 656). */
int mla_kv_requant(const mla_kv_cache *src, const mla_kv_cache *dst, int dev);
/* Dequantizes only the pages that indices (>= 0) refer to: *rows = bf16
 * [count * block_size, ncols], *remap = indices renumbered into those rows
 * (same shape and dtype, -1 kept), *pages = i64 [count] physical page ids
 * in ascending order. Output sizes depend on the index values: on CUDA this
 * synchronizes (not CUDA-graph safe, by design; see the per-token gather). */
int mla_kv_compact(const mla_kv_cache *c, int dev, const mla_tensor *indices, int64_t ncols, mla_tensor *rows,
                   mla_tensor *remap, mla_tensor *pages);
/* The capacity mode of compaction, with no host sync (CUDA-graph safe):
 * rows bf16 [>= cap * block_size, ncols], pages i64 [cap] (its size is the
 * capacity), count i64 [1], remap of the shape of indices, all given. Writes
 * the referenced pages of rank < cap (list, rows, remap), -1 in the list past
 * the count and in remap for pages past the capacity, and the true count
 * (> cap: the outputs are incomplete; the caller checks). */
int mla_kv_compact_into(const mla_kv_cache *c, int dev, const mla_tensor *indices, mla_tensor *rows, mla_tensor *remap,
                        mla_tensor *pages, mla_tensor *count);
/* Top-k transforms; token_req / cu_q / lens may be NULL. */
int mla_kv_topk_paged(int dev, const mla_tensor *topk, const mla_tensor *block_table, int64_t block_size,
                      const mla_tensor *token_req, const mla_tensor *cu_q, mla_tensor *out, mla_tensor *lens);
int mla_kv_topk_ragged(int dev, const mla_tensor *topk, const mla_tensor *cu_k, const mla_tensor *token_req,
                       const mla_tensor *cu_q, mla_tensor *out, mla_tensor *lens);

/* Reads and resets the number of out-of-range indices the kernels of dev
 * skipped since the last call (synchronizes dev; 0 on the CPU). */
int mla_kv_take_bad(int dev, int64_t *n);

#ifdef __cplusplus
}
#endif
#endif
