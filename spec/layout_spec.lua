-- Layouts as data: byte maps of the built-ins (kv-formats.md section 3),
-- the descriptor contract, and every validation error.
local mla = require "mlalab"
local S = require "support"
local core = mla.core

-- The CPU reference is the subject here: tensors default to the host even on
-- a GPU machine (GPU cases name their device).
local prev_device
setup(function() prev_device = mla.device(); mla.set_device("cpu") end)
teardown(function() mla.set_device(prev_device) end)

local function f32(x) return (string.unpack("<f", string.pack("<f", x))) end

-- The descriptor fields of `name` that must hold `want` (nested subsets).
local function assert_desc(name, bs, want)
  local L = mla.layout.get(name)
  local d = core.layout_unpack(L:packed(bs)) -- the numbers C sees (eps as an f32)
  for i, f in ipairs(L:desc(bs).fields) do d.fields[i].name = f.name end
  local function sub(exp, got, path)
    for k, v in pairs(exp) do
      if type(v) == "table" then sub(v, got[k], path .. "." .. k)
      else assert(got[k] == v, string.format("%s %s.%s: expected %s, got %s", name, path, k, tostring(v), tostring(got[k]))) end
    end
  end
  sub(want, d, "desc")
  return d
end

describe("built-in layout byte maps", function()
  it("lists every built-in format", function()
    local names = mla.layout.builtins()
    for _, n in ipairs { "bf16", "fp8_pertensor", "fp8_ds_mla", "fp8_ds_mla_amax", "fp8_v4", "fp8_v4_vllm", "indexer_fp8",
      "indexer_fp8_ue8m0", "fp4_v41", "fp8_v41" } do
      local found = false
      for _, m in ipairs(names) do found = found or m == n end
      assert.is_true(found, n)
    end
  end)

  it("bf16 is 1152 B/token: 512 bf16 latent then 64 bf16 RoPE, V = K[0, 512)", function()
    assert.equal(1152, mla.layout.get("bf16").token_bytes)
    assert_desc("bf16", 64, { dim = 576, k_dims = 576, v_dims = 512, nregions = 1, region_row_bytes = { 1152 },
      region_off = { 0 }, page_bytes = 73728, fields = {
        { name = "nope", dtype = "bf16", dim_lo = 0, count = 512, byte_off = 0, scale_kind = "none" },
        { name = "rope", dtype = "bf16", dim_lo = 512, count = 64, byte_off = 1024, scale_kind = "none" } } })
  end)

  it("fp8_pertensor is 576 B/token of e4m3 under one tensor scale", function()
    assert.equal(576, mla.layout.get("fp8_pertensor").token_bytes)
    assert_desc("fp8_pertensor", 64, { v_dims = 512, region_row_bytes = { 576 }, page_bytes = 36864, fields = {
      { dtype = "e4m3", dim_lo = 0, count = 512, byte_off = 0, scale_kind = "tensor" },
      { dtype = "e4m3", dim_lo = 512, count = 64, byte_off = 512, scale_kind = "tensor" } } })
    assert.is_true(mla.layout.get("fp8_pertensor"):has_tensor_scale())
  end)

  it("fp8_ds_mla is 656 B/token: e4m3 [0,512), 4 f32 pow2 scales per 128 at 512, bf16 RoPE at 528", function()
    assert.equal(656, mla.layout.get("fp8_ds_mla").token_bytes)
    assert_desc("fp8_ds_mla", 64, { v_dims = 512, region_row_bytes = { 656 }, page_bytes = 41984, token_align = 16, fields = {
      { name = "nope", dtype = "e4m3", count = 512, byte_off = 0, scale_kind = "group", group = 128, scale_dtype = "f32",
        scale_region = 0, scale_off = 512, scale_policy = "pow2", eps_on_amax = 0, eps = f32(1e-4), qmax = 448 },
      { name = "rope", dtype = "bf16", dim_lo = 512, count = 64, byte_off = 528 } } })
    assert_desc("fp8_ds_mla_amax", 64, { region_row_bytes = { 656 },
      fields = { { scale_policy = "amax", eps = 2 ^ -126, scale_off = 512 }, { byte_off = 528 } } })
  end)

  it("fp8_v4 splits the page: 576 B data rows, then 8 B scale rows (7 ue8m0 + 1 zero), padded to 576 B multiples", function()
    local L = mla.layout.get("fp8_v4")
    assert.equal(584, L.token_bytes)
    assert_desc("fp8_v4", 64, { dim = 512, k_dims = 512, v_dims = 512, nregions = 2, region_row_bytes = { 576, 8 },
      region_off = { 0, 36864 }, page_bytes = 37440, page_align = 576, fields = {
        { name = "nope", dtype = "e4m3", dim_lo = 0, count = 448, region = 0, byte_off = 0, scale_kind = "group", group = 64,
          scale_dtype = "ue8m0", scale_region = 1, scale_off = 0, scale_policy = "pow2", eps_on_amax = 0 },
        { name = "rope", dtype = "bf16", dim_lo = 448, count = 64, region = 0, byte_off = 448 },
        { role = "pad", dtype = "u8", count = 1, region = 1, byte_off = 7 } } })
    assert_desc("fp8_v4", 256, { region_off = { 0, 147456 }, page_bytes = 149760 })
    assert.equal(37376, select(3, L:page_geometry(64))) -- B x 584 before padding
    assert_desc("fp8_v4_vllm", 64, { page_bytes = 37440, fields = { { eps_on_amax = 1 } } })
  end)

  it("indexer_fp8 is 132 B/token: 128 e4m3 rows then one f32 scale row per token", function()
    assert.equal(132, mla.layout.get("indexer_fp8").token_bytes)
    assert_desc("indexer_fp8", 64, { dim = 128, v_dims = 0, region_row_bytes = { 128, 4 }, region_off = { 0, 8192 },
      page_bytes = 8448, fields = { { dtype = "e4m3", count = 128, group = 128, scale_dtype = "f32", scale_region = 1,
        scale_off = 0, scale_policy = "amax", eps_on_amax = 1, eps = f32(1e-4) } } })
    assert_desc("indexer_fp8_ue8m0", 64, { page_bytes = 8448, fields = { { scale_dtype = "f32", scale_policy = "pow2" } } })
    assert.equal(132 * 3, mla.layout.get("indexer_fp8"):page_bytes(3)) -- vLLM's stride for any block size
  end)

  it("fp4_v41 is 288 B/token: 256 B of e2m1, then 32 e4m3 scales per token, pages in 512 B multiples", function()
    assert.equal(288, mla.layout.get("fp4_v41").token_bytes)
    assert_desc("fp4_v41", 64, { dim = 512, v_dims = 512, region_row_bytes = { 256, 32 }, region_off = { 0, 16384 },
      page_bytes = 18432, page_align = 512, fields = { { dtype = "e2m1", count = 512, group = 16, scale_dtype = "e4m3",
        scale_region = 1, scale_off = 0, scale_policy = "amax", scale_min = 2 ^ -9, scale_max = 448, qmax = 6 } } })
    assert.equal(19 * 512, mla.layout.get("fp4_v41"):page_bytes(33)) -- 33 x 288 = 9504 -> 9728
  end)

  it("fp8_v41 is 528 B/token: 512 e4m3 (RoPE quantized too), then 16 ue8m0 scales per 32 dims, pages in 512 B multiples", function()
    assert.equal(528, mla.layout.get("fp8_v41").token_bytes)
    assert_desc("fp8_v41", 64, { dim = 512, v_dims = 512, region_row_bytes = { 512, 16 }, region_off = { 0, 32768 },
      page_bytes = 33792, page_align = 512, fields = { { dtype = "e4m3", count = 512, group = 32, scale_dtype = "ue8m0",
        scale_region = 1, scale_off = 0, scale_policy = "pow2", eps_on_amax = 0, eps = f32(1e-4), qmax = 448 } } })
    assert.equal(35 * 512, mla.layout.get("fp8_v41"):page_bytes(33)) -- 33 x 528 = 17424 -> 17920
  end)

  it("fp8_ds_mla_blocked is 656 B/token page-blocked: NoPE [32][B][16 B], f32 scales [4][B], RoPE [B][64 bf16]", function()
    local L = mla.layout.get("fp8_ds_mla_blocked")
    assert.equal(656, L.token_bytes)
    assert.is_true(L:chunked())
    assert.is_false(mla.layout.get("fp8_ds_mla"):chunked())
    assert_desc("fp8_ds_mla_blocked", 64, { dim = 576, v_dims = 512, nregions = 3, region_row_bytes = { 512, 16, 128 },
      region_chunk = { 16, 4, 0 }, region_off = { 0, 32768, 33792 }, page_bytes = 41984, fields = {
        { name = "nope", dtype = "e4m3", count = 512, region = 0, byte_off = 0, group = 128, scale_dtype = "f32",
          scale_region = 1, scale_off = 0, scale_policy = "pow2", eps = f32(1e-4) },
        { name = "rope", dtype = "bf16", dim_lo = 512, count = 64, region = 2, byte_off = 0 } } })
    -- locate inverts the piece-major order: dims 16 j .. of token t at j B 16 + t 16, scale g at 32768 + g B 4 + t 4
    local r = L:locate(5 * 64 * 16 + 7 * 16 + 3, 64)
    assert.same({ "nope", 7, "nope", "data", 83 }, { r.region, r.token, r.item, r.kind, r.elem })
    r = L:locate(32768 + 2 * 64 * 4 + 9 * 4 + 1, 64)
    assert.same({ "scales", 9, "nope.scale", "scale", 2 }, { r.region, r.token, r.item, r.kind, r.elem })
    r = L:locate(33792 + 63 * 128 + 127, 64)
    assert.same({ "rope", 63, "rope", "data", 63 }, { r.region, r.token, r.item, r.kind, r.elem })
    assert.is_truthy(mla.layout.map(L, 64):find("32 pieces x 64 x 16 B", 1, true))
  end)

  it("fp8_ds_mla_blocked holds fp8_ds_mla's bytes, moved to their page-blocked places (block sizes 64 and 3)", function()
    for _, bs in ipairs { 64, 3 } do
      local A, B = mla.layout.get("fp8_ds_mla"), mla.layout.get("fp8_ds_mla_blocked")
      local n = 2 * bs
      local x = mla.randn({ n, 576 }, { std = 2 })
      local slots = mla.arange(n, "i64")
      local ca = mla.cache.new { layout = A, num_blocks = 2, block_size = bs, device = "cpu" }:view(0)
      local cb = mla.cache.new { layout = B, num_blocks = 2, block_size = bs, device = "cpu" }:view(0)
      ca.pages:random_bytes_(5)
      cb.pages:random_bytes_(6)
      mla.layout_ref.write(A, ca.pages, x, slots, { block_size = bs })
      mla.layout_ref.write(B, cb.pages, x, slots, { block_size = bs })
      local a, b = core.tensor_bytes(ca.pages), core.tensor_bytes(cb.pages)
      local pa, pb = ca.pages:stride(0), cb.pages:stride(0)
      for s = 0, n - 1 do
        local p, t = s // bs, s % bs
        local ta, tb = p * pa + t * 656, p * pb
        for j = 0, 31 do
          assert.equal(a:sub(ta + 16 * j + 1, ta + 16 * j + 16), b:sub(tb + (j * bs + t) * 16 + 1, tb + (j * bs + t) * 16 + 16))
        end
        for g = 0, 3 do
          local sb = tb + 512 * bs + (g * bs + t) * 4
          assert.equal(a:sub(ta + 512 + 4 * g + 1, ta + 512 + 4 * g + 4), b:sub(sb + 1, sb + 4))
        end
        local rb = tb + 528 * bs + t * 128
        assert.equal(a:sub(ta + 528 + 1, ta + 656), b:sub(rb + 1, rb + 128))
      end
      -- and reads back the same values
      S.assert_bytes(mla.layout_ref.read(A, ca.pages, slots, { block_size = bs }),
        mla.layout_ref.read(B, cb.pages, slots, { block_size = bs }), "read back")
    end
  end)

  it("locates any byte of a page as (region, token, field, element)", function()
    local L = mla.layout.get("fp8_v4")
    local r = L:locate(36864 + 8 * 5 + 3, 64)
    assert.same({ "scales", 5, "nope.scale", "scale", 3 }, { r.region, r.token, r.item, r.kind, r.elem })
    r = L:locate(576 * 2 + 448 + 6, 64)
    assert.same({ "data", 2, "rope", "data", 3 }, { r.region, r.token, r.item, r.kind, r.elem })
    r = L:locate(36864 + 8 * 63 + 7, 64)
    assert.same({ 63, "pad1", "pad" }, { r.token, r.item, r.kind })
    assert.is_true(L:locate(37400, 64).padding)
    local F = mla.layout.get("fp4_v41")
    r = F:locate(256 + 4, 64) -- e2m1: byte 4 of token 1 holds dims 8 (low nibble) and 9
    assert.same({ 1, "kv", 8 }, { r.token, r.item, r.elem })
  end)
end)

describe("layout descriptors", function()
  it("pack and unpack round-trip every built-in bit for bit", function()
    for _, n in ipairs(mla.layout.builtins()) do
      local s = mla.layout.get(n):packed(64)
      assert.equal(648, #s)
      assert.equal(s, core.layout_pack(core.layout_unpack(s)), n)
    end
  end)

  it("accept enumerations and dtypes by name or by id", function()
    local d = mla.layout.get("fp8_ds_mla"):desc(16)
    local byname = core.layout_pack(d)
    d.fields[1].dtype, d.fields[1].scale_kind, d.fields[1].scale_policy, d.fields[1].scale_dtype =
      mla.dtype_info("e4m3").id, 2, 0, mla.dtype_info("f32").id
    assert.equal(byname, core.layout_pack(d))
  end)

  it("feed mla.rtc.layout_header with the same numbers", function()
    local h = mla.rtc_layout.header(mla.layout.get("fp8_v4"), 64)
    assert.truthy(h:find("MLA_LAYOUT_PAGE_BYTES = 37440LL", 1, true))
    assert.truthy(h:find("/* region_off */ {0LL, 36864LL, 0LL, 0LL}", 1, true))
    assert.truthy(h:find("MLA_LAYOUT_FIELD_ROPE = 1", 1, true))
  end)

  it("show prints a byte map of one token and one page", function()
    local text = mla.layout.map("fp8_v4", 64)
    for _, line in ipairs {
      "layout fp8_v4: 512 dims (K [0, 512), V [0, 512)), 584 B/token, page-split",
      "    [    0,   448)  nope         448 x e4m3, dims [0, 448), ue8m0 scale per 64 (pow2, eps 0.0001 on the scale)",
      "    [  448,   576)  rope         64 x bf16, dims [448, 512)",
      "    [    0,     7)  nope.scale   7 x ue8m0, one per 64 dims of 'nope'",
      "    [    7,     8)  pad1         1 B, written as 0",
      "  page of 64 tokens: 37440 B (page_align 576, token_align 16)",
      "    [  36864,   37376)  scales   64 x 8 B",
      "    [  37376,   37440)  padding to a multiple of 576",
    } do
      assert.truthy(text:find(line, 1, true), "missing line: " .. line .. "\n" .. text)
    end
    local v32 = mla.layout.map("fp8_ds_mla", 64)
    assert.truthy(v32:find("[  512,   528)  nope.scale   4 x f32, one per 128 dims of 'nope'", 1, true), v32)
  end)

  it("describe variants with L:with", function()
    local A = mla.layout.get("fp8_ds_mla"):with { name = "v32_amax_test", scale = { nope = { policy = "amax" } } }
    assert.equal("amax", A:desc(64).fields[1].scale_policy)
    assert.equal(656, A.token_bytes)
    S.assert_error_contains(function() mla.layout.get("bf16"):with { scale = { nope = { policy = "amax" } } } end,
      "field 'nope' has no group scale")
  end)
end)

describe("layout validation errors", function()
  local function define_err(spec, msg) return S.assert_error_contains(function() mla.layout.define(spec) end, msg) end
  local e4 = function(n, count, extra)
    local f = { n, "e4m3", count }
    for k, v in pairs(extra or {}) do f[k] = v end
    return f
  end

  it("names an unknown dtype", function()
    define_err({ name = "t", fields = { { "a", "e9m9", 8 } } }, "layout 't': field 'a': dtype e9m9 is not a stored value type")
  end)
  it("names a count that is not a multiple of 8", function()
    define_err({ name = "t", fields = { { "a", "bf16", 12 } } }, "field 'a': count 12 is not a multiple of 8")
  end)
  it("names a group that does not divide the count", function()
    define_err({ name = "t", fields = { e4("a", 64, { scale = { dtype = "f32", group = 48 } }) } },
      "field 'a': group 48 does not divide the field's 64 elements")
  end)
  it("names a group that is not a multiple of 8", function()
    define_err({ name = "t", fields = { e4("a", 64, { scale = { dtype = "f32", group = 4 } }) } },
      "field 'a': group 4 is not a multiple of 8")
  end)
  it("names an illegal scale dtype", function()
    define_err({ name = "t", fields = { e4("a", 64, { scale = { dtype = "e5m2", group = 32 } }) } },
      "field 'a': scale dtype e5m2 is not one of f32, ue8m0, e4m3, bf16")
  end)
  it("names an unknown scale policy and option", function()
    define_err({ name = "t", fields = { e4("a", 64, { scale = { dtype = "f32", group = 32, policy = "round" } }) } },
      "field 'a': scale policy 'round' is neither")
    define_err({ name = "t", fields = { e4("a", 64, { scale = { dtype = "f32", group = 32, epsilon = 1 } }) } },
      "field 'a': unknown scale option 'epsilon'")
  end)
  it("names a negative eps and a clamp with min above max", function()
    define_err({ name = "t", fields = { e4("a", 64, { scale = { dtype = "f32", group = 32, eps = -1 } }) } },
      "field 'a': scale eps must be a finite non-negative number")
    define_err({ name = "t", fields = { e4("a", 64, { scale = { dtype = "f32", group = 32, min = 2, max = 1 } }) } },
      "field 'a': scale min 2 is above max 1")
  end)
  it("names a group scale with neither eps nor a minimum", function()
    define_err({ name = "t", fields = { e4("a", 64, { scale = { dtype = "f32", group = 32 } }) } },
      "field 'a': a group scale needs eps > 0 or min > 0 (an all-zero group would get scale 0 and decode to NaN)")
  end)
  it("names a field whose derived offset is misaligned for its dtype", function()
    define_err({ name = "t", fields = { e4("a", 8), { "b", "bf16", 8 } }, regions = { { row = { "a", { pad = 1 }, "b" } } } },
      "b (bf16) would start at byte 9 of region 'region0', not a multiple of its 2-byte alignment")
  end)
  it("names a field pinned at a misaligned byte", function()
    define_err({ name = "t", fields = { e4("a", 8), { "b", "bf16", 8 } }, regions = { { row = { "a", { "b", at = 9 } }, bytes = 26 } } },
      "field 'b': the data at byte 9 of its row is not aligned for bf16")
  end)
  it("names overlapping fields", function()
    define_err({ name = "t", fields = { e4("a", 8), { "b", "bf16", 8 } }, regions = { { row = { "a", { "b", at = 4 } } } } },
      "field 'b': data at bytes [4, 20) of region 0 overlaps the data of field 'a' at [0, 8)")
  end)
  it("names scales overlapping data", function()
    define_err({ name = "t", fields = { e4("a", 64, { scale = { dtype = "f32", group = 32, eps = 1e-4 } }) },
      regions = { { row = { "a", { "a.scale", at = 60 } } } } }, "field 'a': scales at bytes [60, 68) of region 0 overlaps the data of field 'a'")
  end)
  it("names a field or scale placed in no region, or twice", function()
    define_err({ name = "t", fields = { e4("a", 8), e4("b", 8) }, regions = { { row = { "a" } } } },
      "field 'b' is placed in no region row")
    define_err({ name = "t", fields = { e4("a", 64, { scale = { dtype = "f32", group = 32, eps = 1e-4 } }) }, regions = { { row = { "a" } } } },
      "field 'a': its scales are placed in no region row")
    define_err({ name = "t", fields = { e4("a", 8) }, regions = { { row = { "a" } }, { row = { "a" } } } }, "a is placed twice")
  end)
  it("names row items that name nothing", function()
    define_err({ name = "t", fields = { e4("a", 8) }, regions = { { name = "r", row = { "a", "c" } } } },
      "region 'r': row item 'c' names no field")
    define_err({ name = "t", fields = { e4("a", 8) }, regions = { { name = "r", row = { "a", "a.scale" } } } },
      "region 'r': field 'a' has no group scales to place")
  end)
  it("names K and V dims that are not prefixes", function()
    define_err({ name = "t", fields = { e4("a", 8) }, k_dims = 16 }, "k_dims = 16 exceeds the row's 8 dims")
    define_err({ name = "t", fields = { e4("a", 16) }, k_dims = 8, v_dims = 16 }, "v_dims = 16 exceeds k_dims = 8 (V is a prefix of K)")
  end)
  it("names alignment rules violated", function()
    define_err({ name = "t", fields = { e4("a", 8) }, token_align = 16 }, "rows are 8 bytes, not a multiple of token_align 16")
    define_err({ name = "t", fields = { e4("a", 16) }, token_align = 16, page_align = 24 },
      "page_align = 24 must be a multiple of token_align = 16")
    define_err({ name = "t", fields = { { "a", "f32", 8 } }, token_align = 2 },
      "field 'a': the data is f32 (4-byte aligned) but token_align is 2")
  end)
  it("names duplicate, badly named and too many fields", function()
    define_err({ name = "t", fields = { e4("a", 8), e4("a", 8) } }, "field 'a' is defined twice")
    define_err({ name = "t", fields = { e4("1a", 8) } }, "fields[1]: name must be an identifier")
    local many = {}
    for i = 1, 9 do many[i] = e4("f" .. i, 8) end
    define_err({ name = "t", fields = many }, "9 fields and 0 paddings exceed the descriptor's 8 field slots")
  end)
  it("names unknown keys and impossible regions", function()
    define_err({ name = "t", fields = { e4("a", 8) }, blocksize = 4 }, "unknown key 'blocksize'")
    define_err({ name = "t", fields = { e4("a", 8) }, regions = { { name = "r", row = { "a" }, bytes = 4 } } },
      "region 'r': bytes = 4 is less than its items' 8 bytes")
    local five = {}
    for i = 1, 5 do five[i] = { row = {} } end
    define_err({ name = "t", fields = { e4("a", 8) }, regions = five }, "a page has 1 to 4 regions, 5 given")
    define_err({ name = "t", fields = { e4("a", 8) }, regions = 5 }, "regions must be a list of regions, got number")
    define_err({ name = "t", fields = { e4("a", 8) }, regions = { nil, { name = "r", row = { "a" } } } },
      "regions[1] must be a table with a row list")
  end)
  it("names chunked regions whose pieces do not fit their row or split a read", function()
    define_err({ name = "t", fields = { e4("a", 32) }, regions = { { name = "r", row = { "a" }, chunk = 12 } } },
      "region 'r': chunk = 12 must divide its 32-byte row and be smaller than it")
    define_err({ name = "t", fields = { e4("a", 32) }, regions = { { name = "r", row = { "a" }, chunk = 32 } } },
      "region 'r': chunk = 32 must divide its 32-byte row and be smaller than it")
    -- 8 bf16 dims are one 16-byte read: 8-byte pieces would split it
    define_err({ name = "t", fields = { { "a", "bf16", 16 } }, regions = { { row = { "a" }, chunk = 8 } } },
      "field 'a': 8-dim bytes [0, 16) of region 0 straddle its 8-byte pieces")
    -- an f32 scale across two 2-byte pieces
    define_err({ name = "t", fields = { e4("a", 32, { scale = { dtype = "f32", group = 16, eps = 1e-4 } }) },
      regions = { { row = { "a" } }, { row = { "a.scale" }, chunk = 2 } } }, "the scales is f32 in region 1 whose pieces of 2 bytes")
    -- region 0's pieces keep token_align like its rows
    define_err({ name = "t", fields = { e4("a", 32) }, regions = { { row = { "a" }, chunk = 8 } }, token_align = 16 },
      "region_chunk[0] = 8 must keep token pieces at multiples of token_align = 16")
    assert.is_true(mla.layout.define { name = "t", fields = { e4("a", 32) }, regions = { { row = { "a" }, chunk = 8 } } }:chunked())
  end)
  it("rejects a block size that is not a positive integer", function()
    S.assert_error_contains(function() mla.layout.get("bf16"):desc(0) end, "block_size must be a positive integer")
    S.assert_error_contains(function() mla.layout.get("nope_such") end, "no layout 'nope_such'")
  end)
end)

describe("descriptor checks in C (core.layout_check)", function()
  local function raw()
    return { dim = 576, k_dims = 576, v_dims = 512, block_size = 4, region_row_bytes = { 656 }, region_off = { 0 },
      page_bytes = 2624, page_align = 16, token_align = 16, fields = {
        { dtype = "e4m3", dim_lo = 0, count = 512, byte_off = 0, scale_kind = "group", group = 128, scale_dtype = "f32",
          scale_off = 512, scale_policy = "pow2", qmax = 448, eps = 1e-4 },
        { dtype = "bf16", dim_lo = 512, count = 64, byte_off = 528 } } }
  end
  local function bad(mutate, msg)
    local d = raw()
    mutate(d)
    local ok, err = core.layout_check(d)
    assert.is_false(ok)
    assert.truthy(err:find(msg, 1, true), "'" .. tostring(err) .. "' does not contain '" .. msg .. "'")
    S.assert_error_contains(function() core.layout_pack(d) end, "layout_pack: " .. msg)
  end

  it("accepts the valid base descriptor", function() assert.is_true(core.layout_check(raw())) end)
  it("rejects a page smaller than its regions", function() bad(function(d) d.page_bytes = 2608 end, "page_bytes = 2608 is smaller than the regions' end 2624") end)
  it("rejects a page size off its alignment", function()
    bad(function(d) d.page_bytes = 2632; d.page_align = 32 end, "page_bytes = 2632 is not a multiple of page_align = 32")
    bad(function(d) d.region_chunk = { 12 } end, "region_chunk[0] = 12 must be 0 (rows whole) or a divisor of the 656-byte row")
    bad(function(d) d.region_chunk = { 8 } end, "region_chunk[0] = 8 must keep token pieces at multiples of token_align = 16")
    bad(function(d) d.region_chunk, d.token_align = { 8 }, 8 end,
      "fields[1]: 8-dim bytes [528, 544) of region 0 straddle its 8-byte pieces")
    local d = raw()
    d.region_chunk = { 16 } -- every read inside a 16-byte piece
    assert.is_true(core.layout_check(d))
  end)
  it("rejects overlapping regions", function()
    bad(function(d) d.region_row_bytes = { 656, 4 }; d.region_off = { 0, 2000 }; d.page_bytes = 4000 end,
      "region 1 (bytes [2000, 2016) of the page) overlaps region 0")
  end)
  it("rejects dims stored by no field or by two", function()
    bad(function(d) d.fields[2] = nil end, "dim 512 of the 576-dim row is stored by no field")
    bad(function(d) d.fields[2].dim_lo = 448 end, "fields[1]: dim 448 is already stored by another field")
  end)
  it("rejects fields and scales outside their row", function()
    bad(function(d) d.fields[1].scale_off = 648 end, "fields[0]: scales at bytes [648, 664) fall outside region 0's row of 656 bytes")
    bad(function(d) d.fields[2].byte_off = 544 end, "fields[1]: 64 x bf16 at bytes [544, 672) fall outside region 0's row")
  end)
  it("rejects misaligned scales", function() bad(function(d) d.fields[1].scale_off = 514 end, "fields[0]: the scales at byte 514") end)
  it("rejects group parameters on a field without group scales", function()
    bad(function(d) d.fields[2].group = 8 end, "fields[1].group is set but the field has no group scales")
    bad(function(d) d.fields[2].eps = 1 end, "fields[1].eps is set")
  end)
  it("rejects bad enumerations and numbers", function()
    bad(function(d) d.fields[1].role = 7 end, "fields[0].role = 7 is neither data (0) nor pad (1)")
    bad(function(d) d.fields[1].scale_kind = 9 end, "fields[0].scale_kind = 9")
    bad(function(d) d.fields[1].eps_on_amax = 2 end, "fields[0].eps_on_amax = 2 must be 0 or 1")
    bad(function(d) d.fields[1].qmax = 0 end, "fields[0].qmax = 0 must be a finite positive number")
    bad(function(d) d.fields[1].scale_min = 2; d.fields[1].scale_max = 1 end, "fields[0]: scale_min 2 is above scale_max 1")
    bad(function(d) d.fields[1].eps = 0 end, "fields[0]: group scales need eps > 0 or scale_min > 0")
    bad(function(d) d.fields[1].scale_dtype = "e5m2" end, "fields[0].scale_dtype is e5m2")
    bad(function(d) d.fields[1].dtype = "i32" end, "fields[0].dtype is i32")
  end)
  it("rejects malformed padding", function()
    bad(function(d) d.region_row_bytes = { 672 }; d.page_bytes = 2688
      d.fields[3] = { role = "pad", dtype = "bf16", count = 2, byte_off = 656 } end, "fields[2] is padding and must have dtype u8")
  end)
  it("rejects header values out of range", function()
    bad(function(d) d.block_size = 0 end, "block_size = 0 must be in [1, 1048576]")
    bad(function(d) d.v_dims = 577 end, "v_dims = 577 must be in [0, k_dims = 576]")
    bad(function(d) d.token_align = 12 end, "token_align = 12 must be a power of two")
    bad(function(d) d.fields[1].region = 1 end, "fields[0].region = 1 is not a region (nregions = 1)")
    bad(function(d) d.fields[1].group = 48 end, "fields[0]: group 48 does not divide the field's count 512")
  end)
  it("rejects malformed tables while packing", function()
    local d = raw()
    d.fields[1].dtpye = "e4m3"
    S.assert_error_contains(function() core.layout_pack(d) end, "fields[0] has an unknown key 'dtpye'")
    d = raw()
    d.fields[1].scale_policy = "round"
    S.assert_error_contains(function() core.layout_pack(d) end, "fields[0].scale_policy = 'round' is not one of pow2, amax")
    d = raw()
    d.nfields = 3
    S.assert_error_contains(function() core.layout_pack(d) end, "nfields = 3 but 2 fields are listed")
    S.assert_error_contains(function() core.layout_unpack("short") end, "a packed layout descriptor has 648 bytes, got 5")
  end)
end)

describe("cache view checks", function()
  local L = mla.layout.get("fp8_ds_mla")
  local function write(pages, opts)
    opts = opts or {}
    core.ref_write(opts.desc or L:packed(64), pages, opts.x or mla.randn({ 1, 576 }), opts.slots or mla.tensor({ 0 }, "i64"),
      opts.scale)
  end

  it("rejects pages that are not u8 or have the wrong rank", function()
    S.assert_error_contains(function() write(mla.zeros({ 2, 41984 }, "i8")) end, "pages (argument #2) must be a u8 tensor, got i8")
    S.assert_error_contains(function() write(mla.zeros({ 41984 * 2 }, "u8")) end, "must be u8 [pages, page_bytes] or [pages, block_size, row]")
  end)
  it("rejects a page stride off the layout's page_align", function()
    local V4 = mla.layout.get("fp8_v4")
    local pages = mla.zeros({ 2, 37440 + 16 }, "u8"):narrow(1, 0, 37440)
    S.assert_error_contains(function() write(pages, { desc = V4:packed(64), x = mla.randn({ 1, 512 }) }) end,
      "page stride 37456 bytes is not a multiple of the layout's page_align 576")
  end)
  it("rejects a page stride below the page size", function()
    local pages = mla.zeros({ 2 * 41984 }, "u8"):as_strided({ 2, 41984 - 16 }, { 41984 - 16, 1 }, 0)
    S.assert_error_contains(function() write(pages) end, "each page of the view spans 41968 bytes but the layout uses 41984")
    local base = mla.zeros({ 3 * 41984 }, "u8")
    S.assert_error_contains(function() write(base:as_strided({ 2, 41984 }, { 41968, 1 }, 0)) end,
      "page stride 41968 bytes is smaller than the layout's page of 41984 bytes")
  end)
  it("rejects a view whose first byte is misaligned", function()
    local pages = mla.zeros({ 2, 42000 }, "u8"):narrow(1, 8, 41984)
    S.assert_error_contains(function() write(pages) end, "not 16-byte aligned (token_align)")
  end)
  it("takes [pages, block_size, row] views with the token stride of the tensor", function()
    local pages3 = mla.zeros({ 2, 65, 656 }, "u8"):narrow(1, 0, 64) -- FlashMLA's (block_size + 1) page stride
    local x = mla.randn({ 2, 576 })
    core.ref_write(L:packed(64), pages3, x, mla.tensor({ 3, 70 }, "i64"))
    local out = mla.zeros({ 2, 576 })
    core.ref_read(L:packed(64), pages3, mla.tensor({ 3, 70 }, "i64"), out)
    local ref = mla.zeros({ 2, 41984 }, "u8")
    core.ref_write(L:packed(64), ref, x, mla.tensor({ 3, 70 }, "i64"))
    assert.is_true(pages3:select(0, 1):select(0, 6):equal(ref:select(0, 1):narrow(0, 6 * 656, 656):view({ 656 })))
    S.assert_error_contains(function() write(mla.zeros({ 2, 64, 650 }, "u8")) end, "rows of 650 bytes are shorter than the layout's 656-byte token row")
    S.assert_error_contains(function() write(mla.zeros({ 2, 32, 656 }, "u8")) end, "size(1) = 32 but the layout has block_size 64")
    local V4 = mla.layout.get("fp8_v4")
    S.assert_error_contains(function() write(mla.zeros({ 2, 64, 584 }, "u8"), { desc = V4:packed(64), x = mla.randn({ 1, 512 }) }) end,
      "needs a one-region layout; this one has 2 regions")
  end)
  it("checks the tensor scale, x, slots and out arguments by name", function()
    local P = mla.layout.get("fp8_pertensor")
    local pages = mla.zeros({ 1, 36864 }, "u8")
    local function pw(x, slots, scale) core.ref_write(P:packed(64), pages, x, slots, scale) end
    S.assert_error_contains(function() pw(mla.randn({ 1, 576 }), mla.tensor({ 0 }, "i64"), mla.ones({ 2 })) end,
      "tensor_scale (argument #5) must be an f32 tensor of 1 element, got f32 with 2 elements")
    S.assert_error_contains(function() pw(mla.randn({ 1, 512 }), mla.tensor({ 0 }, "i64")) end,
      "ref_write: x (argument #3) has 512 columns, the layout's row has 576 dims")
    S.assert_error_contains(function() pw(mla.randn({ 1, 576 }, { dtype = "bf16" }), mla.tensor({ 0 }, "i64")) end,
      "ref_write: x (argument #3) must be a 2-dim f32 tensor, got bf16")
    S.assert_error_contains(function() pw(mla.randn({ 1, 576 }), mla.tensor({ 0 }, "i32")) end,
      "ref_write: slots (argument #4) must be a 1-dim i64 tensor, got i32")
    S.assert_error_contains(function() pw(mla.randn({ 1, 576 }), mla.tensor({ 0, 1 }, "i64")) end,
      "ref_write: x (argument #3) has 1 rows but slots (argument #4) maps 2 tokens")
    S.assert_error_contains(function() pw(mla.randn({ 2, 576 }), mla.tensor({ 0, 64 }, "i64")) end,
      "ref_write: slots[1] = 64 is past the cache (1 pages of 64 tokens)")
    S.assert_error_contains(function() core.ref_read(P:packed(64), pages, mla.tensor({ 0 }, "i64"), mla.zeros({ 2, 576 })) end,
      "ref_read: out (argument #4) has 2 rows, slots (argument #3) has 1")
    S.assert_error_contains(function() core.ref_read(P:packed(64), pages, mla.tensor({ 0 }, "i64"), mla.zeros({ 1, 600 })) end,
      "ref_read: out (argument #4) has 600 columns, expected 1 to the layout's 576 dims")
    S.assert_error_contains(function() core.ref_read("nope", pages, mla.tensor({ 0 }, "i64"), mla.zeros({ 1, 5 })) end,
      "a packed layout descriptor has 648 bytes, got 4")
  end)
  it("writes nothing when any slot is out of range", function()
    local pages = mla.zeros({ 1, 41984 }, "u8")
    S.assert_error_contains(function() write(pages, { x = mla.randn({ 2, 576 }), slots = mla.tensor({ 0, 99 }, "i64") }) end,
      "slots[1] = 99 is past the cache")
    assert.is_true(pages:equal(mla.zeros({ 1, 41984 }, "u8")))
  end)
  it("rejects pages on a GPU for the CPU reference #gpu", function()
    local pages = mla.zeros({ 1, 41984 }, "u8", "cuda")
    S.assert_error_contains(function() write(pages) end, "pages (argument #2) must be a CPU tensor")
  end)
end)
