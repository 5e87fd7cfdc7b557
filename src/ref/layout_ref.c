/* CPU reference quantize / dequantize over a layout descriptor. */
#include "layout_ref.h"

#include <string.h>

#include "dtype.h"
#include "mla/quant_math.h"
#include "mla_error.h"

/* Byte b of the slot's row in region r (layout_desc.h: mla_region_base). */
static unsigned char *row_byte(const mla_layout_desc *d, const mla_cache_view *v, int64_t slot, int r, int64_t b) {
  return mla_view_byte(d, v, slot / d->block_size, slot % d->block_size, r, b);
}

/* Element e of a field as (pointer, index) for mla_load/store_double: the
 * field's row start and e where the region is whole, else the element's own
 * byte (e2m1: the nibble's byte and e % 2) in its piece. */
static unsigned char *elem_at(const mla_layout_desc *d, const mla_cache_view *v, int64_t slot, const mla_layout_field *fd,
                              unsigned char *row, int64_t e, int64_t *idx) {
  if (d->region_chunk[fd->region] <= 0) return *idx = e, row;
  if (fd->dtype == MLA_E2M1) return *idx = e & 1, row_byte(d, v, slot, fd->region, fd->byte_off + e / 2);
  *idx = 0;
  return row_byte(d, v, slot, fd->region, fd->byte_off + e * mla_dtype_size((mla_dtype)fd->dtype));
}

static float tensor_scale(const mla_cache_view *v) { return v->tensor_scale ? *v->tensor_scale : 1.0f; }

static void store_scale(unsigned char *p, int scale_dtype, uint32_t code) {
  int n = mla_scale_size(scale_dtype);
  for (int i = 0; i < n; i++) p[i] = (unsigned char)(code >> (8 * i));
}

static uint32_t load_scale(const unsigned char *p, int scale_dtype) {
  int n = mla_scale_size(scale_dtype);
  uint32_t code = 0;
  for (int i = 0; i < n; i++) code |= (uint32_t)p[i] << (8 * i);
  return code;
}

/* Encodes x / s (or x) into one element of the field's dtype, exactly as the
 * device intrinsics do: fp8 satfinite RNE, e2m1 satfinite RNE, bf16 RNE. */
static void encode_elem(mla_dtype dt, unsigned char *row, int64_t i, float v) {
  mla_store_double(dt, row, i, (double)v, &mla_cvt_default);
}

void mla_ref_quantize_token(const mla_layout_desc *d, const mla_cache_view *v, int64_t slot, const float *x) {
  for (int f = 0; f < d->nfields; f++) {
    const mla_layout_field *fd = &d->fields[f];
    unsigned char *row = row_byte(d, v, slot, fd->region, fd->byte_off);
    if (fd->role == MLA_FIELD_PAD) {
      for (int i = 0; i < fd->count; i++) *row_byte(d, v, slot, fd->region, fd->byte_off + i) = 0;
      continue;
    }
    const float *xs = x + fd->dim_lo;
    mla_dtype dt = (mla_dtype)fd->dtype;
    if (fd->scale_kind == MLA_SCALE_GROUP) {
      for (int g = 0; g < fd->count / fd->group; g++) {
        float amax = 0.0f, dec;
        for (int i = 0; i < fd->group; i++) amax = mla_amax_update(amax, xs[g * fd->group + i]);
        uint32_t code = mla_encode_scale(fd->scale_dtype, mla_group_scale_value(fd, amax), &dec);
        store_scale(row_byte(d, v, slot, fd->scale_region, fd->scale_off + (int64_t)g * mla_scale_size(fd->scale_dtype)),
                    fd->scale_dtype, code);
        for (int i = 0; i < fd->group; i++) {
          int64_t e = (int64_t)g * fd->group + i, k;
          unsigned char *p = elem_at(d, v, slot, fd, row, e, &k);
          encode_elem(dt, p, k, MLA_FDIV(xs[e], dec));
        }
      }
    } else {
      float s = fd->scale_kind == MLA_SCALE_TENSOR ? tensor_scale(v) : 1.0f;
      for (int64_t e = 0; e < fd->count; e++) {
        int64_t k;
        unsigned char *p = elem_at(d, v, slot, fd, row, e, &k);
        encode_elem(dt, p, k, fd->scale_kind == MLA_SCALE_TENSOR ? MLA_FDIV(xs[e], s) : xs[e]);
      }
    }
  }
}

void mla_ref_dequant_token(const mla_layout_desc *d, const mla_cache_view *v, int64_t slot, float *out) {
  for (int f = 0; f < d->nfields; f++) {
    const mla_layout_field *fd = &d->fields[f];
    if (fd->role != MLA_FIELD_DATA) continue;
    unsigned char *row = row_byte(d, v, slot, fd->region, fd->byte_off);
    float ts = tensor_scale(v);
    float s = fd->scale_kind == MLA_SCALE_TENSOR ? ts : 1.0f;
    for (int64_t e = 0; e < fd->count; e++) {
      int64_t k;
      const unsigned char *p = elem_at(d, v, slot, fd, row, e, &k);
      float q = (float)mla_load_double((mla_dtype)fd->dtype, p, k);
      if (fd->scale_kind == MLA_SCALE_GROUP && e % fd->group == 0) {
        int64_t g = e / fd->group, ss = mla_scale_size(fd->scale_dtype);
        s = mla_decode_scale(fd->scale_dtype, load_scale(row_byte(d, v, slot, fd->scale_region, fd->scale_off + g * ss), fd->scale_dtype));
      }
      out[fd->dim_lo + e] = fd->scale_kind == MLA_SCALE_NONE ? q : q * s;
    }
  }
}

static int check_slot(const mla_layout_desc *d, const mla_cache_view *v, int64_t slot, int64_t i) {
  if (slot / d->block_size >= v->num_pages)
    return mla_err("slot %lld (entry %lld) is past the cache (%lld pages of %d tokens)", (long long)slot, (long long)i,
                   (long long)v->num_pages, d->block_size);
  return 0;
}

int mla_ref_write(const mla_layout_desc *d, const mla_cache_view *v, const float *x, int64_t x_stride,
                  const int64_t *slots, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    if (slots[i] < 0) continue;
    if (check_slot(d, v, slots[i], i)) return -1;
    mla_ref_quantize_token(d, v, slots[i], x + i * x_stride);
  }
  return 0;
}

int mla_ref_read(const mla_layout_desc *d, const mla_cache_view *v, const int64_t *slots, int64_t n, float *out,
                 int64_t out_stride, int ncols) {
  float row[4096];
  if (d->dim > 4096) return mla_err("layout dim %d exceeds the reference's 4096", d->dim);
  for (int64_t i = 0; i < n; i++) {
    if (slots[i] < 0) continue;
    if (check_slot(d, v, slots[i], i)) return -1;
    mla_ref_dequant_token(d, v, slots[i], row);
    memcpy(out + i * out_stride, row, sizeof(float) * (size_t)ncols);
  }
  return 0;
}
