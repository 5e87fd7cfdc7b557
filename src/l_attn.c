/* Lua bindings for MLA decode attention (src/attn.h):
 *   core.attn_decode(opts) -> plan table (baked kernels, CUDA tensors)
 *   core.attn_decode_ref(opts)            (CPU reference, CPU tensors)
 * opts: layout (packed descriptor), pages, tensor_scale?, q, block_table +
 * cache_lens (+ causal) or indices (+ topk_len), sink?, scale, out, lse,
 * check (validate index values on the host), splits (baked, 0 = auto),
 * specialize (baked, default true; false forces the generic kernel, "slice" the V-slice kernel for 16-row tiles,
 * "wide" 64-row tiles whatever the row count), causal_tail (baked, default true; false: attn.h's
 * shared_causal_tiles).
 *   core.attn_last_variant() -> "generic" | "wgmma" | "wgmma16rs" | built-in layout name (V-slice kernel) | "none"
 *   core.attn_num_splits(family, sm_count, ctas_per_sm, ctas, max_tiles, align?) -> the automatic split count
 * lua/mlalab/attention.lua allocates outputs and gives friendlier errors;
 * every rule is enforced here too, so no call can crash. */
#include <math.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "attn.h"
#include "kernels/attn_decode.h"
#include "l_common.h"
#include "layout_check.h"
#include "mla_error.h"
#include "ref/attn_ref.h"

static int lerrf(lua_State *L, const char *fmt, ...) MLA_PRINTF(2, 3);
static int lerrf(lua_State *L, const char *fmt, ...) {
  char buf[640];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return luaL_error(L, "%s", buf);
}

typedef struct call {
  lua_State *L;
  const char *fn;
  int opts, dev; /* device of the pages */
} call;

/* Field `name` of the options as a tensor (left on the stack; its index in
 * *idx), or NULL when absent and optional. */
static mla_tensor *field_tensor(call *c, const char *name, int required, int *idx) {
  lua_getfield(c->L, c->opts, name);
  *idx = lua_gettop(c->L);
  if (lua_isnil(c->L, -1)) {
    if (required) lerrf(c->L, "%s: %s is required", c->fn, name);
    return NULL;
  }
  mla_tensor *t = mla_test_tensor(c->L, -1);
  if (!t) lerrf(c->L, "%s: %s must be a tensor, got a %s", c->fn, name, luaL_typename(c->L, -1));
  if (!t->storage) lerrf(c->L, "%s: %s is a closed tensor", c->fn, name);
  return t;
}

static void fmt_shape(const mla_tensor *t, char *buf, size_t n) {
  size_t o = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < t->ndim && o < n; i++) o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)t->sizes[i]);
  if (o < n) snprintf(buf + o, n - o, "]");
}

/* dtype, shape (sizes[i] < 0: any), device, and optionally contiguity. */
static void expect(call *c, const mla_tensor *t, const char *name, mla_dtype dt, int ndim, const int64_t *sizes,
                   int contiguous, const char *what) {
  char got[160], dn[32], pn[32];
  fmt_shape(t, got, sizeof got);
  if (t->dtype != dt)
    lerrf(c->L, "%s: %s must be %s %s, got %s %s", c->fn, name, mla_dtype_name(dt), what, mla_dtype_name(t->dtype), got);
  int ok = t->ndim == ndim;
  for (int i = 0; ok && i < ndim; i++) ok = sizes[i] < 0 || t->sizes[i] == sizes[i];
  if (!ok) lerrf(c->L, "%s: %s must be %s, got %s", c->fn, name, what, got);
  if (mla_tensor_device(t) != c->dev)
    lerrf(c->L, "%s: %s is on %s but the cache pages are on %s", c->fn, name,
          mla_device_name(mla_tensor_device(t), dn, sizeof dn), mla_device_name(c->dev, pn, sizeof pn));
  if (contiguous && !mla_tensor_is_contiguous(t)) lerrf(c->L, "%s: %s must be contiguous (call :contiguous())", c->fn, name);
}

static const void *data_of(call *c, const mla_tensor *t) {
  void *p = NULL;
  if (t && mla_tensor_data(t, &p)) mla_lua_errorf(c->L, c->fn);
  return p;
}

/* A host copy of a small int32 tensor (the tensor itself when on the CPU). */
static const int32_t *host_i32(call *c, const mla_tensor *t, mla_tensor *tmp) {
  memset(tmp, 0, sizeof *tmp);
  if (!t) return NULL;
  if (mla_tensor_device(t) == MLA_CPU) return data_of(c, t);
  if (mla_tensor_empty(tmp, MLA_I32, t->ndim, t->sizes, MLA_CPU) || mla_tensor_copy(tmp, t, NULL)) mla_lua_errorf(c->L, c->fn);
  return data_of(c, tmp);
}

typedef struct decode_in {
  const mla_layout_desc *d;
  mla_cache_view v;
  mla_attn_args a;
  mla_tensor *bt, *lens, *idx, *tlen, *out, *lse;
  int check, splits, specialize;
} decode_in;

/* Reads and checks every option; outputs must be `out_dt` (MLA_DTYPE_COUNT: bf16 or f32). */
static void read_inputs(call *c, decode_in *in, mla_dtype out_dt) {
  lua_State *L = c->L;
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checkstack(L, 40, "attention options");
  c->opts = 1;
  memset(in, 0, sizeof *in);
  lua_getfield(L, 1, "layout");
  in->d = mla_check_layout_desc(L, lua_gettop(L));
  int pages_idx, scale_idx, i;
  field_tensor(c, "pages", 1, &pages_idx);
  field_tensor(c, "tensor_scale", 0, &scale_idx);
  c->dev = mla_check_cache_view(L, in->d, pages_idx, scale_idx, &in->v);
  if (mla_layout_has_tensor_scale(in->d) && !in->v.tensor_scale)
    lerrf(L, "%s: the layout scales by a per-tensor scale: pass tensor_scale (an f32 tensor of 1 element)", c->fn);

  mla_tensor *q = field_tensor(c, "q", 1, &i);
  if (q->ndim != 4) {
    char got[160];
    fmt_shape(q, got, sizeof got);
    lerrf(L, "%s: q must be bf16 [b, s_q, h_q, d_qk], got %d dims %s", c->fn, q->ndim, got);
  }
  mla_attn_args *a = &in->a;
  a->b = q->sizes[0], a->s_q = q->sizes[1], a->h_q = q->sizes[2], a->d_qk = q->sizes[3];
  a->d_v = in->d->v_dims;
  int64_t qs[4] = {-1, -1, -1, in->d->k_dims};
  expect(c, q, "q", MLA_BF16, 4, qs, 0, "[b, s_q, h_q, d_qk = layout k_dims]");
  a->q = data_of(c, q);
  for (int k = 0; k < 4; k++) a->q_stride[k] = q->strides[k];

  in->idx = field_tensor(c, "indices", 0, &i);
  in->bt = field_tensor(c, "block_table", 0, &i);
  in->lens = field_tensor(c, "cache_lens", 0, &i);
  in->tlen = field_tensor(c, "topk_len", 0, &i);
  lua_getfield(L, 1, "causal");
  a->causal = lua_toboolean(L, -1);
  lua_getfield(L, 1, "causal_tail");
  if (!lua_isnil(L, -1) && !lua_isboolean(L, -1))
    lerrf(L, "%s: causal_tail must be a boolean, got %s", c->fn, luaL_typename(L, -1));
  a->shared_causal_tiles = lua_isboolean(L, -1) && !lua_toboolean(L, -1);
  a->sparse = in->idx != NULL;
  if (a->sparse) {
    if (in->bt || in->lens) lerrf(L, "%s: pass indices (sparse) or block_table and cache_lens (dense), not both", c->fn);
    if (a->causal) lerrf(L, "%s: causal applies to dense decode; sparse queries see exactly their indices", c->fn);
    int64_t is[3] = {a->b, a->s_q, -1};
    expect(c, in->idx, "indices", MLA_I32, 3, is, 1, "[b, s_q, topk] (slot ids, -1 for none)");
    a->topk = in->idx->sizes[2];
    a->indices = data_of(c, in->idx);
    if (in->tlen) {
      int64_t ts[1] = {a->b};
      expect(c, in->tlen, "topk_len", MLA_I32, 1, ts, 1, "[b]");
      a->topk_len = data_of(c, in->tlen);
    }
  } else {
    if (!in->bt || !in->lens) lerrf(L, "%s: dense decode needs block_table and cache_lens (or pass indices for sparse)", c->fn);
    if (in->tlen) lerrf(L, "%s: topk_len applies to sparse decode (with indices)", c->fn);
    int64_t bs[2] = {a->b, -1}, ls[1] = {a->b};
    expect(c, in->bt, "block_table", MLA_I32, 2, bs, 1, "[b, max_blocks]");
    expect(c, in->lens, "cache_lens", MLA_I32, 1, ls, 1, "[b]");
    a->block_table = data_of(c, in->bt), a->max_blocks = in->bt->sizes[1];
    a->cache_lens = data_of(c, in->lens);
  }
  mla_tensor *sink = field_tensor(c, "sink", 0, &i);
  if (sink) {
    int64_t ss[1] = {a->h_q};
    expect(c, sink, "sink", MLA_F32, 1, ss, 1, "[h_q] (one logit per head)");
    a->sink = data_of(c, sink);
  }
  lua_getfield(L, 1, "scale");
  if (!lua_isnumber(L, -1)) lerrf(L, "%s: scale must be a number (the softmax scale, e.g. d_qk^-0.5)", c->fn);
  double sc = lua_tonumber(L, -1);
  if (!isfinite(sc) || sc <= 0) lerrf(L, "%s: scale = %g must be finite and positive", c->fn, sc);
  a->scale = (float)sc;

  int64_t os[4] = {a->b, a->s_q, a->h_q, a->d_v}, ls[3] = {a->b, a->h_q, a->s_q};
  in->out = field_tensor(c, "out", 1, &i);
  if (out_dt == MLA_DTYPE_COUNT) out_dt = in->out->dtype == MLA_F32 ? MLA_F32 : MLA_BF16;
  expect(c, in->out, "out", out_dt, 4, os, 1, "[b, s_q, h_q, d_v]");
  in->lse = field_tensor(c, "lse", 1, &i);
  expect(c, in->lse, "lse", MLA_F32, 3, ls, 1, "[b, h_q, s_q]");
  lua_getfield(L, 1, "check");
  in->check = lua_isnil(L, -1) ? 1 : lua_toboolean(L, -1);
  lua_getfield(L, 1, "splits");
  in->splits = lua_isnil(L, -1) ? 0 : (int)luaL_checkinteger(L, -1);
  if (in->splits < 0 || in->splits > 4096) lerrf(L, "%s: splits = %d must be 0 (automatic) to 4096", c->fn, in->splits);
  lua_getfield(L, 1, "specialize");
  const int is_str = lua_type(L, -1) == LUA_TSTRING;
  const int slice = is_str && strcmp(lua_tostring(L, -1), "slice") == 0, wide = is_str && strcmp(lua_tostring(L, -1), "wide") == 0;
  if (!lua_isnil(L, -1) && !lua_isboolean(L, -1) && !slice && !wide)
    lerrf(L, "%s: specialize must be true, false (the generic kernel), \"slice\" (the V-slice kernel for 16-row "
          "tiles) or \"wide\" (64-row tiles), got %s", c->fn, is_str ? lua_tostring(L, -1) : luaL_typename(L, -1));
  in->specialize = slice  ? MLA_ATTN_SLICE
                   : wide ? MLA_ATTN_WIDE
                   : lua_isnil(L, -1) || lua_toboolean(L, -1) ? MLA_ATTN_SPECIALIZED
                                                              : MLA_ATTN_GENERIC;
}

/* Host check of the index values; returns the most keys any problem has. */
static int64_t check_values(call *c, decode_in *in) {
  mla_tensor t_bt, t_lens, t_idx, t_tlen;
  mla_attn_args h = in->a;
  h.block_table = host_i32(c, in->bt, &t_bt);
  h.cache_lens = host_i32(c, in->lens, &t_lens);
  h.indices = host_i32(c, in->idx, &t_idx);
  h.topk_len = host_i32(c, in->tlen, &t_tlen);
  int rc = mla_attn_check_values(in->d, in->v.num_pages, &h);
  int64_t most = h.sparse ? h.topk : 0;
  if (!rc && !h.sparse)
    for (int64_t r = 0; r < h.b; r++) most = h.cache_lens[r] > most ? h.cache_lens[r] : most;
  mla_tensor_release(&t_bt), mla_tensor_release(&t_lens), mla_tensor_release(&t_idx), mla_tensor_release(&t_tlen);
  if (rc) mla_lua_errorf(c->L, c->fn);
  return most;
}

static int l_attn_decode_ref(lua_State *L) {
  call c = {L, "attention (ref)", 1, MLA_CPU};
  decode_in in;
  read_inputs(&c, &in, MLA_F32);
  if (c.dev != MLA_CPU) return lerrf(L, "%s: the reference runs on the host: pass CPU tensors", c.fn);
  check_values(&c, &in); /* always: the reference dereferences every index */
  if (mla_ref_attn_decode(in.d, &in.v, &in.a, (float *)data_of(&c, in.out), (float *)data_of(&c, in.lse)))
    return mla_lua_errorf(L, c.fn);
  return 0;
}

/* core.attn_check(opts): the checks alone (arguments and index values), for
 * the JIT path. */
static int l_attn_check(lua_State *L) {
  call c = {L, "attention (jit)", 1, MLA_CPU};
  decode_in in;
  read_inputs(&c, &in, MLA_DTYPE_COUNT);
  check_values(&c, &in);
  return 0;
}

static void set_int(lua_State *L, const char *k, int64_t v) { lua_pushinteger(L, (lua_Integer)v), lua_setfield(L, -2, k); }

static int l_attn_decode(lua_State *L) {
  call c = {L, "attention (baked)", 1, MLA_CPU};
  decode_in in;
  read_inputs(&c, &in, MLA_BF16);
  if (c.dev == MLA_CPU) return lerrf(L, "%s: the baked kernels run on a CUDA device; use impl='ref' for CPU tensors", c.fn);
  if (mla_attn_baked_supports(in.d, &in.a) != 1) return mla_lua_errorf(L, c.fn);
  /* the kernels write whole 16-byte pieces of the output rows */
  if ((uintptr_t)data_of(&c, in.out) % 16)
    return lerrf(L, "%s: out must start at a 16-byte aligned address (its storage offset is %lld elements); "
                 "pass a fresh tensor or one whose offset is a multiple of 8", c.fn, (long long)in.out->offset);
  int64_t max_keys = in.a.sparse ? in.a.topk : in.a.max_blocks * in.d->block_size;
  if (in.check) max_keys = check_values(&c, &in);
  mla_attn_plan plan;
  memset(&plan, 0, sizeof plan);
  if (mla_cuda_attn_decode(in.d, &in.v, &in.a, max_keys, in.splits, in.specialize, (void *)data_of(&c, in.out),
                           (float *)data_of(&c, in.lse), c.dev, &plan))
    return mla_lua_errorf(L, c.fn);
  lua_createtable(L, 0, 8);
  set_int(L, "splits", plan.splits), set_int(L, "rows_per_cta", plan.rows_per_cta), set_int(L, "ctas", plan.ctas);
  set_int(L, "stages", plan.stages), set_int(L, "tile_keys", plan.tile_keys), set_int(L, "ctas_per_sm", plan.ctas_per_sm), set_int(L, "smem", plan.smem);
  lua_pushboolean(L, plan.identity), lua_setfield(L, -2, "identity");
  lua_pushboolean(L, plan.causal_tail), lua_setfield(L, -2, "causal_tail");
  lua_pushstring(L, plan.variant ? plan.variant : "generic"), lua_setfield(L, -2, "variant");
  return 1;
}

/* core.attn_last_variant() -> what the last baked launch ran ("generic", a built-in layout's name, "none") */
static int l_attn_last_variant(lua_State *L) {
  lua_pushstring(L, mla_attn_last_variant());
  return 1;
}

/* core.attn_num_splits(family, sm_count, ctas_per_sm, ctas, max_tiles, align) -> the split count the
 * baked launcher picks (family "rs16", "wg64" or "two_per_sm"): the model alone, on any device */
static int l_attn_num_splits(lua_State *L) {
  static const char *const fams[] = {"rs16", "wg64", "two_per_sm", NULL};
  static const mla_split_family ids[] = {MLA_SPLIT_RS16, MLA_SPLIT_WG64, MLA_SPLIT_TWO_PER_SM};
  const int f = luaL_checkoption(L, 1, NULL, fams);
  const lua_Integer sm = luaL_checkinteger(L, 2), per_sm = luaL_checkinteger(L, 3), ctas = luaL_checkinteger(L, 4);
  const lua_Integer tiles = luaL_checkinteger(L, 5), align = luaL_optinteger(L, 6, 1);
  luaL_argcheck(L, sm >= 1 && sm <= 1 << 20, 2, "SM count out of range");
  luaL_argcheck(L, per_sm >= 1 && per_sm <= 64, 3, "CTAs a SM out of range");
  luaL_argcheck(L, ctas >= 1 && ctas <= 0x7fffffff, 4, "CTA count must be in 1 .. 2^31 - 1");
  luaL_argcheck(L, tiles >= 0 && tiles <= 0x7fffffff, 5, "tile count must be in 0 .. 2^31 - 1");
  luaL_argcheck(L, align >= 1 && align <= 1 << 20, 6, "alignment out of range");
  lua_pushinteger(L, mla_attn_num_splits(ids[f], (int)sm, (int)per_sm, (int64_t)ctas, (int64_t)tiles, (int)align));
  return 1;
}

MLA_LUA_MODULE(attn) {
  static const luaL_Reg fns[] = {{"attn_decode", l_attn_decode}, {"attn_decode_ref", l_attn_decode_ref},
                                 {"attn_check", l_attn_check}, {"attn_last_variant", l_attn_last_variant},
                                 {"attn_num_splits", l_attn_num_splits}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
