// Where a decode kernel's rows and keys come from, shared by the main
// kernels (attn_decode_kernel.cuh and the kernels built on it) and the causal
// tail (attn_causal_tail.cu): a row's query and head, its query dims, and a
// key's page and in-page offset.
#ifndef MLA_ATTN_DECODE_ROWS_CUH
#define MLA_ATTN_DECODE_ROWS_CUH

#include "attn_decode_params.cuh"

namespace mla_attn {

// x / bs for x >= 0: a shift for the usual power-of-two page sizes (a
// uniform branch; the division is ~25 instructions per key and thread). BS:
// the page size when the kernel is compiled for one (specialized layouts),
// else 0.
template <int BS = 0> __device__ __forceinline__ int div_block(int x, int bs) {
  if constexpr (BS > 0) return x / BS;
  else return (bs & (bs - 1)) == 0 ? x >> (__ffs(bs) - 1) : x / bs;
}

// A key's slot in two steps, so that a caller can have the block-table or
// index entry's load in flight before it needs the slot: slot_fetch loads the
// entry of key n of tile `tile` (off = -1: past the keys), slot_resolve turns it
// into the page and in-page offset (page -1: no key, a -1 index, a page or
// slot outside the cache). Keys of one problem count in int32 (lengths,
// top-k and block tables are int32). TB: keys per tile.
struct slot_entry {
  int off, raw; // off -1: no key; dense: the in-page offset and the block-table entry; sparse: the index
};
template <int TB = BN, int BS = 0>
__device__ __forceinline__ slot_entry slot_fetch(const params &p, int r, int qi, int nkeys, int tile, int n) {
  const int k = tile * TB + n;
  if (k >= nkeys) return {-1, -1};
  if (!p.sparse) {
    const int blk = div_block<BS>(k, p.d.block_size);
    if (blk >= p.max_blocks) return {-1, -1};
    return {k - blk * p.d.block_size, __ldg(p.block_table + (int64_t)r * p.max_blocks + blk)};
  }
  return {0, __ldg(p.indices + ((int64_t)r * p.s_q + qi) * p.topk + k)};
}
template <int BS = 0> __device__ __forceinline__ void slot_resolve(const params &p, slot_entry e, int &page, int &off) {
  const int bs = p.d.block_size;
  page = -1, off = 0;
  if (e.off < 0 || e.raw < 0) return;
  if (!p.sparse) {
    if (e.raw >= p.v.num_pages) return;
    page = e.raw, off = e.off;
  } else {
    if ((int64_t)e.raw >= p.v.num_pages * bs) return;
    page = div_block<BS>(e.raw, bs), off = e.raw - page * bs;
  }
}
// Both steps at once.
template <int TB = BN, int BS = 0>
__device__ __forceinline__ void token_of(const params &p, int r, int qi, int nkeys, int tile, int n, int &page, int &off) {
  slot_resolve<BS>(p, slot_fetch<TB, BS>(p, r, qi, nkeys, tile, n), page, off);
}

// Query index and head of row rho of a problem.
__device__ __forceinline__ void row_coords(const params &p, int qi, int rho, int &i, int &h) {
  if (p.sparse) i = qi, h = rho;
  else i = rho / p.h_q, h = rho - (rho / p.h_q) * p.h_q;
}

// Dims [8c, 8c + 8) of query (r, i, h) as 8 bf16: one 16-byte load, or 8 strided ones.
__device__ __forceinline__ uint4 load_q8(const params &p, int r, int i, int h, int c) {
  const uint16_t *src = p.q + (int64_t)r * p.qs0 + (int64_t)i * p.qs1 + (int64_t)h * p.qs2 + (int64_t)c * 8 * p.qs3;
  if (p.q_vec) return __ldg(reinterpret_cast<const uint4 *>(src));
  uint16_t e[8];
#pragma unroll
  for (int k = 0; k < 8; k++) e[k] = __ldg(src + k * p.qs3);
  return make_uint4(e[0] | (uint32_t)e[1] << 16, e[2] | (uint32_t)e[3] << 16, e[4] | (uint32_t)e[5] << 16,
                    e[6] | (uint32_t)e[7] << 16);
}

} // namespace mla_attn

#endif
