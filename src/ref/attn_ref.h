/* CPU reference of MLA decode attention (semantics in src/attn.h), computed
 * in double on the cache dequantized through the layout descriptor
 * (mla_ref_dequant_token), so it is the yardstick for the baked and JIT
 * kernels on any layout. */
#ifndef MLA_ATTN_REF_H
#define MLA_ATTN_REF_H

#include "attn.h"
#include "mla/layout_desc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out: f32 [b, s_q, h_q, d_v], lse: f32 [b, h_q, s_q], both contiguous. The
 * cache view, q and the index arrays are host memory. Index values must have
 * passed mla_attn_check_values. Returns 0, or -1 with mla_err (allocation). */
int mla_ref_attn_decode(const mla_layout_desc *d, const mla_cache_view *v, const mla_attn_args *a, float *out,
                        float *lse);

#ifdef __cplusplus
}
#endif
#endif
