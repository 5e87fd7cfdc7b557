--- Does the automatic split count pick well? Times decode launches at batch sizes on and off
-- whole waves of CTAs (the 16-row kernel runs one CTA a SM, the 64-row one two CTAs a request at
-- h_q 128), with the launcher's own count (splits = 0) and with forced counts, and prints each
-- row's best forced count and auto / best. A batch one request past a whole wave is where an
-- unsplit launch loses most (a second wave of a few CTAs); splitting then fills the SMs, at the
-- cost of a fixed prologue and epilogue a CTA and the combine (bench/RESULTS.md, twenty-sixth
-- session).
--   mlalab bench/attn_splits.lua [--max-time s] [--quick]
local mla = require "mlalab"
local AB = require "mlalab.attention_bench"

local max_time, quick = AB.script_options("bench/attn_splits.lua", { ... }, 0.25)
if mla.device() == "cpu" then error("bench/attn_splits.lua: times the baked GPU kernels' split counts; no GPU here", 0) end

-- rows: a shape and its batch sizes (H100: 132 SMs)
local ROWS = {
  { kind = "dense", layout = "fp8_ds_mla", h_q = 128, len = 4096, bs = { 66, 68, 100, 128, 134, 160 } },
  { kind = "dense", layout = "fp8_v4", h_q = 16, len = 4096, bs = { 128, 133, 150, 200, 264 } },
  { kind = "dense", layout = "fp8_ds_mla", h_q = 16, len = 16384, bs = { 133, 200 } },
  { kind = "dense", layout = "bf16", h_q = 16, len = 4096, bs = { 140, 300 } },
  { kind = "sparse", layout = "fp8_ds_mla", h_q = 128, s_q = 2, topk = 2048, pool = 131072, bs = { 40 } },
}
local FORCED = quick and { 1, 2, 4 } or { 1, 2, 3, 4, 6, 8 }

print(string.format("%-44s %-14s %-14s %-8s %s", "case", "auto (splits)", "best forced", "auto/best", "forced: splits:us"))
for _, row in ipairs(ROWS) do
  for _, b in ipairs(quick and #row.bs > 1 and { row.bs[1], row.bs[#row.bs] } or row.bs) do
    local p = { kind = row.kind, layout = row.layout, b = b, s_q = row.s_q or 1, h_q = row.h_q, len = row.len,
      topk = row.topk, pool = row.pool }
    local auto = AB.run(p, { max_time = max_time })
    local best, best_ns, cells = math.huge, 0, {}
    for _, ns in ipairs(FORCED) do
      p.splits = ns
      local t = AB.run(p, { max_time = max_time }).median
      cells[#cells + 1] = string.format("%d:%.1f", ns, t * 1e6)
      if t < best then best, best_ns = t, ns end
    end
    print(string.format("%-44s %-14s %-14s %-8s %s", AB.name(p), string.format("%.1f us (%d)", auto.median * 1e6, auto.plan.splits),
      string.format("%.1f us (%d)", best * 1e6, best_ns), string.format("%.3f", auto.median / best), table.concat(cells, " ")))
  end
end
