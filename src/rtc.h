/* NVRTC compilation for JIT kernels (kernels_rtc/): one program in, one
 * cubin out, plus what a host needs to use it: lowered names of the name
 * expressions, each entry's parameter signature (read off the PTX, so it is
 * known without a GPU) and the full log (ptxas -v resource lines included).
 * No caching here (rtc_cache.h), no header discovery (rtc_deps.h), no CUDA
 * driver: this file runs on machines without a GPU. */
#ifndef MLA_RTC_H
#define MLA_RTC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A text known by name: an in-memory header, or the program itself. */
typedef struct mla_rtc_text {
  const char *name; /* include name as written in #include, or the program name */
  const char *text; /* NUL-terminated */
  size_t len;
} mla_rtc_text;

typedef struct mla_rtc_program {
  mla_rtc_text source;          /* name: what diagnostics and -lineinfo show */
  const mla_rtc_text *headers;  /* passed to NVRTC in memory: exactly what is hashed */
  int nheaders;
  const char *const *options;   /* every option, in order (-arch=sm_XX included) */
  int noptions;
  const char *const *exprs;     /* name expressions (templates to instantiate) */
  int nexprs;
} mla_rtc_program;

/* One compiled program. Strings are owned (NUL-terminated) and freed by
 * mla_rtc_binary_free. */
typedef struct mla_rtc_binary {
  char *cubin;
  size_t cubin_len;
  char *log;       /* NVRTC log: warnings, ptxas info lines */
  int nexprs;
  char **exprs;    /* name expressions ... */
  char **lowered;  /* ... and their mangled names */
  char *signatures; /* one line per entry: "<mangled>\t<sig>\n", sig as mla_rtc_parse_signature reads it */
} mla_rtc_binary;

/* Compiles p. Returns 0 on success; 1 when NVRTC rejected the program or an
 * option (out->log holds its diagnostics, nothing else is set); -1 on any
 * other failure (mla_err). *ms receives the wall time of the NVRTC calls. */
int mla_rtc_compile(const mla_rtc_program *p, mla_rtc_binary *out, double *ms);
void mla_rtc_binary_free(mla_rtc_binary *b);

/* NVRTC version, and a string that pins its exact build (version, library
 * path, size and modification time): part of every cache key. */
void mla_rtc_version(int *major, int *minor);
const char *mla_rtc_build_id(void);
/* Real architectures NVRTC can emit cubins for (75, 80, 86, ...). Returns the count. */
int mla_rtc_supported_archs(int *archs, int max);

/* Extracts each .entry's parameter list from PTX text into the signature
 * format above ("u64,u32,f32,b8[40]@8": type, then [bytes] and @align for
 * byte arrays). Returns a malloc'd string or NULL (mla_err). */
char *mla_rtc_ptx_signatures(const char *ptx, size_t len);

#ifdef __cplusplus
}
#endif
#endif
