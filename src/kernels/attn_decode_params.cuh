// Parameters of the baked decode kernels and their shared-memory plan,
// computed identically on the host (launcher) and the device (kernel).
#ifndef MLA_ATTN_DECODE_PARAMS_CUH
#define MLA_ATTN_DECODE_PARAMS_CUH

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "mla/layout_desc.h"

namespace mla_attn {

constexpr int BN = 32;  // keys per K tile
constexpr int DV = 512; // value dims of every MLA model the baked kernels serve

struct params {
  mla_layout_desc d;
  mla_cache_view v;
  const uint16_t *q; // bf16 bits
  int64_t qs0, qs1, qs2, qs3;
  int b, s_q, h_q, rows; // rows: query rows per problem
  int row_chunks;        // CTAs per problem and split (rows / MR, rounded up)
  int sparse, causal;
  const int *block_table;
  int max_blocks;
  const int *cache_lens;
  const int *indices;
  int topk;
  const int *topk_len;
  const float *sink;
  float scale_log2; // softmax scale x log2(e): scores live in base 2
  int nsplits;      // KV splits of the main kernel
  int nparts;       // partial slots a problem: nsplits, plus the causal tail's; 1: the kernel writes out and lse
  int mr;           // query rows a CTA (its chunk)
  // Causal mask with chunks that hold several queries: each chunk attends
  // only the keys its first query sees, so no key is masked for one row and
  // not another (masked keys' V would meet a 0 weight in the shared P V, and
  // 0 x NaN is NaN); the causal tail kernel (attn_causal_tail.cu) attends
  // the later queries' remaining keys into partial slot nparts - 1.
  int causal_tail;
  int identity;     // one bf16 field holds dims [0, d_qk): copy rows straight into the tile
  int id_off;       // byte offset of dim 0 in the region-0 row (identity)
  int stage_pitch;  // bytes per token of a staged tile (every region's row, 16 B aligned)
  int nstages;
  int reg_stage_off[MLA_LAYOUT_MAX_REGIONS];
  int reg_bytes[MLA_LAYOUT_MAX_REGIONS];
  int reg_gran[MLA_LAYOUT_MAX_REGIONS]; // 16, 8, 4: cp.async size; 1: synchronous byte copy
  int reg_upp[MLA_LAYOUT_MAX_REGIONS];  // chunked regions: gran-byte units a piece, and its log2 (-1: not a power of two)
  int reg_ushift[MLA_LAYOUT_MAX_REGIONS];
  int q_vec;        // q rows can be read 16 B at a time
  uint16_t *out;    // bf16 [problems * rows, DV] (= [b, s_q, h_q, DV])
  float *lse;       // [b, h_q, s_q]
  float *o_acc;     // split partials [problems, nparts, rows, DV], normalized
  float *lse_acc;   // [problems, nparts, rows], base 2, -inf when empty
};

struct combine_params {
  const float *o_acc, *lse_acc;
  int nsplits, rows, problems, h_q, s_q, sparse;
  const float *sink;
  uint16_t *out;
  float *lse;
};

// LSE-weighted merge of the split partials (attn_combine.cu).
cudaError_t launch_combine(const combine_params &c, cudaStream_t s);

// Programmatic dependent launch (sm_90+; no-ops elsewhere). The main decode
// kernels allow their dependent to launch as each CTA begins (the trigger
// completes once every CTA has begun, so no CTA of theirs still waits for an
// SM); the causal tail, launched as that dependent, does its own keys while
// the last CTAs finish and waits for the grid only before it reads their
// partials.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait_primary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The causal tail (attn_causal_tail.cu): for each dense row whose query comes
// after its chunk's first, the keys only it (and later queries) see, into
// partial slot p.nparts - 1 of every row (empty where there are none), or,
// with one split, merged with slot 0 into out and lse.
cudaError_t launch_causal_tail(const params &p, cudaStream_t s);

// Byte offsets of the shared-memory buffers of one CTA.
struct smem_plan {
  int q, p, stages, kb, plan, red_max, red_sum, m_run, alpha, l_run, tok_page, tok_off, s_part, total;
};

// The fused path (16 rows per CTA, staged raw bytes): each of the 8 warps
// dequantizes 8 tokens x half of the dims straight into mma B fragments
// (S = Q K^T split over the two dim halves, partial sums meeting in shared
// memory) and writes the bf16 V dims to the K tile for P V. Q rows are then
// read 16 B per lane, so their pitch is 64 bytes past a multiple of 128 (no
// bank conflict); staged rows are padded to 32 past a multiple of 128
// (attn_decode.cu), so 8-byte fp8 chunk reads of 4 tokens x 4 lanes spread
// over all banks.
template <int MR> __host__ __device__ constexpr bool fused_path(int identity) { return MR == 16 && !identity; }
template <int MR, int DQK> __host__ __device__ constexpr int q_pitch(int identity) {
  return fused_path<MR>(identity) ? DQK + 32 : DQK + 8;
}

template <int MR, int DQK>
__host__ __device__ inline smem_plan make_smem_plan(int identity, int stage_pitch, int nstages) {
  constexpr int KP = DQK + 8, PP = BN + 8; // pitches in bf16: rows 16 B apart mod 128, so ldmatrix has no bank conflict
  smem_plan s;
  int o = 0;
  auto take = [&](int bytes) {
    int at = o;
    o += (bytes + 15) / 16 * 16;
    return at;
  };
  s.q = take(MR * q_pitch<MR, DQK>(identity) * 2);
  s.p = take(MR * PP * 2);
  int stage_bytes = identity ? BN * KP * 2 : BN * stage_pitch;
  s.stages = take(nstages * stage_bytes);
  s.kb = identity ? s.stages : take(BN * KP * 2);
  s.plan = take(DQK / 8 * 16);
  s.red_max = take(4 * MR * 4); // up to 4 column groups of S per row
  s.red_sum = take(4 * MR * 4);
  s.m_run = take(2 * MR * 4);
  s.alpha = take(MR * 4);
  s.l_run = take(MR * 4);
  s.tok_page = take(nstages * BN * 4);
  s.tok_off = take(nstages * BN * 4);
  s.s_part = take(fused_path<MR>(identity) ? MR * BN * 4 : 0);
  s.total = o;
  return s;
}

} // namespace mla_attn

#endif
