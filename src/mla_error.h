/* Error reporting for the Lua-free C core.
 * Core functions return a negative status and leave a message in a
 * thread-local buffer; the Lua bindings (l_*.c) turn it into a Lua error.
 * Keeping luaL_error out of the core lets fuzzers and C tests call it directly. */
#ifndef MLA_ERROR_H
#define MLA_ERROR_H

#include <stdio.h>
#include <stdlib.h>

#if defined(__GNUC__)
#define MLA_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MLA_PRINTF(a, b)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Sets the message and returns -1, so callers can write `return mla_err(...)`. */
int mla_err(const char *fmt, ...) MLA_PRINTF(1, 2);
/* Prefixes the current message with context ("copy: " + message). */
int mla_err_prefix(const char *fmt, ...) MLA_PRINTF(1, 2);
const char *mla_errmsg(void);

/* Internal invariants: always on, also in release builds (as GGML_ASSERT). */
#define MLA_ASSERT(cond)                                                        \
  do {                                                                          \
    if (!(cond)) {                                                              \
      fprintf(stderr, "mlalab: internal error: %s:%d: assertion '%s' failed\n", \
              __FILE__, __LINE__, #cond);                                       \
      abort();                                                                  \
    }                                                                           \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif
