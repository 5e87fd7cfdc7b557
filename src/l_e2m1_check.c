/* The division-free e2m1 encoder of the fp4 writes (mla/e2m1_div.h) run on
 * the host, over its whole domain, against the reference: every e4m3 scale
 * code in [2^-9, 448] or NaN times every bf16 pattern (NaN x only with a NaN
 * scale), each code compared with e2m1(x / s) as src/ref quantizes (fp32
 * division, src/dtype.c's satfinite ties-to-even encoder). The host runs the
 * kernels' source with its f16 pair instructions in software (mla/f16x2.h),
 * so a CPU-only CI checks the encoder's argument; the #gpu spec checks the
 * device code the same way. */
#include "dtype.h"
#include "l_common.h"
#include "mla/e2m1_div.h"

/* core.e2m1_div_check([r_scale]) -> {pairs, mismatches, first_scale_code,
 * first_x}: r_scale multiplies 1 / s (1: the kernels' r; anything else, to
 * show that the check sees a wrong quotient) */
static int l_e2m1_div_check(lua_State *L) {
  const double r_scale = luaL_optnumber(L, 1, 1.0);
  int64_t pairs = 0, bad = 0;
  int first_code = -1, first_x = -1;
  for (int code = 0; code < 256; code++) {
    const float s = (float)mla_e4m3_to_double((uint8_t)code);
    if (!(s != s || (s >= 0x1p-9f && s <= 448.0f))) continue;
    const float r = (float)((double)(1.0f / s) * r_scale);
    for (uint32_t j = 0; j < 65536 / 8; j++) {
      uint32_t w[4];
      for (int k = 0; k < 4; k++) w[k] = (8 * j + 2 * k) | (8 * j + 2 * k + 1) << 16;
      const uint32_t got = mla_e2m1x8_encode_bf16_div(w[0], w[1], w[2], w[3], s, r);
      for (int k = 0; k < 8; k++) {
        const uint32_t h = 8 * j + (uint32_t)k;
        const float x = mla_u2f(h << 16);
        if (x != x && s == s) continue;
        pairs++;
        if (((got >> (4 * k)) & 15u) != mla_double_to_e2m1((double)MLA_FDIV(x, s))) {
          if (bad++ == 0) first_code = code, first_x = (int)h;
        }
      }
    }
  }
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, pairs), lua_setfield(L, -2, "pairs");
  lua_pushinteger(L, bad), lua_setfield(L, -2, "mismatches");
  lua_pushinteger(L, first_code), lua_setfield(L, -2, "first_scale_code");
  lua_pushinteger(L, first_x), lua_setfield(L, -2, "first_x");
  return 1;
}

MLA_LUA_MODULE(e2m1_check) {
  static const luaL_Reg fns[] = {{"e2m1_div_check", l_e2m1_div_check}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
