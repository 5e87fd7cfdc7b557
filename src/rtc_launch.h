/* Loading and launching JIT kernels: a cubin becomes a cudaLibrary_t
 * (cudaLibraryLoadData; no libcuda link), a mangled name a cudaKernel_t, and
 * each launch packs its arguments against the kernel's real parameter list
 * (cudaFuncGetParamInfo: offsets and sizes; the PTX signature adds whether a
 * parameter is an integer, a float or a byte array). Packing is pure C so it
 * is tested without a GPU. */
#ifndef MLA_RTC_LAUNCH_H
#define MLA_RTC_LAUNCH_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

enum mla_param_kind { MLA_PARAM_ANY = 0, MLA_PARAM_INT, MLA_PARAM_FLOAT, MLA_PARAM_BYTES };

typedef struct mla_rtc_param {
  int64_t offset, size;
  int kind;     /* mla_param_kind; ANY when the type is not known */
  int align;
  char type[24]; /* "u32", "f32", "b8[40]" (PTX spelling), or "" */
} mla_rtc_param;

/* Parses one entry's signature ("u64,u32,f32,b8[40]@8"; "" = no
 * parameters) and lays the parameters out as CUDA does (each at a multiple
 * of its alignment). Returns the count, or -1 (mla_err). */
int mla_rtc_parse_signature(const char *sig, mla_rtc_param *out, int max);

enum mla_arg_kind { MLA_ARG_INT, MLA_ARG_FLOAT, MLA_ARG_BOOL, MLA_ARG_PTR, MLA_ARG_BYTES };

typedef struct mla_rtc_arg {
  int kind;           /* mla_arg_kind */
  int64_t i;          /* INT, BOOL */
  double f;           /* FLOAT */
  const void *ptr;    /* PTR */
  const void *bytes;  /* BYTES */
  size_t nbytes;
  const char *what;   /* how an error names the value; may be NULL */
  const char *tensor_dtype; /* PTR from a tensor: its dtype name (errors say "a cuda:0 bf16 tensor") */
  int tensor_dev;           /* ... and its device (-1 = cpu) */
} mla_rtc_arg;

/* Writes argument `index` (1-based, of `count`) for parameter p into dst.
 * Conversions: integers to 1/2/4/8-byte integer parameters (range checked)
 * or to float/double ones; numbers to float/double, or to integer parameters
 * when they hold an exact integer; booleans to 0/1; pointers (tensors) only
 * to 8-byte non-float parameters; byte strings of exactly the parameter's
 * size to anything (structs, __half, vectors). Errors name the argument, its
 * expected size and type. */
int mla_rtc_pack_arg(const mla_rtc_param *p, int index, int count, const mla_rtc_arg *a, unsigned char *dst);

#define MLA_RTC_MAX_DEVICES 16

typedef struct mla_rtc_kernel {
  cudaKernel_t handle;
  char name[128];     /* display name: the name expression, used in errors and fault reports */
  char *lowered;      /* mangled name in the library */
  char *sig;          /* PTX signature of the entry, or NULL */
  int nparams;        /* -1 until the device was asked */
  mla_rtc_param *params;
  unsigned char *argbuf; /* packed arguments (reused by every launch) */
  void **argv;
  int64_t argbytes;
  int attr_known, max_threads, static_smem, num_regs, local_bytes;
  int smem_optin[MLA_RTC_MAX_DEVICES]; /* dynamic shared memory opted into per device */
} mla_rtc_kernel;

/* Needs a usable device; the handle works on every device of the process. */
int mla_rtc_library_load(const void *cubin, size_t len, cudaLibrary_t *lib);
void mla_rtc_library_unload(cudaLibrary_t lib);

/* Fills k for `lowered` in lib (k->name/sig set by the caller first). */
int mla_rtc_kernel_bind(mla_rtc_kernel *k, cudaLibrary_t lib, const char *lowered, const char *sig);
void mla_rtc_kernel_clear(mla_rtc_kernel *k);

/* Asks the device for the parameter list (once) and merges the PTX kinds
 * when both agree on count and sizes. */
int mla_rtc_kernel_params(mla_rtc_kernel *k, int dev);
/* Registers, max threads per block, static shared memory (once). */
int mla_rtc_kernel_attributes(mla_rtc_kernel *k, int dev);

typedef struct mla_rtc_launch_cfg {
  dim3 grid, block;
  dim3 cluster; /* thread block cluster shape (sm_90+); {1, 1, 1} or zeros: none */
  int64_t shared_mem;
  cudaStream_t stream;
  int dev;
} mla_rtc_launch_cfg;

/* A cluster shape of at most 8 CTAs (the portable size) that divides the grid
 * on every axis; {1, 1, 1} and all-zero mean no cluster. Pure C: the
 * launch's check, testable without a GPU. Returns 0 or -1 (mla_err, naming
 * kname and the axis). */
int mla_rtc_check_cluster(dim3 grid, dim3 cluster, const char *kname);

/* Launches with the arguments already packed in k->argbuf: checks the block
 * against the kernel's limit, opts into large dynamic shared memory, launches
 * in clusters when c->cluster asks (cudaLaunchKernelEx; sm_90+), and checks
 * the launch naming the kernel (synchronously with MLALAB_SYNC=1). */
int mla_rtc_launch(mla_rtc_kernel *k, const mla_rtc_launch_cfg *c);

/* The baseline of the launch-overhead benchmark: n plain cudaLaunchKernel
 * calls with the same packed arguments, host wall time in *seconds (the
 * stream is synchronized before the clock starts, not after it stops). */
int mla_rtc_time_raw_launches(mla_rtc_kernel *k, const mla_rtc_launch_cfg *c, int64_t n, double *seconds);

#ifdef __cplusplus
}
#endif
#endif
