local mla = require "mlalab"
local S = require "support"

-- f32 tensor whose element i has the given raw bits (as i32)
local function f32_bits(bits, device)
  local t = mla.tensor(bits, "i32", "cpu"):view("f32")
  return device and t:to(device) or t
end

local function f64(vals, device) return mla.tensor(vals, "f64", device or "cpu") end

describe("compare exact", function()
  it("passes identical tensors and counts every element compared", function()
    local a = mla.randn({ 3, 5 }, { seed = 1, device = "cpu" })
    local r = mla.compare(a, a:clone())
    assert.is_true(r.ok)
    assert.equal("exact", r.mode)
    assert.equal(15, r.compared)
    assert.equal(0, r.mismatches)
  end)

  it("catches a single flipped bit and names its coordinates and both bit patterns", function()
    local a = mla.randn({ 4, 8 }, { seed = 2, device = "cpu" })
    local b = a:clone()
    local bytes = b:view("u8") -- [4, 32]
    bytes:set({ 2, 13 }, bytes:get({ 2, 13 }) ~ 0x01) -- element [2, 3], lowest bit of its second byte
    local r = mla.compare(b, a, "exact")
    assert.is_false(r.ok)
    assert.equal(1, r.mismatches)
    assert.same({ 2, 3 }, r.first[1].at)
    assert.equal(0x100, r.first[1].abits ~ r.first[1].bbits)
    assert.truthy(r:report():find("[2,3]", 1, true))
  end)

  it("tells NaNs with different payloads apart, while allclose accepts them", function()
    local a = f32_bits({ 0x3f800000, 0x7fc00000 })
    local b = f32_bits({ 0x3f800000, 0x7fc00001 })
    local ex = mla.compare(a, b, "exact")
    assert.is_false(ex.ok)
    assert.equal(1, ex.bits_diff)
    assert.equal(0x7fc00000, ex.first[1].abits)
    assert.equal(0x7fc00001, ex.first[1].bbits)
    local ac = mla.compare(a, b, { atol = 0 })
    assert.is_true(ac.ok)
    assert.equal(1, ac.nan_a)
    assert.equal(1, ac.nan_b)
  end)

  it("treats -0 and +0 as different bytes but equal values", function()
    local a, b = f32_bits({ 0x00000000 }), f32_bits({ -0x80000000 }) -- -0.0
    assert.is_false(mla.compare(a, b, "exact").ok)
    local r = mla.compare(a, b, { mode = "allclose" })
    assert.is_true(r.ok)
    assert.equal(0, r.max_abs)
  end)

  it("needs equal dtypes and equal shapes", function()
    local a = mla.zeros({ 2 }, "f32", "cpu")
    S.assert_error_contains(function() mla.compare(a, mla.zeros({ 2 }, "bf16", "cpu"), "exact") end, "equal dtypes")
    S.assert_error_contains(function() mla.compare(a, mla.zeros({ 3 }, "f32", "cpu")) end, "shapes differ ([2] vs [3])")
  end)

  it("fails a dead comparison of empty tensors", function()
    local r = mla.compare(mla.empty({ 0, 4 }, "f32", "cpu"), mla.empty({ 0, 4 }, "f32", "cpu"))
    assert.is_false(r.ok)
    assert.equal(0, r.compared)
    assert.truthy(r.reasons[1]:find("dead comparison", 1, true))
  end)
end)

describe("compare allclose", function()
  it("requires NaN, +inf and -inf at the same positions before anything else", function()
    local inf = math.huge
    local a = f64({ 1, inf, -inf, 0 / 0 })
    assert.is_true(mla.compare(a, f64({ 1, inf, -inf, 0 / 0 }), { atol = 1e-3 }).ok)
    local r = mla.compare(a, f64({ 1, -inf, -inf, 0 / 0 }), { atol = 1e-3 })
    assert.is_false(r.ok)
    assert.equal(1, r.class_diff)
    assert.is_false(r.specials_agree)
    assert.same({ 1 }, r.first[1].at)
    local r2 = mla.compare(a, f64({ 1, inf, -inf, 5 }), { atol = 1e9 })
    assert.is_false(r2.ok)
    assert.truthy(r2.reasons[1]:find("NaN/inf positions differ", 1, true))
  end)

  it("applies atol strictly: |a-b| < atol", function()
    local a, b = f64({ 0.5 + 2 ^ -10 }), f64({ 0.5 })
    assert.is_false(mla.compare(a, b, { atol = 2 ^ -10 }).ok)
    assert.is_true(mla.compare(a, b, { atol = 2 ^ -10 * (1 + 1e-9) }).ok)
  end)

  it("applies rtol strictly against |b|", function()
    local a, b = f64({ 1 + 2 ^ -8 }), f64({ 1 })
    local r = mla.compare(a, b, { rtol = 2 ^ -8 })
    assert.is_false(r.ok)
    assert.equal(2 ^ -8, r.max_rel)
    assert.is_true(mla.compare(a, b, { rtol = 2 ^ -8 * (1 + 1e-9) }).ok)
    -- |b| is the reference: the same pair the other way round has a smaller relative error
    assert.is_true(mla.compare(b, a, { rtol = 2 ^ -8 }).ok)
  end)

  it("passes an element when either atol or rtol holds", function()
    local a, b = f64({ 1000.5, 0.0015 }), f64({ 1000, 0.001 })
    local r = mla.compare(a, b, { atol = 1e-3, rtol = 1e-3 })
    assert.is_true(r.ok)
    assert.equal(0, r.close_fail)
  end)

  it("reports max abs and max rel errors with their coordinates", function()
    local b = mla.ones({ 3, 4 }, "f64", "cpu")
    local a = b:clone()
    a:set({ 1, 2 }, 1.5) -- abs 0.5, rel 0.5
    b:set({ 2, 3 }, 0.01)
    a:set({ 2, 3 }, 0.02) -- abs 0.01, rel 1
    local r = mla.compare(a, b, { rtol = 0.1 })
    assert.equal(0.5, r.max_abs)
    assert.same({ 1, 2 }, r.max_abs_at)
    assert.equal(1, r.max_rel)
    assert.same({ 2, 3 }, r.max_rel_at)
    assert.equal(2, r.mismatches)
  end)

  it("lists the first mismatches in index order", function()
    local b = mla.zeros({ 100 }, "f32", "cpu")
    local a = b:clone()
    for _, i in ipairs { 97, 3, 50, 12, 71 } do a:set({ i }, 1) end
    local r = mla.compare(a, b, { atol = 0.5, first = 3 })
    assert.equal(5, r.mismatches)
    assert.equal(3, #r.first)
    assert.same({ { 3 }, { 12 }, { 50 } }, { r.first[1].at, r.first[2].at, r.first[3].at })
  end)

  it("compares values across dtypes after exact decoding", function()
    local a = mla.tensor({ 1.5, -2.25, 448 }, "bf16", "cpu")
    local b = mla.tensor({ 1.5, -2.25, 448 }, "e4m3", "cpu")
    local r = mla.compare(a, b, { atol = 0 })
    assert.is_true(r.ok)
    assert.equal(0, r.max_abs)
  end)
end)

describe("compare cosine and nmse", function()
  it("computes FlashMLA's cos_diff = 1 - 2 sum(ab) / sum(a^2 + b^2)", function()
    local a, b = f64({ 1, 2, 3 }), f64({ 1, 2, 4 })
    local r = mla.compare(a, b, { cos = 1e-9 })
    local want = 1 - 2 * (1 + 4 + 12) / ((1 + 4 + 9) + (1 + 4 + 16))
    assert.near(want, r.cos_diff, 1e-15)
    assert.is_false(r.ok)
    assert.is_true(mla.compare(a, b, { cos = want * 1.0001 }).ok)
  end)

  it("computes ggml's nmse = sum((a-b)^2) / sum(a^2)", function()
    local a, b = f64({ 1, 2, 3 }), f64({ 1, 2, 4 })
    local r = mla.compare(a, b, { nmse = 0.07 })
    assert.near(1 / 14, r.nmse, 1e-15)
    assert.is_false(r.ok)
    assert.is_true(mla.compare(a, b, { nmse = 0.072 }).ok)
  end)

  it("fails any NaN under nan='fail' (ggml), even at matching positions", function()
    local a = f64({ 1, 0 / 0 })
    assert.is_true(mla.compare(a, f64({ 1, 0 / 0 }), { nmse = 1e-7 }).ok)
    local r = mla.compare(a, f64({ 1, 0 / 0 }), "ggml")
    assert.is_false(r.ok)
    assert.truthy(r:report():find("nan='fail'", 1, true))
  end)

  it("combines modes: FlashMLA's check is allclose and cosine together", function()
    local n = 64
    local b = mla.full({ n }, 1e-3, "f64", "cpu")
    local a = mla.full({ n }, 1e-3 + 7e-4, "f64", "cpu") -- every element within atol 8e-4, direction intact
    local r = mla.compare(a, b, "flashmla_dense_decode")
    assert.equal("allclose+cosine", r.mode)
    assert.equal(0, r.close_fail)
    assert.is_false(r.ok) -- cos_diff ~ 0.08 > 5e-6
    assert.truthy(r.reasons[1]:find("cosine", 1, true))
  end)
end)

describe("compare on strided inputs", function()
  it("compares a transposed view with its contiguous copy element by element", function()
    local t = mla.randn({ 6, 5 }, { seed = 3, device = "cpu" })
    local v = t:transpose(0, 1)
    local c = v:contiguous()
    assert.is_false(v:is_contiguous())
    assert.is_true(mla.compare(v, c).ok)
    c:set({ 4, 1 }, 42)
    local r = mla.compare(v, c)
    assert.same({ 4, 1 }, r.first[1].at)
  end)

  it("reads a padded-stride twin through its strides, not its padding", function()
    local padded = mla.full({ 4, 8 + 3 }, -7, "f32", "cpu")
    local view = padded:narrow(1, 0, 8)
    local data = mla.randn({ 4, 8 }, { seed = 4, device = "cpu" })
    view:copy(data)
    local r = mla.compare(view, data)
    assert.is_true(r.ok)
    assert.equal(32, r.compared)
  end)
end)

describe("compare reports", function()
  it("prints as one table row and raises the full report from assert_close", function()
    local a, b = f64({ 1, 2 }), f64({ 1, 2.5 })
    local r = mla.compare(a, b, { atol = 0.1, name = "case-x" })
    local row = tostring(r)
    assert.is_nil(row:find("\n"))
    assert.truthy(row:find("FAIL", 1, true))
    assert.truthy(row:find("case-x", 1, true))
    local err = S.assert_error_contains(function() mla.assert_close(a, b, { atol = 0.1 }) end, "assert_close failed")
    assert.truthy(err:find("first 1 of 1 mismatches", 1, true))
    assert.truthy(err:find("at [1]", 1, true))
  end)

  it("builds ggml-style case ids in the declared parameter order", function()
    local id = mla.compare_mod.case_id("FLASH_ATTN_EXT", { hsk = 576, hsv = 512, v_is_view = true }, { "hsk", "hsv", "v_is_view" })
    assert.equal("FLASH_ATTN_EXT(hsk=576,hsv=512,v_is_view=1)", id)
  end)

  it("runs a suite of named cases with their own tolerances and lists the failures", function()
    local s = mla.compare_mod.suite("demo")
    local a, b = f64({ 1, 2 }), f64({ 1, 2.001 })
    s:check("loose", a, b, { atol = 0.01 })
    s:check("tight", a, b, { atol = 1e-6 })
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    local ok = s:report(f)
    f:close()
    local text = io.open(path):read("a")
    os.remove(path)
    assert.is_false(ok)
    assert.equal(1, #s:failures())
    assert.equal("tight", s:failures()[1].name)
    assert.truthy(text:find("1 passed, 1 failed", 1, true))
  end)
end)

describe("compare on the GPU #gpu", function()
  local function mixed(seed, n)
    local a = mla.randn({ n }, { seed = seed, device = "cpu" })
    local b = mla.randn({ n }, { seed = seed, device = "cpu", std = 1.001 })
    for i = 0, n - 1, 9973 do a:set({ i }, 0 / 0) end
    for i = 5, n - 1, 30011 do b:set({ i }, math.huge) end
    for i = 7, n - 1, 50021 do a:set({ i }, -math.huge) b:set({ i }, -math.huge) end
    return a, b
  end

  local function same_stats(c, g)
    for _, k in ipairs { "compared", "mismatches", "bits_diff", "close_fail", "class_diff", "nan_a", "nan_b", "inf_a",
      "inf_b", "max_abs", "max_rel", "cos_diff", "nmse" } do
      assert.equal(c[k], g[k], k)
    end
    for _, k in ipairs { "ab", "aa", "bb", "dd" } do assert.equal(c.sums[k], g.sums[k], "sum_" .. k) end
    assert.same(c.max_abs_at, g.max_abs_at)
    assert.same(c.max_rel_at, g.max_rel_at)
    assert.equal(#c.first, #g.first)
    for i = 1, #c.first do assert.same(c.first[i].at, g.first[i].at) end
  end

  it("returns the same bits on the GPU as on the CPU, sums included", function()
    local a, b = mixed(11, 300001)
    local opts = { mode = "allclose+cosine+nmse", atol = 1e-3, rtol = 1e-3, first = 8 }
    local c = mla.compare(a, b, opts)
    local g = mla.compare(a:cuda(), b:cuda(), opts)
    assert.equal("cpu", c.ran_on)
    assert.equal("cuda:0", g.ran_on)
    same_stats(c, g)
  end)

  it("agrees on strided bf16 against f32 views", function()
    local a, base = mixed(12, 2 * 3 * 40000)
    a = a:view({ 2, 3, 40000 }):to("bf16")
    base = base:view({ 40000, 3, 2 })
    local b, gb = base:permute({ 2, 1, 0 }), base:cuda():permute({ 2, 1, 0 }) -- strided f32 on both devices
    assert.is_false(gb:is_contiguous())
    local opts = { atol = 1e-2, rtol = 1e-2, first = 5 }
    same_stats(mla.compare(a, b, opts), mla.compare(a:cuda(), gb, opts))
  end)

  it("compares exactly on the GPU, NaN payloads included", function()
    local a = f32_bits({ 0x7fc00000, -0x80000000, 0x3f800000 }, "cuda")
    local b = f32_bits({ 0x7fc00001, 0x00000000, 0x3f800000 }, "cuda")
    local r = mla.compare(a, b, "exact")
    assert.equal("cuda:0", r.ran_on)
    assert.equal(2, r.bits_diff)
    assert.same({ 0 }, r.first[1].at)
    assert.equal(0x7fc00001, r.first[1].bbits)
  end)

  it("brings a CPU tensor to the GPU, never the GPU tensor to the host", function()
    local a = mla.randn({ 1000 }, { seed = 13, device = "cuda" })
    local r = mla.compare(a, a:cpu())
    assert.is_true(r.ok)
    assert.equal("cuda:0", r.ran_on)
  end)

  it("reduces tens of millions of elements on the device", function()
    local n = 64 * 1024 * 1024
    local a = mla.randn({ n }, { seed = 14, device = "cuda", dtype = "bf16" })
    local b = a:clone()
    b:set({ n - 3 }, 1e6)
    local r = mla.compare(a, b, { atol = 1e-3 })
    -- on the device, not copied to the host: a place, not a time (a time bound fails under the sanitizers)
    assert.equal("cuda:0", r.ran_on)
    assert.equal(n, r.compared)
    assert.equal(1, r.mismatches)
    assert.same({ n - 3 }, r.first[1].at)
  end)
end)

-- The cross-layer equivalence check -----------------------------------------------------

local ROW, PER_PAGE = 16, 4 -- 4 tokens of 16 bytes per page
local PAGE = ROW * PER_PAGE
local SLOTS = { 5, 0, 14, 9, 3, 12 }

-- Reads token rows through the cache's own page stride.
local function gather(cache, ctx)
  local out = mla.zeros({ #SLOTS, ROW }, "u8", cache.device)
  for i, slot in ipairs(SLOTS) do
    out:select(0, i - 1):copy(cache:select(0, slot // PER_PAGE):narrow(0, (slot % PER_PAGE) * ROW, ROW))
  end
  return out
end

-- The bug of vLLM #45111: page addresses computed as block * page_bytes from
-- the view's start, as if the pages were packed.
local function packed_pages(cache)
  return cache:as_strided({ cache:size(0), cache:size(1) }, { cache:size(1), 1 }, cache:offset())
end

local function gather_packed(cache, ctx) return gather(packed_pages(cache), ctx) end

local SRC = {}
for i = 1, #SLOTS do
  SRC[i] = {}
  for j = 1, ROW do SRC[i][j] = (i * ROW + j) % 255 + 1 end -- never 0: the write poison
end

local function scatter(cache, ctx)
  local src = mla.tensor(SRC, "u8", cache.device)
  for i, slot in ipairs(SLOTS) do
    cache:select(0, slot // PER_PAGE):narrow(0, (slot % PER_PAGE) * ROW, ROW):copy(src:select(0, i - 1))
  end
end

local function scatter_packed(cache, ctx) scatter(packed_pages(cache), ctx) end

describe("equivalence on a cross-layer view", function()
  for _, dev in ipairs(S.devices()) do
    it("passes a stride-aware read kernel on " .. dev, function()
      local r = mla.equivalence { name = "gather", run = gather, page_bytes = PAGE, blocks = 4, layers = 3, layer = 1, device = dev }
      assert.is_true(r.ok, r:report())
      assert.equal(4, #r.checks)
    end)

    it("catches a read kernel that assumes packed pages on " .. dev, function()
      local r = mla.equivalence { name = "gather_packed", run = gather_packed, page_bytes = PAGE, device = dev }
      assert.is_false(r.ok)
      local failed = {}
      for _, c in ipairs(r.checks) do if not c.ok then failed[#failed + 1] = c.name end end
      assert.same({ "output out" }, failed)
      assert.truthy(tostring(r):find("FAIL", 1, true))
    end)

    it("passes a stride-aware write kernel with zero bleed on " .. dev, function()
      local r = mla.equivalence { name = "scatter", kind = "write", run = scatter, page_bytes = PAGE, device = dev }
      assert.is_true(r.ok, r:report())
      assert.equal(0, r.bleed.bytes)
    end)

    it("reports the first byte a packed-page write kernel corrupts on " .. dev, function()
      local r = mla.equivalence { name = "scatter_packed", kind = "write", run = scatter_packed, page_bytes = PAGE, device = dev }
      assert.is_false(r.ok)
      -- slot 5 lands in block 1 -> packed address 2 pages past the buffer start = block 0, layer 2
      assert.same({ block = 0, layer = 2, byte = 1 * ROW }, { block = r.bleed.first.block, layer = r.bleed.first.layer,
        byte = r.bleed.first.byte })
      assert.truthy(r:report():find("first at block 0, layer 2, byte 16", 1, true))
    end)
  end

  it("names the field of a corrupted byte through an optional layout", function()
    local layout = { field_at = function(_, byte) return string.format("token %d, byte %d", byte // ROW, byte % ROW) end }
    local r = mla.equivalence { kind = "write", run = scatter_packed, page_bytes = PAGE, device = "cpu", layout = layout }
    assert.truthy(r:report():find("(token 1, byte 0)", 1, true))
  end)

  it("uses a caller's poison and payload", function()
    local poisoned = false
    local payload = mla.full({ 4, PAGE }, 9, "u8", "cpu")
    local r = mla.equivalence {
      run = gather, page_bytes = PAGE, device = "cpu", payload = payload,
      poison = function(buf) poisoned = true buf:fill(0xff) end,
    }
    assert.is_true(poisoned)
    assert.is_true(r.ok, r:report())
    assert.equal(0xff, r.buffer:get({ 0, 0, 0 }))
    assert.equal(9, r.outputs.view.out:get({ 0, 0 }))
  end)

  it("fails a read kernel whose outputs are all zero", function()
    local r = mla.equivalence { run = function() return mla.zeros({ 4 }, "f32", "cpu") end, page_bytes = PAGE, device = "cpu" }
    assert.is_false(r.ok)
    assert.equal("outputs not all zero", r.checks[#r.checks].name)
  end)

  it("refuses set-ups where the strided view could not differ from packed pages", function()
    S.assert_error_contains(function() mla.equivalence { run = gather, page_bytes = PAGE, blocks = 1 } end, "blocks must be >= 2")
    S.assert_error_contains(function() mla.equivalence { run = gather, page_bytes = PAGE, layers = 1, layer = 0 } end, "layers must be >= 2")
    S.assert_error_contains(function() mla.equivalence { run = gather, page_bytes = PAGE, layer = 3 } end, "layer 3 out of range")
    S.assert_error_contains(function() mla.equivalence { run = gather } end, "page_bytes")
  end)

  it("raises with the report when asked to", function()
    S.assert_error_contains(function()
      mla.assert_equivalent { run = gather_packed, page_bytes = PAGE, device = "cpu" }
    end, "equivalence failed")
  end)
end)
