--- Bandwidth of the baked KV-cache kernels beside cudaMemcpy device to device,
-- measured in the same run (bytes read + bytes written, 1e9 B/s; the bytes a
-- kernel must move: rows and the slot ids or indices it reads, as the pm
-- timer's DRAM counters confirm, --counters 1), cold
-- (L2 flushed, queued behind the blocking kernel), median of mla.bench's
-- samples. Target: every kernel >= 90% of the memcpy rate at >= 256 MiB, and
-- the sparse gather of 262144 rows from fp8_ds_mla (656 B read + 1152 B
-- written per row) >= 2600 GB/s. Compaction's exact-output mode runs the
-- capacity mode's kernels plus a host round trip its output shapes require;
-- its verdict is TRADE-OFF, with the time that round trip adds.
--
--   mlalab bench/kv_bench.lua [--mib 256,1024] [--out DIR] [--only PATTERN] [--max-time S] [--device cpu]
--                             [--timer events|cupti|pm] [--counters 1]
--
-- --timer picks mla.bench's timer for the kernels (the cudaMemcpy baseline and
-- compaction's exact mode, whose time is a host round trip, keep the event
-- pair). The memcpy reference (a 1 GiB copy) is timed as the kernels are
-- (mla.bench_mod.memcpy_bandwidth); the default event pair brackets ~1-1.5 us
-- of launch processing per call, which weighs on a 90 us kernel and hardly on
-- the reference; --timer pm times each kernel as Nsight Compute's Duration
-- (bench/RESULTS.md uses both).
-- --counters 1 (with --timer pm) also reads the DRAM bytes each call moved,
-- printed beside the bytes the case declares.
--
-- --device cpu runs the CPU references with tiny sizes (a smoke test of the
-- script, not a measurement). Results: DIR/kv_bench.jsonl, one line per case.
local mla = require "mlalab"
local json = require "mlalab.json"
local B = mla.bench_mod
local K = mla.kernels

local args = { mib = "256,1024", out = "/tmp/mlalab-bench", device = "cuda", max_time = 15 }
do
  local a, i = { ... }, 1
  while i <= #a do
    local k, v = a[i], a[i + 1]
    if k == "--mib" then args.mib = v
    elseif k == "--out" then args.out = v
    elseif k == "--only" then args.only = v
    elseif k == "--max-time" then args.max_time = tonumber(v)
    elseif k == "--device" then args.device = v
    elseif k == "--timer" then args.timer = v
    elseif k == "--counters" then args.counters = v == "1"
    else error("kv_bench: unknown argument " .. tostring(k)) end
    i = i + 2
  end
end

if args.counters and args.timer ~= "pm" then error("kv_bench: --counters 1 needs --timer pm") end

local MiB = 1 << 20
local dev = args.device
local cpu = dev == "cpu"
local sizes = {}
for s in args.mib:gmatch("%d+") do sizes[#sizes + 1] = tonumber(s) * MiB end
if cpu then sizes = { MiB } end
local SPARSE_ROWS = cpu and 512 or 262144
local BS = 64

mla.manual_seed(0x6b76)
math.randomseed(0x6b76)

-- Inputs -------------------------------------------------------------------------------

local function pool(name, tokens, extra)
  local L = mla.layout.get(name)
  local nb = (tokens + BS - 1) // BS
  local c = mla.cache.new(setmetatable({ layout = L, num_blocks = nb, block_size = BS, device = dev, tensor_scale = 0.5 },
    { __index = extra }))
  return c, L, nb
end

-- Every slot of layer li holds a quantized random row.
local function fill(c, li)
  local v, n = c:view(li), c.num_blocks * BS
  K.write(v, mla.arange(n, "i64", dev), mla.randn({ n, c.layout.dim }, { device = dev }):to("bf16"))
  return v
end

-- Integers in [0, hi), drawn as integers: a float draw rounded to hi now and then
-- (about one in 2^25 for hi = 65536), an out-of-range index.
local function rand_ints(n, hi, dtype)
  return mla.rand({ n }, { lo = 0, hi = hi, device = dev, dtype = dtype or "i32" })
end

-- Pages of a page-granular permutation: slot t -> perm[t / BS] * BS + t % BS.
local function shuffled_slots(n)
  local np = (n + BS - 1) // BS
  local p = {}
  for i = 1, np do p[i] = i - 1 end
  for i = np, 2, -1 do local j = math.random(i) p[i], p[j] = p[j], p[i] end
  local s = {}
  for t = 0, n - 1 do s[t + 1] = p[t // BS + 1] * BS + t % BS end
  return mla.tensor(s, "i64", dev), p
end

-- Cases: each returns fn, bytes, note (, extra mla.bench options) ---------------------------

local cases = {}
-- tradeoff_of: a case whose kernels are that case's plus a cost by design; its
-- verdict is the time it adds to it (run just before, at the same size)
local function case(name, build, tradeoff_of)
  cases[#cases + 1] = { name = name, build = build, tradeoff_of = tradeoff_of }
end
-- Cases bound by their layout (random rows of a chunked layout:
-- each row is pieces in separate 32-byte sectors, about twice its bytes):
-- verdict LAYOUT, no target.

-- The copy itself, timed like the kernels (cold: the same L2 flush, one call
-- per sample behind the blocking kernel) at each size: a same-conditions
-- baseline, printed beside each verdict. The verdicts stay against the
-- cudaMemcpy reference (1 GiB, back to back), which has no per-call ramp or tail.
case("memcpy D2D", function(bytes)
  local n = bytes // 2
  local src, dst = mla.empty({ n }, "u8", dev), mla.empty({ n }, "u8", dev)
  src:fill(0x5a)
  return function() dst:copy(src) end, 2 * n, string.format("%d B copied (t:copy: cudaMemcpyAsync)", n),
      { timer = "events" } -- a copy is no kernel for the pm timer
end)

for _, lname in ipairs { "bf16", "fp8_pertensor", "fp8_ds_mla", "fp8_ds_mla_blocked", "fp8_v4", "indexer_fp8", "fp4_v41",
  "fp8_v41" } do
  case("write " .. lname, function(bytes)
    local L = mla.layout.get(lname)
    local per = 2 * L.dim + L.token_bytes + 8 -- the i64 slot id is read too (the DRAM counters see it)
    local n = bytes // per
    local c = pool(lname, n)
    local v = c:view(0)
    local slots = shuffled_slots(n)
    local rows = mla.randn({ n, L.dim }, { device = dev }):to("bf16")
    return function() K.write(v, slots, rows, { check = false }) end, n * per,
        string.format("%d tokens, %d B + 8 B slot id read + %d B written", n, 2 * L.dim, L.token_bytes)
  end)
end

local function sparse_case(lname, rows_fixed, view)
  return function(bytes)
    local L = mla.layout.get(lname)
    -- the i32 slot id read per row; the fixed-row case keeps the issue's count (656 B read + 1152 B written)
    local idx = rows_fixed and 0 or 4
    local per = L.token_bytes + 2 * L.dim + idx
    local n = rows_fixed or bytes // per
    local c
    if view then c = pool(lname, n, { num_layers = 61, order = "block_major" }) else c = pool(lname, n) end
    local v = fill(c, view and 30 or 0)
    local slots = rand_ints(n, c.num_blocks * BS)
    local out = mla.empty({ n, L.dim }, "bf16", dev)
    return function() K.gather_sparse(v, slots, { out = out, check = false }) end, n * per,
        string.format("%d rows, %d B%s read + %d B written%s", n, L.token_bytes, idx > 0 and " + 4 B slot id" or "",
          2 * L.dim, view and ", layer 30 of 61 block-major" or "")
  end
end

case("gather_sparse fp8_ds_mla 262144 rows", sparse_case("fp8_ds_mla", SPARSE_ROWS))
case("gather_sparse fp8_ds_mla 262144 rows 61-layer view", sparse_case("fp8_ds_mla", SPARSE_ROWS, true))
for _, lname in ipairs { "bf16", "fp8_pertensor", "fp8_ds_mla", "fp8_ds_mla_blocked", "fp8_v4", "fp4_v41", "fp8_v41" } do
  case("gather_sparse " .. lname, sparse_case(lname))
  cases[#cases].layout_bound = mla.layout.get(lname):chunked()
end

local function dense_case(lname, bytes)
  local L = mla.layout.get(lname)
  local per = L.token_bytes + 2 * L.dim
  local nreq = cpu and 2 or 64
  local len = (bytes // per) // nreq // BS * BS
  local c = pool(lname, len * nreq)
  local v = fill(c, 0)
  local _, p = shuffled_slots(len * nreq)
  local bt, cu = {}, { 0 }
  for r = 1, nreq do
    bt[r] = {}
    for j = 1, len // BS do bt[r][j] = p[(r - 1) * (len // BS) + j] end
    cu[r + 1] = cu[r] + len
  end
  local btt, cut = mla.tensor(bt, "i32", dev), mla.tensor(cu, "i32", dev)
  local out = mla.empty({ len * nreq, L.dim }, "bf16", dev)
  return function() K.gather_dense(v, btt, cut, { out = out, check = false }) end, len * nreq * per,
      string.format("%d requests x %d tokens", nreq, len)
end
case("gather_dense fp8_ds_mla", function(bytes) return dense_case("fp8_ds_mla", bytes) end)
-- dense runs of a chunked layout: pieces of consecutive tokens read together
case("gather_dense fp8_ds_mla_blocked", function(bytes) return dense_case("fp8_ds_mla_blocked", bytes) end)

case("gather_raw indexer_fp8", function(bytes)
  local n = bytes // (2 * 132) // BS * BS
  local c = pool("indexer_fp8", n)
  local v = fill(c, 0)
  local nreq = 16
  local len = n // nreq // BS * BS
  n = len * nreq
  local _, p = shuffled_slots(n)
  local bt, cu = {}, { 0 }
  for r = 1, nreq do
    bt[r] = {}
    for j = 1, len // BS do bt[r][j] = p[(r - 1) * (len // BS) + j] end
    cu[r + 1] = cu[r] + len
  end
  local btt, cut = mla.tensor(bt, "i32", dev), mla.tensor(cu, "i32", dev)
  local out = { mla.empty({ n, 128 }, "u8", dev), mla.empty({ n, 4 }, "u8", dev) }
  return function() K.gather_raw(v, btt, cut, { out = out, check = false }) end, n * 2 * 132,
      string.format("%d tokens, 132 B read + 132 B written", n)
end)

case("requant fp8_pertensor -> fp8_ds_mla", function(bytes)
  local n = bytes // (576 + 656) // BS * BS
  local src = fill(pool("fp8_pertensor", n), 0)
  local dst = pool("fp8_ds_mla", n):view(0)
  return function() K.requant(src, dst, { check = false }) end, n * (576 + 656),
      string.format("%d tokens, 576 B read + 656 B written", n)
end)

-- relayouts: codes and scales moved to (and from) their page-blocked places
for _, pr in ipairs { { "fp8_ds_mla", "fp8_ds_mla_blocked" }, { "fp8_ds_mla_blocked", "fp8_ds_mla" } } do
  case(string.format("requant %s -> %s", pr[1], pr[2]), function(bytes)
    local n = bytes // (2 * 656) // BS * BS
    local src = fill(pool(pr[1], n), 0)
    local dst = pool(pr[2], n):view(0)
    return function() K.requant(src, dst, { check = false }) end, n * 2 * 656,
        string.format("%d tokens, 656 B read + 656 B written", n)
  end)
end

-- The fallbacks' inputs: T x W random indices into an fp8_ds_mla pool of
-- twice as many slots (per = bytes read + written per dequantized row).
local REF_PER = 656 + 1152
local function referenced_inputs(bytes)
  local W = cpu and 64 or 2048
  local T = (bytes // REF_PER) // W
  local c = pool("fp8_ds_mla", 2 * T * W)
  local v = fill(c, 0)
  return c, v, rand_ints(T * W, c.num_blocks * BS):reshape({ T, W }), T, W
end

local function compact_note(T, W, npages, c)
  return string.format("%d x %d indices -> %d of %d pages dequantized (%d B read + %d B written per row) + 4 B remap read and written",
    T, W, npages, c.num_blocks, 656, 1152)
end

case("gather_referenced fp8_ds_mla", function(bytes)
  local _, v, idx, T, W = referenced_inputs(bytes)
  local out, remap = mla.empty({ T * W, 576 }, "bf16", dev), mla.empty({ T * W }, "i32", dev)
  return function() K.gather_referenced(v, idx, { out = out, remap = remap, check = false }) end, T * W * (REF_PER + 8),
      string.format("%d x %d indices, + 4 B remap read and written", T, W)
end)

-- Compaction (vLLM #42248's design) in its capacity mode: mark, rank and list
-- the referenced pages, dequantize them, remap the indices, into outputs
-- preallocated for every page of the pool; no host sync (the count stays on
-- the device), so it is timed like the other kernels (cold, queued behind the
-- blocking kernel).
case("compact fp8_ds_mla capacity", function(bytes)
  local c, v, idx, T, W = referenced_inputs(bytes)
  local o = { out = mla.empty({ c.num_blocks * BS, 576 }, "bf16", dev), check = false }
  local _, _, _, count = K.compact(v, idx, o)
  K.check(dev)
  local npages = math.tointeger(count:item())
  return function() K.compact(v, idx, o) end, npages * BS * REF_PER + T * W * 8,
      compact_note(T, W, npages, c) .. string.format("; capacity %d pages, no sync", c.num_blocks)
end)

-- The same compaction with exact outputs: their shapes depend on index
-- values, so it reads the page count back (a host sync by design) and the GPU
-- idles while the host allocates them. Timed with sync = true (no blocking
-- kernel in front; host gaps between its kernels included). Its kernels are
-- the capacity mode's, so its verdict is the trade-off the issue asks to see:
-- the time it adds to the capacity mode of the same size (run just before).
-- The outputs are closed after each call, as a loop that keeps none of them
-- would: their blocks go back to the caching allocator for the next call.
case("compact fp8_ds_mla exact", function(bytes)
  local c, v, idx, T, W = referenced_inputs(bytes)
  local _, _, pages = K.compact(v, idx)
  local npages = pages:numel()
  return function()
    local rows, remap, list = K.compact(v, idx)
    rows:close(); remap:close(); list:close()
  end, npages * BS * REF_PER + T * W * 8, compact_note(T, W, npages, c),
      { sync = true, timer = "events" }
end, "compact fp8_ds_mla capacity")

for _, mode in ipairs { "paged", "ragged" } do
  case("topk_" .. mode .. " prefill", function(bytes)
    local W = 2048
    local T = bytes // 8 // W
    local nreq = 8
    local q = {}
    for r = 1, nreq do q[r] = T // nreq end
    q[nreq] = T - (nreq - 1) * (T // nreq)
    local topk = rand_ints(T * W, 65536):reshape({ T, W })
    local out = mla.empty({ T, W }, "i32", dev)
    -- the query -> request map as a device tensor made once (q_lens, a host
    -- list, would be copied to the device inside the timed call)
    local cq = { 0 }
    for r = 1, nreq do cq[r + 1] = cq[r] + q[r] end
    local cu_q = mla.tensor(cq, "i32", dev)
    local fn
    if mode == "paged" then
      local bt = rand_ints(nreq * 1024, 1 << 20):reshape({ nreq, 1024 })
      fn = function() K.topk_paged(topk, bt, BS, { cu_q = cu_q, out = out, check = false }) end
    else
      local cu = { 0 }
      for r = 1, nreq do cu[r + 1] = cu[r] + 65536 end
      local cut = mla.tensor(cu, "i32", dev)
      fn = function() K.topk_ragged(topk, cut, { cu_q = cu_q, out = out, check = false }) end
    end
    return fn, T * W * 8, string.format("%d query tokens x top-%d, 4 B read + 4 B written", T, W)
  end)
end

-- Run -----------------------------------------------------------------------------------

os.execute("mkdir -p '" .. args.out .. "'")
local jsonl = io.open(args.out .. "/kv_bench.jsonl", "w")
local memcpy = not cpu and B.memcpy_bandwidth(dev) or nil
if not cpu then
  local props = mla.device_props(dev)
  print(string.format("device: %s; DRAM peak by formula %.0f GB/s; cudaMemcpy D2D (read + write) %.0f GB/s", props.name,
    props.peak_dram_gbs, memcpy))
end
local results, verdicts, failed = {}, {}, 0
local same_size = {} -- GB/s of the memcpy case at each size
local medians = {} -- seconds a call, by case name .. "@" .. size
for _, cs in ipairs(cases) do
  if not args.only or cs.name == "memcpy D2D" or cs.name:find(args.only, 1, true) then
    local fixed = cs.name:find("262144", 1, true)
    for si, size in ipairs(sizes) do
      if not (fixed and si > 1) then
        local fn, bytes, note, extra = cs.build(size)
        local name = cs.name .. (fixed and "" or string.format(" %d MiB", size // MiB))
        local bopts = { name = name, bytes = bytes, device = dev, max_time = args.max_time, timer = args.timer }
        if args.counters then bopts.metrics = B.DRAM_METRICS end
        for k, x in pairs(extra or {}) do bopts[k] = x end
        if bopts.timer ~= "pm" then bopts.metrics = nil end
        local r = mla.bench(fn, bopts)
        K.check(dev)
        results[#results + 1] = r
        local ratio = r.memcpy_frac
        local target = (fixed and not cpu) and 2600 or nil
        local ok = cpu or ((ratio or 0) >= 0.9 and (not target or r.gbs >= target))
        local verdict = cpu and "n/a (cpu smoke run)" or ok and "PASS" or "FAIL"
        local base = cs.tradeoff_of
        local ref = base and medians[base .. "@" .. size]
        if cs.layout_bound and not cpu then
          ok, verdict = nil, "LAYOUT"
          note = note .. "; each random row is pieces in separate sectors (about twice its bytes fetched)"
        elseif base and not cpu then
          -- a design trade-off, not a kernel: shown as the time it adds to the kernels it shares
          ok, verdict = nil, "TRADE-OFF"
          note = ref and string.format("%s; +%.1f us over the %s (%.1f%% of its time): the page count's host round trip",
            note, 1e6 * (r.median - ref), base, 100 * (r.median - ref) / ref)
            or string.format("%s; (run %s too for the time it adds)", note, base)
        elseif not ok then
          failed = failed + 1
        end
        medians[cs.name .. "@" .. size] = r.median
        if cs.name == "memcpy D2D" then same_size[size] = r.gbs end
        local same = not fixed and same_size[size] and r.gbs / same_size[size] or nil
        verdicts[#verdicts + 1] = string.format("%-58s %9.1f MiB %9.1f GB/s %7s of memcpy %s  (%s of the same-size copy)  %s",
          name, bytes / MiB, r.gbs, ratio and string.format("%.1f%%", 100 * ratio) or "-",
          verdict, same and string.format("%.1f%%", 100 * same) or "-", note)
        local rec = r:summary()
        rec.case, rec.note, rec.pass, rec.target_gbs, rec.same_size_copy_frac = cs.name, note, ok, target, same
        rec.tradeoff_of = base
        jsonl:write(json.encode(rec), "\n")
        jsonl:flush()
        print(r:row())
        local dram = r:dram_line()
        if dram then
          print("  " .. dram)
          verdicts[#verdicts] = verdicts[#verdicts] .. "\n     " .. dram
        end
        collectgarbage() -- the inputs of this case go back to the allocator
      end
    end
  end
end
jsonl:close()
print()
B.table(results)
print()
print("verdicts (>= 90% of cudaMemcpy D2D at 1 GiB; the 262144-row sparse gather also >= 2600 GB/s; TRADE-OFF: a"
  .. " host round trip by design, shown as the time it adds to the kernels it shares; LAYOUT: bound by the layout's scattered pieces, no target):")
for _, v in ipairs(verdicts) do print("  " .. v) end
print(string.format("%d of %d cases below target; results in %s/kv_bench.jsonl", failed, #verdicts, args.out))
os.exit(failed == 0 and 0 or 1)
