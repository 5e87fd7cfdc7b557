/* The C core of `require "mlalab"`: one table, filled by each binding file. */
#include "l_common.h"
#include "mla_version.h"

int luaopen_mlalab_core(lua_State *L) {
  lua_newtable(L);
  lua_pushstring(L, MLALAB_VERSION), lua_setfield(L, -2, "version");
  mla_open_tensor(L);
  mla_open_device(L);
  mla_open_process(L);
  mla_open_bytes(L);
  mla_open_timing(L);
  mla_open_compare(L);
  return 1;
}
