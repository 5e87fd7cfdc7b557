/* Lua bindings for tensors: creation, views, copies, element access. */
#include <math.h>
#include <string.h>

#include "device.h"
#include "l_common.h"
#include "mla_error.h"

/* ---- shared helpers ---------------------------------------------------- */

int mla_lua_error(lua_State *L) { return luaL_error(L, "%s", mla_errmsg()); }
int mla_lua_errorf(lua_State *L, const char *fn) { return luaL_error(L, "%s: %s", fn, mla_errmsg()); }

mla_tensor *mla_test_tensor(lua_State *L, int idx) { return luaL_testudata(L, idx, MLA_TENSOR_MT); }

mla_tensor *mla_check_tensor(lua_State *L, int idx) {
  mla_tensor *t = luaL_checkudata(L, idx, MLA_TENSOR_MT);
  if (!t->storage) luaL_argerror(L, idx, "attempt to use a closed tensor");
  return t;
}

mla_tensor *mla_push_tensor(lua_State *L) {
  mla_tensor *t = lua_newuserdatauv(L, sizeof(mla_tensor), 1);
  memset(t, 0, sizeof *t);
  luaL_setmetatable(L, MLA_TENSOR_MT);
  return t;
}

mla_dtype mla_check_dtype(lua_State *L, int idx) {
  const char *s = luaL_checkstring(L, idx);
  mla_dtype t;
  if (mla_dtype_parse(s, &t))
    return (mla_dtype)luaL_error(L, "unknown dtype '%s' (u8 i8 u16 i16 i32 i64 f16 bf16 f32 f64 e4m3 e5m2 ue8m0 e2m1)", s);
  return t;
}

mla_dtype mla_opt_dtype(lua_State *L, int idx, mla_dtype def) {
  return lua_isnoneornil(L, idx) ? def : mla_check_dtype(L, idx);
}

int mla_opt_field(lua_State *L, int idx, const char *name) {
  if (lua_istable(L, idx)) return lua_getfield(L, idx, name);
  lua_pushnil(L);
  return LUA_TNIL;
}

int mla_check_shape(lua_State *L, int idx, int64_t *sizes) {
  int n = 0;
  if (lua_istable(L, idx)) {
    n = (int)luaL_len(L, idx);
    if (n > MLA_MAX_DIMS) return luaL_error(L, "shape has %d dims, at most %d are supported", n, MLA_MAX_DIMS);
    for (int i = 0; i < n; i++) {
      lua_geti(L, idx, i + 1);
      int ok;
      lua_Integer v = lua_tointegerx(L, -1, &ok);
      if (!ok) return luaL_error(L, "shape entry %d is not an integer (%s)", i + 1, luaL_typename(L, -1));
      sizes[i] = v;
      lua_pop(L, 1);
    }
    return n;
  }
  for (int i = idx; !lua_isnoneornil(L, i) && lua_isinteger(L, i); i++) {
    if (n == MLA_MAX_DIMS) return luaL_error(L, "shape has more than %d dims", MLA_MAX_DIMS);
    sizes[n++] = lua_tointeger(L, i);
  }
  return n;
}

/* Options after the shape: a table {dtype=, device=} or (dtype, device). */
static void creation_opts(lua_State *L, int idx, mla_dtype *dtype, int *device, mla_dtype def) {
  if (lua_istable(L, idx)) {
    mla_opt_field(L, idx, "dtype");
    *dtype = lua_isnil(L, -1) ? def : mla_check_dtype(L, lua_gettop(L));
    lua_pop(L, 1);
    mla_opt_field(L, idx, "device");
    *device = mla_opt_device(L, lua_gettop(L));
    lua_pop(L, 1);
  } else {
    *dtype = mla_opt_dtype(L, idx, def);
    *device = mla_opt_device(L, idx + 1);
  }
}

static mla_tensor *new_tensor(lua_State *L, mla_dtype dtype, int ndim, const int64_t *sizes, int device) {
  mla_tensor *t = mla_push_tensor(L);
  if (mla_tensor_empty(t, dtype, ndim, sizes, device)) mla_lua_error(L);
  return t;
}

/* ---- creation ---------------------------------------------------------- */

static int l_empty(lua_State *L) {
  int64_t sz[MLA_MAX_DIMS];
  luaL_checktype(L, 1, LUA_TTABLE);
  int n = mla_check_shape(L, 1, sz), dev;
  mla_dtype dt;
  creation_opts(L, 2, &dt, &dev, MLA_F32);
  new_tensor(L, dt, n, sz, dev);
  return 1;
}

static int l_full(lua_State *L) {
  int64_t sz[MLA_MAX_DIMS];
  luaL_checktype(L, 1, LUA_TTABLE);
  int n = mla_check_shape(L, 1, sz), dev;
  double v = luaL_checknumber(L, 2);
  mla_dtype dt;
  creation_opts(L, 3, &dt, &dev, MLA_F32);
  mla_tensor *t = new_tensor(L, dt, n, sz, dev);
  if (mla_tensor_fill(t, v)) return mla_lua_errorf(L, "full");
  return 1;
}

static int l_arange(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  int dev;
  mla_dtype dt;
  creation_opts(L, 2, &dt, &dev, MLA_I64);
  int64_t sz[1] = {n};
  mla_tensor host;
  if (mla_tensor_empty(&host, dt, 1, sz, MLA_CPU)) return mla_lua_errorf(L, "arange");
  for (int64_t i = 0; i < n; i++) {
    if (dt == MLA_I64) ((int64_t *)host.storage->data)[i] = i;
    else mla_store_double(dt, host.storage->data, i, (double)i, NULL);
  }
  mla_tensor *t = new_tensor(L, dt, 1, sz, dev);
  int rc = mla_tensor_copy(t, &host, NULL);
  mla_tensor_release(&host);
  if (rc) return mla_lua_errorf(L, "arange");
  return 1;
}

/* mla.core.random(shape, kind, seed, a, b, dtype, device) */
static int l_random(lua_State *L) {
  int64_t sz[MLA_MAX_DIMS];
  luaL_checktype(L, 1, LUA_TTABLE);
  int n = mla_check_shape(L, 1, sz);
  static const char *const kinds[] = {"uniform", "normal", "bits", NULL};
  int kind = luaL_checkoption(L, 2, NULL, kinds);
  lua_Integer seed = luaL_checkinteger(L, 3);
  double a = luaL_optnumber(L, 4, 0.0), b = luaL_optnumber(L, 5, 1.0);
  mla_dtype dt = mla_opt_dtype(L, 6, kind == 2 ? MLA_U8 : MLA_F32);
  int dev = mla_opt_device(L, 7);
  mla_tensor *t = new_tensor(L, dt, n, sz, dev);
  if (mla_tensor_random(t, (uint64_t)seed, (mla_rng_kind)kind, a, b)) return mla_lua_errorf(L, "random");
  return 1;
}

/* t:random_(kind, seed, a, b): fill an existing view in place */
static int l_random_(lua_State *L) {
  mla_tensor *t = mla_check_tensor(L, 1);
  static const char *const kinds[] = {"uniform", "normal", "bits", NULL};
  int kind = luaL_checkoption(L, 2, NULL, kinds);
  lua_Integer seed = luaL_checkinteger(L, 3);
  if (mla_tensor_random(t, (uint64_t)seed, (mla_rng_kind)kind, luaL_optnumber(L, 4, 0.0), luaL_optnumber(L, 5, 1.0)))
    return mla_lua_errorf(L, "random_");
  lua_settop(L, 1);
  return 1;
}

/* nested table -> shape */
static int table_shape(lua_State *L, int idx, int64_t *sz) {
  int n = 0;
  lua_pushvalue(L, idx);
  while (lua_istable(L, -1)) {
    if (n == MLA_MAX_DIMS) return luaL_error(L, "tensor: nested deeper than %d", MLA_MAX_DIMS);
    sz[n++] = (int64_t)luaL_len(L, -1);
    if (sz[n - 1] == 0) break;
    lua_geti(L, -1, 1);
    lua_remove(L, -2);
  }
  lua_pop(L, 1);
  return n;
}

static void fill_from_table(lua_State *L, int idx, mla_tensor *t, int dim, int64_t *pos) {
  int64_t n = (int64_t)luaL_len(L, idx);
  if (n != t->sizes[dim]) luaL_error(L, "tensor: ragged table at depth %d (%I vs %I)", dim + 1, (lua_Integer)n, (lua_Integer)t->sizes[dim]);
  for (int64_t i = 1; i <= n; i++) {
    lua_geti(L, idx, i);
    if (dim + 1 < t->ndim) {
      if (!lua_istable(L, -1)) luaL_error(L, "tensor: expected a table at depth %d", dim + 2);
      fill_from_table(L, lua_gettop(L), t, dim + 1, pos);
    } else {
      int isnum;
      if (lua_isinteger(L, -1) && t->dtype == MLA_I64) ((int64_t *)t->storage->data)[(*pos)++] = lua_tointeger(L, -1);
      else {
        double v = lua_tonumberx(L, -1, &isnum);
        if (!isnum) luaL_error(L, "tensor: element is a %s, not a number", luaL_typename(L, -1));
        mla_store_double(t->dtype, t->storage->data, (*pos)++, v, NULL);
      }
    }
    lua_pop(L, 1);
  }
}

static int l_tensor(lua_State *L) {
  int64_t sz[MLA_MAX_DIMS];
  int dev;
  mla_dtype dt;
  if (!lua_istable(L, 1)) { /* scalar */
    double v = luaL_checknumber(L, 1);
    creation_opts(L, 2, &dt, &dev, MLA_F32);
    mla_tensor *t = new_tensor(L, dt, 0, sz, dev);
    if (mla_tensor_fill(t, v)) return mla_lua_errorf(L, "tensor");
    return 1;
  }
  int n = table_shape(L, 1, sz);
  creation_opts(L, 2, &dt, &dev, MLA_F32);
  mla_tensor host;
  if (mla_tensor_empty(&host, dt, n, sz, MLA_CPU)) return mla_lua_errorf(L, "tensor");
  int64_t pos = 0;
  mla_tensor *t = mla_push_tensor(L);
  *t = host; /* owned by the userdata from here, so an error below does not leak it */
  if (n > 0 && sz[0] > 0) fill_from_table(L, 1, t, 0, &pos);
  if (dev != MLA_CPU) {
    mla_tensor *g = new_tensor(L, dt, n, sz, dev);
    if (mla_tensor_copy(g, t, NULL)) return mla_lua_errorf(L, "tensor");
  }
  return 1;
}

/* ---- metadata ---------------------------------------------------------- */

static void push_i64_list(lua_State *L, const int64_t *v, int n) {
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) lua_pushinteger(L, v[i]), lua_rawseti(L, -2, i + 1);
}

static int check_dim_arg(lua_State *L, const mla_tensor *t, int idx) {
  lua_Integer d = luaL_checkinteger(L, idx);
  if (d < 0) d += t->ndim;
  if (d < 0 || d >= t->ndim) return luaL_error(L, "dim %d out of range for a %d-dim tensor", (int)lua_tointeger(L, idx), t->ndim);
  return (int)d;
}

static int l_size(lua_State *L) {
  mla_tensor *t = mla_check_tensor(L, 1);
  if (lua_isnoneornil(L, 2)) push_i64_list(L, t->sizes, t->ndim);
  else lua_pushinteger(L, t->sizes[check_dim_arg(L, t, 2)]);
  return 1;
}

static int l_stride(lua_State *L) {
  mla_tensor *t = mla_check_tensor(L, 1);
  if (lua_isnoneornil(L, 2)) push_i64_list(L, t->strides, t->ndim);
  else lua_pushinteger(L, t->strides[check_dim_arg(L, t, 2)]);
  return 1;
}

static int l_offset(lua_State *L) { lua_pushinteger(L, mla_check_tensor(L, 1)->offset); return 1; }
static int l_numel(lua_State *L) { lua_pushinteger(L, mla_tensor_numel(mla_check_tensor(L, 1))); return 1; }
static int l_dim(lua_State *L) { lua_pushinteger(L, mla_check_tensor(L, 1)->ndim); return 1; }
static int l_is_contiguous(lua_State *L) { lua_pushboolean(L, mla_tensor_is_contiguous(mla_check_tensor(L, 1))); return 1; }

static int l_dtype(lua_State *L) { lua_pushstring(L, mla_dtype_name(mla_check_tensor(L, 1)->dtype)); return 1; }
static int l_device(lua_State *L) {
  char buf[32];
  lua_pushstring(L, mla_device_name(mla_tensor_device(mla_check_tensor(L, 1)), buf, sizeof buf));
  return 1;
}
static int l_is_cuda(lua_State *L) { lua_pushboolean(L, mla_tensor_device(mla_check_tensor(L, 1)) != MLA_CPU); return 1; }

static int l_element_size(lua_State *L) {
  lua_pushnumber(L, mla_dtype_info_of(mla_check_tensor(L, 1)->dtype)->bits / 8.0);
  return 1;
}

static int l_nbytes(lua_State *L) {
  mla_tensor *t = mla_check_tensor(L, 1);
  lua_pushinteger(L, (mla_tensor_numel(t) * mla_dtype_info_of(t->dtype)->bits + 7) / 8);
  return 1;
}

static int l_storage_nbytes(lua_State *L) { lua_pushinteger(L, mla_check_tensor(L, 1)->storage->nbytes); return 1; }

static int l_byte_range(lua_State *L) {
  int64_t lo, hi;
  mla_tensor_byte_range(mla_check_tensor(L, 1), &lo, &hi);
  lua_pushinteger(L, lo), lua_pushinteger(L, hi);
  return 2;
}

static int l_data_ptr(lua_State *L) {
  void *p;
  if (mla_tensor_data(mla_check_tensor(L, 1), &p)) return mla_lua_errorf(L, "data_ptr");
  lua_pushinteger(L, (lua_Integer)(intptr_t)p);
  return 1;
}

static int l_same_storage(lua_State *L) {
  lua_pushboolean(L, mla_check_tensor(L, 1)->storage == mla_check_tensor(L, 2)->storage);
  return 1;
}

/* ---- views -------------------------------------------------------------- */

/* New userdata sharing t's storage; keeps nothing else alive. */
static mla_tensor *push_view(lua_State *L, const mla_tensor *t) {
  mla_tensor *v = mla_push_tensor(L);
  mla_tensor_share(v, t);
  return v;
}

static int l_narrow(lua_State *L) {
  mla_tensor *t = mla_check_tensor(L, 1);
  int d = check_dim_arg(L, t, 2);
  lua_Integer start = luaL_checkinteger(L, 3), len = luaL_checkinteger(L, 4); /* before push_view takes a slot */
  mla_tensor *v = push_view(L, t);
  if (mla_tensor_narrow(v, d, start, len)) return mla_lua_error(L);
  return 1;
}

static int l_select(lua_State *L) {
  mla_tensor *t = mla_check_tensor(L, 1);
  int d = check_dim_arg(L, t, 2);
  lua_Integer i = luaL_checkinteger(L, 3);
  if (i < 0) i += t->sizes[d];
  mla_tensor *v = push_view(L, t);
  if (mla_tensor_select(v, d, i)) return mla_lua_error(L);
  return 1;
}

static int l_permute(lua_State *L) {
  mla_tensor *t = mla_check_tensor(L, 1);
  int perm[MLA_MAX_DIMS];
  int64_t p64[MLA_MAX_DIMS];
  int n = mla_check_shape(L, 2, p64);
  if (n != t->ndim) return luaL_error(L, "permute: %d entries for a %d-dim tensor", n, t->ndim);
  for (int i = 0; i < n; i++) perm[i] = (int)p64[i];
  mla_tensor *v = push_view(L, t);
  if (mla_tensor_permute(v, perm)) return mla_lua_error(L);
  return 1;
}

static int l_transpose(lua_State *L) {
  mla_tensor *t = mla_check_tensor(L, 1);
  int a = check_dim_arg(L, t, 2), b = check_dim_arg(L, t, 3);
  int perm[MLA_MAX_DIMS];
  for (int i = 0; i < t->ndim; i++) perm[i] = i;
  perm[a] = b, perm[b] = a;
  mla_tensor *v = push_view(L, t);
  if (mla_tensor_permute(v, perm)) return mla_lua_error(L);
  return 1;
}

/* t:view(shape...) or t:view(dtype) (byte reinterpretation) */
static int l_view(lua_State *L) {
  mla_tensor *t = mla_check_tensor(L, 1);
  if (lua_type(L, 2) == LUA_TSTRING) {
    mla_dtype dt = mla_check_dtype(L, 2);
    mla_tensor *v = push_view(L, t);
    if (mla_tensor_view_dtype(v, dt)) return mla_lua_error(L);
    return 1;
  }
  int64_t sz[MLA_MAX_DIMS];
  int n = mla_check_shape(L, 2, sz);
  mla_tensor *v = push_view(L, t);
  if (mla_tensor_view(v, n, sz)) return mla_lua_error(L);
  return 1;
}

static int l_reshape(lua_State *L) {
  mla_tensor *t = mla_check_tensor(L, 1);
  int64_t sz[MLA_MAX_DIMS];
  int n = mla_check_shape(L, 2, sz);
  mla_tensor probe = *t;
  if (mla_tensor_view(&probe, n, sz) == 0) {
    mla_tensor *v = push_view(L, t);
    *v = probe;
    return 1;
  }
  mla_tensor *c = new_tensor(L, t->dtype, t->ndim, t->sizes, mla_tensor_device(t));
  if (mla_tensor_copy(c, t, NULL) || mla_tensor_view(c, n, sz)) return mla_lua_errorf(L, "reshape");
  return 1;
}

static int l_as_strided(lua_State *L) {
  mla_tensor *t = mla_check_tensor(L, 1);
  int64_t sz[MLA_MAX_DIMS], st[MLA_MAX_DIMS];
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checktype(L, 3, LUA_TTABLE);
  int n = mla_check_shape(L, 2, sz), m = mla_check_shape(L, 3, st);
  if (n != m) return luaL_error(L, "as_strided: %d sizes but %d strides", n, m);
  lua_Integer offset = luaL_optinteger(L, 4, t->offset); /* before push_view takes slot 4 */
  mla_tensor *v = push_view(L, t);
  if (mla_tensor_as_strided(v, n, sz, st, offset)) return mla_lua_error(L);
  return 1;
}

/* ---- data --------------------------------------------------------------- */

static int l_copy_(lua_State *L) {
  mla_tensor *dst = mla_check_tensor(L, 1), *src = mla_check_tensor(L, 2);
  mla_cvt_opts o = mla_cvt_default;
  if (mla_opt_field(L, 3, "saturate") != LUA_TNIL) o.saturate = lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (mla_opt_field(L, 3, "ue8m0_round") != LUA_TNIL) o.ue8m0_round_up = strcmp(lua_tostring(L, -1), "zero") != 0;
  lua_pop(L, 1);
  if (mla_tensor_copy(dst, src, &o)) return mla_lua_errorf(L, "copy");
  lua_settop(L, 1);
  return 1;
}

/* t:to(dtype | device | {dtype=, device=, saturate=}) -> new tensor (or t itself if nothing changes) */
static int l_to(lua_State *L) {
  mla_tensor *t = mla_check_tensor(L, 1);
  mla_dtype dt = t->dtype;
  int dev = mla_tensor_device(t);
  mla_cvt_opts o = mla_cvt_default;
  if (lua_istable(L, 2)) {
    if (mla_opt_field(L, 2, "dtype") != LUA_TNIL) dt = mla_check_dtype(L, lua_gettop(L));
    lua_pop(L, 1);
    if (mla_opt_field(L, 2, "device") != LUA_TNIL) dev = mla_check_device(L, lua_gettop(L));
    lua_pop(L, 1);
    if (mla_opt_field(L, 2, "saturate") != LUA_TNIL) o.saturate = lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (mla_opt_field(L, 2, "ue8m0_round") != LUA_TNIL) o.ue8m0_round_up = strcmp(lua_tostring(L, -1), "zero") != 0;
    lua_pop(L, 1);
  } else {
    const char *s = luaL_checkstring(L, 2);
    mla_dtype tmp;
    if (mla_dtype_parse(s, &tmp) == 0) dt = tmp;
    else if (strncmp(s, "cpu", 3) == 0 || strncmp(s, "cuda", 4) == 0) dev = mla_check_device(L, 2);
    else
      return luaL_error(L, "to: '%s' is neither a dtype (u8 i8 u16 i16 i32 i64 f16 bf16 f32 f64 e4m3 e5m2 ue8m0 e2m1) "
                           "nor a device (cpu, cuda, cuda:N)", s);
  }
  if (dt == t->dtype && dev == mla_tensor_device(t)) {
    lua_settop(L, 1);
    return 1;
  }
  mla_tensor *c = new_tensor(L, dt, t->ndim, t->sizes, dev);
  if (mla_tensor_copy(c, t, &o)) return mla_lua_errorf(L, "to");
  return 1;
}

static int l_clone(lua_State *L) {
  mla_tensor *t = mla_check_tensor(L, 1);
  mla_tensor *c = new_tensor(L, t->dtype, t->ndim, t->sizes, mla_tensor_device(t));
  if (mla_tensor_copy(c, t, NULL)) return mla_lua_errorf(L, "clone");
  return 1;
}

static int l_contiguous(lua_State *L) {
  mla_tensor *t = mla_check_tensor(L, 1);
  if (mla_tensor_is_contiguous(t) && (t->offset * mla_dtype_info_of(t->dtype)->bits) % 8 == 0) {
    lua_settop(L, 1);
    return 1;
  }
  return l_clone(L);
}

static int l_fill_(lua_State *L) {
  if (mla_tensor_fill(mla_check_tensor(L, 1), luaL_checknumber(L, 2))) return mla_lua_errorf(L, "fill");
  lua_settop(L, 1);
  return 1;
}

/* Reads one element as a Lua number (integer for integer dtypes). */
static void push_elem(lua_State *L, const mla_tensor *t, int64_t e) {
  if (!mla_dtype_info_of(t->dtype)->is_float) lua_pushinteger(L, mla_load_int(t->dtype, t->storage->data, e));
  else lua_pushnumber(L, mla_load_double(t->dtype, t->storage->data, e));
}

/* Element index from a table of coordinates, checked. */
static int64_t coords(lua_State *L, const mla_tensor *t, int idx) {
  int64_t c[MLA_MAX_DIMS] = {0};
  int n = 0;
  if (lua_istable(L, idx)) n = mla_check_shape(L, idx, c);
  else if (lua_isinteger(L, idx)) c[0] = lua_tointeger(L, idx), n = 1;
  if (n != t->ndim) return luaL_error(L, "index has %d coordinates, tensor has %d dims", n, t->ndim);
  for (int i = 0; i < n; i++) {
    if (c[i] < 0) c[i] += t->sizes[i];
    if (c[i] < 0 || c[i] >= t->sizes[i])
      return luaL_error(L, "index %I out of range for dim %d of size %I", (lua_Integer)c[i], i, (lua_Integer)t->sizes[i]);
  }
  return mla_tensor_elem_index(t, c);
}

/* Runs fn on a CPU tensor equal to t (a copy when t lives on a GPU). */
static mla_tensor *host_view(lua_State *L, mla_tensor *t, mla_tensor *tmp) {
  if (mla_tensor_device(t) == MLA_CPU) return t;
  if (mla_tensor_empty(tmp, t->dtype, t->ndim, t->sizes, MLA_CPU) || mla_tensor_copy(tmp, t, NULL)) {
    mla_tensor_release(tmp);
    mla_lua_error(L);
  }
  return tmp;
}

static int l_get(lua_State *L) {
  mla_tensor *t = mla_check_tensor(L, 1);
  int64_t e = coords(L, t, 2);
  if (mla_tensor_device(t) == MLA_CPU) {
    push_elem(L, t, e);
    return 1;
  }
  /* one element from the GPU: a 1-element view copied over */
  mla_tensor one = *t, h;
  one.ndim = 0, one.offset = e;
  if (t->dtype == MLA_E2M1) one.ndim = 1, one.sizes[0] = 2, one.strides[0] = 1, one.offset = e & ~1LL;
  if (mla_tensor_empty(&h, t->dtype, one.ndim, one.sizes, MLA_CPU) || mla_tensor_copy(&h, &one, NULL)) {
    mla_tensor_release(&h);
    return mla_lua_errorf(L, "get");
  }
  push_elem(L, &h, t->dtype == MLA_E2M1 ? (e & 1) : 0);
  mla_tensor_release(&h);
  return 1;
}

static int l_set(lua_State *L) {
  mla_tensor *t = mla_check_tensor(L, 1);
  int64_t e = coords(L, t, 2);
  /* the value is checked before the temporary exists: a raised error would leak it */
  const int exact_i64 = lua_isinteger(L, 3) && t->dtype == MLA_I64;
  const double v = exact_i64 ? 0.0 : luaL_checknumber(L, 3);
  mla_tensor one = *t, h;
  one.ndim = 0, one.offset = e;
  if (mla_tensor_empty(&h, t->dtype == MLA_E2M1 ? MLA_F64 : t->dtype, 0, one.sizes, MLA_CPU)) return mla_lua_errorf(L, "set");
  if (exact_i64) ((int64_t *)h.storage->data)[0] = lua_tointeger(L, 3);
  else mla_store_double(h.dtype, h.storage->data, 0, v, NULL);
  int rc;
  if (t->dtype == MLA_E2M1 && mla_tensor_device(t) != MLA_CPU) {
    rc = mla_err("set: single e2m1 elements on the GPU are not addressable; set a CPU copy");
  } else rc = mla_tensor_copy(&one, &h, NULL);
  mla_tensor_release(&h);
  if (rc) return mla_lua_errorf(L, "set");
  lua_settop(L, 1);
  return 1;
}

static int l_item(lua_State *L) {
  mla_tensor *t = mla_check_tensor(L, 1);
  if (mla_tensor_numel(t) != 1) return luaL_error(L, "item: tensor has %I elements, not 1", (lua_Integer)mla_tensor_numel(t));
  mla_tensor tmp = {0}, *h = host_view(L, t, &tmp);
  mla_iter it;
  mla_iter_init(&it, h);
  push_elem(L, h, mla_iter_elem(&it, h));
  mla_tensor_release(&tmp);
  return 1;
}

static void totable_rec(lua_State *L, const mla_tensor *t, int dim, int64_t base) {
  lua_createtable(L, (int)t->sizes[dim], 0);
  for (int64_t i = 0; i < t->sizes[dim]; i++) {
    int64_t e = base + i * t->strides[dim];
    if (dim + 1 < t->ndim) totable_rec(L, t, dim + 1, e);
    else push_elem(L, t, e);
    lua_rawseti(L, -2, i + 1);
  }
}

static int l_totable(lua_State *L) {
  mla_tensor *t = mla_check_tensor(L, 1);
  lua_Integer limit = luaL_optinteger(L, 2, 1 << 24);
  if (mla_tensor_numel(t) > limit)
    return luaL_error(L, "totable: %I elements exceed the limit %I (pass a larger limit)", (lua_Integer)mla_tensor_numel(t), (lua_Integer)limit);
  mla_tensor tmp = {0}, *h = host_view(L, t, &tmp);
  if (h->ndim == 0) push_elem(L, h, h->offset);
  else totable_rec(L, h, 0, h->offset);
  mla_tensor_release(&tmp);
  return 1;
}

/* Bit equality: same dtype and shape, every element's bits identical. */
static int l_equal(lua_State *L) {
  mla_tensor *a = mla_check_tensor(L, 1), *b = mla_check_tensor(L, 2);
  if (a->dtype != b->dtype || a->ndim != b->ndim) { lua_pushboolean(L, 0); return 1; }
  for (int i = 0; i < a->ndim; i++)
    if (a->sizes[i] != b->sizes[i]) { lua_pushboolean(L, 0); return 1; }
  mla_tensor ta = {0}, tb = {0}, ca = {0}, cb = {0};
  mla_tensor *ha = host_view(L, a, &ta), *hb = host_view(L, b, &tb);
  /* contiguous host copies, then one memcmp (sub-byte padding is zeroed by the copy) */
  int rc = mla_tensor_empty(&ca, a->dtype, a->ndim, a->sizes, MLA_CPU) || mla_tensor_empty(&cb, a->dtype, a->ndim, a->sizes, MLA_CPU);
  if (!rc) {
    memset(ca.storage->data, 0, (size_t)ca.storage->nbytes), memset(cb.storage->data, 0, (size_t)cb.storage->nbytes);
    rc = mla_tensor_copy(&ca, ha, NULL) || mla_tensor_copy(&cb, hb, NULL);
  }
  int eq = !rc && memcmp(ca.storage->data, cb.storage->data, (size_t)ca.storage->nbytes) == 0;
  mla_tensor_release(&ta), mla_tensor_release(&tb), mla_tensor_release(&ca), mla_tensor_release(&cb);
  if (rc) return mla_lua_errorf(L, "equal");
  lua_pushboolean(L, eq);
  return 1;
}

static int l_close(lua_State *L) {
  mla_tensor *t = luaL_checkudata(L, 1, MLA_TENSOR_MT);
  mla_tensor_release(t);
  return 0;
}

static int l_is_closed(lua_State *L) {
  lua_pushboolean(L, ((mla_tensor *)luaL_checkudata(L, 1, MLA_TENSOR_MT))->storage == NULL);
  return 1;
}

static int l_is_tensor(lua_State *L) {
  lua_pushboolean(L, mla_test_tensor(L, 1) != NULL);
  return 1;
}

/* properties reachable as fields: t.shape, t.dtype, t.device, t.ndim, t.strides */
static int l_index(lua_State *L) {
  lua_pushvalue(L, 2);
  if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1;
  const char *k = lua_tostring(L, 2);
  if (!k) return 0;
  lua_settop(L, 1); /* the getters below read an optional dim from slot 2, which holds the key here */
  if (strcmp(k, "shape") == 0) return l_size(L);
  if (strcmp(k, "dtype") == 0) return l_dtype(L);
  if (strcmp(k, "device") == 0) return l_device(L);
  if (strcmp(k, "ndim") == 0) return l_dim(L);
  if (strcmp(k, "strides") == 0) return l_stride(L);
  return 0;
}

static int l_dtype_info(lua_State *L) {
  mla_dtype t = mla_check_dtype(L, 1);
  const mla_dtype_info *i = mla_dtype_info_of(t);
  lua_createtable(L, 0, 4);
  lua_pushstring(L, i->name), lua_setfield(L, -2, "name");
  lua_pushinteger(L, i->bits), lua_setfield(L, -2, "bits");
  lua_pushboolean(L, i->is_float), lua_setfield(L, -2, "is_float");
  lua_pushboolean(L, i->is_signed), lua_setfield(L, -2, "is_signed");
  lua_pushinteger(L, (lua_Integer)t), lua_setfield(L, -2, "id");
  return 1;
}

MLA_LUA_MODULE(tensor) {
  /* Sizes, strides and offsets count elements; dims and coordinates count from 0 and may be negative (from the end). */
  static const mla_doc_reg methods[] = {
    {"size", l_size, "t:size([dim]) -> {sizes} or one size (also t.shape)"},
    {"stride", l_stride, "t:stride([dim]) -> {strides} or one stride, in elements (also t.strides)"},
    {"offset", l_offset, "t:offset() -> the storage offset of element 0, in elements"},
    {"numel", l_numel, "t:numel() -> the number of elements"},
    {"dim", l_dim, "t:dim() -> the number of dims (also t.ndim)"},
    {"is_contiguous", l_is_contiguous, "t:is_contiguous() -> true when the strides are row-major with no gaps"},
    {"element_size", l_element_size, "t:element_size() -> bytes an element (0.5 for e2m1)"},
    {"nbytes", l_nbytes, "t:nbytes() -> bytes the elements hold (numel x bits / 8, rounded up)"},
    {"storage_nbytes", l_storage_nbytes, "t:storage_nbytes() -> bytes of the whole storage the view lies in"},
    {"byte_range", l_byte_range,
     "t:byte_range() -> lo, hi: the bytes of the storage the view can touch, [lo, hi)\n"
     "From the offset to one past the last element; a view's bounds check is hi <= storage_nbytes."},
    {"data_ptr", l_data_ptr, "t:data_ptr() -> the address of element 0 as an integer (a device address on a GPU)\n"
     "Raises for an e2m1 view that starts in the middle of a byte."},
    {"same_storage", l_same_storage, "t:same_storage(u) -> true when both views lie in one storage"},
    {"is_cuda", l_is_cuda, "t:is_cuda() -> true on a GPU"},
    {"get_dtype", l_dtype, "t:get_dtype() -> the dtype's name, e.g. \"bf16\" (also t.dtype)"},
    {"get_device", l_device, "t:get_device() -> \"cpu\" or \"cuda:N\" (also t.device)"},
    {"narrow", l_narrow, "t:narrow(dim, start, length) -> a view of `length` entries of dim from `start`"},
    {"select", l_select, "t:select(dim, i) -> a view with dim removed, at index i"},
    {"permute", l_permute, "t:permute({d0, d1, ...}) -> a view with the dims in that order"},
    {"transpose", l_transpose, "t:transpose(a, b) -> a view with dims a and b swapped"},
    {"view", l_view,
     "t:view(shape) or t:view(dtype) -> a view of the same elements in another shape, or of the same bytes as another dtype\n"
     "The shape must be reachable without a copy (else use reshape); a dtype view rescales the last dim and the strides,\n"
     "which needs the last dim contiguous. One size may be -1."},
    {"reshape", l_reshape, "t:reshape(shape) -> a view when the strides allow one, else a contiguous copy"},
    {"as_strided", l_as_strided,
     "t:as_strided(sizes, strides[, offset]) -> a view with these sizes, strides and storage offset (elements)\n"
     "Checked against the storage's bytes: no view reaches past its storage."},
    {"copy", l_copy_,
     "dst:copy(src[, {saturate=true, ue8m0_round=\"up\"|\"zero\"}]) -> dst: element-wise copy between any views,\n"
     "devices and dtypes, converting as CUDA's intrinsics do (fp8 satfinite unless saturate = false, which overflows\n"
     "to NaN / inf as torch's .to does; ue8m0 rounds up unless ue8m0_round = \"zero\"). Shapes must match."},
    {"to", l_to,
     "t:to(dtype | device | {dtype=, device=, saturate=, ue8m0_round=}) -> a new contiguous tensor\n"
     "(t itself when neither changes); conversions as in copy."},
    {"clone", l_clone, "t:clone() -> a contiguous copy on the same device"},
    {"contiguous", l_contiguous, "t:contiguous() -> t when it is contiguous and byte-aligned, else a contiguous copy"},
    {"fill", l_fill_, "t:fill(v) -> t, every element of the view set to v (converted to the dtype)"},
    {"random_", l_random_,
     "t:random_(kind, seed[, a, b]) -> t, the view filled from the counter-based RNG in place\n"
     "kind \"uniform\" in [a, b), \"normal\" with mean a and std b, \"bits\" raw random bits; the same seed gives the\n"
     "same bits on the CPU and a GPU. See also uniform_, normal_, random_bytes_."},
    {"get", l_get, "t:get(i | {i0, i1, ...}) -> one element as a Lua number (an integer for integer dtypes)"},
    {"set", l_set, "t:set(i | {i0, i1, ...}, v) -> t, one element set to v (converted to the dtype)"},
    {"item", l_item, "t:item() -> the value of a one-element tensor"},
    {"totable", l_totable, "t:totable([limit = 2^24]) -> nested Lua tables of the elements (raises above limit elements)"},
    {"equal", l_equal, "t:equal(u) -> true when dtype, shape and every element's bits are the same (NaN equals its own bits)"},
    {"close", l_close,
     "t:close(): frees the tensor's hold on its storage now instead of at garbage collection\n"
     "(a `local t <close>` does it at the end of the block); a closed tensor raises when used."},
    {"is_closed", l_is_closed, "t:is_closed() -> true after close"},
    {NULL, NULL, NULL}};
  static const luaL_Reg fns[] = {
    {"empty", l_empty}, {"full", l_full}, {"arange", l_arange}, {"random", l_random}, {"tensor", l_tensor}, {NULL, NULL}};
  static const mla_doc_reg public_fns[] = {
    {"is_tensor", l_is_tensor, "mla.is_tensor(x) -> true when x is a tensor (closed or not)"},
    {"dtype_info", l_dtype_info,
     "mla.dtype_info(name) -> {name, bits, is_float, is_signed, id} of a dtype\n"
     "dtypes: u8 i8 u16 i16 i32 i64 f16 bf16 f32 f64 e4m3 e5m2 ue8m0 e2m1"},
    {NULL, NULL, NULL}};

  luaL_newmetatable(L, MLA_TENSOR_MT);
  lua_newtable(L); /* methods */
  mla_set_documented(L, methods);
  lua_pushvalue(L, -1);
  lua_setfield(L, -4, "Tensor"); /* core.Tensor = methods: the Lua library adds more */
  lua_pushcclosure(L, l_index, 1);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, l_close), lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, l_close), lua_setfield(L, -2, "__close");
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, "Tensor_mt");
  lua_pop(L, 1);
  luaL_setfuncs(L, fns, 0);
  mla_set_documented(L, public_fns);
}
