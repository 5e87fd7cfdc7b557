// Probe: how many cycles does one warpgroup MMA with N = 16 (the 16-row decode
// kernels' shape, m64n16k16 f16) occupy an SM, with A in shared memory (SS) or
// in registers (RS), on one accumulator chain or on several? One CTA per SM,
// 1-3 warpgroups, 8 wgmma per commit group, one group in flight while the
// next is issued; m64n32k16 for comparison. Standalone (no mlalab):
//   nvcc -O2 -gencode arch=compute_90a,code=sm_90a -o /tmp/wgmma_n16_rate bench/probes/wgmma_n16_rate.cu && /tmp/wgmma_n16_rate
// Results: bench/RESULTS.md, sixteenth session.
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((lbo & 0x3FFFF) >> 4) << 16 | (uint64_t)((sbo & 0x3FFFF) >> 4) << 32 |
         (uint64_t)1 << 62;
}
#define ACC8(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
__device__ __forceinline__ void mma_ss_n16(float *d, uint64_t da, uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, 1, 1, 1, 0, 0;\n"
               : ACC8(d) : "l"(da), "l"(db));
}
__device__ __forceinline__ void mma_rs_n16(float *d, const uint32_t (&a)[4], uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, 1, 1, 1, 0;\n"
               : ACC8(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
__device__ __forceinline__ void mma_ss_n32(float *d, uint64_t da, uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, 1, 1, 1, 0, 0;\n"
               : ACC8(d), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
               : "l"(da), "l"(db));
}

enum { SS16, RS16, SS32 };
constexpr int PER_GROUP = 8;

// Cycles of `iters` groups of PER_GROUP wgmma, accumulator k % NACC, for thread 0 of each CTA.
template <int KIND, int NACC> __global__ void rate(float *sink, long long *cycles, int iters) {
  extern __shared__ __align__(1024) unsigned char smem[];
  for (int i = threadIdx.x; i < 65536 / 4; i += blockDim.x) reinterpret_cast<uint32_t *>(smem)[i] = (i * 2654435761u) & 0x3bff3bffu; // finite f16
  __syncthreads();
  const uint32_t base = (uint32_t)__cvta_generic_to_shared(smem);
  float d[NACC][16] = {};
  const uint32_t a[4] = {0x3c003c00u, 0x3c00bc00u, threadIdx.x, 0x38003800u};
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  const long long t0 = clock64();
  for (int it = 0; it < iters; it++) {
#pragma unroll
    for (int k = 0; k < PER_GROUP; k++) {
      const uint64_t da = sw128_desc(base + k * 2048, 16, 1024), db = sw128_desc(base + 32768 + k * 1024, 16, 1024);
      if constexpr (KIND == SS16) mma_ss_n16(d[k % NACC], da, db);
      else if constexpr (KIND == RS16) mma_rs_n16(d[k % NACC], a, db);
      else mma_ss_n32(d[k % NACC], da, db);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  const long long t1 = clock64();
  float s = 0.f;
  for (int x = 0; x < NACC; x++)
    for (int e = 0; e < 16; e++) s += d[x][e];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <int KIND, int NACC> void measure(const char *name, int warpgroups, int sms) {
  float *sink;
  long long *cycles;
  cudaMalloc(&sink, (size_t)sms * 384 * sizeof(float));
  cudaMalloc(&cycles, (size_t)sms * sizeof(long long));
  cudaFuncSetAttribute(rate<KIND, NACC>, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536);
  const int iters = 2000;
  rate<KIND, NACC><<<sms, 128 * warpgroups, 65536>>>(sink, cycles, iters);
  const cudaError_t e = cudaDeviceSynchronize();
  long long c = 0;
  cudaMemcpy(&c, cycles, sizeof c, cudaMemcpyDeviceToHost);
  const double per = (double)c / ((double)iters * PER_GROUP * warpgroups);
  printf("%-22s %d accumulator(s), %d warpgroup(s): %5.1f SM cycles per wgmma%s%s\n", name, NACC, warpgroups, per,
         e == cudaSuccess ? "" : ", error: ", e == cudaSuccess ? "" : cudaGetErrorString(e));
  cudaFree(sink);
  cudaFree(cycles);
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  measure<SS16, 1>("SS m64n16k16", 1, sms);
  measure<SS16, 4>("SS m64n16k16", 1, sms);
  measure<SS16, 8>("SS m64n16k16", 2, sms);
  measure<SS16, 8>("SS m64n16k16", 3, sms);
  measure<RS16, 1>("RS m64n16k16", 1, sms);
  measure<RS16, 4>("RS m64n16k16", 1, sms);
  measure<RS16, 8>("RS m64n16k16", 2, sms);
  measure<SS32, 4>("SS m64n32k16", 1, sms);
  measure<SS32, 4>("SS m64n32k16", 2, sms);
  return 0;
}
