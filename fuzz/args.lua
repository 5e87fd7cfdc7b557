-- Argument fuzz of the Lua API (run by .ci/run under ASan + UBSan):
--   mlalab fuzz/args.lua [--seed N] [--iterations N] [--show]
-- Builds a valid call of mla.attention.decode or an mla.kernels operation on
-- small CPU caches of every built-in layout (or a tensor method, a
-- constructor, mla.compare, mla.cache.new, mla.pair, mla.rtc.compile or the
-- REPL's completion with random arguments, or mla.layout.define on a built-in description made wrong), replaces one or two of its
-- arguments with something wrong (another dtype, shape or device, a closed
-- tensor, negative, huge or NaN values, a table or string for a tensor...)
-- and calls it. Each call must return or raise a Lua error whose message
-- names the operation; a crash, a sanitizer report or an error that names
-- nothing (Lua's own "attempt to index a nil value") fails the run. Huge
-- allocations must fail as errors: run with ASAN_OPTIONS=allocator_may_return_null=1.
local mla = require "mlalab"
local C = mla.attention_cases
local K = mla.kernels

local opt = { seed = 1, iterations = 300, show = false }
local i = 1
while i <= #arg do
  local a = arg[i]
  if a == "--seed" then opt.seed, i = math.tointeger(tonumber(arg[i + 1])), i + 1
  elseif a == "--iterations" then opt.iterations, i = math.tointeger(tonumber(arg[i + 1])), i + 1
  elseif a == "--show" then opt.show = true
  else error("fuzz/args.lua: unknown argument " .. tostring(a), 0) end
  i = i + 1
end
assert(opt.seed and opt.iterations, "fuzz/args.lua: --seed and --iterations take integers")

local draw = C.rng(opt.seed)
local function pick(t) return t[draw(#t) + 1] end

local LAYOUTS = { "bf16", "fp8_pertensor", "fp8_ds_mla", "fp8_ds_mla_blocked", "fp8_v4", "fp8_v4_vllm", "fp8_v41", "fp4_v41",
  "indexer_fp8" }

-- Wrong values for a tensor argument x (x may be nil).
local function wrong_tensor(x)
  local is_t = mla.is_tensor(x)
  local f = pick {
    function() return nil end, function() return 7 end, function() return "x" end, function() return {} end,
    function() return mla.zeros({ 0 }, "i32", "cpu") end,
    function() return mla.full({ 3 }, -5, "i64", "cpu") end,
    function() return mla.full({ 2, 1 << 16 }, 1, "i32", "cpu") end,
    function() return mla.full({ 5 }, 2147483647, "i32", "cpu") end,
    function() return mla.randn({ 1, 1, 1, 576 }, { dtype = "bf16", device = "cpu" }) end,
    function() return is_t and x:to("f32") or nil end,
    function() return is_t and x:to("i64") or nil end,
    function() return is_t and x:view("u8") or nil end,
    function() return is_t and x:dim() >= 2 and x:transpose(0, 1) or x end,
    function() return is_t and x:numel() > 0 and x:narrow(0, 0, x:size(0) - 1) or x end,
    function() if is_t then local y = x:clone(); y:fill(-1); return y end end,
    function() if is_t then local y = x:clone(); y:fill(1e9); return y end end,
    function() if is_t then local y = x:clone(); y:close(); return y end end,
  }
  return f()
end

local function wrong_scalar()
  return pick { -1, 0, 3, 1 << 40, 0.5, 0 / 0, 1e300, "x", {}, true }
end

-- A cache view table with one field made wrong.
local function wrong_view(v)
  local w = {}
  for k, x in pairs(v) do w[k] = x end
  local k = pick { "pages", "pages", "tensor_scale", "block_size", "layout", "desc" }
  if k == "pages" then
    w.pages = pick {
      function() return w.pages:narrow(0, 0, 1) end, function() return w.pages:view("f32") end,
      function() return mla.zeros({ 3, 5 }, "u8", "cpu") end,
      function() local y = w.pages:clone(); y:close(); return y end,
      function() return w.pages:narrow(1, 1, w.pages:size(1) - 1) end,
    }()
  elseif k == "tensor_scale" then w.tensor_scale = pick { 0, -1, 0 / 0, mla.zeros({ 3 }, "f32", "cpu"), "x" }
  elseif k == "block_size" then w.block_size = pick { 0, -16, 7, 1 << 40, 0.5 }
  elseif k == "layout" then w.layout = pick { "nope", 3, {} }
  else w.desc = pick { "", "garbage", 5 } end
  return w
end

local function cpu_view(layout, blocks, bs, seed)
  local c = mla.cache.new { layout = layout, num_blocks = blocks, block_size = bs, device = "cpu", tensor_scale = 0.5 }
  local v = c:view(0)
  v.pages:random_("bits", seed)
  return v
end

-- Valid calls: name (what its errors must mention), function, argument list.
local function attention_call(it)
  local sparse = draw(2) == 0
  local o = { layout = pick(LAYOUTS), b = 2, s_q = 1 + draw(2), h_q = 1 + draw(3), block_size = 16, device = "cpu", seed = it }
  if sparse then o.topk, o.pool, o.invalid = 8 + draw(9), 40, 0.2 else o.lens = { draw(40), draw(40) } end
  local ok, case = pcall(sparse and C.sparse or C.dense, o)
  if not ok then return nil end -- a layout attention does not serve
  local a = C.args(case, { impl = "ref" })
  local keys = {}
  for k in pairs(a) do keys[#keys + 1] = k end
  table.sort(keys)
  for _ = 1, 1 + draw(2) do
    local k = pick(keys)
    if mla.is_tensor(a[k]) or a[k] == nil then
      local ok2, x = pcall(wrong_tensor, a[k])
      a[k] = ok2 and x or nil
    elseif type(a[k]) == "table" and a[k].pages then
      local ok2, w = pcall(wrong_view, a[k])
      a[k] = ok2 and w or nil
    else a[k] = wrong_scalar() end
  end
  if draw(4) == 0 then a.splits = pick { -1, 0, 1, 1000, 0.5 } end
  return "attention", mla.attention.decode, { a }
end

local function kernel_call(it)
  local bs = pick { 16, 64 }
  local v = cpu_view(pick(LAYOUTS), 6, bs, it)
  local dim = mla.core.layout_unpack(v.desc).dim
  local slots = mla.tensor({ 0, 3, bs + 1, 5 * bs - 1 }, "i64", "cpu")
  local bt = mla.tensor({ { 0, 2 }, { 5, 1 } }, "i32", "cpu")
  local cu = mla.tensor({ 0, bs + 3, 2 * bs + 1 }, "i32", "cpu")
  local topk = mla.tensor({ { 0, 5, -1 }, { 3, bs + 2, 1 } }, "i32", "cpu")
  local name, fn, args = table.unpack(pick {
    { "write", K.write, { v, slots, mla.randn({ 4, dim }, { dtype = "bf16", device = "cpu" }) } },
    { "gather_sparse", K.gather_sparse, { v, slots:to("i32"), { ncols = pick { nil, 512, 0, -1, 1 << 20 } } } },
    { "gather_dense", K.gather_dense, { v, bt, cu } },
    { "gather_raw", K.gather_raw, { v, bt, cu } },
    { "requant", K.requant, { v, cpu_view(pick(LAYOUTS), 6, bs, it + 1) } },
    { "compact", K.compact, { v, topk } },
    { "gather_referenced", K.gather_referenced, { v, topk } },
    { "topk_paged", K.topk_paged, { topk, bt, bs } },
    { "topk_ragged", K.topk_ragged, { topk, mla.tensor({ 0, 3 }, "i32", "cpu") } },
  })
  for _ = 1, 1 + draw(2) do
    local k = draw(#args + 1) + 1
    local x = args[k]
    if type(x) == "table" and x.pages then
      local ok, w = pcall(wrong_view, x)
      args[k] = ok and w or nil
    elseif mla.is_tensor(x) or x == nil then
      local ok, y = pcall(wrong_tensor, x)
      args[k] = ok and y or nil
    elseif type(x) == "number" then args[k] = wrong_scalar()
    else args[k] = pick { { check = false }, { out = mla.zeros({ 1 }, "f32", "cpu") }, "x", 5 } end
  end
  return name, fn, args
end

-- Tensor methods and constructors with random arguments: small shapes (a
-- valid huge shape is a real allocation, not a bug), views of every kind.
local TENSOR_INTS = { 0, 1, 2, 3, -1, -2, 5, 1 << 31, (1 << 31) - 1, 1 << 40, math.maxinteger, math.mininteger, 0.5, 0 / 0 }
local DTYPES = { "u8", "i8", "i16", "i32", "i64", "f16", "bf16", "f32", "f64", "e4m3", "e5m2", "ue8m0", "e2m1", "bogus" }
local METHODS = {}
for k, v in pairs(mla.core.Tensor) do
  -- close would end the fuzz's own tensors; save_npy writes files where the fuzz runs
  if type(v) == "function" and k ~= "close" and k ~= "save_npy" then METHODS[#METHODS + 1] = k end
end
table.sort(METHODS)
local ALLOCATING = { view = 1, reshape = 1, to = 1, clone = 1, contiguous = 1, totable = 1, cpu = 1, cuda = 1, float = 1, double = 1 }

local function small_tensor()
  local shape = {}
  for d = 1, draw(4) do shape[d] = draw(5) end
  local t = mla.randn(shape, { dtype = pick { "f32", "bf16", "f64" }, device = "cpu" })
  if draw(3) == 0 then
    local ok, u = pcall(t.to, t, pick(DTYPES))
    if ok then t = u end
  end
  if draw(4) == 0 and t:dim() >= 2 then t = t:transpose(0, 1) end
  return t
end

local function tensor_arg(small)
  local k = draw(6)
  local function int()
    local v = pick(TENSOR_INTS)
    return (small and type(v) == "number" and math.abs(v) > 64) and 3 or v
  end
  if k == 0 then return int()
  elseif k == 1 then return pick(DTYPES)
  elseif k == 2 then
    local s = {}
    for d = 1, draw(5) do s[d] = int() end
    return s
  elseif k == 3 then return small_tensor()
  elseif k == 4 then return nil
  else return { dtype = pick(DTYPES), device = pick { "cpu", "cuda", "cuda:3", "x" } } end
end

local function tensor_call()
  local t = small_tensor()
  if draw(2) == 0 then
    local m = pick(METHODS)
    local small = ALLOCATING[m] ~= nil
    local a = { tensor_arg(small), tensor_arg(small), tensor_arg(small), tensor_arg(small) }
    return "tensor", function(...) return t[m](t, ...) end, a
  end
  local shape = {}
  for d = 1, draw(4) do shape[d] = pick { 0, 1, 2, 3, -1, 0.5, 0 / 0, "x" } end
  local ctor = pick { mla.empty, mla.zeros, mla.full, mla.tensor, mla.arange, mla.rand, mla.randn, mla.random_bytes }
  return "tensor", ctor, { shape, tensor_arg(true), tensor_arg(true) }
end

-- The REPL's completion rule on words made of random pieces (it must never
-- raise on a string), or on a value that is not one.
local WORD_PIECES = { "mla", "t", "attention", "layout", "get", "core", "Tensor", "string", "_G", "x", ".", ".", ":", "..",
  "(", "1", " ", "", "nar", "decode", "__index" }
local function complete_call()
  if draw(8) == 0 then return "complete", mla.complete.candidates, { pick { 5, {}, true } } end
  local w = {}
  for k = 1, 1 + draw(6) do w[k] = pick(WORD_PIECES) end
  local env = setmetatable({ mla = mla, t = mla.zeros({ 2 }, "f32", "cpu"), string = string }, { __index = _G })
  return "complete", mla.complete.candidates, { table.concat(w), env }
end

-- mla.rtc.compile (NVRTC needs no GPU) on a tiny kernel with one option made
-- wrong; not cached, so nothing is written. A compile error is an error
-- object carrying NVRTC's log; any other error must name rtc.
local TINY = 'extern "C" __global__ void f(float *x, int n) { if ((int)threadIdx.x < n) x[threadIdx.x] = N; }'
local function rtc_call()
  local spec = { source = TINY, name = "fuzz.cu", arch = pick { "sm_90a", "sm_80" }, cache = false, defines = { N = 1 } }
  local k = pick { "source", "name", "arch", "defines", "names", "include_dirs", "options", "std", "lineinfo", "headers",
    "layout", "block_size", "cache", "file", "bogus" }
  spec[k] = pick {
    nil, 5, "", "x", {}, true, { 5 }, { "--bogus-flag" }, { N = {} }, { ["x.h"] = 5 }, "sm_1", "c++99", "fp8_v4", 0, -3,
    1 << 40, "../../etc/passwd", "f<int>", { "f", "g<float>" }, string.rep("y", 5000), TINY .. " }",
  }
  if k == "layout" and spec.layout ~= nil and draw(2) == 0 then spec.block_size = pick { 16, 64, 0, 7 } end
  if spec.cache == nil or spec.cache == true then spec.cache = "memory" end -- never the disk cache
  return "rtc", mla.rtc.compile, { spec }
end

-- mla.pair on backend and layout names, right and wrong.
local BACKENDS = { "sparse_prefill_bf16", "sparse_kv_fp8", "trtllm_fp8", "dense_bf16", "dense_fp8_blocked", "nope", 5 }
local function pair_call()
  if draw(5) == 0 then return "pair", mla.pair, { pick { 5, "x", true } } end
  local o = { prefill = pick(BACKENDS), decode = pick(BACKENDS) }
  if draw(2) == 0 then o.store = pick { "bf16", "fp8_ds_mla", "fp8_pertensor", "fp8_v4", "nope", 3 } end
  if draw(2) == 0 then o.kv_dtype = pick { "bf16", "fp8", "auto", "int4", 0 } end
  if draw(3) == 0 then o.block_size = pick { 64, 16, 0, -1, 0.5, 1 << 40, "x" } end
  if draw(3) == 0 then o.allow = pick { {}, { "dequant_pool" }, "x", { 5 } } end
  if draw(4) == 0 then o[pick { "bogus", "prefil" }] = 1 end
  return "pair", mla.pair, { o }
end

-- mla.compare and mla.cache.new with random operands and options.
local function misc_call()
  local function operand()
    local t = small_tensor()
    if draw(5) == 0 then t:close() end
    return pick { t, t, nil, 3, "x" }
  end
  if draw(2) == 0 then
    local a = operand()
    local b = (mla.is_tensor(a) and not a:is_closed() and draw(2) == 0) and a:clone() or operand()
    local o = pick {
      nil, "flashmla_dense_decode", "ggml", "quant_roundtrip", "nope",
      { mode = pick { "exact", "allclose", "cosine", "nmse", "allclose+cosine", "bogus" }, atol = pick { 0, -1, 0 / 0, 1e-3 },
        rtol = 1e-2, cos = pick { -1, 1e-5 }, first = pick { -1, 0, 5, 1 << 40 } },
    }
    return "tensor", mla.compare, { a, b, o }
  end
  return "tensor", mla.cache.new, { {
    layout = pick { "bf16", "fp8_v4", "nope", 3 }, num_blocks = pick { 0, 1, 3, -1, 1 << 40, 0.5 },
    block_size = pick { 16, 0, 7, -1, 1 << 33 }, num_layers = pick { 1, 2, 0, -3, 1 << 30 },
    order = pick { "layer_major", "block_major", "x" }, page_pad = pick { 0, 16, -16, 3 }, device = "cpu" } }
end

-- mla.layout.define on a built-in description with one to three parts made
-- wrong (a value replaced, a key dropped, an item added), anywhere in its
-- tree. Its errors must name the layout; what it accepts must then serve a
-- CPU cache: a page poisoned, three rows written by the reference and read
-- back, a JIT header generated (each raising only errors that name the op).
local BUILTIN_SPECS = require "mlalab.layout_builtins"
local WRONG_VALUES = { -1, 0, 1, 3, 7, 16, 1 << 40, 0.5, 0 / 0, "x", "", {}, true, "e4m3", "ue8m0", "e2m1", "f32", "bf16",
  "pow2", "amax", "tensor", "scale", "nope", "nope.scale", "rope", { pad = 1 }, { align = 16 }, { "rope", at = 3 },
  { dtype = "f32", group = 3 }, { name = "r", row = { "nope" } } }

local function deep_copy(t)
  if type(t) ~= "table" then return t end
  local o = {}
  for k, v in pairs(t) do o[k] = deep_copy(v) end
  return o
end

-- Every table of a description with the keys it holds: the places to mutate.
local function places(t, out)
  out[#out + 1] = t
  local ks = {}
  for k, v in pairs(t) do
    if type(v) == "table" then ks[#ks + 1] = k end
  end
  table.sort(ks, function(a, b) return tostring(a) < tostring(b) end)
  for _, k in ipairs(ks) do places(t[k], out) end
  return out
end

local function mutate(spec)
  local at = pick(places(spec, {}))
  local ks = {}
  for k in pairs(at) do ks[#ks + 1] = k end
  table.sort(ks, function(a, b) return tostring(a) < tostring(b) end)
  local what = draw(3)
  if what == 0 and #ks > 0 then at[pick(ks)] = nil -- dropped (an array may get a hole)
  elseif what == 1 then at[#at + 1] = deep_copy(pick(WRONG_VALUES)) -- an item added
  elseif #ks > 0 then at[pick(ks)] = deep_copy(pick(WRONG_VALUES)) end
end

local function layout_call(it)
  local spec = deep_copy(pick(BUILTIN_SPECS))
  spec.name = "fuzz_" .. it
  for _ = 1, 1 + draw(3) do mutate(spec) end
  return "layout", function()
    local L = mla.layout.define(spec)
    -- accepted: it must serve a CPU cache as a built-in does
    local bs = pick { 1, 4, 16, 64 }
    local c = mla.cache.new { layout = L, num_blocks = 3, block_size = bs, device = "cpu", tensor_scale = 0.25 }
    local v = c:view(0)
    v.pages:random_("bits", it)
    local slots = mla.tensor({ 0, bs + 1, 3 * bs - 1 }, "i64", "cpu")
    local rows = mla.randn({ 3, L.dim }, { std = 2, dtype = "bf16", device = "cpu", seed = it })
    -- an error here must name its operation (a table is no name: the run fails on it)
    for _, step in ipairs { { "write", function() K.write(v, slots, rows) end },
      { "gather_sparse", function() K.gather_sparse(v, slots:to("i32")) end },
      { "layout_header", function() mla.rtc.layout_header(L, bs) end } } do
      local op, ok, err = step[1], pcall(step[2])
      if not ok and not (type(err) == "string" and err:find(op, 1, true)) then error({ op .. ": " .. tostring(err) }, 0) end
    end
  end, {}
end

-- An error must be a string that names the operation, the one it delegates
-- to, or the closed tensor it was given.
local DELEGATES = { gather_referenced = "gather_sparse", attention = "attn_", pair = "backend" }
local function names_op(msg, name)
  if name == "rtc" and type(msg) == "table" and type(msg.log) == "string" then return true end -- NVRTC's diagnostics
  if type(msg) ~= "string" then return false end
  msg = msg:gsub("^[^\n:]*%.lua:%d+: ", "") -- a source position is no name (rtc.lua would pass for "rtc")
  if name == "tensor" then return true end -- Lua's own argument errors name the method; only a crash or a leak fails
  return msg:find(name, 1, true) ~= nil or msg:find("closed tensor", 1, true) ~= nil
    or (DELEGATES[name] and msg:find(DELEGATES[name], 1, true) ~= nil)
end

local calls, raised, bad = 0, 0, {}
local per = {} -- operation -> {calls, returned}
for it = 1, opt.iterations do
  local name, fn, args
  local family = draw(5)
  if family == 0 then name, fn, args = attention_call(it)
  elseif family == 1 then name, fn, args = kernel_call(it)
  elseif family == 2 then name, fn, args = tensor_call()
  elseif family == 3 then name, fn, args = layout_call(it)
  elseif draw(4) == 0 then name, fn, args = complete_call()
  elseif draw(4) == 0 then name, fn, args = rtc_call()
  elseif draw(3) == 0 then name, fn, args = pair_call()
  else name, fn, args = misc_call() end
  if name then
    local ok, err = pcall(fn, table.unpack(args, 1, 4))
    calls = calls + 1
    per[name] = per[name] or { 0, 0 }
    per[name][1], per[name][2] = per[name][1] + 1, per[name][2] + (ok and 1 or 0)
    if not ok then
      raised = raised + 1
      if opt.show then print(name, err) end
      if not names_op(err, name) then bad[#bad + 1] = string.format("%s (iteration %d): %s", name, it,
        type(err) == "table" and tostring(err[1]) or tostring(err)) end
    end
  end
end
print(string.format("fuzz/args.lua: seed %d, %d calls, %d raised, %d errors that name nothing", opt.seed, calls, raised, #bad))
local names = {}
for n in pairs(per) do names[#names + 1] = n end
table.sort(names)
for k, n in ipairs(names) do names[k] = string.format("%s %d/%d", n, per[n][2], per[n][1]) end
print("  returned / called: " .. table.concat(names, ", "))
for k = 1, math.min(#bad, 20) do print("  " .. bad[k]) end
if #bad > 0 then os.exit(1) end
