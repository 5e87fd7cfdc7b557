/* Validation of layout descriptors (kernels_rtc/include/mla/layout_desc.h)
 * and of the cache views kernels receive. Pure C, no Lua: the bindings, the
 * fuzzer (fuzz/layout_fuzz.c) and C tests call it directly. Every rule here
 * is one that some reader relies on (the CPU reference, the baked kernels'
 * 8-dim vector loads, JIT kernels); a descriptor that passes can be handed to
 * any of them. Errors go through mla_err and name the offending field as
 * fields[i] (0-based) or the descriptor member. */
#ifndef MLA_LAYOUT_CHECK_H
#define MLA_LAYOUT_CHECK_H

#include <stdint.h>

#include "mla/layout_desc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest logical row the references handle (src/ref/layout_ref.c keeps one
 * row on the stack). */
#define MLA_LAYOUT_MAX_DIM 4096
/* Bounds that keep every derived size far inside int64 arithmetic. */
#define MLA_LAYOUT_MAX_BLOCK_SIZE (1 << 20)
#define MLA_LAYOUT_MAX_ROW_BYTES (1 << 20)
#define MLA_LAYOUT_MAX_PAGE_BYTES ((int64_t)1 << 42)
/* Baked kernels dequantize 8 consecutive dims at a time (layout_access.cuh:
 * dequant8), so fields and groups come in multiples of 8 dims. */
#define MLA_LAYOUT_DIM_QUANTUM 8

/* 0 if the descriptor is valid, else -1 with the reason in mla_errmsg(). */
int mla_layout_check(const mla_layout_desc *d);

/* Checks a view's geometry against a valid descriptor: page and token
 * strides in bytes, the base address (for alignment), and the extent the view
 * covers per page (`page_extent`: bytes of each page the tensor actually
 * spans). 0 if a kernel may use it, else -1 with the reason. */
int mla_layout_check_view(const mla_layout_desc *d, const mla_cache_view *v, int64_t page_extent);

/* Byte size of `count` elements of a field dtype (e2m1 packs two per byte). */
int64_t mla_layout_elem_bytes(int dtype, int64_t count);

/* 1 if any field uses the per-tensor scale. */
int mla_layout_has_tensor_scale(const mla_layout_desc *d);

#ifdef __cplusplus
}
#endif
#endif
