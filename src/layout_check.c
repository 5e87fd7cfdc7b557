/* Layout descriptor and cache view validation (see layout_check.h). */
#include "layout_check.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dtype.h"
#include "mla/quant_math.h"
#include "mla_error.h"

int64_t mla_layout_elem_bytes(int dtype, int64_t count) {
  if (dtype == MLA_E2M1) return (count + 1) / 2;
  return count * mla_dtype_size((mla_dtype)dtype);
}

int mla_layout_has_tensor_scale(const mla_layout_desc *d) {
  for (int f = 0; f < d->nfields && f < MLA_LAYOUT_MAX_FIELDS; f++)
    if (d->fields[f].role == MLA_FIELD_DATA && d->fields[f].scale_kind == MLA_SCALE_TENSOR) return 1;
  return 0;
}

static int is_data_dtype(int dt) {
  return dt == MLA_F16 || dt == MLA_BF16 || dt == MLA_F32 || dt == MLA_E4M3 || dt == MLA_E5M2 || dt == MLA_E2M1;
}

static int is_scale_dtype(int dt) { return dt == MLA_F32 || dt == MLA_UE8M0 || dt == MLA_E4M3 || dt == MLA_BF16; }

static const char *dt_name(int dt) {
  return dt >= 0 && dt < MLA_DTYPE_COUNT ? mla_dtype_name((mla_dtype)dt) : "an unknown dtype";
}

/* Byte alignment an element needs at its address (its size; e2m1 and
 * one-byte types need none). */
static int elem_align(int dt) {
  int s = dt == MLA_E2M1 ? 1 : mla_dtype_size((mla_dtype)dt);
  return s > 0 ? s : 1;
}

/* A run of bytes inside one region's token row, for the overlap check. */
typedef struct span {
  int region;
  int64_t lo, hi;
  int field;
  const char *what;
} span;

static int check_aligned(const mla_layout_desc *d, int f, const char *what, int region, int64_t off, int align,
                         const char *dtname) {
  if (off % align)
    return mla_err("fields[%d]: %s at byte %lld of its row is not aligned for %s (needs a multiple of %d)", f, what,
                   (long long)off, dtname, align);
  if (d->token_align % align)
    return mla_err("fields[%d]: %s is %s (%d-byte aligned) but token_align is %d; token_align must be a multiple of %d",
                   f, what, dtname, align, d->token_align, align);
  if (region > 0 && (d->region_off[region] % align || d->region_row_bytes[region] % align))
    return mla_err("fields[%d]: %s is %s in region %d whose offset %lld or row size %d is not a multiple of %d", f,
                   what, dtname, region, (long long)d->region_off[region], d->region_row_bytes[region], align);
  if (d->region_chunk[region] % align)
    return mla_err("fields[%d]: %s is %s in region %d whose pieces of %d bytes are not a multiple of %d", f, what,
                   dtname, region, d->region_chunk[region], align);
  return 0;
}

/* In a chunked region every read unit (an 8-dim quantum, one scale, one
 * padding byte) must lie inside one piece: readers load a unit from one
 * address. Units of `unit` bytes from `lo`, `n` of them. */
static int check_in_pieces(const mla_layout_desc *d, int f, const char *what, int region, int64_t lo, int64_t unit,
                           int64_t n) {
  const int64_t c = d->region_chunk[region];
  if (c <= 0) return 0;
  for (int64_t k = 0; k < n; k++) {
    const int64_t a = lo + k * unit, b = a + unit - 1;
    if (a / c != b / c)
      return mla_err("fields[%d]: %s bytes [%lld, %lld) of region %d straddle its %lld-byte pieces (a reader loads them at once)",
                     f, what, (long long)a, (long long)(b + 1), region, (long long)c);
  }
  return 0;
}

static int check_finite(int f, const char *name, float v, int positive) {
  if (!isfinite(v) || v < 0.0f || (positive && v == 0.0f))
    return mla_err("fields[%d].%s = %g must be a finite %s number", f, name, (double)v,
                   positive ? "positive" : "non-negative");
  return 0;
}

/* Members that mean nothing without group scales must stay zero, so a
 * forgotten scale_kind cannot silently drop a scale. */
static int check_no_group_params(const mla_layout_field *fd, int f) {
  const char *bad = fd->group ? "group" : fd->scale_dtype ? "scale_dtype" : fd->scale_region ? "scale_region"
                  : fd->scale_off ? "scale_off" : fd->scale_policy ? "scale_policy" : fd->eps_on_amax ? "eps_on_amax"
                  : fd->eps != 0.0f ? "eps" : fd->scale_min != 0.0f ? "scale_min" : fd->scale_max != 0.0f ? "scale_max" : NULL;
  if (bad) return mla_err("fields[%d].%s is set but the field has no group scales (scale_kind is not group)", f, bad);
  return 0;
}

static int check_group(const mla_layout_desc *d, const mla_layout_field *fd, int f, span *spans, int *ns) {
  if (fd->group <= 0) return mla_err("fields[%d].group = %d must be > 0 for group scales", f, fd->group);
  if (fd->count % fd->group)
    return mla_err("fields[%d]: group %d does not divide the field's count %d", f, fd->group, fd->count);
  if (fd->group % MLA_LAYOUT_DIM_QUANTUM)
    return mla_err("fields[%d].group = %d must be a multiple of %d (kernels dequantize %d dims under one scale)", f,
                   fd->group, MLA_LAYOUT_DIM_QUANTUM, MLA_LAYOUT_DIM_QUANTUM);
  if (!is_scale_dtype(fd->scale_dtype))
    return mla_err("fields[%d].scale_dtype is %s; a group scale is f32, ue8m0, e4m3 or bf16", f, dt_name(fd->scale_dtype));
  if (fd->scale_region < 0 || fd->scale_region >= d->nregions)
    return mla_err("fields[%d].scale_region = %d is not a region (nregions = %d)", f, fd->scale_region, d->nregions);
  if (fd->scale_policy != MLA_POLICY_POW2 && fd->scale_policy != MLA_POLICY_AMAX)
    return mla_err("fields[%d].scale_policy = %d is neither pow2 (0) nor amax (1)", f, fd->scale_policy);
  if (fd->eps_on_amax != 0 && fd->eps_on_amax != 1)
    return mla_err("fields[%d].eps_on_amax = %d must be 0 or 1", f, fd->eps_on_amax);
  if (check_finite(f, "qmax", fd->qmax, 1) || check_finite(f, "eps", fd->eps, 0) ||
      check_finite(f, "scale_min", fd->scale_min, 0) || check_finite(f, "scale_max", fd->scale_max, 0))
    return -1;
  if (fd->eps == 0.0f && fd->scale_min == 0.0f)
    return mla_err("fields[%d]: group scales need eps > 0 or scale_min > 0 (an all-zero group would get scale 0 and decode to NaN)", f);
  if (fd->scale_min > 0.0f && fd->scale_max > 0.0f && fd->scale_min > fd->scale_max)
    return mla_err("fields[%d]: scale_min %g is above scale_max %g", f, (double)fd->scale_min, (double)fd->scale_max);
  int ss = mla_scale_size(fd->scale_dtype);
  int64_t n = (int64_t)(fd->count / fd->group) * ss, row = d->region_row_bytes[fd->scale_region];
  if (fd->scale_off < 0 || fd->scale_off + n > row)
    return mla_err("fields[%d]: scales at bytes [%d, %lld) fall outside region %d's row of %lld bytes", f, fd->scale_off,
                   (long long)(fd->scale_off + n), fd->scale_region, (long long)row);
  if (check_aligned(d, f, "the scales", fd->scale_region, fd->scale_off, ss, dt_name(fd->scale_dtype))) return -1;
  if (check_in_pieces(d, f, "scale", fd->scale_region, fd->scale_off, ss, fd->count / fd->group)) return -1;
  spans[(*ns)++] = (span){fd->scale_region, fd->scale_off, fd->scale_off + n, f, "scales"};
  return 0;
}

static int check_field(const mla_layout_desc *d, int f, unsigned char *covered, span *spans, int *ns) {
  const mla_layout_field *fd = &d->fields[f];
  if (fd->role != MLA_FIELD_DATA && fd->role != MLA_FIELD_PAD)
    return mla_err("fields[%d].role = %d is neither data (0) nor pad (1)", f, fd->role);
  if (fd->region < 0 || fd->region >= d->nregions)
    return mla_err("fields[%d].region = %d is not a region (nregions = %d)", f, fd->region, d->nregions);
  if (fd->count <= 0) return mla_err("fields[%d].count = %d must be > 0", f, fd->count);
  int64_t row = d->region_row_bytes[fd->region];
  if (fd->role == MLA_FIELD_PAD) {
    if (fd->dtype != MLA_U8) return mla_err("fields[%d] is padding and must have dtype u8, not %s", f, dt_name(fd->dtype));
    if (fd->scale_kind != MLA_SCALE_NONE) return mla_err("fields[%d] is padding and cannot have a scale", f);
    if (fd->dim_lo != 0) return mla_err("fields[%d] is padding and stores no dims (dim_lo must be 0)", f);
    if (check_no_group_params(fd, f)) return -1;
    if (fd->byte_off < 0 || fd->byte_off + (int64_t)fd->count > row)
      return mla_err("fields[%d]: padding bytes [%d, %lld) fall outside region %d's row of %lld bytes", f, fd->byte_off,
                     (long long)fd->byte_off + fd->count, fd->region, (long long)row);
    spans[(*ns)++] = (span){fd->region, fd->byte_off, fd->byte_off + (int64_t)fd->count, f, "padding"};
    return 0;
  }
  if (!is_data_dtype(fd->dtype))
    return mla_err("fields[%d].dtype is %s; stored values are f16, bf16, f32, e4m3, e5m2 or e2m1", f, dt_name(fd->dtype));
  if (fd->dim_lo < 0 || (int64_t)fd->dim_lo + fd->count > d->dim)
    return mla_err("fields[%d] stores dims [%d, %lld), outside the row of %d dims", f, fd->dim_lo,
                   (long long)fd->dim_lo + fd->count, d->dim);
  if (fd->dim_lo % MLA_LAYOUT_DIM_QUANTUM || fd->count % MLA_LAYOUT_DIM_QUANTUM)
    return mla_err("fields[%d] stores dims [%d, %d): start and count must be multiples of %d (kernels read 8 dims at once)",
                   f, fd->dim_lo, fd->dim_lo + fd->count, MLA_LAYOUT_DIM_QUANTUM);
  int64_t nb = mla_layout_elem_bytes(fd->dtype, fd->count);
  if (fd->byte_off < 0 || fd->byte_off + nb > row)
    return mla_err("fields[%d]: %d x %s at bytes [%d, %lld) fall outside region %d's row of %lld bytes", f, fd->count,
                   dt_name(fd->dtype), fd->byte_off, (long long)(fd->byte_off + nb), fd->region, (long long)row);
  if (check_aligned(d, f, "the data", fd->region, fd->byte_off, elem_align(fd->dtype), dt_name(fd->dtype))) return -1;
  if (check_in_pieces(d, f, "8-dim", fd->region, fd->byte_off, mla_layout_elem_bytes(fd->dtype, MLA_LAYOUT_DIM_QUANTUM),
                      fd->count / MLA_LAYOUT_DIM_QUANTUM))
    return -1;
  spans[(*ns)++] = (span){fd->region, fd->byte_off, fd->byte_off + nb, f, "data"};
  for (int i = fd->dim_lo; i < fd->dim_lo + fd->count; i++) {
    if (covered[i]) return mla_err("fields[%d]: dim %d is already stored by another field", f, i);
    covered[i] = 1;
  }
  switch (fd->scale_kind) {
  case MLA_SCALE_NONE:
  case MLA_SCALE_TENSOR:
    if (check_no_group_params(fd, f)) return -1;
    if (!isfinite(fd->qmax) || fd->qmax < 0.0f) return mla_err("fields[%d].qmax = %g must be finite and >= 0", f, (double)fd->qmax);
    return 0;
  case MLA_SCALE_GROUP: return check_group(d, fd, f, spans, ns);
  default: return mla_err("fields[%d].scale_kind = %d is none (0), tensor (1) or group (2)", f, fd->scale_kind);
  }
}

static int check_header(const mla_layout_desc *d) {
  if (d->dim < 1 || d->dim > MLA_LAYOUT_MAX_DIM) return mla_err("dim = %d must be in [1, %d]", d->dim, MLA_LAYOUT_MAX_DIM);
  if (d->k_dims < 1 || d->k_dims > d->dim) return mla_err("k_dims = %d must be in [1, dim = %d]", d->k_dims, d->dim);
  if (d->v_dims < 0 || d->v_dims > d->k_dims)
    return mla_err("v_dims = %d must be in [0, k_dims = %d] (V is a prefix of K)", d->v_dims, d->k_dims);
  if (d->nfields < 1 || d->nfields > MLA_LAYOUT_MAX_FIELDS)
    return mla_err("nfields = %d must be in [1, %d]", d->nfields, MLA_LAYOUT_MAX_FIELDS);
  if (d->nregions < 1 || d->nregions > MLA_LAYOUT_MAX_REGIONS)
    return mla_err("nregions = %d must be in [1, %d]", d->nregions, MLA_LAYOUT_MAX_REGIONS);
  if (d->block_size < 1 || d->block_size > MLA_LAYOUT_MAX_BLOCK_SIZE)
    return mla_err("block_size = %d must be in [1, %d]", d->block_size, MLA_LAYOUT_MAX_BLOCK_SIZE);
  if (d->token_align < 1 || d->token_align > 256 || (d->token_align & (d->token_align - 1)))
    return mla_err("token_align = %d must be a power of two in [1, 256]", d->token_align);
  if (d->page_align < 1 || d->page_align > MLA_LAYOUT_MAX_ROW_BYTES)
    return mla_err("page_align = %d must be in [1, %d]", d->page_align, MLA_LAYOUT_MAX_ROW_BYTES);
  if (d->page_align % d->token_align)
    return mla_err("page_align = %d must be a multiple of token_align = %d (every page starts a token row)", d->page_align,
                   d->token_align);
  return 0;
}

static int check_regions(const mla_layout_desc *d) {
  int64_t end = 0;
  for (int r = 0; r < MLA_LAYOUT_MAX_REGIONS; r++) {
    int64_t off = d->region_off[r], row = d->region_row_bytes[r];
    int64_t c = d->region_chunk[r];
    if (r >= d->nregions) {
      if (off || row || c)
        return mla_err("region_row_bytes[%d] / region_off[%d] / region_chunk[%d] must be 0 past nregions = %d", r, r, r,
                       d->nregions);
      continue;
    }
    if (row < 1 || row > MLA_LAYOUT_MAX_ROW_BYTES)
      return mla_err("region_row_bytes[%d] = %lld must be in [1, %d]", r, (long long)row, MLA_LAYOUT_MAX_ROW_BYTES);
    if (c < 0 || c >= row || (c && row % c))
      return mla_err("region_chunk[%d] = %lld must be 0 (rows whole) or a divisor of the %lld-byte row below it", r,
                     (long long)c, (long long)row);
    if (r == 0 && c % d->token_align)
      return mla_err("region_chunk[0] = %lld must keep token pieces at multiples of token_align = %d", (long long)c,
                     d->token_align);
    if (off < 0 || off > MLA_LAYOUT_MAX_PAGE_BYTES)
      return mla_err("region_off[%d] = %lld is out of range [0, 2^42]", r, (long long)off);
    int64_t hi = off + row * d->block_size;
    for (int q = 0; q < r; q++) {
      int64_t qlo = d->region_off[q], qhi = qlo + (int64_t)d->region_row_bytes[q] * d->block_size;
      if (off < qhi && qlo < hi)
        return mla_err("region %d (bytes [%lld, %lld) of the page) overlaps region %d (bytes [%lld, %lld))", r,
                       (long long)off, (long long)hi, q, (long long)qlo, (long long)qhi);
    }
    if (hi > end) end = hi;
  }
  if (d->region_off[0] % d->token_align || d->region_row_bytes[0] % d->token_align)
    return mla_err("region 0 (offset %lld, row %d bytes) must keep token rows at multiples of token_align = %d",
                   (long long)d->region_off[0], d->region_row_bytes[0], d->token_align);
  if (d->page_bytes < end)
    return mla_err("page_bytes = %lld is smaller than the regions' end %lld", (long long)d->page_bytes, (long long)end);
  if (d->page_bytes > MLA_LAYOUT_MAX_PAGE_BYTES) return mla_err("page_bytes = %lld exceeds 2^42", (long long)d->page_bytes);
  if (d->page_bytes % d->page_align)
    return mla_err("page_bytes = %lld is not a multiple of page_align = %d", (long long)d->page_bytes, d->page_align);
  return 0;
}

int mla_layout_check(const mla_layout_desc *d) {
  if (check_header(d) || check_regions(d)) return -1;
  unsigned char covered[MLA_LAYOUT_MAX_DIM];
  span spans[2 * MLA_LAYOUT_MAX_FIELDS];
  int ns = 0;
  memset(covered, 0, sizeof covered);
  for (int f = 0; f < d->nfields; f++)
    if (check_field(d, f, covered, spans, &ns)) return -1;
  for (int i = 0; i < d->dim; i++)
    if (!covered[i]) return mla_err("dim %d of the %d-dim row is stored by no field", i, d->dim);
  for (int a = 0; a < ns; a++)
    for (int b = 0; b < a; b++)
      if (spans[a].region == spans[b].region && spans[a].lo < spans[b].hi && spans[b].lo < spans[a].hi)
        return mla_err("fields[%d]: %s at bytes [%lld, %lld) of region %d overlaps the %s of fields[%d] at [%lld, %lld)",
                       spans[a].field, spans[a].what, (long long)spans[a].lo, (long long)spans[a].hi, spans[a].region,
                       spans[b].what, spans[b].field, (long long)spans[b].lo, (long long)spans[b].hi);
  return 0;
}

/* End of the bytes a page's regions use, with region 0 rows token_stride apart. */
static int64_t used_end(const mla_layout_desc *d, int64_t token_stride) {
  int64_t end = d->region_off[0] + (int64_t)(d->block_size - 1) * token_stride + d->region_row_bytes[0];
  for (int r = 1; r < d->nregions; r++) {
    int64_t hi = d->region_off[r] + (int64_t)d->region_row_bytes[r] * d->block_size;
    if (hi > end) end = hi;
  }
  return end;
}

int mla_layout_check_view(const mla_layout_desc *d, const mla_cache_view *v, int64_t page_extent) {
  if (v->num_pages < 0) return mla_err("the view has %lld pages", (long long)v->num_pages);
  int64_t row0 = d->region_row_bytes[0];
  if (v->token_stride < row0 || v->token_stride > MLA_LAYOUT_MAX_PAGE_BYTES)
    return mla_err("token stride %lld bytes is smaller than the layout's token row of %lld bytes",
                   (long long)v->token_stride, (long long)row0);
  if (d->region_chunk[0] > 0 && v->token_stride != row0)
    return mla_err("token stride %lld bytes differs from the row of %lld bytes; a chunked layout fixes it (pass [pages, page_bytes])",
                   (long long)v->token_stride, (long long)row0);
  if (d->nregions > 1 && v->token_stride != row0)
    return mla_err("token stride %lld bytes differs from the row of %lld bytes; a page-split layout (%d regions) fixes it",
                   (long long)v->token_stride, (long long)row0, d->nregions);
  if (v->token_stride % d->token_align)
    return mla_err("token stride %lld bytes is not a multiple of the layout's token_align %d", (long long)v->token_stride,
                   d->token_align);
  int64_t need = used_end(d, v->token_stride);
  if (page_extent < need)
    return mla_err("each page of the view spans %lld bytes but the layout uses %lld", (long long)page_extent, (long long)need);
  if (v->page_stride < 0 || v->page_stride % d->page_align)
    return mla_err("page stride %lld bytes is not a multiple of the layout's page_align %d", (long long)v->page_stride,
                   d->page_align);
  if (v->num_pages > 1) {
    int64_t min = need > d->page_bytes ? need : d->page_bytes;
    if (v->page_stride < min)
      return mla_err("page stride %lld bytes is smaller than the layout's page of %lld bytes", (long long)v->page_stride,
                     (long long)min);
    if (v->page_stride > INT64_MAX / v->num_pages)
      return mla_err("%lld pages of %lld bytes overflow 64-bit offsets", (long long)v->num_pages, (long long)v->page_stride);
  }
  if ((uintptr_t)v->base % (uintptr_t)d->token_align)
    return mla_err("the view's first byte is not %d-byte aligned (token_align); check its storage offset", d->token_align);
  return 0;
}
