/* Lua bindings for tensor comparison (src/compare.h). The verdict logic
 * (modes, tolerances, reports) lives in lua/mlalab/compare.lua. */
#include "compare.h"
#include "l_common.h"
#include "mla_error.h"

static int opt_flag(lua_State *L, int t, const char *k) {
  int v = mla_opt_field(L, t, k) != LUA_TNIL && lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

static double opt_num(lua_State *L, int t, const char *k, double def) {
  double v = mla_opt_field(L, t, k) == LUA_TNIL ? def : luaL_checknumber(L, -1);
  lua_pop(L, 1);
  return v;
}

static void set_int(lua_State *L, const char *k, int64_t v) { lua_pushinteger(L, (lua_Integer)v), lua_setfield(L, -2, k); }
static void set_num(lua_State *L, const char *k, double v) { lua_pushnumber(L, v), lua_setfield(L, -2, k); }

/* {idx=, a=, b=, abits=, bbits=}; bits as integers (u64 wraps to negative
 * for f64 NaNs with the sign bit, which string.format("%x") still prints). */
static void push_value(lua_State *L, const mla_cmp_value *v) {
  lua_createtable(L, 0, 5);
  set_int(L, "idx", v->idx);
  set_num(L, "a", v->a);
  set_num(L, "b", v->b);
  set_int(L, "abits", (int64_t)v->abits);
  set_int(L, "bbits", (int64_t)v->bbits);
}

/* core.compare(a, b, {exact=, close=, special=, no_nan=, atol=, rtol=, first=}) -> stats table */
static int l_compare(lua_State *L) {
  mla_tensor *a = mla_check_tensor(L, 1), *b = mla_check_tensor(L, 2);
  mla_cmp_params p = {0, 0, 0.0, 0.0};
  if (opt_flag(L, 3, "exact")) p.tests |= MLA_CMP_T_EXACT;
  if (opt_flag(L, 3, "close")) p.tests |= MLA_CMP_T_CLOSE;
  if (opt_flag(L, 3, "special")) p.tests |= MLA_CMP_T_SPECIAL;
  if (opt_flag(L, 3, "no_nan")) p.tests |= MLA_CMP_T_NO_NAN;
  p.atol = opt_num(L, 3, "atol", 0.0);
  p.rtol = opt_num(L, 3, "rtol", 0.0);
  if (p.atol < 0 || p.rtol < 0 || p.atol != p.atol || p.rtol != p.rtol)
    return luaL_error(L, "compare: atol and rtol must be non-negative numbers");
  int first = (int)opt_num(L, 3, "first", 5);
  mla_cmp_result r;
  if (mla_compare(a, b, &p, first, &r)) return mla_lua_error(L);
  const mla_cmp_partial *t = &r.total;
  lua_createtable(L, 0, 32);
  set_int(L, "numel", r.numel);
  set_int(L, "count", t->count);
  set_int(L, "bad", t->bad);
  set_int(L, "bits_diff", t->bits_diff);
  set_int(L, "close_fail", t->close_fail);
  set_int(L, "class_diff", t->class_diff);
  set_int(L, "nan_a", t->nan_a), set_int(L, "nan_b", t->nan_b);
  set_int(L, "inf_a", t->inf_a), set_int(L, "inf_b", t->inf_b);
  set_num(L, "sum_ab", t->sum_ab), set_num(L, "sum_aa", t->sum_aa);
  set_num(L, "sum_bb", t->sum_bb), set_num(L, "sum_dd", t->sum_dd);
  if (t->max_abs_idx >= 0) {
    set_num(L, "max_abs", t->max_abs);
    push_value(L, &r.at_max_abs), lua_setfield(L, -2, "at_max_abs");
  }
  if (t->max_rel_idx >= 0) {
    set_num(L, "max_rel", t->max_rel);
    push_value(L, &r.at_max_rel), lua_setfield(L, -2, "at_max_rel");
  }
  lua_createtable(L, r.nfirst, 0);
  for (int i = 0; i < r.nfirst; i++) push_value(L, &r.first[i]), lua_rawseti(L, -2, i + 1);
  lua_setfield(L, -2, "first");
  char buf[32];
  lua_pushstring(L, mla_device_name(r.device, buf, sizeof buf)), lua_setfield(L, -2, "ran_on");
  return 1;
}

MLA_LUA_MODULE(compare) {
  static const luaL_Reg fns[] = {{"compare", l_compare}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
