/* Timing primitives for the bench harness (lua/mlalab/bench.lua holds the
 * policy: warm-up, stopping rule, throttle back-off, statistics).
 *
 * A GPU sample, NVBench's cold measurement:
 *   begin: [L2 flush: memset over an L2-sized buffer] -> sync -> [blocking
 *          kernel that spins until released, so the launches that follow
 *          queue behind it] -> [clock stamp] -> start event
 *   ... the caller launches the work under test on the device stream ...
 *   next:  (a cold batch: several calls in one sample) stop event -> [L2
 *          flush, as kernels] -> start event of the next call
 *   end:   stop event -> [clock stamp] -> [SM clock read by NVML while the
 *          GPU is still busy] -> release the blocker -> sync -> elapsed time
 *          (summed over the calls' event pairs)
 * NVML is opened with dlopen, so the binary has no link dependency on it. */
#ifndef MLA_TIMING_H
#define MLA_TIMING_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "timing_pm.h" /* MLA_PM_MAX_METRICS */

#ifdef __cplusplus
extern "C" {
#endif

/* Monotonic wall clock in seconds, and a sleep. */
double mla_clock_now(void);
void mla_sleep(double seconds);

typedef enum { MLA_CLOCK_NONE, MLA_CLOCK_NVML, MLA_CLOCK_STAMPS } mla_clock_source;

typedef enum { MLA_FLUSH_NONE, MLA_FLUSH_MEMSET, MLA_FLUSH_CLEAN } mla_flush_kind;

typedef struct mla_timing_opts {
  int flush;             /* mla_flush_kind: MEMSET = NVBench's memset of an L2-sized buffer;
                            CLEAN = that, then a read pass over a second one, so no dirty
                            line is left in L2 for the timed work to write back */
  int block;             /* queue the work behind the blocking kernel */
  mla_clock_source clock;
  double block_timeout;  /* seconds the blocker waits before releasing itself */
  int cupti;             /* also read the GPU's activity timeline (timing_cupti.h; opened by the caller) */
  int pm;                /* also read each kernel's duration from the performance monitors
                            (timing_pm.h; session opened by the caller); takes no blocker
                            and no clock stamps, and the calls of a batch are synchronized */
} mla_timing_opts;

#define MLA_TIMING_MAX_CALLS 64 /* calls of a cold batch */

typedef struct mla_timing_sample {
  double gpu_s;     /* start event to stop event, summed over the calls (cupti: one
                       pair around the whole batch, its flushes included) */
  double cpu_s;     /* host time from after the flush to after the final sync */
  double sm_mhz;    /* SM clock during the sample, 0 when unknown */
  int block_timed_out; /* the blocker released itself: the caller synchronized inside the sample */
  double span_s;    /* cupti: first start to last end of the GPU activity inside the sample */
  double busy_s;    /* cupti: sum of those activities' durations */
  int64_t activities; /* cupti: kernels, copies and memsets seen */
  int64_t cupti_calls; /* cupti: runs of activity between the harness's kernels */
  double pm_s;      /* pm: sum of the work's kernel durations (gpu__time_duration) */
  int64_t pm_kernels, pm_calls; /* pm: kernels profiled; calls that launched at least one */
  double pm_metrics[MLA_PM_MAX_METRICS]; /* pm: the session's extra metrics, summed */
} mla_timing_sample;

int mla_timing_begin(int dev, const mla_timing_opts *o);
/* Closes the current call of the sample and opens the next (a cold batch). */
int mla_timing_next(int dev);
int mla_timing_end(int dev, mla_timing_sample *out);
/* After an error between begin and end: release the blocker, drain the stream. */
void mla_timing_abort(int dev);

typedef struct mla_timing_info {
  int64_t l2_bytes;
  double default_sm_mhz; /* cudaDevAttrClockRate, what NVBench calls the default clock */
  int nvml_ok;
  char nvml_status[160];
} mla_timing_info;
int mla_timing_info_get(int dev, mla_timing_info *info);
/* Current SM clock through NVML (MHz); negative status when NVML is unusable. */
int mla_nvml_sm_clock(int dev, double *mhz);

/* CUDA graphs: capture the work launched on the device stream, replay it. */
int mla_graph_begin(int dev);
int mla_graph_end(int dev, cudaGraphExec_t *out, int64_t *nodes);
void mla_graph_abort(int dev);
int mla_graph_launch(int dev, cudaGraphExec_t g);
void mla_graph_destroy(cudaGraphExec_t g);

/* Reference rates measured on this device in one short burst (3 warm-up
 * runs, then the median of `reps` event-timed runs): cudaMemcpy device to
 * device of `bytes` (GB/s counting bytes read + written), and a cuBLAS bf16
 * GEMM n x n x n with fp32 accumulation (TFLOPS). */
int mla_memcpy_bandwidth(int dev, int64_t bytes, int reps, double *gbs);
int mla_gemm_rate(int dev, int n, int reps, double *tflops);

/* The same operations kept alive, so a timing harness can launch one sample
 * after another on the device stream (size: bytes for memcpy, n for GEMM). */
typedef enum { MLA_REF_MEMCPY, MLA_REF_GEMM } mla_ref_kind;
typedef struct mla_ref_op mla_ref_op;
int mla_ref_op_new(int dev, mla_ref_kind kind, int64_t size, mla_ref_op **out);
int mla_ref_op_launch(mla_ref_op *op);
void mla_ref_op_free(mla_ref_op *op);

#ifdef __cplusplus
}
#endif
#endif
