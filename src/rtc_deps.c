/* Header discovery for JIT programs (rtc_deps.h). */
#define _POSIX_C_SOURCE 200809L
#include "rtc_deps.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mla_error.h"

#define MAX_DEPTH 64
#define MAX_FILES 4096

static char *dup_n(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}
static char *dup_s(const char *s) { return dup_n(s, strlen(s)); }

int mla_rtc_stat(const char *path, int64_t *mtime_ns, int64_t *size) {
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return -1;
  if (mtime_ns) *mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
  if (size) *size = (int64_t)st.st_size;
  return 0;
}

int mla_rtc_read_file(const char *path, char **text, size_t *len, int64_t *mtime_ns) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return mla_err("cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return mla_err("%s is not a regular file", path);
  }
  size_t n = (size_t)st.st_size, got = 0;
  char *buf = malloc(n + 1);
  if (!buf) { close(fd); return mla_err("out of memory reading %s", path); }
  while (got < n) {
    ssize_t r = read(fd, buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  if (got != n) { free(buf); return mla_err("short read of %s", path); }
  buf[n] = 0;
  *text = buf, *len = n;
  if (mtime_ns) *mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
  return 0;
}

/* ---- the dependency set --------------------------------------------------- */

static int add_file(mla_rtc_deps *d, const char *name, const char *path, char *text, size_t len, int64_t mtime) {
  if (d->n >= MAX_FILES) { free(text); return mla_err("more than %d headers reached", MAX_FILES); }
  if (d->n == d->cap) {
    int cap = d->cap ? 2 * d->cap : 16;
    mla_rtc_file *f = realloc(d->files, sizeof *f * (size_t)cap);
    if (!f) { free(text); return mla_err("out of memory"); }
    d->files = f, d->cap = cap;
  }
  mla_rtc_file *f = &d->files[d->n];
  memset(f, 0, sizeof *f);
  f->name = dup_s(name);
  f->path = path ? dup_s(path) : NULL;
  f->text = text, f->len = len, f->mtime_ns = mtime, f->size = (int64_t)len;
  if (!f->name || (path && !f->path)) { free(f->name), free(f->path), free(text); return mla_err("out of memory"); }
  d->n++;
  return 0;
}

int mla_rtc_deps_add_text(mla_rtc_deps *d, const char *name, const char *text, size_t len) {
  char *copy = dup_n(text, len);
  if (!copy) return mla_err("out of memory");
  return add_file(d, name, NULL, copy, len, 0);
}

static int add_other(mla_rtc_deps *d, const char *tag, const char *name) {
  size_t n = strlen(tag) + strlen(name) + 1;
  char *s = malloc(n);
  if (!s) return mla_err("out of memory");
  snprintf(s, n, "%s%s", tag, name);
  for (int i = 0; i < d->nother; i++)
    if (strcmp(d->other[i], s) == 0) { free(s); return 0; }
  if (d->nother == d->cap_other) {
    int cap = d->cap_other ? 2 * d->cap_other : 16;
    char **o = realloc(d->other, sizeof(char *) * (size_t)cap);
    if (!o) { free(s); return mla_err("out of memory"); }
    d->other = o, d->cap_other = cap;
  }
  d->other[d->nother++] = s;
  return 0;
}

void mla_rtc_deps_free(mla_rtc_deps *d) {
  for (int i = 0; i < d->n; i++) free(d->files[i].name), free(d->files[i].path), free(d->files[i].text);
  for (int i = 0; i < d->nother; i++) free(d->other[i]);
  free(d->files);
  free(d->other);
  memset(d, 0, sizeof *d);
}

int mla_rtc_deps_changed(const mla_rtc_deps *d) {
  for (int i = 0; i < d->n; i++) {
    const mla_rtc_file *f = &d->files[i];
    if (!f->path) continue;
    int64_t m, s;
    if (mla_rtc_stat(f->path, &m, &s) != 0 || m != f->mtime_ns || s != f->size) return 1;
  }
  return 0;
}

/* ---- scanning ------------------------------------------------------------- */

typedef struct scan_ctx {
  mla_rtc_deps *d;
  const char **inc; /* include directories, in option order */
  int *inc_sys;     /* 1 where the directory is a system one */
  int ninc;
} scan_ctx;

static int find_header(const mla_rtc_deps *d, const char *name) {
  for (int i = 0; i < d->n; i++)
    if (strcmp(d->files[i].name, name) == 0) return i;
  return -1;
}

static int join(char *out, size_t n, const char *dir, const char *name) {
  int w = snprintf(out, n, "%s/%s", dir, name);
  return w < 0 || (size_t)w >= n ? -1 : 0;
}

static void dir_of(const char *path, char *out, size_t n) {
  snprintf(out, n, "%s", path);
  char *slash = strrchr(out, '/');
  if (slash == out) slash[1] = 0;
  else if (slash) *slash = 0;
  else snprintf(out, n, ".");
}

static int same_file(const char *a, const char *b) {
  struct stat sa, sb;
  if (stat(a, &sa) != 0 || stat(b, &sb) != 0) return 0;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static int scan_text(scan_ctx *c, const char *text, size_t len, const char *dir, int depth);

static int include_file(scan_ctx *c, const char *name, const char *path, int depth) {
  char *text;
  size_t len;
  int64_t mtime;
  if (mla_rtc_read_file(path, &text, &len, &mtime)) return -1;
  if (add_file(c->d, name, path, text, len, mtime)) return -1;
  char dir[PATH_MAX];
  dir_of(path, dir, sizeof dir);
  /* scan from the stored copy: the array may move while recursing */
  int idx = c->d->n - 1;
  return scan_text(c, c->d->files[idx].text, c->d->files[idx].len, dir, depth + 1);
}

static int resolve(scan_ctx *c, const char *name, int quoted, const char *dir, int depth) {
  char cand[PATH_MAX];
  int have = find_header(c->d, name);
  if (have >= 0) {
    /* NVRTC's in-memory headers are one flat namespace: the same include name
     * must not stand for two different files. */
    const char *known = c->d->files[have].path;
    if (quoted && dir && known && join(cand, sizeof cand, dir, name) == 0 && mla_rtc_stat(cand, NULL, NULL) == 0 &&
        !same_file(cand, known))
      return mla_err("#include \"%s\" names two different files (%s and %s); NVRTC sees headers by include "
                     "name, so give them distinct names",
                     name, known, cand);
    return 0;
  }
  if (quoted && dir && join(cand, sizeof cand, dir, name) == 0 && mla_rtc_stat(cand, NULL, NULL) == 0)
    return include_file(c, name, cand, depth);
  for (int i = 0; i < c->ninc; i++) {
    if (join(cand, sizeof cand, c->inc[i], name) != 0 || mla_rtc_stat(cand, NULL, NULL) != 0) continue;
    if (c->inc_sys[i]) return add_other(c->d, "<sys>", name);
    return include_file(c, name, cand, depth);
  }
  return add_other(c->d, "?", name); /* let NVRTC report it (or find a built-in) */
}

static int scan_text(scan_ctx *c, const char *text, size_t len, const char *dir, int depth) {
  if (depth > MAX_DEPTH) return mla_err("includes nested deeper than %d", MAX_DEPTH);
  const char *s = text, *end = text + len;
  while (s < end) {
    const char *eol = memchr(s, '\n', (size_t)(end - s));
    if (!eol) eol = end;
    const char *p = s;
    while (p < eol && (*p == ' ' || *p == '\t')) p++;
    if (p < eol && *p == '#') {
      p++;
      while (p < eol && (*p == ' ' || *p == '\t')) p++;
      if ((size_t)(eol - p) > 7 && memcmp(p, "include", 7) == 0) {
        p += 7;
        while (p < eol && (*p == ' ' || *p == '\t')) p++;
        char close = p < eol && *p == '"' ? '"' : p < eol && *p == '<' ? '>' : 0;
        if (close) {
          const char *q = memchr(p + 1, close, (size_t)(eol - p - 1));
          if (q && q > p + 1) {
            char name[PATH_MAX];
            size_t n = (size_t)(q - p - 1);
            if (n >= sizeof name) return mla_err("include name too long");
            memcpy(name, p + 1, n);
            name[n] = 0;
            if (resolve(c, name, close == '"', dir, depth)) return -1;
          }
        }
      }
    }
    s = eol + 1;
  }
  return 0;
}

static const char *option_value(const char *o, const char *const *prefixes) {
  for (int i = 0; prefixes[i]; i++) {
    size_t n = strlen(prefixes[i]);
    if (strncmp(o, prefixes[i], n) == 0 && o[n]) return o + n;
  }
  return NULL;
}

int mla_rtc_deps_scan(mla_rtc_deps *d, const char *src, size_t len, const char *src_dir, const char *const *options,
                      int noptions, const char *const *sys_dirs, int nsys) {
  static const char *const inc_prefix[] = {"--include-path=", "-I=", "-I", NULL};
  static const char *const pre_prefix[] = {"--pre-include=", "-include=", NULL};
  scan_ctx c = {d, NULL, NULL, 0};
  int rc = 0;
  c.inc = malloc(sizeof(char *) * (size_t)(noptions + 1));
  c.inc_sys = malloc(sizeof(int) * (size_t)(noptions + 1));
  if (!c.inc || !c.inc_sys) { rc = mla_err("out of memory"); goto done; }
  for (int i = 0; i < noptions; i++) {
    const char *v = option_value(options[i], inc_prefix);
    if (!v) continue;
    c.inc[c.ninc] = v;
    c.inc_sys[c.ninc] = 0;
    for (int k = 0; k < nsys; k++) {
      size_t n = strlen(sys_dirs[k]);
      while (n > 1 && sys_dirs[k][n - 1] == '/') n--;
      size_t m = strlen(v);
      while (m > 1 && v[m - 1] == '/') m--;
      if (n == m && strncmp(v, sys_dirs[k], n) == 0) c.inc_sys[c.ninc] = 1;
    }
    c.ninc++;
  }
  /* headers given in memory may include others too */
  for (int i = 0, given = d->n; i < given; i++)
    if ((rc = scan_text(&c, d->files[i].text, d->files[i].len, NULL, 1))) goto done;
  for (int i = 0; i < noptions; i++) {
    const char *v = option_value(options[i], pre_prefix);
    if (v && (rc = resolve(&c, v, 1, src_dir, 0))) goto done;
  }
  rc = scan_text(&c, src, len, src_dir, 0);
done:
  free(c.inc);
  free(c.inc_sys);
  return rc;
}

/* ---- listing -------------------------------------------------------------- */

typedef struct plist { char **p; int n, cap; } plist;

static int plist_add(plist *l, const char *s) {
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 32;
    char **p = realloc(l->p, sizeof(char *) * (size_t)cap);
    if (!p) return mla_err("out of memory");
    l->p = p, l->cap = cap;
  }
  if (!(l->p[l->n] = dup_s(s))) return mla_err("out of memory");
  l->n++;
  return 0;
}

static int walk(const char *dir, const char *suffix, plist *l, int depth) {
  if (depth > 32) return 0;
  DIR *dp = opendir(dir);
  if (!dp) return depth == 0 ? mla_err("cannot list %s: %s", dir, strerror(errno)) : 0;
  struct dirent *e;
  int rc = 0;
  size_t sl = strlen(suffix);
  while (!rc && (e = readdir(dp)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char path[PATH_MAX];
    if (join(path, sizeof path, dir, e->d_name) != 0) continue;
    struct stat st;
    if (stat(path, &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) rc = walk(path, suffix, l, depth + 1);
    else if (S_ISREG(st.st_mode)) {
      size_t nl = strlen(e->d_name);
      if (nl >= sl && strcmp(e->d_name + nl - sl, suffix) == 0) rc = plist_add(l, path);
    }
  }
  closedir(dp);
  return rc;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int mla_rtc_list_files(const char *dir, const char *suffix, char ***paths, int *n) {
  plist l = {0};
  if (walk(dir, suffix, &l, 0)) {
    for (int i = 0; i < l.n; i++) free(l.p[i]);
    free(l.p);
    return -1;
  }
  if (l.n > 1) qsort(l.p, (size_t)l.n, sizeof(char *), cmp_str);
  *paths = l.p, *n = l.n;
  return 0;
}
