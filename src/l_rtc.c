/* Lua bindings of the JIT path (rtc.h, rtc_deps.h, rtc_cache.h, rtc_launch.h).
 * lua/mlalab/rtc.lua builds the public API on these:
 *   core.rtc_prepare(spec) -> prepared      read source + headers, compute the cache key
 *   core.rtc_build(prepared, opts) -> table disk hit or NVRTC compile (+ disk write)
 *   core.rtc_load(cubin) -> library;  core.rtc_kernel(library, lowered, name, sig) -> kernel
 *   kernel:launch{grid=, block=, shared_mem=, stream=, device=, args={...}}
 *   core.rtc_pack_args(sig, args) -> bytes (the launch's argument checks, without a GPU) */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device.h"
#include "l_common.h"
#include "mla_error.h"
#include "rtc.h"
#include "rtc_cache.h"
#include "rtc_deps.h"
#include "rtc_launch.h"
#include "kernels/rtc_bench_kernels.h"

#ifndef MLALAB_RTC_ARCHS
#define MLALAB_RTC_ARCHS "sm_80,sm_90a,sm_100a"
#endif

#define PREPARED_MT "mlalab.RtcPrepared"
#define LIBRARY_MT "mlalab.RtcLibrary"
#define KERNEL_MT "mlalab.RtcKernel"
#define MAX_ARGS 256

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

/* ---- libraries -------------------------------------------------------------------- */

typedef struct library { cudaLibrary_t lib; } library;

static int l_library_gc(lua_State *L) {
  library *l = luaL_checkudata(L, 1, LIBRARY_MT);
  if (l->lib) mla_rtc_library_unload(l->lib);
  l->lib = NULL;
  return 0;
}

/* core.rtc_load(cubin) -> library */
static int l_rtc_load(lua_State *L) {
  size_t n;
  const char *cubin = luaL_checklstring(L, 1, &n);
  library *l = lua_newuserdatauv(L, sizeof *l, 0);
  l->lib = NULL;
  luaL_setmetatable(L, LIBRARY_MT);
  if (mla_rtc_library_load(cubin, n, &l->lib)) return mla_lua_errorf(L, "rtc load");
  return 1;
}

/* ---- kernels ------------------------------------------------------------------------ */

static mla_rtc_kernel *check_kernel(lua_State *L, int idx) {
  mla_rtc_kernel *k = luaL_checkudata(L, idx, KERNEL_MT);
  if (!k->handle) luaL_error(L, "kernel %s is not loaded (its module failed to rebuild?)", k->name);
  return k;
}

static int l_kernel_gc(lua_State *L) {
  mla_rtc_kernel *k = luaL_checkudata(L, 1, KERNEL_MT);
  mla_rtc_kernel_clear(k);
  return 0;
}

/* core.rtc_kernel(library, lowered, display_name, sig|nil, info_table) -> kernel */
static int l_rtc_kernel(lua_State *L) {
  library *l = luaL_checkudata(L, 1, LIBRARY_MT);
  const char *lowered = luaL_checkstring(L, 2);
  const char *name = luaL_checkstring(L, 3);
  const char *sig = luaL_optstring(L, 4, NULL);
  mla_rtc_kernel *k = lua_newuserdatauv(L, sizeof *k, 2);
  memset(k, 0, sizeof *k);
  k->nparams = -1;
  luaL_setmetatable(L, KERNEL_MT);
  snprintf(k->name, sizeof k->name, "%s", name);
  if (mla_rtc_kernel_bind(k, l->lib, lowered, sig)) return mla_lua_error(L);
  lua_pushvalue(L, 1), lua_setiuservalue(L, -2, 1); /* the library lives as long as the kernel */
  if (lua_istable(L, 5)) lua_pushvalue(L, 5);
  else lua_newtable(L);
  lua_setiuservalue(L, -2, 2);
  return 1;
}

/* core.rtc_rebind(kernel, library, lowered, sig|nil): after a module reload */
static int l_rtc_rebind(lua_State *L) {
  mla_rtc_kernel *k = luaL_checkudata(L, 1, KERNEL_MT);
  library *l = luaL_checkudata(L, 2, LIBRARY_MT);
  if (mla_rtc_kernel_bind(k, l->lib, luaL_checkstring(L, 3), luaL_optstring(L, 4, NULL))) return mla_lua_error(L);
  lua_pushvalue(L, 2), lua_setiuservalue(L, 1, 1);
  return 0;
}

/* kernel fields: methods first, then the info table (name, lowered, module, ...) */
static int l_kernel_index(lua_State *L) {
  lua_pushvalue(L, 2);
  if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1;
  lua_pop(L, 1);
  lua_getiuservalue(L, 1, 2);
  lua_pushvalue(L, 2);
  lua_gettable(L, -2);
  return 1;
}

static int l_kernel_tostring(lua_State *L) {
  mla_rtc_kernel *k = luaL_checkudata(L, 1, KERNEL_MT);
  lua_pushfstring(L, "rtc kernel %s%s", k->name, k->handle ? "" : " (unloaded)");
  return 1;
}

static int read_dim(lua_State *L, int cfg, const char *field, dim3 *d, int required) {
  int t = lua_getfield(L, cfg, field);
  unsigned v[3] = {1, 1, 1};
  if (t == LUA_TNIL) {
    lua_pop(L, 1);
    if (required) return luaL_error(L, "launch: %s is required (a number or {x, y, z})", field);
    *d = (dim3){1, 1, 1};
    return 0;
  }
  if (t == LUA_TNUMBER) {
    lua_Integer x;
    if (!lua_isinteger(L, -1) || (x = lua_tointeger(L, -1)) < 1 || x > 0x7fffffff)
      return luaL_error(L, "launch: %s must be a positive integer or {x, y, z}", field);
    v[0] = (unsigned)x;
  } else if (t == LUA_TTABLE) {
    int n = (int)luaL_len(L, -1);
    if (n < 1 || n > 3) return luaL_error(L, "launch: %s must have 1 to 3 entries, got %d", field, n);
    for (int i = 0; i < n; i++) {
      lua_geti(L, -1, i + 1);
      lua_Integer x;
      if (!lua_isinteger(L, -1) || (x = lua_tointeger(L, -1)) < 1 || x > 0x7fffffff)
        return luaL_error(L, "launch: %s[%d] must be a positive integer", field, i + 1);
      v[i] = (unsigned)x;
      lua_pop(L, 1);
    }
  } else {
    return luaL_error(L, "launch: %s must be a number or {x, y, z}, got a %s", field, luaL_typename(L, -1));
  }
  lua_pop(L, 1);
  *d = (dim3){v[0], v[1], v[2]};
  return 0;
}

/* Converts the Lua value at idx to an argument; *tensor_dev gets the device of a tensor. */
static void to_arg(lua_State *L, int idx, int i, int n, mla_rtc_arg *a, int *tensor_dev) {
  memset(a, 0, sizeof *a);
  *tensor_dev = -2;
  switch (lua_type(L, idx)) {
  case LUA_TNUMBER:
    if (lua_isinteger(L, idx)) a->kind = MLA_ARG_INT, a->i = (int64_t)lua_tointeger(L, idx);
    else a->kind = MLA_ARG_FLOAT, a->f = (double)lua_tonumber(L, idx);
    return;
  case LUA_TBOOLEAN: a->kind = MLA_ARG_BOOL, a->i = lua_toboolean(L, idx); return;
  case LUA_TSTRING: a->kind = MLA_ARG_BYTES, a->bytes = lua_tolstring(L, idx, &a->nbytes); return;
  case LUA_TLIGHTUSERDATA: a->kind = MLA_ARG_PTR, a->ptr = lua_touserdata(L, idx); return;
  case LUA_TUSERDATA: {
    mla_tensor *t = mla_test_tensor(L, idx);
    if (t) {
      if (!t->storage) luaL_error(L, "argument %d of %d is a closed tensor", i, n);
      void *p;
      if (mla_tensor_data(t, &p)) luaL_error(L, "argument %d of %d: %s", i, n, mla_errmsg());
      *tensor_dev = mla_tensor_device(t);
      a->kind = MLA_ARG_PTR, a->ptr = p;
      a->tensor_dtype = mla_dtype_name(t->dtype), a->tensor_dev = *tensor_dev;
      return;
    }
  } /* fallthrough */
  default:
    luaL_error(L, "argument %d of %d is a %s; kernels take tensors, numbers, booleans and byte strings", i, n,
               luaL_typename(L, idx));
  }
}

static int read_args(lua_State *L, int idx, mla_rtc_arg *a, int *first_dev, int *devs) {
  *first_dev = -2;
  if (lua_isnoneornil(L, idx)) return 0;
  luaL_checktype(L, idx, LUA_TTABLE);
  int n;
  if (lua_getfield(L, idx, "n") == LUA_TNUMBER) n = (int)lua_tointeger(L, -1);
  else n = (int)lua_rawlen(L, idx);
  lua_pop(L, 1);
  if (n > MAX_ARGS) luaL_error(L, "launch: %d arguments, at most %d are supported", n, MAX_ARGS);
  for (int i = 0; i < n; i++) {
    if (lua_rawgeti(L, idx, i + 1) == LUA_TNIL)
      luaL_error(L, "argument %d of %d is nil (pass 0 for a null pointer)", i + 1, n);
    to_arg(L, -1, i + 1, n, &a[i], &devs[i]);
    if (devs[i] != -2 && *first_dev == -2) *first_dev = devs[i];
    lua_pop(L, 1); /* strings stay alive in the args table */
  }
  return n;
}

/* Name of parameter i (1-based), or NULL. names_idx holds a list of names,
 * or a kernel (its info table's param_names: looked up only on the error
 * path), or is 0. The string stays alive in that list. */
static const char *param_name(lua_State *L, int names_idx, int i) {
  if (!names_idx) return NULL;
  int top = lua_gettop(L);
  if (lua_type(L, names_idx) == LUA_TUSERDATA) {
    lua_getiuservalue(L, names_idx, 2);
    if (lua_type(L, -1) != LUA_TTABLE || lua_getfield(L, -1, "param_names") != LUA_TTABLE) {
      lua_settop(L, top);
      return NULL;
    }
  } else {
    lua_pushvalue(L, names_idx);
  }
  const char *s = NULL;
  if (lua_type(L, -1) == LUA_TTABLE && lua_rawgeti(L, -1, i) == LUA_TSTRING) s = lua_tostring(L, -1);
  lua_settop(L, top);
  return s;
}

/* Packs a[0, n) against ps[0, np); errors name the kernel and the parameter
 * (names_idx: a list of parameter names from the source, or 0). */
static int pack_all(lua_State *L, const char *kname, const mla_rtc_param *ps, int np, const mla_rtc_arg *a, int n,
                    unsigned char *buf, int names_idx) {
  if (n != np) {
    char list[512] = "";
    size_t used = 0;
    for (int i = 1; i <= np && used < sizeof list; i++) {
      const char *pn = param_name(L, names_idx, i);
      if (!pn) { list[0] = 0; break; }
      int w = snprintf(list + used, sizeof list - used, "%s%s%s", i == 1 ? " (" : ", ", pn, i == np ? ")" : "");
      if (w < 0) break;
      used += (size_t)w;
    }
    return luaL_error(L, "kernel %s: expects %d argument%s%s, got %d", kname, np, np == 1 ? "" : "s", list, n);
  }
  for (int i = 0; i < n; i++)
    if (mla_rtc_pack_arg(&ps[i], i + 1, n, &a[i], buf + ps[i].offset)) {
      const char *pn = param_name(L, names_idx, i + 1);
      if (pn) mla_err_prefix("kernel %s: parameter '%s': ", kname, pn);
      else mla_err_prefix("kernel %s: ", kname);
      return mla_lua_error(L);
    }
  return 0;
}

static int launch_cfg(lua_State *L, int cfg, mla_rtc_launch_cfg *c, int first_dev) {
  read_dim(L, cfg, "grid", &c->grid, 1);
  read_dim(L, cfg, "block", &c->block, 1);
  lua_getfield(L, cfg, "shared_mem");
  c->shared_mem = lua_isnil(L, -1) ? 0 : (int64_t)luaL_checkinteger(L, -1);
  lua_pop(L, 1);
  if (lua_getfield(L, cfg, "device") != LUA_TNIL) c->dev = mla_check_device(L, lua_gettop(L));
  else c->dev = first_dev != -2 ? first_dev : mla_default_device(L);
  lua_pop(L, 1);
  if (c->dev < 0) return luaL_error(L, "launch: JIT kernels run on a CUDA device, and the launch device is cpu");
  int t = lua_getfield(L, cfg, "stream");
  if (t == LUA_TNIL) {
    c->stream = mla_device_stream(c->dev);
    if (!c->stream) return mla_lua_error(L);
  } else if (t == LUA_TLIGHTUSERDATA) {
    c->stream = (cudaStream_t)lua_touserdata(L, -1);
  } else if (lua_isinteger(L, -1)) {
    c->stream = (cudaStream_t)(intptr_t)lua_tointeger(L, -1);
  } else {
    return luaL_error(L, "launch: stream must be a stream handle (integer or light userdata), got a %s",
                      luaL_typename(L, -1));
  }
  lua_pop(L, 1);
  return 0;
}

/* kernel:launch{grid=, block=, shared_mem=0, stream=, device=, args={...}} */
static int l_kernel_launch(lua_State *L) {
  mla_rtc_kernel *k = check_kernel(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  mla_rtc_arg a[MAX_ARGS];
  int devs[MAX_ARGS];
  lua_getfield(L, 2, "args");
  int args_idx = lua_gettop(L);
  int first_dev;
  int n = read_args(L, args_idx, a, &first_dev, devs);
  mla_rtc_launch_cfg c;
  launch_cfg(L, 2, &c, first_dev);
  for (int i = 0; i < n; i++)
    if (devs[i] != -2 && devs[i] != c.dev) {
      char dn[32], ln[32];
      return luaL_error(L, "kernel %s: argument %d of %d is a %s tensor, but the kernel launches on %s", k->name, i + 1, n,
                        mla_device_name(devs[i], dn, sizeof dn), mla_device_name(c.dev, ln, sizeof ln));
    }
  if (mla_rtc_kernel_params(k, c.dev)) return mla_lua_error(L);
  pack_all(L, k->name, k->params, k->nparams, a, n, k->argbuf, 1);
  if (mla_rtc_launch(k, &c)) return mla_lua_error(L);
  return 0;
}

/* kernel:time_raw_launches(n, cfg) -> seconds: n bare cudaLaunchKernel calls with the
 * arguments of the last launch (the baseline of bench/rtc_bench.lua) */
static int l_kernel_time_raw(lua_State *L) {
  mla_rtc_kernel *k = check_kernel(L, 1);
  lua_Integer n = luaL_checkinteger(L, 2);
  luaL_checktype(L, 3, LUA_TTABLE);
  mla_rtc_launch_cfg c;
  launch_cfg(L, 3, &c, -2);
  double s = 0;
  if (mla_rtc_time_raw_launches(k, &c, (int64_t)n, &s)) return mla_lua_error(L);
  lua_pushnumber(L, s);
  return 1;
}

/* core.rtc_time_baked_launches(n, {grid=, block=, device=, stream=}, buffer, a, b) -> seconds:
 * n plain cudaLaunchKernel calls of a baked empty kernel with the JIT empty
 * kernel's parameters (float *, int, long long): the launch-overhead baseline. */
static int l_rtc_time_baked(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  mla_tensor *t = mla_check_tensor(L, 3);
  lua_Integer a = luaL_checkinteger(L, 4), b = luaL_checkinteger(L, 5);
  if (n < 0) return luaL_error(L, "rtc_time_baked_launches: n must be >= 0");
  mla_rtc_launch_cfg c;
  launch_cfg(L, 2, &c, mla_tensor_device(t));
  if (mla_tensor_device(t) != c.dev) return luaL_error(L, "rtc_time_baked_launches: the buffer is not on the launch device");
  if (c.grid.y != 1 || c.grid.z != 1 || c.block.y != 1 || c.block.z != 1)
    return luaL_error(L, "rtc_time_baked_launches: grid and block must be 1-dimensional");
  void *p;
  if (mla_tensor_data(t, &p)) return mla_lua_error(L);
  if (mla_device_use(c.dev)) return mla_lua_error(L);
  double s = 0;
  cudaError_t e = mla_cuda_time_empty_launches((int64_t)n, c.grid.x, c.block.x, p, (int32_t)a, (int64_t)b, c.stream, &s);
  if (mla_cuda_check(e, "baked empty kernel launches")) return mla_lua_error(L);
  lua_pushnumber(L, s);
  return 1;
}

static void push_params(lua_State *L, const mla_rtc_param *ps, int n) {
  static const char *const kinds[] = {"any", "int", "float", "bytes"};
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_createtable(L, 0, 4);
    lua_pushinteger(L, (lua_Integer)ps[i].offset), lua_setfield(L, -2, "offset");
    lua_pushinteger(L, (lua_Integer)ps[i].size), lua_setfield(L, -2, "size");
    lua_pushstring(L, kinds[ps[i].kind]), lua_setfield(L, -2, "kind");
    if (ps[i].type[0]) lua_pushstring(L, ps[i].type), lua_setfield(L, -2, "type");
    lua_rawseti(L, -2, i + 1);
  }
}

/* kernel:params([device]) -> { {offset=, size=, kind=, type=}, ... } as the device reports them */
static int l_kernel_params(lua_State *L) {
  mla_rtc_kernel *k = check_kernel(L, 1);
  int dev = lua_isnoneornil(L, 2) ? mla_default_device(L) : mla_check_device(L, 2);
  if (dev < 0) return luaL_error(L, "params: needs a CUDA device");
  if (mla_rtc_kernel_params(k, dev)) return mla_lua_error(L);
  push_params(L, k->params, k->nparams);
  return 1;
}

/* kernel:attributes([device]) -> {registers=, max_threads=, static_shared_mem=, local_bytes=} */
static int l_kernel_attributes(lua_State *L) {
  mla_rtc_kernel *k = check_kernel(L, 1);
  int dev = lua_isnoneornil(L, 2) ? mla_default_device(L) : mla_check_device(L, 2);
  if (dev < 0) return luaL_error(L, "attributes: needs a CUDA device");
  if (mla_rtc_kernel_attributes(k, dev)) return mla_lua_error(L);
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, k->num_regs), lua_setfield(L, -2, "registers");
  lua_pushinteger(L, k->max_threads), lua_setfield(L, -2, "max_threads");
  lua_pushinteger(L, k->static_smem), lua_setfield(L, -2, "static_shared_mem");
  lua_pushinteger(L, k->local_bytes), lua_setfield(L, -2, "local_bytes");
  return 1;
}

/* ---- CPU-side helpers ------------------------------------------------------------------ */

/* core.rtc_signature(sig) -> params laid out as CUDA would */
static int l_rtc_signature(lua_State *L) {
  mla_rtc_param ps[MAX_ARGS];
  int n = mla_rtc_parse_signature(luaL_checkstring(L, 1), ps, MAX_ARGS);
  if (n < 0) return mla_lua_errorf(L, "rtc_signature");
  push_params(L, ps, n);
  return 1;
}

/* core.rtc_pack_args(sig, args [, param_names [, kernel_name]]) -> packed parameter bytes: the
 * launch's checks (mla_rtc_pack_arg, the same code) without a GPU */
static int l_rtc_pack_args(lua_State *L) {
  mla_rtc_param ps[MAX_ARGS];
  int np = mla_rtc_parse_signature(luaL_checkstring(L, 1), ps, MAX_ARGS);
  if (np < 0) return mla_lua_errorf(L, "rtc_pack_args");
  mla_rtc_arg a[MAX_ARGS];
  int devs[MAX_ARGS], first;
  int n = read_args(L, 2, a, &first, devs);
  const char *kname = luaL_optstring(L, 4, "(signature)");
  int names_idx = lua_istable(L, 3) ? 3 : 0;
  int64_t total = 0;
  for (int i = 0; i < np; i++)
    if (ps[i].offset + ps[i].size > total) total = ps[i].offset + ps[i].size;
  /* a userdata, not malloc: errors longjmp out of pack_all */
  unsigned char *box = lua_newuserdatauv(L, (size_t)total + 1, 0);
  memset(box, 0, (size_t)total + 1);
  pack_all(L, kname, ps, np, a, n, box, names_idx);
  lua_pushlstring(L, (const char *)box, (size_t)total);
  return 1;
}

/* core.rtc_cache_view(packed_desc, pages [, tensor_scale]) -> the bytes of the
 * mla_cache_view a JIT kernel takes by value, and the pages' device name.
 * The view is checked against the descriptor as for every other kernel
 * (l_layout.c: dtype, dims, strides from the tensor, alignment, extent). */
static int l_rtc_cache_view(lua_State *L) {
  const mla_layout_desc *d = mla_check_layout_desc(L, 1);
  mla_cache_view v;
  int dev = mla_check_cache_view(L, d, 2, 3, &v);
  lua_pushlstring(L, (const char *)&v, sizeof v);
  char dn[32];
  lua_pushstring(L, mla_device_name(dev, dn, sizeof dn));
  return 2;
}

/* core.rtc_scalar_bytes(dtype, x) -> the element's bytes (e.g. a __half or __nv_bfloat16 argument) */
static int l_rtc_scalar_bytes(lua_State *L) {
  mla_dtype t = mla_check_dtype(L, 1);
  double x = luaL_checknumber(L, 2);
  int size = mla_dtype_size(t);
  if (size <= 0) return luaL_error(L, "rtc_scalar_bytes: %s has no whole-byte element", mla_dtype_name(t));
  unsigned char b[8] = {0};
  if (lua_isinteger(L, 2) && !mla_dtype_info_of(t)->is_float) {
    lua_Integer v = lua_tointeger(L, 2);
    for (int i = 0; i < size; i++) b[i] = (unsigned char)((uint64_t)v >> (8 * i));
  } else {
    mla_store_double(t, b, 0, x, &mla_cvt_default);
  }
  lua_pushlstring(L, (const char *)b, (size_t)size);
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
  static const luaL_Reg kernel_methods[] = {{"launch", l_kernel_launch},
                                            {"params", l_kernel_params},
                                            {"attributes", l_kernel_attributes},
                                            {"time_raw_launches", l_kernel_time_raw},
                                            {NULL, NULL}};
  static const luaL_Reg fns[] = {
    {"rtc_prepare", l_rtc_prepare},       {"rtc_build", l_rtc_build},
    {"rtc_load", l_rtc_load},             {"rtc_kernel", l_rtc_kernel},
    {"rtc_rebind", l_rtc_rebind},         {"rtc_signature", l_rtc_signature},
    {"rtc_pack_args", l_rtc_pack_args},   {"rtc_scalar_bytes", l_rtc_scalar_bytes},
    {"rtc_cache_view", l_rtc_cache_view}, {"rtc_time_baked_launches", l_rtc_time_baked},
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

  luaL_newmetatable(L, LIBRARY_MT);
  lua_pushcfunction(L, l_library_gc), lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);

  luaL_newmetatable(L, KERNEL_MT);
  lua_newtable(L);
  luaL_setfuncs(L, kernel_methods, 0);
  lua_pushvalue(L, -1);
  lua_setfield(L, -4, "RtcKernel"); /* core.RtcKernel: rtc.lua adds Lua methods */
  lua_pushcclosure(L, l_kernel_index, 1);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, l_kernel_gc), lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, l_kernel_tostring), lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);

  luaL_setfuncs(L, fns, 0);
}
