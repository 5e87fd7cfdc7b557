-- Paged caches: per-layer views with inflated page strides and storage
-- offsets, poisoned neighbours, bleed located by (layer, block, token, field).
local mla = require "mlalab"
local S = require "support"
local core = mla.core

-- The CPU reference is the subject here: tensors default to the host even on
-- a GPU machine (GPU cases name their device).
local prev_device
setup(function() prev_device = mla.device(); mla.set_device("cpu") end)
teardown(function() mla.set_device(prev_device) end)

local LAYERS = 61

local function slots_of(t) return mla.tensor(t, "i64") end

-- The bytes a write of x to slots gives on plain contiguous pages.
local function plain_pages(L, bs, nblocks, x, slots)
  local pages = mla.zeros({ nblocks, L:page_bytes(bs) }, "u8")
  mla.layout_ref.write(L, pages, x, slots_of(slots), { block_size = bs })
  return pages
end

describe("cache geometry", function()
  it("layer-major: one buffer per layer, page stride = page bytes + pad, no offset", function()
    local c = mla.cache.new { layout = "fp8_ds_mla", num_blocks = 3, block_size = 64, num_layers = LAYERS, page_pad = 656 }
    assert.equal(LAYERS, #c.buffers)
    local v = c:layer(17)
    assert.same({ 3, 41984 }, v:size())
    assert.same({ 41984 + 656, 1 }, v:stride())
    assert.equal(0, v:offset())
    assert.is_false(v:same_storage(c:layer(18)))
  end)

  it("block-major: physical (blocks, layers, page), layer stride = layers x page, offset = layer x page", function()
    local c = mla.cache.new { layout = "fp8_v4", num_blocks = 3, block_size = 64, num_layers = LAYERS, order = "block_major",
      page_pad = 576 }
    local ps = 37440 + 576
    for _, i in ipairs { 0, 1, 30, 60 } do
      local v = c:layer(i)
      assert.same({ 3, 37440 }, v:size())
      assert.same({ LAYERS * ps, 1 }, v:stride())
      assert.equal(i * ps, v:offset())
      assert.is_true(v:same_storage(c.buffers[1]))
    end
    local view = c:view(5)
    assert.equal(c.desc, view.desc)
    assert.equal(64, view.block_size)
    assert.is_nil(view.tensor_scale)
  end)

  it("keeps one per-tensor scale per layer for tensor-scaled layouts", function()
    local c = mla.cache.new { layout = "fp8_pertensor", num_blocks = 1, block_size = 16, num_layers = 4, tensor_scale = 0.5 }
    local s = c:tensor_scale(2)
    assert.same({ 1 }, s:size())
    assert.equal(0.5, s:item())
    s:fill(0.25)
    local x = mla.full({ 1, 576 }, 1.0)
    c:write(2, x, slots_of { 3 })
    assert.equal(0x48, c:layer(2):get({ 0, 3 * 576 })) -- 1 / 0.25 = 4 -> e4m3 0x48
    assert.equal(1.0, c:read(2, slots_of { 3 }):get({ 0, 0 }))
  end)

  it("rejects bad options and layers by name", function()
    S.assert_error_contains(function() mla.cache.new { layout = "fp8_v4", num_blocks = 2, page_pad = 100 } end,
      "page_pad 100 makes pages of 37540 bytes, not a multiple of layout 'fp8_v4' page_align 576")
    S.assert_error_contains(function() mla.cache.new { layout = "fp8_v4", num_blocks = 2, order = "layers_first" } end,
      "order must be \"layer_major\" or \"block_major\"")
    S.assert_error_contains(function() mla.cache.new { layout = "fp8_v4", num_blocks = 0 } end, "num_blocks must be an integer >= 1")
    S.assert_error_contains(function() mla.cache.new { layout = "fp9", num_blocks = 1 } end, "no layout 'fp9'")
    S.assert_error_contains(function() mla.cache.new { layout = "bf16", num_blocks = 1, block_size = 1 << 33 } end,
      "block_size must be an integer >= 1 and <= 2147483647, got 8589934592")
    -- the whole cache is held against the device's memory before any layer's buffer exists
    S.assert_error_contains(function() mla.cache.new { layout = "fp8_v4", num_blocks = 3, block_size = 16, num_layers = 1 << 30, device = "cpu" } end,
      "cache.new: 1073741824 layers x 3 blocks x 9792 bytes a page = 3.154e+13 bytes, more than the")
    local c = mla.cache.new { layout = "bf16", num_blocks = 1, block_size = 4, num_layers = 2 }
    S.assert_error_contains(function() c:layer(2) end, "layer 2 is not in [0, 2)")
    S.assert_error_contains(function() c:check_bleed(0) end, "no snapshot")
  end)
end)

describe("writes with neighbours poisoned", function()
  for _, order in ipairs { "layer_major", "block_major" } do
    for _, name in ipairs { "fp8_ds_mla", "fp8_v4", "fp4_v41", "fp8_v41", "indexer_fp8" } do
      it(string.format("%s %s: bytes as on plain pages, zero bleed outside the written tokens", order, name), function()
        local L = mla.layout.get(name)
        local c = mla.cache.new { layout = L, num_blocks = 3, block_size = 16, num_layers = LAYERS, order = order,
          page_pad = L.page_align * 2 }
        local slots = { 0, 17, 47, -1, 30 }
        local x = mla.randn({ #slots, L.dim }, { std = 2 })
        c:layer(40):fill(0) -- caches start uninitialised, like torch.empty
        c:poison(40, "zeros")
        c:write(40, x, slots_of(slots))
        local report = c:check_bleed(40, { slots = slots })
        assert.is_nil(report, report and report.message)
        assert.is_true(c:layer(40):equal(plain_pages(L, 16, 3, x, slots)))
      end)
    end
  end
end)

describe("reads with neighbours poisoned", function()
  for _, order in ipairs { "layer_major", "block_major" } do
    for _, pattern in ipairs { "random", "nan" } do
      it(string.format("%s, %s poison: every read is bit-identical to the clean read", order, pattern), function()
        local L = mla.layout.get("fp8_v4")
        local c = mla.cache.new { layout = L, num_blocks = 4, block_size = 64, num_layers = LAYERS, order = order, page_pad = 576 }
        for i = 0, LAYERS - 1 do c:layer(i):fill(0) end
        local slots = slots_of { 5, 64, 130, 255, -1, 200 }
        c:write(3, mla.randn({ 6, 512 }), slots)
        local clean = c:read(3, slots)
        c:poison(3, pattern, 99)
        local after = c:read(3, slots)
        assert.is_true(after:equal(clean))
        assert.is_nil(c:check_bleed(3, {})) -- reading changed nothing anywhere
        -- the poison really is there: layer 2's scale tail decodes as garbage
        if pattern == "nan" then assert.equal(255, c:layer(2):get({ 0, 64 * 576 })) end
      end)
    end
  end
end)

describe("bleed reports", function()
  local L = mla.layout.get("fp8_v4")
  local function fresh(order)
    local c = mla.cache.new { layout = L, num_blocks = 3, block_size = 64, num_layers = LAYERS, order = order, page_pad = 576 }
    c:poison(7, "zeros")
    return c
  end

  it("locate a corrupted scale byte of another layer as (layer, block, token, field, element)", function()
    local c = fresh("block_major")
    c:layer(6):set({ 2, 64 * 576 + 8 * 5 + 3 }, 1)
    local r = c:check_bleed(7)
    assert.same({ 6, 2, 5, "nope.scale", "scale", 3 }, { r.layer, r.block, r.token, r.field, r.kind, r.elem })
    assert.same({ 0, 1 }, { r.expected, r.got })
    assert.truthy(r.message:find("layer 6, block 2, token 5, nope.scale [3]", 1, true), r.message)
  end)

  it("locate a byte in the stride padding and in the page padding", function()
    local c = fresh("layer_major")
    c.buffers[8]:set({ 1, 37440 + 10 }, 3) -- layer 7's own stride padding
    local r = c:check_bleed(7)
    assert.same({ 7, 1, "(stride padding)" }, { r.layer, r.block, r.field })
    c = fresh("layer_major")
    c:layer(9):set({ 0, 37376 + 2 }, 3)
    r = c:check_bleed(7)
    assert.same({ 9, 0, "(page padding)" }, { r.layer, r.block, r.field })
  end)

  it("report a write to a token that was not in the slots", function()
    local c = fresh("block_major")
    c:write(7, mla.randn({ 2, 512 }), slots_of { 2, 3 })
    assert.is_nil(c:check_bleed(7, { slots = { 2, 3 } }))
    local r = c:check_bleed(7, { slots = { 2 } })
    assert.same({ 7, 0, 3, "nope" }, { r.layer, r.block, r.token, r.field })
  end)

  it("locate a corrupted RoPE element of the layer under test when no slots were written", function()
    local c = fresh("layer_major")
    c:layer(7):set({ 1, 576 * 9 + 448 + 2 * 5 + 1 }, 7)
    local r = c:check_bleed(7, { slots = {} })
    assert.same({ 7, 1, 9, "rope", 5 }, { r.layer, r.block, r.token, r.field, r.elem })
  end)
end)

describe("64-bit addressing", function()
  it("writes and reads a block-major layer whose pages x page stride exceed 2^31 bytes", function()
    -- 941 blocks x 61 layers x 37440 B = 2.15 GB of uninitialised (untouched) host memory
    local L = mla.layout.get("fp8_v4")
    local ok, c = pcall(mla.cache.new, { layout = L, num_blocks = 941, block_size = 64, num_layers = LAYERS, order = "block_major" })
    assert(ok, "could not reserve 2.15 GB of address space: " .. tostring(c))
    local v = c:layer(60)
    assert.is_true(v:size(0) * v:stride(0) > 2 ^ 31)
    local last = 940 * 64 + 63
    local slots = slots_of { last, 5 }
    local x = mla.randn({ 2, 512 })
    c:write(60, x, slots)
    local y = c:read(60, slots)
    local ref = mla.zeros({ 941, 37440 }, "u8")
    mla.layout_ref.write(L, ref:narrow(0, 940, 1), x:narrow(0, 0, 1), slots_of { 63 }, { block_size = 64 })
    mla.layout_ref.write(L, ref:narrow(0, 0, 1), x:narrow(0, 1, 1), slots_of { 5 }, { block_size = 64 })
    assert.is_true(y:equal(mla.layout_ref.read(L, ref, slots, { block_size = 64 })))
    -- the scale bytes of the last token sit past 2^31 in the storage
    local byte = (940 * LAYERS + 60) * 37440 + 64 * 576 + 63 * 8
    assert.is_true(byte > 2 ^ 31)
    local flat = c.buffers[1]:view({ -1 })
    for k = 0, 7 do assert.equal(ref:get({ 940, 64 * 576 + 63 * 8 + k }), flat:get({ byte + k })) end
    c.buffers[1]:close()
  end)
end)

describe("a format defined only in Lua, end to end", function()
  local L = mla.layout.define {
    name = "fp8_ue8m0_64",
    doc = "fp8 latent with ue8m0 scales per 64 inline, bf16 RoPE",
    fields = {
      { "nope", "e4m3", 512, scale = { dtype = "ue8m0", group = 64, policy = "pow2", eps = 1e-4 } },
      { "rope", "bf16", 64 },
    },
    v_dims = 512,
    token_align = 8,
  }

  it("runs through a cross-layer cache with zero bleed and a half-step round trip", function()
    local c = mla.cache.new { layout = L, num_blocks = 2, block_size = 32, num_layers = LAYERS, order = "block_major", page_pad = 8 }
    local slots = { 1, 40, 63 }
    local x = mla.randn({ 3, 576 })
    c:poison(11, "zeros")
    c:write(11, x, slots_of(slots))
    assert.is_nil(c:check_bleed(11, { slots = slots }))
    local y = c:read(11, slots_of(slots))
    for r = 0, 2 do
      for d = 0, 575 do
        local xv, yv = x:get({ r, d }), y:get({ r, d })
        assert(math.abs(xv - yv) <= math.abs(xv) * 2 ^ -4 + 2 ^ -9, string.format("row %d dim %d: %g vs %g", r, d, xv, yv))
      end
    end
    -- its scale bytes sit right after the 512 codes of the token, as the description says
    local page = c:layer(11):select(0, 1)
    local t = 40 - 32
    for g = 0, 7 do
      local amax = 0
      for d = 64 * g, 64 * g + 63 do amax = math.max(amax, math.abs(x:get({ 1, d }))) end
      local e = math.ceil(math.log(math.max(amax / 448, 1e-4), 2))
      assert.equal(e + 127, page:get({ t * 648 + 512 + g }))
    end
    assert.truthy(mla.layout.map(L, 32):find("[  512,   520)  nope.scale   8 x ue8m0, one per 64 dims of 'nope'", 1, true))
  end)
end)

describe("caches on a GPU #gpu", function()
  it("write and read through the host reference match a CPU cache bit for bit", function()
    local L = mla.layout.get("fp8_ds_mla")
    local g = mla.cache.new { layout = L, num_blocks = 3, block_size = 64, num_layers = 4, order = "block_major", page_pad = 656, device = "cuda" }
    local h = mla.cache.new { layout = L, num_blocks = 3, block_size = 64, num_layers = 4, order = "block_major", page_pad = 656, device = "cpu" }
    -- the layer itself starts as fresh allocations on two devices: give both the same bytes
    -- (before poisoning, which records the bytes check_bleed compares against)
    g:layer(2):fill(0)
    h:layer(2):fill(0)
    g:poison(2, "zeros")
    h:poison(2, "zeros")
    local slots = slots_of { 0, 100, 191 }
    local x = mla.randn({ 3, 576 })
    g:write(2, x:cuda(), slots:cuda())
    h:write(2, x, slots)
    assert.is_true(g:layer(2):cpu():equal(h:layer(2)))
    assert.is_nil(g:check_bleed(2, { slots = slots }))
    assert.is_true(g:read(2, slots):equal(h:read(2, slots)))
  end)

  it("bf16 rows are written by the baked kernel with the reference's bytes", function()
    for _, name in ipairs { "fp8_ds_mla", "fp8_v4", "fp4_v41" } do
      local L = mla.layout.get(name)
      local opts = { layout = L, num_blocks = 3, block_size = 64, num_layers = LAYERS, order = "block_major", page_pad = L.page_align }
      opts.device = "cuda"
      local g = mla.cache.new(opts)
      opts.device = "cpu"
      local h = mla.cache.new(opts)
      for l = 0, LAYERS - 1 do g:layer(l):fill(0); h:layer(l):fill(0) end
      g:poison(9, "zeros")
      local slots = slots_of { 0, 77, 190, -1 }
      local x = mla.randn({ 4, L.dim }, { dtype = "bf16" })
      g:write(9, x:cuda(), slots:cuda())
      h:write(9, x, slots)
      assert.is_true(g:layer(9):cpu():equal(h:layer(9)), name)
      local report = g:check_bleed(9, { slots = slots })
      assert.is_nil(report, report and report.message)
    end
  end)
end)
