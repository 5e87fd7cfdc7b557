/* Shared helpers for the Lua bindings (l_*.c). Bindings check arguments,
 * call the C core, and turn its errors into Lua errors; nothing else. */
#ifndef MLA_L_COMMON_H
#define MLA_L_COMMON_H

#include <lauxlib.h>
#include <lua.h>

#include "dtype.h"
#include "tensor.h"

#define MLA_TENSOR_MT "mlalab.Tensor"

/* Raises the core's current error message as a Lua error (never returns). */
int mla_lua_error(lua_State *L);
/* Raises "<fn>: <core message>" */
int mla_lua_errorf(lua_State *L, const char *fn);

/* Tensors as userdata: the userdata holds the mla_tensor itself. */
mla_tensor *mla_check_tensor(lua_State *L, int idx); /* errors on closed tensors too */
mla_tensor *mla_test_tensor(lua_State *L, int idx);  /* NULL if not a tensor */
/* Pushes a new userdata; the caller fills the returned struct (storage NULL
 * until then, which __gc tolerates). */
mla_tensor *mla_push_tensor(lua_State *L);

mla_dtype mla_check_dtype(lua_State *L, int idx);
mla_dtype mla_opt_dtype(lua_State *L, int idx, mla_dtype def);
/* "cpu", "cuda", "cuda:N", or nil for the default device */
int mla_check_device(lua_State *L, int idx);
int mla_opt_device(lua_State *L, int idx);
int mla_default_device(lua_State *L);
/* Reads a shape: a table of sizes or the integers from idx on. */
int mla_check_shape(lua_State *L, int idx, int64_t *sizes);
/* Field of an options table (or nil); leaves the value on the stack. */
int mla_opt_field(lua_State *L, int idx, const char *name);
const char *mla_device_name(int dev, char *buf, size_t n);

/* Layout descriptors travel between Lua and C as Lua strings holding the
 * packed struct (core.layout_pack(desc_table) builds one; see
 * lua/mlalab/layout.lua). Implemented in l_layout.c. */
#include "mla/layout_desc.h"
const mla_layout_desc *mla_check_layout_desc(lua_State *L, int idx);
/* The cache view a kernel receives, from a tensor holding one layer's pages
 * (u8 [pages, page_bytes], or [pages, block_size, row] for one-region
 * layouts) and an optional f32 tensor-scale tensor at scale_idx (0 = none).
 * Checks dtype, dims, page stride and alignment against the descriptor and
 * raises a Lua error naming what is wrong. Returns the tensor's device. */
int mla_check_cache_view(lua_State *L, const mla_layout_desc *d, int tensor_idx, int scale_idx, mla_cache_view *v);

/* A binding with its doc, the text `help` shows for it: a first line with the
 * call and what it returns, then what a user needs to know. The doc lives
 * here, beside the function, so it cannot drift from it. */
typedef struct mla_doc_reg {
  const char *name;
  lua_CFunction fn;
  const char *doc;
} mla_doc_reg;
/* luaL_setfuncs for documented bindings (no upvalues): sets each function
 * into the table at the top of the stack and records its doc for core.doc. */
void mla_set_documented(lua_State *L, const mla_doc_reg *r);

/* Module registration: each l_*.c adds its functions to the core table with
 *   MLA_LUA_MODULE(name) { ...fill the table on top of L... }
 * A constructor records the opener, so adding a binding file needs no edit
 * anywhere else (CMake globs src/). Openers run in file-name order. */
typedef void (*mla_lua_opener)(lua_State *L);
void mla_register_opener(const char *name, mla_lua_opener fn);
#define MLA_LUA_MODULE(name)                                                               \
  static void mla_open_##name(lua_State *L);                                               \
  __attribute__((constructor)) static void mla_register_##name(void) {                     \
    mla_register_opener(#name, mla_open_##name);                                           \
  }                                                                                        \
  static void mla_open_##name(lua_State *L)

#endif
