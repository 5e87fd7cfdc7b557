/* CUDA devices for the C core: probing, a caching allocator, one stream per
 * device, and error reporting that names the operation or kernel.
 * Without a driver or a visible GPU every entry point fails cleanly and the
 * rest of mlalab runs on the CPU. */
#ifndef MLA_DEVICE_H
#define MLA_DEVICE_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mla_device_props {
  char name[256];
  int major, minor;
  int sm_count;
  int64_t total_mem;
  int64_t l2_bytes;
  int mem_clock_khz;
  int bus_width_bits;
  int sm_clock_khz;
  int max_smem_optin;
  double peak_dram_gbs; /* 2 x memory clock x bus width / 8, in 1e9 B/s */
} mla_device_props;

/* Number of usable CUDA devices (probed once); 0 when there is none. */
int mla_device_count(void);
/* Why there is no device ("cudaErrorInsufficientDriver: ..."), or "" */
const char *mla_device_status(void);
int mla_device_props_get(int dev, mla_device_props *p);
/* Versions: runtime and driver as CUDA encodes them (13000 = 13.0); driver 0 if none. */
void mla_cuda_versions(int *runtime, int *driver);

/* Makes dev current for this thread (cheap when it already is). */
int mla_device_use(int dev);
cudaStream_t mla_device_stream(int dev);
int mla_device_sync(int dev);
/* Synchronizes every device touched so far; used after an interrupt. */
void mla_device_sync_all(void);

/* Caching allocator: freeing returns memory to a per-device cache and never
 * synchronizes, so it is safe inside timed regions. */
int mla_device_alloc(int dev, int64_t nbytes, void **out);
/* Called once when an allocation fails even after the cache was emptied
 * (the Lua binding runs a full garbage collection: dead tensors free their
 * blocks), before the last retry. */
typedef void (*mla_reclaim_fn)(void *ud);
void mla_device_set_reclaim(mla_reclaim_fn fn, void *ud);
void mla_device_free(int dev, void *p, int64_t nbytes);
void mla_device_empty_cache(int dev);
typedef struct mla_alloc_stats { int64_t in_use, cached, peak, n_malloc, n_hits; } mla_alloc_stats;
void mla_device_alloc_stats(int dev, mla_alloc_stats *s);

/* Turns a CUDA status into an mla_err naming what failed; 0 on success. */
int mla_cuda_check(cudaError_t e, const char *what);
/* After a kernel launch: records the name, checks the launch, and in
 * synchronous mode (MLALAB_SYNC=1 or mla_device_set_sync) waits for the
 * kernel so a fault is attributed to it. */
int mla_launch_check(int dev, const char *kernel);
void mla_device_set_sync(int on);
/* Name of the last kernel launched on dev (for fault reports). */
const char *mla_device_last_kernel(int dev);
/* True once a sticky error (illegal address, trap...) has hit the context. */
int mla_device_poisoned(void);

#ifdef __cplusplus
}
#endif
#endif
