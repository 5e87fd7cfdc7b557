/* libFuzzer target for layout descriptors: arbitrary bytes as a packed
 * mla_layout_desc plus a view geometry go through mla_layout_check and
 * mla_layout_check_view; whatever they accept must be safe for the CPU
 * reference: one quantize and one dequantize of a token on a buffer of
 * exactly the view's size (ASan sees any stray byte), writing only the
 * slot's token rows, zeroing PAD bytes, and deterministically.
 * Input: [desc bytes (sizeof mla_layout_desc, zero-filled if short)]
 *        [8 geometry bytes] [float values for the row ...]
 * Built and run by fuzz/run.
 * fuzz-sources: src/layout_check.c src/ref/layout_ref.c src/dtype.c src/mla_error.c
 * fuzz-flags: -Isrc -Ikernels_rtc/include */
#define _POSIX_C_SOURCE 200112L /* posix_memalign */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout_check.h"
#include "mla_error.h"
#include "ref/layout_ref.h"

/* A broken invariant is a bug: stop so libFuzzer keeps the input. */
#define CHECK(c)                                                                       \
  do {                                                                                 \
    if (!(c)) {                                                                        \
      fprintf(stderr, "layout_fuzz: invariant failed: %s (line %d)\n", #c, __LINE__); \
      abort();                                                                         \
    }                                                                                  \
  } while (0)

#define MAX_BUFFER (4 << 20) /* bytes of cache a case may allocate */

/* Buffer offset of byte b of the slot's row in region r (layout_desc.h: mla_view_byte). */
static int64_t row_byte_off(const mla_layout_desc *d, const mla_cache_view *v, int64_t slot, int r, int64_t b) {
  return mla_view_byte(d, v, slot / d->block_size, slot % d->block_size, r, b) - v->base;
}

/* 1 if byte `off` of the buffer lies in a token row (any region; a chunked one's pieces) of `slot`. */
static int in_slot_rows(const mla_layout_desc *d, const mla_cache_view *v, int64_t slot, int64_t off) {
  for (int r = 0; r < d->nregions; r++) {
    int64_t row = d->region_row_bytes[r], piece = d->region_chunk[r] > 0 ? d->region_chunk[r] : row;
    for (int64_t b = 0; b < row; b += piece) {
      int64_t lo = row_byte_off(d, v, slot, r, b);
      if (off >= lo && off < lo + piece) return 1;
    }
  }
  return 0;
}

static void check_pads_zero(const mla_layout_desc *d, const mla_cache_view *v, int64_t slot) {
  for (int f = 0; f < d->nfields; f++) {
    const mla_layout_field *fd = &d->fields[f];
    if (fd->role != MLA_FIELD_PAD) continue;
    for (int i = 0; i < fd->count; i++) CHECK(v->base[row_byte_off(d, v, slot, fd->region, fd->byte_off + i)] == 0);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mla_layout_desc d;
  memset(&d, 0, sizeof d);
  size_t n = size < sizeof d ? size : sizeof d;
  memcpy(&d, data, n);
  data += n, size -= n;
  if (mla_layout_check(&d)) {
    CHECK(mla_errmsg()[0] != '\0');
    return 0;
  }
  /* accepted: the derived sizes are sane */
  CHECK(d.page_bytes >= d.region_row_bytes[0] && d.page_bytes % d.page_align == 0);

  uint8_t g[8] = {0};
  n = size < sizeof g ? size : sizeof g;
  memcpy(g, data, n);
  data += n, size -= n;
  mla_cache_view v;
  memset(&v, 0, sizeof v);
  v.num_pages = 1 + g[0] % 3;
  v.token_stride = d.region_row_bytes[0] + (int64_t)(g[1] % 3) * d.token_align; /* a chunked region 0 must refuse a wider one */
  int64_t used = d.region_off[0] + (int64_t)(d.block_size - 1) * v.token_stride + d.region_row_bytes[0];
  int64_t need = used > d.page_bytes ? used : d.page_bytes;
  v.page_stride = (need + d.page_align - 1) / d.page_align * d.page_align + (int64_t)(g[2] % 3) * d.page_align;
  if (g[3] & 1) v.page_stride += 1; /* sometimes misaligned on purpose */
  int64_t extent = g[3] & 2 ? used - 1 : v.page_stride;
  if (v.page_stride > MAX_BUFFER / v.num_pages) return 0;
  int64_t total = (v.num_pages - 1) * v.page_stride + extent;
  if (total <= 0) return 0;
  size_t shift = (g[4] & 1) ? 1 : 0; /* sometimes a misaligned base */
  unsigned char *mem = NULL;
  CHECK(posix_memalign((void **)&mem, 256, (size_t)total + shift) == 0);
  v.base = mem + shift;
  if (mla_layout_check_view(&d, &v, extent)) {
    CHECK(mla_errmsg()[0] != '\0');
    free(mem);
    return 0;
  }
  /* accepted views address only [base, base + total) for every slot: ASan checks below */
  for (size_t i = 0; i < (size_t)total; i++) v.base[i] = (unsigned char)(0xA5 ^ i);
  unsigned char *before = malloc((size_t)total);
  CHECK(before != NULL);
  memcpy(before, v.base, (size_t)total);

  float x[MLA_LAYOUT_MAX_DIM], out[MLA_LAYOUT_MAX_DIM];
  for (int i = 0; i < d.dim; i++) {
    x[i] = 0.0f;
    if (size >= 4) memcpy(&x[i], data + (4 * (size_t)i) % (size - size % 4), 4);
  }
  int64_t slot = ((int64_t)g[5] << 8 | g[6]) % (v.num_pages * d.block_size);
  int64_t slots[2] = {slot, -1};
  CHECK(mla_ref_write(&d, &v, x, d.dim, slots, 2) == 0);
  for (int64_t i = 0; i < total; i++)
    if (v.base[i] != before[i]) CHECK(in_slot_rows(&d, &v, slot, i));
  check_pads_zero(&d, &v, slot);

  /* writing the same row again gives the same bytes */
  memcpy(before, v.base, (size_t)total);
  mla_ref_quantize_token(&d, &v, slot, x);
  CHECK(memcmp(before, v.base, (size_t)total) == 0);

  CHECK(mla_ref_read(&d, &v, slots, 2, out, d.dim, d.dim) == 0);
  /* unscaled bf16 / f16 / f32 fields hold exactly what encode gives: decode(encode(x)) is idempotent */
  mla_ref_write(&d, &v, out, d.dim, slots, 1);
  float again[MLA_LAYOUT_MAX_DIM];
  CHECK(mla_ref_read(&d, &v, slots, 1, again, d.dim, d.dim) == 0);
  for (int f = 0; f < d.nfields; f++) {
    const mla_layout_field *fd = &d.fields[f];
    if (fd->role != MLA_FIELD_DATA || fd->scale_kind != MLA_SCALE_NONE) continue;
    for (int e = fd->dim_lo; e < fd->dim_lo + fd->count; e++)
      CHECK(memcmp(&out[e], &again[e], 4) == 0 || (out[e] != out[e] && again[e] != again[e]));
  }
  free(before);
  free(mem);
  return 0;
}
