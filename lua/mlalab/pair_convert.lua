--- What a backend reads, made from the stored pool: the conversions of
-- mla.backend executed with the KV kernels (mla.kernels), into buffers
-- allocated once so the same closure can be run for the check and timed.
--
--   local input = convert.prepare(scn, phase_resolution)
--   input.run(check)   -- performs the conversion (nothing for a native read)
--   input.cache        -- the cache table the backend's attention reads
--   input.rows         -- cache tokens the conversion reads
--
-- Conversions keep the pool's page geometry (same pages, same block size), so
-- PAGED slot ids address the converted pool too; dequant_ragged makes flat
-- bf16 rows of the requests' tokens (RAGGED: position + request offset).
-- A researcher's conversion may carry its own `prepare(scn, phase, stored_view, conversion)`.
local mla = require "mlalab"
local K = require "mlalab.kernels"

local M = {}

local function fail(fmt, ...) error("pair: " .. string.format(fmt, ...), 0) end

--- bf16 rows of a bf16 pool as a page-size-1 cache (what a flat_bf16 backend
-- reads when the pool is bf16: slot ids are its rows).
function M.flat_view(view)
  local L = mla.layout.get(view.layout)
  if L.name ~= "bf16" then fail("a flat bf16 read of a %s pool needs a conversion", L.name) end
  local p = view.pages
  local row = L:page_bytes(1)
  if p:stride(1) ~= 1 or p:stride(0) ~= view.block_size * row then
    fail("flat rows need packed pages (page stride %d B, %d x %d B expected)", p:stride(0), view.block_size, row)
  end
  return { pages = p:reshape({ p:size(0) * view.block_size, row }), layout = L, block_size = 1 }
end

-- A cache of layout `name` with the stored pool's geometry.
local function like(scn, name)
  return mla.cache.new { layout = name, num_blocks = scn.num_blocks, block_size = scn.block_size, device = scn.device }
end

local builtin = {}

-- fp8_pertensor 576 B -> fp8_ds_mla 656 B, the whole pool (sglang #21011's repack).
function builtin.requant(scn, _, stored)
  local dst = like(scn, "fp8_ds_mla")
  local v = dst:view(0)
  return { cache = v, rows = scn.pool_tokens, run = function(check) K.requant(stored, v, { check = check }) end }
end

-- bf16 pool -> fp8_ds_mla: dequant-free gather of every slot, then quantize-and-cache.
function builtin.quantize(scn, _, stored)
  local dst = like(scn, "fp8_ds_mla")
  local v = dst:view(0)
  local all = mla.arange(scn.pool_tokens, "i32", scn.device)
  local tmp = mla.empty({ scn.pool_tokens, stored.layout.dim }, "bf16", scn.device)
  return {
    cache = v, rows = scn.pool_tokens,
    run = function(check)
      K.gather_sparse(stored, all, { out = tmp, check = check })
      K.write(v, all, tmp, { check = check })
    end,
  }
end

-- fp8_ds_mla <-> fp8_ds_mla_blocked, the whole pool: requant's relayout moves codes and scale bits unchanged.
function builtin.relayout(scn, _, stored, conv)
  local dst = like(scn, conv.to)
  local v = dst:view(0)
  return { cache = v, rows = scn.pool_tokens, run = function(check) K.requant(stored, v, { check = check }) end }
end

-- any pool -> bf16 pages: every slot dequantized straight into the bf16 pool's rows.
function builtin.dequant_pool(scn, _, stored)
  local dst = like(scn, "bf16")
  local v = dst:view(0)
  local rows = v.pages:view("bf16"):reshape({ scn.pool_tokens, 576 })
  local all = mla.arange(scn.pool_tokens, "i32", scn.device)
  return { cache = v, rows = scn.pool_tokens,
    run = function(check) K.gather_sparse(stored, all, { out = rows, check = check }) end }
end

-- the requests' tokens -> ragged bf16 rows [sum of lengths, 576] (dense gather-dequant).
function builtin.dequant_ragged(scn, phase, stored)
  local cu = scn:cu_k(phase)
  local n = cu[#cu]
  local out = mla.empty({ n, stored.layout.dim }, "bf16", scn.device)
  local cut = mla.tensor(cu, "i32", scn.device)
  return {
    cache = { pages = out:view("u8"), layout = mla.layout.get("bf16"), block_size = 1 }, rows = n, cu_k = cu,
    run = function(check) K.gather_dense(stored, scn.block_table, cut, { out = out, num_rows = n, check = check }) end,
  }
end
M.builtin = builtin

--- The input of one phase: the conversion prepared, or the stored pool
-- itself (flat rows for a flat_bf16 backend on a bf16 pool).
function M.prepare(scn, ph, phase)
  local stored = scn:view()
  local c = ph.conversion
  if not c then
    local cache = ph.backend.input == "flat_bf16" and M.flat_view(stored) or stored
    return { cache = cache, rows = 0, run = function() end }
  end
  local f = c.prepare or builtin[c.name]
  if not f then fail("conversion '%s' has no executor (give it prepare = function(scn, phase, stored, conversion))", c.name) end
  local input = f(scn, phase, stored, c)
  input.name = c.name
  return input
end

return M
