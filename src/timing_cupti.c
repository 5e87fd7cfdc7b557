/* CUPTI activity timeline for the bench harness (see timing_cupti.h). */
#define _POSIX_C_SOURCE 200809L
#include "timing_cupti.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cupti.h>

#include "mla_error.h"

static struct {
  int tried, loaded, enabled;
  char why[256];
  CUptiResult (*enable)(CUpti_ActivityKind);
  CUptiResult (*disable)(CUpti_ActivityKind);
  CUptiResult (*register_cb)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
  CUptiResult (*flush_all)(uint32_t);
  CUptiResult (*next_record)(uint8_t *, size_t, CUpti_Activity **);
  CUptiResult (*dropped)(CUcontext, uint32_t, size_t *);
  CUptiResult (*result_string)(CUptiResult, const char **);
} cu;

/* What the completion callback keeps between a mark and a collect: every
 * activity of the device, the harness's own kernels flagged (they separate
 * the calls of a cold batch). CUPTI may call it from its own thread, hence
 * the mutex. */
typedef struct span_rec {
  uint64_t start, end; /* ns */
  int harness;
} span_rec;
static struct {
  pthread_mutex_t lock;
  int dev; /* device whose records count; -1: none */
  span_rec *recs;
  int64_t n, cap, dropped, lost; /* lost: records the list had no room for */
} acc = {PTHREAD_MUTEX_INITIALIZER, -1, NULL, 0, 0, 0, 0};

static const CUpti_ActivityKind KINDS[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                           CUPTI_ACTIVITY_KIND_MEMSET};
#define NKINDS (sizeof KINDS / sizeof KINDS[0])
#define BUFFER_BYTES (1 << 20)

static const char *cupti_str(CUptiResult r) {
  const char *s = NULL;
  if (cu.result_string && cu.result_string(r, &s) == CUPTI_SUCCESS && s) return s;
  return "unknown CUPTI error";
}

static int cupti_check(CUptiResult r, const char *what) {
  if (r == CUPTI_SUCCESS) return 0;
  return mla_err("CUPTI %s failed: %s (%d)%s", what, cupti_str(r), (int)r,
                 r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED || r == CUPTI_ERROR_NOT_INITIALIZED
                     ? "; another profiler (ncu, nsys) may own CUPTI in this process"
                     : "");
}

static void *open_lib(void) {
  const char *names[] = {"libcupti.so", "libcupti.so.13", "libcupti.so.12", NULL};
  for (int i = 0; names[i]; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h) return h;
  }
  /* next to the toolkit, where the runtime libraries of a CUDA install live */
  const char *roots[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda", NULL};
  const char *subs[] = {"lib64/libcupti.so", "extras/CUPTI/lib64/libcupti.so", "targets/x86_64-linux/lib/libcupti.so",
                        NULL};
  char path[1024];
  for (int i = 0; i < 3; i++) {
    if (!roots[i] || !*roots[i]) continue;
    for (int j = 0; subs[j]; j++) {
      snprintf(path, sizeof path, "%s/%s", roots[i], subs[j]);
      void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (h) return h;
    }
  }
  return NULL;
}

#define NO_LIB "libcupti.so not found (CUDA toolkit lib64 or extras/CUPTI; set CUDA_HOME)"

void *mla_cupti_lib(const char **why) {
  static int tried;
  static void *lib;
  if (!tried) tried = 1, lib = open_lib();
  if (why) *why = lib ? "" : NO_LIB;
  return lib;
}

static int load(void) {
  if (cu.tried) return cu.loaded;
  cu.tried = 1;
  void *h = mla_cupti_lib(NULL);
  if (!h) {
    snprintf(cu.why, sizeof cu.why, NO_LIB);
    return 0;
  }
  *(void **)&cu.enable = dlsym(h, "cuptiActivityEnable");
  *(void **)&cu.disable = dlsym(h, "cuptiActivityDisable");
  *(void **)&cu.register_cb = dlsym(h, "cuptiActivityRegisterCallbacks");
  *(void **)&cu.flush_all = dlsym(h, "cuptiActivityFlushAll");
  *(void **)&cu.next_record = dlsym(h, "cuptiActivityGetNextRecord");
  *(void **)&cu.dropped = dlsym(h, "cuptiActivityGetNumDroppedRecords");
  *(void **)&cu.result_string = dlsym(h, "cuptiGetResultString");
  if (!cu.enable || !cu.disable || !cu.register_cb || !cu.flush_all || !cu.next_record) {
    snprintf(cu.why, sizeof cu.why, "libcupti lacks the activity API entry points");
    return 0;
  }
  cu.loaded = 1;
  return 1;
}

int mla_cupti_available(const char **why) {
  int ok = load();
  if (why) *why = ok ? "" : cu.why;
  return ok;
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  /* CUPTI wants 8-byte aligned buffers */
  void *p = NULL;
  if (posix_memalign(&p, 8, BUFFER_BYTES) != 0) p = NULL;
  *buffer = p;
  *size = p ? BUFFER_BYTES : 0;
  *max_records = 0;
}

/* The bench's own kernels run inside the sample window but are not the work. */
static int harness_kernel(const char *name) {
  return name && (strstr(name, "block_stream_kernel") || strstr(name, "clock_stamp_kernel") ||
                  strstr(name, "l2_read_kernel") || strstr(name, "l2_fill_kernel"));
}

static void take(uint32_t device, uint64_t start, uint64_t end, int harness) {
  if ((int)device != acc.dev || end < start) return;
  if (acc.n == acc.cap) {
    int64_t cap = acc.cap ? 2 * acc.cap : 256;
    span_rec *r = realloc(acc.recs, (size_t)cap * sizeof *r);
    if (!r) {
      acc.lost++;
      return;
    }
    acc.recs = r, acc.cap = cap;
  }
  acc.recs[acc.n++] = (span_rec){start, end, harness};
}

static int by_start(const void *a, const void *b) {
  const span_rec *x = a, *y = b;
  return x->start < y->start ? -1 : x->start > y->start;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
  (void)size;
  pthread_mutex_lock(&acc.lock);
  CUpti_Activity *rec = NULL;
  while (buffer && cu.next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
      take(k->deviceId, k->start, k->end, harness_kernel(k->name));
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)rec;
      take(m->deviceId, m->start, m->end, 0);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)rec;
      take(m->deviceId, m->start, m->end, 0);
      break;
    }
    default: break;
    }
  }
  size_t lost = 0;
  if (cu.dropped && cu.dropped(ctx, stream, &lost) == CUPTI_SUCCESS) acc.dropped += (int64_t)lost;
  pthread_mutex_unlock(&acc.lock);
  free(buffer);
}

int mla_cupti_open(void) {
  if (!load()) return mla_err("timer 'cupti': %s", cu.why);
  if (cu.enabled) return 0;
  static int registered;
  if (!registered) {
    if (cupti_check(cu.register_cb(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks")) return -1;
    registered = 1;
  }
  for (size_t i = 0; i < NKINDS; i++)
    if (cupti_check(cu.enable(KINDS[i]), "cuptiActivityEnable")) {
      for (size_t j = 0; j < i; j++) cu.disable(KINDS[j]);
      return -1;
    }
  cu.enabled = 1;
  return 0;
}

static void reset(int dev) {
  acc.dev = dev;
  acc.n = 0, acc.dropped = 0, acc.lost = 0;
}

int mla_cupti_mark(int dev) {
  if (!cu.enabled) return mla_err("timer 'cupti': tracing is not enabled");
  pthread_mutex_lock(&acc.lock);
  acc.dev = -1; /* what is flushed now predates the window */
  pthread_mutex_unlock(&acc.lock);
  if (cupti_check(cu.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll")) return -1;
  pthread_mutex_lock(&acc.lock);
  reset(dev);
  pthread_mutex_unlock(&acc.lock);
  return 0;
}

int mla_cupti_collect(int dev, mla_cupti_span *out) {
  memset(out, 0, sizeof *out);
  if (!cu.enabled) return mla_err("timer 'cupti': tracing is not enabled");
  if (cupti_check(cu.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll")) return -1;
  pthread_mutex_lock(&acc.lock);
  if (acc.dev == dev) {
    /* in time order, each run of the work's activities between two harness
     * kernels is one call's span (one run unless the sample is a cold batch) */
    if (acc.n > 1) qsort(acc.recs, (size_t)acc.n, sizeof *acc.recs, by_start);
    uint64_t first = 0, last = 0;
    int open = 0;
    for (int64_t i = 0; i <= acc.n; i++) {
      const span_rec *r = i < acc.n ? &acc.recs[i] : NULL;
      if (!r || r->harness) {
        if (open) out->span_s += (double)(last - first) * 1e-9, out->calls++;
        open = 0;
        continue;
      }
      if (!open) first = r->start, last = r->end, open = 1;
      else if (r->end > last) last = r->end;
      out->busy_s += (double)(r->end - r->start) * 1e-9;
      out->count++;
    }
  }
  out->dropped = acc.dropped + acc.lost;
  reset(-1);
  pthread_mutex_unlock(&acc.lock);
  return 0;
}

void mla_cupti_close(void) {
  if (!cu.enabled) return;
  for (size_t i = 0; i < NKINDS; i++) cu.disable(KINDS[i]);
  pthread_mutex_lock(&acc.lock);
  acc.dev = -1;
  pthread_mutex_unlock(&acc.lock);
  cu.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  pthread_mutex_lock(&acc.lock);
  free(acc.recs);
  acc.recs = NULL, acc.n = 0, acc.cap = 0;
  pthread_mutex_unlock(&acc.lock);
  cu.enabled = 0;
}
