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

/* Docs of the C bindings, keyed by the function value: a C function without
 * upvalues is a light value, equal to itself wherever it is pushed. */
#define MLA_DOCS_KEY "mlalab.docs"

static void push_docs(lua_State *L) {
  if (lua_getfield(L, LUA_REGISTRYINDEX, MLA_DOCS_KEY) == LUA_TTABLE) return;
  lua_pop(L, 1);
  lua_newtable(L);
  lua_pushvalue(L, -1);
  lua_setfield(L, LUA_REGISTRYINDEX, MLA_DOCS_KEY);
}

void mla_set_documented(lua_State *L, const mla_doc_reg *r) {
  push_docs(L);
  for (; r->name; r++) {
    lua_pushcfunction(L, r->fn);
    lua_pushvalue(L, -1);
    lua_setfield(L, -4, r->name);
    lua_pushstring(L, r->doc);
    lua_rawset(L, -3);
  }
  lua_pop(L, 1);
}

/* core.doc(f) -> the doc of a documented C binding, or nil */
static int l_doc(lua_State *L) {
  luaL_checkany(L, 1);
  if (!lua_iscfunction(L, 1)) {
    lua_pushnil(L);
    return 1;
  }
  push_docs(L);
  lua_pushvalue(L, 1);
  lua_rawget(L, -2);
  return 1;
}

int luaopen_mlalab_core(lua_State *L) {
  qsort(openers, (size_t)nopeners, sizeof openers[0], by_name); /* a stable order whatever the link order */
  lua_newtable(L);
  lua_pushstring(L, MLALAB_VERSION), lua_setfield(L, -2, "version");
  lua_pushcfunction(L, l_doc), lua_setfield(L, -2, "doc");
#ifdef MLA_USE_READLINE
  lua_pushboolean(L, 1); /* the REPL has readline: history and tab completion */
#else
  lua_pushboolean(L, 0);
#endif
  lua_setfield(L, -2, "readline");
  for (int i = 0; i < nopeners; i++) openers[i].fn(L);
  return 1;
}
