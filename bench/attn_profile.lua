--- Launches one decode case a few times, for Nsight Compute:
--   ncu --kernel-name regex:attn_decode_kernel --launch-skip 2 --launch-count 1 --section ... \
--       mlalab bench/attn_profile.lua <case> [launches]
-- Cases: the names of bench/attn_bench.lua's shapes below.
local mla = require "mlalab"
local C = require "mlalab.attention_cases"
local AB = require "mlalab.attention_bench"

-- A third argument "generic" forces the generic kernel (specialize = false).
local cases = {
  fp8_v4_h16 = { kind = "dense", layout = "fp8_v4", b = 128, s_q = 1, h_q = 16, len = 4096 },
  fp8pt_h16 = { kind = "dense", layout = "fp8_pertensor", b = 128, s_q = 1, h_q = 16, len = 4096 },
  bf16_h16 = { kind = "dense", layout = "bf16", b = 128, s_q = 1, h_q = 16, len = 4096 },
  fp8_h16 = { kind = "dense", layout = "fp8_ds_mla", b = 128, s_q = 1, h_q = 16, len = 4096 },
  bf16_h128 = { kind = "dense", layout = "bf16", b = 128, s_q = 1, h_q = 128, len = 4096 },
  fp8_h128 = { kind = "dense", layout = "fp8_ds_mla", b = 128, s_q = 1, h_q = 128, len = 4096 },
  fp8_v4_h128 = { kind = "dense", layout = "fp8_v4", b = 128, s_q = 1, h_q = 128, len = 4096 },
  fp8pt_h128 = { kind = "dense", layout = "fp8_pertensor", b = 128, s_q = 1, h_q = 128, len = 4096 },
  sparse_fp8 = { kind = "sparse", layout = "fp8_ds_mla", b = 128, s_q = 2, h_q = 128, topk = 2048, pool = 131072 },
  sparse_v4 = { kind = "sparse", layout = "fp8_v4", b = 128, s_q = 2, h_q = 128, topk = 2048, pool = 131072 },
}
local name, n, mode = ..., tonumber(select(2, ...) or "3"), select(3, ...)
local p = cases[name] or error("attn_profile: case must be one of bf16_h16, fp8_h16, fp8_v4_h16, fp8pt_h16, bf16_h128, fp8_h128, fp8_v4_h128, fp8pt_h128, sparse_fp8, sparse_v4")
local case = AB.case(p)
local a = mla.attention.prepare(C.args(case, { impl = "baked", check = false, specialize = mode ~= "generic" }))
for _ = 1, n do mla.core.attn_decode(a) end
mla.synchronize()
print(name, "launched", n, "variant", mla.attention.last_variant())
