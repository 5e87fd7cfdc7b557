/* libFuzzer target for the .npy reader (src/npy.c): every input goes
 * through the in-memory parser and through the FILE path the Lua binding
 * uses (header, resolve with several as= values, data read, e2m1 packing),
 * and each accepted header must survive a write/re-parse round trip.
 * Built and run by fuzz/run.
 * fuzz-sources: src/npy.c src/dtype.c src/mla_error.c
 * fuzz-flags: -Isrc -Ikernels_rtc/include */
#define _GNU_SOURCE /* fmemopen */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"

/* A broken invariant is a bug in npy.c: stop so libFuzzer keeps the input. */
#define CHECK(c)                                                        \
  do {                                                                  \
    if (!(c)) {                                                         \
      fprintf(stderr, "npy_fuzz: invariant failed: %s (line %d)\n", #c, __LINE__); \
      abort();                                                          \
    }                                                                   \
  } while (0)

static const char *const as_values[] = {NULL, "bf16", "e4m3", "e2m1", "f32", "i32", "i64", "u8", "f16", "ue8m0", "no-such-dtype"};

static int same_header(const mla_npy_header *a, const mla_npy_header *b) {
  if (strcmp(a->descr, b->descr) || a->kind != b->kind || a->itemsize != b->itemsize || a->fortran_order != b->fortran_order ||
      a->ndim != b->ndim || a->numel != b->numel || a->data_bytes != b->data_bytes)
    return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

static int64_t count(int ndim, const int64_t *sizes) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++)
    if (sizes[i] == 0) return 0;
  for (int i = 0; i < ndim; i++) CHECK(!__builtin_mul_overflow(n, sizes[i], &n));
  return n;
}

/* Loads the data as l_npy.c does, into plain buffers. */
static void load_as(FILE *f, const mla_npy_header *h, const char *as) {
  mla_npy_target t;
  if (mla_npy_resolve(h, as, &t)) return;
  /* the raw tensor's bytes must be exactly what the file holds */
  int64_t raw_n = count(t.ndim, t.raw_sizes), fin_n = count(t.ndim, t.sizes);
  const mla_dtype_info *ri = mla_dtype_info_of(t.raw_dtype);
  CHECK(ri != NULL && mla_dtype_info_of(t.dtype) != NULL);
  CHECK((raw_n * ri->bits + 7) / 8 == h->data_bytes);
  CHECK(raw_n == fin_n);
  CHECK(!t.reversed || h->fortran_order);
  CHECK(fseek(f, (long)h->data_offset, SEEK_SET) == 0);
  unsigned char *buf = malloc(h->data_bytes ? (size_t)h->data_bytes : 1);
  CHECK(buf != NULL);
  if (mla_npy_read_data(f, h, buf) == 0 && t.unpacked_e2m1) {
    unsigned char *packed = calloc((size_t)(fin_n + 1) / 2 + 1, 1);
    CHECK(packed != NULL);
    mla_npy_pack_e2m1(buf, fin_n, packed);
    free(packed);
  }
  free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mla_npy_header mem, file;
  int mem_rc = mla_npy_parse(data, size, &mem);
  if (size == 0) return 0; /* fmemopen needs a non-empty buffer */
  FILE *f = fmemopen((void *)data, size, "rb");
  if (!f) return 0;
  if (mla_npy_read_header(f, &file) == 0) {
    /* the FILE path accepts a subset of what the memory parser accepts */
    CHECK(mem_rc == 0 && same_header(&mem, &file));
    CHECK(file.data_offset + file.data_bytes == (int64_t)size);
    for (size_t i = 0; i < sizeof as_values / sizeof as_values[0]; i++) load_as(f, &file, as_values[i]);
    /* writing the header back and re-reading it gives the same header */
    char buf[1024];
    size_t n;
    if (mla_npy_format_header(buf, sizeof buf, file.descr, file.fortran_order, file.ndim, file.shape, &n) == 0) {
      mla_npy_header again;
      CHECK(n % 64 == 0);
      CHECK(mla_npy_parse(buf, n, &again) == 0 && same_header(&again, &file));
    }
  }
  fclose(f);
  return 0;
}
