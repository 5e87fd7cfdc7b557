--- A cache layout defined only in Lua, end to end: its byte map, the generic
-- JIT kernels (kv_write.cu, kv_gather.cu, attn_decode.cu compiled for it) and
-- the baked generic kernels (driven by its packed descriptor) verified
-- against the CPU reference, then benchmarked beside the built-in layouts.
--
--   mlalab experiments/new_layout.lua [--device cpu] [--quiet] [--quick]
--
-- The layout: e4m3 latent with one ue8m0 (power-of-two) scale per 64 dims
-- stored inline, bf16 RoPE, padded to 656 B: the bytes of V3.2 with finer
-- scales that every reader decodes exactly (kv-formats.md §5). No C edit.
-- On a CPU the JIT kernels are compiled for sm_90a but cannot launch; the
-- CPU reference runs the checks and the timings (wall clock), and says so.
-- Exits 1 when a check fails.
local mla = require "mlalab"
local E = mla.experiment
local K = mla.kernels
local C = mla.attention_cases
local AB = mla.attention_bench

local a = E.args({ ... }, { quiet = "flag", quick = "flag" }, "new_layout")
local gpu = mla.device() ~= "cpu"
local dev = mla.device()
local BS = 64

local L = mla.layout.register(mla.layout.define {
  name = "lab_fp8_ue8m0_64",
  doc = "e4m3 latent, ue8m0 scale per 64 dims inline, bf16 RoPE; 656 B/token",
  fields = {
    { "nope", "e4m3", 512, scale = { dtype = "ue8m0", group = 64, policy = "pow2", eps = 1e-4 } },
    { "rope", "bf16", 64 },
  },
  regions = { { name = "token", row = { "nope", "rope", "nope.scale", { align = 16 } } } },
  v_dims = 512,
  token_align = 16,
})

mla.manual_seed(656)
E.banner("a layout defined in Lua: " .. L.name)
if not gpu then print("note: no GPU: JIT kernels compiled for sm_90a, not launched; checks and timings run the CPU reference") end
if not a.quiet then
  print()
  mla.layout.show(L, BS)
end
local v = E.verdicts()

-- 1. Verification --------------------------------------------------------------------------

print("\n== 1. " .. L.name .. " against the CPU reference ==")
local VFMT = "%-40s %-6s %s"
print(string.format(VFMT, "check", "result", "detail"))
local function check(name, ok, detail)
  print(string.format(VFMT, name, ok and "PASS" or "FAIL", detail or ""))
  v:add(name, ok, detail)
end
local function noted(name, detail) print(string.format(VFMT, name, "-", detail)) end

local NB = gpu and 64 or 8
local n = NB * BS
local x = mla.randn({ n, L.dim }, { std = 0.5, dtype = "bf16", device = "cpu" })
x:narrow(0, 3, 1):fill(0) -- an all-zero token: the eps floor of every scale
local slots = {}
for i = 1, n do slots[i] = (i % 11 == 0) and -1 or (i * 37) % n end
local slots_cpu = mla.tensor(slots, "i32", "cpu")

-- the reference bytes and values
local ref_pages = mla.zeros({ NB, L:page_bytes(BS) }, "u8", "cpu")
mla.layout_ref.write(L, ref_pages, x, slots_cpu:to("i64"), { block_size = BS })
local ratio = mla.layout_ref.worst_step_ratio(L, ref_pages, x, slots_cpu:to("i64"), { block_size = BS })
check("round trip <= half a step (reference)", ratio <= 1, string.format("worst |x - read(write(x))| = %.3f half-steps", ratio))
local ref_view = { pages = ref_pages, layout = L, block_size = BS }
local ref_rows = K.gather_sparse(ref_view, slots_cpu)
local read = mla.layout_ref.read(L, ref_pages, slots_cpu:to("i64"), { block_size = BS })
local r = mla.compare(ref_rows, read:to("bf16"), "exact")
check("gather (CPU) == reference read, bf16", r.ok and r.compared > 0,
  r.ok and string.format("%d values identical", r.compared) or r.reasons[1])

local function pages_equal(name, pages)
  local rr = mla.compare(pages:to("cpu"), ref_pages, "exact")
  check(name, rr.ok and rr.compared > 0, rr.ok and string.format("%d bytes identical", rr.compared) or rr.reasons[1])
end
local function rows_equal(name, out)
  local rr = mla.compare(out:to("cpu"), ref_rows, "exact")
  check(name, rr.ok and rr.compared > 0, rr.ok and string.format("%d values identical", rr.compared) or rr.reasons[1])
end

local cpu_pages = mla.zeros({ NB, L:page_bytes(BS) }, "u8", "cpu")
K.write({ pages = cpu_pages, layout = L, block_size = BS }, slots_cpu, x)
pages_equal("write (CPU kernels) == reference", cpu_pages)

if gpu then
  local s_gpu, x_gpu = slots_cpu:to(dev), x:to(dev)
  for _, impl in ipairs { "baked", "jit" } do
    local pages = mla.zeros({ NB, L:page_bytes(BS) }, "u8", dev)
    local cv = { pages = pages, layout = L, block_size = BS }
    if impl == "baked" then K.write(cv, s_gpu, x_gpu) else mla.kv_jit.write(cv, s_gpu, x_gpu) end
    pages_equal("write " .. impl .. " == reference bytes", pages)
    local src = { pages = ref_pages:to(dev), layout = L, block_size = BS }
    rows_equal("gather " .. impl .. " == reference",
      impl == "baked" and K.gather_sparse(src, s_gpu) or mla.kv_jit.gather(src, s_gpu))
  end
else
  for _, which in ipairs { "write", "gather" } do
    local ok, m = pcall(mla.kv_jit.module, which, L, BS, "sm_90a")
    check("kv_" .. which .. ".cu compiles (sm_90a)", ok, ok and #m:kernels() .. " kernels, not launched" or tostring(m))
  end
end

-- decode attention, dense and sparse, against the reference (FlashMLA tolerances)
local impls = gpu and { "baked", "jit" } or {}
for _, kind in ipairs { "dense", "sparse" } do
  local case = kind == "dense"
    and C.dense { layout = L, b = 2, s_q = 1, h_q = gpu and 64 or 8, lens = gpu and { 900, 333 } or { 150, 61 }, block_size = BS }
    or C.sparse { layout = L, b = 2, s_q = 2, h_q = gpu and 64 or 8, topk = gpu and 256 or 64, pool = gpu and 1500 or 200,
      invalid = 0.1, block_size = BS }
  local ro, rl = mla.attention.decode(C.args(case, { impl = "ref" }))
  -- the reference reads the layout through its description: the same rows
  -- dequantized into a bf16 cache (exact: power-of-two scales) give the same bits
  local plain = mla.cache.new { layout = "bf16", num_blocks = case.cache.num_blocks, block_size = BS, device = "cpu" }
  local every = mla.arange(case.cache:num_slots(), "i64", "cpu")
  plain:write(0, case.cache:read(0, every), every)
  local po, pl = mla.attention.decode(C.args({ kind = case.kind, view = plain:view(0), q = case.q, block_table = case.block_table,
    cache_lens = case.cache_lens, indices = case.indices, topk_len = case.topk_len }, { impl = "ref" }))
  local same = mla.compare(ro, po, "exact")
  check(string.format("decode %s reference == on bf16 rows", kind), same.ok and same.compared > 0 and mla.compare(rl, pl, "exact").ok,
    same.ok and string.format("%d outputs identical", same.compared) or same.reasons[1])
  for _, impl in ipairs(impls) do
    if impl ~= "ref" then
      local out, lse = mla.attention.decode(C.args(case, { impl = impl }))
      local preset = kind == "dense" and "flashmla_dense_decode" or "flashmla_sparse_decode"
      local r1 = mla.compare(out:to({ dtype = "f32", device = "cpu" }), ro:to("bf16"):to("f32"), { preset = preset })
      local r2 = mla.compare(lse:to("cpu"), rl, "flashmla_lse")
      check(string.format("decode %s %s vs reference", kind, impl), r1.ok and r2.ok and r1.compared > 0,
        r1.ok and r2.ok and string.format("max |d| %.2g, cos %.1e", r1.max_abs, r1.cos_diff) or (r1.reasons[1] or r2.reasons[1]))
    end
  end
end
if not gpu then
  local ok, m = pcall(mla.rtc.compile, { file = "attn_decode.cu", layout = L, block_size = BS, arch = "sm_90a" })
  check("attn_decode.cu compiles (sm_90a)", ok, ok and #m:kernels() .. " kernel, not launched" or tostring(m))
end

-- 2. Beside the built-ins ---------------------------------------------------------------------

print("\n== 2. timings beside the built-in layouts ==")
local TOK = gpu and (a.quick and 65536 or 262144) or 4096
local DEC = gpu and { b = 64, h_q = 64, len = a.quick and 2048 or 8192 } or { b = 2, h_q = 8, len = 256 }
local BENCH = gpu and { max_time = 1 } or { min_samples = 3, max_time = 0.2, max_noise = 0.05 }
local function bopts(name, bytes)
  local o = { name = name, bytes = bytes }
  for k, x2 in pairs(BENCH) do o[k] = x2 end
  return o
end
print(string.format("write and gather: %d tokens; dense decode: b %d, %d heads, %d tokens each", TOK, DEC.b, DEC.h_q, DEC.len))
local TFMT = "%-18s %6s %22s %22s %22s"
print(string.format(TFMT, "layout", "B/tok", "write", "gather", "decode (dense)"))
local IMPLS = gpu and { "baked", "jit" } or { "ref" }
print(string.format(TFMT, "", "", table.concat(IMPLS, " / "), table.concat(IMPLS, " / "), table.concat(IMPLS, " / ")))
local records = {}
for _, name in ipairs { "bf16", "fp8_ds_mla", "fp8_v4", L.name } do
  local lay = mla.layout.get(name)
  local nb = (TOK + BS - 1) // BS
  local c = mla.cache.new { layout = lay, num_blocks = nb, block_size = BS, device = dev }
  local rows = mla.randn({ TOK, lay.dim }, { std = 0.5, dtype = "bf16", device = dev })
  local all = mla.arange(TOK, "i32", dev)
  local cv = c:view(0)
  local out = mla.empty({ TOK, lay.dim }, "bf16", dev)
  local bytes = TOK * (lay.token_bytes + 2 * lay.dim)
  local cells = { w = {}, g = {}, d = {} }
  for _, impl in ipairs(IMPLS) do
    local wfn, gfn
    if impl == "jit" then
      wfn = function() mla.kv_jit.write(cv, all, rows) end
      gfn = function() mla.kv_jit.gather(cv, all, out) end
    else
      wfn = function() K.write(cv, all, rows, { check = false }) end
      gfn = function() K.gather_sparse(cv, all, { out = out, check = false }) end
    end
    local bw = mla.bench(wfn, bopts(name .. " write", bytes))
    local bg = mla.bench(gfn, bopts(name .. " gather", bytes))
    local bd = AB.run({ kind = "dense", layout = name, b = DEC.b, s_q = 1, h_q = DEC.h_q, len = DEC.len, impl = impl },
      bopts(name .. " decode"))
    for key, res in pairs { w = bw, g = bg, d = bd } do
      local g = res.gbs and string.format(res.gbs < 10 and "(%.2f GB/s)" or "(%.0f GB/s)", res.gbs) or ""
      cells[key][#cells[key] + 1] = string.format("%s %s", E.us(res.median), g)
      records[#records + 1] = { layout = name, impl = impl, op = key, median = res.median, gbs = res.gbs }
    end
  end
  print(string.format(TFMT, name, lay.token_bytes, table.concat(cells.w, " / "), table.concat(cells.g, " / "),
    table.concat(cells.d, " / ")))
  c = nil
  collectgarbage("collect")
end
print("GB/s: write and gather count the cache bytes and the bf16 rows; decode counts q, the cache rows read and the output")
v:finish()
