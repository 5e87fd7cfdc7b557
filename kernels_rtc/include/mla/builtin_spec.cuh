/* Built-in layouts as types, for kernels specialized at compile time on a
 * descriptor from builtin_layouts.h. MLA_BUILTIN_SPEC(name, init) defines, in
 * the enclosing namespace (one of the kernel file's own):
 *   dev_<name>   the descriptor as a __device__ constexpr, what device code reads
 *                (a reference template parameter to a __device__ variable would
 *                not survive nvcc's host stub, hence a type);
 *   spec_<name>  ::host (the constexpr descriptor for host code and constant
 *                expressions), ::name, ::d() (dev_<name> in device code).
 * Expand it over MLA_BUILTIN_LAYOUTS (the built-ins whose rows are whole), or for
 * the layouts a kernel serves (a chunked one only where the kernel addresses
 * pieces: mla_region_base). */
#ifndef MLA_BUILTIN_SPEC_CUH
#define MLA_BUILTIN_SPEC_CUH

#include "builtin_layouts.h"

#define MLA_BUILTIN_SPEC(n, init)                                                                                      \
  __device__ constexpr mla_layout_desc dev_##n = init;                                                                 \
  struct spec_##n {                                                                                                    \
    static constexpr mla_layout_desc host = init;                                                                      \
    static constexpr const char *name = #n;                                                                            \
    static __device__ __forceinline__ const mla_layout_desc &d() { return dev_##n; }                                   \
  };

#endif
