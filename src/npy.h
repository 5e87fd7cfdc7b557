/* numpy .npy files: header parsing and writing, pure C (no Lua), so the
 * libFuzzer target (fuzz/npy_fuzz.c) runs the very code the binding uses.
 *
 * Format: "\x93NUMPY", major, minor, header length (2 bytes LE for v1.0,
 * 4 bytes for v2.0 and v3.0), then a Python dict literal
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 * padded with spaces and a newline, then the raw little-endian data.
 * Every file is untrusted: each check fails with an mla_err message. */
#ifndef MLA_NPY_H
#define MLA_NPY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dtype.h"
#include "tensor.h" /* MLA_MAX_DIMS */

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes before the dict: magic (6) + version (2) + length (2 or 4). */
#define MLA_NPY_PREFIX_V1 10
#define MLA_NPY_PREFIX_V2 12
/* Longest header dict accepted; numpy's own reader stops at 10000 by default. */
#define MLA_NPY_MAX_HEADER (1 << 20)

typedef struct mla_npy_header {
  int major, minor;
  char descr[32];      /* as written, e.g. "<f4" */
  char kind;           /* numpy kind letter: b i u f V */
  int itemsize;        /* bytes per stored word */
  int fortran_order;
  int ndim;
  int64_t shape[MLA_MAX_DIMS];
  int64_t numel;
  int64_t data_offset; /* first data byte, from the start of the file */
  int64_t data_bytes;  /* numel * itemsize */
  int64_t file_bytes;  /* size of the file, -1 when it cannot be known */
} mla_npy_header;

/* Parses a file's beginning held in memory (buf, len bytes available): the
 * prefix and the whole dict must be there; the data need not be. */
int mla_npy_parse(const void *buf, size_t len, mla_npy_header *h);
/* Parses only the dict text (hlen bytes, no prefix) into descr/order/shape. */
int mla_npy_parse_dict(const char *text, size_t hlen, mla_npy_header *h);

/* Reads and checks the header from f (at its start) and, where the file
 * size is known, that the data the shape promises is all there. Leaves f at
 * the first data byte. */
int mla_npy_read_header(FILE *f, mla_npy_header *h);
/* Reads exactly h->data_bytes into dst; a short file or bytes after the
 * data are errors. */
int mla_npy_read_data(FILE *f, const mla_npy_header *h, void *dst);

/* What a header becomes as a tensor. `as` (NULL or a dtype name) says which
 * format raw words hold: bf16 in '<u2' or ml_dtypes' '<V2', fp8 in '|u1',
 * e2m1 packed two per byte in '|u1' (the last dim doubles), or one code per
 * byte in ml_dtypes' float4_e2m1fn ('<V1', the shape stays). */
typedef struct mla_npy_target {
  mla_dtype dtype;                 /* of the tensor returned */
  mla_dtype raw_dtype;             /* of the tensor the data is read into */
  int ndim;
  int64_t sizes[MLA_MAX_DIMS];     /* final tensor shape */
  int64_t raw_sizes[MLA_MAX_DIMS]; /* C-order shape of the stored data */
  int reversed;                    /* fortran_order: tensor = raw permuted in reverse */
  int unpacked_e2m1;               /* raw u8 codes to pack two per byte */
} mla_npy_target;
int mla_npy_resolve(const mla_npy_header *h, const char *as, mla_npy_target *t);
/* Packs n one-per-byte e2m1 codes (ml_dtypes float4_e2m1fn) two per byte,
 * even element in the low nibble; a byte above 15 is an error. */
int mla_npy_pack_e2m1(const uint8_t *codes, int64_t n, uint8_t *packed);

/* Descr written for a dtype ('<f4', narrow formats as raw '<u2' / '|u1'). */
const char *mla_npy_descr_of(mla_dtype t);
/* Stored shape of a tensor of dtype t: e2m1 halves the last dim (which must
 * be even). Returns the number of dims. */
int mla_npy_stored_shape(mla_dtype t, int ndim, const int64_t *sizes, int64_t *out);
/* Formats a whole prefix + dict (v1.0, padded so the data starts at a
 * multiple of 64) into buf; *len receives its length. */
int mla_npy_format_header(char *buf, size_t cap, const char *descr, int fortran_order, int ndim,
                          const int64_t *shape, size_t *len);
/* Writes a C-order array: header then nbytes of data. */
int mla_npy_write(FILE *f, const char *descr, int ndim, const int64_t *shape, const void *data, int64_t nbytes);

#ifdef __cplusplus
}
#endif
#endif
