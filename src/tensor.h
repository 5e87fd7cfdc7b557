/* Tensors: a view (dtype, sizes, element strides, element offset) over a
 * ref-counted storage on the CPU or a CUDA device. Sizes, strides and
 * offsets are int64 everywhere; strides are non-negative. Sub-byte dtypes
 * (e2m1) count elements in nibbles: element i of a storage lives in byte
 * i/2, the even element in the low nibble. */
#ifndef MLA_TENSOR_H
#define MLA_TENSOR_H

#include <stdint.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MLA_MAX_DIMS 8
#define MLA_CPU (-1)

typedef struct mla_storage {
  void *data;
  int64_t nbytes;
  int device;   /* MLA_CPU or a CUDA ordinal */
  int refcount;
  int borrowed; /* memory owned by someone else: never freed here */
} mla_storage;

typedef struct mla_tensor {
  mla_dtype dtype;
  int ndim;
  int64_t sizes[MLA_MAX_DIMS];
  int64_t strides[MLA_MAX_DIMS]; /* in elements */
  int64_t offset;                /* in elements */
  mla_storage *storage;
} mla_tensor;

/* storage */
int mla_storage_new(int device, int64_t nbytes, mla_storage **out);
mla_storage *mla_storage_wrap(int device, void *data, int64_t nbytes); /* borrowed */
void mla_storage_retain(mla_storage *s);
void mla_storage_release(mla_storage *s);

/* creation: a fresh contiguous tensor (contents undefined) */
int mla_tensor_empty(mla_tensor *t, mla_dtype dtype, int ndim, const int64_t *sizes, int device);
/* release the tensor's reference; leaves t with storage NULL */
void mla_tensor_release(mla_tensor *t);
/* t becomes another reference to the same view */
void mla_tensor_share(mla_tensor *dst, const mla_tensor *src);

int64_t mla_tensor_numel(const mla_tensor *t);
int mla_tensor_device(const mla_tensor *t);
int mla_tensor_is_contiguous(const mla_tensor *t);
/* Byte range [lo, hi) the view can touch, relative to the storage start. */
void mla_tensor_byte_range(const mla_tensor *t, int64_t *lo, int64_t *hi);
/* Checks sizes, strides and offset against the storage; call after every
 * change of strides (never before: a view's true extent depends on them). */
int mla_tensor_validate(const mla_tensor *t);
/* Pointer to the first element (byte granular; sub-byte tensors need an even offset). */
int mla_tensor_data(const mla_tensor *t, void **out);
/* Byte address of an element given its coordinates (CPU tensors). */
int64_t mla_tensor_elem_index(const mla_tensor *t, const int64_t *idx);

/* views: all metadata-only, all validated */
int mla_tensor_narrow(mla_tensor *t, int dim, int64_t start, int64_t len);
int mla_tensor_select(mla_tensor *t, int dim, int64_t index);
int mla_tensor_permute(mla_tensor *t, const int *perm);
int mla_tensor_view(mla_tensor *t, int ndim, const int64_t *sizes); /* -1 infers one size */
int mla_tensor_as_strided(mla_tensor *t, int ndim, const int64_t *sizes, const int64_t *strides,
                          int64_t offset);
/* Reinterpret the bytes as another dtype; the last dim must be contiguous
 * and its byte length divisible by the new element size. */
int mla_tensor_view_dtype(mla_tensor *t, mla_dtype dtype);

/* data: any devices, any strides, any dtypes (conversions as in dtype.h) */
int mla_tensor_copy(mla_tensor *dst, const mla_tensor *src, const mla_cvt_opts *o);
int mla_tensor_fill(mla_tensor *t, double v);
/* Counter-based random numbers: element i (in logical row-major order) gets
 * the same value on every device for the same seed. */
typedef enum { MLA_RNG_UNIFORM, MLA_RNG_NORMAL, MLA_RNG_BITS } mla_rng_kind;
int mla_tensor_random(mla_tensor *t, uint64_t seed, mla_rng_kind kind, double a, double b);

/* Helpers for C kernels on CPU tensors: walk every element in row-major order. */
typedef struct mla_iter {
  int ndim;
  int64_t sizes[MLA_MAX_DIMS];
  int64_t idx[MLA_MAX_DIMS];
  int64_t n, pos;
} mla_iter;
void mla_iter_init(mla_iter *it, const mla_tensor *t);
/* element index (storage elements) of the current position, or -1 at the end */
int64_t mla_iter_elem(const mla_iter *it, const mla_tensor *t);
void mla_iter_next(mla_iter *it);

#ifdef __cplusplus
}
#endif
#endif
