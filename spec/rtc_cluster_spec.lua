-- JIT kernels launched in thread block clusters (kernel:launch{cluster = ...}) and the
-- cluster helpers of kernels_rtc/include/mla/cluster.cuh.
local mla = require "mlalab"
local S = require "support"

local core = mla.core
local E = S.assert_error_contains

describe("cluster shapes", function()
  it("a cluster must divide the grid on every axis and hold at most 8 CTAs", function()
    assert.is_true(core.rtc_check_cluster { grid = { 8, 3 }, cluster = { 2, 1, 1 } })
    assert.is_true(core.rtc_check_cluster { grid = 16, cluster = 8 })
    assert.is_true(core.rtc_check_cluster { grid = { 4, 6, 2 }, cluster = { 2, 3, 1 } })
    E(function() core.rtc_check_cluster { grid = { 7, 1 }, cluster = 2, kernel = "k" } end,
      "kernel k: cluster.x = 2 does not divide grid.x = 7")
    E(function() core.rtc_check_cluster { grid = { 4, 6, 3 }, cluster = { 1, 3, 2 } } end,
      "cluster.z = 2 does not divide grid.z = 3")
    E(function() core.rtc_check_cluster { grid = 32, cluster = 16, kernel = "k" } end,
      "kernel k: a cluster of 16 CTAs exceeds the portable size of 8")
    E(function() core.rtc_check_cluster { grid = 4, cluster = { 2, 0 } } end, "launch: cluster[2] must be a positive integer")
    E(function() core.rtc_check_cluster { grid = 4, cluster = "2" } end, "launch: cluster must be a number or {x, y, z}, got a string")
  end)
end)

-- Two CTAs a cluster run a ring of two tile buffers, as a producer that converts half of each tile
-- for both CTAs would: for each tile, CTA r stores its half (one 16-byte element a thread) into its
-- own buffer with plain stores, counted by its "local" mbarrier (an arrival a thread), and into the
-- peer's with st_async16, counted in bytes on the peer's "remote" mbarrier; each CTA waits for both,
-- copies the tile out, and releases the buffer to both CTAs through their "avail" mbarriers. Every
-- CTA must see every tile whole and in order.
local SRC = [[
#include "mla/cluster.cuh"
extern "C" __global__ void cluster_ring(const uint4 *in, uint4 *out, int tiles) {
  constexpr int H = 128; // threads a CTA, elements a half tile
  __shared__ alignas(16) uint4 buf[2][2 * H];
  __shared__ alignas(8) unsigned long long local_full[2], remote_full[2], avail[2];
  const unsigned rank = mla::cluster_rank(), other = rank ^ 1u, cid = blockIdx.x / 2;
  const int i = threadIdx.x;
  auto sm = [](const void *p) { return (uint32_t)__cvta_generic_to_shared(p); };
  if (i == 0) {
    for (int b = 0; b < 2; b++)
      mla::mbar_init(sm(&local_full[b]), H), mla::mbar_init(sm(&remote_full[b]), 1), mla::mbar_init(sm(&avail[b]), 2);
    mla::mbar_init_fence();
  }
  mla::cluster_sync();
  for (int t = 0; t < tiles; t++) {
    const int b = t & 1;
    const unsigned ph = (t >> 1) & 1;
    const uint32_t lb = sm(&local_full[b]), rb = sm(&remote_full[b]), ab = sm(&avail[b]);
    if (t >= 2) mla::mbar_wait(ab, ph ^ 1u); // both CTAs done with tile t - 2
    if (i == 0) mla::mbar_arrive_expect_tx(rb, H * 16); // the peer's half of this CTA's copy
    const uint4 v = in[((size_t)cid * tiles + t) * 2 * H + rank * H + i];
    buf[b][rank * H + i] = v;
    mla::st_async16(mla::peer_smem(sm(&buf[b][rank * H + i]), other), v, mla::peer_smem(rb, other));
    mla::mbar_arrive(lb);
    mla::mbar_wait(lb, ph);
    mla::mbar_wait(rb, ph);
    for (int k = i; k < 2 * H; k += H) out[(((size_t)cid * 2 + rank) * tiles + t) * 2 * H + k] = buf[b][k];
    __syncthreads();
    if (i == 0) mla::mbar_arrive(ab), mla::mbar_arrive_cluster(mla::peer_smem(ab, other));
  }
  mla::cluster_sync(); // no CTA leaves while a peer may still store into it
}
]]

describe("the cluster helpers", function()
  it("compile for sm_90a and, trapping, for older targets", function()
    for _, arch in ipairs { "sm_90a", "sm_80" } do
      local mod = mla.rtc.compile { source = SRC, name = "cluster_ring.cu", arch = arch }
      assert.truthy(mod, arch)
    end
  end)
end)

describe("clusters on the GPU #gpu", function()
  it("two CTAs a cluster share tiles through st.async and mbarriers, every tile whole and in order", function()
    local mod = mla.rtc.compile { source = SRC, name = "cluster_ring.cu" }
    local k = mod:kernel("cluster_ring")
    local clusters, tiles, H = 6, 9, 128
    local input = mla.random_bytes({ clusters, tiles, 2 * H * 16 }, { device = "cuda" })
    local out = mla.random_bytes({ clusters, 2, tiles, 2 * H * 16 }, { device = "cuda" }) -- poison
    k:launch { grid = 2 * clusters, block = H, cluster = { 2, 1, 1 }, args = { input, out, tiles } }
    mla.synchronize()
    local want, got = input:cpu(), out:cpu()
    for c = 0, clusters - 1 do
      for r = 0, 1 do
        S.assert_bytes(got:select(0, c):select(0, r):contiguous(), want:select(0, c):contiguous(),
          string.format("cluster %d, CTA %d", c, r))
      end
    end
  end)

  it("a cluster that does not divide the grid is refused before the launch, naming the kernel", function()
    local mod = mla.rtc.compile { source = SRC, name = "cluster_ring.cu" }
    local k = mod:kernel("cluster_ring")
    local buf = mla.zeros({ 16 }, "u8", "cuda")
    E(function() k:launch { grid = 3, block = 128, cluster = 2, args = { buf, buf, 0 } } end,
      "kernel cluster_ring: cluster.x = 2 does not divide grid.x = 3")
    E(function() k:time_raw_launches(1, { grid = 2, block = 128, cluster = 2, device = "cuda" }) end,
      "raw launches are plain cudaLaunchKernel calls, without a cluster")
  end)
end)
