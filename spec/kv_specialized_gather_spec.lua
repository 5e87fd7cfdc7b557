-- Compile-time-specialized variants of the baked KV gathers and requant
-- (src/kernels/kv_gather_spec.cuh): for every built-in layout, on contiguous
-- caches and on a layer of a 61-layer block-major cache with random
-- neighbours, each op runs with specialization on and off; both results must
-- be bit-identical to the CPU reference, and mla.kernels.last_variant() must
-- name the built-in (specialized) resp. "generic". The pools hold rows written
-- by the quantizer and pages of random bytes (every code, NaN and odd scales
-- included); slot lists carry -1 padding and output rows a sentinel that
-- skipped rows must keep. Descriptors that are not a built-in's (block size
-- 32, a Lua-defined layout) and a view the specialized code does not take (a
-- 4-byte-aligned page stride) report "generic" and match the reference too.
local mla = require "mlalab"
local S = require "support"
local assert_bytes = S.assert_bytes
local core = mla.core
local K = mla.kernels

local BS = 64 -- the built-ins' descriptors are made at block size 64

local function rng(seed) math.randomseed(seed) end

-- A CPU pool of nb pages: pages [0, nb - 2) hold quantized random rows in
-- every slot, the last two pages random bytes.
local function cpu_pool(L, nb, bs, scale, seed)
  local c = mla.cache.new { layout = L, num_blocks = nb, block_size = bs, device = "cpu", tensor_scale = scale }
  local v = c:view(0)
  v.pages:fill(0)
  local n = (nb - 2) * bs
  K.write(v, mla.arange(n, "i64"), mla.randn({ n, L.dim }, { std = 3 }):to("bf16"))
  v.pages:narrow(0, nb - 2, 2):random_bytes_(seed)
  return v
end

-- The same bytes on the GPU: contiguous, or layer li of a 61-layer block-major cache with random neighbours.
local function gpu_twin(v, L, nb, bs, kind, li)
  local g, c
  if kind == "contiguous" then
    c = mla.cache.new { layout = L, num_blocks = nb, block_size = bs, device = "cuda" }
    g = c:view(0)
  else
    c = mla.cache.new { layout = L, num_blocks = nb, block_size = bs, num_layers = 61, order = "block_major", device = "cuda" }
    c:poison(li, "random")
    g = c:view(li)
    assert.is_false(g.pages:is_contiguous())
  end
  g.pages:copy(v.pages)
  if v.tensor_scale then g.tensor_scale:copy(v.tensor_scale) end
  return g, c
end

-- fn() on the GPU with specialization on, then off: the results and the recorded variants.
local function both(fn)
  local prev = K.specialize(true)
  local ok1, a = pcall(fn)
  local va = K.last_variant()
  K.specialize(false)
  local ok2, b = pcall(fn)
  local vb = K.last_variant()
  K.specialize(prev)
  assert(ok1, a)
  assert(ok2, b)
  return a, va, b, vb
end

-- Asserts both runs of fn equal the CPU result `want` (a tensor or a list of
-- tensors) and took the expected variants.
local function check_both(want, fn, variant, what)
  local a, va, b, vb = both(fn)
  assert.equal(variant, va, what .. ": variant with specialization on")
  assert.equal("generic", vb, what .. ": variant with specialization off")
  if mla.is_tensor(want) then want = { want } a, b = { a }, { b } end
  for i = 1, #want do
    assert_bytes(a[i]:cpu(), want[i], what .. " (specialized) #" .. i)
    assert_bytes(b[i]:cpu(), want[i], what .. " (generic) #" .. i)
  end
end

-- Every gather of one cache: CPU reference vs the GPU twin, specialization on and off.
local function check_gathers(name, v, g, L, nb, bs, variant, seed)
  rng(seed)
  local nslots = nb * bs
  for _, itype in ipairs { "i32", "i64" } do
    local n = math.random(200, 400)
    local sl = {}
    for i = 1, n do sl[i] = math.random() < 0.1 and -1 or math.random(0, nslots - 1) end
    local st = mla.tensor(sl, itype)
    for _, ncols in ipairs(L.dim > 512 and { L.dim, 512 } or { L.dim }) do
      local want, wrm = mla.full({ n, ncols }, 3, "bf16"), mla.empty({ n, 1 }, itype)
      K.gather_sparse(v, st, { out = want, remap = wrm })
      local stg = st:cuda()
      check_both({ want, wrm }, function()
        local out, rm = mla.full({ n, ncols }, 3, "bf16", "cuda"), mla.empty({ n, 1 }, itype, "cuda")
        K.gather_sparse(g, stg, { out = out, remap = rm })
        return { out, rm }
      end, variant, string.format("%s sparse %s ncols %d", name, itype, ncols))
    end
    -- referenced (the graph-safe fallback): a [T, W] index matrix
    local idx = st:narrow(0, 0, 192):reshape({ 6, 32 })
    local r1, m1 = K.gather_referenced(v, idx)
    local idxg = idx:cuda()
    check_both({ r1, m1 }, function()
      local r, m = K.gather_referenced(g, idxg)
      return { r, m }
    end, variant, name .. " referenced " .. itype)
  end
  -- dense and raw, with start offsets; rows past cu[B] keep the sentinel
  local b = S.dense_batch(nb, bs, 5, true)
  b.bt, b.cu, b.starts = mla.tensor(b.bt, "i32"), mla.tensor(b.cu, "i32"), mla.tensor(b.starts, "i32")
  local rows = b.total + 5
  local want = mla.full({ rows, L.dim }, -5, "bf16")
  K.gather_dense(v, b.bt, b.cu, { out = want, seq_starts = b.starts })
  local btg, cug, ssg = b.bt:cuda(), b.cu:cuda(), b.starts:cuda()
  check_both(want, function()
    local out = mla.full({ rows, L.dim }, -5, "bf16", "cuda")
    K.gather_dense(g, btg, cug, { out = out, seq_starts = ssg })
    return out
  end, variant, name .. " dense")
  local rw = K.gather_raw(v, b.bt, b.cu, { seq_starts = b.starts, num_rows = rows })
  -- the raw variant copies whole region rows: a chunked layout's raw rows come from the generic kernel
  check_both(rw, function() return K.gather_raw(g, btg, cug, { seq_starts = ssg, num_rows = rows }) end,
    L:chunked() and "generic" or variant, name .. " raw")
  -- compaction: whole referenced pages (gather_pages), then the remap
  local idx = {}
  for t = 1, 4 do
    idx[t] = {}
    for k = 1, 24 do idx[t][k] = math.random() < 0.2 and -1 or math.random(0, nslots - 1) end
  end
  local it = mla.tensor(idx, "i32")
  local c1, c2, c3 = K.compact(v, it)
  local itg = it:cuda()
  check_both({ c1, c2, c3 }, function()
    local a, bb, c = K.compact(g, itg)
    return { a, bb, c }
  end, variant, name .. " compact")
end

describe("specialized KV gathers vs generic vs CPU #gpu", function()
  for li, name in ipairs(mla.layout.builtins()) do
    for _, kind in ipairs { "contiguous", "61-layer view" } do
      it(name .. ", " .. kind .. ": sparse (i32/i64, remap, ncols), referenced, dense, raw, compact", function()
        rng(1000 + li)
        local L = mla.layout.get(name)
        local nb = 10
        local v = cpu_pool(L, nb, BS, 0.375, 77 + li)
        local g = gpu_twin(v, L, nb, BS, kind, (li * 7) % 61)
        check_gathers(name, v, g, L, nb, BS, name, 2000 + li)
      end)
    end
  end

  -- [3]: the variant with specialization on (group-scaled dims dequantized to bf16 have no specialized
  -- requant; relayouts of group-scaled dims and chunked layouts do)
  for _, pair in ipairs { { "fp8_pertensor", "fp8_ds_mla" }, { "fp8_pertensor", "fp8_ds_mla_amax" },
    { "fp8_pertensor", "bf16" }, { "bf16", "bf16" }, { "fp8_ds_mla", "fp8_ds_mla_blocked" },
    { "fp8_pertensor", "fp8_ds_mla_blocked" }, { "fp8_ds_mla_blocked", "fp8_ds_mla" },
    { "fp8_ds_mla_blocked", "fp8_ds_mla_blocked" }, { "fp8_ds_mla", "fp8_ds_mla" }, { "fp8_v4", "fp8_v4_vllm" },
    { "fp8_v41", "fp8_v41" }, { "fp4_v41", "fp4_v41" }, { "indexer_fp8", "indexer_fp8" },
    { "fp8_ds_mla", "bf16", "generic" } } do
    for _, kind in ipairs { "contiguous", "61-layer view" } do
      it(string.format("requant %s -> %s, %s: specialized and generic bytes identical to the CPU", pair[1], pair[2], kind),
        function()
          rng(3000)
          local nb = 9
          local Ls, Ld = mla.layout.get(pair[1]), mla.layout.get(pair[2])
          local src = cpu_pool(Ls, nb, BS, 0.3, 99)
          local dst = mla.cache.new { layout = Ld, num_blocks = nb, block_size = BS, device = "cpu" }:view(0)
          dst.pages:fill(0xAB)
          K.requant(src, dst)
          local gs = gpu_twin(src, Ls, nb, BS, kind, 11)
          local c, gd
          check_both(dst.pages, function()
            if kind == "contiguous" then
              c = mla.cache.new { layout = Ld, num_blocks = nb, block_size = BS, device = "cuda" }
              gd = c:view(0)
            else
              c = mla.cache.new { layout = Ld, num_blocks = nb, block_size = BS, num_layers = 61, order = "block_major",
                device = "cuda" }
              gd = c:view(40)
              c:poison(40, "zeros")
            end
            gd.pages:fill(0xAB)
            K.requant(gs, gd)
            if kind ~= "contiguous" then assert.is_nil(c:check_bleed(40)) end
            return gd.pages
          end, pair[3] or (pair[1] .. "->" .. pair[2]), "requant " .. kind)
        end)
    end
  end

  it("descriptors that are no built-in's, and an unaligned view, run the generic kernels (bit-identical)", function()
    rng(4000)
    local cases = {}
    -- a built-in at another block size
    local L = mla.layout.get("fp8_ds_mla")
    cases[#cases + 1] = { "fp8_ds_mla block size 32", L, 32, {} }
    -- a Lua-defined layout (the bytes of fp8_ds_mla with ue8m0 scales per 64)
    local U = mla.layout.define {
      name = "spec_kv_specialized_lua",
      fields = { { "nope", "e4m3", 512, scale = { dtype = "ue8m0", group = 64, policy = "pow2", eps = 1e-4 } },
        { "rope", "bf16", 64 } },
      v_dims = 512,
    }
    cases[#cases + 1] = { "Lua-defined layout", U, BS, {} }
    -- indexer_fp8 with a 4-byte page pad: page stride 8452, not 16-byte aligned
    cases[#cases + 1] = { "indexer_fp8, page stride 8452", mla.layout.get("indexer_fp8"), BS, { page_pad = 4 } }
    for ci, cs in ipairs(cases) do
      local what, Lc, bs, extra = cs[1], cs[2], cs[3], cs[4]
      local nb = 8
      local o = { layout = Lc, num_blocks = nb, block_size = bs, device = "cpu", tensor_scale = 0.5 }
      for k, x in pairs(extra) do o[k] = x end
      local v = mla.cache.new(o):view(0)
      v.pages:fill(0)
      local n = nb * bs
      K.write(v, mla.arange(n, "i64"), mla.randn({ n, Lc.dim }):to("bf16"))
      o.device = "cuda"
      local g = mla.cache.new(o):view(0)
      g.pages:copy(v.pages)
      if extra.page_pad then assert.equal(8452, g.pages:stride(0)) end
      local sl = {}
      for i = 1, 150 do sl[i] = i % 9 == 0 and -1 or math.random(0, n - 1) end
      local st = mla.tensor(sl, "i64")
      local want = mla.full({ 150, Lc.dim }, 3, "bf16")
      K.gather_sparse(v, st, { out = want })
      local stg = st:cuda()
      local a, va, b, vb = both(function()
        local out = mla.full({ 150, Lc.dim }, 3, "bf16", "cuda")
        K.gather_sparse(g, stg, { out = out })
        return out
      end)
      assert.equal("generic", va, what)
      assert.equal("generic", vb, what)
      assert_bytes(a:cpu(), want, what .. " (specialization on)")
      assert_bytes(b:cpu(), want, what .. " (off)")
      assert.is_true(ci > 0)
    end
  end)

  -- Block-table rows of random pages below pmax, and per query token a top-k row of
  -- positions below cols * bs (a share `holes` of them -1).
  local function paged_inputs(q_lens, cols, bs, width, holes, pmax)
    local bt = {}
    for r = 1, #q_lens do
      bt[r] = {}
      for j = 1, cols do bt[r][j] = math.random(0, pmax) end
    end
    local topk = {}
    for r = 1, #q_lens do
      for _ = 1, q_lens[r] do
        local row = {}
        for k = 1, width do row[k] = math.random() < holes and -1 or math.random(0, cols * bs - 1) end
        topk[#topk + 1] = row
      end
    end
    return bt, topk
  end

  -- topk_paged on the CPU and on the GPU give the same slots and lens.
  local function paged_same(tk, btt, bs, q_lens, what)
    local a, la = K.topk_paged(tk, btt, bs, { q_lens = q_lens, lens = true })
    local b, lb = K.topk_paged(tk:cuda(), btt:cuda(), bs, { q_lens = q_lens, lens = true })
    assert.same(a:totable(), b:cpu():totable(), what)
    assert.same(la:totable(), lb:cpu():totable(), what)
  end

  it("topk_paged over a 3000-column block table (i32 and i64) identical to the CPU; a column past the table raises", function()
    rng(5000)
    local q_lens, cols, bs = { 3, 1, 4 }, 3000, 16
    local bt, topk = paged_inputs(q_lens, cols, bs, 700, 0.1, 1 << 20)
    local tk = mla.tensor(topk, "i32")
    for _, bdt in ipairs { "i32", "i64" } do
      paged_same(tk, mla.tensor(bt, bdt), bs, q_lens, bdt)
      local past = 0
      for _, row in ipairs(topk) do for _, x in ipairs(row) do if x >= 2048 * bs then past = past + 1 end end end
      assert.is_true(past > 100) -- lookups far into the table
    end
    -- a column past the table is counted and raised after the call
    local small = mla.tensor({ { 1, 2 } }, "i32", "cuda")
    assert.has_error(function() K.topk_paged(mla.tensor({ { 5, 40 } }, "i32", "cuda"), small, 16) end)
  end)

  it("topk_paged table staging: 16-byte rows, rows at a 4-byte offset, a column-strided table, bad page ids", function()
    rng(5100)
    local q_lens, cols, bs = { 2, 3 }, 1024, 64
    local bt, topk = paged_inputs(q_lens, cols + 1, bs, 2048, 0.05, 1 << 24)
    for _, row in ipairs(topk) do for k, x in ipairs(row) do if x >= cols * bs then row[k] = x - bs end end end
    local tk = mla.tensor(topk, "i32")
    local wide = mla.tensor(bt, "i32")
    paged_same(tk, wide:narrow(1, 0, cols):contiguous(), bs, q_lens, "16-byte rows")
    paged_same(tk, wide:narrow(1, 1, cols), bs, q_lens, "rows at a 4-byte offset") -- 4-byte cp.async
    paged_same(tk, wide:narrow(1, 0, cols), bs, q_lens, "rows of 1025 columns, the first 1024 used")
    paged_same(tk, wide:transpose(0, 1):contiguous():transpose(0, 1):narrow(1, 0, cols), bs, q_lens, "column-strided table")
    -- page ids that are not pages (-1, past int32 / block_size): counted and raised on both devices
    for _, badv in ipairs { -1, (1 << 31) // bs } do
      local b2 = paged_inputs({ 1, 1 }, 16, bs, 1, 0, 1 << 10)
      b2[2][7] = badv
      local tkb = mla.tensor({ { 6 * bs + 3, 5 }, { 6 * bs + 1, 5 } }, "i32")
      local btb = mla.tensor(b2, "i32")
      assert.has_error(function() K.topk_paged(tkb, btb, bs, { q_lens = { 1, 1 } }) end)
      assert.has_error(function() K.topk_paged(tkb:cuda(), btb:cuda(), bs, { q_lens = { 1, 1 } }) end)
    end
  end)

  it("the switch: specialize() returns the previous setting; a built-in reports its name only when on", function()
    local prev = K.specialize(false)
    assert.is_false(K.specialize(true))
    assert.is_true(K.specialize(prev))
    local L = mla.layout.get("fp8_v4_vllm")
    local g = mla.cache.new { layout = L, num_blocks = 2, block_size = BS, device = "cuda" }:view(0)
    g.pages:fill(0)
    local sl = mla.tensor({ 0, 5, -1, 127 }, "i32", "cuda")
    K.specialize(true)
    K.gather_sparse(g, sl)
    assert.equal("fp8_v4_vllm", K.last_variant()) -- served by fp8_v4's variant (same descriptor for reading)
    K.specialize(false)
    K.gather_sparse(g, sl)
    assert.equal("generic", K.last_variant())
    K.specialize(prev)
  end)
end)
