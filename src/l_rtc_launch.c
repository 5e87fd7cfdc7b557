/* Lua bindings of JIT kernel loading and launching (rtc_launch.h), and of
 * the argument checks they share with CPU-only callers:
 *   core.rtc_load(cubin) -> library;  core.rtc_kernel(library, lowered, name, sig, info) -> kernel
 *   kernel:launch{grid=, block=, cluster=, shared_mem=, stream=, device=, args={...}}
 *   core.rtc_pack_args(sig, args [, names, kernel]) -> bytes (the launch's checks, without a GPU)
 *   core.rtc_check_cluster{grid=, cluster= [, kernel=]} -> true (the cluster-shape check, without a GPU)
 *   core.rtc_cache_view(desc, pages [, scale]) -> the mla_cache_view argument's bytes */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "kernels/rtc_bench_kernels.h"
#include "l_common.h"
#include "mla_error.h"
#include "rtc_launch.h"

#define LIBRARY_MT "mlalab.RtcLibrary"
#define KERNEL_MT "mlalab.RtcKernel"
#define MAX_ARGS 256

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
    if (devs[i] >= 0 && *first_dev == -2) *first_dev = devs[i]; /* the first CUDA tensor picks the device */
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
  read_dim(L, cfg, "cluster", &c->cluster, 0);
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

static int l_kernel_params(lua_State *L) {
  mla_rtc_kernel *k = check_kernel(L, 1);
  int dev = lua_isnoneornil(L, 2) ? mla_default_device(L) : mla_check_device(L, 2);
  if (dev < 0) return luaL_error(L, "params: needs a CUDA device");
  if (mla_rtc_kernel_params(k, dev)) return mla_lua_error(L);
  push_params(L, k->params, k->nparams);
  return 1;
}

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

/* ---- without a GPU ------------------------------------------------------------------------ */

/* core.rtc_signature(sig) -> params laid out as CUDA would */
static int l_rtc_signature(lua_State *L) {
  mla_rtc_param ps[MAX_ARGS];
  int n = mla_rtc_parse_signature(luaL_checkstring(L, 1), ps, MAX_ARGS);
  if (n < 0) return mla_lua_errorf(L, "rtc_signature");
  push_params(L, ps, n);
  return 1;
}

/* core.rtc_check_cluster{grid=, cluster= [, kernel=]} -> true: the launch's cluster-shape check,
 * without a GPU (the spec's way to reach it on CPU-only machines) */
static int l_rtc_check_cluster(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  dim3 grid, cluster;
  read_dim(L, 1, "grid", &grid, 1);
  read_dim(L, 1, "cluster", &cluster, 1);
  lua_getfield(L, 1, "kernel");
  const char *kname = lua_isnil(L, -1) ? "(unnamed)" : luaL_checkstring(L, -1);
  if (mla_rtc_check_cluster(grid, cluster, kname)) return mla_lua_error(L);
  lua_pushboolean(L, 1);
  return 1;
}

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

MLA_LUA_MODULE(rtc_launch) {
  static const mla_doc_reg kernel_methods[] = {
    {"launch", l_kernel_launch,
     "k:launch{grid=, block=, args={...}, cluster=, shared_mem=0, device=, stream=}: one launch, checked first\n"
     "grid, block, cluster: a number or {x, y, z} (cluster: a thread-block cluster shape, sm_90+). args: tensors\n"
     "(their element 0's address), integers, floats, booleans and byte strings (rtc.f16 / rtc.bf16 for 2-byte\n"
     "floats), matched to the parameters as the device declares them; a mismatch raises naming the parameter.\n"
     "device: that of the first CUDA tensor argument, else the default; stream: the device's stream."},
    {"params", l_kernel_params,
     "k:params([device]) -> { {offset=, size=, kind=, type=}, ... }: the parameters as the device reports them"},
    {"attributes", l_kernel_attributes,
     "k:attributes([device]) -> {registers=, max_threads=, static_shared_mem=, local_bytes=} (local_bytes: local memory a thread, spills and local arrays)"},
    {"time_raw_launches", l_kernel_time_raw,
     "k:time_raw_launches(n, {grid=, block=, ...}) -> seconds: n bare cudaLaunchKernel calls with the last\n"
     "launch's arguments (the launch-overhead baseline of bench/rtc_bench.lua)"},
    {NULL, NULL, NULL}};
  static const luaL_Reg fns[] = {
    {"rtc_load", l_rtc_load},             {"rtc_kernel", l_rtc_kernel},
    {"rtc_rebind", l_rtc_rebind},         {"rtc_signature", l_rtc_signature},
    {"rtc_check_cluster", l_rtc_check_cluster},   {"rtc_scalar_bytes", l_rtc_scalar_bytes},
    {"rtc_cache_view", l_rtc_cache_view}, {"rtc_time_baked_launches", l_rtc_time_baked},
    {NULL, NULL}};

  static const mla_doc_reg documented_fns[] = {
    {"rtc_pack_args", l_rtc_pack_args,
     "rtc.pack_args(sig, args[, param_names[, kernel_name]]) -> the packed parameter bytes (a string)\n"
     "sig: a PTX parameter signature, as m:kernels()[i].signature gives it; the launch's own checks on each argument\n"
     "(the same code), without a GPU: a mismatch raises naming the kernel and the parameter."},
    {NULL, NULL, NULL}};
  luaL_newmetatable(L, LIBRARY_MT);
  lua_pushcfunction(L, l_library_gc), lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);

  luaL_newmetatable(L, KERNEL_MT);
  lua_newtable(L);
  mla_set_documented(L, kernel_methods);
  lua_pushvalue(L, -1);
  lua_setfield(L, -4, "RtcKernel"); /* core.RtcKernel: rtc.lua adds Lua methods */
  lua_pushcclosure(L, l_kernel_index, 1);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, l_kernel_gc), lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, l_kernel_tostring), lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);

  luaL_setfuncs(L, fns, 0);
  mla_set_documented(L, documented_fns);
}
