/* Hopper warpgroup MMA (wgmma, sm_90a only) on bf16 operands in shared
 * memory, fp32 accumulators in registers. Operand tiles use the 128-byte
 * swizzle: a tile of R rows is stored as 64-element column blocks of R x 128
 * bytes; the 16-byte chunk c (of 8) of row r sits at r * 128 + ((c ^ r % 8) * 16)
 * of its block, and blocks start 1024-byte aligned. The same bytes serve as a
 * K-major operand (rows = M or N, 64 K values per block row) and as an
 * MN-major one (rows = K, 64 M or N values per block row), which is how one
 * K tile feeds both S = Q K^T and O = P V.
 * Accumulator layout of m64nNk16 (g = lane / 4, t = lane % 4, w = warp of the
 * warpgroup): d[4j + e] is row 16w + g + 8 (e / 2), column 8j + 2t + e % 2. */
#ifndef MLA_WGMMA_CUH
#define MLA_WGMMA_CUH

#include "platform.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MLA_HAVE_WGMMA 1
#else
#define MLA_HAVE_WGMMA 0
#endif

namespace mla {

/* Byte offset of 16-byte chunk c of row r in a swizzled tile of `rows` rows. */
__host__ __device__ __forceinline__ int sw128_off(int rows, int r, int c) {
  return (c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}

/* Shared-memory matrix descriptor, 128-byte swizzle. lbo: byte stride between
 * 64-element blocks along M/N (MN-major operands; unused for K-major);
 * sbo: byte stride between groups of 8 rows (1024 for 8 x 128-byte rows). */
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((saddr & 0x3FFFF) >> 4) | (uint64_t)((lbo & 0x3FFFF) >> 4) << 16 |
         (uint64_t)((sbo & 0x3FFFF) >> 4) << 32 | (uint64_t)1 << 62;
}

/* A descriptor kept as its two words. The start-address field (bits 0-13 of
 * the low word) holds addr >> 4 and shared addresses stay below 2^18, so the
 * descriptor of base + off is the base's low word plus off >> 4, with no
 * carry: a loop adds compile-time offsets to one base built before it
 * instead of masking, shifting and moving each descriptor to uniform
 * registers before every wgmma (about seven instructions a wgmma in the
 * 16-row decode kernels, measured with ncu). Build the base from warp-uniform
 * values (a warpgroup index broadcast with __shfl_sync) so that it lives in
 * uniform registers. */
struct wgmma_sdesc {
  uint32_t lo, hi;
  // byte_off: a multiple of 16, and base + byte_off still a shared address
  __device__ __forceinline__ wgmma_sdesc operator+(uint32_t byte_off) const { return {lo + (byte_off >> 4), hi}; }
  __device__ __forceinline__ operator uint64_t() const { return (uint64_t)hi << 32 | lo; }
  // The same descriptor, opaque to the compiler at this point: called in a
  // loop, it keeps the descriptors derived from it from being hoisted out
  // of the loop and held (or spilled) in registers, one per wgmma.
  __device__ __forceinline__ wgmma_sdesc fresh() const {
    uint32_t l = lo;
    asm volatile("" : "+r"(l));
    return {l, hi};
  }
};
__device__ __forceinline__ wgmma_sdesc wgmma_sdesc_of(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  const uint64_t d = wgmma_desc(saddr, lbo, sbo);
  return {(uint32_t)d, (uint32_t)(d >> 32)};
}

__device__ __forceinline__ void wgmma_fence() {
#if MLA_HAVE_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if MLA_HAVE_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void wgmma_wait() {
#if MLA_HAVE_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
/* Shared-memory writes of this thread (st.shared, cp.async once waited for)
 * become visible to the async proxy wgmma reads through; follow with a barrier. */
__device__ __forceinline__ void fence_proxy_async() {
#if MLA_HAVE_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
/* Pins accumulator registers at this point of the program: after a wait, no
 * read of them moves above it; before an mma, every write lands first. */
template <int N> __device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* Four 8x8 b16 matrices from a warp's registers (an m16n8k16 A fragment's
 * a0..a3) into shared memory: lane l gives the address of row l % 8 of
 * matrix l / 8, a 16-byte row. sm_90 and later. */
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3) {
#if MLA_HAVE_WGMMA
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a0), "r"(a1), "r"(a2), "r"(a3) : "memory");
#endif
}

/* The same, each matrix stored transposed (the lane's address is a row of
 * the stored matrix, i.e. a column of the fragment's). */
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3) {
#if MLA_HAVE_WGMMA
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a0), "r"(a1), "r"(a2), "r"(a3) : "memory");
#endif
}

/* An L2 prefetch (a hint: nothing waits on it) of `bytes` (a multiple of 16)
 * from a 16-byte aligned address, one instruction. */
__device__ __forceinline__ void prefetch_l2_bulk(const void *src, uint32_t bytes) {
#if MLA_HAVE_WGMMA
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
#endif
}

/* Named barriers (id 1..15; 0 is __syncthreads): bar_sync waits until n
 * threads have arrived, bar_arrive counts this thread without waiting. */
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

/* Accumulator operand lists: "{%0, ..., %N-1}" and the matching "+f" constraints. */
#define MLA_WGMMA_D16 "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" "}"
#define MLA_WGMMA_D32 "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" "}"
#define MLA_WGMMA_D128 "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" "}"
#define MLA_WGMMA_D96 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}"
#define MLA_WGMMA_F8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define MLA_WGMMA_F32(d, i) MLA_WGMMA_F8(d, i), MLA_WGMMA_F8(d, i + 8), MLA_WGMMA_F8(d, i + 16), MLA_WGMMA_F8(d, i + 24)
#define MLA_WGMMA_F128(d) MLA_WGMMA_F32(d, 0), MLA_WGMMA_F32(d, 32), MLA_WGMMA_F32(d, 64), MLA_WGMMA_F32(d, 96)
/* scale-d as a predicate from register operand N */
#define MLA_WGMMA_PRED(n) "{\n.reg .pred p;\nsetp.ne.b32 p, %" #n ", 0;\n"

/* Keys on M (the 16-row decode kernel): d (64 x 16) += A (64 x 16) B (16 x 16),
 * B K-major, A K-major (TA = 0) or MN-major (TA = 1); f16 or bf16 operands. */
#define MLA_WGMMA_D8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
template <bool F16, int TA> __device__ __forceinline__ void wgmma_m64n16k16(float (&d)[8], uint64_t da, uint64_t db, int scale_d) {
#if MLA_HAVE_WGMMA
  if constexpr (F16)
    asm volatile(MLA_WGMMA_PRED(10) "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 " MLA_WGMMA_D8 ", %8, %9, p, 1, 1, %11, 0;\n}\n"
                 : MLA_WGMMA_F8(d, 0)
                 : "l"(da), "l"(db), "r"(scale_d), "n"(TA));
  else
    asm volatile(MLA_WGMMA_PRED(10) "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 " MLA_WGMMA_D8 ", %8, %9, p, 1, 1, %11, 0;\n}\n"
                 : MLA_WGMMA_F8(d, 0)
                 : "l"(da), "l"(db), "r"(scale_d), "n"(TA));
#else
  __trap();
#endif
}

/* The same with A in registers (the m16n8k16 A fragment of the warp's 16
 * rows: a0 (g, 2t..2t+1), a1 (g + 8, 2t..), a2 (g, 2t + 8..), a3 (g + 8, 2t + 8..)),
 * B K-major in shared memory. A's registers stay untouched until the wait. */
template <bool F16>
__device__ __forceinline__ void wgmma_m64n16k16_rs(float (&d)[8], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t db, int scale_d) {
#if MLA_HAVE_WGMMA
  if constexpr (F16)
    asm volatile(MLA_WGMMA_PRED(13) "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 " MLA_WGMMA_D8 ", {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
                 : MLA_WGMMA_F8(d, 0)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(scale_d));
  else
    asm volatile(MLA_WGMMA_PRED(13) "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 " MLA_WGMMA_D8 ", {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
                 : MLA_WGMMA_F8(d, 0)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(scale_d));
#else
  __trap();
#endif
}

/* d += A (64 x 16) B (16 x 32), both K-major; scale_d = 0 overwrites d. */
__device__ __forceinline__ void wgmma_m64n32k16_bf16(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
#if MLA_HAVE_WGMMA
  asm volatile(MLA_WGMMA_PRED(18) "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " MLA_WGMMA_D16 ", " "%16, %17, p, 1, 1, 0, 0;\n}\n"
               : MLA_WGMMA_F8(d, 0), MLA_WGMMA_F8(d, 8)
               : "l"(da), "l"(db), "r"(scale_d));
#else
  __trap();
#endif
}

/* d += A (64 x 16) B (16 x 64), both K-major; scale_d = 0 overwrites d. */
__device__ __forceinline__ void wgmma_m64n64k16_bf16(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
#if MLA_HAVE_WGMMA
  asm volatile(MLA_WGMMA_PRED(34) "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " MLA_WGMMA_D32 ", " "%32, %33, p, 1, 1, 0, 0;\n}\n"
               : MLA_WGMMA_F32(d, 0)
               : "l"(da), "l"(db), "r"(scale_d));
#else
  __trap();
#endif
}

/* The same on f16 operands. */
__device__ __forceinline__ void wgmma_m64n64k16_f16(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
#if MLA_HAVE_WGMMA
  asm volatile(MLA_WGMMA_PRED(34) "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " MLA_WGMMA_D32 ", " "%32, %33, p, 1, 1, 0, 0;\n}\n"
               : MLA_WGMMA_F32(d, 0)
               : "l"(da), "l"(db), "r"(scale_d));
#else
  __trap();
#endif
}

/* d += A (64 x 16, K-major) B (16 x 256, MN-major); scale_d = 0 overwrites d. */
__device__ __forceinline__ void wgmma_m64n256k16_bf16_tb(float (&d)[128], uint64_t da, uint64_t db, int scale_d) {
#if MLA_HAVE_WGMMA
  asm volatile(MLA_WGMMA_PRED(130) "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " MLA_WGMMA_D128 ", " "%128, %129, p, 1, 1, 0, 1;\n}\n"
               : MLA_WGMMA_F128(d)
               : "l"(da), "l"(db), "r"(scale_d));
#else
  __trap();
#endif
}

/* The same on f16 operands. */
__device__ __forceinline__ void wgmma_m64n256k16_f16_tb(float (&d)[128], uint64_t da, uint64_t db, int scale_d) {
#if MLA_HAVE_WGMMA
  asm volatile(MLA_WGMMA_PRED(130) "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " MLA_WGMMA_D128 ", " "%128, %129, p, 1, 1, 0, 1;\n}\n"
               : MLA_WGMMA_F128(d)
               : "l"(da), "l"(db), "r"(scale_d));
#else
  __trap();
#endif
}

/* Slices of a 64 x 256 accumulator (d[OFF, OFF + N / 2) holds columns
 * [OFF * 2, OFF * 2 + N)), for value dims whose operand type changes:
 * d += A (64 x 16, K-major) B (16 x N, MN-major). */
template <int OFF> __device__ __forceinline__ void wgmma_m64n192k16_f16_tb(float (&d)[128], uint64_t da, uint64_t db, int scale_d) {
#if MLA_HAVE_WGMMA
  asm volatile(MLA_WGMMA_PRED(98) "wgmma.mma_async.sync.aligned.m64n192k16.f32.f16.f16 " MLA_WGMMA_D96 ", " "%96, %97, p, 1, 1, 0, 1;\n}\n"
               : MLA_WGMMA_F32(d, OFF), MLA_WGMMA_F32(d, OFF + 32), MLA_WGMMA_F32(d, OFF + 64)
               : "l"(da), "l"(db), "r"(scale_d));
#else
  __trap();
#endif
}
template <int OFF> __device__ __forceinline__ void wgmma_m64n64k16_bf16_tb(float (&d)[128], uint64_t da, uint64_t db, int scale_d) {
#if MLA_HAVE_WGMMA
  asm volatile(MLA_WGMMA_PRED(34) "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " MLA_WGMMA_D32 ", " "%32, %33, p, 1, 1, 0, 1;\n}\n"
               : MLA_WGMMA_F32(d, OFF)
               : "l"(da), "l"(db), "r"(scale_d));
#else
  __trap();
#endif
}

} // namespace mla

#endif
