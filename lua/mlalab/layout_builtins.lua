--- The built-in MLA cache formats, as plain descriptions for
-- mla.layout.define. Byte maps and formulas: ../shared/reference/kv-formats.md
-- (sections in brackets below). Adding a format is adding a table here (or
-- calling mla.layout.define anywhere): no C change.
local FLT_MIN = 2 ^ -126

local function fp8_ds_mla(name, policy, eps, doc)
  return {
    name = name,
    doc = doc,
    upstream = "FlashMLA V32 (tests/quant.py V32_FP8Sparse); vLLM fp8_ds_mla; sglang FP8_NOPE_WITH_BLOCK_SCALE_BF16_ROPE",
    fields = {
      { "nope", "e4m3", 512, scale = { dtype = "f32", group = 128, policy = policy, eps = eps } },
      { "rope", "bf16", 64 },
    },
    v_dims = 512,
    token_align = 16, -- SM90 reads the 4 scales with one 16-byte load
    page_align = 16,
  }
end

local function fp8_v4(name, eps_on, doc)
  return {
    name = name,
    doc = doc,
    upstream = "FlashMLA MODEL1/V4 (tests/quant.py MODEL1_FP8Sparse); vLLM DeepSeek V4 cache",
    fields = {
      { "nope", "e4m3", 448, scale = { dtype = "ue8m0", group = 64, policy = "pow2", eps = 1e-4, eps_on = eps_on } },
      { "rope", "bf16", 64 },
    },
    regions = {
      { name = "data", row = { "nope", "rope" } },
      { name = "scales", row = { "nope.scale", { pad = 1 } } },
    },
    token_align = 16,
    page_align = 576, -- SM100 TMA row size: pages padded to a multiple of 576 B
  }
end

local function indexer(name, policy, doc)
  return {
    name = name,
    doc = doc,
    upstream = "vLLM / sglang DSA indexer K cache",
    fields = { { "key", "e4m3", 128, scale = { dtype = "f32", group = 128, policy = policy, eps = 1e-4, eps_on = "amax" } } },
    regions = { { name = "data", row = { "key" } }, { name = "scales", row = { "key.scale" } } },
    v_dims = 0,
    token_align = 4, -- page stride B*132 for every block size, as vLLM allocates it
    page_align = 4,
  }
end

return {
  {
    name = "bf16",
    doc = "BF16 latent + RoPE, 1152 B/token, no scales [3.1]",
    upstream = "vLLM auto/bfloat16; sglang BF16; FlashMLA dense decode",
    fields = { { "nope", "bf16", 512 }, { "rope", "bf16", 64 } },
    v_dims = 512,
    token_align = 16,
  },
  {
    name = "fp8_pertensor",
    doc = "e4m3 latent + e4m3 RoPE, 576 B/token, one f32 scale per tensor: q = e4m3(x / s_t) [3.2]",
    upstream = "vLLM fp8/fp8_e4m3 (trtllm-style); sglang FP8_NOPE_FP8_ROPE",
    fields = { { "nope", "e4m3", 512, scale = "tensor" }, { "rope", "e4m3", 64, scale = "tensor" } },
    v_dims = 512,
    token_align = 16,
  },
  fp8_ds_mla("fp8_ds_mla", "pow2", 1e-4,
    "FlashMLA V3.2, 656 B/token: 512 e4m3, 4 f32 scales 2^ceil(log2(max(a/448, 1e-4))) per 128, 64 bf16 RoPE [3.3]"),
  fp8_ds_mla("fp8_ds_mla_amax", "amax", FLT_MIN,
    "V3.2 bytes with raw f32 scales max(a/448, FLT_MIN) (vLLM's writer before #49435, FlashMLA before #150) [3.3]"),
  {
    name = "fp8_ds_mla_blocked",
    doc = "FlashMLA V3.2 dense page-blocked, 656 B/token: a page holds NoPE as [32][B][16 B] e4m3, f32 scales [4][B] (as fp8_ds_mla's), then RoPE [B][64] bf16 [3.5]",
    upstream = "FlashMLA V32_FP8 dense page-blocked cache (PR #221)",
    fields = {
      { "nope", "e4m3", 512, scale = { dtype = "f32", group = 128, policy = "pow2", eps = 1e-4 } },
      { "rope", "bf16", 64 },
    },
    regions = {
      { name = "nope", row = { "nope" }, chunk = 16 },
      { name = "scales", row = { "nope.scale" }, chunk = 4 },
      { name = "rope", row = { "rope" } },
    },
    v_dims = 512,
    token_align = 16,
    page_align = 16,
  },
  fp8_v4("fp8_v4", "scale",
    "DeepSeek V4, 584 B/token page-split: rows of 448 e4m3 + 64 bf16 RoPE, then 7 ue8m0 scales per 64 + 1 zero byte; pages padded to 576 B multiples [3.4]"),
  fp8_v4("fp8_v4_vllm", "amax",
    "V4 bytes with vLLM's eps placement: 2^ceil(log2(max(a, 1e-4)/448)) (all-zero tile 2^-22) [3.4]"),
  indexer("indexer_fp8", "amax", "DSA indexer key, 132 B/token page-split: 128 e4m3, then f32 scale max(a, 1e-4)/448 [3.6]"),
  indexer("indexer_fp8_ue8m0", "pow2", "DSA indexer key with the ue8m0 option: f32 scale 2^ceil(log2(max(a, 1e-4)/448)) [3.6]"),
  {
    name = "fp4_v41",
    doc = "FlashMLA V4.1 FP4, 288 B/token page-split: 512 e2m1 (even dim low nibble), then e4m3 scales clamp(a/6, 2^-9, 448) per 16 [3.5]",
    upstream = "FlashMLA V41_FP4 (PR #221)",
    fields = { { "kv", "e2m1", 512, scale = { dtype = "e4m3", group = 16, policy = "amax", min = 2 ^ -9, max = 448 } } },
    regions = { { name = "data", row = { "kv" } }, { name = "scales", row = { "kv.scale" } } },
    token_align = 16,
    page_align = 512,
  },
  {
    name = "fp8_v41",
    doc = "FlashMLA V4.1 MXFP8, 528 B/token page-split: 512 e4m3 (RoPE quantized too), then 16 ue8m0 scales per 32; written with V4's rule 2^ceil(log2(max(a/448, 1e-4))) [3.5]",
    upstream = "FlashMLA V41 (PR #221); the reference gives its reading rule only, the writer follows FlashMLA's V4 quantizer",
    fields = { { "kv", "e4m3", 512, scale = { dtype = "ue8m0", group = 32, policy = "pow2", eps = 1e-4, eps_on = "scale" } } },
    regions = { { name = "data", row = { "kv" } }, { name = "scales", row = { "kv.scale" } } },
    token_align = 16,
    page_align = 512,
  },
}
