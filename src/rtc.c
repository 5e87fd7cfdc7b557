/* NVRTC compile: create, add name expressions, compile, collect log, cubin,
 * lowered names and entry signatures (rtc.h). */
#define _GNU_SOURCE /* dladdr */
#include "rtc.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <nvrtc.h>

#include "mla_error.h"

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

void mla_rtc_version(int *major, int *minor) {
  *major = 0, *minor = 0;
  nvrtcVersion(major, minor);
}

const char *mla_rtc_build_id(void) {
  static char id[1200];
  if (id[0]) return id;
  int maj, min;
  mla_rtc_version(&maj, &min);
  Dl_info info;
  struct stat st;
  /* The library actually loaded, not the one a header names: two NVRTC
   * builds of one version (a driver-bundled update) must not share entries. */
  if (dladdr((void *)&nvrtcVersion, &info) && info.dli_fname && stat(info.dli_fname, &st) == 0)
    snprintf(id, sizeof id, "nvrtc %d.%d %s %lld %lld.%09ld", maj, min, info.dli_fname, (long long)st.st_size,
             (long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec);
  else
    snprintf(id, sizeof id, "nvrtc %d.%d", maj, min);
  return id;
}

int mla_rtc_supported_archs(int *archs, int max) {
  int n = 0;
  if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0) return 0;
  int *all = malloc(sizeof(int) * (size_t)n);
  if (!all) return 0;
  if (nvrtcGetSupportedArchs(all) != NVRTC_SUCCESS) n = 0;
  if (n > max) n = max;
  memcpy(archs, all, sizeof(int) * (size_t)n);
  free(all);
  return n;
}

/* ---- PTX entry signatures ------------------------------------------------ */

typedef struct sbuf { char *p; size_t n, cap; int oom; } sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 256;
    while (cap < b->n + n + 1) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) { b->oom = 1; return; }
    b->p = q, b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

static const char *skip_ws(const char *s, const char *end) {
  while (s < end && (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')) s++;
  return s;
}

static int is_ident(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '$' ||
         c == '.';
}

/* One ".param" declaration between s and end: appends its signature token. */
static int param_token(sbuf *b, const char *s, const char *end) {
  const char *type = NULL;
  size_t type_len = 0;
  long align = 0, count = -1;
  while ((s = skip_ws(s, end)) < end) {
    const char *w = s;
    while (s < end && is_ident(*s)) s++;
    size_t len = (size_t)(s - w);
    if (len == 0) { s++; continue; }
    if (len == 6 && memcmp(w, ".align", 6) == 0) {
      s = skip_ws(s, end);
      align = strtol(s, (char **)&s, 10);
    } else if (w[0] == '.' && len >= 3 && (w[1] == 'u' || w[1] == 's' || w[1] == 'f' || w[1] == 'b') &&
               w[2] >= '0' && w[2] <= '9') {
      type = w + 1, type_len = len - 1;
    } else if (w[0] != '.') { /* the parameter's name, maybe followed by [N] */
      s = skip_ws(s, end);
      if (s < end && *s == '[') count = strtol(s + 1, NULL, 10);
      break;
    }
  }
  if (!type) return mla_err("PTX parameter without a type");
  sb_add(b, type, type_len);
  if (count >= 0) {
    char t[48];
    snprintf(t, sizeof t, "[%ld]@%ld", count, align > 0 ? align : 1);
    sb_str(b, t);
  }
  return 0;
}

char *mla_rtc_ptx_signatures(const char *ptx, size_t len) {
  sbuf b = {0};
  sb_str(&b, "");
  const char *end = ptx + len, *s = ptx;
  while ((s = strstr(s, ".entry")) != NULL && s < end) {
    s += 6;
    if (!(*s == ' ' || *s == '\t')) continue;
    s = skip_ws(s, end);
    const char *name = s;
    while (s < end && is_ident(*s)) s++;
    size_t name_len = (size_t)(s - name);
    s = skip_ws(s, end);
    if (name_len == 0 || s >= end || *s != '(') continue;
    const char *close = memchr(s, ')', (size_t)(end - s));
    if (!close) break;
    sb_add(&b, name, name_len);
    sb_str(&b, "\t");
    const char *p = s + 1;
    int first = 1;
    while (p < close) {
      const char *comma = memchr(p, ',', (size_t)(close - p));
      const char *stop = comma ? comma : close;
      const char *q = skip_ws(p, stop);
      if (q < stop) {
        if (!first) sb_str(&b, ",");
        if (param_token(&b, q, stop)) { free(b.p); return NULL; }
        first = 0;
      }
      p = stop + 1;
    }
    sb_str(&b, "\n");
    s = close;
  }
  if (b.oom) { free(b.p); mla_err("out of memory"); return NULL; }
  return b.p;
}

/* ---- compile -------------------------------------------------------------- */

static char *program_log(nvrtcProgram prog) {
  size_t n = 0;
  if (nvrtcGetProgramLogSize(prog, &n) != NVRTC_SUCCESS || n == 0) return dup_str("");
  char *log = malloc(n + 1);
  if (!log) return NULL;
  if (nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) log[0] = 0;
  log[n] = 0;
  return log;
}

void mla_rtc_binary_free(mla_rtc_binary *b) {
  if (!b) return;
  free(b->cubin);
  free(b->log);
  for (int i = 0; i < b->nexprs; i++) {
    if (b->exprs) free(b->exprs[i]);
    if (b->lowered) free(b->lowered[i]);
  }
  free(b->exprs);
  free(b->lowered);
  free(b->signatures);
  memset(b, 0, sizeof *b);
}

#define NVRTC_CHECK(call, what)                                                     \
  do {                                                                            \
    nvrtcResult r_ = (call);                                                      \
    if (r_ != NVRTC_SUCCESS) {                                                    \
      rc = mla_err("NVRTC %s failed: %s", what, nvrtcGetErrorString(r_));         \
      goto done;                                                                  \
    }                                                                             \
  } while (0)

int mla_rtc_compile(const mla_rtc_program *p, mla_rtc_binary *out, double *ms) {
  memset(out, 0, sizeof *out);
  int rc = 0;
  double t0 = now_ms();
  nvrtcProgram prog = NULL;
  const char **hdr_text = NULL, **hdr_name = NULL;
  char *ptx = NULL;
  if (p->nheaders > 0) {
    hdr_text = malloc(sizeof(char *) * (size_t)p->nheaders);
    hdr_name = malloc(sizeof(char *) * (size_t)p->nheaders);
    if (!hdr_text || !hdr_name) { rc = mla_err("out of memory"); goto done; }
    for (int i = 0; i < p->nheaders; i++) hdr_text[i] = p->headers[i].text, hdr_name[i] = p->headers[i].name;
  }
  NVRTC_CHECK(nvrtcCreateProgram(&prog, p->source.text, p->source.name, p->nheaders, hdr_text, hdr_name),
              "create program");
  for (int i = 0; i < p->nexprs; i++) NVRTC_CHECK(nvrtcAddNameExpression(prog, p->exprs[i]), "add name expression");
  nvrtcResult cr = nvrtcCompileProgram(prog, p->noptions, p->options);
  out->log = program_log(prog);
  if (!out->log) { rc = mla_err("out of memory"); goto done; }
  if (cr != NVRTC_SUCCESS) {
    if (cr != NVRTC_ERROR_COMPILATION && cr != NVRTC_ERROR_INVALID_OPTION &&
        cr != NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID && cr != NVRTC_ERROR_INVALID_INPUT) {
      rc = mla_err("NVRTC compile failed: %s", nvrtcGetErrorString(cr));
      goto done;
    }
    if (!out->log[0]) {
      free(out->log);
      out->log = dup_str(nvrtcGetErrorString(cr));
    }
    rc = 1;
    goto done;
  }
  size_t n = 0;
  NVRTC_CHECK(nvrtcGetCUBINSize(prog, &n), "get cubin size");
  if (n == 0) {
    rc = mla_err("NVRTC produced no cubin: the target must be a real architecture (-arch=sm_XX), not compute_XX");
    goto done;
  }
  out->cubin = malloc(n);
  if (!out->cubin) { rc = mla_err("out of memory"); goto done; }
  NVRTC_CHECK(nvrtcGetCUBIN(prog, out->cubin), "get cubin");
  out->cubin_len = n;
  size_t pn = 0;
  NVRTC_CHECK(nvrtcGetPTXSize(prog, &pn), "get PTX size");
  ptx = malloc(pn + 1);
  if (!ptx) { rc = mla_err("out of memory"); goto done; }
  NVRTC_CHECK(nvrtcGetPTX(prog, ptx), "get PTX");
  ptx[pn] = 0;
  out->signatures = mla_rtc_ptx_signatures(ptx, strlen(ptx));
  if (!out->signatures) { rc = -1; goto done; }
  if (p->nexprs > 0) {
    out->exprs = calloc((size_t)p->nexprs, sizeof(char *));
    out->lowered = calloc((size_t)p->nexprs, sizeof(char *));
    if (!out->exprs || !out->lowered) { rc = mla_err("out of memory"); goto done; }
    out->nexprs = p->nexprs;
    for (int i = 0; i < p->nexprs; i++) {
      const char *low = NULL;
      NVRTC_CHECK(nvrtcGetLoweredName(prog, p->exprs[i], &low), "get lowered name");
      out->exprs[i] = dup_str(p->exprs[i]);
      out->lowered[i] = dup_str(low); /* the string dies with the program */
      if (!out->exprs[i] || !out->lowered[i]) { rc = mla_err("out of memory"); goto done; }
    }
  }
done:
  if (prog) nvrtcDestroyProgram(&prog);
  free(hdr_text);
  free(hdr_name);
  free(ptx);
  if (ms) *ms = now_ms() - t0;
  if (rc == 1) { /* keep only the log */
    char *log = out->log;
    out->log = NULL;
    mla_rtc_binary_free(out);
    out->log = log;
  } else if (rc < 0) {
    mla_rtc_binary_free(out);
  }
  return rc;
}
