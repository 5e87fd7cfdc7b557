/* Lua bindings of the KV-cache operations (src/kv.h). The cache arguments
 * are (packed descriptor, pages tensor, tensor_scale or nil), checked by
 * l_layout.c; the device of the pages picks the CPU reference or the baked
 * kernel. lua/mlalab/kernels.lua wraps these with friendlier arguments.
 *   core.kv_write(desc, pages, scale, slot_mapping, rows_a [, rows_b])
 *   core.kv_gather_sparse(desc, pages, scale, slots, out [, remap])
 *   core.kv_gather_dense(desc, pages, scale, block_table, cu_seq_lens, seq_starts|nil, out)
 *   core.kv_gather_raw(desc, pages, scale, block_table, cu_seq_lens, seq_starts|nil, {out per region})
 *   core.kv_requant(src_desc, src_pages, src_scale, dst_desc, dst_pages)
 *   core.kv_compact(desc, pages, scale, indices [, ncols]) -> rows, remap, pages
 *   core.kv_compact_into(desc, pages, scale, indices, rows, remap, page_list, count)
 *   core.kv_topk_paged(topk, block_table, block_size, token_req|nil, cu_q|nil, out [, lens])
 *   core.kv_topk_ragged(topk, cu_k, token_req|nil, cu_q|nil, out [, lens])
 *   core.kv_take_bad(device) -> skipped out-of-range indices since the last call */
#include "kernels/kv_kernels.h"
#include "kv.h"
#include "l_common.h"
#include "mla_error.h"

static mla_tensor *opt_tensor(lua_State *L, int idx) { return lua_isnoneornil(L, idx) ? NULL : mla_check_tensor(L, idx); }

static int check_cache(lua_State *L, int idx, mla_kv_cache *c) {
  c->desc = *mla_check_layout_desc(L, idx);
  return mla_check_cache_view(L, &c->desc, idx + 1, idx + 2, &c->view);
}

static int l_kv_write(lua_State *L) {
  mla_kv_cache c;
  int dev = check_cache(L, 1, &c);
  if (mla_kv_write(&c, dev, mla_check_tensor(L, 4), mla_check_tensor(L, 5), opt_tensor(L, 6)))
    return mla_lua_errorf(L, "kv_write");
  return 0;
}

static int l_kv_gather_sparse(lua_State *L) {
  mla_kv_cache c;
  int dev = check_cache(L, 1, &c);
  if (mla_kv_gather_sparse(&c, dev, mla_check_tensor(L, 4), mla_check_tensor(L, 5), opt_tensor(L, 6)))
    return mla_lua_errorf(L, "kv_gather_sparse");
  return 0;
}

static int l_kv_gather_dense(lua_State *L) {
  mla_kv_cache c;
  int dev = check_cache(L, 1, &c);
  if (mla_kv_gather_dense(&c, dev, mla_check_tensor(L, 4), mla_check_tensor(L, 5), opt_tensor(L, 6),
                          mla_check_tensor(L, 7)))
    return mla_lua_errorf(L, "kv_gather_dense");
  return 0;
}

static int l_kv_gather_raw(lua_State *L) {
  mla_kv_cache c;
  int dev = check_cache(L, 1, &c);
  luaL_checktype(L, 7, LUA_TTABLE);
  mla_tensor *out[MLA_LAYOUT_MAX_REGIONS];
  int n = (int)luaL_len(L, 7);
  if (n > MLA_LAYOUT_MAX_REGIONS) return luaL_error(L, "kv_gather_raw: %d output tensors, at most %d", n, MLA_LAYOUT_MAX_REGIONS);
  for (int i = 0; i < n; i++) {
    lua_geti(L, 7, i + 1);
    out[i] = mla_check_tensor(L, -1);
    lua_pop(L, 1); /* the table keeps it alive */
  }
  if (mla_kv_gather_raw(&c, dev, mla_check_tensor(L, 4), mla_check_tensor(L, 5), opt_tensor(L, 6), out, n))
    return mla_lua_errorf(L, "kv_gather_raw");
  return 0;
}

static int l_kv_requant(lua_State *L) {
  mla_kv_cache src, dst;
  int sdev = check_cache(L, 1, &src);
  dst.desc = *mla_check_layout_desc(L, 4);
  int ddev = mla_check_cache_view(L, &dst.desc, 5, 0, &dst.view);
  if (sdev != ddev) return luaL_error(L, "kv_requant: the source and destination pages are on different devices");
  if (mla_kv_requant(&src, &dst, sdev)) return mla_lua_errorf(L, "kv_requant");
  return 0;
}

static int l_kv_compact(lua_State *L) {
  mla_kv_cache c;
  int dev = check_cache(L, 1, &c);
  mla_tensor *idx = mla_check_tensor(L, 4);
  lua_Integer ncols = luaL_optinteger(L, 5, c.desc.dim);
  mla_tensor *rows = mla_push_tensor(L), *remap = mla_push_tensor(L), *pages = mla_push_tensor(L);
  if (mla_kv_compact(&c, dev, idx, (int64_t)ncols, rows, remap, pages)) return mla_lua_errorf(L, "kv_compact");
  return 3;
}

static int l_kv_compact_into(lua_State *L) {
  mla_kv_cache c;
  int dev = check_cache(L, 1, &c);
  if (mla_kv_compact_into(&c, dev, mla_check_tensor(L, 4), mla_check_tensor(L, 5), mla_check_tensor(L, 6),
                          mla_check_tensor(L, 7), mla_check_tensor(L, 8)))
    return mla_lua_errorf(L, "kv_compact_into");
  return 0;
}

static int l_kv_topk_paged(lua_State *L) {
  mla_tensor *topk = mla_check_tensor(L, 1);
  lua_Integer bs = luaL_checkinteger(L, 3);
  if (mla_kv_topk_paged(mla_tensor_device(topk), topk, mla_check_tensor(L, 2), (int64_t)bs, opt_tensor(L, 4),
                        opt_tensor(L, 5), mla_check_tensor(L, 6), opt_tensor(L, 7)))
    return mla_lua_errorf(L, "kv_topk_paged");
  return 0;
}

static int l_kv_topk_ragged(lua_State *L) {
  mla_tensor *topk = mla_check_tensor(L, 1);
  if (mla_kv_topk_ragged(mla_tensor_device(topk), topk, mla_check_tensor(L, 2), opt_tensor(L, 3), opt_tensor(L, 4),
                         mla_check_tensor(L, 5), opt_tensor(L, 6)))
    return mla_lua_errorf(L, "kv_topk_ragged");
  return 0;
}

static int l_kv_take_bad(lua_State *L) {
  int64_t n;
  if (mla_kv_take_bad(mla_check_device(L, 1), &n)) return mla_lua_errorf(L, "kv_take_bad");
  lua_pushinteger(L, (lua_Integer)n);
  return 1;
}

/* kv_specialize([on]) -> previous setting; kv_last_variant() -> name. */
static int l_kv_specialize(lua_State *L) {
  int was = mla_cuda_kv_specialize();
  if (!lua_isnoneornil(L, 1)) mla_cuda_kv_set_specialize(lua_toboolean(L, 1));
  lua_pushboolean(L, was);
  return 1;
}

static int l_kv_last_variant(lua_State *L) {
  lua_pushstring(L, mla_cuda_kv_last_variant());
  return 1;
}

MLA_LUA_MODULE(kv) {
  static const luaL_Reg fns[] = {{"kv_write", l_kv_write}, {"kv_gather_sparse", l_kv_gather_sparse},
                                 {"kv_gather_dense", l_kv_gather_dense}, {"kv_gather_raw", l_kv_gather_raw},
                                 {"kv_requant", l_kv_requant}, {"kv_compact", l_kv_compact},
                                 {"kv_compact_into", l_kv_compact_into},
                                 {"kv_topk_paged", l_kv_topk_paged}, {"kv_topk_ragged", l_kv_topk_ragged},
                                 {"kv_take_bad", l_kv_take_bad}, {"kv_specialize", l_kv_specialize},
                                 {"kv_last_variant", l_kv_last_variant}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
