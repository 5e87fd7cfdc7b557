// JIT twin of the baked MLA decode kernels (src/kernels/attn_decode*.cu),
// generic over the layout header mla.rtc generates (`mla_layout`, constexpr),
// so any layout gets attention without a C++ edit. Semantics: src/attn.h.
//
// Simple on purpose: one CTA per query row, keys spread over 4 warps, each
// lane holding 8-dim chunks of K dequantized in fp32 (mla::dequant8); online
// softmax per warp in fp32, warps merged at the end. No tensor cores, no
// splits: every row reads its keys again (from L2), so it is slower than the
// baked kernels, but it computes on fp32 K, the reference's values.
//
// grid = (rows per problem, problems), block = 128.
#include "mla/dtype_ids.h" // the generated header names dtype ids without including them
#include "mla_layout.h"
#include "mla/layout_access.cuh"

namespace {

constexpr int KCH = MLA_LAYOUT_K_DIMS / 8;       // 8-dim chunks of K
constexpr int VCH = MLA_LAYOUT_V_DIMS / 8;       // chunks of V (a prefix of K)
constexpr int LCH = (KCH + 31) / 32;             // chunks per lane
constexpr int NWARP = 4;
constexpr int BS = MLA_LAYOUT_BLOCK_SIZE;
__device__ __forceinline__ float inf_f() { return __int_as_float(0x7f800000); }

struct key_src {
  long long page;
  int off;
};

} // namespace

extern "C" __global__ void __launch_bounds__(128)
    attn_decode_jit(const mla_cache_view view, const unsigned short *q, long long qs0, long long qs1, long long qs2,
                    long long qs3, int s_q, int h_q, int sparse, int causal, const int *block_table, int max_blocks,
                    const int *cache_lens, const int *indices, int topk, const int *topk_len, const float *sink,
                    float scale, unsigned short *out, float *lse) {
  __shared__ float qs[MLA_LAYOUT_K_DIMS];
  __shared__ float o_w[NWARP][VCH * 8 > 0 ? VCH * 8 : 1];
  __shared__ float m_w[NWARP], l_w[NWARP];
  const int rows = sparse ? h_q : s_q * h_q;
  const int rho = blockIdx.x, prob = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r = sparse ? prob / s_q : prob;
  const int i = sparse ? prob % s_q : rho / h_q, h = sparse ? rho : rho % h_q;

  for (int c = threadIdx.x; c < MLA_LAYOUT_K_DIMS; c += blockDim.x) {
    const unsigned short b = q[r * qs0 + i * qs1 + h * qs2 + c * qs3];
    qs[c] = __uint_as_float((unsigned)b << 16);
  }
  __syncthreads();

  // keys of this row
  long long nkeys, last;
  if (sparse) {
    nkeys = topk_len ? min(max(topk_len[r], 0), topk) : topk;
    last = nkeys - 1;
  } else {
    const long long s_k = max(cache_lens[r], 0);
    nkeys = s_k;
    last = causal && s_q > 1 ? s_k - s_q + i : s_k - 1;
  }

  float m = -inf_f(), l = 0.f;
  float acc[LCH][8];
#pragma unroll
  for (int k = 0; k < LCH; k++)
#pragma unroll
    for (int e = 0; e < 8; e++) acc[k][e] = 0.f;

  for (long long j = warp; j < nkeys && j <= last; j += NWARP) {
    key_src src = {-1, 0};
    if (sparse) {
      const int idx = indices[((long long)r * s_q + i) * topk + j];
      if (idx >= 0 && (long long)idx < view.num_pages * BS) src.page = idx / BS, src.off = idx % BS;
    } else if (j / BS < max_blocks) {
      const int pg = block_table[(long long)r * max_blocks + j / BS];
      if (pg >= 0 && pg < view.num_pages) src.page = pg, src.off = (int)(j % BS);
    }
    if (src.page < 0) continue; // a missing key (uniform across the warp)
    float kv[LCH][8];
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < LCH; k++) {
      const int c = lane + 32 * k;
      if (c < KCH) {
        mla::dequant8(mla_layout, view, src.page, src.off, c * 8, kv[k]);
#pragma unroll
        for (int e = 0; e < 8; e++) dot += qs[c * 8 + e] * kv[k][e];
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float s = dot * scale;
    const float m_new = fmaxf(m, s);
    const float a = m == -inf_f() ? 0.f : expf(m - m_new), p = expf(s - m_new);
    l = l * a + p;
    m = m_new;
#pragma unroll
    for (int k = 0; k < LCH; k++) {
      const bool mine = lane + 32 * k < VCH;
#pragma unroll
      for (int e = 0; e < 8; e++) acc[k][e] = acc[k][e] * a + (mine ? p * kv[k][e] : 0.f);
    }
  }

  // merge the warps: M = max m_w, L = sum l_w e^(m_w - M), O = sum O_w e^(m_w - M) / L
  if (lane == 0) m_w[warp] = m, l_w[warp] = l;
#pragma unroll
  for (int k = 0; k < LCH; k++) {
    const int c = lane + 32 * k;
    if (c < VCH)
#pragma unroll
      for (int e = 0; e < 8; e++) o_w[warp][c * 8 + e] = acc[k][e];
  }
  __syncthreads();
  float M = -inf_f(), Lsum = 0.f;
  for (int w = 0; w < NWARP; w++) M = fmaxf(M, m_w[w]);
  float f[NWARP];
  for (int w = 0; w < NWARP; w++) {
    f[w] = m_w[w] == -inf_f() ? 0.f : expf(m_w[w] - M);
    Lsum += l_w[w] * f[w];
  }
  const bool none = Lsum == 0.f; // a NaN sum (a NaN score) is not empty: NaN LSE and output, as the reference
  const float lse_v = none ? inf_f() : M + logf(Lsum);
  float g = none ? 0.f : 1.0f / Lsum;
  if (!none && sink) g *= 1.0f / (1.0f + expf(sink[h] - lse_v));
  unsigned short *dst = out + ((long long)prob * rows + rho) * MLA_LAYOUT_V_DIMS;
  for (int c = threadIdx.x; c < MLA_LAYOUT_V_DIMS; c += blockDim.x) {
    float v = 0.f;
    for (int w = 0; w < NWARP; w++) v += o_w[w][c] * f[w];
    dst[c] = __bfloat16_as_ushort(__float2bfloat16_rn(v * g));
  }
  if (threadIdx.x == 0) lse[((long long)r * h_q + h) * s_q + i] = lse_v;
}
