--- An independent model of the upstream quantizers, for the layout specs:
-- element encoders written from the format tables of kv-formats.md (not from
-- src/dtype.c), fp32 arithmetic emulated through string.pack (one rounding
-- per operation, as the hardware does), and one writer per built-in format
-- that follows the upstream code step by step (FlashMLA tests/quant.py for
-- V3.2 and V4, vLLM's eps placement, the indexer and V4.1 FP4 formulas),
-- producing the bytes of a token with the byte map written out by hand.
local M = {}

function M.f32(x) return (string.unpack("<f", string.pack("<f", x))) end
local f32 = M.f32
function M.f32_bits(x) return (string.unpack("<I4", string.pack("<f", x))) end

-- exact 2^ceil(log2 v) of a positive normal f32, from its bits
function M.pow2_ceil(v)
  local u = M.f32_bits(v)
  local e, m = (u >> 23) & 0xff, u & 0x7fffff
  return 2.0 ^ (e - 127 + (m ~= 0 and 1 or 0))
end

-- e4m3 codes 0..126 in increasing value: code c = (e << 3) | m
local E4M3 = {}
for c = 0, 126 do
  local e, m = c >> 3, c & 7
  E4M3[c] = e == 0 and m * 2.0 ^ -9 or (8 + m) * 2.0 ^ (e - 10)
end
function M.e4m3_value(b)
  local v = E4M3[b & 0x7f]
  if v == nil then return 0 / 0 end
  return (b & 0x80) ~= 0 and -v or v
end

-- nearest code, ties to the even code, saturating (inputs here stay <= 448)
local function nearest(table_, n, a)
  if a >= table_[n] then return n end
  local lo = 0
  while table_[lo + 1] <= a do lo = lo + 1 end
  local d0, d1 = a - table_[lo], table_[lo + 1] - a
  if d0 < d1 or (d0 == d1 and lo % 2 == 0) then return lo end
  return lo + 1
end

function M.e4m3(x)
  if x ~= x then return 0x7f end
  local neg = x < 0 or (x == 0 and 1 / x < 0)
  return nearest(E4M3, 126, math.abs(x)) | (neg and 0x80 or 0)
end

local E2M1 = { [0] = 0, 0.5, 1, 1.5, 2, 3, 4, 6 }
function M.e2m1_value(n) local v = E2M1[n & 7]; return (n & 8) ~= 0 and -v or v end
function M.e2m1(x)
  local neg = x < 0 or (x == 0 and 1 / x < 0)
  return nearest(E2M1, 7, math.abs(x)) | (neg and 8 or 0)
end

function M.bf16_bits(x)
  local u = M.f32_bits(x)
  return (u + 0x7fff + ((u >> 16) & 1)) >> 16
end
function M.bf16(x) return (string.unpack("<f", string.pack("<I4", M.bf16_bits(x) << 16))) end

local function amax(x, lo, n)
  local a = 0
  for i = lo, lo + n - 1 do a = math.max(a, math.abs(x[i])) end
  return a
end

local function bytes(t) return string.char(table.unpack(t)) end
local function e4m3_run(x, lo, n, s, out)
  for i = lo, lo + n - 1 do out[#out + 1] = M.e4m3(f32(x[i] / s)) end
end
local function bf16_run(x, lo, n, out)
  for i = lo, lo + n - 1 do
    local b = M.bf16_bits(x[i])
    out[#out + 1], out[#out + 2] = b & 0xff, b >> 8
  end
end
local function f32_le(v, out)
  local s = string.pack("<f", v)
  for i = 1, 4 do out[#out + 1] = s:byte(i) end
end

--- Per format: token(x) -> { [region] = row bytes } with x a 0-based array of
-- f32 values, opts.tensor_scale for the per-tensor format.
M.formats = {}

-- FlashMLA quant.py, V32_FP8Sparse: scale_inv = pow2(ceil(log2(clamp_min(amax / 448, 1e-4))))
local function v32_scale(a) return M.pow2_ceil(math.max(f32(a / 448), f32(1e-4))) end
M.formats.fp8_ds_mla = function(x)
  local q, sc = {}, {}
  for t = 0, 3 do
    local s = v32_scale(amax(x, 128 * t, 128))
    f32_le(s, sc)
    e4m3_run(x, 128 * t, 128, s, q)
  end
  for _, b in ipairs(sc) do q[#q + 1] = b end
  bf16_run(x, 512, 64, q)
  return { bytes(q) }
end

-- vLLM's raw f32 writer: max(amax / 448, FLT_MIN)
M.formats.fp8_ds_mla_amax = function(x)
  local q, sc = {}, {}
  for t = 0, 3 do
    local s = math.max(f32(amax(x, 128 * t, 128) / 448), 2.0 ^ -126)
    f32_le(s, sc)
    e4m3_run(x, 128 * t, 128, s, q)
  end
  for _, b in ipairs(sc) do q[#q + 1] = b end
  bf16_run(x, 512, 64, q)
  return { bytes(q) }
end

-- n groups of width dims from dim 0: e4m3 codes into q, each group's
-- power-of-two scale as its ue8m0 byte into sc
local function ue8m0_groups(x, n, width, scale_of, q, sc)
  for g = 0, n - 1 do
    local s = scale_of(amax(x, width * g, width))
    sc[#sc + 1] = math.floor(math.log(s, 2) + 0.5) + 127 -- s is a power of two
    e4m3_run(x, width * g, width, s, q)
  end
end

-- quant.py MODEL1_FP8Sparse: data row [448 e4m3 | 64 bf16], scale row [7 ue8m0 | pad]
local function v4(scale_of)
  return function(x)
    local q, sc = {}, {}
    ue8m0_groups(x, 7, 64, scale_of, q, sc)
    bf16_run(x, 448, 64, q)
    sc[8] = 0 -- vLLM writes the pad byte as 0
    return { bytes(q), bytes(sc) }
  end
end
M.formats.fp8_v4 = v4(v32_scale)
-- vLLM: e = ceil(log2(max(amax, 1e-4) / 448))
M.formats.fp8_v4_vllm = v4(function(a) return M.pow2_ceil(f32(math.max(a, f32(1e-4)) / 448)) end)

-- indexer: s = max(amax, 1e-4) / 448, ue8m0 option s = 2^ceil(log2 s), both stored as f32
local function indexer(pow2)
  return function(x)
    local s = f32(math.max(amax(x, 0, 128), f32(1e-4)) / 448)
    if pow2 then s = M.pow2_ceil(s) end
    local q, sc = {}, {}
    e4m3_run(x, 0, 128, s, q)
    f32_le(s, sc)
    return { bytes(q), bytes(sc) }
  end
end
M.formats.indexer_fp8 = indexer(false)
M.formats.indexer_fp8_ue8m0 = indexer(true)

-- V4.1 FP4: scale e4m3(clamp(amax / 6, 2^-9, 448)), codes e2m1(x / scale), even dim in the low nibble
M.formats.fp4_v41 = function(x)
  local q, sc = {}, {}
  for g = 0, 31 do
    local s = math.min(math.max(f32(amax(x, 16 * g, 16) / 6), 2.0 ^ -9), 448)
    local code = M.e4m3(s)
    sc[#sc + 1] = code
    local dec = M.e4m3_value(code)
    for i = 16 * g, 16 * g + 15, 2 do
      q[#q + 1] = M.e2m1(f32(x[i] / dec)) | (M.e2m1(f32(x[i + 1] / dec)) << 4)
    end
  end
  return { bytes(q), bytes(sc) }
end

-- V4.1 MXFP8: data row 512 e4m3 (RoPE included), scale row 16 ue8m0 per 32 dims;
-- written here with V4's scale rule (kv-formats.md gives only x = q * 2^(sb - 127))
M.formats.fp8_v41 = function(x)
  local q, sc = {}, {}
  ue8m0_groups(x, 16, 32, v32_scale, q, sc)
  return { bytes(q), bytes(sc) }
end

M.formats.fp8_pertensor = function(x, opts)
  local q = {}
  e4m3_run(x, 0, 576, opts.tensor_scale, q)
  return { bytes(q) }
end

M.formats.bf16 = function(x)
  local q = {}
  bf16_run(x, 0, 576, q)
  return { bytes(q) }
end

--- Where each region row of token t sits in a page of bs tokens, written out
-- per format from kv-formats.md (not from the layout description).
M.row_offset = {
  bf16 = function(t) return { t * 1152 } end,
  fp8_pertensor = function(t) return { t * 576 } end,
  fp8_ds_mla = function(t) return { t * 656 } end,
  fp8_ds_mla_amax = function(t) return { t * 656 } end,
  fp8_v4 = function(t, bs) return { t * 576, bs * 576 + t * 8 } end,
  fp8_v4_vllm = function(t, bs) return { t * 576, bs * 576 + t * 8 } end,
  indexer_fp8 = function(t, bs) return { t * 128, bs * 128 + t * 4 } end,
  indexer_fp8_ue8m0 = function(t, bs) return { t * 128, bs * 128 + t * 4 } end,
  fp4_v41 = function(t, bs) return { t * 256, bs * 256 + t * 32 } end,
  fp8_v41 = function(t, bs) return { t * 512, bs * 512 + t * 16 } end,
}

return M
