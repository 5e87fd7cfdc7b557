/* CPU reference for caches described by a layout descriptor
 * (kernels_rtc/include/mla/layout_desc.h): quantize-and-write tokens into
 * slots, read-and-dequantize slots. Generic over the descriptor; no format is
 * named here. All addresses are 64-bit and honour the view's page and token
 * strides. */
#ifndef MLA_LAYOUT_REF_H
#define MLA_LAYOUT_REF_H

#include <stdint.h>

#include "mla/layout_desc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Quantizes one logical row x[0, dim) into slot `slot` (which must be >= 0
 * and inside the view). */
void mla_ref_quantize_token(const mla_layout_desc *d, const mla_cache_view *v, int64_t slot, const float *x);

/* Dequantizes slot `slot` into out[0, dim) in fp32 (the exact product
 * decode(q) * scale, as layout_desc.h defines it). */
void mla_ref_dequant_token(const mla_layout_desc *d, const mla_cache_view *v, int64_t slot, float *out);

/* Writes n tokens: row i (x + i * x_stride floats) goes to slots[i];
 * slots[i] < 0 is skipped. Returns -1 (with mla_err) for a slot past the view. */
int mla_ref_write(const mla_layout_desc *d, const mla_cache_view *v, const float *x, int64_t x_stride,
                  const int64_t *slots, int64_t n);

/* Reads n slots into out (row i at out + i * out_stride floats, the first
 * `ncols` dims); slots[i] < 0 leaves row i untouched. */
int mla_ref_read(const mla_layout_desc *d, const mla_cache_view *v, const int64_t *slots, int64_t n, float *out,
                 int64_t out_stride, int ncols);

#ifdef __cplusplus
}
#endif
#endif
