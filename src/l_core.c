/* The C core of `require "mlalab"`: one table, filled by each binding file
 * (l_*.c) through the openers they register with MLA_LUA_MODULE. */
#include <stdlib.h>
#include <string.h>

#include "l_common.h"
#include "mla_version.h"

#define MLA_MAX_OPENERS 64

static struct {
  const char *name;
  mla_lua_opener fn;
} openers[MLA_MAX_OPENERS];
static int nopeners;

void mla_register_opener(const char *name, mla_lua_opener fn) {
  if (nopeners == MLA_MAX_OPENERS) abort(); /* a build-time limit, hit only by adding files */
  openers[nopeners].name = name;
  openers[nopeners].fn = fn;
  nopeners++;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int luaopen_mlalab_core(lua_State *L) {
  qsort(openers, (size_t)nopeners, sizeof openers[0], by_name); /* a stable order whatever the link order */
  lua_newtable(L);
  lua_pushstring(L, MLALAB_VERSION), lua_setfield(L, -2, "version");
  for (int i = 0; i < nopeners; i++) openers[i].fn(L);
  return 1;
}
