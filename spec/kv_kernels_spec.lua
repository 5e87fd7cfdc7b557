-- KV-cache kernels (mla.kernels): every semantic on small CPU caches
-- against independent oracles (core.ref_write / core.ref_read from the
-- layout work, and Lua models of the index transforms); #gpu: every baked
-- kernel bit-identical to its CPU reference over randomized sizes, on
-- contiguous caches and on per-layer views of a 61-layer block-major cache
-- (random neighbours for reads, zero neighbours that must stay zero for
-- writes), and on a view whose pages x page stride exceed 2^31 bytes.
local mla = require "mlalab"
local S = require "support"
local assert_bytes, perm, dense_batch = S.assert_bytes, S.perm, S.dense_batch
local core = mla.core
local K = mla.kernels

local GARBAGE = S.GARBAGE

-- Helpers ------------------------------------------------------------------------

local rng_seed = 0x6b76
local function rng(seed) math.randomseed(seed or rng_seed) end

-- A single-layer contiguous cache view for layout L.
local function pool(L, nb, bs, dev, scale)
  local c = mla.cache.new { layout = L, num_blocks = nb, block_size = bs, device = dev, tensor_scale = scale }
  local v = c:view(0)
  v.pages:fill(0)
  return v, c
end

local function host_scale(v) return v.tensor_scale and v.tensor_scale:cpu() or nil end

-- Oracle rows: core.ref_read (layout work's reference) rounded once to bf16.
local function oracle_rows(v, slots, ncols)
  local pages = v.pages:cpu()
  local n = #slots
  local out = mla.zeros({ n, ncols or core.layout_unpack(v.desc).dim })
  if n > 0 then core.ref_read(v.desc, pages, mla.tensor(slots, "i64"), out, host_scale(v)) end
  return out:to("bf16")
end

-- Fills n distinct random slots of a CPU view with random rows; returns the slot list.
local function fill_pool(v, n, scale_std)
  local d = core.layout_unpack(v.desc)
  local slots = {}
  local p = perm(v.pages:size(0) * d.block_size)
  for i = 1, n do slots[i] = p[i] end
  local rows = mla.randn({ n, d.dim }, { std = scale_std or 1 }):to("bf16")
  K.write(v, mla.tensor(slots, "i64"), rows)
  return slots, rows
end

local function builtins() return mla.layout.builtins() end

-- Semantics on the CPU ----------------------------------------------------------------

describe("kernels.write (quantize-and-cache)", function()
  for _, name in ipairs(builtins()) do
    it(name .. ": bytes equal core.ref_write of the same rows; -1 skipped; token count from the slot mapping", function()
      rng(1)
      local L = mla.layout.get(name)
      local v = pool(L, 5, 16, "cpu", 0.5)
      local n = 23
      local rows = mla.randn({ n + 4, L.dim }):to("bf16") -- padded: 4 rows past the slot mapping
      local p = perm(5 * 16)
      local sl = {}
      for i = 1, n do sl[i] = p[i] end
      sl[3], sl[11] = -1, -1
      local slots = mla.tensor(sl, "i64")
      K.write(v, slots, rows)
      local want = mla.zeros(v.pages:size(), "u8")
      core.ref_write(v.desc, want, rows:narrow(0, 0, n):float():contiguous(), slots, host_scale(v))
      assert_bytes(v.pages, want, name .. " pages")
      local nonzero = 0
      for _, b in ipairs(S.values(v.pages)) do if b ~= 0 then nonzero = nonzero + 1 end end
      assert.is_true(nonzero > 0)
    end)
  end

  it("k_nope + k_rope as two strided tensors write the same bytes as whole rows", function()
    local L = mla.layout.get("fp8_ds_mla")
    local a, b = pool(L, 3, 8, "cpu"), pool(L, 3, 8, "cpu")
    local wide = mla.randn({ 10, 700 }):to("bf16") -- k_pe is usually a slice of a wider projection
    local nope, rope = wide:narrow(1, 0, 512), wide:narrow(1, 600, 64)
    local whole = mla.empty({ 10, 576 }, "bf16")
    whole:narrow(1, 0, 512):copy(nope)
    whole:narrow(1, 512, 64):copy(rope)
    local slots = mla.tensor({ 0, 9, 23, 4, 17, -1, 8, 2, 11, 20 }, "i32")
    K.write(a, slots, nope, rope)
    K.write(b, slots, whole)
    assert_bytes(a.pages, b.pages, "split vs whole")
  end)

  it("writes through a per-layer view of a block-major cache: same bytes, neighbours stay zero", function()
    rng(2)
    local L = mla.layout.get("fp8_v4")
    local c = mla.cache.new { layout = L, num_blocks = 4, block_size = 8, num_layers = 3, order = "block_major" }
    local v = c:view(1)
    v.pages:fill(0)
    c:poison(1, "zeros")
    local ref = pool(L, 4, 8, "cpu")
    local rows = mla.randn({ 12, L.dim }):to("bf16")
    local p = perm(32)
    local sl = {}
    for i = 1, 12 do sl[i] = p[i] end
    local slots = mla.tensor(sl, "i64")
    K.write(v, slots, rows)
    K.write(ref, slots, rows)
    assert_bytes(v.pages, ref.pages, "view vs contiguous")
    assert.is_nil(c:check_bleed(1, { slots = sl }))
  end)

  it("rejects rows of the wrong dtype, width or count, a slot past the cache, a missing tensor scale", function()
    local L = mla.layout.get("fp8_ds_mla")
    local v = pool(L, 2, 4, "cpu")
    local slots = mla.tensor({ 0, 1 }, "i64")
    S.assert_error_contains(function() K.write(v, slots, mla.randn({ 2, 576 })) end, "rows must be a 2-dim bf16 tensor, got f32")
    S.assert_error_contains(function() K.write(v, slots, mla.randn({ 2, 512 }):to("bf16")) end,
      "rows has 512 columns, the layout's row has 576 dims")
    S.assert_error_contains(function() K.write(v, slots, mla.randn({ 1, 576 }):to("bf16")) end,
      "slot_mapping maps 2 tokens but rows has only 1 rows")
    S.assert_error_contains(function() K.write(v, mla.tensor({ 0, 8 }, "i64"), mla.randn({ 2, 576 }):to("bf16")) end,
      "slot_mapping[1] = 8 is past the cache (2 pages of 4 tokens)")
    S.assert_error_contains(function() K.write(v, mla.tensor({ 0, 1 }, "f32"), mla.randn({ 2, 576 }):to("bf16")) end,
      "slot_mapping must be a 1-dim i32 or i64 tensor, got f32")
    local t = pool(mla.layout.get("fp8_pertensor"), 2, 4, "cpu")
    t.tensor_scale = nil
    S.assert_error_contains(function() K.write(t, slots, mla.randn({ 2, 576 }):to("bf16")) end, "pass tensor_scale")
  end)
end)

describe("kernels.gather_sparse", function()
  for _, name in ipairs(builtins()) do
    it(name .. ": rows equal the reference read; -1 rows are neither loaded nor stored", function()
      rng(3)
      local L = mla.layout.get(name)
      local v = pool(L, 6, 16, "cpu", 0.375)
      local written = fill_pool(v, 60)
      local sl = {}
      for i = 1, 40 do sl[i] = written[(i * 7) % #written + 1] end
      sl[5], sl[17], sl[40] = -1, -1, -1
      local out = mla.full({ 40, L.dim }, 3, "bf16")
      K.gather_sparse(v, mla.tensor(sl, "i32"), { out = out })
      local want = oracle_rows(v, sl)
      for _, i in ipairs { 5, 17, 40 } do want:select(0, i - 1):fill(3) end -- untouched rows keep their contents
      assert_bytes(out, want, name)
    end)
  end

  it("gathers the first ncols dims only (V = the first 512) and returns remap = i or -1", function()
    local L = mla.layout.get("fp8_ds_mla")
    local v = pool(L, 2, 8, "cpu")
    local written = fill_pool(v, 10)
    local sl = { written[1], -1, written[2], written[3] }
    local out, remap = K.gather_sparse(v, mla.tensor(sl, "i64"), { ncols = 512, remap = true })
    assert.same({ 4, 512 }, out:size())
    assert_bytes(out:narrow(0, 0, 1), oracle_rows(v, { sl[1] }, 512), "row 0")
    assert_bytes(out:narrow(0, 2, 2), oracle_rows(v, { sl[3], sl[4] }, 512), "rows 2, 3")
    assert.same({ 0, -1, 2, 3 }, remap:totable())
  end)

  it("reads a per-layer view of a block-major cache with random neighbours bit-identically", function()
    rng(4)
    local L = mla.layout.get("fp8_ds_mla")
    local ref = pool(L, 4, 8, "cpu")
    local written = fill_pool(ref, 20)
    local c = mla.cache.new { layout = L, num_blocks = 4, block_size = 8, num_layers = 3, order = "block_major" }
    c:poison(2, "random")
    local v = c:view(2)
    v.pages:copy(ref.pages)
    assert.is_false(v.pages:is_contiguous())
    assert_bytes(K.gather_sparse(v, mla.tensor(written, "i64")), K.gather_sparse(ref, mla.tensor(written, "i64")), "view")
  end)
end)

describe("kernels.gather_dense", function()
  for _, name in ipairs { "fp8_ds_mla", "fp8_v4", "bf16", "fp8_pertensor" } do
    it(name .. ": per request through the block table and cu_seq_lens, with start offsets; rows past cu[B] untouched",
      function()
        rng(5)
        local L = mla.layout.get(name)
        local bs = 8
        local v = pool(L, 12, bs, "cpu", 2)
        fill_pool(v, 12 * bs)
        for _, with_starts in ipairs { false, true } do
          local b = dense_batch(12, bs, 5, with_starts)
          assert.is_true(b.total > 0)
          local out = mla.full({ b.total + 3, L.dim }, -5, "bf16") -- num_tokens as an upper bound
          K.gather_dense(v, mla.tensor(b.bt, "i32"), mla.tensor(b.cu, "i32"),
            { out = out, seq_starts = with_starts and mla.tensor(b.starts, "i32") or nil })
          assert_bytes(out:narrow(0, 0, b.total), oracle_rows(v, b.slots), name .. " rows")
          assert_bytes(out:narrow(0, b.total, 3), mla.full({ 3, L.dim }, -5, "bf16"), "rows past cu[B]")
        end
      end)
  end

  it("raises when a position needs a block-table column the table does not have", function()
    local v = pool(mla.layout.get("bf16"), 4, 4, "cpu")
    S.assert_error_contains(function()
      K.gather_dense(v, mla.tensor({ { 0, 1 } }, "i32"), mla.tensor({ 0, 9 }, "i32"), { out = mla.zeros({ 9, 576 }, "bf16") })
    end, "request 0: position 8 needs block_table column 2, the table has 2")
    -- without out, the rows are checked before the output is allocated (a wrong total could make it enormous)
    for _, gather in ipairs { K.gather_dense, K.gather_raw } do
      S.assert_error_contains(function()
        gather(v, mla.tensor({ { 0, 1 } }, "i32"), mla.tensor({ 0, 9 }, "i32"))
      end, "cu_seq_lens[B] = 9 must be a row count from 0 to the 8 tokens the block table holds")
      S.assert_error_contains(function()
        gather(v, mla.tensor({ { 0, 1 } }, "i32"), mla.tensor({ 0, 2147483647 }, "i32"))
      end, "cu_seq_lens[B] = 2147483647 must be a row count")
      S.assert_error_contains(function()
        gather(v, mla.tensor({ { 0, 1 } }, "i32"), mla.tensor({ 0, 4 }, "i32"), { num_rows = -3 })
      end, "num_rows = -3 must be a row count")
      S.assert_error_contains(function() gather(v, mla.tensor({ { 0, 1 } }, "i32"), mla.tensor({ 0, 4 }, "i32"), 5) end,
        "opts must be a table, got number")
    end
    S.assert_error_contains(function() K.gather_sparse(v, mla.tensor({ 0, 1 }, "i32"), { ncols = 1 << 30 }) end,
      "gather_sparse: ncols = 1073741824 must be an integer from 8 to the layout's 576 dims")
    -- arguments that are not tensors are named
    S.assert_error_contains(function() K.write(v, { 0, 1 }) end, "write: rows must be a bf16 tensor [T, dim]")
    S.assert_error_contains(function() K.write(v, nil, mla.randn({ 2, 576 }):to("bf16")) end, "write: slot_mapping must be an index tensor")
    S.assert_error_contains(function() K.gather_sparse(v, { 0, 1 }, { out = "x" }) end, "gather_sparse: opts.out must be a bf16 tensor")
    S.assert_error_contains(function() K.compact(v, nil) end, "compact: indices must be an index tensor or a list of integers, got nil")
    S.assert_error_contains(function() K.gather_referenced(v, 3) end, "gather_referenced: indices must be an index tensor")
    S.assert_error_contains(function() K.topk_paged(5, { { 0 } }, 4) end, "topk_paged: topk must be an index tensor or a list of integers, got number")
    S.assert_error_contains(function() K.topk_ragged(nil, { 0, 1 }) end, "topk_ragged: topk must be an index tensor or a list of integers, got nil")
    S.assert_error_contains(function() K.topk_paged({ { 0 } }, { { 0 } }, 0.5) end, "topk_paged: block_size must be an integer in [1, 2^31 - 1], got 0.5")
    S.assert_error_contains(function() K.topk_paged({ { 0 } }, { { 0 } }, 1 << 40) end, "topk_paged: block_size must be an integer in [1, 2^31 - 1]")
    S.assert_error_contains(function() K.gather_dense(v, { { 0, 1 } }, mla.tensor({ { 0, 4 } }, "i32")) end,
      "gather_dense: cu_seq_lens must be a 1-dim index tensor of B + 1 entries")
    S.assert_error_contains(function()
      K.gather_dense(v, mla.tensor({ { 0, 7 } }, "i32"), mla.tensor({ 0, 6 }, "i32"))
    end, "block_table[0, 1] = 7 is not a page of the cache (4 pages)")
    S.assert_error_contains(function()
      K.gather_dense(v, mla.tensor({ { 0, 1 } }, "i32"), mla.tensor({ 0, 2, 4 }, "i32"))
    end, "block_table has 1 rows for 2 requests")
  end)
end)

describe("kernels.gather_raw (indexer K as stored)", function()
  for _, name in ipairs { "indexer_fp8", "indexer_fp8_ue8m0" } do
    it(name .. ": fp8 keys and f32 scales of each token, page-split, as the cache holds them", function()
      rng(6)
      local L = mla.layout.get(name)
      local bs = 16
      local v = pool(L, 6, bs, "cpu")
      fill_pool(v, 6 * bs)
      local b = dense_batch(6, bs, 3, true)
      local out = K.gather_raw(v, mla.tensor(b.bt, "i32"), mla.tensor(b.cu, "i32"), { seq_starts = mla.tensor(b.starts, "i32") })
      local d = core.layout_unpack(v.desc)
      assert.equal(2, #out)
      local keys, scales = core.tensor_bytes(out[1]), core.tensor_bytes(out[2])
      for i, slot in ipairs(b.slots) do
        local page = core.tensor_bytes(v.pages:select(0, slot // bs))
        local t = slot % bs
        assert.equal(page:sub(t * 128 + 1, t * 128 + 128), keys:sub((i - 1) * 128 + 1, i * 128))
        local so = d.region_off[2] + t * 4
        assert.equal(page:sub(so + 1, so + 4), scales:sub((i - 1) * 4 + 1, i * 4))
      end
      assert.is_true(#b.slots > 0)
    end)
  end
end)

describe("kernels.requant fp8_pertensor (576 B) -> fp8_ds_mla (656 B)", function()
  for _, s in ipairs { 1.0, 0.25, 0.3 } do
    it(string.format("tensor scale %g: NoPE bytes copied, scales = the tensor scale, RoPE = bf16(fp8 * s); values preserved", s),
      function()
        rng(7)
        local bs = 8
        local src = pool(mla.layout.get("fp8_pertensor"), 4, bs, "cpu", s)
        local dst = pool(mla.layout.get("fp8_ds_mla"), 4, bs, "cpu")
        dst.pages:fill(0xAB)
        fill_pool(src, 4 * bs, 40) -- wide values: codes across the e4m3 range
        K.requant(src, dst)
        local all = {}
        for i = 0, 4 * bs - 1 do all[i + 1] = i end
        local gs = K.gather_sparse(src, mla.tensor(all, "i64"))
        assert_bytes(K.gather_sparse(dst, mla.tensor(all, "i64")), gs, "dequantized values")
        local scale_bytes = string.rep(string.pack("<f", s), 4)
        for slot = 0, 4 * bs - 1 do
          local t = slot % bs
          local a = core.tensor_bytes(src.pages:select(0, slot // bs)):sub(t * 576 + 1, t * 576 + 576)
          local b = core.tensor_bytes(dst.pages:select(0, slot // bs)):sub(t * 656 + 1, t * 656 + 656)
          assert.equal(a:sub(1, 512), b:sub(1, 512))
          assert.equal(scale_bytes, b:sub(513, 528))
          assert.equal(core.tensor_bytes(gs:select(0, slot):narrow(0, 512, 64)), b:sub(529, 656))
        end
      end)
  end

  it("rejects layout pairs it cannot repack losslessly, naming the dims", function()
    local p576, p656, pbf = pool(mla.layout.get("fp8_pertensor"), 2, 4, "cpu"), pool(mla.layout.get("fp8_ds_mla"), 2, 4, "cpu"),
        pool(mla.layout.get("bf16"), 2, 4, "cpu")
    S.assert_error_contains(function() K.requant(p656, p576) end,
      "destination dims [0, 8) are e4m3 under a per-tensor scale; a destination chunk is either the source codes")
    S.assert_error_contains(function() K.requant(p656, (pool(mla.layout.get("fp8_v4"), 2, 4, "cpu"))) end,
      "the source row has 576 dims, the destination 512")
    S.assert_error_contains(function() K.requant(p656, (pool(mla.layout.define { name = "spec_requant_g64", v_dims = 512,
      fields = { { "nope", "e4m3", 512, scale = { dtype = "f32", group = 64, eps = 1e-4 } }, { "rope", "bf16", 64 } } }, 2, 4, "cpu"))) end,
      "dims [0, 8) carry group scales on both sides but as e4m3 in groups of 128 under f32 scales (source) and e4m3 in groups of 64")
    S.assert_error_contains(function() K.requant(pbf, p656) end,
      "destination dims [0, 8) store e4m3 under group scales but the source stores bf16")
    S.assert_error_contains(function() K.requant(p576, (pool(mla.layout.get("fp8_ds_mla"), 1, 4, "cpu"))) end,
      "the destination has 1 pages, the source 2")
    S.assert_error_contains(function() K.requant(p576, (pool(mla.layout.get("fp8_ds_mla"), 2, 8, "cpu"))) end,
      "block sizes differ (4 vs 8)")
  end)
end)

describe("kernels.requant between layouts of the same group scales (a relayout)", function()
  for _, pair in ipairs { { "fp8_ds_mla", "fp8_ds_mla_blocked" }, { "fp8_ds_mla_blocked", "fp8_ds_mla" } } do
    it(pair[1] .. " -> " .. pair[2] .. ": the bytes the destination's own writer gives, values kept", function()
      for _, bs in ipairs { 64, 5 } do
        rng(11 + bs)
        local A, B = mla.layout.get(pair[1]), mla.layout.get(pair[2])
        local src, dst, want = pool(A, 3, bs, "cpu"), pool(B, 3, bs, "cpu"), pool(B, 3, bs, "cpu")
        dst.pages:fill(0xAB)
        want.pages:fill(0)
        local n = 3 * bs
        local x = mla.randn({ n, 576 }, { std = 3 }):to("bf16")
        local all = mla.arange(n, "i64")
        K.write(src, all, x)
        K.write(want, all, x)
        K.requant(src, dst)
        -- codes and scales move unchanged; the bf16 RoPE is copied
        assert_bytes(dst.pages, want.pages, "relayout bytes, block size " .. bs)
        assert_bytes(K.gather_sparse(dst, all), K.gather_sparse(src, all), "values")
      end
    end)
  end
end)

describe("referenced-slot dequant for fallbacks", function()
  local function indices_for(nb, bs, T, Kw, npages)
    local pages = perm(nb)
    local idx = {}
    for t = 1, T do
      idx[t] = {}
      for k = 1, Kw do
        idx[t][k] = (k % 5 == 0) and -1 or pages[math.random(npages)] * bs + math.random(0, bs - 1)
      end
    end
    return idx
  end

  it("compact: only referenced pages, ascending; remapped indices address the same rows", function()
    rng(8)
    local L = mla.layout.get("fp8_ds_mla")
    local bs = 4
    local v = pool(L, 10, bs, "cpu")
    fill_pool(v, 40)
    local idx = indices_for(10, bs, 3, 12, 4)
    local rows, remap, pages = K.compact(v, mla.tensor(idx, "i32"))
    local want_pages, seen = {}, {}
    for _, r in ipairs(idx) do for _, x in ipairs(r) do if x >= 0 and not seen[x // bs] then seen[x // bs] = true want_pages[#want_pages + 1] = x // bs end end end
    table.sort(want_pages)
    assert.same(want_pages, pages:totable())
    local slots = {}
    for _, p in ipairs(want_pages) do for t = 0, bs - 1 do slots[#slots + 1] = p * bs + t end end
    assert_bytes(rows, oracle_rows(v, slots), "compact rows")
    local rank = {}
    for i, p in ipairs(want_pages) do rank[p] = i - 1 end
    local rm = remap:totable()
    local checked = 0
    for t, r in ipairs(idx) do
      for k, x in ipairs(r) do
        local want = x < 0 and -1 or rank[x // bs] * bs + x % bs
        assert.equal(want, rm[t][k])
        checked = checked + 1
      end
    end
    assert.equal(36, checked)
  end)

  it("compact, capacity mode: the exact mode's pages, rows and remap, -1 tail, rows past the count untouched", function()
    rng(18)
    local L = mla.layout.get("fp8_ds_mla")
    local bs = 4
    local v = pool(L, 12, bs, "cpu")
    fill_pool(v, 48)
    local idx = mla.tensor(indices_for(12, bs, 4, 10, 7), "i64")
    local r1, m1, p1 = K.compact(v, idx)
    local n = p1:numel()
    assert.is_true(n >= 3)
    -- room for n + 2 pages; the 2 spare pages' rows hold a sentinel that must survive
    local out = mla.full({ (n + 2) * bs, L.dim }, -3.25, "bf16", "cpu")
    -- pages and count as views past the start of their storage
    local pbuf, cbuf = mla.full({ n + 5 }, 99, "i64", "cpu"), mla.full({ 3 }, 99, "i64", "cpu")
    local rows, remap, pages, count = K.compact(v, idx,
      { out = out, pages = pbuf:narrow(0, 3, n + 2), count = cbuf:narrow(0, 2, 1) })
    assert.same({ 99, 99, 99 }, { pbuf:get({ 0 }), pbuf:get({ 1 }), pbuf:get({ 2 }) })
    assert.same({ 99, 99 }, { cbuf:get({ 0 }), cbuf:get({ 1 }) })
    assert.equal(out, rows)
    assert.equal(n, count:item())
    local want = p1:totable()
    want[n + 1], want[n + 2] = -1, -1
    assert.same(want, pages:totable())
    assert.same(m1:totable(), remap:totable())
    assert_bytes(rows:narrow(0, 0, n * bs):contiguous(), r1, "capacity rows")
    assert_bytes(rows:narrow(0, n * bs, 2 * bs):contiguous(), mla.full({ 2 * bs, L.dim }, -3.25, "bf16", "cpu"),
      "rows past the count")

    -- capacity short by 2 pages: check raises; check = false keeps the first cap pages
    local cap = n - 2
    local small = mla.empty({ cap * bs, L.dim }, "bf16", "cpu")
    assert.has_error(function() K.compact(v, idx, { out = small }) end,
      string.format("compact: indices refer to %d pages but the capacity is %d (pages has %d entries; out holds %d "
        .. "rows of block size %d): the outputs hold only the first %d", n, cap, cap, cap * bs, bs, cap))
    local rows2, remap2, pages2, count2 = K.compact(v, idx, { out = small, check = false })
    assert.equal(n, count2:item())
    assert.same({ table.unpack(p1:totable(), 1, cap) }, pages2:totable())
    assert_bytes(rows2, r1:narrow(0, 0, cap * bs):contiguous(), "rows within the capacity")
    local rm, rm2, dropped = m1:totable(), remap2:totable(), 0
    for t = 1, #rm do
      for k = 1, #rm[t] do
        local want_k = rm[t][k]
        if want_k >= cap * bs then want_k, dropped = -1, dropped + 1 end
        assert.equal(want_k, rm2[t][k])
      end
    end
    assert.is_true(dropped > 0)
  end)

  it("compact, capacity mode: bad outputs are named", function()
    rng(19)
    local L = mla.layout.get("fp8_v4")
    local bs = 4
    local v = pool(L, 6, bs, "cpu")
    fill_pool(v, 24)
    local idx = mla.tensor(indices_for(6, bs, 2, 6, 6), "i32")
    local out = mla.empty({ 6 * bs, L.dim }, "bf16", "cpu")
    local cases = {
      { { out = mla.empty({ 6 * bs, L.dim }, "f32", "cpu") }, "out" },
      { { out = out, pages = mla.empty({ 6 }, "i32", "cpu") }, "pages must be a contiguous 1-dim i64 tensor" },
      { { out = out, pages = mla.empty({ 7 }, "i64", "cpu") }, "fewer than pages' capacity of 7 pages" },
      { { out = out, count = mla.empty({ 2 }, "i64", "cpu") }, "count must be an i64 tensor of 1 element" },
      { { out = out, remap = mla.empty({ 12 }, "i32", "cpu") }, "remap must have the shape of indices" },
      { { out = out, ncols = 64 }, "ncols = 64 but out has " .. L.dim .. " columns" },
      { { pages = mla.empty({ 6 }, "i64", "cpu") }, "pages, remap and count outputs need out" },
    }
    local ok, err = pcall(K.compact, { pages = v.pages }, idx)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("compact: the cache table has no layout", 1, true), tostring(err))
    for _, c in ipairs(cases) do
      local ok, err = pcall(K.compact, v, idx, c[1])
      assert.is_false(ok)
      assert.truthy(tostring(err):find(c[2], 1, true), tostring(err))
    end
  end)

  it("per-token gather (graph safe): one row per index, shape from the index tensor alone", function()
    rng(9)
    local L = mla.layout.get("fp8_v4")
    local bs = 8
    local v = pool(L, 6, bs, "cpu")
    fill_pool(v, 48)
    local idx = indices_for(6, bs, 2, 10, 6)
    local rows, remap = K.gather_referenced(v, mla.tensor(idx, "i64"))
    assert.same({ 20, L.dim }, rows:size())
    assert.same({ 2, 10 }, remap:size())
    local flat, want_remap = {}, {}
    for t, r in ipairs(idx) do
      want_remap[t] = {}
      for k, x in ipairs(r) do
        flat[#flat + 1] = x
        want_remap[t][k] = x >= 0 and #flat - 1 or -1
      end
    end
    assert.same(want_remap, remap:totable())
    local valid = 0
    for i, x in ipairs(flat) do
      if x >= 0 then
        valid = valid + 1
        assert_bytes(rows:narrow(0, i - 1, 1), oracle_rows(v, { x }), "row " .. (i - 1))
      end
    end
    assert.is_true(valid > 0)
  end)
end)

-- Lua models of the transforms.
local function model_paged(topk, bt, bs, req_of)
  local out, lens = {}, {}
  for t, row in ipairs(topk) do
    out[t], lens[t] = {}, 0
    local r = req_of(t - 1)
    for k, x in ipairs(row) do
      if x >= 0 and r then
        out[t][k] = bt[r + 1][x // bs + 1] * bs + x % bs
        lens[t] = lens[t] + 1
      else
        out[t][k] = -1
      end
    end
  end
  return out, lens
end

local function model_ragged(topk, cu_k, req_of)
  local out, lens = {}, {}
  for t, row in ipairs(topk) do
    out[t], lens[t] = {}, 0
    local r = req_of(t - 1)
    for k, x in ipairs(row) do
      if x >= 0 and r then
        out[t][k] = x + cu_k[r + 1]
        lens[t] = lens[t] + 1
      else
        out[t][k] = -1
      end
    end
  end
  return out, lens
end

-- Requests with q_lens query tokens each and kv_lens keys; local top-k rows.
local function topk_batch(q_lens, kv_lens, width)
  local topk, req = {}, {}
  for r, q in ipairs(q_lens) do
    for _ = 1, q do
      local row = {}
      local p = perm(kv_lens[r])
      for k = 1, width do row[k] = (k <= #p and math.random() < 0.85) and p[k] or -1 end
      topk[#topk + 1] = row
      req[#req + 1] = r - 1
    end
  end
  return topk, req
end

describe("top-k index transforms", function()
  it("PAGED decode (request = query token): block_table[r, p / bs] * bs + p % bs, -1 kept, lens", function()
    local bt = { { 3, 1, GARBAGE }, { 0, 2, GARBAGE } }
    local topk = mla.tensor({ { 0, 5, -1, 4 }, { 7, -1, -1, 1 } }, "i32")
    local out, lens = K.topk_paged(topk, mla.tensor(bt, "i32"), 4, { lens = true })
    assert.same({ { 12, 5, -1, 4 }, { 11, -1, -1, 1 } }, out:totable())
    assert.same({ 3, 2 }, lens:totable())
  end)

  it("PAGED prefill: each query token of a request uses that request's row (q_lens, cu_q or token_req)", function()
    rng(10)
    local q_lens, kv_lens, bs = { 2, 0, 3, 1 }, { 9, 5, 20, 3 }, 4
    local topk, req = topk_batch(q_lens, kv_lens, 12)
    local bt, p = {}, perm(40)
    for r = 1, 4 do
      bt[r] = {}
      for j = 1, 6 do bt[r][j] = p[(r - 1) * 6 + j] end
    end
    local want, wlens = model_paged(topk, bt, bs, function(t) return req[t + 1] end)
    local tk, btt = mla.tensor(topk, "i32"), mla.tensor(bt, "i32")
    local a, la = K.topk_paged(tk, btt, bs, { q_lens = q_lens, lens = true })
    local b = K.topk_paged(tk, btt, bs, { cu_q = { 0, 2, 2, 5, 6 } })
    local c = K.topk_paged(tk, btt, bs, { token_req = mla.tensor(req, "i64"), dtype = "i64" })
    assert.same(want, a:totable())
    assert.same(wlens, la:totable())
    assert.same(want, b:totable())
    assert.same(want, c:totable())
  end)

  it("RAGGED: position + the request's offset in the concatenated K (lens 2,3,4 -> offsets 0,0,2,2,2,5,5,5,5)", function()
    local topk = {}
    local lens = { 2, 3, 4 }
    for r = 1, 3 do for _ = 1, lens[r] do topk[#topk + 1] = { 0, 1, -1 } end end
    local out = K.topk_ragged(mla.tensor(topk, "i32"), mla.tensor({ 0, 2, 5, 9 }, "i32"), { q_lens = lens })
    local off = { 0, 0, 2, 2, 2, 5, 5, 5, 5 }
    local want = {}
    for i, o in ipairs(off) do want[i] = { o, o + 1, -1 } end
    assert.same(want, out:totable())
  end)

  it("padding query tokens past cu_q[B] give -1 rows and length 0", function()
    local topk = mla.tensor({ { 1, 0 }, { 2, -1 }, { 0, 1 } }, "i32")
    local out, lens = K.topk_ragged(topk, mla.tensor({ 0, 4 }, "i32"), { cu_q = { 0, 2 }, lens = true })
    assert.same({ { 1, 0 }, { 2, -1 }, { -1, -1 } }, out:totable())
    assert.same({ 2, 1, 0 }, lens:totable())
  end)

  it("RAGGED over a dense gather addresses the same rows as PAGED over a sparse gather", function()
    rng(11)
    local bs = 4
    local L = mla.layout.get("fp8_ds_mla")
    local v = pool(L, 16, bs, "cpu")
    fill_pool(v, 64)
    local kv_lens, q_lens = { 6, 11, 3 }, { 2, 1, 3 }
    local bt, p, cu_k = {}, perm(16), { 0 }
    for r = 1, 3 do
      bt[r] = {}
      for j = 1, 4 do bt[r][j] = p[(r - 1) * 4 + j] end
      cu_k[r + 1] = cu_k[r] + kv_lens[r]
    end
    local topk = topk_batch(q_lens, kv_lens, 8)
    local tk, btt = mla.tensor(topk, "i32"), mla.tensor(bt, "i32")
    local ragged_k = K.gather_dense(v, btt, mla.tensor(cu_k, "i32"))
    local ragged = K.topk_ragged(tk, mla.tensor(cu_k, "i32"), { q_lens = q_lens })
    local paged = K.topk_paged(tk, btt, bs, { q_lens = q_lens })
    local flat = pool(mla.layout.get("bf16"), cu_k[4], 1, "cpu") -- the ragged K as a page-size-1 bf16 pool
    K.write(flat, mla.arange(cu_k[4]), ragged_k)
    local a = K.gather_sparse(flat, ragged:reshape({ 48 }))
    local b = K.gather_sparse(v, paged:reshape({ 48 }))
    assert_bytes(a, b, "ragged vs paged rows")
  end)

  it("rejects two ways of naming requests at once, and a topk column past the block table", function()
    local tk = mla.tensor({ { 9 } }, "i32")
    S.assert_error_contains(function()
      K.topk_paged(tk, mla.tensor({ { 0 } }, "i32"), 4, { cu_q = { 0, 1 }, token_req = { 0 } })
    end, "as token_req or as cu_q, not both")
    S.assert_error_contains(function() K.topk_paged(tk, mla.tensor({ { 0, 1 } }, "i32"), 4) end,
      "topk[0, 0] = 9 needs block_table column 2, the table has 2")
  end)

  it("names a slot past the output's range instead of overflowing (argument fuzz, seed 10)", function()
    -- an i64 block table's page times the block size would overflow int64 before the range check
    local tk = mla.tensor({ { 5 } }, "i32")
    local bt = mla.tensor({ { 1 << 40 } }, "i64")
    S.assert_error_contains(function() K.topk_paged(tk, bt, 1 << 30, { dtype = "i64" }) end,
      "block_table[0, 0] = 1099511627776: its slot (topk[0, 0]) does not fit the i64 output")
    S.assert_error_contains(function() K.topk_paged(tk, bt, 16) end, "does not fit the i32 output")
    assert.same({ { (1 << 40) * 16 + 5 } }, K.topk_paged(tk, bt, 16, { dtype = "i64" }):totable())
    -- RAGGED: cu_k + position, summed only when it fits
    local M = math.maxinteger
    S.assert_error_contains(function() K.topk_ragged(tk, mla.tensor({ M - 3, M - 1 }, "i64"), { dtype = "i64" }) end,
      "cu_k[0] = 9223372036854775804 + topk[0, 0] = 5 does not fit the i64 output")
    assert.same({ { M - 2 } }, K.topk_ragged(mla.tensor({ { 1 } }, "i32"), mla.tensor({ M - 3, M - 1 }, "i64"), { dtype = "i64" }):totable())
  end)
end)

-- GPU: baked kernels bit-identical to the CPU references ------------------------------

-- A CPU pool and the same content on the GPU: contiguous, or layer `li` of a
-- 61-layer block-major cache whose other layers hold random bytes.
local function gpu_twin(v, kind, li)
  local d = core.layout_unpack(v.desc)
  if kind == "contiguous" then
    local g = pool(mla.layout.get(v.layout.name), v.pages:size(0), d.block_size, "cuda")
    g.pages:copy(v.pages)
    if v.tensor_scale then g.tensor_scale:copy(v.tensor_scale) end
    return g
  end
  local c = mla.cache.new { layout = v.layout, num_blocks = v.pages:size(0), block_size = d.block_size, num_layers = 61,
    order = "block_major", device = "cuda" }
  c:poison(li, "random")
  local g = c:view(li)
  g.pages:copy(v.pages)
  if v.tensor_scale then g.tensor_scale:copy(v.tensor_scale) end
  return g, c
end

local function random_case(name, seed)
  rng(seed)
  local L = mla.layout.get(name)
  local bs = ({ 1, 4, 16, 64 })[math.random(4)]
  local nb = math.random(3, 12)
  local v = pool(L, nb, bs, "cpu", ({ 1, 0.5, 0.3 })[math.random(3)])
  fill_pool(v, math.max(1, (nb * bs * 3) // 4), ({ 1, 30, 0.01 })[math.random(3)])
  return v, L, bs, nb
end

describe("baked kernels vs CPU references #gpu", function()
  for _, name in ipairs(builtins()) do
    for _, kind in ipairs { "contiguous", "61-layer view" } do
      it(name .. ", " .. kind .. ": write bytes identical, neighbours stay zero", function()
        for seed = 1, 3 do
          rng(100 + seed)
          local L = mla.layout.get(name)
          local bs, nb = ({ 1, 4, 16, 64 })[math.random(4)], math.random(3, 10)
          local cpu = pool(L, nb, bs, "cpu", 0.75)
          local g, c
          if kind == "contiguous" then g = pool(L, nb, bs, "cuda", 0.75)
          else
            c = mla.cache.new { layout = L, num_blocks = nb, block_size = bs, num_layers = 61, order = "block_major",
              device = "cuda", tensor_scale = 0.75 }
            g = c:view(60)
            g.pages:fill(0)
            c:poison(60, "zeros")
          end
          local n = math.random(1, nb * bs)
          local p, sl = perm(nb * bs), {}
          for i = 1, n do sl[i] = (i % 7 == 3) and -1 or p[i] end
          local rows = mla.randn({ n + 2, L.dim }, { std = ({ 1, 50, 1e-3 })[seed] }):to("bf16")
          K.write(cpu, mla.tensor(sl, "i64"), rows)
          K.write(g, mla.tensor(sl, "i64", "cuda"), rows:cuda())
          assert_bytes(g.pages:cpu(), cpu.pages, string.format("%s seed %d", name, seed))
          if c then assert.is_nil(c:check_bleed(60, { slots = sl })) end
        end
      end)

      it(name .. ", " .. kind .. ": sparse, dense and raw gathers identical to the CPU", function()
        for seed = 1, 3 do
          local v, L, bs, nb = random_case(name, 200 + seed)
          local g = gpu_twin(v, kind, math.random(0, 60))
          local n = math.random(1, 300)
          local sl = {}
          for i = 1, n do sl[i] = math.random() < 0.1 and -1 or math.random(0, nb * bs - 1) end
          local st = mla.tensor(sl, "i32")
          local a = K.gather_sparse(v, st, { remap = true })
          local b, rb = K.gather_sparse(g, st:cuda(), { remap = true })
          assert_bytes(b:cpu(), a, name .. " sparse")
          local _, ra = K.gather_sparse(v, st, { remap = true })
          assert.same(ra:totable(), rb:cpu():totable())
          local batch = dense_batch(nb, bs, math.random(1, 6), true)
          local bt, cu, ss = mla.tensor(batch.bt, "i32"), mla.tensor(batch.cu, "i32"), mla.tensor(batch.starts, "i32")
          local o = { seq_starts = ss, num_rows = batch.total + 5 }
          local da = K.gather_dense(v, bt, cu, o)
          local db = K.gather_dense(g, bt:cuda(), cu:cuda(), { seq_starts = ss:cuda(), num_rows = batch.total + 5 })
          assert_bytes(db:cpu(), da, name .. " dense")
          local ra_, rg = K.gather_raw(v, bt, cu, o), K.gather_raw(g, bt:cuda(), cu:cuda(), { seq_starts = ss:cuda(), num_rows = batch.total + 5 })
          for r = 1, #ra_ do assert_bytes(rg[r]:cpu(), ra_[r], name .. " raw region " .. r) end
        end
      end)
    end
  end

  for _, kind in ipairs { "contiguous", "61-layer view" } do
    it("requant 576 -> 656, " .. kind .. ": bytes identical to the CPU, destination neighbours untouched", function()
      for _, s in ipairs { 1.0, 0.125, 0.3 } do
        rng(300)
        local bs, nb = 64, 9
        local src = pool(mla.layout.get("fp8_pertensor"), nb, bs, "cpu", s)
        fill_pool(src, nb * bs, 20)
        local dst = pool(mla.layout.get("fp8_ds_mla"), nb, bs, "cpu")
        K.requant(src, dst)
        local gs = gpu_twin(src, kind, 7)
        local gd, c
        if kind == "contiguous" then gd = pool(mla.layout.get("fp8_ds_mla"), nb, bs, "cuda")
        else
          c = mla.cache.new { layout = "fp8_ds_mla", num_blocks = nb, block_size = bs, num_layers = 61, order = "block_major", device = "cuda" }
          gd = c:view(0)
          gd.pages:fill(0)
          c:poison(0, "zeros")
        end
        K.requant(gs, gd)
        assert_bytes(gd.pages:cpu(), dst.pages, "requant s = " .. s)
        if c then assert.is_nil(c:check_bleed(0)) end
      end
    end)
  end

  it("compaction and the per-token gather identical to the CPU, -1 padding kept", function()
    for seed = 1, 3 do
      local v, _, bs, nb = random_case(({ "fp8_ds_mla", "fp8_v4", "fp4_v41" })[seed], 400 + seed)
      local g = gpu_twin(v, "61-layer view", 30)
      local idx = {}
      for t = 1, 5 do
        idx[t] = {}
        for k = 1, 64 do idx[t][k] = math.random() < 0.2 and -1 or math.random(0, nb * bs - 1) end
      end
      local it_ = mla.tensor(idx, "i32")
      local r1, m1, p1 = K.compact(v, it_)
      local r2, m2, p2 = K.compact(g, it_:cuda())
      assert_bytes(r2:cpu(), r1, "compact rows")
      assert.same(m1:totable(), m2:cpu():totable())
      assert.same(p1:totable(), p2:cpu():totable())
      -- capacity mode, no sync: one spare page whose rows keep their NaN poison
      local n = p1:numel()
      local out = mla.full({ (n + 1) * bs, r1:size(1) }, 0 / 0, "bf16", "cuda")
      local cbuf = mla.full({ 2 }, 99, "i64", "cuda") -- count as a view past the start of its storage
      local r3, m3, p3, c3 = K.compact(g, it_:cuda(), { out = out, count = cbuf:narrow(0, 1, 1), check = false })
      assert.equal(99, cbuf:get({ 0 }))
      K.check("cuda")
      assert.equal(n, c3:item())
      assert_bytes(r3:narrow(0, 0, n * bs):cpu(), r1, "capacity rows")
      assert_bytes(r3:narrow(0, n * bs, bs):cpu(), mla.full({ bs, r1:size(1) }, 0 / 0, "bf16", "cpu"), "spare rows")
      assert.same(m1:totable(), m3:cpu():totable())
      local pl = p1:totable()
      pl[n + 1] = -1
      assert.same(pl, p3:cpu():totable())
      local q1, n1 = K.gather_referenced(v, it_)
      local q2, n2 = K.gather_referenced(g, it_:cuda())
      assert_bytes(q2:cpu(), q1, "per-token rows")
      assert.same(n1:totable(), n2:cpu():totable())
    end
  end)

  it("compaction over more pages than one rank tile (9000 pages), strided and 1-dim indices, short capacity", function()
    rng(450)
    local L, bs, nb = mla.layout.get("fp8_ds_mla"), 2, 9000
    local v = pool(L, nb, bs, "cpu")
    fill_pool(v, 6000)
    local g = gpu_twin(v, "contiguous")
    -- 4000 x 3 indices taken from a 4000 x 5 tensor: rows not packed (the division path)
    local wide = mla.rand({ 4000, 5 }, { lo = 0, hi = nb * bs, dtype = "i64" })
    wide:narrow(1, 2, 1):fill(-1)
    local idx = wide:narrow(1, 1, 3)
    local r1, m1, p1 = K.compact(v, idx)
    local n = p1:numel()
    assert.is_true(n > 4096, "one rank tile would cover it: " .. n)
    local r2, m2, p2 = K.compact(g, idx:cuda())
    assert_bytes(r2:cpu(), r1, "exact rows")
    assert.same(m1:totable(), m2:cpu():totable())
    assert.same(p1:totable(), p2:cpu():totable())
    -- capacity 100 pages short, no sync; the CPU's capacity mode is the reference
    local cap = n - 100
    local oc = { out = mla.empty({ cap * bs, L.dim }, "bf16", "cpu"), check = false }
    local og = { out = mla.empty({ cap * bs, L.dim }, "bf16", "cuda"), check = false }
    local r3, m3, p3, c3 = K.compact(v, idx, oc)
    local r4, m4, p4, c4 = K.compact(g, idx:cuda(), og)
    assert.equal(n, c3:item())
    assert.equal(n, c4:item())
    assert_bytes(r4:cpu(), r3, "capacity rows")
    assert.same(m3:totable(), m4:cpu():totable())
    assert.same(p3:totable(), p4:cpu():totable())
    -- 1-dim indices (one row)
    local flat = idx:contiguous():reshape({ 12000 })
    local _, m5 = K.compact(v, flat)
    local _, m6 = K.compact(g, flat:cuda())
    assert.same(m5:totable(), m6:cpu():totable())
    -- more pages than the shared-memory marking holds (49152): the direct marking
    local vb = pool(L, 50000, 1, "cpu")
    fill_pool(vb, 3000)
    local gb = gpu_twin(vb, "contiguous")
    local ib = mla.rand({ 7, 64 }, { lo = 0, hi = 50000, dtype = "i32" })
    local b1, q1, s1 = K.compact(vb, ib)
    local b2, q2, s2 = K.compact(gb, ib:cuda())
    assert_bytes(b2:cpu(), b1, "rows, 50000-page pool")
    assert.same(q1:totable(), q2:cpu():totable())
    assert.same(s1:totable(), s2:cpu():totable())
    -- capacity mode there (separate marking and ranking; the scratch grows),
    -- then the 9000-page pool again on the same scratch, twice: identical
    local b3, q3, s3, n3 = K.compact(gb, ib:cuda(), { out = mla.empty({ s1:numel(), L.dim }, "bf16", "cuda") })
    assert.equal(s1:numel(), n3:item())
    assert_bytes(b3:cpu(), b1, "capacity rows, 50000-page pool")
    assert.same(q1:totable(), q3:cpu():totable())
    assert.same(s1:totable(), s3:cpu():totable())
    for _ = 1, 2 do
      local r5, m5b, p5, c5 = K.compact(g, idx:cuda(), og)
      assert.equal(n, c5:item())
      assert_bytes(r5:cpu(), r3, "capacity rows, again")
      assert.same(m3:totable(), m5b:cpu():totable())
      assert.same(p3:totable(), p5:cpu():totable())
    end
  end)

  it("top-k PAGED / RAGGED: a slot that would overflow int64 is refused, as on the CPU", function()
    local tk, bt = mla.tensor({ { 5 } }, "i32", "cuda"), mla.tensor({ { 1 << 40 } }, "i64", "cuda")
    assert.same({ { (1 << 40) * 16 + 5 } }, K.topk_paged(tk, bt, 16, { dtype = "i64" }):cpu():totable())
    S.assert_error_contains(function() K.topk_paged(tk, bt, 1 << 30, { dtype = "i64" }) end,
      "out-of-range indices were skipped")
    S.assert_error_contains(function() K.topk_paged(tk:cpu(), bt:cpu(), 1 << 30, { dtype = "i64" }) end,
      "does not fit the i64 output")
    local M = math.maxinteger
    local cu = mla.tensor({ M - 3, M - 1 }, "i64", "cuda")
    S.assert_error_contains(function() K.topk_ragged(tk, cu, { dtype = "i64" }) end, "out-of-range indices were skipped")
    assert.same({ { M - 2 } }, K.topk_ragged(mla.tensor({ { 1 } }, "i32", "cuda"), cu, { dtype = "i64" }):cpu():totable())
  end)

  it("top-k PAGED and RAGGED identical to the CPU for decode and prefill, with lens", function()
    rng(500)
    local q_lens, kv_lens, bs = { 3, 1, 0, 5, 2 }, { 40, 7, 3, 130, 64 }, 16
    local topk, req = topk_batch(q_lens, kv_lens, 128)
    local bt = {}
    for r = 1, 5 do
      bt[r] = {}
      for j = 1, 10 do bt[r][j] = math.random(0, 4000) end
    end
    local cu_k = { 0 }
    for r = 1, 5 do cu_k[r + 1] = cu_k[r] + kv_lens[r] end
    local tk, btt, ck = mla.tensor(topk, "i32"), mla.tensor(bt, "i32"), mla.tensor(cu_k, "i32")
    for _, o in ipairs { { q_lens = q_lens, lens = true }, { token_req = mla.tensor(req, "i32"), lens = true } } do
      local og = {}
      for k, x in pairs(o) do og[k] = mla.is_tensor(x) and x:cuda() or x end
      local a, la = K.topk_paged(tk, btt, bs, o)
      local b, lb = K.topk_paged(tk:cuda(), btt:cuda(), bs, og)
      assert.same(a:totable(), b:cpu():totable())
      assert.same(la:totable(), lb:cpu():totable())
      local c, lc = K.topk_ragged(tk, ck, o)
      local d, ld = K.topk_ragged(tk:cuda(), ck:cuda(), og)
      assert.same(c:totable(), d:cpu():totable())
      assert.same(lc:totable(), ld:cpu():totable())
    end
    -- decode: one query token per request
    local dec = mla.tensor({ topk[1], topk[4], topk[5], topk[6], topk[7] }, "i32")
    assert.same(K.topk_paged(dec, btt, bs):totable(), K.topk_paged(dec:cuda(), btt:cuda(), bs):cpu():totable())
  end)

  it("generic paths: 3-chunk groups (amax through shared memory), bf16 / ue8m0 scales, e2m1, padding, split strided rows", function()
    rng(700)
    local L = mla.layout.define {
      name = "spec_kv_generic_paths",
      fields = {
        { "nope", "e4m3", 480, scale = { dtype = "bf16", group = 24, policy = "amax", eps = 1e-4 } },
        { "rope", "e2m1", 96, scale = { dtype = "ue8m0", group = 32, policy = "pow2", eps = 1e-4 } },
      },
      regions = { { name = "token", row = { "nope", "nope.scale", "rope", "rope.scale", { align = 16 } } } },
      token_align = 16,
    }
    for _, bs in ipairs { 16, 5 } do
      local nb = 7
      local cpu = pool(L, nb, bs, "cpu")
      local c = mla.cache.new { layout = L, num_blocks = nb, block_size = bs, num_layers = 61, order = "block_major",
        device = "cuda" }
      local g = c:view(17)
      g.pages:fill(0)
      c:poison(17, "zeros")
      local n = nb * bs - 3
      local p, sl = perm(nb * bs), {}
      for i = 1, n do sl[i] = (i % 6 == 1) and -1 or p[i] end
      local wide = mla.randn({ n, 700 }, { std = 3 }):to("bf16") -- k_nope and k_rope as slices of a wider projection
      local wg = wide:cuda()
      K.write(cpu, mla.tensor(sl, "i64"), wide:narrow(1, 0, 480), wide:narrow(1, 600, 96))
      K.write(g, mla.tensor(sl, "i64", "cuda"), wg:narrow(1, 0, 480), wg:narrow(1, 600, 96))
      assert_bytes(g.pages:cpu(), cpu.pages, "write, block size " .. bs)
      assert.is_nil(c:check_bleed(17, { slots = sl }))
      local st = mla.tensor(sl, "i32")
      assert_bytes(K.gather_sparse(g, st:cuda()):cpu(), K.gather_sparse(cpu, st), "gather, block size " .. bs)
    end
  end)

  it("a view whose pages x page stride exceed 2^31 bytes: writes and reads land at 64-bit offsets", function()
    rng(600)
    local L, bs, nb, layers = mla.layout.get("fp8_ds_mla"), 64, 900, 61
    local c = mla.cache.new { layout = L, num_blocks = nb, block_size = bs, num_layers = layers, order = "block_major", device = "cuda" }
    c.buffers[1]:fill(0)
    local g = c:view(layers - 1)
    assert.is_true(g.pages:stride(0) * (nb - 1) > 2 ^ 31)
    local sl = {}
    for i = 1, 200 do sl[i] = (i % 2 == 0) and ((nb - 1 - i % 40) * bs + i % bs) or (i * 37) % (nb * bs) end
    local rows = mla.randn({ 200, L.dim }):to("bf16")
    local cpu = pool(L, nb, bs, "cpu")
    K.write(cpu, mla.tensor(sl, "i64"), rows)
    K.write(g, mla.tensor(sl, "i64", "cuda"), rows:cuda())
    assert_bytes(g.pages:cpu(), cpu.pages, "pages of the last layer")
    assert_bytes(c:view(layers - 2).pages:cpu(), mla.zeros({ nb, L:page_bytes(bs) }, "u8"), "neighbour layer stays zero")
    local st = mla.tensor(sl, "i32")
    assert_bytes(K.gather_sparse(g, st:cuda()):cpu(), K.gather_sparse(cpu, st), "gather from high pages")
  end)

  it("skipped out-of-range indices surface as an error after the call", function()
    local g = pool(mla.layout.get("fp8_ds_mla"), 2, 4, "cuda")
    S.assert_error_contains(function() K.gather_sparse(g, mla.tensor({ 0, 8, -1 }, "i32", "cuda")) end,
      "1 out-of-range indices were skipped")
    K.gather_sparse(g, mla.tensor({ 0, 9 }, "i32", "cuda"), { check = false })
    S.assert_error_contains(function() K.check(g.pages.device) end, "1 out-of-range indices were skipped")
    K.check(g.pages.device) -- the count was consumed
    S.assert_error_contains(function() K.gather_sparse(g, mla.tensor({ 0 }, "i32")) end,
      "slots is on cpu but the cache is on cuda:0")
  end)
end)
