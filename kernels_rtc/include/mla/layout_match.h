/* Descriptor equality, for picking a compile-time-specialized kernel variant
 * (instantiated from builtin_layouts.h) for a runtime descriptor. Only the
 * meaningful entries are compared: regions below nregions, fields below
 * nfields (constexpr in C++, so variants can be grouped at compile time).
 * `for_reading` ignores what only a writer uses (scale policy, eps,
 * clamps), so one gather variant serves layouts that differ only in how their
 * scales were chosen. */
#ifndef MLA_LAYOUT_MATCH_H
#define MLA_LAYOUT_MATCH_H

#include "layout_desc.h"

MLA_HD MLA_CONSTEXPR int mla_layout_field_same(const mla_layout_field *a, const mla_layout_field *b, int for_reading) {
  if (a->role != b->role || a->dtype != b->dtype || a->dim_lo != b->dim_lo || a->count != b->count ||
      a->region != b->region || a->byte_off != b->byte_off || a->scale_kind != b->scale_kind)
    return 0;
  if (a->scale_kind == MLA_SCALE_GROUP &&
      (a->group != b->group || a->scale_dtype != b->scale_dtype || a->scale_region != b->scale_region ||
       a->scale_off != b->scale_off))
    return 0;
  if (for_reading) return 1;
  return a->scale_policy == b->scale_policy && a->eps_on_amax == b->eps_on_amax && a->qmax == b->qmax &&
         a->eps == b->eps && a->scale_min == b->scale_min && a->scale_max == b->scale_max;
}

MLA_HD MLA_CONSTEXPR int mla_layout_desc_same(const mla_layout_desc *a, const mla_layout_desc *b, int for_reading) {
  if (a->dim != b->dim || a->k_dims != b->k_dims || a->v_dims != b->v_dims || a->nfields != b->nfields ||
      a->nregions != b->nregions || a->block_size != b->block_size || a->page_bytes != b->page_bytes ||
      a->page_align != b->page_align || a->token_align != b->token_align)
    return 0;
  for (int r = 0; r < a->nregions && r < MLA_LAYOUT_MAX_REGIONS; r++)
    if (a->region_row_bytes[r] != b->region_row_bytes[r] || a->region_off[r] != b->region_off[r]) return 0;
  for (int f = 0; f < a->nfields && f < MLA_LAYOUT_MAX_FIELDS; f++)
    if (!mla_layout_field_same(&a->fields[f], &b->fields[f], for_reading)) return 0;
  return 1;
}

#endif
