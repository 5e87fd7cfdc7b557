/* The layout descriptor: a cache format as plain data, produced from the Lua
 * description (lua/mlalab/layout.lua, `layout:desc(block_size)`) and read by
 * the CPU references (src/ref), the kernels baked in with nvcc (src/kernels)
 * and, as compile-time constants, by JIT kernels. No format is special-cased
 * anywhere else: everything a kernel needs to address, quantize and
 * dequantize a token is here.
 *
 * Model. A token is a logical row of `dim` values (576 for V3/V3.2 MLA: 512
 * latent + 64 RoPE; 512 for V4; 128 for the DSA indexer key). A page holds
 * `block_size` tokens and is split into up to MLA_LAYOUT_MAX_REGIONS regions;
 * region r stores one row of `region_row_bytes[r]` bytes per token, laid out
 * [block_size][row] starting at byte `region_off[r]` of the page. Interleaved
 * formats (bf16, fp8 per-tensor, V3.2 656 B) have one region; page-split
 * formats (V4 584 B, indexer 132 B, V4.1 FP4) put scales in a second region.
 * A chunked region (region_chunk[r] = c > 0) cuts each token's row into
 * pieces of c bytes stored piece-major, [row / c][block_size][c]: FlashMLA's
 * page-blocked V3.2 cache keeps NoPE as [32][B][16 B] and scales as [4][B].
 *
 * Addresses, all in 64-bit arithmetic (see mla_cache_view):
 *   page p  = base + p * page_stride                (page_stride read from the tensor)
 *   token t of region 0 = page + region_off[0] + t * token_stride
 *   token t of region r>0 = page + region_off[r] + t * region_row_bytes[r]
 *   byte b of token t's row in a chunked region (the view's token stride unused)
 *           = page + region_off[r] + (b / c) * block_size * c + t * c + b % c
 *   (mla_region_base and mla_region_step below give every form at once)
 *   slot s  -> p = s / block_size, t = s % block_size; s < 0 is "no token"
 *
 * Fields cover the logical row: field f stores dims [dim_lo, dim_lo + count)
 * as `dtype` elements at byte `byte_off` of the token's row in `region`
 * (sub-byte dtypes pack two per byte, even element in the low nibble).
 * Quantization of a field:
 *   MLA_SCALE_NONE   q = encode(x)                          (bf16: RNE)
 *   MLA_SCALE_TENSOR q = encode(x / s_t), s_t the per-tensor scale (a device f32)
 *   MLA_SCALE_GROUP  per group g of `group` consecutive dims:
 *       a = max |x| over the group (NaN if any x is NaN)
 *       POW2: s = 2^ceil(log2(max(a / qmax, eps)))   (eps_on_amax: max(a, eps) / qmax)
 *       AMAX: s = a / qmax                           (eps_on_amax: max(a, eps) / qmax;
 *                                                     else max(a / qmax, eps))
 *       s clamped to [scale_min, scale_max] when those are > 0,
 *       stored as scale_dtype (f32 exact, ue8m0 exponent byte, e4m3 / bf16 RNE)
 *       at scale_region row byte scale_off + g * scale_size;
 *       q = encode(x / decode(stored scale))   (fp8: satfinite RNE; e2m1: satfinite RNE)
 *   Dequant: x = decode(q) * decode(scale) (or * s_t), computed in fp32; readers
 *   that produce bf16 round that fp32 product once.
 * PAD fields are bytes a writer sets to zero (e.g. V4's 8th scale byte).
 * K is dims [0, k_dims) and V is dims [0, v_dims): V is always a prefix of K. */
#ifndef MLA_LAYOUT_DESC_H
#define MLA_LAYOUT_DESC_H

#include "platform.h"

#define MLA_LAYOUT_MAX_FIELDS 8
#define MLA_LAYOUT_MAX_REGIONS 4

enum mla_field_role { MLA_FIELD_DATA = 0, MLA_FIELD_PAD = 1 };
enum mla_scale_kind { MLA_SCALE_NONE = 0, MLA_SCALE_TENSOR = 1, MLA_SCALE_GROUP = 2 };
enum mla_scale_policy { MLA_POLICY_POW2 = 0, MLA_POLICY_AMAX = 1 };

typedef struct mla_layout_field {
  int32_t role;         /* mla_field_role */
  int32_t dtype;        /* stored element type (mla_dtype id); u8 for PAD */
  int32_t dim_lo;       /* first logical dim stored (DATA) */
  int32_t count;        /* elements stored (DATA), bytes (PAD) */
  int32_t region;       /* page region of the data */
  int32_t byte_off;     /* byte offset inside the token's row of that region */
  int32_t scale_kind;   /* mla_scale_kind */
  int32_t group;        /* elements per scale (GROUP) */
  int32_t scale_dtype;  /* f32, ue8m0, e4m3 or bf16 (GROUP) */
  int32_t scale_region; /* region of the scales (GROUP) */
  int32_t scale_off;    /* byte offset of the first scale in that region's token row */
  int32_t scale_policy; /* mla_scale_policy */
  int32_t eps_on_amax;  /* 1: eps bounds the amax, 0: eps bounds the scale */
  float qmax;           /* largest code magnitude of dtype (448 e4m3, 6 e2m1) */
  float eps;            /* 0 = none */
  float scale_min, scale_max; /* clamp of the scale value, 0 = none */
} mla_layout_field;

typedef struct mla_layout_desc {
  int32_t dim;        /* logical row width */
  int32_t k_dims, v_dims;
  int32_t nfields, nregions;
  int32_t block_size; /* tokens per page this descriptor was made for */
  int32_t region_row_bytes[MLA_LAYOUT_MAX_REGIONS];
  int32_t region_chunk[MLA_LAYOUT_MAX_REGIONS]; /* 0: rows whole; c: rows in c-byte pieces, piece-major */
  int64_t region_off[MLA_LAYOUT_MAX_REGIONS]; /* byte offset of each region in a page */
  int64_t page_bytes; /* smallest legal page stride (regions + alignment padding) */
  int32_t page_align; /* page strides must be multiples of this (bytes) */
  int32_t token_align; /* token rows of region 0 must start at multiples of this */
  mla_layout_field fields[MLA_LAYOUT_MAX_FIELDS];
} mla_layout_desc;

/* One layer's cache as kernels receive it. */
typedef struct mla_cache_view {
  unsigned char *base;  /* byte address of page 0 (storage + view offset) */
  int64_t page_stride;  /* bytes between pages: the view's stride(0), never block_size * entry */
  int64_t token_stride; /* bytes between region-0 token rows (the view's stride(1) when 3-D) */
  int64_t num_pages;
  const float *tensor_scale; /* per-tensor scale (device pointer on GPU, host on CPU), or NULL */
} mla_cache_view;

/* Where byte b of a token's row in region r lives: at page + base + t * step
 * for token t, base = mla_region_base(d, r, b) and step =
 * mla_region_step(d, r), a step of 0 meaning the view's token stride (region
 * 0 unchunked). A read of n bytes from b is one run when it stays inside a
 * piece (layout validation keeps every 8-dim quantum and every scale so). */
MLA_HD MLA_CONSTEXPR int64_t mla_region_base(const mla_layout_desc *d, int r, int64_t b) {
  return d->region_off[r] +
         (d->region_chunk[r] > 0 ? b / d->region_chunk[r] * d->region_chunk[r] * d->block_size + b % d->region_chunk[r] : b);
}
MLA_HD MLA_CONSTEXPR int64_t mla_region_step(const mla_layout_desc *d, int r) {
  return d->region_chunk[r] > 0 ? d->region_chunk[r] : r == 0 ? 0 : d->region_row_bytes[r];
}
/* Byte b of token t's row in region r of page `page` of a view: the one
 * address rule every reader of a cache uses (references, generic kernels,
 * the fuzzer). */
MLA_HD unsigned char *mla_view_byte(const mla_layout_desc *d, const mla_cache_view *v, int64_t page, int64_t t, int r,
                                    int64_t b) {
  const int64_t step = mla_region_step(d, r);
  return v->base + page * v->page_stride + mla_region_base(d, r, b) + t * (step ? step : v->token_stride);
}
/* A chunked region copied in units of `gran` bytes (gran divides the piece):
 * unit i of a token's row is unit i % upp of piece i / upp (upp = piece /
 * gran), pieces pstride = block_size x piece bytes apart; the offset is from
 * the token's first piece. `shift` = log2(upp) where upp is a power of two
 * (mla_log2_exact, else -1) spares the division. */
MLA_HD int mla_log2_exact(int n) {
  for (int k = 0; k < 31; k++)
    if (n == 1 << k) return k;
  return -1;
}
MLA_HD int64_t mla_piece_unit_off(int i, int gran, int upp, int shift, int64_t pstride) {
  const unsigned piece = shift >= 0 ? (unsigned)i >> shift : (unsigned)i / (unsigned)upp;
  return (int64_t)piece * pstride + (i - (int)piece * upp) * gran;
}
/* Whether any region is chunked (kernels that address whole rows take only unchunked layouts). */
MLA_HD MLA_CONSTEXPR int mla_layout_chunked(const mla_layout_desc *d) {
  for (int r = 0; r < MLA_LAYOUT_MAX_REGIONS; r++)
    if (r < d->nregions && d->region_chunk[r] > 0) return 1;
  return 0;
}

#endif
