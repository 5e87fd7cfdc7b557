/* Tensor metadata, views and validation. Data movement is in tensor_copy.c. */
#define _POSIX_C_SOURCE 200809L
#include "tensor.h"

#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "mla_error.h"

/* ---- storage ---------------------------------------------------------- */

int mla_storage_new(int device, int64_t nbytes, mla_storage **out) {
  if (nbytes < 0) return mla_err("negative storage size %lld", (long long)nbytes);
  /* beyond any machine's address space: say so instead of asking malloc (ASan aborts on such requests) */
  if (device == MLA_CPU && nbytes > ((int64_t)1 << 47))
    return mla_err("out of host memory: requested %lld bytes, more than a 47-bit address space holds", (long long)nbytes);
  mla_storage *s = calloc(1, sizeof *s);
  if (!s) return mla_err("out of host memory");
  if (device == MLA_CPU) {
    if (posix_memalign(&s->data, 256, nbytes > 0 ? (size_t)nbytes : 1) != 0) {
      free(s);
      return mla_err("out of host memory: requested %lld bytes", (long long)nbytes);
    }
  } else if (mla_device_alloc(device, nbytes, &s->data)) {
    free(s);
    return -1;
  }
  s->nbytes = nbytes, s->device = device, s->refcount = 1;
  *out = s;
  return 0;
}

mla_storage *mla_storage_wrap(int device, void *data, int64_t nbytes) {
  mla_storage *s = calloc(1, sizeof *s);
  MLA_ASSERT(s);
  s->data = data, s->nbytes = nbytes, s->device = device, s->refcount = 1, s->borrowed = 1;
  return s;
}

void mla_storage_retain(mla_storage *s) { if (s) s->refcount++; }

void mla_storage_release(mla_storage *s) {
  if (!s || --s->refcount > 0) return;
  if (!s->borrowed) {
    if (s->device == MLA_CPU) free(s->data);
    else mla_device_free(s->device, s->data, s->nbytes);
  }
  free(s);
}

/* ---- tensors ---------------------------------------------------------- */

static int64_t elem_bytes_ceil(mla_dtype t, int64_t n) {
  return (n * mla_dtype_info_of(t)->bits + 7) / 8;
}

static int check_shape(int ndim, const int64_t *sizes) {
  if (ndim < 0 || ndim > MLA_MAX_DIMS) return mla_err("tensors have 0 to %d dims, got %d", MLA_MAX_DIMS, ndim);
  for (int i = 0; i < ndim; i++)
    if (sizes[i] < 0) return mla_err("size of dim %d is negative (%lld)", i, (long long)sizes[i]);
  return 0;
}

/* Element count; *overflow also when the product of the non-zero sizes
 * (the contiguous strides of a zero-size tensor) leaves 64-bit addressing. */
static int64_t numel_of(int ndim, const int64_t *sizes, int *overflow) {
  int64_t n = 1, span = 1;
  *overflow = 0;
  for (int i = 0; i < ndim; i++) {
    if (sizes[i] == 0) { n = 0; continue; }
    if (span > INT64_MAX / 16 / sizes[i]) { *overflow = 1; return 0; }
    span *= sizes[i], n *= sizes[i];
  }
  return n;
}

static void set_contiguous_strides(mla_tensor *t) {
  int64_t st = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    t->strides[i] = st;
    st *= t->sizes[i] > 0 ? t->sizes[i] : 1;
  }
}

int mla_tensor_empty(mla_tensor *t, mla_dtype dtype, int ndim, const int64_t *sizes, int device) {
  int ovf;
  memset(t, 0, sizeof *t);
  if ((unsigned)dtype >= MLA_DTYPE_COUNT) return mla_err("invalid dtype id %d", (int)dtype);
  if (check_shape(ndim, sizes)) return -1;
  int64_t n = numel_of(ndim, sizes, &ovf);
  if (ovf) return mla_err("tensor of %d dims is too large to address", ndim);
  t->dtype = dtype, t->ndim = ndim;
  memcpy(t->sizes, sizes, sizeof(int64_t) * (size_t)ndim);
  set_contiguous_strides(t);
  return mla_storage_new(device, elem_bytes_ceil(dtype, n), &t->storage);
}

void mla_tensor_release(mla_tensor *t) {
  mla_storage_release(t->storage);
  t->storage = NULL;
}

void mla_tensor_share(mla_tensor *dst, const mla_tensor *src) {
  *dst = *src;
  mla_storage_retain(dst->storage);
}

int64_t mla_tensor_numel(const mla_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->sizes[i];
  return n;
}

int mla_tensor_device(const mla_tensor *t) { return t->storage ? t->storage->device : MLA_CPU; }

int mla_tensor_is_contiguous(const mla_tensor *t) {
  int64_t st = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->sizes[i] == 1) continue;
    if (t->strides[i] != st) return 0;
    st *= t->sizes[i];
  }
  return 1;
}

void mla_tensor_byte_range(const mla_tensor *t, int64_t *lo, int64_t *hi) {
  int64_t last = t->offset; /* element index of the last element */
  int bits = mla_dtype_info_of(t->dtype)->bits;
  if (mla_tensor_numel(t) == 0) { *lo = *hi = t->offset * bits / 8; return; }
  for (int i = 0; i < t->ndim; i++) last += (t->sizes[i] - 1) * t->strides[i];
  *lo = t->offset * bits / 8;
  *hi = (last + 1) * bits / 8 + ((last + 1) * bits % 8 ? 1 : 0);
}

int mla_tensor_validate(const mla_tensor *t) {
  if (!t->storage) return mla_err("attempt to use a closed tensor");
  if (check_shape(t->ndim, t->sizes)) return -1;
  if (t->offset < 0) return mla_err("storage offset is negative (%lld)", (long long)t->offset);
  int64_t last = t->offset;
  int bits = mla_dtype_info_of(t->dtype)->bits;
  int ovf;
  numel_of(t->ndim, t->sizes, &ovf);
  if (ovf) return mla_err("view is too large to address");
  if (mla_tensor_numel(t) == 0) return 0;
  for (int i = 0; i < t->ndim; i++) {
    if (t->strides[i] < 0) return mla_err("stride of dim %d is negative (%lld)", i, (long long)t->strides[i]);
    if (t->sizes[i] > 1 && t->strides[i] > (INT64_MAX / 16 - last) / (t->sizes[i] - 1))
      return mla_err("stride of dim %d overflows 64-bit addressing", i);
    last += (t->sizes[i] - 1) * t->strides[i];
  }
  int64_t lo, hi;
  mla_tensor_byte_range(t, &lo, &hi);
  (void)bits;
  if (hi > t->storage->nbytes)
    return mla_err("view reaches byte %lld but its storage has %lld bytes (offset %lld, last element %lld)",
                   (long long)hi, (long long)t->storage->nbytes, (long long)t->offset, (long long)last);
  return 0;
}

int mla_tensor_data(const mla_tensor *t, void **out) {
  if (!t->storage) return mla_err("attempt to use a closed tensor");
  int bits = mla_dtype_info_of(t->dtype)->bits;
  if ((t->offset * bits) % 8) return mla_err("a %s view starting at an odd nibble has no byte address", mla_dtype_name(t->dtype));
  *out = (char *)t->storage->data + t->offset * bits / 8;
  return 0;
}

int64_t mla_tensor_elem_index(const mla_tensor *t, const int64_t *idx) {
  int64_t e = t->offset;
  for (int i = 0; i < t->ndim; i++) e += idx[i] * t->strides[i];
  return e;
}

/* ---- views ------------------------------------------------------------ */

static int check_dim(const mla_tensor *t, int dim) {
  if (dim < 0 || dim >= t->ndim) return mla_err("dim %d out of range for a %d-dim tensor", dim, t->ndim);
  return 0;
}

int mla_tensor_narrow(mla_tensor *t, int dim, int64_t start, int64_t len) {
  if (check_dim(t, dim)) return -1;
  if (start < 0 || len < 0 || start + len > t->sizes[dim])
    return mla_err("narrow(%d, %lld, %lld) is out of range for size %lld", dim, (long long)start,
                   (long long)len, (long long)t->sizes[dim]);
  t->offset += start * t->strides[dim];
  t->sizes[dim] = len;
  return mla_tensor_validate(t);
}

int mla_tensor_select(mla_tensor *t, int dim, int64_t index) {
  if (check_dim(t, dim)) return -1;
  if (index < 0 || index >= t->sizes[dim])
    return mla_err("select(%d, %lld) is out of range for size %lld", dim, (long long)index, (long long)t->sizes[dim]);
  t->offset += index * t->strides[dim];
  for (int i = dim; i < t->ndim - 1; i++) t->sizes[i] = t->sizes[i + 1], t->strides[i] = t->strides[i + 1];
  t->ndim--;
  return mla_tensor_validate(t);
}

int mla_tensor_permute(mla_tensor *t, const int *perm) {
  int seen[MLA_MAX_DIMS] = {0};
  int64_t sz[MLA_MAX_DIMS], st[MLA_MAX_DIMS];
  for (int i = 0; i < t->ndim; i++) {
    if (perm[i] < 0 || perm[i] >= t->ndim || seen[perm[i]]++)
      return mla_err("permute: entry %d (%d) is not a permutation of 0..%d", i, perm[i], t->ndim - 1);
    sz[i] = t->sizes[perm[i]], st[i] = t->strides[perm[i]];
  }
  memcpy(t->sizes, sz, sizeof(int64_t) * (size_t)t->ndim);
  memcpy(t->strides, st, sizeof(int64_t) * (size_t)t->ndim);
  return 0;
}

/* A view with new sizes exists iff each group of old dims that maps onto a
 * group of new dims is itself contiguous in memory (as torch's view rule). */
int mla_tensor_view(mla_tensor *t, int ndim, const int64_t *sizes_in) {
  int64_t sizes[MLA_MAX_DIMS], strides[MLA_MAX_DIMS];
  if (ndim < 0 || ndim > MLA_MAX_DIMS) return mla_err("view: 0 to %d dims, got %d", MLA_MAX_DIMS, ndim);
  int64_t n = mla_tensor_numel(t), known = 1;
  int infer = -1;
  for (int i = 0; i < ndim; i++) {
    sizes[i] = sizes_in[i];
    if (sizes[i] == -1) {
      if (infer >= 0) return mla_err("view: only one size may be -1");
      infer = i;
    } else if (sizes[i] < 0) return mla_err("view: size %lld of dim %d is invalid", (long long)sizes[i], i);
    else if (__builtin_mul_overflow(known, sizes[i], &known)) return mla_err("view: shape's element count overflows 64 bits");
  }
  if (infer >= 0) {
    if (known == 0 || n % known) return mla_err("view: cannot infer dim %d for %lld elements", infer, (long long)n);
    sizes[infer] = n / known;
    known *= sizes[infer];
  }
  if (known != n) return mla_err("view: shape has %lld elements, tensor has %lld", (long long)known, (long long)n);
  if (n == 0) {
    int ovf;
    numel_of(ndim, sizes, &ovf);
    if (ovf) return mla_err("view: shape is too large to address");
    t->ndim = ndim;
    memcpy(t->sizes, sizes, sizeof(int64_t) * (size_t)ndim);
    set_contiguous_strides(t);
    return 0;
  }
  /* Split the old dims into maximal contiguous chunks (innermost first) and
   * give each chunk's elements to the new dims that cover exactly as many. */
  int nd = ndim - 1;
  if (t->ndim == 0) {
    for (int i = 0; i < ndim; i++) strides[i] = 1;
    nd = -1;
  } else {
    int64_t base = t->strides[t->ndim - 1], old_n = 1, new_n = 1;
    for (int od = t->ndim - 1; od >= 0; od--) {
      old_n *= t->sizes[od];
      int chunk_ends = od == 0 || (t->sizes[od - 1] != 1 && t->strides[od - 1] != old_n * base);
      if (!chunk_ends) continue;
      while (nd >= 0 && (new_n < old_n || sizes[nd] == 1)) {
        strides[nd] = new_n * base;
        new_n *= sizes[nd];
        nd--;
      }
      if (new_n != old_n)
        return mla_err("view: the tensor's strides do not allow this shape; use reshape (which copies) or contiguous()");
      if (od > 0) base = t->strides[od - 1], old_n = 1, new_n = 1;
    }
  }
  if (nd != -1) return mla_err("view: incompatible shape");
  t->ndim = ndim;
  memcpy(t->sizes, sizes, sizeof(int64_t) * (size_t)ndim);
  memcpy(t->strides, strides, sizeof(int64_t) * (size_t)ndim);
  return 0;
}

int mla_tensor_as_strided(mla_tensor *t, int ndim, const int64_t *sizes, const int64_t *strides, int64_t offset) {
  if (check_shape(ndim, sizes)) return -1;
  mla_tensor v = *t;
  v.ndim = ndim;
  memcpy(v.sizes, sizes, sizeof(int64_t) * (size_t)ndim);
  memcpy(v.strides, strides, sizeof(int64_t) * (size_t)ndim);
  v.offset = offset;
  if (mla_tensor_validate(&v)) return mla_err_prefix("as_strided: ");
  *t = v;
  return 0;
}

int mla_tensor_view_dtype(mla_tensor *t, mla_dtype dtype) {
  int ob = mla_dtype_info_of(t->dtype)->bits, nb = mla_dtype_info_of(dtype)->bits;
  if (ob == nb) { t->dtype = dtype; return 0; }
  if (t->ndim == 0) return mla_err("view_dtype: a 0-dim tensor cannot change element size");
  int last = t->ndim - 1;
  if (t->sizes[last] != 1 && t->strides[last] != 1)
    return mla_err("view_dtype: the last dim must be contiguous (stride %lld)", (long long)t->strides[last]);
  if ((t->sizes[last] * ob) % nb)
    return mla_err("view_dtype: last dim of %lld x %d bits is not a multiple of %d bits", (long long)t->sizes[last], ob, nb);
  if ((t->offset * ob) % nb) return mla_err("view_dtype: storage offset is not aligned to the new element size");
  for (int i = 0; i < last; i++)
    if ((t->strides[i] * ob) % nb) return mla_err("view_dtype: stride of dim %d is not a multiple of the new element size", i);
  for (int i = 0; i < last; i++) t->strides[i] = t->strides[i] * ob / nb;
  t->sizes[last] = t->sizes[last] * ob / nb;
  t->strides[last] = 1;
  t->offset = t->offset * ob / nb;
  t->dtype = dtype;
  return mla_tensor_validate(t);
}

/* ---- iteration -------------------------------------------------------- */

void mla_iter_init(mla_iter *it, const mla_tensor *t) {
  memset(it, 0, sizeof *it);
  it->ndim = t->ndim;
  memcpy(it->sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
  it->n = mla_tensor_numel(t);
}

int64_t mla_iter_elem(const mla_iter *it, const mla_tensor *t) {
  return it->pos < it->n ? mla_tensor_elem_index(t, it->idx) : -1;
}

void mla_iter_next(mla_iter *it) {
  it->pos++;
  for (int i = it->ndim - 1; i >= 0; i--) {
    if (++it->idx[i] < it->sizes[i]) return;
    it->idx[i] = 0;
  }
}
