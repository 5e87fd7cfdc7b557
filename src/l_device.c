/* Lua bindings for devices: the default device, properties, sync, allocator. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "l_common.h"
#include "mla_error.h"

static int default_dev = -2; /* -2: not resolved yet */
static const char *requested_name; /* from --device or MLALAB_DEVICE */

const char *mla_device_name(int dev, char *buf, size_t n) {
  if (dev == MLA_CPU) snprintf(buf, n, "cpu");
  else snprintf(buf, n, "cuda:%d", dev);
  return buf;
}

/* Parses "cpu" / "cuda" / "cuda:N"; returns -2 on a malformed name. */
static int parse_device(const char *s) {
  if (strcmp(s, "cpu") == 0) return MLA_CPU;
  if (strcmp(s, "cuda") == 0 || strcmp(s, "gpu") == 0) return 0;
  if (strncmp(s, "cuda:", 5) == 0 && s[5]) {
    char *end;
    long v = strtol(s + 5, &end, 10);
    if (*end == 0 && v >= 0 && v < 1024) return (int)v;
  }
  return -2;
}

static int check_usable(lua_State *L, int dev, const char *name) {
  if (dev == MLA_CPU) return dev;
  if (mla_device_count() == 0)
    return luaL_error(L, "device '%s' requested but no CUDA device is usable (%s)", name, mla_device_status());
  if (dev >= mla_device_count())
    return luaL_error(L, "device '%s' does not exist (%d CUDA device%s)", name, mla_device_count(),
                      mla_device_count() == 1 ? "" : "s");
  return dev;
}

int mla_default_device(lua_State *L) {
  if (default_dev != -2) return default_dev;
  const char *name = requested_name ? requested_name : getenv("MLALAB_DEVICE");
  if (name && *name) {
    int d = parse_device(name);
    if (d == -2) return luaL_error(L, "invalid device '%s' (expected cpu, cuda or cuda:N)", name);
    default_dev = check_usable(L, d, name);
  } else if (mla_device_count() > 0) {
    default_dev = 0;
  } else {
    fprintf(stderr, "mlalab: no usable CUDA device (%s); running on cpu\n", mla_device_status());
    default_dev = MLA_CPU;
  }
  return default_dev;
}

int mla_check_device(lua_State *L, int idx) {
  if (lua_isinteger(L, idx)) {
    lua_Integer d = lua_tointeger(L, idx);
    char nm[32];
    snprintf(nm, sizeof nm, "cuda:%lld", (long long)d);
    return d < 0 ? MLA_CPU : check_usable(L, (int)d, nm);
  }
  const char *s = luaL_checkstring(L, idx);
  int d = parse_device(s);
  if (d == -2) return luaL_error(L, "invalid device '%s' (expected cpu, cuda or cuda:N)", s);
  return check_usable(L, d, s);
}

int mla_opt_device(lua_State *L, int idx) {
  return lua_isnoneornil(L, idx) ? mla_default_device(L) : mla_check_device(L, idx);
}

/* mla.core.set_default_device(name): also what --device does */
static int l_set_default_device(lua_State *L) {
  const char *s = luaL_checkstring(L, 1);
  int d = parse_device(s);
  if (d == -2) return luaL_error(L, "invalid device '%s' (expected cpu, cuda or cuda:N)", s);
  default_dev = check_usable(L, d, s);
  return 0;
}

static int l_default_device(lua_State *L) {
  char buf[32];
  lua_pushstring(L, mla_device_name(mla_default_device(L), buf, sizeof buf));
  return 1;
}

static int l_device_count(lua_State *L) {
  lua_pushinteger(L, mla_device_count());
  return 1;
}

static int l_device_status(lua_State *L) {
  lua_pushstring(L, mla_device_status());
  return 1;
}

static int dev_arg(lua_State *L, int idx) {
  int d = mla_opt_device(L, idx);
  if (d == MLA_CPU) return luaL_error(L, "a CUDA device is required here (got cpu)");
  return d;
}

static int l_device_props(lua_State *L) {
  mla_device_props p;
  if (mla_device_props_get(dev_arg(L, 1), &p)) return mla_lua_error(L);
  lua_createtable(L, 0, 12);
  lua_pushstring(L, p.name), lua_setfield(L, -2, "name");
  lua_pushinteger(L, p.major), lua_setfield(L, -2, "major");
  lua_pushinteger(L, p.minor), lua_setfield(L, -2, "minor");
  lua_pushinteger(L, p.sm_count), lua_setfield(L, -2, "sm_count");
  lua_pushinteger(L, p.total_mem), lua_setfield(L, -2, "total_mem");
  lua_pushinteger(L, p.l2_bytes), lua_setfield(L, -2, "l2_bytes");
  lua_pushinteger(L, p.mem_clock_khz), lua_setfield(L, -2, "mem_clock_khz");
  lua_pushinteger(L, p.bus_width_bits), lua_setfield(L, -2, "bus_width_bits");
  lua_pushinteger(L, p.sm_clock_khz), lua_setfield(L, -2, "sm_clock_khz");
  lua_pushinteger(L, p.max_smem_optin), lua_setfield(L, -2, "max_smem_optin");
  lua_pushnumber(L, p.peak_dram_gbs), lua_setfield(L, -2, "peak_dram_gbs");
  lua_pushfstring(L, "sm_%d%d", p.major, p.minor), lua_setfield(L, -2, "arch");
  return 1;
}

static int l_cuda_versions(lua_State *L) {
  int rt, drv;
  mla_cuda_versions(&rt, &drv);
  lua_pushinteger(L, rt);
  lua_pushinteger(L, drv);
  return 2;
}

static int l_synchronize(lua_State *L) {
  int d = mla_opt_device(L, 1);
  if (d != MLA_CPU && mla_device_sync(d)) return mla_lua_error(L);
  return 0;
}

static int l_alloc_stats(lua_State *L) {
  mla_alloc_stats s;
  mla_device_alloc_stats(dev_arg(L, 1), &s);
  lua_createtable(L, 0, 5);
  lua_pushinteger(L, s.in_use), lua_setfield(L, -2, "in_use");
  lua_pushinteger(L, s.cached), lua_setfield(L, -2, "cached");
  lua_pushinteger(L, s.peak), lua_setfield(L, -2, "peak");
  lua_pushinteger(L, s.n_malloc), lua_setfield(L, -2, "n_malloc");
  lua_pushinteger(L, s.n_hits), lua_setfield(L, -2, "n_hits");
  return 1;
}

static int l_empty_cache(lua_State *L) {
  mla_device_empty_cache(dev_arg(L, 1));
  return 0;
}

static int l_set_sync(lua_State *L) {
  mla_device_set_sync(lua_toboolean(L, 1));
  return 0;
}

static int l_last_kernel(lua_State *L) {
  lua_pushstring(L, mla_device_last_kernel(dev_arg(L, 1)));
  return 1;
}

static int l_poisoned(lua_State *L) {
  lua_pushboolean(L, mla_device_poisoned());
  return 1;
}

void mla_set_requested_device(const char *name) { requested_name = name; }

static void collect_garbage(void *ud) { lua_gc((lua_State *)ud, LUA_GCCOLLECT); }

MLA_LUA_MODULE(device) {
  lua_State *main_state;
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  main_state = lua_tothread(L, -1);
  lua_pop(L, 1);
  mla_device_set_reclaim(collect_garbage, main_state);
  static const luaL_Reg fns[] = {
    {"set_default_device", l_set_default_device}, {"default_device", l_default_device},
    {"device_count", l_device_count},             {"device_status", l_device_status},
    {"cuda_versions", l_cuda_versions},
    {"synchronize", l_synchronize},               {"alloc_stats", l_alloc_stats},
    {"empty_cache", l_empty_cache},               {"set_sync", l_set_sync},
    {"last_kernel", l_last_kernel},               {"context_poisoned", l_poisoned},
    {NULL, NULL}};
  static const mla_doc_reg public_fns[] = {
    {"device_props", l_device_props,
     "mla.device_props([device]) -> what a CUDA device is: {name, arch = \"sm_90\", major, minor, sm_count,\n"
     "total_mem, l2_bytes, max_smem_optin (bytes), sm_clock_khz, mem_clock_khz, bus_width_bits, peak_dram_gbs}\n"
     "peak_dram_gbs is the formula's peak (2 x memory clock x bus width); the benches' limit is the measured\n"
     "copy bandwidth (mla.bench_mod.memcpy_bandwidth()). Raises on the cpu."},
    {NULL, NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
  mla_set_documented(L, public_fns);
}
