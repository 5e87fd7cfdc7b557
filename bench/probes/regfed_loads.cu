// Probe: does a large shared-memory carve-out (a small L1) throttle register-fed
// global loads? One CTA per SM, 256 threads, 4 per random 656-byte row of a 1 GiB
// buffer (9 x 16-byte loads per thread, as the wgmma decode kernel's loaders do),
// one 64-row tile in registers while the next is loaded; the dynamic shared memory
// (unused) sets the carve-out. Standalone (no mlalab):
//   nvcc -O3 -arch=sm_90a -o /tmp/regfed_loads bench/probes/regfed_loads.cu && /tmp/regfed_loads
// Results: bench/RESULTS.md, fourteenth session.
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
__global__ void probe(const uint4 *__restrict__ base, int64_t nrows, int tiles, uint32_t seed, uint4 *sink) {
  const int t = threadIdx.x, key = t >> 2, q = t & 3;
  uint32_t h = seed ^ (blockIdx.x * 9781u + key * 6271u);
  uint4 acc = make_uint4(0, 0, 0, 0), d[9];
  auto row_of = [&](int tile) { uint32_t x = h ^ (tile * 2654435761u); x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15; return (int64_t)(x % (uint32_t)nrows); };
  auto load = [&](int tile) {
    const uint4 *r = base + row_of(tile) * 41; // 656 B = 41 x 16 B
#pragma unroll
    for (int i = 0; i < 9; i++) { const int c = i * 4 + q; d[i] = c < 41 ? __ldg(r + c) : make_uint4(0, 0, 0, 0); }
  };
  load(0);
  for (int u = 1; u <= tiles; u++) {
    uint4 cur[9];
#pragma unroll
    for (int i = 0; i < 9; i++) cur[i] = d[i];
    if (u < tiles) load(u);
#pragma unroll
    for (int i = 0; i < 9; i++) acc.x ^= cur[i].x, acc.y ^= cur[i].y, acc.z += cur[i].z, acc.w ^= cur[i].w;
  }
  if (acc.x == 0x12345678u) sink[blockIdx.x * 256 + t] = acc;
}
int main() {
  const int64_t nrows = (1ll << 30) / 656;
  uint4 *buf, *sink;
  cudaMalloc(&buf, nrows * 656 + 4096); cudaMemset(buf, 1, nrows * 656);
  cudaMalloc(&sink, 1 << 20);
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int tiles = 2000;
  for (int kb : {0, 64, 100, 132, 164, 196, 200, 223}) {
    for (int rep = 0; rep < 2; rep++) {
      cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
      probe<<<sms, 256, kb * 1024>>>(buf, nrows, 10, 1, sink);
      cudaEventRecord(a);
      probe<<<sms, 256, kb * 1024>>>(buf, nrows, tiles, 7 + rep, sink);
      cudaEventRecord(b); cudaEventSynchronize(b);
      float ms; cudaEventElapsedTime(&ms, a, b);
      const double bytes = (double)sms * 64 * 656 * tiles;
      printf("smem %3d KB: %.1f us, %.0f GB/s, %.2f us per 64-row tile\n", kb, ms * 1e3, bytes / ms / 1e6, ms * 1e3 / tiles);
    }
  }
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
