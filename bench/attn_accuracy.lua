-- Accuracy probe of the baked decode kernels: the sparse case of the spec "sparse decode on every MLA layout"
-- (h_q 64, topk 192 with -1 holes, an all -1 row, topk_len) on three seeds per layout, each result compared
-- with the double-precision reference (rounded to bf16) and the specialized kernel with the generic one:
-- FlashMLA's comparator's cosine difference and max abs error. Then the lse of a query with one key (its
-- score, so any rounding of K shows in full): causal MTP (s_q 2 x h_q 64) with a request of one key, every
-- fp8 built-in, both kernels against FlashMLA's lse bound. Run on a GPU: mlalab bench/attn_accuracy.lua
local mla = require "mlalab"
local C = require "mlalab.attention_cases"
mla.set_device("cuda")
local LAYOUTS = { "bf16", "fp8_pertensor", "fp8_ds_mla", "fp8_ds_mla_amax", "fp8_v4", "fp8_v4_vllm", "fp4_v41", "fp8_v41" }
local function f32(t) return t:to({ dtype = "f32", device = "cpu" }) end
-- out, lse, plan of `impl` ("ref" or "baked", specialize = spec) on a case
local function decode(case, opts, impl, spec)
  local a = C.args(case, opts)
  a.impl, a.specialize = impl, spec
  return mla.attention.decode(a)
end
for k, name in ipairs(LAYOUTS) do
  for _, seed in ipairs { 200 + k, 300 + k, 400 + k } do
    mla.manual_seed(seed)
    local case = C.sparse { layout = name, b = 3, s_q = 2, h_q = 64, topk = 192, pool = 700, invalid = 0.2,
      empty_rows = { { 1, 1 } }, topk_len = { 192, 77, 130 }, block_size = 64 }
    local opts = { scale = case.layout.k_dims ^ -0.55 }
    local ro = decode(case, opts, "ref")
    local want = ro:to("bf16"):to("f32")
    local line = string.format("%-16s seed %d", name, seed)
    local outs = {}
    for _, spec in ipairs { true, false } do
      local out, _, plan = decode(case, opts, "baked", spec)
      outs[#outs + 1] = f32(out)
      local r = mla.compare(outs[#outs], want, { preset = "flashmla_sparse_decode" })
      line = line .. string.format("  %s: cos %.3g abs %.3g", plan.variant, r.cos_diff, r.max_abs)
    end
    local r = mla.compare(outs[1], outs[2], { preset = "flashmla_sparse_decode" })
    print(line .. string.format("  spec vs generic: cos %.3g abs %.3g", r.cos_diff, r.max_abs))
  end
end

print("single-key lse (causal MTP, s_k = 1: query 1 attends one key), max |lse - reference|, FlashMLA's lse bound")
for k, name in ipairs { "fp8_pertensor", "fp8_ds_mla", "fp8_ds_mla_amax", "fp8_v4", "fp8_v4_vllm" } do
  for seed = 1, 3 do
    mla.manual_seed(2000 + 10 * k + seed)
    local case = C.dense { layout = name, b = 3, s_q = 2, h_q = 64, lens = { 700, 1, 130 }, tensor_scale = 2.0 }
    local _, rl = decode(case, {}, "ref")
    local line = string.format("%-16s seed %d", name, seed)
    for _, spec in ipairs { true, false } do
      local _, lse, plan = decode(case, {}, "baked", spec)
      local r = mla.compare(f32(lse), f32(rl), { preset = "flashmla_lse" })
      line = line .. string.format("  %s: max abs %.3g %s", plan.variant, r.max_abs, r.ok and "within" or "OUTSIDE")
    end
    print(line)
  end
end
