/* Lua bindings for the timing primitives (src/timing.h). */
#include <string.h>

#include "l_common.h"
#include "mla_error.h"
#include "timing.h"
#include "timing_cupti.h"
#include "timing_pm.h"

#define MLA_GRAPH_MT "mlalab.Graph"

typedef struct lgraph {
  cudaGraphExec_t exec;
  int dev;
  int64_t nodes;
} lgraph;

static int gpu_arg(lua_State *L, int idx) {
  int d = mla_opt_device(L, idx);
  if (d == MLA_CPU) return luaL_error(L, "a CUDA device is required here (got cpu)");
  return d;
}

static int l_clock(lua_State *L) {
  lua_pushnumber(L, mla_clock_now());
  return 1;
}

static int l_sleep(lua_State *L) {
  mla_sleep(luaL_checknumber(L, 1));
  return 0;
}

static int opt_bool(lua_State *L, int t, const char *k, int def) {
  int v = mla_opt_field(L, t, k) == LUA_TNIL ? def : lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

/* core.timing_begin(dev, {flush=true|"memset"|"clean"|false, block=true, clock="nvml"|"stamps"|"none", block_timeout=5,
 *                         cupti=false, pm=false}) */
static int l_timing_begin(lua_State *L) {
  int dev = gpu_arg(L, 1);
  mla_timing_opts o = {MLA_FLUSH_MEMSET, opt_bool(L, 2, "block", 1), MLA_CLOCK_NONE, 5.0, opt_bool(L, 2, "cupti", 0),
                       opt_bool(L, 2, "pm", 0)};
  /* flush: true / "memset" (NVBench), "clean" (memset + read pass), false / "none" */
  if (mla_opt_field(L, 2, "flush") == LUA_TSTRING) {
    static const char *const kinds[] = {"none", "memset", "clean", NULL};
    o.flush = luaL_checkoption(L, -1, NULL, kinds);
  } else if (!lua_isnil(L, -1)) {
    o.flush = lua_toboolean(L, -1) ? MLA_FLUSH_MEMSET : MLA_FLUSH_NONE;
  }
  lua_pop(L, 1);
  if (mla_opt_field(L, 2, "clock") != LUA_TNIL) {
    static const char *const names[] = {"none", "nvml", "stamps", NULL};
    o.clock = (mla_clock_source)luaL_checkoption(L, -1, NULL, names);
  }
  lua_pop(L, 1);
  if (mla_opt_field(L, 2, "block_timeout") != LUA_TNIL) o.block_timeout = luaL_checknumber(L, -1);
  lua_pop(L, 1);
  if (mla_timing_begin(dev, &o)) return mla_lua_errorf(L, "timing_begin");
  return 0;
}

/* core.timing_next(dev): the next call of a cold batch (flush between) */
static int l_timing_next(lua_State *L) {
  if (mla_timing_next(gpu_arg(L, 1))) return mla_lua_errorf(L, "timing_next");
  return 0;
}

/* core.timing_end(dev) -> {gpu_s=, cpu_s=, sm_mhz=, block_timed_out=} */
static int l_timing_end(lua_State *L) {
  int dev = gpu_arg(L, 1);
  mla_timing_sample s;
  if (mla_timing_end(dev, &s)) return mla_lua_errorf(L, "timing_end");
  lua_createtable(L, 0, 4);
  lua_pushnumber(L, s.gpu_s), lua_setfield(L, -2, "gpu_s");
  lua_pushnumber(L, s.cpu_s), lua_setfield(L, -2, "cpu_s");
  if (s.sm_mhz > 0) lua_pushnumber(L, s.sm_mhz), lua_setfield(L, -2, "sm_mhz");
  lua_pushboolean(L, s.block_timed_out), lua_setfield(L, -2, "block_timed_out");
  if (s.activities > 0) {
    lua_pushnumber(L, s.span_s), lua_setfield(L, -2, "span_s");
    lua_pushnumber(L, s.busy_s), lua_setfield(L, -2, "busy_s");
    lua_pushinteger(L, (lua_Integer)s.activities), lua_setfield(L, -2, "activities");
    lua_pushinteger(L, (lua_Integer)s.cupti_calls), lua_setfield(L, -2, "cupti_calls");
  }
  if (s.pm_kernels > 0) {
    lua_pushnumber(L, s.pm_s), lua_setfield(L, -2, "pm_s");
    lua_pushinteger(L, (lua_Integer)s.pm_kernels), lua_setfield(L, -2, "pm_kernels");
    lua_pushinteger(L, (lua_Integer)s.pm_calls), lua_setfield(L, -2, "pm_calls");
    lua_createtable(L, MLA_PM_MAX_METRICS, 0);
    for (int i = 0; i < MLA_PM_MAX_METRICS; i++) lua_pushnumber(L, s.pm_metrics[i]), lua_rawseti(L, -2, i + 1);
    lua_setfield(L, -2, "pm_metrics");
  }
  return 1;
}

/* core.pm_open(dev, {metric names}): a range-profiler session on dev
 * (gpu__time_duration.sum plus these counters); errors say why it cannot. */
static int l_pm_open(lua_State *L) {
  int dev = gpu_arg(L, 1);
  const char *names[MLA_PM_MAX_METRICS];
  int n = 0;
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_Integer len = luaL_len(L, 2);
    if (len > MLA_PM_MAX_METRICS) return luaL_error(L, "pm_open: at most %d metrics (got %d)", MLA_PM_MAX_METRICS, (int)len);
    for (n = 0; n < (int)len; n++) {
      if (lua_geti(L, 2, n + 1) != LUA_TSTRING) return luaL_error(L, "pm_open: metric %d is not a string", n + 1);
      names[n] = lua_tostring(L, -1); /* anchored by the table at index 2 */
      lua_pop(L, 1);
    }
  }
  if (mla_pm_open(dev, names, n)) return mla_lua_errorf(L, "pm_open");
  return 0;
}

static int l_pm_close(lua_State *L) {
  (void)L;
  mla_pm_close();
  return 0;
}

/* true, or false and the reason */
static int push_available(lua_State *L, int ok, const char *why) {
  lua_pushboolean(L, ok);
  if (ok) return 1;
  lua_pushstring(L, why);
  return 2;
}

/* core.pm_available() -> true, or false and the reason */
static int l_pm_available(lua_State *L) {
  const char *why = NULL;
  int ok = mla_pm_available(&why);
  return push_available(L, ok, why);
}

/* core.cupti_open(): start reading the GPU's activity timeline (errors say why it cannot). */
static int l_cupti_open(lua_State *L) {
  if (mla_cupti_open()) return mla_lua_errorf(L, "cupti_open");
  return 0;
}

static int l_cupti_close(lua_State *L) {
  (void)L;
  mla_cupti_close();
  return 0;
}

/* core.cupti_available() -> true, or false and the reason */
static int l_cupti_available(lua_State *L) {
  const char *why = NULL;
  int ok = mla_cupti_available(&why);
  return push_available(L, ok, why);
}

static int l_timing_abort(lua_State *L) {
  mla_timing_abort(gpu_arg(L, 1));
  return 0;
}

static int l_timing_info(lua_State *L) {
  mla_timing_info i;
  if (mla_timing_info_get(gpu_arg(L, 1), &i)) return mla_lua_errorf(L, "timing_info");
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, i.l2_bytes), lua_setfield(L, -2, "l2_bytes");
  lua_pushnumber(L, i.default_sm_mhz), lua_setfield(L, -2, "default_sm_mhz");
  lua_pushboolean(L, i.nvml_ok), lua_setfield(L, -2, "nvml");
  lua_pushstring(L, i.nvml_status), lua_setfield(L, -2, "nvml_status");
  return 1;
}

/* core.sm_clock(dev) -> MHz, or nil and the reason */
static int l_sm_clock(lua_State *L) {
  double mhz;
  if (mla_nvml_sm_clock(gpu_arg(L, 1), &mhz)) {
    lua_pushnil(L);
    lua_pushstring(L, mla_errmsg());
    return 2;
  }
  lua_pushnumber(L, mhz);
  return 1;
}

/* ---- graphs ------------------------------------------------------------- */

static lgraph *check_graph(lua_State *L, int idx) {
  lgraph *g = luaL_checkudata(L, idx, MLA_GRAPH_MT);
  if (!g->exec) luaL_argerror(L, idx, "attempt to use a closed graph");
  return g;
}

static int l_graph_begin(lua_State *L) {
  if (mla_graph_begin(gpu_arg(L, 1))) return mla_lua_errorf(L, "graph capture");
  return 0;
}

static int l_graph_end(lua_State *L) {
  int dev = gpu_arg(L, 1);
  lgraph *g = lua_newuserdatauv(L, sizeof *g, 0);
  memset(g, 0, sizeof *g);
  luaL_setmetatable(L, MLA_GRAPH_MT);
  g->dev = dev;
  if (mla_graph_end(dev, &g->exec, &g->nodes)) return mla_lua_errorf(L, "graph capture");
  return 1;
}

static int l_graph_abort(lua_State *L) {
  mla_graph_abort(gpu_arg(L, 1));
  return 0;
}

static int l_graph_launch(lua_State *L) {
  lgraph *g = check_graph(L, 1);
  if (mla_graph_launch(g->dev, g->exec)) return mla_lua_errorf(L, "graph launch");
  return 0;
}

static int l_graph_nodes(lua_State *L) {
  lua_pushinteger(L, check_graph(L, 1)->nodes);
  return 1;
}

static int l_graph_close(lua_State *L) {
  lgraph *g = luaL_checkudata(L, 1, MLA_GRAPH_MT);
  mla_graph_destroy(g->exec);
  g->exec = NULL;
  return 0;
}

/* ---- reference rates ---------------------------------------------------- */

static int l_memcpy_bandwidth(lua_State *L) {
  int dev = gpu_arg(L, 1);
  lua_Integer bytes = luaL_optinteger(L, 2, (lua_Integer)1 << 30);
  int reps = (int)luaL_optinteger(L, 3, 20);
  double gbs;
  if (mla_memcpy_bandwidth(dev, bytes, reps, &gbs)) return mla_lua_errorf(L, "memcpy_bandwidth");
  lua_pushnumber(L, gbs);
  return 1;
}

static int l_gemm_rate(lua_State *L) {
  int dev = gpu_arg(L, 1);
  int n = (int)luaL_optinteger(L, 2, 8192), reps = (int)luaL_optinteger(L, 3, 20);
  double tf;
  if (mla_gemm_rate(dev, n, reps, &tf)) return mla_lua_errorf(L, "gemm_rate");
  lua_pushnumber(L, tf);
  return 1;
}

/* core.reference_op(dev, "memcpy" | "gemm", size) -> an operation that
 * op:launch() enqueues on the device stream (timed by mla.bench like any
 * kernel); op:close() frees it (also on collection). */
#define MLA_REF_OP_MT "mlalab.reference_op"
typedef struct lref { mla_ref_op *op; } lref;

static int l_reference_op(lua_State *L) {
  int dev = gpu_arg(L, 1);
  static const char *const kinds[] = {"memcpy", "gemm", NULL};
  const int kind = luaL_checkoption(L, 2, NULL, kinds);
  lua_Integer size = luaL_checkinteger(L, 3);
  lref *r = lua_newuserdatauv(L, sizeof *r, 0);
  r->op = NULL;
  luaL_setmetatable(L, MLA_REF_OP_MT);
  if (mla_ref_op_new(dev, kind == 0 ? MLA_REF_MEMCPY : MLA_REF_GEMM, (int64_t)size, &r->op))
    return mla_lua_errorf(L, "reference_op");
  return 1;
}

static int l_reference_launch(lua_State *L) {
  lref *r = luaL_checkudata(L, 1, MLA_REF_OP_MT);
  if (!r->op) return luaL_error(L, "reference_op: launch after close");
  if (mla_ref_op_launch(r->op)) return mla_lua_errorf(L, "reference_op launch");
  return 0;
}

static int l_reference_close(lua_State *L) {
  lref *r = luaL_checkudata(L, 1, MLA_REF_OP_MT);
  mla_ref_op_free(r->op);
  r->op = NULL;
  return 0;
}

/* A handle's metatable: its methods as __index, and close as __gc and __close. */
static void handle_metatable(lua_State *L, const char *name, const luaL_Reg *methods, lua_CFunction close) {
  luaL_newmetatable(L, name);
  lua_newtable(L);
  luaL_setfuncs(L, methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, close), lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, close), lua_setfield(L, -2, "__close");
  lua_pop(L, 1);
}

MLA_LUA_MODULE(timing) {
  static const luaL_Reg graph_methods[] = {
    {"launch", l_graph_launch}, {"nodes", l_graph_nodes}, {"close", l_graph_close}, {NULL, NULL}};
  static const luaL_Reg ref_methods[] = {{"launch", l_reference_launch}, {"close", l_reference_close}, {NULL, NULL}};
  static const luaL_Reg fns[] = {
    {"clock", l_clock}, {"sleep", l_sleep},
    {"timing_begin", l_timing_begin}, {"timing_next", l_timing_next}, {"timing_end", l_timing_end},
    {"timing_abort", l_timing_abort},
    {"cupti_open", l_cupti_open}, {"cupti_close", l_cupti_close}, {"cupti_available", l_cupti_available},
    {"pm_open", l_pm_open}, {"pm_close", l_pm_close}, {"pm_available", l_pm_available},
    {"timing_info", l_timing_info}, {"sm_clock", l_sm_clock},
    {"graph_begin", l_graph_begin}, {"graph_end", l_graph_end}, {"graph_abort", l_graph_abort},
    {"memcpy_bandwidth", l_memcpy_bandwidth}, {"gemm_rate", l_gemm_rate}, {"reference_op", l_reference_op},
    {NULL, NULL}};
  handle_metatable(L, MLA_GRAPH_MT, graph_methods, l_graph_close);
  handle_metatable(L, MLA_REF_OP_MT, ref_methods, l_reference_close);
  luaL_setfuncs(L, fns, 0);
}
