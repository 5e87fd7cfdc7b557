/* Lua bindings of the JIT compile path (rtc.h, rtc_deps.h, rtc_cache.h); no
 * GPU needed. lua/mlalab/rtc.lua builds the public API on these:
 *   core.rtc_prepare(spec) -> prepared      read source + headers, compute the cache key
 *   core.rtc_build(prepared, opts) -> table disk hit or NVRTC compile (+ disk write)
 * Loading and launching: l_rtc_launch.c. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "l_common.h"
#include "mla_error.h"
#include "rtc.h"
#include "rtc_cache.h"
#include "rtc_deps.h"

#ifndef MLALAB_RTC_ARCHS
#define MLALAB_RTC_ARCHS "sm_80,sm_90a,sm_100a"
#endif

#define PREPARED_MT "mlalab.RtcPrepared"

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

static char *dup_lstr(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d) memcpy(d, s, n), d[n] = 0;
  return d;
}

/* ---- prepared programs -------------------------------------------------------- */

typedef struct prepared {
  mla_rtc_deps deps;
  char *name, *src, *path;
  size_t src_len;
  int64_t src_mtime, src_size;
  char **opts, **exprs;
  int nopts, nexprs;
  char key[MLA_RTC_KEY_HEX];
  double prep_ms;
} prepared;

static void prepared_free(prepared *p) {
  mla_rtc_deps_free(&p->deps);
  for (int i = 0; i < p->nopts; i++) free(p->opts[i]);
  for (int i = 0; i < p->nexprs; i++) free(p->exprs[i]);
  free(p->opts), free(p->exprs), free(p->name), free(p->src), free(p->path);
  memset(p, 0, sizeof *p);
}

static int l_prepared_gc(lua_State *L) {
  prepared_free(luaL_checkudata(L, 1, PREPARED_MT));
  return 0;
}

static prepared *check_prepared(lua_State *L, int idx) {
  prepared *p = luaL_checkudata(L, idx, PREPARED_MT);
  if (!p->src) luaL_error(L, "attempt to use a released program");
  return p;
}

/* A list of strings at field `f` of the table at idx, copied. */
static char **string_list(lua_State *L, int idx, const char *f, int *n) {
  *n = 0;
  if (lua_getfield(L, idx, f) == LUA_TNIL) {
    lua_pop(L, 1);
    return NULL;
  }
  if (!lua_istable(L, -1)) luaL_error(L, "rtc: %s must be a list of strings", f);
  int len = (int)luaL_len(L, -1);
  char **out = calloc((size_t)len + 1, sizeof(char *));
  if (!out) luaL_error(L, "out of memory");
  for (int i = 0; i < len; i++) {
    lua_geti(L, -1, i + 1);
    size_t sl;
    const char *s = lua_tolstring(L, -1, &sl);
    if (!s || lua_type(L, -1) != LUA_TSTRING) {
      for (int k = 0; k < i; k++) free(out[k]);
      free(out);
      luaL_error(L, "rtc: %s[%d] is a %s, not a string", f, i + 1, luaL_typename(L, -1));
      return NULL; /* not reached: luaL_error does not return (GCC cannot tell, and saw a use of out after free) */
    }
    out[i] = dup_lstr(s, sl);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  *n = len;
  return out;
}

static void prepared_program(const prepared *p, mla_rtc_program *prog, mla_rtc_text **hdrs) {
  *hdrs = malloc(sizeof(mla_rtc_text) * (size_t)(p->deps.n + 1));
  for (int i = 0; *hdrs && i < p->deps.n; i++)
    (*hdrs)[i] = (mla_rtc_text){p->deps.files[i].name, p->deps.files[i].text, p->deps.files[i].len};
  prog->source = (mla_rtc_text){p->name, p->src, p->src_len};
  prog->headers = *hdrs, prog->nheaders = *hdrs ? p->deps.n : 0;
  prog->options = (const char *const *)p->opts, prog->noptions = p->nopts;
  prog->exprs = (const char *const *)p->exprs, prog->nexprs = p->nexprs;
}

/* core.rtc_prepare{name=, file= | source=, dir=, options={}, names={}, headers={[name]=text},
 *                  sys_dirs={}, salt=} */
static int l_rtc_prepare(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  double t0 = now_ms();
  prepared *p = lua_newuserdatauv(L, sizeof *p, 0);
  memset(p, 0, sizeof *p);
  luaL_setmetatable(L, PREPARED_MT);
  int top = lua_gettop(L);
  lua_getfield(L, 1, "name");
  const char *name = lua_tostring(L, -1);
  if (!name) return luaL_error(L, "rtc_prepare: name (the program name) is required");
  p->name = strdup(name);
  lua_getfield(L, 1, "file");
  lua_getfield(L, 1, "source");
  if (lua_isstring(L, -2)) {
    p->path = strdup(lua_tostring(L, -2));
    if (mla_rtc_read_file(p->path, &p->src, &p->src_len, &p->src_mtime)) return mla_lua_error(L);
    p->src_size = (int64_t)p->src_len;
  } else if (lua_isstring(L, -1)) {
    size_t n;
    const char *s = lua_tolstring(L, -1, &n);
    p->src = dup_lstr(s, n), p->src_len = n;
  } else {
    return luaL_error(L, "rtc_prepare: file or source is required");
  }
  lua_getfield(L, 1, "dir");
  const char *dir = lua_tostring(L, -1);
  lua_getfield(L, 1, "salt");
  const char *salt = lua_tostring(L, -1);
  p->opts = string_list(L, 1, "options", &p->nopts);
  p->exprs = string_list(L, 1, "names", &p->nexprs);
  if (lua_getfield(L, 1, "headers") == LUA_TTABLE) {
    /* sorted by name so the order NVRTC sees never depends on table traversal */
    lua_pushnil(L);
    while (lua_next(L, -2)) {
      size_t tl;
      const char *text = lua_tolstring(L, -1, &tl);
      if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
        return luaL_error(L, "rtc_prepare: headers must map include names to texts");
      if (mla_rtc_deps_add_text(&p->deps, lua_tostring(L, -2), text, tl)) return mla_lua_error(L);
      lua_pop(L, 1);
    }
    for (int i = 1; i < p->deps.n; i++)
      for (int j = i; j > 0 && strcmp(p->deps.files[j - 1].name, p->deps.files[j].name) > 0; j--) {
        mla_rtc_file t = p->deps.files[j];
        p->deps.files[j] = p->deps.files[j - 1], p->deps.files[j - 1] = t;
      }
  }
  int nsys = 0;
  char **sys = string_list(L, 1, "sys_dirs", &nsys); /* read last: nothing below raises before it is freed */
  int rc = mla_rtc_deps_scan(&p->deps, p->src, p->src_len, dir, (const char *const *)p->opts, p->nopts,
                             (const char *const *)sys, nsys);
  for (int i = 0; i < nsys; i++) free(sys[i]);
  free(sys);
  if (rc) return mla_lua_errorf(L, p->name);
  mla_rtc_program prog;
  mla_rtc_text *hdrs;
  prepared_program(p, &prog, &hdrs);
  if (!hdrs) return luaL_error(L, "out of memory");
  mla_rtc_cache_key(&prog, &p->deps, salt, p->key);
  free(hdrs);
  p->prep_ms = now_ms() - t0;
  lua_settop(L, top);
  return 1;
}

static int l_prepared_key(lua_State *L) {
  lua_pushstring(L, check_prepared(L, 1)->key);
  return 1;
}

static int l_prepared_ms(lua_State *L) {
  lua_pushnumber(L, check_prepared(L, 1)->prep_ms);
  return 1;
}

/* p:deps() -> { {name=, path=, mtime=, size=}, ... }, { other include names } */
static int l_prepared_deps(lua_State *L) {
  prepared *p = check_prepared(L, 1);
  lua_createtable(L, p->deps.n, 0);
  for (int i = 0; i < p->deps.n; i++) {
    const mla_rtc_file *f = &p->deps.files[i];
    lua_createtable(L, 0, 4);
    lua_pushstring(L, f->name), lua_setfield(L, -2, "name");
    if (f->path) lua_pushstring(L, f->path), lua_setfield(L, -2, "path");
    lua_pushinteger(L, (lua_Integer)f->mtime_ns), lua_setfield(L, -2, "mtime");
    lua_pushinteger(L, (lua_Integer)f->size), lua_setfield(L, -2, "size");
    lua_rawseti(L, -2, i + 1);
  }
  lua_createtable(L, p->deps.nother, 0);
  for (int i = 0; i < p->deps.nother; i++) lua_pushstring(L, p->deps.other[i]), lua_rawseti(L, -2, i + 1);
  return 2;
}

/* p:changed() -> true if the source file or any header read from disk changed */
static int l_prepared_changed(lua_State *L) {
  prepared *p = check_prepared(L, 1);
  int changed = mla_rtc_deps_changed(&p->deps);
  if (!changed && p->path) {
    int64_t m, s;
    changed = mla_rtc_stat(p->path, &m, &s) != 0 || m != p->src_mtime || s != p->src_size;
  }
  lua_pushboolean(L, changed);
  return 1;
}

/* p:text(name) -> the text compiled under that name (the program or a header), or nil */
static int l_prepared_text(lua_State *L) {
  prepared *p = check_prepared(L, 1);
  const char *name = luaL_checkstring(L, 2);
  if (strcmp(name, p->name) == 0) {
    lua_pushlstring(L, p->src, p->src_len);
    return 1;
  }
  for (int i = 0; i < p->deps.n; i++)
    if (strcmp(name, p->deps.files[i].name) == 0 ||
        (p->deps.files[i].path && strcmp(name, p->deps.files[i].path) == 0)) {
      lua_pushlstring(L, p->deps.files[i].text, p->deps.files[i].len);
      if (p->deps.files[i].path) lua_pushstring(L, p->deps.files[i].path);
      else lua_pushnil(L);
      return 2;
    }
  return 0;
}

/* ---- build: disk cache, else NVRTC ------------------------------------------------ */

static void push_binary(lua_State *L, const mla_rtc_binary *b) {
  lua_pushlstring(L, b->cubin, b->cubin_len), lua_setfield(L, -2, "cubin");
  lua_pushstring(L, b->log ? b->log : ""), lua_setfield(L, -2, "log");
  lua_pushstring(L, b->signatures ? b->signatures : ""), lua_setfield(L, -2, "signatures");
  lua_createtable(L, 0, b->nexprs);
  for (int i = 0; i < b->nexprs; i++) lua_pushstring(L, b->lowered[i]), lua_setfield(L, -2, b->exprs[i]);
  lua_setfield(L, -2, "lowered");
}

/* core.rtc_build(p, {cache_dir=, save_source=, no_read=}) ->
 *   {ok=true, state="disk"|"compiled", cubin=, log=, signatures=, lowered={}, compile_ms=, read_ms=,
 *    corrupt=reason?, write_error=msg?}  or  {ok=false, log=, compile_ms=} */
static int l_rtc_build(lua_State *L) {
  prepared *p = check_prepared(L, 1);
  const char *dir = NULL;
  int save_source = 0, no_read = 0;
  if (lua_istable(L, 2)) {
    lua_getfield(L, 2, "cache_dir");
    dir = lua_tostring(L, -1);
    lua_getfield(L, 2, "save_source");
    save_source = lua_toboolean(L, -1);
    lua_getfield(L, 2, "no_read");
    no_read = lua_toboolean(L, -1);
    lua_pop(L, 2); /* dir stays referenced on the stack */
  }
  lua_createtable(L, 0, 10);
  mla_rtc_binary b;
  char why[160] = "";
  if (dir && !no_read) {
    double t0 = now_ms();
    int st = mla_rtc_cache_read(dir, p->key, &b, why, sizeof why);
    lua_pushnumber(L, now_ms() - t0), lua_setfield(L, -2, "read_ms");
    if (st == MLA_RTC_ENTRY_HIT) {
      push_binary(L, &b);
      mla_rtc_binary_free(&b);
      lua_pushboolean(L, 1), lua_setfield(L, -2, "ok");
      lua_pushliteral(L, "disk"), lua_setfield(L, -2, "state");
      return 1;
    }
    if (st == MLA_RTC_ENTRY_CORRUPT) lua_pushstring(L, why), lua_setfield(L, -2, "corrupt");
  }
  mla_rtc_program prog;
  mla_rtc_text *hdrs;
  prepared_program(p, &prog, &hdrs);
  if (!hdrs) return luaL_error(L, "out of memory");
  double ms = 0;
  int rc = mla_rtc_compile(&prog, &b, &ms);
  free(hdrs);
  if (rc < 0) return mla_lua_errorf(L, p->name);
  lua_pushnumber(L, ms), lua_setfield(L, -2, "compile_ms");
  if (rc == 1) {
    lua_pushboolean(L, 0), lua_setfield(L, -2, "ok");
    lua_pushstring(L, b.log ? b.log : ""), lua_setfield(L, -2, "log");
    mla_rtc_binary_free(&b);
    return 1;
  }
  push_binary(L, &b);
  lua_pushboolean(L, 1), lua_setfield(L, -2, "ok");
  lua_pushliteral(L, "compiled"), lua_setfield(L, -2, "state");
  if (dir) {
    mla_rtc_text src = {p->name, p->src, p->src_len};
    if (mla_rtc_cache_write(dir, p->key, &b, save_source ? &src : NULL))
      lua_pushstring(L, mla_errmsg()), lua_setfield(L, -2, "write_error");
  }
  mla_rtc_binary_free(&b);
  return 1;
}

static int l_rtc_version(lua_State *L) {
  int maj, min;
  mla_rtc_version(&maj, &min);
  lua_pushinteger(L, maj), lua_pushinteger(L, min);
  return 2;
}

static int l_rtc_build_id(lua_State *L) {
  lua_pushstring(L, mla_rtc_build_id());
  return 1;
}

static int l_rtc_supported_archs(lua_State *L) {
  int a[64];
  int n = mla_rtc_supported_archs(a, 64);
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) lua_pushinteger(L, a[i]), lua_rawseti(L, -2, i + 1);
  return 1;
}

/* core.rtc_config() -> {archs = "sm_80,sm_90a,...", cuda_include = dir} (build-time settings) */
static int l_rtc_config(lua_State *L) {
  lua_createtable(L, 0, 2);
  lua_pushstring(L, MLALAB_RTC_ARCHS), lua_setfield(L, -2, "archs");
#ifdef MLALAB_CUDA_INCLUDE_DIR
  lua_pushstring(L, MLALAB_CUDA_INCLUDE_DIR), lua_setfield(L, -2, "cuda_include");
#endif
  return 1;
}

static int l_rtc_hash(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  char hex[MLA_RTC_KEY_HEX];
  mla_rtc_hash_hex(s, n, hex);
  lua_pushstring(L, hex);
  return 1;
}

/* core.rtc_entry_check(key, bytes) -> "hit" | "corrupt", reason */
static int l_rtc_entry_check(lua_State *L) {
  const char *key = luaL_checkstring(L, 1);
  size_t n;
  const char *data = luaL_checklstring(L, 2, &n);
  if (strlen(key) != 32) return luaL_error(L, "rtc_entry_check: key must be 32 hex digits");
  mla_rtc_binary b;
  char why[160] = "";
  int st = mla_rtc_entry_decode(key, data, n, &b, why, sizeof why);
  mla_rtc_binary_free(&b);
  lua_pushstring(L, st == MLA_RTC_ENTRY_HIT ? "hit" : "corrupt");
  lua_pushstring(L, why);
  return 2;
}

static int l_rtc_list_files(lua_State *L) {
  char **paths;
  int n;
  if (mla_rtc_list_files(luaL_checkstring(L, 1), luaL_optstring(L, 2, ""), &paths, &n)) return mla_lua_error(L);
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_pushstring(L, paths[i]), lua_rawseti(L, -2, i + 1);
    free(paths[i]);
  }
  free(paths);
  return 1;
}

/* core.rtc_stat(path) -> mtime_ns, size  (nil if it is not a regular file) */
static int l_rtc_stat(lua_State *L) {
  int64_t m, s;
  if (mla_rtc_stat(luaL_checkstring(L, 1), &m, &s) != 0) return 0;
  lua_pushinteger(L, (lua_Integer)m), lua_pushinteger(L, (lua_Integer)s);
  return 2;
}

static int l_rtc_clock_ms(lua_State *L) {
  lua_pushnumber(L, now_ms());
  return 1;
}

MLA_LUA_MODULE(rtc) {
  static const luaL_Reg prepared_methods[] = {{"key", l_prepared_key},         {"deps", l_prepared_deps},
                                              {"changed", l_prepared_changed}, {"text", l_prepared_text},
                                              {"prepare_ms", l_prepared_ms},   {NULL, NULL}};
  static const luaL_Reg fns[] = {
    {"rtc_prepare", l_rtc_prepare},       {"rtc_build", l_rtc_build},
    {"rtc_version", l_rtc_version},       {"rtc_build_id", l_rtc_build_id},
    {"rtc_supported_archs", l_rtc_supported_archs}, {"rtc_config", l_rtc_config},
    {"rtc_hash", l_rtc_hash},             {"rtc_entry_check", l_rtc_entry_check},
    {"rtc_list_files", l_rtc_list_files}, {"rtc_stat", l_rtc_stat},
    {"rtc_clock_ms", l_rtc_clock_ms},     {NULL, NULL}};

  luaL_newmetatable(L, PREPARED_MT);
  lua_newtable(L);
  luaL_setfuncs(L, prepared_methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, l_prepared_gc), lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);

  luaL_setfuncs(L, fns, 0);
}
