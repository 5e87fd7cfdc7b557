/* Lua binding for child processes: core.spawn{argv=, env=, input=, timeout=, result_fd=} */
#include <stdlib.h>
#include <string.h>

#include "l_common.h"
#include "device.h"
#include "kernels/debug_kernels.h"
#include "process.h"

static const char **string_list(lua_State *L, int idx, const char *what) {
  int n = (int)luaL_len(L, idx);
  const char **v = lua_newuserdatauv(L, sizeof(char *) * (size_t)(n + 1), 0); /* freed by the GC */
  for (int i = 0; i < n; i++) {
    lua_geti(L, idx, i + 1);
    if (!lua_isstring(L, -1)) luaL_error(L, "spawn: %s[%d] is a %s, not a string", what, i + 1, luaL_typename(L, -1));
    v[i] = lua_tostring(L, -1);
    lua_pop(L, 1); /* the strings stay alive in the argument table */
  }
  v[n] = NULL;
  return v;
}

static int l_spawn(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  mla_spawn_opts o;
  memset(&o, 0, sizeof o);
  if (lua_getfield(L, 1, "argv") != LUA_TTABLE) return luaL_error(L, "spawn: argv (a list of strings) is required");
  o.argv = string_list(L, lua_gettop(L), "argv");
  if (lua_getfield(L, 1, "env") == LUA_TTABLE) o.env = string_list(L, lua_gettop(L), "env");
  size_t len = 0;
  if (lua_getfield(L, 1, "input") == LUA_TSTRING) o.input = lua_tolstring(L, -1, &len), o.input_len = len;
  lua_getfield(L, 1, "timeout");
  o.timeout_s = luaL_optnumber(L, -1, 0);
  lua_getfield(L, 1, "result_fd");
  o.result_fd = (int)luaL_optinteger(L, -1, -1);
  lua_getfield(L, 1, "max_capture");
  o.max_capture = (size_t)luaL_optinteger(L, -1, 0);
  if (o.result_fd >= 0 && o.result_fd < 3) return luaL_error(L, "spawn: result_fd must be 3 or more (got %d)", o.result_fd);
  mla_spawn_result r;
  if (mla_spawn(&o, &r)) return mla_lua_error(L);
  lua_createtable(L, 0, 8);
  lua_pushinteger(L, r.exit_code), lua_setfield(L, -2, "exit_code");
  lua_pushinteger(L, r.signal), lua_setfield(L, -2, "signal");
  lua_pushboolean(L, r.timed_out), lua_setfield(L, -2, "timed_out");
  lua_pushnumber(L, r.elapsed_s), lua_setfield(L, -2, "elapsed");
  lua_pushlstring(L, r.out, r.out_len), lua_setfield(L, -2, "stdout");
  lua_pushlstring(L, r.err, r.err_len), lua_setfield(L, -2, "stderr");
  if (o.result_fd >= 3) lua_pushlstring(L, r.result, r.result_len), lua_setfield(L, -2, "result");
  mla_spawn_result_free(&r);
  return 1;
}

/* core.debug_kernel("oob_store" | "trap" | "spin", buffer_tensor): launch a
 * kernel that fails on purpose (tests of isolation and fault reports). */
static int l_debug_kernel(lua_State *L) {
  static const char *const kinds[] = {"oob_store", "trap", "spin", NULL};
  static const char *const names[] = {"mla_debug_oob_store", "mla_debug_trap", "mla_debug_spin"};
  int kind = luaL_checkoption(L, 1, NULL, kinds);
  mla_tensor *t = mla_check_tensor(L, 2);
  int dev = mla_tensor_device(t);
  if (dev == MLA_CPU) return luaL_error(L, "debug_kernel: the buffer must be on a CUDA device");
  void *p;
  if (mla_tensor_data(t, &p)) return mla_lua_error(L);
  cudaStream_t s = mla_device_stream(dev);
  if (!s || mla_cuda_check(mla_debug_launch(kind, p, s), names[kind])) return mla_lua_error(L);
  if (mla_launch_check(dev, names[kind])) return mla_lua_error(L);
  return 0;
}

MLA_LUA_MODULE(process) {
  static const luaL_Reg fns[] = {{"spawn", l_spawn}, {"debug_kernel", l_debug_kernel}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
