/* Baked MLA decode attention (dense and sparse) over any layout descriptor:
 * split-KV tensor-core kernel (attn_decode_kernel.cuh) plus an LSE-weighted
 * combine (attn_combine.cu). Semantics: src/attn.h. */
#ifndef MLA_ATTN_DECODE_H
#define MLA_ATTN_DECODE_H

#include <stdint.h>

#include "attn.h"
#include "mla/layout_desc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the launcher chose, for reports and benches. */
typedef struct mla_attn_plan {
  int splits;        /* KV splits per problem */
  int rows_per_cta;  /* 16, 32 or 64 query rows share each K tile */
  int ctas;          /* CTAs of the main kernel */
  int stages;        /* K tiles in flight */
  int tile_keys;     /* keys per K tile */
  int ctas_per_sm;
  int identity;      /* K rows copied as bf16 without a dequant pass */
  int64_t smem;      /* dynamic shared memory per CTA */
  const char *variant; /* "generic", "wgmma", "wgmma16rs", or the built-in layout whose V-slice kernel ran */
  int causal_tail;   /* causal chunks straddle queries: the later queries' last keys ran in attn_causal_tail */
} mla_attn_plan;

/* 1 if the baked kernels handle this shape (d_qk 512 or 576, d_v 512),
 * else 0 with the reason in mla_errmsg(). */
int mla_attn_baked_supports(const mla_layout_desc *d, const mla_attn_args *a);

/* Runs decode on device `dev` (its stream). a holds device pointers; out is
 * bf16 [b, s_q, h_q, d_v], lse f32 [b, h_q, s_q], both contiguous. max_keys
 * bounds the keys of one problem (sizes the split count); splits = 0 picks
 * the count from the SM count and the batch. Out-of-range pages or slots are
 * treated as missing keys (the caller checks values beforehand).
 * specialize (mla_attn_specialize): MLA_ATTN_SPECIALIZED lets a descriptor
 * equal (for reading) to a built-in fp8 layout's run that layout's
 * compile-time-specialized kernels (16-row tiles: the wgmma one on Hopper,
 * else the V-slice one; 64-row tiles: the wgmma kernel's register-fed
 * tiles); MLA_ATTN_SLICE the same but the V-slice kernel for 16-row tiles on
 * Hopper too; MLA_ATTN_WIDE 64-row tiles whatever the row count (on Hopper
 * the wgmma kernel, its unused rows masked); MLA_ATTN_GENERIC forces the
 * generic, descriptor-driven kernel.
 * Returns 0, or -1 with mla_err. */
enum mla_attn_specialize { MLA_ATTN_GENERIC = 0, MLA_ATTN_SPECIALIZED = 1, MLA_ATTN_SLICE = 2, MLA_ATTN_WIDE = 3 };
int mla_cuda_attn_decode(const mla_layout_desc *d, const mla_cache_view *v, const mla_attn_args *a, int64_t max_keys,
                         int splits, int specialize, void *out, float *lse, int dev, mla_attn_plan *plan);

/* What the last launch ran: "generic", a built-in layout's name, or "none". */
const char *mla_attn_last_variant(void);

#ifdef __cplusplus
}
#endif
#endif
