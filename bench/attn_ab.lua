--- Quick A/B timing of the issue's fp8 decode shapes, for comparing two builds in one
-- device run (no reference rates: use attn_bench.lua for figures of record):
--   for bin in $OLD $NEW $OLD $NEW; do $bin bench/attn_ab.lua [compute|memory] [seconds]; done
-- compute (default): the six compute-bound shapes (h_q = 128, dense L4096 fp8 and bf16, sparse
-- topk 2048); memory: the memory-bound ones (b = 128, 16 rows: h_q 16 at L4096 and L8192, and
-- s_q 2 x h_q 8). Seconds per case default to 0.5.
local AB = require "mlalab.attention_bench"

local sets = {
  compute = {
    { kind = "dense", layout = "fp8_ds_mla", b = 128, s_q = 1, h_q = 128, len = 4096 },
    { kind = "dense", layout = "fp8_v4", b = 128, s_q = 1, h_q = 128, len = 4096 },
    { kind = "dense", layout = "fp8_pertensor", b = 128, s_q = 1, h_q = 128, len = 4096 },
    { kind = "dense", layout = "bf16", b = 128, s_q = 1, h_q = 128, len = 4096 },
    { kind = "sparse", layout = "fp8_ds_mla", b = 128, s_q = 2, h_q = 128, topk = 2048, pool = 131072 },
    { kind = "sparse", layout = "fp8_v4", b = 128, s_q = 2, h_q = 128, topk = 2048, pool = 131072 },
  },
  memory = {},
}
for _, layout in ipairs { "fp8_ds_mla", "fp8_v4", "fp8_pertensor" } do
  for _, len in ipairs { 4096, 8192 } do
    table.insert(sets.memory, { kind = "dense", layout = layout, b = 128, s_q = 1, h_q = 16, len = len })
  end
end
table.insert(sets.memory, { kind = "dense", layout = "fp8_ds_mla", b = 128, s_q = 2, h_q = 8, len = 8192 })

local which, secs = ...
local points = sets[which or "compute"]
if not points then error("bench/attn_ab.lua: the set must be 'compute' or 'memory', got '" .. tostring(which) .. "'", 0) end
local max_time = tonumber(secs) or 0.5
local cells = {}
for _, p in ipairs(points) do
  local r = AB.run(p, { max_time = max_time })
  cells[#cells + 1] = string.format("%s %.1f us", AB.name(p), r.median * 1e6)
end
print(table.concat(cells, " | "))
