/* numpy .npy reading and writing (see npy.h). The dict is parsed by a small
 * hand-written scanner for the subset of Python literals numpy writes:
 * strings, True/False, tuples of non-negative integers. No recursion, no
 * allocation beyond the header text, 64-bit sizes with overflow checks. */
#define _POSIX_C_SOURCE 200809L
#include "npy.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "mla_error.h"

static const char npy_magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

/* ---- the dict scanner ---------------------------------------------------- */

typedef struct scanner {
  const char *start, *p, *end;
} scanner;

static int is_space(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Next non-space byte, or -1 at the end. */
static int peek(scanner *s) {
  while (s->p < s->end && is_space((unsigned char)*s->p)) s->p++;
  return s->p < s->end ? (unsigned char)*s->p : -1;
}

static long pos(const scanner *s) { return (long)(s->p - s->start); }

/* A short, printable rendering of what sits at the cursor, for messages. */
static const char *shown(const scanner *s, char *buf, size_t n) {
  if (s->p >= s->end) return "the end of the header";
  size_t k = 0;
  buf[k++] = '\'';
  for (const char *q = s->p; q < s->end && k + 5 < n && q - s->p < 12; q++) {
    unsigned char c = (unsigned char)*q;
    if (c >= 0x20 && c < 0x7f) buf[k++] = (char)c;
    else k += (size_t)snprintf(buf + k, n - k, "\\x%02x", c);
  }
  buf[k++] = '\'';
  buf[k] = 0;
  return buf;
}

static int expect(scanner *s, char c, const char *context) {
  char b[64];
  if (peek(s) != (unsigned char)c) return mla_err("header: expected '%c' %s at byte %ld, found %s", c, context, pos(s), shown(s, b, sizeof b));
  s->p++;
  return 0;
}

/* 'text' or "text", no escapes (numpy never writes any). */
static int scan_string(scanner *s, char *out, size_t cap, const char *what) {
  char b[64];
  int q = peek(s);
  if (q != '\'' && q != '"') return mla_err("header: expected a quoted %s at byte %ld, found %s", what, pos(s), shown(s, b, sizeof b));
  const char *a = ++s->p;
  while (s->p < s->end && *s->p != (char)q) {
    if (*s->p == '\\') return mla_err("header: escape sequences in %s strings are not supported (byte %ld)", what, pos(s));
    if ((unsigned char)*s->p < 0x20 || (unsigned char)*s->p > 0x7e)
      return mla_err("header: byte 0x%02x inside a %s string at byte %ld (printable ASCII expected)", (unsigned char)*s->p, what, pos(s));
    s->p++;
  }
  if (s->p >= s->end || *s->p != (char)q) return mla_err("header: unterminated string (%s) starting at byte %ld", what, (long)(a - s->start - 1));
  size_t n = (size_t)(s->p - a);
  s->p++;
  if (n >= cap) return mla_err("header: %s string of %zu bytes is too long (at most %zu)", what, n, cap - 1);
  memcpy(out, a, n);
  out[n] = 0;
  return 0;
}

/* A non-negative decimal integer (Python 2's 'L' suffix allowed, as numpy's reader does). */
static int scan_int(scanner *s, int64_t *v) {
  char b[64];
  int c = peek(s);
  if (c == '-') return mla_err("header: negative dimension in shape at byte %ld", pos(s));
  if (c < '0' || c > '9') return mla_err("header: expected a dimension (integer) at byte %ld, found %s", pos(s), shown(s, b, sizeof b));
  int64_t x = 0;
  const char *a = s->p;
  while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
    int d = *s->p - '0';
    if (x > (INT64_MAX - d) / 10) return mla_err("header: dimension at byte %ld does not fit in 64 bits", (long)(a - s->start));
    x = x * 10 + d;
    s->p++;
  }
  if (*a == '0' && s->p - a > 1) return mla_err("header: dimension with a leading zero at byte %ld (not a Python integer)", (long)(a - s->start));
  if (s->p < s->end && (*s->p == 'L' || *s->p == 'l')) s->p++;
  if (s->p < s->end && (*s->p == '.' || *s->p == 'e' || *s->p == 'E' || *s->p == '_' || *s->p == 'x'))
    return mla_err("header: dimension at byte %ld is not a plain integer", (long)(a - s->start));
  *v = x;
  return 0;
}

static int scan_word(scanner *s, const char *w) {
  size_t n = strlen(w);
  if ((size_t)(s->end - s->p) < n || memcmp(s->p, w, n) != 0) return 0;
  const char *after = s->p + n;
  if (after < s->end && (*after == '_' || (*after >= 'a' && *after <= 'z') || (*after >= 'A' && *after <= 'Z') ||
                         (*after >= '0' && *after <= '9')))
    return 0;
  s->p = after;
  return 1;
}

static int scan_bool(scanner *s, int *v) {
  char b[64];
  peek(s);
  if (scan_word(s, "True")) *v = 1;
  else if (scan_word(s, "False")) *v = 0;
  else return mla_err("header: fortran_order must be True or False, found %s at byte %ld", shown(s, b, sizeof b), pos(s));
  return 0;
}

/* (), (n,), (a, b), (a, b,) -- a tuple, as numpy requires; "(n)" is an int. */
static int scan_shape(scanner *s, mla_npy_header *h) {
  char b[64];
  if (peek(s) != '(') return mla_err("header: shape must be a tuple like (2, 3), found %s at byte %ld", shown(s, b, sizeof b), pos(s));
  s->p++;
  int n = 0, commas = 0;
  while (peek(s) != ')') {
    if (n == MLA_MAX_DIMS) return mla_err("header: shape has more than %d dims (mlalab tensors have at most %d)", MLA_MAX_DIMS, MLA_MAX_DIMS);
    if (scan_int(s, &h->shape[n])) return -1;
    n++;
    int c = peek(s);
    if (c == ',') { s->p++, commas++; continue; }
    if (c != ')') return mla_err("header: expected ',' or ')' in shape at byte %ld, found %s", pos(s), shown(s, b, sizeof b));
  }
  s->p++;
  if (n == 1 && commas == 0) return mla_err("header: shape (n) is an integer, not a tuple; numpy writes (n,)");
  h->ndim = n;
  return 0;
}

/* '<f4', '|u1', '=i8', 'f4': byte order, kind letter, item size. */
static int parse_descr(const char *d, mla_npy_header *h) {
  const char *p = d;
  char order = '=';
  if (*p == '<' || *p == '>' || *p == '|' || *p == '=') order = *p++;
  char kind = *p ? *p++ : 0;
  int size = 0, digits = 0;
  while (*p >= '0' && *p <= '9' && digits < 3) size = size * 10 + (*p++ - '0'), digits++;
  switch (kind) {
  case 'b': case 'i': case 'u': case 'f': case 'V': break;
  case 'c': return mla_err("descr '%s': complex numbers are not supported", d);
  case 'O': return mla_err("descr '%s': Python objects (pickled data) are not supported", d);
  case 'S': case 'U': case 'a': return mla_err("descr '%s': strings are not supported", d);
  case 'M': case 'm': return mla_err("descr '%s': datetimes are not supported", d);
  default: return mla_err("descr '%s' is not a numpy type string like '<f4' or '|u1'", d);
  }
  if (*p || !digits) return mla_err("descr '%s' is not a numpy type string like '<f4' or '|u1'", d);
  if (size != 1 && size != 2 && size != 4 && size != 8)
    return mla_err("descr '%s': items of %d bytes are not supported (1, 2, 4 or 8)", d, size);
  if (kind == 'b' && size != 1) return mla_err("descr '%s': booleans have 1 byte", d);
  if (order == '>' && size > 1)
    return mla_err("descr '%s' is big-endian; only little-endian data is supported (save arr.astype('<%c%d'))", d, kind, size);
  h->kind = kind, h->itemsize = size;
  return 0;
}

int mla_npy_parse_dict(const char *text, size_t hlen, mla_npy_header *h) {
  scanner s = {text, text, text + hlen};
  int seen_descr = 0, seen_order = 0, seen_shape = 0;
  char key[32], b[64];
  if (expect(&s, '{', "at the start of the header dict")) return -1;
  while (peek(&s) != '}') {
    if (peek(&s) == -1) return mla_err("header: the dict is not closed ('}' missing)");
    if (scan_string(&s, key, sizeof key, "key")) return -1;
    if (expect(&s, ':', "after a key")) return -1;
    if (strcmp(key, "descr") == 0) {
      if (seen_descr++) return mla_err("header: key 'descr' appears twice");
      if (peek(&s) == '[') return mla_err("header: descr is a list: structured dtypes are not supported");
      if (scan_string(&s, h->descr, sizeof h->descr, "descr")) return -1;
    } else if (strcmp(key, "fortran_order") == 0) {
      if (seen_order++) return mla_err("header: key 'fortran_order' appears twice");
      if (scan_bool(&s, &h->fortran_order)) return -1;
    } else if (strcmp(key, "shape") == 0) {
      if (seen_shape++) return mla_err("header: key 'shape' appears twice");
      if (scan_shape(&s, h)) return -1;
    } else {
      return mla_err("header: unexpected key '%s' (numpy headers have exactly descr, fortran_order, shape)", key);
    }
    int c = peek(&s);
    if (c == ',') s.p++;
    else if (c != '}') return mla_err("header: expected ',' or '}' at byte %ld, found %s", pos(&s), shown(&s, b, sizeof b));
  }
  s.p++;
  if (peek(&s) != -1) return mla_err("header: unexpected %s after the dict at byte %ld", shown(&s, b, sizeof b), pos(&s));
  if (!seen_descr || !seen_order || !seen_shape)
    return mla_err("header: key '%s' is missing", !seen_descr ? "descr" : !seen_order ? "fortran_order" : "shape");
  if (parse_descr(h->descr, h)) return -1;
  int64_t n = 1;
  for (int i = 0; i < h->ndim; i++)
    if (__builtin_mul_overflow(n, h->shape[i], &n)) return mla_err("header: shape's element count overflows 64 bits");
  h->numel = n;
  if (__builtin_mul_overflow(n, (int64_t)h->itemsize, &h->data_bytes) || h->data_bytes > INT64_MAX / 2)
    return mla_err("header: shape x item size overflows 64 bits");
  return 0;
}

/* ---- prefix --------------------------------------------------------------- */

/* Checks magic and version in the first n bytes; sets the prefix length. */
static int parse_prefix(const unsigned char *p, size_t n, mla_npy_header *h, size_t *prefix, uint32_t *hlen) {
  if (n < sizeof npy_magic || memcmp(p, npy_magic, sizeof npy_magic) != 0) {
    if (n < sizeof npy_magic && memcmp(p, npy_magic, n) == 0) return mla_err("file is too short (%zu bytes) to be an npy file", n);
    return mla_err("not an npy file (bad magic: expected \\x93NUMPY, found %02x %02x %02x %02x %02x %02x)", n > 0 ? p[0] : 0,
                   n > 1 ? p[1] : 0, n > 2 ? p[2] : 0, n > 3 ? p[3] : 0, n > 4 ? p[4] : 0, n > 5 ? p[5] : 0);
  }
  if (n < 8) return mla_err("file ends inside the npy version bytes (%zu bytes)", n);
  h->major = p[6], h->minor = p[7];
  if (h->minor != 0 || h->major < 1 || h->major > 3)
    return mla_err("npy format version %d.%d is not supported (1.0, 2.0 or 3.0)", h->major, h->minor);
  *prefix = h->major == 1 ? MLA_NPY_PREFIX_V1 : MLA_NPY_PREFIX_V2;
  if (n < *prefix) return mla_err("file ends inside the npy header length (%zu bytes)", n);
  *hlen = h->major == 1 ? (uint32_t)p[8] | (uint32_t)p[9] << 8
                        : (uint32_t)p[8] | (uint32_t)p[9] << 8 | (uint32_t)p[10] << 16 | (uint32_t)p[11] << 24;
  if (*hlen > MLA_NPY_MAX_HEADER) return mla_err("header length %u is implausibly large (at most %d bytes)", *hlen, MLA_NPY_MAX_HEADER);
  h->data_offset = (int64_t)*prefix + *hlen;
  return 0;
}

/* Data the shape promises must be in the file, and nothing after it. */
static int check_size(const mla_npy_header *h) {
  if (h->file_bytes < 0) return 0;
  int64_t have = h->file_bytes - h->data_offset;
  if (have < h->data_bytes)
    return mla_err("data is truncated: shape and descr '%s' need %lld bytes, the file has %lld after the header", h->descr,
                   (long long)h->data_bytes, (long long)have);
  if (have > h->data_bytes)
    return mla_err("%lld unexpected bytes after the data (shape and descr '%s' need %lld)", (long long)(have - h->data_bytes),
                   h->descr, (long long)h->data_bytes);
  return 0;
}

int mla_npy_parse(const void *buf, size_t len, mla_npy_header *h) {
  const unsigned char *p = (const unsigned char *)buf;
  size_t prefix;
  uint32_t hlen;
  memset(h, 0, sizeof *h);
  h->file_bytes = -1;
  if (parse_prefix(p, len, h, &prefix, &hlen)) return -1;
  if (len - prefix < hlen) return mla_err("header is truncated: %u bytes announced, %zu present", hlen, len - prefix);
  return mla_npy_parse_dict((const char *)p + prefix, hlen, h);
}

/* ---- files ------------------------------------------------------------------ */

static int64_t file_size(FILE *f) {
  long here = ftell(f);
  if (here < 0 || fseek(f, 0, SEEK_END) != 0) return -1;
  long end = ftell(f);
  if (end < 0 || fseek(f, here, SEEK_SET) != 0) return -1;
  return end;
}

int mla_npy_read_header(FILE *f, mla_npy_header *h) {
  unsigned char pre[MLA_NPY_PREFIX_V2];
  size_t prefix;
  uint32_t hlen;
  memset(h, 0, sizeof *h);
  h->file_bytes = file_size(f);
  size_t n = fread(pre, 1, MLA_NPY_PREFIX_V1, f);
  if (ferror(f)) return mla_err("read error: %s", strerror(errno));
  if (n == MLA_NPY_PREFIX_V1 && pre[6] >= 2 && pre[6] <= 3 && pre[7] == 0) n += fread(pre + n, 1, 2, f);
  if (parse_prefix(pre, n, h, &prefix, &hlen)) return -1;
  char *text = malloc(hlen ? hlen : 1);
  if (!text) return mla_err("out of host memory reading a %u-byte header", hlen);
  size_t got = fread(text, 1, hlen, f);
  int rc = got < hlen ? mla_err("header is truncated: %u bytes announced, %zu present", hlen, got)
                      : mla_npy_parse_dict(text, hlen, h);
  free(text);
  if (rc) return rc;
  return check_size(h);
}

int mla_npy_read_data(FILE *f, const mla_npy_header *h, void *dst) {
  size_t want = (size_t)h->data_bytes, got = want ? fread(dst, 1, want, f) : 0;
  if (got < want) {
    if (ferror(f)) return mla_err("read error: %s", strerror(errno));
    return mla_err("data is truncated: shape and descr '%s' need %lld bytes, the file has %zu after the header", h->descr,
                   (long long)h->data_bytes, got);
  }
  if (fgetc(f) != EOF) return mla_err("unexpected bytes after the data (shape and descr '%s' need %lld)", h->descr, (long long)h->data_bytes);
  return 0;
}

/* ---- descr <-> dtype --------------------------------------------------------- */

/* The dtype a descr holds by itself, or -1 when raw words need `as`. */
static int natural_dtype(const mla_npy_header *h) {
  switch (h->kind) {
  case 'b': return MLA_U8;
  case 'i': return h->itemsize == 1 ? MLA_I8 : h->itemsize == 2 ? MLA_I16 : h->itemsize == 4 ? MLA_I32 : MLA_I64;
  case 'u': return h->itemsize == 1 ? MLA_U8 : h->itemsize == 2 ? MLA_U16 : -1;
  case 'f': return h->itemsize == 2 ? MLA_F16 : h->itemsize == 4 ? MLA_F32 : h->itemsize == 8 ? MLA_F64 : -1;
  default: return -1;
  }
}

static int needs_as(const mla_npy_header *h) {
  if (h->kind == 'u') return mla_err("descr '%s': mlalab has no unsigned %d-bit dtype; load the raw words with as='i%d'", h->descr, 8 * h->itemsize, 8 * h->itemsize);
  if (h->kind == 'V' || h->kind == 'f')
    return mla_err("descr '%s' holds raw %d-byte words (ml_dtypes writes bfloat16 as '<V2', float8 as '<V1' or '<f1'); "
                   "name their format with as= (e.g. as='%s')", h->descr, h->itemsize, h->itemsize == 2 ? "bf16" : "e4m3");
  return mla_err("descr '%s' is not supported", h->descr);
}

int mla_npy_resolve(const mla_npy_header *h, const char *as, mla_npy_target *t) {
  memset(t, 0, sizeof *t);
  int nat = natural_dtype(h);
  if (!as) {
    if (nat < 0) return needs_as(h);
    t->dtype = (mla_dtype)nat;
  } else {
    mla_dtype d;
    if (mla_dtype_parse(as, &d)) return mla_err("as='%s' is not a dtype", as);
    int raw_words = h->kind == 'i' || h->kind == 'u' || h->kind == 'V' || (h->kind == 'f' && h->itemsize == 1);
    if (d == MLA_E2M1) {
      if (h->itemsize != 1 || !raw_words)
        return mla_err("as='e2m1' reads bytes from a 1-byte integer or void descr, not '%s'", h->descr);
      if (h->fortran_order) return mla_err("as='e2m1': fp4 in fortran order is not supported");
      t->unpacked_e2m1 = h->kind == 'V';
      if (!t->unpacked_e2m1 && h->ndim == 0)
        return mla_err("as='e2m1': a 0-d '%s' array has no last dim to unpack two codes per byte into", h->descr);
    } else {
      if (mla_dtype_size(d) != h->itemsize)
        return mla_err("as='%s' needs %d-byte words, descr '%s' has %d-byte items", as, mla_dtype_size(d), h->descr, h->itemsize);
      if (nat != (int)d && !raw_words)
        return mla_err("as='%s' reinterprets raw words from an integer or void descr; '%s' holds %s values", as, h->descr,
                       nat >= 0 ? mla_dtype_name((mla_dtype)nat) : "other");
    }
    t->dtype = d;
  }
  t->raw_dtype = t->unpacked_e2m1 ? MLA_U8 : t->dtype;
  t->ndim = h->ndim;
  for (int i = 0; i < h->ndim; i++) {
    t->sizes[i] = h->shape[i];
    t->raw_sizes[i] = h->fortran_order ? h->shape[h->ndim - 1 - i] : h->shape[i];
  }
  if (t->dtype == MLA_E2M1 && !t->unpacked_e2m1) {
    int last = h->ndim - 1;
    if (h->shape[last] > INT64_MAX / 4) return mla_err("as='e2m1': last dim %lld is too large to double", (long long)h->shape[last]);
    t->sizes[last] *= 2, t->raw_sizes[last] *= 2;
  }
  t->reversed = h->fortran_order && h->ndim > 1;
  return 0;
}

int mla_npy_pack_e2m1(const uint8_t *codes, int64_t n, uint8_t *packed) {
  for (int64_t i = 0; i < n; i++) {
    if (codes[i] > 15)
      return mla_err("as='e2m1': byte %lld is 0x%02x, not a float4_e2m1fn code (0..15, one per byte)", (long long)i, codes[i]);
    if (i & 1) packed[i >> 1] = (uint8_t)(packed[i >> 1] | codes[i] << 4);
    else packed[i >> 1] = codes[i];
  }
  return 0;
}

const char *mla_npy_descr_of(mla_dtype t) {
  switch (t) {
  case MLA_U8: return "|u1";
  case MLA_I8: return "|i1";
  case MLA_U16: return "<u2";
  case MLA_I16: return "<i2";
  case MLA_I32: return "<i4";
  case MLA_I64: return "<i8";
  case MLA_F16: return "<f2";
  case MLA_F32: return "<f4";
  case MLA_F64: return "<f8";
  case MLA_BF16: return "<u2";
  case MLA_E4M3: case MLA_E5M2: case MLA_UE8M0: case MLA_E2M1: return "|u1";
  default: return NULL;
  }
}

int mla_npy_stored_shape(mla_dtype t, int ndim, const int64_t *sizes, int64_t *out) {
  memcpy(out, sizes, sizeof(int64_t) * (size_t)ndim);
  if (t != MLA_E2M1) return ndim;
  if (ndim == 0 || sizes[ndim - 1] % 2)
    return mla_err("e2m1 is saved as packed bytes (two codes per byte): the last dim must be even, got %s",
                   ndim == 0 ? "a 0-d tensor" : "an odd one");
  out[ndim - 1] /= 2;
  return ndim;
}

/* ---- writing ---------------------------------------------------------------- */

int mla_npy_format_header(char *buf, size_t cap, const char *descr, int fortran_order, int ndim, const int64_t *shape,
                          size_t *len) {
  char dict[512];
  size_t k = (size_t)snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': %s, 'shape': (", descr,
                              fortran_order ? "True" : "False");
  for (int i = 0; i < ndim && k < sizeof dict; i++)
    k += (size_t)snprintf(dict + k, sizeof dict - k, i ? ", %lld" : "%lld", (long long)shape[i]);
  if (k < sizeof dict) k += (size_t)snprintf(dict + k, sizeof dict - k, ndim == 1 ? ",), }" : "), }");
  if (k >= sizeof dict) return mla_err("npy header does not fit in %zu bytes", sizeof dict);
  /* pad with spaces and a final newline so the data starts at a multiple of 64 */
  size_t total = MLA_NPY_PREFIX_V1 + k + 1;
  total = (total + 63) / 64 * 64;
  if (total > cap) return mla_err("npy header of %zu bytes exceeds the buffer (%zu)", total, cap);
  size_t hlen = total - MLA_NPY_PREFIX_V1;
  memcpy(buf, npy_magic, sizeof npy_magic);
  buf[6] = 1, buf[7] = 0, buf[8] = (char)(hlen & 0xFF), buf[9] = (char)(hlen >> 8);
  memcpy(buf + MLA_NPY_PREFIX_V1, dict, k);
  memset(buf + MLA_NPY_PREFIX_V1 + k, ' ', hlen - k - 1);
  buf[total - 1] = '\n';
  *len = total;
  return 0;
}

int mla_npy_write(FILE *f, const char *descr, int ndim, const int64_t *shape, const void *data, int64_t nbytes) {
  char head[640];
  size_t n;
  if (mla_npy_format_header(head, sizeof head, descr, 0, ndim, shape, &n)) return -1;
  if (fwrite(head, 1, n, f) != n || (nbytes > 0 && fwrite(data, 1, (size_t)nbytes, f) != (size_t)nbytes))
    return mla_err("write error: %s", strerror(errno));
  return 0;
}
