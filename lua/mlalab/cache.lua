--- Paged KV caches for a layout, one page per (layer, block), and the checks
-- every cache kernel needs: neighbours poisoned, bleed located.
--
--   local c = mla.cache.new{ layout = "fp8_v4", num_blocks = 8, block_size = 64, num_layers = 61,
--                            order = "block_major", page_pad = 576, device = "cuda" }
--   c:layer(3)            -- u8 [num_blocks, page_bytes] view: inflated page stride, storage offset
--   c:view(3)             -- what a kernel receives: { pages, desc, tensor_scale, block_size, layout }
--   c:write(3, x, slots)  -- quantize rows into slots (CPU reference; bf16 rows on a GPU: baked kernel)
--   c:read(3, slots)      -- dequantized f32 [n, dim]
--   c:poison(3, "random") -- every byte outside layer 3 (random / "nan" = 0xff / "zeros" / a byte)
--   c:check_bleed(3, {slots = slots}) -- nil, or the first corrupted byte as (layer, block, token, field)
--
-- Orders: "layer_major" = one buffer per layer, [num_blocks, page_stride]
-- each; "block_major" = one buffer [num_blocks, num_layers, page_stride]
-- (vLLM's cross-layer (1,0,2,3) order), so a layer's page stride is
-- num_layers x page_stride and layer i starts at byte i x page_stride.
-- Layers, blocks, tokens and slots count from 0, like tensor indices.
local core = require "mlalab.core"
local layout = require "mlalab.layout"
local layout_ref = require "mlalab.layout_ref"

local M = {}
local Cache = {}
Cache.__index = Cache
M.Cache = Cache

--- GPU hooks: dispatch.write(cache, layer, x, slots) and
-- dispatch.read(cache, layer, slots, opts) -> out replace the defaults for
-- caches on a GPU. Defaults: bf16 rows are written by the baked kernel
-- (mla.kernels.write, bit-identical to the reference); other rows, and every
-- read (exact f32), go through the CPU reference on a host copy of the layer.
M.dispatch = {}

local function int_opt(o, k, def, lo, hi)
  local v = o[k]
  if v == nil then v = def end
  local i = math.tointeger(v)
  if not i or (lo and i < lo) or (hi and i > hi) then
    error(string.format("cache.new: %s must be an integer >= %d%s, got %s", k, lo or 0,
      hi and string.format(" and <= %d", hi) or "", tostring(v)), 3)
  end
  return i
end

-- Bytes of memory the device has (nil when unknown): host RAM from
-- /proc/meminfo, a GPU's from its properties.
local function memory_of(dev)
  local d = dev or core.default_device()
  if d == "cpu" then
    local f = io.open("/proc/meminfo", "r")
    if not f then return nil end
    local kb = f:read("a"):match("MemTotal:%s*(%d+) kB")
    f:close()
    return kb and tonumber(kb) * 1024
  end
  local ok, props = pcall(core.device_props, d)
  return ok and props.total_mem or nil
end

local NEW_OPTIONS = { "layout", "num_blocks", "block_size", "num_layers", "order", "page_pad", "device", "tensor_scale" }

--- mla.cache.new{layout, num_blocks, block_size = 64, num_layers = 1,
--   order = "layer_major" | "block_major", page_pad = 0, device, tensor_scale = 1}
function M.new(o)
  if type(o) ~= "table" then error("cache.new: an options table is expected", 2) end
  require("mlalab.options").check("cache.new", o, NEW_OPTIONS)
  local L = layout.get(o.layout)
  local c = setmetatable({ layout = L }, Cache)
  c.num_blocks = int_opt(o, "num_blocks", nil, 1)
  c.block_size = int_opt(o, "block_size", 64, 1, 0x7fffffff) -- descriptors hold it in 32 bits
  c.num_layers = int_opt(o, "num_layers", 1, 1)
  c.page_pad = int_opt(o, "page_pad", 0, 0)
  c.order = o.order or "layer_major"
  if c.order ~= "layer_major" and c.order ~= "block_major" then
    error("cache.new: order must be \"layer_major\" or \"block_major\", got " .. tostring(c.order), 2)
  end
  c.page_bytes = L:page_bytes(c.block_size)
  c.page_stride = c.page_bytes + c.page_pad -- physical bytes per (layer, block)
  if c.page_stride % L.page_align ~= 0 then
    error(string.format("cache.new: page_pad %d makes pages of %d bytes, not a multiple of layout '%s' page_align %d",
      c.page_pad, c.page_stride, L.name, L.page_align), 2)
  end
  c.desc = L:packed(c.block_size)
  -- the whole cache against the device's memory before any buffer exists
  -- (layer-major buffers are allocated one by one, each of which might fit)
  local total, mem = c.num_layers * 1.0 * c.num_blocks * c.page_stride, memory_of(o.device)
  if mem and total > mem then
    error(string.format("cache.new: %d layers x %d blocks x %d bytes a page = %.4g bytes, more than the %.4g bytes of %s memory",
      c.num_layers, c.num_blocks, c.page_stride, total, mem, o.device or core.default_device()), 2)
  end
  c.device = o.device
  if c.order == "layer_major" then
    c.buffers = {}
    for i = 1, c.num_layers do c.buffers[i] = core.empty({ c.num_blocks, c.page_stride }, { dtype = "u8", device = o.device }) end
  else
    c.buffers = { core.empty({ c.num_blocks, c.num_layers, c.page_stride }, { dtype = "u8", device = o.device }) }
  end
  c.device = c.buffers[1].device
  c.views = {}
  for i = 0, c.num_layers - 1 do
    local v = c.order == "layer_major" and c.buffers[i + 1] or c.buffers[1]:select(1, i)
    c.views[i + 1] = v:narrow(1, 0, c.page_bytes)
  end
  if layout.has_tensor_scale(L) then
    local s = o.tensor_scale or 1
    c.scales = core.full({ c.num_layers }, s, { dtype = "f32", device = c.device })
  end
  return c
end

function Cache:_check_layer(i, fn)
  local li = math.tointeger(i)
  if not li or li < 0 or li >= self.num_layers then
    error(string.format("cache:%s: layer %s is not in [0, %d)", fn, tostring(i), self.num_layers), 3)
  end
  return li
end

--- Layer i's pages: u8 [num_blocks, page_bytes], page stride from the order.
function Cache:layer(i) return self.views[self:_check_layer(i, "layer") + 1] end

--- Layer i's per-tensor scale (f32 [1] on the cache's device), or nil.
function Cache:tensor_scale(i)
  i = self:_check_layer(i, "tensor_scale")
  return self.scales and self.scales:narrow(0, i, 1) or nil
end

--- Everything a kernel receives for layer i.
function Cache:view(i)
  i = self:_check_layer(i, "view")
  return { pages = self.views[i + 1], desc = self.desc, tensor_scale = self:tensor_scale(i), block_size = self.block_size,
    layout = self.layout, layer = i }
end

--- c:num_slots() -> slots a layer holds (num_blocks x block_size): slot ids run 0 .. num_slots - 1.
function Cache:num_slots() return self.num_blocks * self.block_size end

--- Quantize rows of x into slots of layer i (slot < 0 skipped).
function Cache:write(i, x, slots)
  i = self:_check_layer(i, "write")
  local pages = self.views[i + 1]
  if pages:is_cuda() then
    if M.dispatch.write then return M.dispatch.write(self, i, x, slots) end
    if core.is_tensor(x) and x:get_dtype() == "bf16" then -- the baked kernel: same bytes as the reference
      return require("mlalab.kernels").write(self:view(i), slots:to(self.device), x:to(self.device))
    end
    local host = pages:to("cpu") -- read-modify-write on a host copy
    layout_ref.write(self.layout, host, x, slots, { block_size = self.block_size, tensor_scale = self:_host_scale(i) })
    pages:copy(host)
    return
  end
  layout_ref.write(self.layout, pages, x, slots, { block_size = self.block_size, tensor_scale = self:tensor_scale(i) })
end

--- Dequantized rows f32 [n, cols or dim] of layer i's slots (CPU tensor
-- from the reference; negative slots give zero rows).
function Cache:read(i, slots, opts)
  i = self:_check_layer(i, "read")
  opts = opts or {}
  local pages = self.views[i + 1]
  if pages:is_cuda() then
    if M.dispatch.read then return M.dispatch.read(self, i, slots, opts) end
    pages = pages:to("cpu")
    return layout_ref.read(self.layout, pages, slots, { block_size = self.block_size, cols = opts.cols, tensor_scale = self:_host_scale(i) })
  end
  return layout_ref.read(self.layout, pages, slots, { block_size = self.block_size, cols = opts.cols, tensor_scale = self:tensor_scale(i) })
end

function Cache:_host_scale(i)
  local s = self:tensor_scale(i)
  return s and s:to("cpu") or nil
end

-- Poison and bleed ----------------------------------------------------------

-- Views covering every byte outside layer i's pages [0, page_bytes).
function Cache:_outside(i)
  local out = {}
  for j = 0, self.num_layers - 1 do
    local whole = self.order == "layer_major" and self.buffers[j + 1] or self.buffers[1]:select(1, j)
    if j ~= i then out[#out + 1] = whole
    elseif self.page_pad > 0 then out[#out + 1] = whole:narrow(1, self.page_bytes, self.page_pad) end
  end
  return out
end

--- Fills every byte outside layer i: "random" (seeded bits, so stray reads
-- decode to garbage or NaN), "nan" (0xff: every fp8, ue8m0, bf16 and f32
-- code is NaN), "zeros", or a byte value; then snapshots the whole cache so
-- check_bleed can compare. Returns self.
function Cache:poison(i, pattern, seed)
  i = self:_check_layer(i, "poison")
  pattern = pattern or "random"
  for _, v in ipairs(self:_outside(i)) do
    if pattern == "random" then v:random_("bits", seed or require("mlalab").next_seed())
    elseif pattern == "nan" then v:fill(255)
    elseif pattern == "zeros" then v:fill(0)
    elseif math.tointeger(pattern) and pattern >= 0 and pattern <= 255 then v:fill(pattern)
    else error("cache:poison: pattern must be \"random\", \"nan\", \"zeros\" or a byte value, got " .. tostring(pattern), 2) end
  end
  self:snapshot()
  return self
end

--- Remembers every byte of the cache (check_bleed compares against it).
function Cache:snapshot()
  self._snap = {}
  for k, b in ipairs(self.buffers) do self._snap[k] = core.tensor_bytes(b) end
  return self
end

-- Storage byte of buffer k -> (layer, block, byte in the page).
function Cache:_where(k, off)
  if self.order == "layer_major" then return k - 1, off // self.page_stride, off % self.page_stride end
  local per_block = self.num_layers * self.page_stride
  return (off % per_block) // self.page_stride, off // per_block, off % self.page_stride
end

--- What byte `off` of buffer k holds: { layer, block, token, region, field, kind, elem, page_byte }.
function Cache:locate(k, off)
  local layer, block, pb = self:_where(k, off)
  local r = { layer = layer, block = block, page_byte = pb, byte = off, buffer = k }
  if pb >= self.page_bytes then
    r.field, r.kind = "(stride padding)", "padding"
    return r
  end
  local at = self.layout:locate(pb, self.block_size)
  if at.padding then
    r.field, r.kind = "(page padding)", "padding"
    return r
  end
  r.token, r.region, r.field, r.kind, r.elem = at.token, at.region, at.item, at.kind, at.elem
  return r
end

-- Byte ranges [lo, hi) of buffer k's page (layer i, block b) that a write to
-- `allowed` tokens (set of token ids, or true for the whole page) may change.
function Cache:_allowed_ranges(page_base, allowed)
  if allowed == true then return { { page_base, page_base + self.page_bytes } } end
  local offs = self.layout:page_geometry(self.block_size)
  local rs = {}
  for ri, reg in ipairs(self.layout.regions) do
    for t in pairs(allowed) do
      if reg.chunk then -- a chunked region: the token's piece in each run of pieces
        for j = 0, reg.row_bytes // reg.chunk - 1 do
          local lo = page_base + offs[ri] + (j * self.block_size + t) * reg.chunk
          rs[#rs + 1] = { lo, lo + reg.chunk }
        end
      else
        local lo = page_base + offs[ri] + t * reg.row_bytes
        rs[#rs + 1] = { lo, lo + reg.row_bytes }
      end
    end
  end
  table.sort(rs, function(a, b) return a[1] < b[1] end)
  return rs
end

-- First differing byte of a and b in [lo, hi) (0-based), or nil.
local function first_diff(a, b, lo, hi)
  if lo >= hi or a:sub(lo + 1, hi) == b:sub(lo + 1, hi) then return nil end
  local step = 4096
  for s = lo, hi - 1, step do
    local e = math.min(s + step, hi)
    if a:sub(s + 1, e) ~= b:sub(s + 1, e) then
      for p = s + 1, e do
        if a:byte(p) ~= b:byte(p) then return p - 1 end
      end
    end
  end
  return nil
end

--- Compares the cache with the last snapshot (poison or snapshot). Bytes of
-- layer i's pages may differ (only the rows of opts.slots when given);
-- nothing else may. Returns nil when clean, else a report of the first
-- corrupted byte: { layer, block, token, region, field, kind, elem, byte,
-- expected, got, message }.
function Cache:check_bleed(i, opts)
  i = self:_check_layer(i, "check_bleed")
  opts = opts or {}
  if not self._snap then error("cache:check_bleed: no snapshot; call cache:poison or cache:snapshot first", 2) end
  local tokens -- block -> set of tokens allowed to change, or nil for whole pages
  if opts.slots then
    tokens = {}
    local s = opts.slots
    if core.is_tensor(s) then s = s:to("cpu"):totable() end
    for _, v in ipairs(s) do
      if v >= 0 then
        local b, t = v // self.block_size, v % self.block_size
        tokens[b] = tokens[b] or {}
        tokens[b][t] = true
      end
    end
  end
  for k, b in ipairs(self.buffers) do
    local now, before = core.tensor_bytes(b), self._snap[k]
    if now ~= before then
      -- walk the pages that belong to layer i in this buffer, skipping allowed ranges
      local holes = {}
      for blk = 0, self.num_blocks - 1 do
        local base
        if self.order == "layer_major" then base = (k - 1 == i) and blk * self.page_stride or nil
        else base = (blk * self.num_layers + i) * self.page_stride end
        if base then
          local allowed = tokens == nil and true or tokens[blk]
          if allowed then
            for _, r in ipairs(self:_allowed_ranges(base, allowed)) do holes[#holes + 1] = r end
          end
        end
      end
      table.sort(holes, function(x, y) return x[1] < y[1] end)
      local pos = 0
      holes[#holes + 1] = { #now, #now }
      for _, h in ipairs(holes) do
        local p = first_diff(now, before, pos, h[1])
        if p then
          local r = self:locate(k, p)
          r.expected, r.got = before:byte(p + 1), now:byte(p + 1)
          r.message = string.format("byte %d of %s: layer %d, block %d, %s%s: expected 0x%02x, got 0x%02x", p,
            self.order == "layer_major" and ("buffer " .. (k - 1)) or "the cache", r.layer, r.block,
            r.token and string.format("token %d, ", r.token) or "", r.field .. (r.elem and string.format(" [%d]", r.elem) or ""),
            r.expected, r.got)
          return r
        end
        pos = math.max(pos, h[2])
      end
    end
  end
  return nil
end

function Cache:__tostring()
  return string.format("cache(%s, %d layers x %d blocks x %d tokens, %s, page %d B + %d pad, %s)", self.layout.name,
    self.num_layers, self.num_blocks, self.block_size, self.order, self.page_bytes, self.page_pad, self.device)
end

return M
