/* Kernel durations and counters from the GPU's performance monitors, through
 * CUPTI's range profiler: each kernel is its own range (auto range), timed by
 * gpu__time_duration.sum, the metric Nsight Compute reports as "Duration", and
 * optionally other single-pass counter metrics (dram__bytes_read.sum, ...).
 * The profiler serializes kernels and adds host work around each; the counters
 * see only the kernel. libcupti is the one timing_cupti.c opens (dlopen).
 *
 * One session at a time (one device):
 *   mla_pm_open(dev, metrics, n)  config for gpu__time_duration.sum + metrics
 *   mla_pm_start()                counters on: every kernel launched from now
 *   mla_pm_stop(&acc)             after a device sync: counters off, each
 *                                 kernel's values added to acc (one call)
 *   mla_pm_close()
 * Kernels launched between a stop and the next start (the harness's L2
 * flushes) are not profiled, so no kernel needs to be told apart by name. */
#ifndef MLA_TIMING_PM_H
#define MLA_TIMING_PM_H

#include <stdint.h>

#define MLA_PM_MAX_METRICS 8 /* besides the duration */

typedef struct mla_pm_acc {
  double time_s;                      /* sum of the kernels' gpu__time_duration */
  double metrics[MLA_PM_MAX_METRICS]; /* sums of the extra metrics */
  int64_t kernels;                    /* ranges (kernels) seen */
  int64_t calls;                      /* stops that saw at least one kernel */
  int64_t stops;
} mla_pm_acc;

int mla_pm_available(const char **why);
int mla_pm_open(int dev, const char *const *metrics, int n);
int mla_pm_start(void);
int mla_pm_stop(mla_pm_acc *acc);
/* Counters off, values dropped, no error reported (an error path's cleanup). */
void mla_pm_cancel(void);
void mla_pm_close(void);
/* Device of the open session, -1 when none. */
int mla_pm_device(void);

#endif
