/* Lua bindings for .npy files: core.npy_load(path, as, device),
 * core.npy_header(path), core.npy_save(path, tensor). Errors name the file. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "l_common.h"
#include "mla_error.h"
#include "npy.h"

static int file_error(lua_State *L, const char *fn, const char *path) {
  return luaL_error(L, "%s('%s'): %s", fn, path, mla_errmsg());
}

static FILE *open_npy(lua_State *L, const char *fn, const char *path, mla_npy_header *h) {
  FILE *f = fopen(path, "rb");
  if (!f) luaL_error(L, "%s('%s'): cannot open: %s", fn, path, strerror(errno));
  if (mla_npy_read_header(f, h)) {
    fclose(f);
    file_error(L, fn, path);
  }
  return f;
}

static int l_npy_header(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  mla_npy_header h;
  fclose(open_npy(L, "npy.header", path, &h));
  lua_createtable(L, 0, 6);
  lua_pushstring(L, h.descr), lua_setfield(L, -2, "descr");
  lua_pushboolean(L, h.fortran_order), lua_setfield(L, -2, "fortran_order");
  lua_createtable(L, h.ndim, 0);
  for (int i = 0; i < h.ndim; i++) lua_pushinteger(L, h.shape[i]), lua_rawseti(L, -2, i + 1);
  lua_setfield(L, -2, "shape");
  lua_pushfstring(L, "%d.%d", h.major, h.minor), lua_setfield(L, -2, "version");
  lua_pushinteger(L, h.data_offset), lua_setfield(L, -2, "data_offset");
  lua_pushinteger(L, h.data_bytes), lua_setfield(L, -2, "data_bytes");
  return 1;
}

/* Reads into a CPU tensor shaped like the stored data (raw_sizes), then
 * undoes fortran order and moves to the device. */
static int l_npy_load(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  const char *as = luaL_optstring(L, 2, NULL);
  int dev = mla_opt_device(L, 3);
  mla_npy_header h;
  mla_npy_target tg;
  FILE *f = open_npy(L, "npy.load", path, &h);
  if (mla_npy_resolve(&h, as, &tg)) {
    fclose(f);
    return file_error(L, "npy.load", path);
  }
  mla_tensor *raw = mla_push_tensor(L); /* owned by Lua from here: an error below does not leak it */
  if (mla_tensor_empty(raw, tg.raw_dtype, tg.ndim, tg.raw_sizes, MLA_CPU)) {
    fclose(f);
    return file_error(L, "npy.load", path);
  }
  MLA_ASSERT(raw->storage->nbytes == h.data_bytes);
  int rc = mla_npy_read_data(f, &h, raw->storage->data);
  fclose(f);
  if (rc) return file_error(L, "npy.load", path);
  if (tg.unpacked_e2m1) {
    mla_tensor *packed = mla_push_tensor(L);
    if (mla_tensor_empty(packed, MLA_E2M1, tg.ndim, tg.sizes, MLA_CPU) ||
        mla_npy_pack_e2m1(raw->storage->data, h.numel, packed->storage->data))
      return file_error(L, "npy.load", path);
    raw = packed;
  }
  if (!tg.reversed && dev == MLA_CPU) return 1;
  mla_tensor src = *raw;
  if (tg.reversed) {
    int perm[MLA_MAX_DIMS];
    for (int i = 0; i < tg.ndim; i++) perm[i] = tg.ndim - 1 - i;
    if (mla_tensor_permute(&src, perm)) return file_error(L, "npy.load", path);
  }
  mla_tensor *out = mla_push_tensor(L);
  if (mla_tensor_empty(out, tg.dtype, tg.ndim, tg.sizes, dev) || mla_tensor_copy(out, &src, NULL))
    return file_error(L, "npy.load", path);
  return 1;
}

/* Writes to a temporary file beside the target and renames it, so an
 * interrupted save never leaves a half-written .npy under the real name. */
static int l_npy_save(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  mla_tensor *t = mla_check_tensor(L, 2);
  int64_t shape[MLA_MAX_DIMS];
  const char *descr = mla_npy_descr_of(t->dtype);
  if (!descr) return luaL_error(L, "npy.save('%s'): dtype %s has no npy equivalent", path, mla_dtype_name(t->dtype));
  int nd = mla_npy_stored_shape(t->dtype, t->ndim, t->sizes, shape);
  if (nd < 0) return file_error(L, "npy.save", path);
  /* a contiguous CPU copy unless t already is one */
  const mla_tensor *src = t;
  int bits = mla_dtype_info_of(t->dtype)->bits;
  if (mla_tensor_device(t) != MLA_CPU || !mla_tensor_is_contiguous(t) || (t->offset * bits) % 8) {
    mla_tensor *c = mla_push_tensor(L);
    if (mla_tensor_empty(c, t->dtype, t->ndim, t->sizes, MLA_CPU) || mla_tensor_copy(c, t, NULL))
      return file_error(L, "npy.save", path);
    src = c;
  }
  void *data;
  if (mla_tensor_data(src, &data)) return file_error(L, "npy.save", path);
  int64_t nbytes = (mla_tensor_numel(src) * bits + 7) / 8;
  const char *tmp = lua_pushfstring(L, "%s.tmp%d", path, (int)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) return luaL_error(L, "npy.save('%s'): cannot open for writing: %s", path, strerror(errno));
  int rc = mla_npy_write(f, descr, nd, shape, data, nbytes);
  if (fclose(f) != 0 && rc == 0) rc = mla_err("write error: %s", strerror(errno));
  if (rc == 0 && rename(tmp, path) != 0) rc = mla_err("cannot rename the temporary file: %s", strerror(errno));
  if (rc) {
    remove(tmp);
    return file_error(L, "npy.save", path);
  }
  return 0;
}

MLA_LUA_MODULE(npy) {
  static const luaL_Reg fns[] = {
    {"npy_load", l_npy_load}, {"npy_header", l_npy_header}, {"npy_save", l_npy_save}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
