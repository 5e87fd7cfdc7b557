// The causal tail of dense decode (params::causal_tail): where a CTA's chunk
// of rows holds several queries, the main kernels attend only the keys the
// chunk's first query sees, and this kernel attends, for each later row, the
// keys between those and its own causal limit: fewer than s_q, so it is
// simple on purpose. One warp a row, 8-dim chunks of K dequantized in fp32
// through the descriptor (mla::dequant8, as the JIT kernel), an online
// softmax in base 2. It is launched as a programmatic dependent of the main
// kernel, so that this part runs while the main kernel's last CTAs finish.
// With one KV split it then merges its result with the main kernel's partial
// and writes the output and lse (one launch fewer than the combine); with
// several it fills partial slot nparts - 1 (normalized output, base-2 LSE,
// -inf and zeros when empty, NaN when a score is NaN) for the combine.
#include <math_constants.h>

#include "attn_decode_params.cuh"
#include "attn_decode_rows.cuh"
#include "mla/layout_access.cuh"
#include "mla/mma.cuh"
#include "mla/token_access.cuh"

namespace mla_attn {

namespace {

constexpr int LCH = (576 / 8 + 31) / 32; // chunks of K a lane holds (d_qk 576 or 512)

__global__ void __launch_bounds__(128) attn_causal_tail_kernel(const __grid_constant__ params p) {
  const int lane = threadIdx.x & 31;
  const int64_t gw = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
  if (gw >= (int64_t)p.b * p.rows) return;
  const int r = (int)(gw / p.rows), rho = (int)(gw - (int64_t)r * p.rows);
  int i, h;
  row_coords(p, 0, rho, i, h);
  const int i0 = rho / p.mr * p.mr / p.h_q; // the chunk's first query: the main kernels attended its keys
  const int s_k = max(0, __ldg(p.cache_lens + r));
  const int lo = max(0, s_k - p.s_q + i0 + 1), hi = min(s_k, s_k - p.s_q + i + 1);
  const int kch = p.d.k_dims / 8, vch = DV / 8;

  float q[LCH][8]; // read only where the row has tail keys (half the rows of s_q 2 have none)
#pragma unroll
  for (int k = 0; k < LCH; k++) {
    const int c = lane + 32 * k;
    mla::unpack_bf16x8(c < kch && lo < hi ? load_q8(p, r, i, h, c) : make_uint4(0, 0, 0, 0), q[k]);
  }
  float m = -CUDART_INF_F, l = 0.f, acc[LCH][8];
  bool nan = false;
#pragma unroll
  for (int k = 0; k < LCH; k++)
#pragma unroll
    for (int e = 0; e < 8; e++) acc[k][e] = 0.f;

  for (int j = lo; j < hi; j++) {
    int pg, off;
    slot_resolve(p, slot_fetch<1>(p, r, 0, hi, j, 0), pg, off);
    if (pg < 0) continue; // a missing key, as in the main kernels
    float kv[LCH][8];
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < LCH; k++) {
      const int c = lane + 32 * k;
#pragma unroll
      for (int e = 0; e < 8; e++) kv[k][e] = 0.f;
      if (c < kch) {
        mla::dequant8(p.d, p.v, pg, off, c * 8, kv[k]);
#pragma unroll
        for (int e = 0; e < 8; e++) dot += q[k][e] * kv[k][e];
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float s = dot * p.scale_log2;
    nan |= s != s;
    const float m_new = fmaxf(m, s);
    const float a = m == -CUDART_INF_F ? 0.f : exp2f(m - m_new), w = exp2f(s - m_new);
    l = l * a + w, m = m_new;
#pragma unroll
    for (int k = 0; k < LCH; k++) {
      const bool v = lane + 32 * k < vch;
#pragma unroll
      for (int e = 0; e < 8; e++) acc[k][e] = acc[k][e] * a + (v ? w * kv[k][e] : 0.f);
    }
  }
  // empty only at l == 0; a NaN score makes the row NaN, as in the reference
  pdl_wait_primary(); // the main kernel's grid is done and its partials visible; nothing is written before
  const float f = nan ? CUDART_NAN_F : l != 0.f ? 1.0f / l : 0.f;
  const float lse2 = nan ? CUDART_NAN_F : l != 0.f ? m + log2f(l) : -CUDART_INF_F;
  const int64_t slot = ((int64_t)r * p.nparts + p.nparts - 1) * p.rows + rho;
#pragma unroll
  for (int k = 0; k < LCH; k++)
#pragma unroll
    for (int e = 0; e < 8; e++) acc[k][e] *= f;
  if (p.nsplits > 1) { // the combine merges the partials
    float *o = p.o_acc + slot * DV;
#pragma unroll
    for (int k = 0; k < LCH; k++) {
      const int c = lane + 32 * k;
      if (c < vch) {
        float4 *dst = reinterpret_cast<float4 *>(o + c * 8);
        dst[0] = make_float4(acc[k][0], acc[k][1], acc[k][2], acc[k][3]);
        dst[1] = make_float4(acc[k][4], acc[k][5], acc[k][6], acc[k][7]);
      }
    }
    if (lane == 0) p.lse_acc[slot] = lse2;
    return;
  }
  // one split: merge with the main kernel's partial (slot 0) as the combine would, then the sink
  const int64_t slot0 = (int64_t)r * p.nparts * p.rows + rho;
  const float lse_a = __ldg(p.lse_acc + slot0), mx = fmaxf(lse_a, lse2);
  float wa = 0.f, wb = 0.f, lse_nat = CUDART_INF_F;
  if (lse_a != lse_a || lse2 != lse2) wa = wb = lse_nat = CUDART_NAN_F;
  else if (mx != -CUDART_INF_F) {
    const float lse_m = mx + log2f(exp2f(lse_a - mx) + exp2f(lse2 - mx));
    wa = exp2f(lse_a - lse_m), wb = exp2f(lse2 - lse_m), lse_nat = lse_m * 0.69314718055994531f;
    if (p.sink) {
      const float g = 1.0f / (1.0f + expf(__ldg(p.sink + h) - lse_nat));
      wa *= g, wb *= g;
    }
  }
  const float *oa = p.o_acc + slot0 * DV;
  uint16_t *out = p.out + ((int64_t)r * p.rows + rho) * DV;
#pragma unroll
  for (int k = 0; k < LCH; k++) {
    const int c = lane + 32 * k;
    if (c < vch) {
      float4 a0 = make_float4(0.f, 0.f, 0.f, 0.f), a1 = a0;
      if (wa != 0.f) a0 = __ldg(reinterpret_cast<const float4 *>(oa + c * 8)), a1 = __ldg(reinterpret_cast<const float4 *>(oa + c * 8) + 1);
      const float x[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      uint32_t w4[4];
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const float v0 = wa * x[2 * e] + wb * acc[k][2 * e], v1 = wa * x[2 * e + 1] + wb * acc[k][2 * e + 1];
        w4[e] = mla::pack_bf16x2(v0, v1);
      }
      *reinterpret_cast<uint4 *>(out + c * 8) = make_uint4(w4[0], w4[1], w4[2], w4[3]);
    }
  }
  if (lane == 0) p.lse[((int64_t)r * p.h_q + h) * p.s_q + i] = lse_nat;
}

} // namespace

// Launched as a programmatic dependent of the main kernel (pdl_wait_primary).
cudaError_t launch_causal_tail(const params &p, cudaStream_t s) {
  const int64_t warps = (int64_t)p.b * p.rows;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)((warps + 3) / 4)), cfg.blockDim = dim3(128), cfg.dynamicSmemBytes = 0, cfg.stream = s;
  cfg.attrs = at, cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, attn_causal_tail_kernel, p);
}

} // namespace mla_attn
