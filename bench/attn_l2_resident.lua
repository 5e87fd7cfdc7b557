--- Is a decode kernel bound by memory or by its own work? Times each memory-bound case (b128,
-- one query, h_q 16 by default) twice in one process, hot (back-to-back calls): on its permuted
-- pages (read from DRAM), then with every request's block table pointing into the same few
-- pages (L2-resident, so no DRAM traffic). A ratio L2 / DRAM near 1 says the kernel runs at
-- the rate of its instructions, not of the memory: the tile's work is what to cut.
-- (bench/RESULTS.md: the fp8 16-row kernels measured 0.92-1.02 in the nineteenth session,
-- 0.87-0.94 once they sent their pages to L2 a tile ahead in the twenty-first.)
--   mlalab bench/attn_l2_resident.lua [layout ...] [--len L ...] [--pages N] [--b B] [--h H]
--                                     [--max-time s]
local mla = require "mlalab"
local core = mla.core
local C = require "mlalab.attention_cases"
local A = require "mlalab.attention"
local AB = require "mlalab.attention_bench"

local USAGE = "bench/attn_l2_resident.lua [layout ...] [--len L ...] [--pages N] [--b B] [--h H] [--max-time s]"
local layouts, lens, npages, b, h_q, max_time = {}, {}, 32, 128, 16, 0.5
local args = { ... }
local i = 1
-- the option's value: a positive number, a whole one unless `real`
local function number_arg(name, real)
  local v = tonumber(args[i + 1])
  if v and not real then v = math.tointeger(v) end
  if not v or v <= 0 then
    error(string.format("bench/attn_l2_resident.lua: %s takes a positive %s (%s)", name, real and "number" or "whole number",
      USAGE), 0)
  end
  i = i + 1
  return v
end
while i <= #args do
  local a = args[i]
  if a == "--len" then lens[#lens + 1] = number_arg("--len")
  elseif a == "--pages" then npages = number_arg("--pages")
  elseif a == "--b" then b = number_arg("--b")
  elseif a == "--h" then h_q = number_arg("--h")
  elseif a == "--max-time" then max_time = number_arg("--max-time", true)
  elseif a:sub(1, 2) == "--" then error("bench/attn_l2_resident.lua: unknown option " .. a .. " (" .. USAGE .. ")", 0)
  else layouts[#layouts + 1] = a end
  i = i + 1
end
if #layouts == 0 then layouts = { "fp8_pertensor", "fp8_ds_mla", "fp8_v4", "bf16" } end
if #lens == 0 then lens = { 4096, 8192 } end
if mla.device() == "cpu" then
  error("bench/attn_l2_resident.lua: times the baked GPU kernels; no GPU here", 0)
end

local TILE = 64
print(string.format("%-14s %-6s %-10s %10s %10s %8s %12s", "layout", "len", "variant", "DRAM", "L2", "L2/DRAM",
  "L2 us a tile"))
for _, layout in ipairs(layouts) do
  for _, len in ipairs(lens) do
    local case = AB.case { kind = "dense", layout = layout, b = b, s_q = 1, h_q = h_q, len = len }
    local nbk = (len + case.block_size - 1) // case.block_size
    if npages > case.cache.num_blocks then
      error(string.format("bench/attn_l2_resident.lua: --pages %d exceeds the case's %d pages", npages, case.cache.num_blocks), 0)
    end
    -- request r's block j reads page (7 j + r) mod npages: every page of the small set, spread
    -- over the requests so that concurrent CTAs do not all read one page
    local bt = {}
    for r = 1, b do
      local row = {}
      for j = 1, nbk + 1 do row[j] = j <= nbk and (7 * j + r) % npages or C.GARBAGE end
      bt[r] = row
    end
    local t, variant = {}, "?"
    for _, where in ipairs { "DRAM", "L2" } do
      local a = C.args(case, { impl = "baked", check = false })
      if where == "L2" then a.block_table = mla.tensor(bt, "i32", case.q.device) end
      local prepared = A.prepare(a)
      local plan = core.attn_decode(prepared)
      variant = plan.variant or variant
      local r = mla.bench(function() core.attn_decode(prepared) end,
        { name = where, mode = "hot", min_time = math.min(0.2, max_time), max_time = max_time, reference = false })
      t[where] = r.median * 1e6
    end
    print(string.format("%-14s %-6d %-10s %7.1f us %7.1f us %8.3f %9.3f us", layout, len, variant, t.DRAM, t.L2,
      t.L2 / t.DRAM, t.L2 / ((len + TILE - 1) // TILE)))
    case = nil
    collectgarbage("collect")
    core.empty_cache(mla.device())
  end
end
