--- KV-cache kernels, one entry per operation. Each runs the CPU reference
-- (src/ref/kv_ref.c) when the cache lives on the CPU and the baked kernel
-- (src/kernels/kv_*.cu) when it lives on a GPU; both have the same
-- semantics, bit for bit. Semantics of every index:
-- ../shared/reference/kernels-and-indices.md, C contracts: src/kv.h.
--
-- A cache argument is a table
--   { layout = L | "name" | descriptor table | packed string,
--     pages = u8 tensor [pages, page_bytes] or [pages, block_size, row],
--     tensor_scale = f32 tensor of 1 element | number (per-tensor formats),
--     block_size = n (needed with [pages, page_bytes] and a layout object) }
-- or anything with those fields, e.g. cache:view(i) of mla.cache (its packed
-- `desc` is used when present). Page and
-- token strides come from the pages tensor: a per-layer view carved from a
-- cross-layer cache works as is.
--
-- GPU calls never synchronize, except that out-of-range indices (skipped by
-- the kernels) are checked after each call unless opts.check == false; pass
-- check = false inside timed or graph-captured code and call
-- kernels.check(device) afterwards.
local mla = require "mlalab"
local core = mla.core

local M = {}

local options = require "mlalab.options"

-- A Lua error naming the operation, raised at its caller.
local function fail(fn, fmt, ...) error(fn .. ": " .. string.format(fmt, ...), 3) end
-- Every option some operation reads (several share the readers of out, ncols,
-- the request mapping...); write and requant take only `check`.
local OPTION_NAMES = { "out", "ncols", "remap", "check", "q_lens", "cu_q", "token_req", "pages", "count", "seq_starts",
  "num_rows", "fill", "lens", "dtype" }
local CHECK_ONLY = { "check" }

local function opts_table(fn, opts, names)
  if opts == nil then return {} end
  if type(opts) ~= "table" then fail(fn, "opts must be a table, got %s", type(opts)) end
  options.check(fn, opts, names or OPTION_NAMES, 3)
  return opts
end

-- A packed mla_layout_desc always holds zero bytes; layout names never do.
local function is_packed(s) return type(s) == "string" and s:find("\0", 1, true) ~= nil end

-- The block size of a cache table: explicit, from a 3-dim pages tensor, or from a packed descriptor.
local function block_size_of(fn, c)
  if c.block_size then return c.block_size end
  local p = c.pages
  if p:dim() == 3 then return p:size(1) end
  if is_packed(c.layout) then return core.layout_unpack(c.layout).block_size end
  if type(c.layout) == "table" and c.layout.block_size and not mla.layout.is_layout(c.layout) then return c.layout.block_size end
  fail(fn, "pages is [pages, page_bytes]: give block_size in the cache table")
end

local function packed_of(fn, c)
  local l = c.desc or c.layout
  if l == nil then fail(fn, "the cache table has no layout") end
  if is_packed(l) then return l end
  if type(l) == "string" or mla.layout.is_layout(l) then
    local ok, L = pcall(mla.layout.get, l)
    if not ok then fail(fn, "%s", tostring(L):gsub("^[^:]*:%d+: ", "")) end -- the caller's name before layout.get's message
    return L:packed(block_size_of(fn, c))
  end
  if type(l) == "table" then
    local d = l
    if not d.block_size then
      d = {}
      for k, v in pairs(l) do d[k] = v end
      d.block_size = block_size_of(fn, c)
    end
    return core.layout_pack(d)
  end
  fail(fn, "layout must be a layout, a layout name, a descriptor table or a packed descriptor, got %s", type(l))
end

local function scale_of(c, dev)
  local s = c.tensor_scale
  if type(s) == "number" then return mla.full({ 1 }, s, "f32", dev) end
  return s
end

--- The core arguments of a cache table: packed descriptor, pages, tensor scale.
function M.cache_args(c, fn)
  fn = fn or "cache_args"
  if type(c) ~= "table" and type(c) ~= "userdata" then fail(fn, "a cache table {layout =, pages =} expected, got %s", type(c)) end
  if not mla.is_tensor(c.pages) then fail(fn, "the cache's pages must be a u8 tensor, got %s", type(c.pages)) end
  return packed_of(fn, c), c.pages, scale_of(c, c.pages.device)
end

local function dim_of(desc) return core.layout_unpack(desc).dim end

--- Raises if kernels on `device` skipped out-of-range indices since the last check.
function M.check(device)
  if device == nil or device == "cpu" then return end
  local n = core.kv_take_bad(device)
  if n > 0 then
    error(string.format("kernels: %d out-of-range indices were skipped on %s (a slot past the cache, a block-table "
      .. "column past its row, a page outside the cache, or a result that does not fit the index type)", n, device), 2)
  end
end

local function after(opts, dev)
  if dev ~= "cpu" and (opts == nil or opts.check ~= false) then M.check(dev) end
end

local function need_tensor(fn, v, name, what)
  if not mla.is_tensor(v) then fail(fn, "%s must be %s, got %s", name, what, type(v)) end
  return v
end

local function idx_tensor(fn, v, name, dev, required)
  if v == nil and not required then return nil end
  if mla.is_tensor(v) then return v end
  if type(v) == "table" then return mla.tensor(v, "i32", dev) end
  fail(fn, "%s must be an index tensor or a list of integers, got %s", name, type(v))
end

--- Compile-time-specialized variants: kernels for the built-in layouts'
-- descriptors (kernels_rtc/include/mla/builtin_layouts.h) serve any cache
-- whose descriptor equals one of them. specialize(false) forces the generic
-- kernels (returns the previous setting); last_variant() names what the last
-- CUDA launch ran ("generic" or the built-in layout's name).
function M.specialize(on) return core.kv_specialize(on) end
--- last_variant() -> what the last CUDA launch ran: "generic" or a built-in layout's name.
function M.last_variant() return core.kv_last_variant() end

--- write(cache, slot_mapping, rows [, rope], opts): quantize-and-cache.
-- rows: bf16 [>= T, dim], or k_nope [>= T, a] with rope = k_rope [>= T, dim - a].
-- T = slot_mapping:size(0); slots < 0 are skipped.
function M.write(c, slot_mapping, rows, rope, opts)
  if rope ~= nil and not mla.is_tensor(rope) then rope, opts = nil, rope end
  opts = opts_table("write", opts, CHECK_ONLY)
  local desc, pages, scale = M.cache_args(c, "write")
  local dev = pages.device
  slot_mapping = idx_tensor("write", slot_mapping, "slot_mapping", dev, true)
  need_tensor("write", rows, "rows", "a bf16 tensor [T, dim] (or k_nope with rope = k_rope)")
  core.kv_write(desc, pages, scale, slot_mapping, rows, rope)
  after(opts, dev)
end

local function out_rows(fn, opts, n, desc, dev)
  if opts and opts.out then return opts.out end
  local dim = dim_of(desc)
  local cols = opts and opts.ncols or dim
  -- checked before the allocation, which a wrong value could make enormous (the core checks out's shape again)
  if math.type(cols) ~= "integer" or cols < 8 or cols > dim then
    fail(fn, "ncols = %s must be an integer from 8 to the layout's %d dims", tostring(cols), dim)
  end
  local o = mla.empty({ n, cols }, "bf16", dev)
  if not (opts and opts.fill == false) then o:fill(0) end
  return o
end

--- gather_sparse(cache, slots, opts) -> out [N, ncols] bf16 (, remap).
-- Row i <- slot slots[i]; slots[i] < 0: no load and no store (row keeps its
-- contents: zeros unless opts.out or fill = false). opts: out, ncols,
-- remap = true (or an index tensor): remap[i] = slots[i] >= 0 ? i : -1.
function M.gather_sparse(c, slots, opts)
  opts = opts_table("gather_sparse", opts)
  local desc, pages, scale = M.cache_args(c, "gather_sparse")
  local dev = pages.device
  slots = idx_tensor("gather_sparse", slots, "slots", dev, true)
  if opts.out ~= nil then need_tensor("gather_sparse", opts.out, "opts.out", "a bf16 tensor [N, ncols]") end
  if slots:dim() ~= 1 then slots = slots:reshape({ slots:numel() }) end
  local out = out_rows("gather_sparse", opts, slots:size(0), desc, dev)
  local remap = opts.remap
  if remap == true then remap = mla.empty({ slots:size(0) }, slots.dtype, dev) end
  core.kv_gather_sparse(desc, pages, scale, slots, out, remap or nil)
  after(opts, dev)
  if remap then return out, remap end
  return out
end

-- The rows of a gather's output: opts.num_rows (an upper bound the caller
-- chose), or cu_seq_lens[B], which can be no more than the block table holds.
-- Checked here, before the output is allocated (a wrong total could make it
-- enormous); the core checks each request's rows again.
local function total_rows(fn, cu, bt, desc, opts)
  local n = opts.num_rows
  if n ~= nil then
    if math.type(n) ~= "integer" or n < 0 then fail(fn, "num_rows = %s must be a row count (an integer >= 0)", tostring(n)) end
    return n
  end
  if not mla.is_tensor(cu) or cu:dim() ~= 1 or cu:numel() == 0 then fail(fn, "cu_seq_lens must be a 1-dim index tensor of B + 1 entries") end
  if not mla.is_tensor(bt) or bt:dim() ~= 2 then fail(fn, "block_table must be a 2-dim index tensor [B, max_blocks]") end
  n = math.tointeger(cu:get({ cu:numel() - 1 })) -- reads the device (a sync); pass num_rows to avoid it
  local cap = bt:size(0) * bt:size(1) * core.layout_unpack(desc).block_size
  if not n or n < 0 or n > cap then
    fail(fn, "cu_seq_lens[B] = %s must be a row count from 0 to the %d tokens the block table holds", tostring(n), cap)
  end
  return n
end

--- gather_dense(cache, block_table, cu_seq_lens, opts) -> out [rows, ncols] bf16.
-- Request r, i < cu[r+1] - cu[r]: p = seq_starts[r] + i, out[cu[r] + i] <- block_table[r, p / bs], p % bs.
-- opts: seq_starts, out, num_rows (an upper bound: rows past cu[B] are untouched), ncols.
function M.gather_dense(c, block_table, cu_seq_lens, opts)
  opts = opts_table("gather_dense", opts)
  local desc, pages, scale = M.cache_args(c, "gather_dense")
  local dev = pages.device
  local cu = idx_tensor("gather_dense", cu_seq_lens, "cu_seq_lens", dev)
  local bt = idx_tensor("gather_dense", block_table, "block_table", dev)
  local out = opts.out
    or out_rows("gather_dense", opts, total_rows("gather_dense", cu, bt, desc, opts), desc, dev)
  core.kv_gather_dense(desc, pages, scale, bt, cu, idx_tensor("gather_dense", opts.seq_starts, "seq_starts", dev), out)
  after(opts, dev)
  return out
end

--- gather_raw(cache, block_table, cu_seq_lens, opts) -> { u8 [rows, region row] per region }:
-- the stored bytes of each token (e.g. the indexer's fp8 keys and their
-- scales, as DeepGEMM reads them). opts: seq_starts, num_rows, out (a list).
function M.gather_raw(c, block_table, cu_seq_lens, opts)
  opts = opts_table("gather_raw", opts)
  local desc, pages, scale = M.cache_args(c, "gather_raw")
  local dev = pages.device
  local cu = idx_tensor("gather_raw", cu_seq_lens, "cu_seq_lens", dev)
  local bt = idx_tensor("gather_raw", block_table, "block_table", dev)
  local out = opts.out
  if not out then
    local d, n = core.layout_unpack(desc), total_rows("gather_raw", cu, bt, desc, opts)
    out = {}
    for r = 1, d.nregions do out[r] = mla.zeros({ n, d.region_row_bytes[r] }, "u8", dev) end
  end
  core.kv_gather_raw(desc, pages, scale, bt, cu,
    idx_tensor("gather_raw", opts.seq_starts, "seq_starts", dev), out)
  after(opts, dev)
  return out
end

--- requant(src_cache, dst_cache): repacks every page of src into dst, e.g.
-- fp8_pertensor (576 B) -> fp8_ds_mla (656 B): codes copied, f32 group
-- scales = the tensor scale, unscaled bf16 dims = bf16(decode * tensor scale).
-- Lossless; the pairing of the two layouts is checked dim by dim.
function M.requant(src, dst, opts)
  opts = opts_table("requant", opts, CHECK_ONLY)
  local sd, sp, ss = M.cache_args(src, "requant")
  local dd, dp = M.cache_args(dst, "requant")
  core.kv_requant(sd, sp, ss, dd, dp)
  after(opts, sp.device)
end

--- compact(cache, indices, opts) -> rows, remap, pages [, count]: dequantizes
-- only the pages that indices >= 0 refer to (rows = bf16 [#pages * bs, ncols],
-- pages ascending), and renumbers indices into those rows (-1 kept).
-- Two designs (vLLM #42248's compaction):
--  * exact outputs (no opts.out): shapes depend on index values, so the page
--    count is read back (a host sync): not CUDA-graph safe.
--  * capacity mode (opts.out = bf16 [>= cap * bs, ncols]): no sync. opts.pages
--    (i64 [cap], allocated from out's rows if absent) sets the capacity;
--    opts.remap, opts.count (i64 [1]) are optional. The list holds -1 past the
--    count, rows past it are untouched; count is the true number of pages.
--    opts.check ~= false reads count back and raises when it exceeds the
--    capacity (and on out-of-range indices); with check = false nothing syncs
--    (kernels.check(device) and count:item() later).
function M.compact(c, indices, opts)
  opts = opts_table("compact", opts)
  local desc, pages, scale = M.cache_args(c, "compact")
  local dev = pages.device
  local idx = idx_tensor("compact", indices, "indices", dev, true)
  if opts.out == nil then
    if opts.pages or opts.remap or opts.count then
      fail("compact", "pages, remap and count outputs need out (the rows buffer of the capacity mode)")
    end
    return core.kv_compact(desc, pages, scale, idx, opts.ncols)
  end
  local out = opts.out
  if not mla.is_tensor(out) or out:dim() ~= 2 then fail("compact", "out must be a bf16 tensor [rows, ncols]") end
  if opts.ncols and opts.ncols ~= out:size(1) then
    fail("compact", "ncols = %d but out has %d columns", opts.ncols, out:size(1))
  end
  local bs = core.layout_unpack(desc).block_size
  local pg = opts.pages or mla.empty({ out:size(0) // bs }, "i64", dev)
  local remap = opts.remap or mla.empty(idx:size(), idx.dtype, dev)
  local count = opts.count or mla.empty({ 1 }, "i64", dev)
  core.kv_compact_into(desc, pages, scale, idx, out, remap, pg, count)
  if opts.check ~= false then
    M.check(dev)
    local n, cap = math.tointeger(count:item()), pg:numel()
    if n > cap then
      fail("compact", "indices refer to %d pages but the capacity is %d (pages has %d entries; out holds %d rows of "
        .. "block size %d): the outputs hold only the first %d", n, cap, cap, out:size(0), bs, cap)
    end
  end
  return out, remap, pg, count
end

--- gather_referenced(cache, indices, opts) -> rows [indices:numel(), ncols], remap:
-- the CUDA-graph-safe fallback (vLLM #42576's design): one row per index
-- (duplicates dequantized twice), remap = index >= 0 ? its position : -1, with
-- the shape of indices. Shapes depend only on indices' shape.
function M.gather_referenced(c, indices, opts)
  opts = opts_table("gather_referenced", opts)
  indices = idx_tensor("gather_referenced", indices, "indices",
    type(c) == "table" and mla.is_tensor(c.pages) and c.pages.device or "cpu", true)
  local flat = indices:reshape({ indices:numel() })
  local o = { out = opts.out, ncols = opts.ncols, remap = opts.remap or true, check = opts.check, fill = opts.fill }
  local rows, remap = M.gather_sparse(c, flat, o)
  return rows, remap:reshape(indices:size())
end

-- Request of each query token: token_req, cu_q, or q_lens (a list on the host).
local function req_args(fn, opts, dev)
  local tr, cq = opts.token_req, opts.cu_q
  if opts.q_lens then
    if cq then fail(fn, "give cu_q or q_lens, not both") end
    local cu, s = { 0 }, 0
    for i, n in ipairs(opts.q_lens) do s = s + n cu[i + 1] = s end
    cq = cu
  end
  return idx_tensor(fn, tr, "token_req", dev), idx_tensor(fn, cq, "cu_q", dev)
end

local function topk_outs(topk, opts)
  local out = opts.out or mla.empty(topk:size(), opts.dtype or "i32", topk.device)
  local lens = opts.lens
  if lens == true then lens = mla.empty({ topk:size(0) }, "i32", topk.device) end
  return out, lens or nil
end

--- topk_paged(topk, block_table, block_size, opts) -> out (, lens): request-local
-- top-k positions -> physical slot ids, -1 kept: block_table[r, p / bs] * bs + p % bs.
-- Row t belongs to request opts.token_req[t], or by opts.cu_q / opts.q_lens
-- (prefill: each query token of a request), or r = t (decode). opts: out,
-- dtype ("i32"), lens = true (number of entries >= 0 per row).
function M.topk_paged(topk, block_table, block_size, opts)
  opts = opts_table("topk_paged", opts)
  topk = idx_tensor("topk_paged", topk, "topk", "cpu", true)
  if math.type(block_size) ~= "integer" or block_size < 1 or block_size > 0x7fffffff then
    fail("topk_paged", "block_size must be an integer in [1, 2^31 - 1], got %s", tostring(block_size))
  end
  local dev = topk.device
  local tr, cq = req_args("topk_paged", opts, dev)
  local out, lens = topk_outs(topk, opts)
  core.kv_topk_paged(topk, idx_tensor("topk_paged", block_table, "block_table", dev), block_size, tr, cq, out, lens)
  after(opts, dev)
  if lens then return out, lens end
  return out
end

--- topk_ragged(topk, cu_k, opts) -> out (, lens): positions -> rows of K
-- concatenated over requests (idx + cu_k[r], -1 kept). Options as topk_paged.
function M.topk_ragged(topk, cu_k, opts)
  opts = opts_table("topk_ragged", opts)
  topk = idx_tensor("topk_ragged", topk, "topk", "cpu", true)
  local dev = topk.device
  local tr, cq = req_args("topk_ragged", opts, dev)
  local out, lens = topk_outs(topk, opts)
  core.kv_topk_ragged(topk, idx_tensor("topk_ragged", cu_k, "cu_k", dev), tr, cq, out, lens)
  after(opts, dev)
  if lens then return out, lens end
  return out
end

return M
