--- Timing of decode attention: builds a benchmark-sized case (pages filled
-- by replicating a few pages written through the layout, so the bytes are
-- valid codes without quantizing gigabytes on the CPU), prepares the call
-- once (outputs allocated, checks off: nothing inside the timed function
-- allocates, copies to the host or synchronizes) and times it with
-- mla.bench, which also measures cudaMemcpy bandwidth and the cuBLAS GEMM
-- rate in the same process for the fractions.
--
--   local AB = mla.attention_bench
--   local r = AB.run{ kind = "dense", layout = "bf16", b = 128, s_q = 1, h_q = 16, len = 8192 }
--   print(AB.header()); print(AB.row(r))
--
-- Counting (testing-and-timing.md §8): FLOPs = 2 x rows x keys x (d_qk + d_v)
-- (rows = h_q x s_q dense, h_q sparse; keys = sum of lengths, or valid index
-- entries; the causal triangle is not subtracted); bytes = q (bf16) + keys x
-- the layout's bytes per token (all region rows) + out (bf16).
local mla = require "mlalab"
local core = mla.core
local C = require "mlalab.attention_cases"
local A = require "mlalab.attention"

local M = {}

--- Bytes one token occupies in the cache rows a kernel reads (every region's row).
function M.token_bytes(L, block_size)
  local d = core.layout_unpack(L:packed(block_size))
  local n = 0
  for r = 1, d.nregions do n = n + d.region_row_bytes[r] end
  return n
end

--- Builds a case from a point: kind = "dense" | "sparse", layout, b, s_q,
-- h_q, len (dense), topk + pool (sparse), block_size = 64. A point may also
-- carry impl, splits, specialize and causal_tail (attention.decode's options)
-- and device (default: the GPU when there is one).
function M.case(p)
  local o = { layout = p.layout, b = p.b, s_q = p.s_q or 1, h_q = p.h_q, block_size = p.block_size or 64,
    fill = "replicate", template_pages = 16, seed = p.seed or 1, kv_std = 1, device = p.device }
  if p.kind == "sparse" then
    o.topk, o.pool, o.unique, o.invalid = p.topk, p.pool or 131072, false, p.invalid
    return C.sparse(o)
  end
  o.len = p.len
  return C.dense(o)
end

--- FLOPs and bytes of one call on a case.
function M.cost(case)
  local L = case.layout
  local keys = C.attended(case)
  local rows = case.kind == "dense" and case.h_q * case.s_q or case.h_q
  local flops = 2 * rows * keys * (L.k_dims + L.v_dims)
  local qo = 2 * case.b * case.s_q * case.h_q * (L.k_dims + L.v_dims)
  local bytes = qo + keys * M.token_bytes(L, case.block_size)
  return flops, bytes, keys
end

--- Times one point; returns the bench result with .point, .plan, .keys.
function M.run(p, bench_opts)
  local case = M.case(p)
  local a, info = A.prepare(C.args(case, { impl = p.impl or "baked", check = false, splits = p.splits,
    specialize = p.specialize, causal_tail = p.causal_tail, scale = p.kind == "sparse" and case.layout.k_dims ^ -0.55 or nil }))
  local flops, bytes, keys = M.cost(case)
  local fn, plan
  if info.impl == "baked" then
    plan = core.attn_decode(a)
    fn = function() core.attn_decode(a) end
  else
    fn = function() A.decode(C.args(case, { impl = info.impl, check = false, out = a.out, lse = a.lse })) end
  end
  local o = { name = p.name or M.name(p), bytes = bytes, flops = flops, max_time = 4 }
  for k, v in pairs(bench_opts or {}) do o[k] = v end
  local r = mla.bench(fn, o)
  r.point, r.plan, r.keys = p, plan, keys
  local dev = case.q.device
  case, a, fn = nil, nil, nil -- let the pages go before the next case
  collectgarbage("collect")
  if dev ~= "cpu" then core.empty_cache(dev) end
  return r
end

--- A point's case name: "dense fp8_v4 b128 s1 h16 L4096", "sparse ... k2048", with " gen" / " <variant>"
-- for a forced kernel and " shared" without the causal tail.
function M.name(p)
  local gen = p.specialize == false and " gen" or type(p.specialize) == "string" and " " .. p.specialize or ""
  if p.causal_tail == false then gen = gen .. " shared" end -- the causal tiles' keys shared (no tail)
  if p.kind == "sparse" then
    return string.format("sparse %s b%d s%d h%d k%d%s", p.layout, p.b, p.s_q or 1, p.h_q, p.topk, gen)
  end
  return string.format("dense %s b%d s%d h%d L%d%s", p.layout, p.b, p.s_q or 1, p.h_q, p.len, gen)
end

local COLS = { { "case", 34 }, { "impl", 5 }, { "median", 10 }, { "noise", 6 }, { "GB/s", 7 }, { "%memcpy", 7 },
  { "TFLOPS", 7 }, { "%gemm", 6 }, { "MHz", 4 }, { "splits", 6 }, { "rows", 4 }, { "st", 2 }, { "variant", 13 }, { "flags", 14 } }

local function pad(s, w)
  s = tostring(s)
  if #s > w then return s:sub(1, w - 1) .. "~" end
  return s .. string.rep(" ", w - #s)
end

--- Options of the bench scripts that take [--max-time s] [--quick]: returns
-- max_time (default `max_time`) and quick; a bad one raises an error naming
-- `script` and its usage.
function M.script_options(script, args, max_time)
  local usage = script .. " [--max-time s] [--quick]"
  local quick, i = false, 1
  while i <= #args do
    local a = args[i]
    if a == "--max-time" then
      max_time = tonumber(args[i + 1])
      if not max_time or max_time <= 0 then error(script .. ": --max-time takes a positive number (" .. usage .. ")", 0) end
      i = i + 1
    elseif a == "--quick" then
      quick = true
    else
      error(script .. ": unknown argument " .. a .. " (" .. usage .. ")", 0)
    end
    i = i + 1
  end
  return max_time, quick
end

--- The header line of the bench table (the columns of M.row).
function M.header()
  local t = {}
  for _, c in ipairs(COLS) do t[#t + 1] = pad(c[1], c[2]) end
  return table.concat(t, " ")
end

local function pct(f) return f and string.format("%.1f%%", 100 * f) or "-" end

--- One table row of a bench result of M.run: time, noise, GB/s and TFLOPS with their fractions of the
-- references, clock, and the plan (splits, rows a CTA, stages, variant).
function M.row(r)
  local pl = r.plan or {}
  local cells = { r.name, r.point.impl or "baked", mla.bench_mod.fmt_time(r.median), pct(r.noise),
    r.gbs and string.format("%.0f", r.gbs) or "-", pct(r.memcpy_frac), r.tflops and string.format("%.1f", r.tflops) or "-",
    pct(r.gemm_frac), r.clock_mhz and string.format("%.0f", r.clock_mhz) or "-", pl.splits or "-", pl.rows_per_cta or "-", pl.stages or "-",
    pl.variant and pl.variant .. (pl.causal_tail and "+tail" or "") or "-", table.concat(r.flags or {}, ",") }
  local t = {}
  for i, c in ipairs(COLS) do t[#t + 1] = pad(cells[i], c[2]) end
  return table.concat(t, " ")
end

--- One flat record per result (JSON lines).
function M.record(r)
  local s = r:summary()
  for k, v in pairs(r.point) do s["p_" .. k] = v end
  for k, v in pairs(r.plan or {}) do s["plan_" .. k] = v end
  s.keys = r.keys
  return s
end

return M
