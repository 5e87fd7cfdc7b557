/* Plain arguments of the KV-cache operations, shared by the CPU references
 * (src/ref/kv_ref.c), the baked kernels' launchers (src/kernels/kv_kernels.h)
 * and the tensor-level entry points (src/kv.h). Pointers already include the
 * tensors' storage offsets; strides are in elements; everything is 64-bit. */
#ifndef MLA_KV_TYPES_H
#define MLA_KV_TYPES_H

#include <stdint.h>

#include "mla/layout_desc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A vector of integer indices (i32 or i64), element i at data[i * stride].
 * n = 0 means "not given" wherever an index vector is optional. */
typedef struct mla_kv_ivec {
  const void *data;
  int64_t n, stride;
  int32_t is64;
} mla_kv_ivec;

/* A matrix of integer indices: element (r, c) at data[r * rs + c * cs]. */
typedef struct mla_kv_imat {
  const void *data;
  int64_t rows, cols, rs, cs;
  int32_t is64;
} mla_kv_imat;

/* An output index vector / matrix (same addressing, writable). */
typedef struct mla_kv_omat {
  void *data;
  int64_t rows, cols, rs, cs;
  int32_t is64;
} mla_kv_omat;

/* bf16 rows: row r starts at data + r * stride elements; cols contiguous. */
typedef struct mla_kv_rows {
  void *data;
  int64_t rows, cols, stride;
} mla_kv_rows;

/* A layer's cache as every KV operation receives it. */
typedef struct mla_kv_cache {
  mla_layout_desc desc;
  mla_cache_view view;
} mla_kv_cache;

/* Token rows to write: dims [0, split) from a, [split, dim) from b
 * (split = dim when the rows come whole; b then unused). */
typedef struct mla_kv_src_rows {
  mla_kv_rows a, b;
  int64_t split;
} mla_kv_src_rows;

/* Dense gather: request r's positions [starts[r], starts[r] + len_r) through
 * block_table row r into output rows [cu[r], cu[r + 1]). */
typedef struct mla_kv_dense {
  mla_kv_imat block_table;
  mla_kv_ivec cu;     /* B + 1 entries */
  mla_kv_ivec starts; /* B entries, or n = 0 */
} mla_kv_dense;

/* Which request a query token belongs to, for the top-k transforms:
 * token_req[t] if given, else the r with cu_q[r] <= t < cu_q[r + 1] if
 * given, else r = t (decode: one query token per request). */
typedef struct mla_kv_token_req {
  mla_kv_ivec token_req;
  mla_kv_ivec cu_q;
} mla_kv_token_req;

#ifdef __cplusplus
}
#endif
#endif
