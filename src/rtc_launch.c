/* JIT kernel loading, argument packing and checked launches (rtc_launch.h). */
#define _POSIX_C_SOURCE 200809L
#include "rtc_launch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device.h"
#include "mla_error.h"

/* ---- signatures ------------------------------------------------------------ */

int mla_rtc_parse_signature(const char *sig, mla_rtc_param *out, int max) {
  int n = 0;
  int64_t off = 0;
  const char *s = sig;
  while (*s) {
    const char *e = strchr(s, ',');
    size_t len = e ? (size_t)(e - s) : strlen(s);
    if (n >= max) return mla_err("more than %d parameters", max);
    mla_rtc_param *p = &out[n];
    memset(p, 0, sizeof *p);
    if (len == 0 || len >= sizeof p->type) return mla_err("bad signature token in '%s'", sig);
    char tok[sizeof p->type];
    memcpy(tok, s, len);
    tok[len] = 0;
    long bits = 0, count = 0, align = 0;
    char cls = tok[0];
    if (strchr(tok, '[')) {
      if (sscanf(tok + 1, "%ld[%ld]@%ld", &bits, &count, &align) != 3 || bits <= 0 || bits % 8 || count <= 0 ||
          align <= 0 || (align & (align - 1)))
        return mla_err("bad signature token '%s'", tok);
      p->kind = MLA_PARAM_BYTES;
      p->size = (int64_t)(bits / 8) * count;
      p->align = (int)align;
      char *at = strchr(tok, '@');
      *at = 0; /* type shown without the alignment */
    } else {
      char *end;
      bits = strtol(tok + 1, &end, 10);
      if (*end || (bits != 8 && bits != 16 && bits != 32 && bits != 64)) return mla_err("bad signature token '%s'", tok);
      p->size = bits / 8;
      p->align = (int)p->size;
      p->kind = cls == 'f' ? MLA_PARAM_FLOAT : (cls == 'u' || cls == 's') ? MLA_PARAM_INT : MLA_PARAM_BYTES;
      if (cls == 'f' && bits == 16) p->kind = MLA_PARAM_BYTES; /* .f16: pass the bits as a 2-byte string */
    }
    snprintf(p->type, sizeof p->type, "%s", tok);
    off = (off + p->align - 1) / p->align * p->align;
    p->offset = off;
    off += p->size;
    n++;
    s += len;
    if (*s == ',') s++;
  }
  return n;
}

/* ---- packing --------------------------------------------------------------- */

static void put_le(unsigned char *dst, uint64_t v, int64_t size) {
  for (int64_t i = 0; i < size; i++) dst[i] = (unsigned char)(v >> (8 * i));
}

static const char *describe(const mla_rtc_arg *a, char *buf, size_t n) {
  if (a->what) return a->what;
  if (a->kind == MLA_ARG_PTR && a->tensor_dtype) { /* formatted only on the error path */
    if (a->tensor_dev < 0) snprintf(buf, n, "a cpu %s tensor", a->tensor_dtype);
    else snprintf(buf, n, "a cuda:%d %s tensor", a->tensor_dev, a->tensor_dtype);
    return buf;
  }
  switch (a->kind) {
  case MLA_ARG_INT: snprintf(buf, n, "the integer %lld", (long long)a->i); break;
  case MLA_ARG_FLOAT: snprintf(buf, n, "the number %.17g", a->f); break;
  case MLA_ARG_BOOL: snprintf(buf, n, "a boolean"); break;
  case MLA_ARG_PTR: snprintf(buf, n, "a pointer"); break;
  default: snprintf(buf, n, "a %zu-byte string", a->nbytes); break;
  }
  return buf;
}

#define ARG_ERR(fmt, ...)                                                                                          \
  mla_err("argument %d of %d (%s%s%lld bytes): " fmt, index, count, p->type, p->type[0] ? ", " : "",            \
          (long long)p->size, __VA_ARGS__)
/* How an error names the value: formatted only on the error path (launches are hot). */
#define WHAT describe(a, buf, sizeof buf)

static int pack_int(const mla_rtc_param *p, int index, int count, int64_t v, const mla_rtc_arg *a, unsigned char *dst) {
  char buf[96];
  if (p->size != 1 && p->size != 2 && p->size != 4 && p->size != 8)
    return ARG_ERR("got %s; pass a %lld-byte string for this parameter", WHAT, (long long)p->size);
  if (p->size < 8) {
    /* the parameter's signedness is unknown: accept either reading */
    int64_t lo = -((int64_t)1 << (8 * p->size - 1)), hi = ((int64_t)1 << (8 * p->size)) - 1;
    if (v < lo || v > hi) return ARG_ERR("%s does not fit in %lld bytes", WHAT, (long long)p->size);
  }
  put_le(dst, (uint64_t)v, p->size);
  return 0;
}

static int pack_float(const mla_rtc_param *p, int index, int count, double v, const mla_rtc_arg *a, unsigned char *dst) {
  char buf[96];
  if (p->size == 4) {
    float f = (float)v;
    memcpy(dst, &f, 4);
  } else if (p->size == 8) {
    memcpy(dst, &v, 8);
  } else {
    return ARG_ERR("got %s; pass the bits as a %lld-byte string (e.g. mla.rtc.f16(x))", WHAT, (long long)p->size);
  }
  return 0;
}

int mla_rtc_pack_arg(const mla_rtc_param *p, int index, int count, const mla_rtc_arg *a, unsigned char *dst) {
  char buf[96];
  switch (a->kind) {
  case MLA_ARG_BYTES:
    if ((int64_t)a->nbytes != p->size) return ARG_ERR("got a %zu-byte string", a->nbytes);
    memcpy(dst, a->bytes, a->nbytes);
    return 0;
  case MLA_ARG_PTR:
    if (p->kind == MLA_PARAM_FLOAT || p->kind == MLA_PARAM_BYTES || p->size != 8)
      return ARG_ERR("got %s (an 8-byte device pointer)", WHAT);
    put_le(dst, (uint64_t)(uintptr_t)a->ptr, 8);
    return 0;
  case MLA_ARG_BOOL:
    if (p->kind == MLA_PARAM_FLOAT || p->kind == MLA_PARAM_BYTES) return ARG_ERR("got %s", WHAT);
    return pack_int(p, index, count, a->i ? 1 : 0, a, dst);
  case MLA_ARG_INT:
    if (p->kind == MLA_PARAM_BYTES) return ARG_ERR("got %s; pass a %lld-byte string", WHAT, (long long)p->size);
    if (p->kind == MLA_PARAM_FLOAT) return pack_float(p, index, count, (double)a->i, a, dst);
    return pack_int(p, index, count, a->i, a, dst);
  case MLA_ARG_FLOAT:
    if (p->kind == MLA_PARAM_BYTES) return ARG_ERR("got %s; pass a %lld-byte string", WHAT, (long long)p->size);
    if (p->kind == MLA_PARAM_FLOAT || (p->kind == MLA_PARAM_ANY && (p->size == 4 || p->size == 8)))
      return pack_float(p, index, count, a->f, a, dst);
    /* an integer parameter takes a number only when it holds an exact integer */
    if (!(a->f == floor(a->f)) || fabs(a->f) >= 9223372036854775808.0)
      return ARG_ERR("got %s, which is not an integer", WHAT);
    return pack_int(p, index, count, (int64_t)a->f, a, dst);
  default: return ARG_ERR("got an unsupported value%s", "");
  }
}

/* ---- library and kernels ----------------------------------------------------- */

static int need_device(void) {
  if (mla_device_count() > 0) return 0;
  return mla_err("no CUDA device is usable (%s): JIT kernels compile without a GPU but need one to load",
                 mla_device_status());
}

int mla_rtc_library_load(const void *cubin, size_t len, cudaLibrary_t *lib) {
  (void)len;
  if (need_device()) return -1;
  int cur = 0;
  if (cudaGetDevice(&cur) != cudaSuccess) cur = 0;
  if (mla_device_use(cur)) return -1;
  return mla_cuda_check(cudaLibraryLoadData(lib, cubin, NULL, NULL, 0, NULL, NULL, 0), "cudaLibraryLoadData");
}

void mla_rtc_library_unload(cudaLibrary_t lib) {
  if (lib && !mla_device_poisoned()) {
    cudaLibraryUnload(lib);
    cudaGetLastError();
  }
}

void mla_rtc_kernel_clear(mla_rtc_kernel *k) {
  free(k->lowered);
  free(k->sig);
  free(k->params);
  free(k->argbuf);
  free(k->argv);
  k->lowered = k->sig = NULL, k->params = NULL, k->argbuf = NULL, k->argv = NULL;
  k->handle = NULL;
  k->nparams = -1;
  k->argbytes = 0;
  k->attr_known = 0;
  memset(k->smem_optin, 0, sizeof k->smem_optin);
}

static char *dup_s(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

int mla_rtc_kernel_bind(mla_rtc_kernel *k, cudaLibrary_t lib, const char *lowered, const char *sig) {
  cudaKernel_t h = NULL;
  char what[256];
  snprintf(what, sizeof what, "cudaLibraryGetKernel(%s)", k->name);
  if (mla_cuda_check(cudaLibraryGetKernel(&h, lib, lowered), what)) return -1;
  mla_rtc_kernel_clear(k);
  k->handle = h;
  k->lowered = dup_s(lowered);
  k->sig = dup_s(sig);
  if (!k->lowered || (sig && !k->sig)) return mla_err("out of memory");
  return 0;
}

int mla_rtc_kernel_params(mla_rtc_kernel *k, int dev) {
  if (k->nparams >= 0) return 0;
  if (mla_device_use(dev)) return -1;
  int cap = 16, n = 0;
  mla_rtc_param *ps = malloc(sizeof *ps * (size_t)cap);
  if (!ps) return mla_err("out of memory");
  /* With the PTX list known, ask the driver about exactly that many
   * parameters: probing past the last one is an API error that
   * compute-sanitizer (rightly) reports. Without it, probe to the end. */
  int limit = -1;
  if (k->sig) {
    limit = k->sig[0] ? 1 : 0;
    for (const char *c = k->sig; *c; c++) limit += *c == ',';
  }
  for (; limit < 0 || n < limit;) {
    size_t off = 0, size = 0;
    if (cudaFuncGetParamInfo((const void *)k->handle, (size_t)n, &off, &size) != cudaSuccess) {
      cudaGetLastError(); /* past the last parameter: that is the count */
      break;
    }
    if (n == cap) {
      cap *= 2;
      mla_rtc_param *q = realloc(ps, sizeof *ps * (size_t)cap);
      if (!q) { free(ps); return mla_err("out of memory"); }
      ps = q;
    }
    memset(&ps[n], 0, sizeof ps[n]);
    ps[n].offset = (int64_t)off, ps[n].size = (int64_t)size, ps[n].kind = MLA_PARAM_ANY, ps[n].align = 1;
    n++;
  }
  /* a driver that cannot answer (no parameter at all where the PTX has some): the PTX list stands alone */
  if (n == 0 && k->sig && k->sig[0]) {
    free(ps);
    int m = 0;
    for (const char *c = k->sig; *c; c++) m += *c == ',';
    ps = malloc(sizeof *ps * (size_t)(m + 1));
    if (!ps) return mla_err("out of memory");
    n = mla_rtc_parse_signature(k->sig, ps, m + 1);
    if (n < 0) { free(ps); return -1; }
  }
  /* the PTX signature knows int from float: use it when it describes the same list */
  else if (k->sig) {
    mla_rtc_param *sp = malloc(sizeof *sp * (size_t)(n + 1));
    int m = sp ? mla_rtc_parse_signature(k->sig, sp, n + 1) : -1;
    int agree = m == n;
    for (int i = 0; agree && i < n; i++) agree = sp[i].size == ps[i].size;
    for (int i = 0; agree && i < n; i++) {
      ps[i].kind = sp[i].kind, ps[i].align = sp[i].align;
      memcpy(ps[i].type, sp[i].type, sizeof ps[i].type);
    }
    free(sp);
  }
  int64_t total = 0;
  for (int i = 0; i < n; i++)
    if (ps[i].offset + ps[i].size > total) total = ps[i].offset + ps[i].size;
  k->argbuf = calloc(1, (size_t)total + 16);
  k->argv = calloc((size_t)n + 1, sizeof(void *));
  if (!k->argbuf || !k->argv) { free(ps); return mla_err("out of memory"); }
  for (int i = 0; i < n; i++) k->argv[i] = k->argbuf + ps[i].offset;
  k->params = ps, k->nparams = n, k->argbytes = total;
  return 0;
}

int mla_rtc_kernel_attributes(mla_rtc_kernel *k, int dev) {
  if (k->attr_known) return 0;
  if (mla_device_use(dev)) return -1;
  struct cudaFuncAttributes a;
  char what[200];
  snprintf(what, sizeof what, "cudaFuncGetAttributes(%s)", k->name);
  if (mla_cuda_check(cudaFuncGetAttributes(&a, (const void *)k->handle), what)) return -1;
  k->max_threads = a.maxThreadsPerBlock, k->static_smem = (int)a.sharedSizeBytes;
  k->num_regs = a.numRegs, k->local_bytes = (int)a.localSizeBytes;
  k->attr_known = 1;
  return 0;
}

/* Dynamic shared memory above the 48 KiB default needs an opt-in per device. */
static int ensure_smem(mla_rtc_kernel *k, int dev, int64_t smem) {
  if (smem <= 48 * 1024 || (dev < MLA_RTC_MAX_DEVICES && k->smem_optin[dev] >= smem)) return 0;
  mla_device_props pr;
  if (mla_device_props_get(dev, &pr)) return -1;
  if (smem + k->static_smem > pr.max_smem_optin)
    return mla_err("kernel %s: shared_mem %lld bytes + %d static exceeds cuda:%d's limit of %d bytes per block", k->name,
                   (long long)smem, k->static_smem, dev, pr.max_smem_optin);
  char what[200];
  snprintf(what, sizeof what, "kernel %s: opting into %lld bytes of dynamic shared memory", k->name, (long long)smem);
  if (mla_cuda_check(cudaKernelSetAttributeForDevice(k->handle, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem, dev),
                     what))
    return -1;
  if (dev < MLA_RTC_MAX_DEVICES) k->smem_optin[dev] = (int)smem;
  return 0;
}

static int sync_requested(void) {
  static int v = -1;
  if (v < 0) {
    const char *s = getenv("MLALAB_SYNC");
    v = s && *s && strcmp(s, "0") != 0;
  }
  return v;
}

static int clustered(dim3 cl) { return cl.x * cl.y * cl.z > 1; }

int mla_rtc_check_cluster(dim3 grid, dim3 cluster, const char *kname) {
  if (cluster.x == 0 && cluster.y == 0 && cluster.z == 0) return 0;
  const unsigned g[3] = {grid.x, grid.y, grid.z}, cl[3] = {cluster.x, cluster.y, cluster.z};
  static const char axis[3] = {'x', 'y', 'z'};
  for (int i = 0; i < 3; i++) {
    if (cl[i] < 1) return mla_err("kernel %s: cluster.%c must be a positive integer, got %u", kname, axis[i], cl[i]);
    if (g[i] % cl[i])
      return mla_err("kernel %s: cluster.%c = %u does not divide grid.%c = %u", kname, axis[i], cl[i], axis[i], g[i]);
  }
  const unsigned long long n = (unsigned long long)cl[0] * cl[1] * cl[2];
  if (n > 8) return mla_err("kernel %s: a cluster of %llu CTAs exceeds the portable size of 8", kname, n);
  return 0;
}

/* cudaLaunchKernelEx with a cluster dimension (the caller checked the shape). */
static cudaError_t launch_clustered(mla_rtc_kernel *k, const mla_rtc_launch_cfg *c) {
  cudaLaunchConfig_t lc;
  memset(&lc, 0, sizeof lc);
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = c->cluster.x, at[0].val.clusterDim.y = c->cluster.y, at[0].val.clusterDim.z = c->cluster.z;
  lc.gridDim = c->grid, lc.blockDim = c->block, lc.dynamicSmemBytes = (size_t)c->shared_mem, lc.stream = c->stream;
  lc.attrs = at, lc.numAttrs = 1;
  return cudaLaunchKernelExC(&lc, (const void *)k->handle, k->argv);
}

int mla_rtc_launch(mla_rtc_kernel *k, const mla_rtc_launch_cfg *c) {
  if (!k->handle) return mla_err("kernel %s is not loaded", k->name);
  if (mla_rtc_kernel_attributes(k, c->dev)) return -1;
  int64_t threads = (int64_t)c->block.x * c->block.y * c->block.z;
  if (threads > k->max_threads)
    return mla_err("kernel %s: block of %lld threads exceeds its limit of %d (registers: %d per thread)", k->name,
                   (long long)threads, k->max_threads, k->num_regs);
  if (c->shared_mem < 0) return mla_err("kernel %s: shared_mem must be >= 0", k->name);
  if (mla_rtc_check_cluster(c->grid, c->cluster, k->name)) return -1;
  const int cl = clustered(c->cluster);
  if (cl) { // one attribute query (cudaGetDeviceProperties would cost every launch far more)
    int major = 0;
    if (mla_cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->dev), "cudaDeviceGetAttribute"))
      return -1;
    if (major < 9) {
      mla_device_props props;
      if (mla_device_props_get(c->dev, &props)) return -1;
      return mla_err("kernel %s: thread block clusters need compute capability 9.0 or later; %s is %d.%d", k->name,
                     props.name, props.major, props.minor);
    }
  }
  if (ensure_smem(k, c->dev, c->shared_mem)) return -1;
  cudaError_t e = cl ? launch_clustered(k, c)
                     : cudaLaunchKernel((const void *)k->handle, c->grid, c->block, k->argv, (size_t)c->shared_mem, c->stream);
  if (e != cudaSuccess) {
    char what[200];
    snprintf(what, sizeof what, "launch of kernel %s", k->name);
    mla_launch_check(c->dev, k->name); /* records the name, clears the error */
    return mla_cuda_check(e, what);
  }
  if (mla_launch_check(c->dev, k->name)) return -1;
  if (sync_requested() && c->stream != mla_device_stream(c->dev)) {
    char what[200];
    snprintf(what, sizeof what, "kernel %s", k->name);
    return mla_cuda_check(cudaStreamSynchronize(c->stream), what);
  }
  return 0;
}

int mla_rtc_time_raw_launches(mla_rtc_kernel *k, const mla_rtc_launch_cfg *c, int64_t n, double *seconds) {
  if (!k->handle || k->nparams < 0) return mla_err("kernel %s: launch it once before timing raw launches", k->name);
  if (clustered(c->cluster)) return mla_err("kernel %s: raw launches are plain cudaLaunchKernel calls, without a cluster", k->name);
  if (mla_device_use(c->dev)) return -1;
  if (mla_cuda_check(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize")) return -1;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int64_t i = 0; i < n; i++) {
    cudaError_t e = cudaLaunchKernel((const void *)k->handle, c->grid, c->block, k->argv, (size_t)c->shared_mem, c->stream);
    if (e != cudaSuccess) return mla_cuda_check(e, k->name);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  *seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  return mla_cuda_check(cudaStreamSynchronize(c->stream), k->name);
}
