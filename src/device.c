#include "device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mla_error.h"

#define MAX_DEVICES 16

typedef struct cached_block {
  void *ptr;
  int64_t size;
  struct cached_block *next;
} cached_block;

typedef struct device_state {
  int touched;
  cudaStream_t stream;
  cached_block *free_list;
  mla_alloc_stats stats;
  char last_kernel[128];
} device_state;

static int probed, ndev;
static char status[256];
static device_state devs[MAX_DEVICES];
static int sync_mode = -1, poisoned;

static void probe(void) {
  if (probed) return;
  probed = 1;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess) {
    snprintf(status, sizeof status, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
    ndev = 0;
    cudaGetLastError();
  } else if (ndev == 0) {
    snprintf(status, sizeof status, "no CUDA device visible");
  }
  if (ndev > MAX_DEVICES) ndev = MAX_DEVICES;
}

int mla_device_count(void) { probe(); return ndev; }
const char *mla_device_status(void) { probe(); return status; }

void mla_cuda_versions(int *runtime, int *driver) {
  *runtime = 0, *driver = 0;
  cudaRuntimeGetVersion(runtime);
  if (cudaDriverGetVersion(driver) != cudaSuccess) *driver = 0;
}

static int check_dev(int dev) {
  probe();
  if (ndev == 0) return mla_err("no CUDA device is usable (%s)", status);
  if (dev < 0 || dev >= ndev) return mla_err("cuda:%d does not exist (%d device%s)", dev, ndev, ndev == 1 ? "" : "s");
  return 0;
}

static int is_sticky(cudaError_t e) {
  switch (e) {
  case cudaErrorIllegalAddress: case cudaErrorLaunchFailure: case cudaErrorHardwareStackError:
  case cudaErrorIllegalInstruction: case cudaErrorMisalignedAddress: case cudaErrorInvalidAddressSpace:
  case cudaErrorInvalidPc: case cudaErrorAssert: case cudaErrorLaunchTimeout:
    return 1;
  default: return 0;
  }
}

int mla_cuda_check(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 0;
  if (is_sticky(e)) poisoned = 1;
  cudaGetLastError(); /* clear non-sticky errors so the next call starts clean */
  return mla_err("%s: CUDA error %s (%s)%s", what, cudaGetErrorName(e), cudaGetErrorString(e),
                 is_sticky(e) ? "; the CUDA context is unusable now, restart the process "
                                "(mla.isolate runs work in a child process)" : "");
}

int mla_device_poisoned(void) { return poisoned; }

int mla_device_use(int dev) {
  if (check_dev(dev)) return -1;
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != dev || !devs[dev].touched) {
    if (mla_cuda_check(cudaSetDevice(dev), "cudaSetDevice")) return -1;
    devs[dev].touched = 1;
  }
  return 0;
}

cudaStream_t mla_device_stream(int dev) {
  if (mla_device_use(dev)) return NULL;
  if (!devs[dev].stream) {
    if (mla_cuda_check(cudaStreamCreateWithFlags(&devs[dev].stream, cudaStreamNonBlocking),
                       "cudaStreamCreate"))
      return NULL;
  }
  return devs[dev].stream;
}

int mla_device_sync(int dev) {
  cudaStream_t s = mla_device_stream(dev);
  if (!s) return -1;
  cudaError_t e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) {
    char what[200];
    snprintf(what, sizeof what, "synchronize cuda:%d (last kernel launched: %s)", dev,
             devs[dev].last_kernel[0] ? devs[dev].last_kernel : "none");
    return mla_cuda_check(e, what);
  }
  return 0;
}

void mla_device_sync_all(void) {
  for (int d = 0; d < ndev; d++)
    if (devs[d].touched && devs[d].stream) {
      cudaSetDevice(d);
      cudaStreamSynchronize(devs[d].stream);
      cudaGetLastError();
    }
}

int mla_device_props_get(int dev, mla_device_props *p) {
  if (check_dev(dev)) return -1;
  struct cudaDeviceProp prop;
  if (mla_cuda_check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties")) return -1;
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", prop.name);
  p->major = prop.major, p->minor = prop.minor;
  p->sm_count = prop.multiProcessorCount;
  p->total_mem = (int64_t)prop.totalGlobalMem;
  p->l2_bytes = prop.l2CacheSize;
  cudaDeviceGetAttribute(&p->mem_clock_khz, cudaDevAttrMemoryClockRate, dev);
  cudaDeviceGetAttribute(&p->bus_width_bits, cudaDevAttrGlobalMemoryBusWidth, dev);
  cudaDeviceGetAttribute(&p->sm_clock_khz, cudaDevAttrClockRate, dev);
  cudaDeviceGetAttribute(&p->max_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  p->peak_dram_gbs = 2.0 * p->mem_clock_khz * 1e3 * p->bus_width_bits / 8.0 / 1e9;
  return 0;
}

/* ---- caching allocator ---------------------------------------------- */

static int64_t round_size(int64_t n) {
  if (n <= 0) n = 1;
  if (n < (1 << 20)) return (n + 511) & ~(int64_t)511;
  return (n + (2 << 20) - 1) & ~(int64_t)((2 << 20) - 1);
}

static void release_cached(int dev) {
  cached_block *b = devs[dev].free_list;
  if (!b) return;
  cudaDeviceSynchronize();
  while (b) {
    cached_block *n = b->next;
    cudaFree(b->ptr);
    devs[dev].stats.cached -= b->size;
    free(b);
    b = n;
  }
  devs[dev].free_list = NULL;
}

static mla_reclaim_fn reclaim_fn;
static void *reclaim_ud;

void mla_device_set_reclaim(mla_reclaim_fn fn, void *ud) {
  reclaim_fn = fn;
  reclaim_ud = ud;
}

int mla_device_alloc(int dev, int64_t nbytes, void **out) {
  if (mla_device_use(dev)) return -1;
  int64_t size = round_size(nbytes);
  device_state *d = &devs[dev];
  for (cached_block **pp = &d->free_list; *pp; pp = &(*pp)->next) {
    if ((*pp)->size == size) {
      cached_block *b = *pp;
      *pp = b->next;
      *out = b->ptr;
      d->stats.cached -= size;
      d->stats.in_use += size;
      d->stats.n_hits++;
      if (d->stats.in_use > d->stats.peak) d->stats.peak = d->stats.in_use;
      free(b);
      return 0;
    }
  }
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, (size_t)size);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    release_cached(dev);
    e = cudaMalloc(&p, (size_t)size);
  }
  if (e == cudaErrorMemoryAllocation && reclaim_fn) {
    /* unreachable tensors may still hold memory the garbage collector has not
     * seen as pressure: collect them, give their blocks back, try once more */
    cudaGetLastError();
    reclaim_fn(reclaim_ud);
    release_cached(dev);
    e = cudaMalloc(&p, (size_t)size);
  }
  if (e != cudaSuccess) {
    size_t fr = 0, tot = 0;
    cudaGetLastError();
    cudaMemGetInfo(&fr, &tot);
    if (e == cudaErrorMemoryAllocation)
      return mla_err("out of device memory on cuda:%d: requested %lld bytes, %lld free of %lld "
                     "(mlalab holds %lld in use)", dev, (long long)nbytes, (long long)fr,
                     (long long)tot, (long long)d->stats.in_use);
    return mla_cuda_check(e, "cudaMalloc");
  }
  d->stats.n_malloc++;
  d->stats.in_use += size;
  if (d->stats.in_use > d->stats.peak) d->stats.peak = d->stats.in_use;
  *out = p;
  return 0;
}

void mla_device_free(int dev, void *p, int64_t nbytes) {
  if (!p || dev < 0 || dev >= MAX_DEVICES) return;
  int64_t size = round_size(nbytes);
  cached_block *b = malloc(sizeof *b);
  MLA_ASSERT(b);
  b->ptr = p, b->size = size, b->next = devs[dev].free_list;
  devs[dev].free_list = b;
  devs[dev].stats.in_use -= size;
  devs[dev].stats.cached += size;
}

void mla_device_empty_cache(int dev) {
  if (check_dev(dev) == 0 && mla_device_use(dev) == 0) release_cached(dev);
}

void mla_device_alloc_stats(int dev, mla_alloc_stats *s) {
  memset(s, 0, sizeof *s);
  if (dev >= 0 && dev < MAX_DEVICES) *s = devs[dev].stats;
}

/* ---- launches ---------------------------------------------------------- */

void mla_device_set_sync(int on) { sync_mode = on; }

const char *mla_device_last_kernel(int dev) {
  return dev >= 0 && dev < MAX_DEVICES ? devs[dev].last_kernel : "";
}

int mla_launch_check(int dev, const char *kernel) {
  snprintf(devs[dev].last_kernel, sizeof devs[dev].last_kernel, "%s", kernel);
  cudaError_t e = cudaGetLastError();
  char what[200];
  if (e != cudaSuccess) {
    snprintf(what, sizeof what, "launch of kernel %s", kernel);
    return mla_cuda_check(e, what);
  }
  if (sync_mode < 0) {
    const char *s = getenv("MLALAB_SYNC");
    sync_mode = s && *s && strcmp(s, "0") != 0;
  }
  if (sync_mode) {
    e = cudaStreamSynchronize(devs[dev].stream);
    if (e != cudaSuccess) {
      snprintf(what, sizeof what, "kernel %s", kernel);
      return mla_cuda_check(e, what);
    }
  }
  return 0;
}
