/* Lua bindings for layout descriptors and the CPU cache reference:
 * core.layout_pack(table) -> string, core.layout_unpack(string) -> table,
 * core.layout_check(desc) -> true | false, message (fields named fields[i], 0-based as in C),
 * core.ref_write(desc, pages, x, slots [, tensor_scale]),
 * core.ref_read(desc, pages, slots, out [, tensor_scale]);
 * plus mla_check_layout_desc / mla_check_cache_view for every binding that
 * takes a layout and a cache (declared in l_common.h). */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "l_common.h"
#include "layout_check.h"
#include "mla_error.h"
#include "ref/layout_ref.h"

/* luaL_error without lua_pushfstring's format limits (%lld, %g). */
static int lerrf(lua_State *L, const char *fmt, ...) MLA_PRINTF(2, 3);
static int lerrf(lua_State *L, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return luaL_error(L, "%s", buf);
}

static const char *const ROLE_NAMES[] = {"data", "pad", NULL};
static const char *const KIND_NAMES[] = {"none", "tensor", "group", NULL};
static const char *const POLICY_NAMES[] = {"pow2", "amax", NULL};

/* ---- packing ------------------------------------------------------------ */

/* Every key a descriptor table may hold; `name` is carried for people. */
static const char *const DESC_KEYS[] = {"dim", "k_dims", "v_dims", "nfields", "nregions", "block_size", "region_chunk",
                                        "region_row_bytes", "region_off", "page_bytes", "page_align",
                                        "token_align", "fields", "name", NULL};
static const char *const FIELD_KEYS[] = {"role", "dtype", "dim_lo", "count", "region", "byte_off", "scale_kind",
                                         "group", "scale_dtype", "scale_region", "scale_off", "scale_policy",
                                         "eps_on_amax", "qmax", "eps", "scale_min", "scale_max", "name", NULL};

static void check_keys(lua_State *L, int t, const char *const *keys, const char *where) {
  lua_pushnil(L);
  while (lua_next(L, t)) {
    int known = 0;
    if (lua_type(L, -2) == LUA_TSTRING)
      for (const char *const *k = keys; *k && !known; k++) known = strcmp(*k, lua_tostring(L, -2)) == 0;
    if (!known) {
      lua_pushvalue(L, -2);
      lerrf(L, "layout_pack: %s has an unknown key '%s' (expected the members of %s)", where,
                 luaL_tolstring(L, -1, NULL), strcmp(where, "the descriptor") ? "mla_layout_field" : "mla_layout_desc");
    }
    lua_pop(L, 1);
  }
}

/* Integer member (nil -> def; booleans read as 0/1). */
static int64_t get_int(lua_State *L, int t, const char *key, int64_t def, const char *where) {
  int ty = lua_getfield(L, t, key);
  int64_t v = def;
  if (ty == LUA_TBOOLEAN) v = lua_toboolean(L, -1);
  else if (ty != LUA_TNIL) {
    int ok;
    v = lua_tointegerx(L, -1, &ok);
    if (!ok || ty != LUA_TNUMBER) lerrf(L, "layout_pack: %s.%s must be an integer, got %s", where, key, luaL_typename(L, -1));
  }
  lua_pop(L, 1);
  return v;
}

static int32_t get_i32(lua_State *L, int t, const char *key, int64_t def, const char *where) {
  int64_t v = get_int(L, t, key, def, where);
  if (v < INT32_MIN || v > INT32_MAX) lerrf(L, "layout_pack: %s.%s = %lld does not fit in 32 bits", where, key, (long long)v);
  return (int32_t)v;
}

static float get_float(lua_State *L, int t, const char *key, const char *where) {
  int ty = lua_getfield(L, t, key);
  float v = 0.0f;
  if (ty == LUA_TNUMBER) v = (float)lua_tonumber(L, -1);
  else if (ty != LUA_TNIL) lerrf(L, "layout_pack: %s.%s must be a number, got %s", where, key, luaL_typename(L, -1));
  lua_pop(L, 1);
  return v;
}

/* An enumeration given by name or by id. */
static int32_t get_enum(lua_State *L, int t, const char *key, const char *const *names, const char *where) {
  int ty = lua_getfield(L, t, key);
  int32_t v = 0;
  if (ty == LUA_TSTRING) {
    const char *s = lua_tostring(L, -1);
    int i = 0;
    while (names[i] && strcmp(names[i], s)) i++;
    if (!names[i]) {
      luaL_Buffer b;
      luaL_buffinit(L, &b);
      for (int k = 0; names[k]; k++) luaL_addstring(&b, k ? ", " : ""), luaL_addstring(&b, names[k]);
      luaL_pushresult(&b);
      lerrf(L, "layout_pack: %s.%s = '%s' is not one of %s", where, key, s, lua_tostring(L, -1));
    }
    v = i;
  } else if (ty != LUA_TNIL) {
    lua_pop(L, 1);
    return get_i32(L, t, key, 0, where);
  }
  lua_pop(L, 1);
  return v;
}

static int32_t get_dtype(lua_State *L, int t, const char *key, const char *where) {
  int ty = lua_getfield(L, t, key);
  int32_t v = 0;
  if (ty == LUA_TSTRING) {
    mla_dtype dt;
    if (mla_dtype_parse(lua_tostring(L, -1), &dt))
      lerrf(L, "layout_pack: %s.%s = '%s' is not a dtype", where, key, lua_tostring(L, -1));
    v = (int32_t)dt;
  } else if (ty != LUA_TNIL) {
    lua_pop(L, 1);
    return get_i32(L, t, key, 0, where);
  }
  lua_pop(L, 1);
  return v;
}

/* A list of at most MLA_LAYOUT_MAX_REGIONS integers; returns its length. */
static int get_region_list(lua_State *L, int t, const char *key, int64_t *out, int64_t lim) {
  int ty = lua_getfield(L, t, key);
  int n = 0;
  if (ty != LUA_TNIL) {
    if (ty != LUA_TTABLE) lerrf(L, "layout_pack: %s must be a list of integers", key);
    n = (int)luaL_len(L, -1);
    if (n > MLA_LAYOUT_MAX_REGIONS) lerrf(L, "layout_pack: %s has %d entries, at most %d", key, n, MLA_LAYOUT_MAX_REGIONS);
    for (int i = 0; i < n; i++) {
      int ok;
      lua_geti(L, -1, i + 1);
      out[i] = lua_tointegerx(L, -1, &ok);
      if (!ok || out[i] < 0 || out[i] > lim) lerrf(L, "layout_pack: %s[%d] must be an integer in [0, %lld]", key, i + 1, (long long)lim);
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 1);
  return n;
}

static void pack_field(lua_State *L, int t, mla_layout_field *f, const char *where) {
  check_keys(L, t, FIELD_KEYS, where);
  f->role = get_enum(L, t, "role", ROLE_NAMES, where);
  f->dtype = get_dtype(L, t, "dtype", where);
  f->dim_lo = get_i32(L, t, "dim_lo", 0, where);
  f->count = get_i32(L, t, "count", 0, where);
  f->region = get_i32(L, t, "region", 0, where);
  f->byte_off = get_i32(L, t, "byte_off", 0, where);
  f->scale_kind = get_enum(L, t, "scale_kind", KIND_NAMES, where);
  f->group = get_i32(L, t, "group", 0, where);
  f->scale_dtype = get_dtype(L, t, "scale_dtype", where);
  f->scale_region = get_i32(L, t, "scale_region", 0, where);
  f->scale_off = get_i32(L, t, "scale_off", 0, where);
  f->scale_policy = get_enum(L, t, "scale_policy", POLICY_NAMES, where);
  f->eps_on_amax = get_i32(L, t, "eps_on_amax", 0, where);
  f->qmax = get_float(L, t, "qmax", where);
  f->eps = get_float(L, t, "eps", where);
  f->scale_min = get_float(L, t, "scale_min", where);
  f->scale_max = get_float(L, t, "scale_max", where);
}

/* Fills d from the table at t (raising on malformed members; no semantic
 * validation, which mla_layout_check does). */
static void pack_desc(lua_State *L, int t, mla_layout_desc *d) {
  const char *w = "the descriptor";
  luaL_checktype(L, t, LUA_TTABLE);
  check_keys(L, t, DESC_KEYS, w);
  memset(d, 0, sizeof *d); /* canonical bytes: padding and unused slots are zero */
  d->dim = get_i32(L, t, "dim", 0, w);
  d->k_dims = get_i32(L, t, "k_dims", d->dim, w);
  d->v_dims = get_i32(L, t, "v_dims", d->k_dims, w);
  d->block_size = get_i32(L, t, "block_size", 0, w);
  int64_t rows[MLA_LAYOUT_MAX_REGIONS] = {0}, offs[MLA_LAYOUT_MAX_REGIONS] = {0};
  int nr = get_region_list(L, t, "region_row_bytes", rows, INT32_MAX);
  int no = get_region_list(L, t, "region_off", offs, INT64_MAX);
  if (no > nr) lerrf(L, "layout_pack: region_off has %d entries but region_row_bytes only %d", no, nr);
  int64_t chunks[MLA_LAYOUT_MAX_REGIONS] = {0};
  int nc = get_region_list(L, t, "region_chunk", chunks, INT32_MAX);
  if (nc > nr) lerrf(L, "layout_pack: region_chunk has %d entries but region_row_bytes only %d", nc, nr);
  d->nregions = get_i32(L, t, "nregions", nr, w);
  for (int r = 0; r < MLA_LAYOUT_MAX_REGIONS; r++)
    d->region_row_bytes[r] = (int32_t)rows[r], d->region_chunk[r] = (int32_t)chunks[r], d->region_off[r] = offs[r];
  d->page_bytes = get_int(L, t, "page_bytes", 0, w);
  d->page_align = get_i32(L, t, "page_align", 1, w);
  d->token_align = get_i32(L, t, "token_align", 1, w);
  if (lua_getfield(L, t, "fields") != LUA_TTABLE) lerrf(L, "layout_pack: fields must be a list of field tables");
  int nf = (int)luaL_len(L, -1);
  if (nf < 1 || nf > MLA_LAYOUT_MAX_FIELDS) lerrf(L, "layout_pack: %d fields given, 1 to %d allowed", nf, MLA_LAYOUT_MAX_FIELDS);
  for (int i = 0; i < nf; i++) {
    char where[32];
    snprintf(where, sizeof where, "fields[%d]", i); /* 0-based, like the C struct */
    if (lua_geti(L, -1, i + 1) != LUA_TTABLE) lerrf(L, "layout_pack: %s must be a table", where);
    pack_field(L, lua_gettop(L), &d->fields[i], where);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  d->nfields = get_i32(L, t, "nfields", nf, w);
  if (d->nfields != nf) lerrf(L, "layout_pack: nfields = %d but %d fields are listed", d->nfields, nf);
}

static int l_layout_pack(lua_State *L) {
  mla_layout_desc d;
  pack_desc(L, 1, &d);
  if (mla_layout_check(&d)) return mla_lua_errorf(L, "layout_pack");
  lua_pushlstring(L, (const char *)&d, sizeof d);
  return 1;
}

/* ---- unpacking ---------------------------------------------------------- */

static void set_int(lua_State *L, const char *k, int64_t v) { lua_pushinteger(L, (lua_Integer)v), lua_setfield(L, -2, k); }
static void set_num(lua_State *L, const char *k, float v) { lua_pushnumber(L, (lua_Number)v), lua_setfield(L, -2, k); }
static void set_str(lua_State *L, const char *k, const char *v) { lua_pushstring(L, v), lua_setfield(L, -2, k); }
static const char *enum_name(const char *const *names, int n, int32_t v) { return v >= 0 && v < n ? names[v] : NULL; }

static void set_enum(lua_State *L, const char *k, const char *const *names, int n, int32_t v) {
  const char *s = enum_name(names, n, v);
  if (s) set_str(L, k, s);
  else set_int(L, k, v);
}

static void set_dtype(lua_State *L, const char *k, int32_t v) {
  if (v >= 0 && v < MLA_DTYPE_COUNT) set_str(L, k, mla_dtype_name((mla_dtype)v));
  else set_int(L, k, v);
}

static void push_desc(lua_State *L, const mla_layout_desc *d) {
  lua_createtable(L, 0, 12);
  set_int(L, "dim", d->dim), set_int(L, "k_dims", d->k_dims), set_int(L, "v_dims", d->v_dims);
  set_int(L, "nfields", d->nfields), set_int(L, "nregions", d->nregions), set_int(L, "block_size", d->block_size);
  int nr = d->nregions >= 0 && d->nregions <= MLA_LAYOUT_MAX_REGIONS ? d->nregions : MLA_LAYOUT_MAX_REGIONS;
  lua_createtable(L, nr, 0);
  for (int r = 0; r < nr; r++) lua_pushinteger(L, d->region_row_bytes[r]), lua_rawseti(L, -2, r + 1);
  lua_setfield(L, -2, "region_row_bytes");
  lua_createtable(L, nr, 0);
  for (int r = 0; r < nr; r++) lua_pushinteger(L, (lua_Integer)d->region_off[r]), lua_rawseti(L, -2, r + 1);
  lua_setfield(L, -2, "region_off");
  lua_createtable(L, nr, 0);
  for (int r = 0; r < nr; r++) lua_pushinteger(L, d->region_chunk[r]), lua_rawseti(L, -2, r + 1);
  lua_setfield(L, -2, "region_chunk");
  set_int(L, "page_bytes", d->page_bytes), set_int(L, "page_align", d->page_align), set_int(L, "token_align", d->token_align);
  int nf = d->nfields >= 0 && d->nfields <= MLA_LAYOUT_MAX_FIELDS ? d->nfields : MLA_LAYOUT_MAX_FIELDS;
  lua_createtable(L, nf, 0);
  for (int i = 0; i < nf; i++) {
    const mla_layout_field *f = &d->fields[i];
    lua_createtable(L, 0, 17);
    set_enum(L, "role", ROLE_NAMES, 2, f->role), set_dtype(L, "dtype", f->dtype);
    set_int(L, "dim_lo", f->dim_lo), set_int(L, "count", f->count), set_int(L, "region", f->region);
    set_int(L, "byte_off", f->byte_off), set_enum(L, "scale_kind", KIND_NAMES, 3, f->scale_kind);
    set_int(L, "group", f->group), set_dtype(L, "scale_dtype", f->scale_dtype);
    set_int(L, "scale_region", f->scale_region), set_int(L, "scale_off", f->scale_off);
    set_enum(L, "scale_policy", POLICY_NAMES, 2, f->scale_policy), set_int(L, "eps_on_amax", f->eps_on_amax);
    set_num(L, "qmax", f->qmax), set_num(L, "eps", f->eps), set_num(L, "scale_min", f->scale_min);
    set_num(L, "scale_max", f->scale_max);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "fields");
}

/* Copies a packed string into d; raises if the length is wrong. */
static void unpack_string(lua_State *L, int idx, mla_layout_desc *d, const char *fn) {
  size_t n;
  const char *s = lua_tolstring(L, idx, &n);
  if (n != sizeof *d)
    lerrf(L, "%s: a packed layout descriptor has %d bytes, got %d (use core.layout_pack or L:packed(block_size))", fn,
               (int)sizeof *d, (int)n);
  memcpy(d, s, sizeof *d);
}

static int l_layout_unpack(lua_State *L) {
  mla_layout_desc d;
  luaL_checktype(L, 1, LUA_TSTRING);
  unpack_string(L, 1, &d, "layout_unpack");
  push_desc(L, &d);
  return 1;
}

/* layout_check(table | string) -> true | false, message (never raises for
 * an invalid layout; malformed tables still raise). */
static int l_layout_check(lua_State *L) {
  mla_layout_desc d;
  if (lua_type(L, 1) == LUA_TSTRING) unpack_string(L, 1, &d, "layout_check");
  else pack_desc(L, 1, &d);
  if (mla_layout_check(&d)) {
    lua_pushboolean(L, 0);
    lua_pushstring(L, mla_errmsg());
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* ---- descriptors and views for every binding ---------------------------- */

const mla_layout_desc *mla_check_layout_desc(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  if (lua_type(L, idx) != LUA_TSTRING)
    lerrf(L, "bad argument #%d: a packed layout descriptor (string from L:packed(block_size)) expected, got %s", idx,
               luaL_typename(L, idx));
  mla_layout_desc tmp;
  unpack_string(L, idx, &tmp, "layout");
  if (mla_layout_check(&tmp)) lerrf(L, "bad argument #%d: invalid layout descriptor: %s", idx, mla_errmsg());
  const char *s = lua_tostring(L, idx);
  if ((uintptr_t)s % _Alignof(mla_layout_desc) == 0) return (const mla_layout_desc *)(const void *)s;
  /* Lua keeps string bytes 8-aligned on every 64-bit build; if not, an aligned copy takes the argument's place. */
  mla_layout_desc *copy = lua_newuserdatauv(L, sizeof tmp, 0);
  *copy = tmp;
  lua_replace(L, idx);
  return copy;
}

int mla_check_cache_view(lua_State *L, const mla_layout_desc *d, int tensor_idx, int scale_idx, mla_cache_view *v) {
  mla_tensor *t = mla_check_tensor(L, tensor_idx);
  int dev = mla_tensor_device(t);
  const char *w = "pages";
  /* the binding's name, as luaL_argerror gives it: several bindings share this check */
  lua_Debug ar;
  const char *fn = lua_getstack(L, 0, &ar) && lua_getinfo(L, "n", &ar) && ar.name ? ar.name : "?";
  if (t->dtype != MLA_U8) return lerrf(L, "%s: %s (argument #%d) must be a u8 tensor, got %s", fn, w, tensor_idx, mla_dtype_name(t->dtype));
  memset(v, 0, sizeof *v);
  int64_t extent;
  if (t->ndim == 2) {
    if (t->sizes[1] > 1 && t->strides[1] != 1)
      return lerrf(L, "%s: %s (argument #%d): the bytes of a page must be contiguous (stride(1) = %lld)", fn, w, tensor_idx,
                        (long long)t->strides[1]);
    v->token_stride = d->region_row_bytes[0];
    extent = t->sizes[1];
  } else if (t->ndim == 3) {
    if (d->nregions != 1)
      return lerrf(L, "%s: %s (argument #%d): a [pages, block_size, row] view needs a one-region layout; this one has %d regions (pass [pages, page_bytes])",
                        fn, w, tensor_idx, d->nregions);
    if (t->sizes[1] != d->block_size)
      return lerrf(L, "%s: %s (argument #%d): size(1) = %lld but the layout has block_size %d", fn, w, tensor_idx,
                        (long long)t->sizes[1], d->block_size);
    if (t->sizes[2] > 1 && t->strides[2] != 1)
      return lerrf(L, "%s: %s (argument #%d): the bytes of a token row must be contiguous (stride(2) = %lld)", fn, w,
                        tensor_idx, (long long)t->strides[2]);
    if (t->sizes[2] < d->region_row_bytes[0])
      return lerrf(L, "%s: %s (argument #%d): rows of %lld bytes are shorter than the layout's %d-byte token row", fn, w,
                        tensor_idx, (long long)t->sizes[2], d->region_row_bytes[0]);
    v->token_stride = t->strides[1];
    extent = d->region_off[0] + (t->sizes[1] - 1) * t->strides[1] + t->sizes[2];
  } else {
    return lerrf(L, "%s: %s (argument #%d) must be u8 [pages, page_bytes] or [pages, block_size, row], got %d dims", fn, w,
                      tensor_idx, t->ndim);
  }
  v->num_pages = t->sizes[0];
  v->page_stride = t->strides[0]; /* from the tensor, never block_size x row */
  void *p;
  if (mla_tensor_data(t, &p)) return lerrf(L, "%s: %s (argument #%d): %s", fn, w, tensor_idx, mla_errmsg());
  v->base = p;
  if (mla_layout_check_view(d, v, extent)) return lerrf(L, "%s: %s (argument #%d): %s", fn, w, tensor_idx, mla_errmsg());
  if (scale_idx && !lua_isnoneornil(L, scale_idx)) {
    mla_tensor *s = mla_check_tensor(L, scale_idx);
    if (s->dtype != MLA_F32 || mla_tensor_numel(s) != 1)
      return lerrf(L, "%s: tensor_scale (argument #%d) must be an f32 tensor of 1 element, got %s with %lld elements",
                        fn, scale_idx, mla_dtype_name(s->dtype), (long long)mla_tensor_numel(s));
    if (mla_tensor_device(s) != dev) {
      char a[32], b[32];
      return lerrf(L, "%s: tensor_scale (argument #%d) is on %s but the pages are on %s", fn, scale_idx,
                        mla_device_name(mla_tensor_device(s), a, sizeof a), mla_device_name(dev, b, sizeof b));
    }
    if (mla_tensor_data(s, &p)) return lerrf(L, "%s: tensor_scale (argument #%d): %s", fn, scale_idx, mla_errmsg());
    v->tensor_scale = p;
  }
  return dev;
}

/* ---- CPU reference ------------------------------------------------------ */

static void need_cpu(lua_State *L, const mla_tensor *t, const char *fn, const char *name, int arg) {
  if (mla_tensor_device(t) != MLA_CPU)
    lerrf(L, "%s: %s (argument #%d) must be a CPU tensor (the reference runs on the host; use :cpu())", fn, name, arg);
}

/* Slot ids as a contiguous int64 array (a copy when strided); NULL if n = 0. */
static const int64_t *check_slots(lua_State *L, int idx, const char *fn, int64_t *n, mla_tensor *tmp) {
  mla_tensor *s = mla_check_tensor(L, idx);
  if (s->dtype != MLA_I64 || s->ndim != 1)
    lerrf(L, "%s: slots (argument #%d) must be a 1-dim i64 tensor, got %s with %d dims", fn, idx,
               mla_dtype_name(s->dtype), s->ndim);
  need_cpu(L, s, fn, "slots", idx);
  *n = s->sizes[0];
  memset(tmp, 0, sizeof *tmp);
  const mla_tensor *src = s;
  if (!mla_tensor_is_contiguous(s)) {
    if (mla_tensor_empty(tmp, MLA_I64, 1, s->sizes, MLA_CPU) || mla_tensor_copy(tmp, s, NULL)) {
      mla_tensor_release(tmp);
      mla_lua_errorf(L, fn);
    }
    src = tmp;
  }
  void *p;
  if (mla_tensor_data(src, &p)) mla_lua_errorf(L, fn);
  return p;
}

/* Every slot inside the cache, checked before anything is written. */
static int find_bad_slot(const mla_layout_desc *d, const mla_cache_view *v, const int64_t *slots, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (slots[i] >= 0 && slots[i] / d->block_size >= v->num_pages) return (int)(i < INT32_MAX ? i : INT32_MAX);
  return -1;
}

/* An f32 [rows, cols] CPU tensor with contiguous rows. */
static float *check_rows(lua_State *L, int idx, const char *fn, const char *name, int64_t *rows, int64_t *cols,
                         int64_t *row_stride) {
  mla_tensor *t = mla_check_tensor(L, idx);
  if (t->dtype != MLA_F32 || t->ndim != 2)
    lerrf(L, "%s: %s (argument #%d) must be a 2-dim f32 tensor, got %s with %d dims", fn, name, idx,
               mla_dtype_name(t->dtype), t->ndim);
  need_cpu(L, t, fn, name, idx);
  if (t->sizes[1] > 1 && t->strides[1] != 1)
    lerrf(L, "%s: %s (argument #%d) must have contiguous rows (stride(1) = %lld)", fn, name, idx, (long long)t->strides[1]);
  void *p;
  if (mla_tensor_data(t, &p)) mla_lua_errorf(L, fn);
  *rows = t->sizes[0], *cols = t->sizes[1], *row_stride = t->strides[0];
  return p;
}

static void check_view_cpu(lua_State *L, const mla_layout_desc *d, int pages, int scale, mla_cache_view *v, const char *fn) {
  if (mla_check_cache_view(L, d, pages, scale, v) != MLA_CPU)
    lerrf(L, "%s: pages (argument #%d) must be a CPU tensor (the reference runs on the host; use :cpu())", fn, pages);
}

/* core.ref_write(desc, pages, x [>= n, dim] f32, slots [n] i64 [, tensor_scale]) */
static int l_ref_write(lua_State *L) {
  const char *fn = "ref_write";
  const mla_layout_desc *d = mla_check_layout_desc(L, 1);
  mla_cache_view v;
  check_view_cpu(L, d, 2, 5, &v, fn);
  int64_t rows, cols, xs, n;
  const float *x = check_rows(L, 3, fn, "x", &rows, &cols, &xs);
  if (cols != d->dim) return lerrf(L, "%s: x (argument #3) has %lld columns, the layout's row has %d dims", fn, (long long)cols, d->dim);
  mla_tensor tmp;
  const int64_t *slots = check_slots(L, 4, fn, &n, &tmp);
  if (rows < n) {
    mla_tensor_release(&tmp);
    return lerrf(L, "%s: x (argument #3) has %lld rows but slots (argument #4) maps %lld tokens", fn, (long long)rows, (long long)n);
  }
  int bad = find_bad_slot(d, &v, slots, n);
  if (bad >= 0) {
    long long s = (long long)slots[bad];
    mla_tensor_release(&tmp);
    return lerrf(L, "%s: slots[%d] = %lld is past the cache (%lld pages of %d tokens)", fn, bad, s,
                      (long long)v.num_pages, d->block_size);
  }
  int rc = mla_ref_write(d, &v, x, xs, slots, n);
  mla_tensor_release(&tmp);
  if (rc) return mla_lua_errorf(L, fn);
  return 0;
}

/* core.ref_read(desc, pages, slots [n] i64, out [n, ncols] f32 [, tensor_scale]) */
static int l_ref_read(lua_State *L) {
  const char *fn = "ref_read";
  const mla_layout_desc *d = mla_check_layout_desc(L, 1);
  mla_cache_view v;
  check_view_cpu(L, d, 2, 5, &v, fn);
  int64_t rows, cols, os, n;
  float *out = check_rows(L, 4, fn, "out", &rows, &cols, &os);
  if (cols < 1 || cols > d->dim)
    return lerrf(L, "%s: out (argument #4) has %lld columns, expected 1 to the layout's %d dims", fn, (long long)cols, d->dim);
  if (rows > 1 && os < cols)
    return lerrf(L, "%s: out (argument #4) rows overlap (stride(0) = %lld < %lld columns)", fn, (long long)os, (long long)cols);
  mla_tensor tmp;
  const int64_t *slots = check_slots(L, 3, fn, &n, &tmp);
  if (rows != n) {
    mla_tensor_release(&tmp);
    return lerrf(L, "%s: out (argument #4) has %lld rows, slots (argument #3) has %lld", fn, (long long)rows, (long long)n);
  }
  int bad = find_bad_slot(d, &v, slots, n);
  if (bad >= 0) {
    long long s = (long long)slots[bad];
    mla_tensor_release(&tmp);
    return lerrf(L, "%s: slots[%d] = %lld is past the cache (%lld pages of %d tokens)", fn, bad, s,
                      (long long)v.num_pages, d->block_size);
  }
  int rc = mla_ref_read(d, &v, slots, n, out, os, (int)cols);
  mla_tensor_release(&tmp);
  if (rc) return mla_lua_errorf(L, fn);
  return 0;
}

MLA_LUA_MODULE(layout) {
  static const luaL_Reg fns[] = {{"layout_pack", l_layout_pack}, {"layout_unpack", l_layout_unpack},
                                 {"layout_check", l_layout_check}, {"ref_write", l_ref_write},
                                 {"ref_read", l_ref_read}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
