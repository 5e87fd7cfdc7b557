/* Kernel durations from the performance monitors (see timing_pm.h). */
#define _POSIX_C_SOURCE 200809L
#include "timing_pm.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti_profiler_host.h> /* C-clean but for one include: see src/cupti_c/string */
#include <cupti_profiler_target.h>
#include <cupti_range_profiler.h>
#include <cupti_target.h>

#include "device.h"
#include "mla_error.h"
#include "timing_cupti.h"

#define DURATION "gpu__time_duration.sum"
#define MAX_RANGES 512 /* kernels between a start and a stop */

#define FN(name, P) CUptiResult (*name)(P *)
static struct {
  int tried, loaded;
  char why[256];
  CUptiResult (*result_string)(CUptiResult, const char **);
  FN(init, CUpti_Profiler_Initialize_Params);
  FN(supported, CUpti_Profiler_DeviceSupported_Params);
  FN(chip_name, CUpti_Device_GetChipName_Params);
  FN(availability, CUpti_Profiler_GetCounterAvailability_Params);
  FN(host_init, CUpti_Profiler_Host_Initialize_Params);
  FN(host_deinit, CUpti_Profiler_Host_Deinitialize_Params);
  FN(metric_props, CUpti_Profiler_Host_GetMetricProperties_Params);
  FN(add_metrics, CUpti_Profiler_Host_ConfigAddMetrics_Params);
  FN(config_size, CUpti_Profiler_Host_GetConfigImageSize_Params);
  FN(config_image, CUpti_Profiler_Host_GetConfigImage_Params);
  FN(num_passes, CUpti_Profiler_Host_GetNumOfPasses_Params);
  FN(evaluate, CUpti_Profiler_Host_EvaluateToGpuValues_Params);
  FN(enable, CUpti_RangeProfiler_Enable_Params);
  FN(disable, CUpti_RangeProfiler_Disable_Params);
  FN(set_config, CUpti_RangeProfiler_SetConfig_Params);
  FN(start, CUpti_RangeProfiler_Start_Params);
  FN(stop, CUpti_RangeProfiler_Stop_Params);
  FN(decode, CUpti_RangeProfiler_DecodeData_Params);
  FN(data_size, CUpti_RangeProfiler_GetCounterDataSize_Params);
  FN(data_init, CUpti_RangeProfiler_CounterDataImage_Initialize_Params);
  FN(data_info, CUpti_RangeProfiler_GetCounterDataInfo_Params);
} api;
#undef FN

/* The open session. */
static struct {
  int open, dev, started, nmetrics; /* nmetrics counts the duration too */
  char names[MLA_PM_MAX_METRICS + 1][128];
  const char *metric[MLA_PM_MAX_METRICS + 1];
  CUpti_Profiler_Host_Object *host;
  CUpti_RangeProfiler_Object *obj;
  uint8_t *avail, *config, *data;
  size_t config_bytes, data_bytes;
} pm = {.dev = -1};

static const char *cupti_str(CUptiResult r) {
  const char *s = NULL;
  if (api.result_string && api.result_string(r, &s) == CUPTI_SUCCESS && s) return s;
  return "unknown CUPTI error";
}

static int check(CUptiResult r, const char *what) {
  if (r == CUPTI_SUCCESS) return 0;
  return mla_err("timer 'pm': %s failed: %s (%d)%s", what, cupti_str(r), (int)r,
                 r == CUPTI_ERROR_INSUFFICIENT_PRIVILEGES
                     ? "; the driver restricts GPU performance counters to administrators "
                       "(NVreg_RestrictProfilingToAdminUsers)"
                 : r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED || r == CUPTI_ERROR_NOT_INITIALIZED
                     ? "; another profiler (ncu, nsys, a timer 'cupti' bench) may own the counters"
                     : "");
}

static int load(void) {
  if (api.tried) return api.loaded;
  api.tried = 1;
  const char *why = NULL;
  void *h = mla_cupti_lib(&why);
  if (!h) {
    snprintf(api.why, sizeof api.why, "%s", why);
    return 0;
  }
  struct {
    void **slot;
    const char *name;
  } syms[] = {
    {(void **)&api.result_string, "cuptiGetResultString"},
    {(void **)&api.init, "cuptiProfilerInitialize"},
    {(void **)&api.supported, "cuptiProfilerDeviceSupported"},
    {(void **)&api.chip_name, "cuptiDeviceGetChipName"},
    {(void **)&api.availability, "cuptiProfilerGetCounterAvailability"},
    {(void **)&api.host_init, "cuptiProfilerHostInitialize"},
    {(void **)&api.host_deinit, "cuptiProfilerHostDeinitialize"},
    {(void **)&api.metric_props, "cuptiProfilerHostGetMetricProperties"},
    {(void **)&api.add_metrics, "cuptiProfilerHostConfigAddMetrics"},
    {(void **)&api.config_size, "cuptiProfilerHostGetConfigImageSize"},
    {(void **)&api.config_image, "cuptiProfilerHostGetConfigImage"},
    {(void **)&api.num_passes, "cuptiProfilerHostGetNumOfPasses"},
    {(void **)&api.evaluate, "cuptiProfilerHostEvaluateToGpuValues"},
    {(void **)&api.enable, "cuptiRangeProfilerEnable"},
    {(void **)&api.disable, "cuptiRangeProfilerDisable"},
    {(void **)&api.set_config, "cuptiRangeProfilerSetConfig"},
    {(void **)&api.start, "cuptiRangeProfilerStart"},
    {(void **)&api.stop, "cuptiRangeProfilerStop"},
    {(void **)&api.decode, "cuptiRangeProfilerDecodeData"},
    {(void **)&api.data_size, "cuptiRangeProfilerGetCounterDataSize"},
    {(void **)&api.data_init, "cuptiRangeProfilerCounterDataImageInitialize"},
    {(void **)&api.data_info, "cuptiRangeProfilerGetCounterDataInfo"},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    *syms[i].slot = dlsym(h, syms[i].name);
    if (!*syms[i].slot) {
      snprintf(api.why, sizeof api.why, "libcupti lacks %s (the range profiler needs CUPTI from CUDA 12.6 or later)",
               syms[i].name);
      return 0;
    }
  }
  api.loaded = 1;
  return 1;
}

int mla_pm_available(const char **why) {
  int ok = load();
  if (why) *why = ok ? "" : api.why;
  return ok;
}

int mla_pm_device(void) { return pm.open ? pm.dev : -1; }

/* The context the runtime made current for dev, through the driver entry
 * point the runtime exposes (the binary does not link libcuda). */
static int current_context(CUcontext *ctx) {
  CUresult (*get)(CUcontext *) = NULL;
  enum cudaDriverEntryPointQueryResult q;
  if (mla_cuda_check(cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", (void **)&get, 12000, cudaEnableDefault, &q),
                     "cudaGetDriverEntryPoint (cuCtxGetCurrent)"))
    return -1;
  if (!get || q != cudaDriverEntryPointSuccess) return mla_err("timer 'pm': the driver has no cuCtxGetCurrent");
  if (get(ctx) != CUDA_SUCCESS || !*ctx) return mla_err("timer 'pm': no current CUDA context");
  return 0;
}

static const char *level(CUpti_Profiler_Support_Level l) {
  return l == CUPTI_PROFILER_CONFIGURATION_SUPPORTED ? "supported"
         : l == CUPTI_PROFILER_CONFIGURATION_DISABLED ? "disabled"
         : l == CUPTI_PROFILER_CONFIGURATION_UNSUPPORTED ? "unsupported" : "unknown";
}

static int device_supported(int dev) {
  CUpti_Profiler_DeviceSupported_Params p = {.structSize = CUpti_Profiler_DeviceSupported_Params_STRUCT_SIZE};
  p.cuDevice = dev;
  p.api = CUPTI_PROFILER_RANGE_PROFILING;
  if (check(api.supported(&p), "cuptiProfilerDeviceSupported")) return -1;
  if (p.isSupported == CUPTI_PROFILER_CONFIGURATION_SUPPORTED) return 0;
  return mla_err("timer 'pm': cuda:%d does not support the range profiler (architecture %s, vGPU %s, confidential "
                 "compute %s, WSL %s)", dev, level(p.architecture), level(p.vGpu), level(p.confidentialCompute),
                 level(p.wsl));
}

/* Host side: the chip's metric names -> a config image; refuses metrics that
 * are not counters (a sum over kernels and calls would mean nothing) and
 * sets that need more than one pass (a replay would re-run the work). */
static int build_config(int dev, CUcontext ctx) {
  CUpti_Device_GetChipName_Params cn = {.structSize = CUpti_Device_GetChipName_Params_STRUCT_SIZE};
  cn.deviceIndex = (size_t)dev;
  if (check(api.chip_name(&cn), "cuptiDeviceGetChipName")) return -1;
  CUpti_Profiler_GetCounterAvailability_Params av = {.structSize = CUpti_Profiler_GetCounterAvailability_Params_STRUCT_SIZE};
  av.ctx = ctx;
  if (check(api.availability(&av), "cuptiProfilerGetCounterAvailability")) return -1;
  if (!(pm.avail = malloc(av.counterAvailabilityImageSize))) return mla_err("timer 'pm': out of host memory");
  av.pCounterAvailabilityImage = pm.avail;
  if (check(api.availability(&av), "cuptiProfilerGetCounterAvailability")) return -1;

  CUpti_Profiler_Host_Initialize_Params hi = {.structSize = CUpti_Profiler_Host_Initialize_Params_STRUCT_SIZE};
  hi.profilerType = CUPTI_PROFILER_TYPE_RANGE_PROFILER;
  hi.pChipName = cn.pChipName;
  hi.pCounterAvailabilityImage = pm.avail;
  if (check(api.host_init(&hi), "cuptiProfilerHostInitialize")) return -1;
  pm.host = hi.pHostObject;
  for (int i = 0; i < pm.nmetrics; i++) {
    CUpti_Profiler_Host_GetMetricProperties_Params mp = {.structSize = CUpti_Profiler_Host_GetMetricProperties_Params_STRUCT_SIZE};
    mp.pHostObject = pm.host;
    mp.pMetricName = pm.metric[i];
    if (api.metric_props(&mp) != CUPTI_SUCCESS)
      return mla_err("timer 'pm': %s is not a metric of %s (Nsight Compute's `ncu --query-metrics` lists them)",
                     pm.metric[i], cn.pChipName);
    if (mp.metricType != CUPTI_METRIC_TYPE_COUNTER)
      return mla_err("timer 'pm': %s is a %s; the bench sums metrics over kernels and calls, so it takes counters "
                     "(names ending in .sum)", pm.metric[i],
                     mp.metricType == CUPTI_METRIC_TYPE_RATIO ? "ratio" : "throughput");
  }
  CUpti_Profiler_Host_ConfigAddMetrics_Params am = {.structSize = CUpti_Profiler_Host_ConfigAddMetrics_Params_STRUCT_SIZE};
  am.pHostObject = pm.host;
  am.ppMetricNames = pm.metric;
  am.numMetrics = (size_t)pm.nmetrics;
  if (check(api.add_metrics(&am), "cuptiProfilerHostConfigAddMetrics")) return -1;
  CUpti_Profiler_Host_GetConfigImageSize_Params cs = {.structSize = CUpti_Profiler_Host_GetConfigImageSize_Params_STRUCT_SIZE};
  cs.pHostObject = pm.host;
  if (check(api.config_size(&cs), "cuptiProfilerHostGetConfigImageSize")) return -1;
  if (!(pm.config = malloc(cs.configImageSize))) return mla_err("timer 'pm': out of host memory");
  pm.config_bytes = cs.configImageSize;
  CUpti_Profiler_Host_GetConfigImage_Params ci = {.structSize = CUpti_Profiler_Host_GetConfigImage_Params_STRUCT_SIZE};
  ci.pHostObject = pm.host;
  ci.configImageSize = pm.config_bytes;
  ci.pConfigImage = pm.config;
  if (check(api.config_image(&ci), "cuptiProfilerHostGetConfigImage")) return -1;
  CUpti_Profiler_Host_GetNumOfPasses_Params np = {.structSize = CUpti_Profiler_Host_GetNumOfPasses_Params_STRUCT_SIZE};
  np.configImageSize = pm.config_bytes;
  np.pConfigImage = pm.config;
  if (check(api.num_passes(&np), "cuptiProfilerHostGetNumOfPasses")) return -1;
  if (np.numOfPasses != 1)
    return mla_err("timer 'pm': these metrics need %zu passes of the hardware counters; the bench takes sets that fit "
                   "one pass (fewer metrics)", np.numOfPasses);
  return 0;
}

static int enable_target(CUcontext ctx) {
  CUpti_RangeProfiler_Enable_Params en = {.structSize = CUpti_RangeProfiler_Enable_Params_STRUCT_SIZE};
  en.ctx = ctx;
  if (check(api.enable(&en), "cuptiRangeProfilerEnable")) return -1;
  pm.obj = en.pRangeProfilerObject;
  CUpti_RangeProfiler_GetCounterDataSize_Params ds = {.structSize = CUpti_RangeProfiler_GetCounterDataSize_Params_STRUCT_SIZE};
  ds.pRangeProfilerObject = pm.obj;
  ds.pMetricNames = pm.metric;
  ds.numMetrics = (size_t)pm.nmetrics;
  ds.maxNumOfRanges = MAX_RANGES;
  ds.maxNumRangeTreeNodes = MAX_RANGES;
  if (check(api.data_size(&ds), "cuptiRangeProfilerGetCounterDataSize")) return -1;
  if (!(pm.data = malloc(ds.counterDataSize))) return mla_err("timer 'pm': out of host memory");
  pm.data_bytes = ds.counterDataSize;
  return 0;
}

int mla_pm_open(int dev, const char *const *metrics, int n) {
  if (!load()) return mla_err("timer 'pm': %s", api.why);
  if (pm.open) return mla_err("timer 'pm': a session is already open on cuda:%d", pm.dev);
  if (n < 0 || n > MLA_PM_MAX_METRICS) return mla_err("timer 'pm': at most %d metrics", MLA_PM_MAX_METRICS);
  pm.nmetrics = n + 1;
  snprintf(pm.names[0], sizeof pm.names[0], "%s", DURATION);
  for (int i = 0; i < n; i++) {
    if (!metrics[i] || !*metrics[i] || strlen(metrics[i]) >= sizeof pm.names[0])
      return mla_err("timer 'pm': metric %d is empty or too long", i + 1);
    snprintf(pm.names[i + 1], sizeof pm.names[0], "%s", metrics[i]);
  }
  for (int i = 0; i < pm.nmetrics; i++) pm.metric[i] = pm.names[i];
  CUcontext ctx = NULL;
  if (mla_device_use(dev) || mla_cuda_check(cudaFree(NULL), "cudaFree (context)") || current_context(&ctx)) return -1;
  CUpti_Profiler_Initialize_Params ip = {.structSize = CUpti_Profiler_Initialize_Params_STRUCT_SIZE};
  if (check(api.init(&ip), "cuptiProfilerInitialize") || device_supported(dev)) return -1;
  pm.open = 1, pm.dev = dev; /* from here mla_pm_close undoes what was done */
  if (build_config(dev, ctx) || enable_target(ctx)) {
    mla_pm_close();
    return -1;
  }
  return 0;
}

int mla_pm_start(void) {
  if (!pm.open) return mla_err("timer 'pm': no session is open");
  if (pm.started) return 0;
  CUpti_RangeProfiler_CounterDataImage_Initialize_Params di = {
    .structSize = CUpti_RangeProfiler_CounterDataImage_Initialize_Params_STRUCT_SIZE};
  di.pRangeProfilerObject = pm.obj;
  di.counterDataSize = pm.data_bytes;
  di.pCounterData = pm.data;
  if (check(api.data_init(&di), "cuptiRangeProfilerCounterDataImageInitialize")) return -1;
  CUpti_RangeProfiler_SetConfig_Params sc = {.structSize = CUpti_RangeProfiler_SetConfig_Params_STRUCT_SIZE};
  sc.pRangeProfilerObject = pm.obj;
  sc.configSize = pm.config_bytes;
  sc.pConfig = pm.config;
  sc.counterDataImageSize = pm.data_bytes;
  sc.pCounterDataImage = pm.data;
  sc.range = CUPTI_AutoRange;
  sc.replayMode = CUPTI_UserReplay; /* one pass, never replayed: nothing to save and restore */
  sc.maxRangesPerPass = MAX_RANGES;
  sc.numNestingLevels = 1;
  sc.minNestingLevel = 1;
  sc.passIndex = 0;
  sc.targetNestingLevel = 1;
  if (check(api.set_config(&sc), "cuptiRangeProfilerSetConfig")) return -1;
  CUpti_RangeProfiler_Start_Params st = {.structSize = CUpti_RangeProfiler_Start_Params_STRUCT_SIZE};
  st.pRangeProfilerObject = pm.obj;
  if (check(api.start(&st), "cuptiRangeProfilerStart")) return -1;
  pm.started = 1;
  return 0;
}

int mla_pm_stop(mla_pm_acc *acc) {
  if (!pm.open || !pm.started) return mla_err("timer 'pm': the counters are not running");
  pm.started = 0;
  CUpti_RangeProfiler_Stop_Params sp = {.structSize = CUpti_RangeProfiler_Stop_Params_STRUCT_SIZE};
  sp.pRangeProfilerObject = pm.obj;
  if (check(api.stop(&sp), "cuptiRangeProfilerStop")) return -1;
  if (!sp.isAllPassSubmitted) return mla_err("timer 'pm': the profiler wants another pass (replay is not supported)");
  CUpti_RangeProfiler_DecodeData_Params dd = {.structSize = CUpti_RangeProfiler_DecodeData_Params_STRUCT_SIZE};
  dd.pRangeProfilerObject = pm.obj;
  if (check(api.decode(&dd), "cuptiRangeProfilerDecodeData")) return -1;
  if (dd.numOfRangeDropped)
    return mla_err("timer 'pm': %zu kernels were not profiled (at most %d kernels per call)", dd.numOfRangeDropped,
                   MAX_RANGES);
  CUpti_RangeProfiler_GetCounterDataInfo_Params info = {.structSize = CUpti_RangeProfiler_GetCounterDataInfo_Params_STRUCT_SIZE};
  info.pCounterDataImage = pm.data;
  info.counterDataImageSize = pm.data_bytes;
  if (check(api.data_info(&info), "cuptiRangeProfilerGetCounterDataInfo")) return -1;
  double v[MLA_PM_MAX_METRICS + 1];
  for (size_t r = 0; r < info.numTotalRanges; r++) {
    CUpti_Profiler_Host_EvaluateToGpuValues_Params ev = {.structSize = CUpti_Profiler_Host_EvaluateToGpuValues_Params_STRUCT_SIZE};
    ev.pHostObject = pm.host;
    ev.pCounterDataImage = pm.data;
    ev.counterDataImageSize = pm.data_bytes;
    ev.rangeIndex = r;
    ev.ppMetricNames = pm.metric;
    ev.numMetrics = (size_t)pm.nmetrics;
    ev.pMetricValues = v;
    if (check(api.evaluate(&ev), "cuptiProfilerHostEvaluateToGpuValues")) return -1;
    acc->time_s += v[0] * 1e-9; /* nanoseconds */
    for (int i = 1; i < pm.nmetrics; i++) acc->metrics[i - 1] += v[i];
  }
  acc->kernels += (int64_t)info.numTotalRanges;
  acc->calls += info.numTotalRanges > 0;
  acc->stops++;
  return 0;
}

void mla_pm_cancel(void) {
  if (!pm.open || !pm.started) return;
  CUpti_RangeProfiler_Stop_Params sp = {.structSize = CUpti_RangeProfiler_Stop_Params_STRUCT_SIZE};
  sp.pRangeProfilerObject = pm.obj;
  api.stop(&sp);
  pm.started = 0;
}

void mla_pm_close(void) {
  if (!pm.open) return;
  mla_pm_cancel();
  if (pm.obj) {
    CUpti_RangeProfiler_Disable_Params d = {.structSize = CUpti_RangeProfiler_Disable_Params_STRUCT_SIZE};
    d.pRangeProfilerObject = pm.obj;
    api.disable(&d);
  }
  if (pm.host) {
    CUpti_Profiler_Host_Deinitialize_Params d = {.structSize = CUpti_Profiler_Host_Deinitialize_Params_STRUCT_SIZE};
    d.pHostObject = pm.host;
    api.host_deinit(&d);
  }
  free(pm.avail);
  free(pm.config);
  free(pm.data);
  pm.avail = pm.config = pm.data = NULL;
  pm.obj = NULL, pm.host = NULL;
  pm.open = 0, pm.dev = -1;
}
