// Merge of split-KV partials: for each query row, lse = log2 sum_s 2^lse_s
// and out = sum_s 2^(lse_s - lse) o_s, then the attention sink's factor
// 1 / (1 + e^(sink - lse)); the stored lse is natural log, +inf (and a zero
// output) when no split saw a key, NaN (and a NaN output) when a split's is
// NaN: a NaN score. One warp per row, 16 dims per lane.
#include <math_constants.h>

#include <cuda_bf16.h>

#include "attn_decode_params.cuh"

namespace mla_attn {

__global__ void __launch_bounds__(128) attn_combine_kernel(const __grid_constant__ combine_params c) {
  const int lane = threadIdx.x & 31;
  const int64_t gw = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
  if (gw >= (int64_t)c.problems * c.rows) return;
  const int64_t prob = gw / c.rows;
  const int rho = (int)(gw - prob * c.rows);
  const float *lse_s = c.lse_acc + prob * c.nsplits * c.rows + rho; // split s at lse_s[s * rows]
  float m = -CUDART_INF_F;
  bool nan = false; // a split's NaN LSE (a NaN score): the row is NaN, not the other splits' answer
  for (int s = lane; s < c.nsplits; s += 32) {
    const float v = lse_s[(int64_t)s * c.rows];
    m = fmaxf(m, v), nan |= v != v;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (__any_sync(0xffffffffu, nan)) m = CUDART_NAN_F;
  int i, h;
  if (c.sparse) i = (int)(prob % c.s_q), h = rho;
  else i = rho / c.h_q, h = rho % c.h_q;
  const int64_t r = c.sparse ? prob / c.s_q : prob;
  uint16_t *out = c.out + (prob * c.rows + rho) * DV;
  float acc[16];
#pragma unroll
  for (int k = 0; k < 16; k++) acc[k] = 0.f;
  float lse_nat = CUDART_INF_F;
  if (m != -CUDART_INF_F) {
    float w_sum = 0.f;
    for (int s = 0; s < c.nsplits; s++) w_sum += exp2f(lse_s[(int64_t)s * c.rows] - m);
    const float lse2 = m + log2f(w_sum);
    for (int s = 0; s < c.nsplits; s++) {
      const float w = exp2f(lse_s[(int64_t)s * c.rows] - lse2);
      if (w == 0.f) continue; // also skips empty splits, whose partial is zero
      const float4 *src = reinterpret_cast<const float4 *>(c.o_acc + ((prob * c.nsplits + s) * c.rows + rho) * DV);
#pragma unroll
      for (int k = 0; k < 4; k++) {
        const float4 v = src[k * 32 + lane];
        acc[4 * k] += w * v.x, acc[4 * k + 1] += w * v.y, acc[4 * k + 2] += w * v.z, acc[4 * k + 3] += w * v.w;
      }
    }
    lse_nat = lse2 * 0.69314718055994531f;
    if (c.sink) {
      const float f = 1.0f / (1.0f + expf(c.sink[h] - lse_nat));
#pragma unroll
      for (int k = 0; k < 16; k++) acc[k] *= f;
    }
  }
#pragma unroll
  for (int k = 0; k < 4; k++) {
    uint2 v;
    v.x = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(acc[4 * k])) |
          (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(acc[4 * k + 1])) << 16;
    v.y = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(acc[4 * k + 2])) |
          (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(acc[4 * k + 3])) << 16;
    reinterpret_cast<uint2 *>(out)[k * 32 + lane] = v;
  }
  if (lane == 0) c.lse[(r * c.h_q + h) * c.s_q + i] = lse_nat;
}

cudaError_t launch_combine(const combine_params &c, cudaStream_t s) {
  const int64_t warps = (int64_t)c.problems * c.rows;
  attn_combine_kernel<<<(unsigned)((warps + 3) / 4), 128, 0, s>>>(c);
  return cudaGetLastError();
}

} // namespace mla_attn
