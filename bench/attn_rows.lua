--- Which tile height serves a decode shape of few query rows? Times dense and sparse cases of 16
-- and 32 rows a request with each kernel the launcher can run them on: its own choice
-- (specialize = true), 64-row tiles ("wide"), the generic kernel (false) and, for the fp8
-- built-ins, the V-slice kernel ("slice"), at large and small batches (small ones split the
-- keys, so each kernel's fixed cost a split shows). Prints each case's times, the fastest
-- choice and default / fastest. (bench/RESULTS.md, thirty-seventh session: on the H200 dense bf16
-- runs 1.28-2.3 times faster on 64-row tiles at b128, so the launcher takes them by default.)
-- Each case builds its own pools: a full run takes about five minutes on the H200, --quick
-- (bf16 and fp8_ds_mla at b128) about two.
--   mlalab bench/attn_rows.lua [--max-time s] [--quick]
local mla = require "mlalab"
local AB = require "mlalab.attention_bench"

local max_time, quick = AB.script_options("bench/attn_rows.lua", { ... }, 0.25)
if mla.device() == "cpu" then error("bench/attn_rows.lua: times the baked GPU kernels; no GPU here", 0) end

local FP8 = { fp8_pertensor = true, fp8_ds_mla = true, fp8_v4 = true }
-- shapes: 16 rows (s1 h16, s2 h8) and 32 (s2 h16), long and short contexts, whole waves and small batches
local ROWS = {
  { kind = "dense", s_q = 1, h_q = 16, len = 4096, bs = { 128, 8 } },
  { kind = "dense", s_q = 1, h_q = 16, len = 32768, bs = { 128, 4 } },
  { kind = "dense", s_q = 2, h_q = 8, len = 8192, bs = { 128, 16 } },
  { kind = "dense", s_q = 2, h_q = 16, len = 8192, bs = { 128, 16 } },
  { kind = "sparse", s_q = 2, h_q = 16, topk = 2048, pool = 131072, bs = { 128, 16 } },
}
local LAYOUTS = quick and { "bf16", "fp8_ds_mla" } or { "bf16", "fp8_pertensor", "fp8_ds_mla", "fp8_v4" }

local function shown(spec) return type(spec) == "string" and spec or tostring(spec) end
print(string.format("%-40s %-26s %-20s %-9s %s", "case", "default (variant, splits)", "fastest", "def/best", "choice: us"))
for _, row in ipairs(ROWS) do
  for _, layout in ipairs(LAYOUTS) do
    for _, b in ipairs(quick and { row.bs[1] } or row.bs) do
      local p = { kind = row.kind, layout = layout, b = b, s_q = row.s_q, h_q = row.h_q, len = row.len, topk = row.topk,
        pool = row.pool }
      local def, best, best_spec, cells = nil, math.huge, nil, {}
      for _, spec in ipairs(FP8[layout] and { true, "wide", false, "slice" } or { true, "wide", false }) do
        p.specialize = spec
        local r = AB.run(p, { max_time = max_time })
        def = def or r
        cells[#cells + 1] = string.format("%s:%.1f", shown(spec), r.median * 1e6)
        if r.median < best then best, best_spec = r.median, spec end
      end
      p.specialize = nil
      print(string.format("%-40s %-26s %-20s %-9s %s", AB.name(p),
        string.format("%.1f us (%s, %d)", def.median * 1e6, def.plan.variant, def.plan.splits),
        string.format("%.1f us (%s)", best * 1e6, shown(best_spec)), string.format("%.3f", def.median / best), table.concat(cells, " ")))
    end
  end
end
