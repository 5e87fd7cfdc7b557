/* Tensors as byte strings, for moving them across a process boundary
 * (mla.isolate) or into files: core.tensor_bytes(t) and
 * core.tensor_from_bytes(bytes, dtype, shape, device). */
#include <string.h>

#include "l_common.h"
#include "mla_error.h"

static int l_tensor_bytes(lua_State *L) {
  mla_tensor *t = mla_check_tensor(L, 1);
  mla_tensor h;
  if (mla_tensor_empty(&h, t->dtype, t->ndim, t->sizes, MLA_CPU)) return mla_lua_errorf(L, "tensor_bytes");
  memset(h.storage->data, 0, (size_t)h.storage->nbytes); /* defined padding nibble for odd e2m1 */
  if (mla_tensor_copy(&h, t, NULL)) {
    mla_tensor_release(&h);
    return mla_lua_errorf(L, "tensor_bytes");
  }
  lua_pushlstring(L, (const char *)h.storage->data, (size_t)h.storage->nbytes);
  mla_tensor_release(&h);
  return 1;
}

static int l_tensor_from_bytes(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  mla_dtype dt = mla_check_dtype(L, 2);
  int64_t sz[MLA_MAX_DIMS];
  luaL_checktype(L, 3, LUA_TTABLE);
  int n = mla_check_shape(L, 3, sz);
  int dev = mla_opt_device(L, 4);
  mla_tensor h;
  if (mla_tensor_empty(&h, dt, n, sz, MLA_CPU)) return mla_lua_errorf(L, "tensor_from_bytes");
  if ((size_t)h.storage->nbytes != len) {
    long long need = (long long)h.storage->nbytes;
    mla_tensor_release(&h);
    return luaL_error(L, "tensor_from_bytes: %d bytes given, a %s tensor of that shape needs %d", (int)len,
                      mla_dtype_name(dt), (int)need);
  }
  memcpy(h.storage->data, s, len);
  mla_tensor *t = mla_push_tensor(L);
  if (dev == MLA_CPU) {
    *t = h;
    return 1;
  }
  if (mla_tensor_empty(t, dt, n, sz, dev) || mla_tensor_copy(t, &h, NULL)) {
    mla_tensor_release(&h);
    return mla_lua_errorf(L, "tensor_from_bytes");
  }
  mla_tensor_release(&h);
  return 1;
}

MLA_LUA_MODULE(bytes) {
  static const luaL_Reg fns[] = {{"tensor_bytes", l_tensor_bytes}, {"tensor_from_bytes", l_tensor_from_bytes}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
