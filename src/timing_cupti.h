/* The GPU's own activity timeline through CUPTI (what Nsight Systems, the
 * PyTorch profiler and FlashMLA's benchmarks read): each kernel, memcpy and
 * memset with the start and end timestamps the GPU recorded, so a sample's
 * time excludes the front-end work an event pair brackets (~1.5 us on H100:
 * bench/RESULTS.md). libcupti is opened with dlopen on first use (the
 * toolkit's lib64 or extras/CUPTI), so the binary has no link dependency on it;
 * tracing is enabled only while a bench asks for it.
 *
 *   mla_cupti_open()         load libcupti and enable activity tracing
 *   mla_cupti_mark(dev)      after a device sync: drop every record so far
 *   mla_cupti_collect(dev)   after a device sync: span of the GPU activity of
 *                            device dev since the mark, the harness's own
 *                            kernels (blocker, clock stamps, L2 flush) excluded;
 *                            in a cold batch (flushes between the calls) the
 *                            sum of each call's span
 *   mla_cupti_close()        disable tracing (records are flushed and dropped) */
#ifndef MLA_TIMING_CUPTI_H
#define MLA_TIMING_CUPTI_H

#include <stdint.h>

typedef struct mla_cupti_span {
  double span_s;  /* first start to last end, summed over the calls */
  double busy_s;  /* sum of the activities' durations */
  int64_t count;  /* activities seen */
  int64_t calls;  /* runs of activities between harness kernels */
  int64_t dropped; /* records CUPTI had to drop (buffer overflow) */
} mla_cupti_span;

int mla_cupti_open(void);
int mla_cupti_mark(int dev);
int mla_cupti_collect(int dev, mla_cupti_span *out);
void mla_cupti_close(void);
/* Whether libcupti can be loaded, with the reason when it cannot. */
int mla_cupti_available(const char **why);
/* The dlopen handle of libcupti (also the range profiler's, timing_pm.c),
 * NULL with the reason when it cannot be loaded. */
void *mla_cupti_lib(const char **why);

#endif
