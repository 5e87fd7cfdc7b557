/* Timing primitives: cold samples (flush, blocker, events), SM clocks
 * (NVML by dlopen, or clock stamps), CUDA graphs. Reference rates (memcpy,
 * GEMM) are in timing_ref.c. */
#define _POSIX_C_SOURCE 200809L
#include "timing.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "device.h"
#include "kernels/timing_kernels.h"
#include "mla_error.h"
#include "timing_cupti.h"

#define MAX_DEV 16

double mla_clock_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void mla_sleep(double seconds) {
  if (seconds <= 0) return;
  struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {}
}

/* ---- NVML, opened at run time ------------------------------------------ */

typedef void *nvml_device;
static struct {
  int tried, ok;
  char status[160];
  int (*init)(void);
  int (*by_pci)(const char *, nvml_device *);
  int (*clock_info)(nvml_device, int, unsigned *);
  const char *(*errstr)(int);
  nvml_device handle[MAX_DEV];
  int have_handle[MAX_DEV];
} nvml;

enum { NVML_CLOCK_SM = 1 };

static int nvml_open(void) {
  if (nvml.tried) return nvml.ok;
  nvml.tried = 1;
  void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(nvml.status, sizeof nvml.status, "libnvidia-ml.so.1 not found");
    return 0;
  }
  /* POSIX: dlsym results convert to function pointers through this cast */
  *(void **)&nvml.init = dlsym(lib, "nvmlInit_v2");
  *(void **)&nvml.by_pci = dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
  *(void **)&nvml.clock_info = dlsym(lib, "nvmlDeviceGetClockInfo");
  *(void **)&nvml.errstr = dlsym(lib, "nvmlErrorString");
  if (!nvml.init || !nvml.by_pci || !nvml.clock_info) {
    snprintf(nvml.status, sizeof nvml.status, "libnvidia-ml.so.1 lacks the clock entry points");
    return 0;
  }
  int rc = nvml.init();
  if (rc != 0) {
    snprintf(nvml.status, sizeof nvml.status, "nvmlInit failed: %s", nvml.errstr ? nvml.errstr(rc) : "?");
    return 0;
  }
  snprintf(nvml.status, sizeof nvml.status, "ok");
  nvml.ok = 1;
  return 1;
}

int mla_nvml_sm_clock(int dev, double *mhz) {
  if (dev < 0 || dev >= MAX_DEV) return mla_err("nvml: bad device %d", dev);
  if (!nvml_open()) return mla_err("nvml: %s", nvml.status);
  if (!nvml.have_handle[dev]) {
    char pci[64];
    if (mla_cuda_check(cudaDeviceGetPCIBusId(pci, sizeof pci, dev), "cudaDeviceGetPCIBusId")) return -1;
    int rc = nvml.by_pci(pci, &nvml.handle[dev]);
    if (rc != 0) return mla_err("nvml: no handle for %s: %s", pci, nvml.errstr ? nvml.errstr(rc) : "?");
    nvml.have_handle[dev] = 1;
  }
  unsigned v = 0;
  int rc = nvml.clock_info(nvml.handle[dev], NVML_CLOCK_SM, &v);
  if (rc != 0) return mla_err("nvml: clock read failed: %s", nvml.errstr ? nvml.errstr(rc) : "?");
  *mhz = (double)v;
  return 0;
}

/* ---- per-device sampling state ------------------------------------------ */

typedef struct timing_dev {
  int ready;
  void *l2buf, *l2buf2; /* memset target; read target of the clean flush */
  uint32_t *sink;
  int64_t l2_bytes;
  int sm_count, clock_khz;
  volatile int32_t *flag_h, *tout_h; /* mapped host memory */
  int32_t *flag_d, *tout_d;
  uint64_t *stamps_h, *stamps_d; /* [global0, clock0, global1, clock1] */
  cudaEvent_t ev0[MLA_TIMING_MAX_CALLS], ev1[MLA_TIMING_MAX_CALLS]; /* one pair per call of a cold batch */
  int ncalls;                                                        /* pairs opened in this sample */
  int active;
  double nvml_mhz, nvml_at; /* last NVML reading and when */
  mla_timing_opts opts;
  double cpu0;
  mla_pm_acc pm; /* the pm timer's sums over the calls of the sample */
} timing_dev;

static timing_dev tdev[MAX_DEV];

static int mapped(int64_t bytes, void **h, void **d) {
  if (mla_cuda_check(cudaHostAlloc(h, (size_t)bytes, cudaHostAllocMapped), "cudaHostAlloc (timing)")) return -1;
  memset(*h, 0, (size_t)bytes);
  return mla_cuda_check(cudaHostGetDevicePointer(d, *h, 0), "cudaHostGetDevicePointer (timing)");
}

static timing_dev *state(int dev) {
  if (dev < 0 || dev >= MAX_DEV) {
    mla_err("timing needs a CUDA device (got %d)", dev);
    return NULL;
  }
  if (mla_device_use(dev)) return NULL;
  timing_dev *t = &tdev[dev];
  if (t->ready) return t;
  int l2 = 0;
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev);
  cudaDeviceGetAttribute(&t->sm_count, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceGetAttribute(&t->clock_khz, cudaDevAttrClockRate, dev);
  t->l2_bytes = l2;
  void *h, *d;
  if (l2 > 0 && (mla_cuda_check(cudaMalloc(&t->l2buf, (size_t)l2), "cudaMalloc (L2 flush buffer)") ||
                 mla_cuda_check(cudaMalloc(&t->l2buf2, (size_t)l2), "cudaMalloc (L2 flush buffer)") ||
                 mla_cuda_check(cudaMemset(t->l2buf2, 0, (size_t)l2), "cudaMemset (L2 flush buffer)") ||
                 mla_cuda_check(cudaMalloc((void **)&t->sink, 16), "cudaMalloc (L2 flush sink)")))
    return NULL;
  if (mapped(64, &h, &d)) return NULL;
  t->flag_h = (volatile int32_t *)h, t->tout_h = (volatile int32_t *)h + 1;
  t->flag_d = (int32_t *)d, t->tout_d = (int32_t *)d + 1;
  if (mapped(64, &h, &d)) return NULL;
  t->stamps_h = h, t->stamps_d = d;
  for (int i = 0; i < MLA_TIMING_MAX_CALLS; i++)
    if (mla_cuda_check(cudaEventCreate(&t->ev0[i]), "cudaEventCreate") ||
        mla_cuda_check(cudaEventCreate(&t->ev1[i]), "cudaEventCreate"))
      return NULL;
  t->ready = 1;
  return t;
}

int mla_timing_info_get(int dev, mla_timing_info *info) {
  timing_dev *t = state(dev);
  if (!t) return -1;
  memset(info, 0, sizeof *info);
  info->l2_bytes = t->l2_bytes;
  info->default_sm_mhz = t->clock_khz / 1000.0;
  info->nvml_ok = nvml_open();
  snprintf(info->nvml_status, sizeof info->nvml_status, "%s", nvml.status);
  return 0;
}

/* The harness kernels run while the stream is held by the blocker, so their
 * launches are checked without mla_launch_check: in synchronous mode
 * (MLALAB_SYNC=1) it would wait on the held stream until the blocker's
 * timeout. Faults still surface at the sample's final synchronize. */
static int launched(int dev, cudaError_t e, const char *name) {
  (void)dev;
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess) {
    char what[96];
    snprintf(what, sizeof what, "launch of kernel %s", name);
    return mla_cuda_check(e, what);
  }
  return 0;
}

/* The L2 flush of a sample: a write pass over one L2-sized buffer (NVBench's
 * memset, or, between the calls of a cold batch, a kernel the activity
 * timeline can tell from the work), then for the clean flush a read pass over
 * a second one. */
static int enqueue_flush(int dev, timing_dev *t, int flush, int as_kernel, cudaStream_t s) {
  const int64_t bytes = t->l2_bytes & ~(int64_t)15;
  if (flush != MLA_FLUSH_NONE && t->l2buf) {
    if (as_kernel ? launched(dev, mla_cuda_l2_fill(t->l2buf, bytes, t->sm_count, s), "l2_fill")
                  : mla_cuda_check(cudaMemsetAsync(t->l2buf, 0, (size_t)t->l2_bytes, s), "L2 flush"))
      return -1;
  }
  if (flush == MLA_FLUSH_CLEAN && t->l2buf2 &&
      launched(dev, mla_cuda_l2_read(t->l2buf2, bytes, t->sink, t->sm_count, s), "l2_read"))
    return -1;
  return 0;
}

int mla_timing_begin(int dev, const mla_timing_opts *o) {
  timing_dev *t = state(dev);
  if (!t) return -1;
  if (t->active) return mla_err("timing: a sample is already open on cuda:%d", dev);
  if (o->pm && (o->block || o->clock == MLA_CLOCK_STAMPS || o->cupti))
    return mla_err("timer 'pm': the profiler serializes kernels, so it takes no blocking kernel, no clock stamps "
                   "and no CUPTI timeline");
  if (o->pm && mla_pm_device() != dev) return mla_err("timer 'pm': no profiler session is open on cuda:%d", dev);
  cudaStream_t s = mla_device_stream(dev);
  if (!s) return -1;
  if (enqueue_flush(dev, t, o->flush, 0, s) || mla_device_sync(dev)) return -1;
  if (o->cupti && mla_cupti_mark(dev)) return -1;
  memset(&t->pm, 0, sizeof t->pm);
  if (o->pm && mla_pm_start()) return -1;
  t->opts = *o;
  t->cpu0 = mla_clock_now();
  /* under cupti the start event goes before the blocker, so only harness
   * kernels precede the first call too (the event pair then spans the sample) */
  if (o->cupti && mla_cuda_check(cudaEventRecord(t->ev0[0], s), "cudaEventRecord")) return -1;
  if (o->block) {
    *t->flag_h = 0, *t->tout_h = 0;
    if (launched(dev, mla_cuda_block_stream(t->flag_d, t->tout_d, o->block_timeout, s), "block_stream")) return -1;
  }
  t->active = 1; /* from here an error must release the blocker: mla_timing_abort */
  if (o->clock == MLA_CLOCK_STAMPS &&
      launched(dev, mla_cuda_clock_stamp(t->stamps_d, t->sm_count, s), "clock_stamp")) {
    mla_timing_abort(dev);
    return -1;
  }
  t->ncalls = 1;
  if (!o->cupti && mla_cuda_check(cudaEventRecord(t->ev0[0], s), "cudaEventRecord")) {
    mla_timing_abort(dev);
    return -1;
  }
  return 0;
}

int mla_timing_next(int dev) {
  timing_dev *t = state(dev);
  if (!t) return -1;
  if (!t->active) return mla_err("timing: no sample is open on cuda:%d", dev);
  if (t->ncalls >= MLA_TIMING_MAX_CALLS) {
    mla_timing_abort(dev);
    return mla_err("timing: a cold batch holds at most %d calls", MLA_TIMING_MAX_CALLS);
  }
  cudaStream_t s = mla_device_stream(dev);
  /* under cupti the calls are told apart by the flush kernels: no event
   * records between them, so nothing but the flush precedes a call; under pm
   * the counters stop for the flush */
  const int pairs = !t->opts.cupti && !t->opts.pm;
  int rc = pairs ? mla_cuda_check(cudaEventRecord(t->ev1[t->ncalls - 1], s), "cudaEventRecord") : 0;
  if (rc == 0 && t->opts.pm) rc = mla_device_sync(dev) || mla_pm_stop(&t->pm);
  if (rc == 0) rc = enqueue_flush(dev, t, t->opts.flush, 1, s);
  if (rc == 0 && t->opts.pm) rc = mla_device_sync(dev) || mla_pm_start();
  if (rc == 0 && pairs) rc = mla_cuda_check(cudaEventRecord(t->ev0[t->ncalls], s), "cudaEventRecord");
  if (rc) {
    mla_timing_abort(dev);
    return -1;
  }
  t->ncalls++;
  return 0;
}

int mla_timing_end(int dev, mla_timing_sample *out) {
  timing_dev *t = state(dev);
  if (!t) return -1;
  if (!t->active) return mla_err("timing: no sample is open on cuda:%d", dev);
  cudaStream_t s = mla_device_stream(dev);
  memset(out, 0, sizeof *out);
  int rc = mla_cuda_check(cudaEventRecord(t->ev1[t->ncalls - 1], s), "cudaEventRecord");
  if (rc == 0 && t->opts.clock == MLA_CLOCK_STAMPS)
    rc = launched(dev, mla_cuda_clock_stamp(t->stamps_d + 2, t->sm_count, s), "clock_stamp");
  /* read while the blocker still holds the queue: the GPU is busy, not idling down */
  double mhz = 0;
  if (rc == 0 && t->opts.clock == MLA_CLOCK_NVML) {
    /* an NVML read is a driver call (tens of us to ~1 ms): at most one per
     * 10 ms, throttling lasts far longer than that */
    double now = mla_clock_now();
    if (now - t->nvml_at > 0.01 || t->nvml_mhz <= 0) {
      if (mla_nvml_sm_clock(dev, &t->nvml_mhz)) t->nvml_mhz = 0;
      t->nvml_at = now;
    }
    mhz = t->nvml_mhz;
  }
  if (t->opts.block) *t->flag_h = 1;
  t->active = 0;
  if (rc) {
    mla_device_sync_all();
    if (t->opts.pm) mla_pm_cancel();
    return rc;
  }
  if (mla_device_sync(dev)) {
    if (t->opts.pm) mla_pm_cancel();
    return -1;
  }
  out->cpu_s = mla_clock_now() - t->cpu0;
  if (t->opts.pm) {
    if (mla_pm_stop(&t->pm)) return -1;
    out->pm_s = t->pm.time_s, out->pm_kernels = t->pm.kernels, out->pm_calls = t->pm.calls;
    memcpy(out->pm_metrics, t->pm.metrics, sizeof out->pm_metrics);
  }
  /* a pair per call; under cupti and pm one pair around the whole batch, flushes included */
  const int whole = t->opts.cupti || t->opts.pm;
  const int pairs = whole ? 1 : t->ncalls;
  for (int i = 0; i < pairs; i++) {
    float ms = 0;
    const int stop = whole ? t->ncalls - 1 : i;
    if (mla_cuda_check(cudaEventElapsedTime(&ms, t->ev0[i], t->ev1[stop]), "cudaEventElapsedTime")) return -1;
    out->gpu_s += ms * 1e-3;
  }
  out->block_timed_out = t->opts.block && *t->tout_h;
  if (t->opts.cupti) {
    mla_cupti_span sp;
    if (mla_cupti_collect(dev, &sp)) return -1;
    if (sp.dropped) return mla_err("timer 'cupti': CUPTI dropped %lld activity records", (long long)sp.dropped);
    out->span_s = sp.span_s, out->busy_s = sp.busy_s, out->activities = sp.count, out->cupti_calls = sp.calls;
  }
  if (t->opts.clock == MLA_CLOCK_STAMPS) {
    uint64_t dg = t->stamps_h[2] - t->stamps_h[0], dc = t->stamps_h[3] - t->stamps_h[1];
    mhz = dg > 0 ? (double)dc / (double)dg * 1e3 : 0; /* cycles per ns * 1000 = MHz */
  }
  out->sm_mhz = mhz;
  return 0;
}

void mla_timing_abort(int dev) {
  if (dev < 0 || dev >= MAX_DEV || !tdev[dev].ready) return;
  timing_dev *t = &tdev[dev];
  if (t->opts.block) *t->flag_h = 1;
  t->active = 0;
  cudaStream_t s = mla_device_stream(dev);
  if (s) cudaStreamSynchronize(s);
  cudaGetLastError();
  if (t->opts.pm) mla_pm_cancel();
}

/* ---- CUDA graphs ------------------------------------------------------------ */

int mla_graph_begin(int dev) {
  cudaStream_t s = mla_device_stream(dev);
  if (!s) return -1;
  if (mla_device_sync(dev)) return -1;
  /* relaxed: allocator calls made by the captured code are not refused */
  return mla_cuda_check(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
}

int mla_graph_end(int dev, cudaGraphExec_t *out, int64_t *nodes) {
  cudaStream_t s = mla_device_stream(dev);
  if (!s) return -1;
  cudaGraph_t g = NULL;
  cudaError_t e = cudaStreamEndCapture(s, &g);
  if (e != cudaSuccess)
    return mla_cuda_check(e, "graph capture (the captured code synchronized, copied to the host, or used another stream)");
  size_t n = 0;
  cudaGraphGetNodes(g, NULL, &n);
  *nodes = (int64_t)n;
  e = cudaGraphInstantiate(out, g, 0);
  cudaGraphDestroy(g);
  return mla_cuda_check(e, "cudaGraphInstantiate");
}

void mla_graph_abort(int dev) {
  cudaStream_t s = mla_device_stream(dev);
  if (!s) return;
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone) {
    cudaGraph_t g = NULL;
    cudaStreamEndCapture(s, &g);
    if (g) cudaGraphDestroy(g);
  }
  cudaGetLastError();
}

int mla_graph_launch(int dev, cudaGraphExec_t g) {
  cudaStream_t s = mla_device_stream(dev);
  if (!s) return -1;
  return mla_cuda_check(cudaGraphLaunch(g, s), "cudaGraphLaunch");
}

void mla_graph_destroy(cudaGraphExec_t g) {
  if (g) cudaGraphExecDestroy(g);
}
