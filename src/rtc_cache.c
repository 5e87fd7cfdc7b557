/* Kernel cache keys and entries (rtc_cache.h). */
#define _POSIX_C_SOURCE 200809L
#include "rtc_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Header-only use: no run-time dependency on libxxhash (the binary also runs
 * on machines that only have what CUDA needs). */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "mla_error.h"

static const char MAGIC[8] = {'M', 'L', 'A', 'R', 'T', 'C', 0, MLA_RTC_FORMAT_VERSION};
#define HEADER_BYTES 48

/* ---- key ------------------------------------------------------------------ */

static void feed(XXH3_state_t *s, const char *tag, const void *data, size_t len) {
  uint64_t n = (uint64_t)len;
  XXH3_128bits_update(s, tag, strlen(tag) + 1);
  XXH3_128bits_update(s, &n, sizeof n);
  if (len) XXH3_128bits_update(s, data, len);
}
static void feed_str(XXH3_state_t *s, const char *tag, const char *str) { feed(s, tag, str, str ? strlen(str) : 0); }

static void to_hex(XXH128_hash_t h, char hex[MLA_RTC_KEY_HEX]) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < 16; i++) hex[2 * i] = digits[c.digest[i] >> 4], hex[2 * i + 1] = digits[c.digest[i] & 15];
  hex[32] = 0;
}

void mla_rtc_hash_hex(const void *data, size_t len, char hex[MLA_RTC_KEY_HEX]) { to_hex(XXH3_128bits(data, len), hex); }

static int cmp_strp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }
static int cmp_file(const void *a, const void *b) {
  return strcmp(((const mla_rtc_file *)a)->name, ((const mla_rtc_file *)b)->name);
}

void mla_rtc_cache_key(const mla_rtc_program *p, const mla_rtc_deps *deps, const char *salt,
                       char hex[MLA_RTC_KEY_HEX]) {
  XXH3_state_t st;
  XXH3_128bits_reset(&st);
  char ver[32];
  snprintf(ver, sizeof ver, "mlalab-rtc %d cubin", MLA_RTC_FORMAT_VERSION);
  feed_str(&st, "format", ver);
  feed_str(&st, "nvrtc", mla_rtc_build_id());
  feed_str(&st, "salt", salt ? salt : "");
  feed_str(&st, "name", p->source.name);
  feed(&st, "source", p->source.text, p->source.len);
  for (int i = 0; i < p->noptions; i++) feed_str(&st, "option", p->options[i]);
  /* name expressions: order does not change the result, duplicates neither */
  const char **ex = p->nexprs ? malloc(sizeof(char *) * (size_t)p->nexprs) : NULL;
  int nex = 0;
  if (ex) {
    memcpy(ex, p->exprs, sizeof(char *) * (size_t)p->nexprs);
    qsort(ex, (size_t)p->nexprs, sizeof(char *), cmp_strp);
    for (int i = 0; i < p->nexprs; i++)
      if (i == 0 || strcmp(ex[i], ex[i - 1]) != 0) feed_str(&st, "expr", ex[i]), nex++;
    free(ex);
  } else {
    for (int i = 0; i < p->nexprs; i++) feed_str(&st, "expr", p->exprs[i]); /* out of memory: unsorted, still exact */
  }
  if (deps && deps->n) {
    mla_rtc_file *f = malloc(sizeof *f * (size_t)deps->n);
    const mla_rtc_file *list = f ? f : deps->files;
    if (f) {
      memcpy(f, deps->files, sizeof *f * (size_t)deps->n);
      qsort(f, (size_t)deps->n, sizeof *f, cmp_file);
    }
    for (int i = 0; i < deps->n; i++) {
      feed_str(&st, "header", list[i].name);
      feed(&st, "text", list[i].text, list[i].len);
    }
    free(f);
  }
  if (deps && deps->nother) {
    char **o = malloc(sizeof(char *) * (size_t)deps->nother);
    if (o) {
      memcpy(o, deps->other, sizeof(char *) * (size_t)deps->nother);
      qsort(o, (size_t)deps->nother, sizeof(char *), cmp_strp);
    }
    for (int i = 0; i < deps->nother; i++) feed_str(&st, "other", o ? o[i] : deps->other[i]);
    free(o);
  }
  to_hex(XXH3_128bits_digest(&st), hex);
}

/* ---- entry encoding ------------------------------------------------------- */

typedef struct wbuf { char *p; size_t n, cap; int oom; } wbuf;

static void put(wbuf *b, const void *d, size_t n) {
  if (b->oom) return;
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + n) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) { b->oom = 1; return; }
    b->p = q, b->cap = cap;
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
}
static void put_u32(wbuf *b, uint32_t v) {
  unsigned char x[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
  put(b, x, 4);
}
static void put_u64(wbuf *b, uint64_t v) {
  put_u32(b, (uint32_t)v);
  put_u32(b, (uint32_t)(v >> 32));
}
static void put_str32(wbuf *b, const char *s, size_t n) {
  put_u32(b, (uint32_t)n);
  put(b, s, n);
}

static int hex_to_digest(const char hex[MLA_RTC_KEY_HEX], unsigned char d[16]) {
  for (int i = 0; i < 16; i++) {
    unsigned v = 0;
    for (int k = 0; k < 2; k++) {
      char c = hex[2 * i + k];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
      else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
      else return -1;
    }
    d[i] = (unsigned char)v;
  }
  return 0;
}

int mla_rtc_entry_encode(const char hex[MLA_RTC_KEY_HEX], const mla_rtc_binary *b, char **out, size_t *len) {
  unsigned char digest[16];
  if (hex_to_digest(hex, digest)) return mla_err("bad cache key '%s'", hex);
  wbuf w = {0};
  put(&w, MAGIC, 8);
  put(&w, digest, 16);
  put_u64(&w, 0);        /* payload length, patched below */
  put(&w, digest, 16);   /* payload checksum, patched below */
  put_u32(&w, (uint32_t)b->nexprs);
  for (int i = 0; i < b->nexprs; i++) {
    put_str32(&w, b->exprs[i], strlen(b->exprs[i]));
    put_str32(&w, b->lowered[i], strlen(b->lowered[i]));
  }
  put_str32(&w, b->log ? b->log : "", b->log ? strlen(b->log) : 0);
  put_str32(&w, b->signatures ? b->signatures : "", b->signatures ? strlen(b->signatures) : 0);
  put_u64(&w, (uint64_t)b->cubin_len);
  put(&w, b->cubin, b->cubin_len);
  if (w.oom) { free(w.p); return mla_err("out of memory encoding a cache entry"); }
  uint64_t plen = (uint64_t)(w.n - HEADER_BYTES);
  for (int i = 0; i < 8; i++) w.p[24 + i] = (char)(plen >> (8 * i));
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(w.p + HEADER_BYTES, (size_t)plen));
  memcpy(w.p + 32, c.digest, 16);
  *out = w.p, *len = w.n;
  return 0;
}

typedef struct rbuf { const unsigned char *p; size_t n, pos; int bad; } rbuf;

static uint64_t get_uint(rbuf *r, int bytes) {
  if (r->bad || r->n - r->pos < (size_t)bytes) { r->bad = 1; return 0; }
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)r->p[r->pos + (size_t)i] << (8 * i);
  r->pos += (size_t)bytes;
  return v;
}
static char *get_str(rbuf *r, uint64_t n) {
  if (r->bad || n > r->n - r->pos) { r->bad = 1; return NULL; }
  char *s = malloc((size_t)n + 1);
  if (!s) { r->bad = 1; return NULL; }
  memcpy(s, r->p + r->pos, (size_t)n);
  s[n] = 0;
  r->pos += (size_t)n;
  return s;
}

static int corrupt(mla_rtc_binary *b, char *why, size_t n, const char *reason) {
  mla_rtc_binary_free(b);
  if (why && n) snprintf(why, n, "%s", reason);
  return MLA_RTC_ENTRY_CORRUPT;
}

int mla_rtc_entry_decode(const char hex[MLA_RTC_KEY_HEX], const char *data, size_t len, mla_rtc_binary *b, char *why,
                         size_t n) {
  memset(b, 0, sizeof *b);
  unsigned char digest[16];
  if (hex_to_digest(hex, digest)) return corrupt(b, why, n, "bad key");
  if (len < HEADER_BYTES) return corrupt(b, why, n, "truncated header");
  if (memcmp(data, MAGIC, 8) != 0) return corrupt(b, why, n, "not an mlalab kernel cache entry of this format version");
  if (memcmp(data + 8, digest, 16) != 0) return corrupt(b, why, n, "entry stored under another key");
  rbuf h = {(const unsigned char *)data, len, 24, 0};
  uint64_t plen = get_uint(&h, 8);
  if (plen != len - HEADER_BYTES) return corrupt(b, why, n, plen > len - HEADER_BYTES ? "truncated payload" : "trailing bytes");
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(data + HEADER_BYTES, (size_t)plen));
  if (memcmp(c.digest, data + 32, 16) != 0) return corrupt(b, why, n, "checksum mismatch");
  rbuf r = {(const unsigned char *)data + HEADER_BYTES, (size_t)plen, 0, 0};
  uint64_t nex = get_uint(&r, 4);
  if (nex > 100000) return corrupt(b, why, n, "implausible name count");
  if (nex) {
    b->exprs = calloc((size_t)nex, sizeof(char *));
    b->lowered = calloc((size_t)nex, sizeof(char *));
    if (!b->exprs || !b->lowered) return corrupt(b, why, n, "out of memory");
    b->nexprs = (int)nex;
    for (uint64_t i = 0; i < nex; i++) {
      b->exprs[i] = get_str(&r, get_uint(&r, 4));
      b->lowered[i] = get_str(&r, get_uint(&r, 4));
    }
  }
  b->log = get_str(&r, get_uint(&r, 4));
  b->signatures = get_str(&r, get_uint(&r, 4));
  uint64_t clen = get_uint(&r, 8);
  if (r.bad || clen != r.n - r.pos) return corrupt(b, why, n, "malformed payload");
  b->cubin = malloc((size_t)clen ? (size_t)clen : 1);
  if (!b->cubin) return corrupt(b, why, n, "out of memory");
  memcpy(b->cubin, r.p + r.pos, (size_t)clen);
  b->cubin_len = (size_t)clen;
  if (clen < 4 || memcmp(b->cubin, "\x7f" "ELF", 4) != 0) return corrupt(b, why, n, "payload is not a cubin");
  return MLA_RTC_ENTRY_HIT;
}

/* ---- disk ------------------------------------------------------------------ */

static int entry_path(char *out, size_t n, const char *dir, const char *hex, const char *ext) {
  int w = snprintf(out, n, "%s/%s%s", dir, hex, ext);
  return w < 0 || (size_t)w >= n ? mla_err("cache path too long") : 0;
}

int mla_rtc_cache_read(const char *dir, const char hex[MLA_RTC_KEY_HEX], mla_rtc_binary *b, char *why, size_t n) {
  memset(b, 0, sizeof *b);
  char path[PATH_MAX];
  if (entry_path(path, sizeof path, dir, hex, ".cubin")) return MLA_RTC_ENTRY_ABSENT;
  if (mla_rtc_stat(path, NULL, NULL) != 0) return MLA_RTC_ENTRY_ABSENT;
  char *data;
  size_t len;
  if (mla_rtc_read_file(path, &data, &len, NULL)) {
    if (why && n) snprintf(why, n, "unreadable: %s", mla_errmsg());
    return MLA_RTC_ENTRY_CORRUPT;
  }
  int r = mla_rtc_entry_decode(hex, data, len, b, why, n);
  free(data);
  return r;
}

static int mkdirs(const char *dir) {
  char tmp[PATH_MAX];
  int w = snprintf(tmp, sizeof tmp, "%s", dir);
  if (w < 0 || (size_t)w >= sizeof tmp) return mla_err("cache directory path too long");
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return mla_err("cannot create %s: %s", tmp, strerror(errno));
    *p = '/';
  }
  if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return mla_err("cannot create %s: %s", tmp, strerror(errno));
  return 0;
}

static int write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w, n -= (size_t)w;
  }
  return 0;
}

/* Test hook (issue 9, the cache under concurrency): MLALAB_RTC_TEST_WRITE
 * = "kill" makes the process SIGKILL itself after writing half of a temp
 * file, "pause:<ms>" sleeps there (widening the window in which concurrent
 * writers overlap). Unset in normal use; read once. */
static void test_hook_mid_write(void) {
  static int mode = -1, pause_ms = 0;
  if (mode < 0) {
    const char *s = getenv("MLALAB_RTC_TEST_WRITE");
    mode = 0;
    if (s && strcmp(s, "kill") == 0) mode = 1;
    else if (s && strncmp(s, "pause:", 6) == 0) mode = 2, pause_ms = atoi(s + 6);
  }
  if (mode == 1) raise(SIGKILL);
  if (mode == 2 && pause_ms > 0) {
    struct timespec ts = {pause_ms / 1000, (long)(pause_ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
  }
}

/* Temp files are ".<key>.tmp.<pid>.XXXXXX". One whose writer is gone (killed
 * mid-write) is never read (no entry has that name) and is removed by the
 * next write to the directory. A writer in another PID namespace may look
 * gone: removing its file only costs it that one write (a warning). */
#define TMP_TAG ".tmp."

static void remove_stale_temps(const char *dir) {
  DIR *dp = opendir(dir);
  if (!dp) return;
  struct dirent *e;
  while ((e = readdir(dp)) != NULL) {
    const char *tag = e->d_name[0] == '.' ? strstr(e->d_name, TMP_TAG) : NULL;
    if (!tag) continue;
    char *end;
    long pid = strtol(tag + strlen(TMP_TAG), &end, 10);
    if (pid <= 0 || *end != '.' || (pid_t)pid == getpid()) continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
    char path[PATH_MAX];
    int w = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (w > 0 && (size_t)w < sizeof path) unlink(path);
  }
  closedir(dp);
}

/* Temp file in dir, then rename over final. */
static int atomic_write(const char *dir, const char *hex, const char *final, const char *data, size_t len) {
  char tmp[PATH_MAX];
  int w = snprintf(tmp, sizeof tmp, "%s/.%s" TMP_TAG "%ld.XXXXXX", dir, hex, (long)getpid());
  if (w < 0 || (size_t)w >= sizeof tmp) return mla_err("cache path too long");
  int fd = mkstemp(tmp);
  if (fd < 0) return mla_err("cannot create a file in %s: %s", dir, strerror(errno));
  size_t half = len / 2;
  int ok = write_all(fd, data, half) == 0;
  if (ok) test_hook_mid_write();
  ok = ok && write_all(fd, data + half, len - half) == 0;
  fchmod(fd, 0644);
  if (close(fd) != 0) ok = 0;
  if (!ok || rename(tmp, final) != 0) {
    int e = errno;
    unlink(tmp);
    return mla_err("cannot write %s: %s", final, strerror(e));
  }
  return 0;
}

int mla_rtc_cache_write(const char *dir, const char hex[MLA_RTC_KEY_HEX], const mla_rtc_binary *b,
                        const mla_rtc_text *save_source) {
  if (mkdirs(dir)) return -1;
  remove_stale_temps(dir);
  char path[PATH_MAX];
  if (entry_path(path, sizeof path, dir, hex, ".cubin")) return -1;
  char *data;
  size_t len;
  if (mla_rtc_entry_encode(hex, b, &data, &len)) return -1;
  int rc = atomic_write(dir, hex, path, data, len);
  free(data);
  if (rc == 0 && save_source) {
    if (entry_path(path, sizeof path, dir, hex, ".cu")) return -1;
    rc = atomic_write(dir, hex, path, save_source->text, save_source->len);
  }
  return rc;
}
