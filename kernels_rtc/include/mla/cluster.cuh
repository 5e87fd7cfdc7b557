/* Thread block clusters (sm_90+): a CTA's rank, the cluster barrier,
 * addresses in a peer CTA's shared memory, mbarriers with byte counts, and
 * 16-byte asynchronous stores into a peer's shared memory that complete on
 * the peer's mbarrier (what lets two CTAs of a cluster each convert half of a
 * tile and both read all of it). Shared-memory addresses are 32-bit
 * (__cvta_generic_to_shared). Launch with kernel:launch{..., cluster = {2, 1, 1}}.
 * Below sm_90 MLA_HAVE_CLUSTER is 0 and the helpers trap. */
#ifndef MLA_CLUSTER_CUH
#define MLA_CLUSTER_CUH

#include "platform.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MLA_HAVE_CLUSTER 1
#else
#define MLA_HAVE_CLUSTER 0
#endif

namespace mla {

#if MLA_HAVE_CLUSTER
#define MLA_CLUSTER_ASM(...) asm volatile(__VA_ARGS__)
#else
#define MLA_CLUSTER_ASM(...) __trap()
#endif

/* This CTA's rank in its cluster, and the cluster's CTA count. */
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r = 0;
  MLA_CLUSTER_ASM("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_size() {
  unsigned n = 1;
  MLA_CLUSTER_ASM("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return n;
}

/* Every thread of every CTA of the cluster: release this CTA's prior shared
 * memory writes, acquire the others'. */
__device__ __forceinline__ void cluster_sync() {
  MLA_CLUSTER_ASM("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

/* The address of the same shared-memory location in CTA `rank` of the cluster. */
__device__ __forceinline__ uint32_t peer_smem(uint32_t addr, unsigned rank) {
  uint32_t r = addr;
  MLA_CLUSTER_ASM("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}

/* An mbarrier (8 bytes, 8-byte aligned) expecting `count` arrivals a phase;
 * the fence makes the initialization visible to the cluster's async proxy. */
__device__ __forceinline__ void mbar_init(uint32_t bar, unsigned count) {
  MLA_CLUSTER_ASM("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
  MLA_CLUSTER_ASM("fence.mbarrier_init.release.cluster;" ::: "memory");
}
/* One arrival on this CTA's barrier that also expects `bytes` of asynchronous
 * stores (st_async16) before the phase completes. */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, unsigned bytes) {
  MLA_CLUSTER_ASM("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
/* One plain arrival on this CTA's barrier (after this thread's shared-memory
 * stores and, for the tensor cores, fence_proxy_async). */
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  MLA_CLUSTER_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* One arrival on a barrier anywhere in the cluster (bar from peer_smem): says
 * "done reading a buffer". The default (.release.cta) semantics: the cluster
 * scope would add a GPU-wide fence (ERRBAR) to every arrival. */
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar) {
  MLA_CLUSTER_ASM("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* Waits until the phase of parity `phase` of this CTA's barrier completed.
 * Bytes that st_async16 counted on the barrier are visible once the phase
 * completes, so the default (.acquire.cta) semantics suffice; the cluster
 * scope would invalidate L1 (CCTL.IVALL) on every poll. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, unsigned phase) {
#if MLA_HAVE_CLUSTER
  asm volatile("{\n\t.reg .pred done;\n"
               "wait_%=:\n\t"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
               "@!done bra wait_%=;\n}" ::"r"(bar),
               "r"(phase)
               : "memory");
#else
  __trap();
#endif
}

/* 16 bytes into shared memory of a CTA of the cluster (addr, bar from
 * peer_smem): completes `16` bytes of the transaction count of that CTA's
 * mbarrier `bar`. */
__device__ __forceinline__ void st_async16(uint32_t addr, uint4 v, uint32_t bar) {
  MLA_CLUSTER_ASM("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(addr),
                  "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar)
                  : "memory");
}

/* 4 bytes, likewise (complete 4 bytes of the transaction count). */
__device__ __forceinline__ void st_async4(uint32_t addr, uint32_t v, uint32_t bar) {
  MLA_CLUSTER_ASM("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(addr), "r"(v), "r"(bar) : "memory");
}

#undef MLA_CLUSTER_ASM

} // namespace mla

#endif
