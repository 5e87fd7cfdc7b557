/* What a JIT program depends on: the headers it reaches through #include.
 * Every header found outside the system include directories (CUDA's, which
 * the NVRTC build pins) is read once, hashed into the cache key and handed
 * to NVRTC in memory under the name it was included by, so the text that is
 * hashed is the text that compiles (no race with an editor saving a file,
 * no dependence on the working directory). Conditional includes are followed
 * too: an over-approximation costs at most a spurious cache miss. */
#ifndef MLA_RTC_DEPS_H
#define MLA_RTC_DEPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mla_rtc_file {
  char *name;        /* include name as written ("mla/convert.cuh") */
  char *path;        /* file it resolved to; NULL for headers given in memory */
  char *text;        /* NUL-terminated */
  size_t len;
  int64_t mtime_ns, size; /* at the time it was read (reload checks) */
} mla_rtc_file;

typedef struct mla_rtc_deps {
  mla_rtc_file *files; /* in-memory headers: given ones first, then those found */
  int n, cap;
  char **other;        /* include names not read: system headers ("<cuda_bf16.h>") and unresolved ones ("?name") */
  int nother, cap_other;
} mla_rtc_deps;

/* Adds a header given in memory (copied). Returns 0 or -1 (mla_err). */
int mla_rtc_deps_add_text(mla_rtc_deps *d, const char *name, const char *text, size_t len);

/* Follows the #include directives of `src` (a file in src_dir, or NULL for a
 * string) and of every header reached. Search order mirrors NVRTC's: headers
 * already in memory, the including file's directory (quoted includes), then
 * the include directories named by `options` (--include-path=, -I) in order.
 * A header inside one of sys_dirs is recorded by name and not read.
 * --pre-include= options are followed like includes. */
int mla_rtc_deps_scan(mla_rtc_deps *d, const char *src, size_t len, const char *src_dir, const char *const *options,
                      int noptions, const char *const *sys_dirs, int nsys);
void mla_rtc_deps_free(mla_rtc_deps *d);

/* 1 if any file read by the scan changed on disk (size, mtime, or gone). */
int mla_rtc_deps_changed(const mla_rtc_deps *d);

/* Whole file into a NUL-terminated buffer; also its mtime and size. */
int mla_rtc_read_file(const char *path, char **text, size_t *len, int64_t *mtime_ns);
/* mtime in ns and size of path; -1 if it does not exist. */
int mla_rtc_stat(const char *path, int64_t *mtime_ns, int64_t *size);

/* Paths of the files under dir (recursively) whose names end in suffix,
 * sorted; hidden entries are skipped. Caller frees each and the array. */
int mla_rtc_list_files(const char *dir, const char *suffix, char ***paths, int *n);

#ifdef __cplusplus
}
#endif
#endif
