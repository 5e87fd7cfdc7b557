--- Quick A/B timing of the issue's four compute-bound fp8 decode shapes (h_q = 128),
-- for comparing two builds in one device run (no reference rates: use attn_bench.lua
-- for figures of record):
--   for bin in $OLD $NEW $OLD $NEW; do $bin bench/attn_ab.lua; done
-- Optional argument: seconds per case (default 0.5).
local AB = require "mlalab.attention_bench"

local points = {
  { kind = "dense", layout = "fp8_ds_mla", b = 128, s_q = 1, h_q = 128, len = 4096 },
  { kind = "dense", layout = "fp8_v4", b = 128, s_q = 1, h_q = 128, len = 4096 },
  { kind = "sparse", layout = "fp8_ds_mla", b = 128, s_q = 2, h_q = 128, topk = 2048, pool = 131072 },
  { kind = "sparse", layout = "fp8_v4", b = 128, s_q = 2, h_q = 128, topk = 2048, pool = 131072 },
}
local max_time = tonumber((...)) or 0.5
local cells = {}
for _, p in ipairs(points) do
  local r = AB.run(p, { max_time = max_time })
  cells[#cells + 1] = string.format("%s %.1f us", AB.name(p), r.median * 1e6)
end
print(table.concat(cells, " | "))
