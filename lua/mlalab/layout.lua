--- Cache layouts as data. A layout is defined once, in a few lines of Lua,
-- and the same description drives the CPU reference (core.ref_write/read),
-- the baked kernels (the packed descriptor, L:packed(block_size)), the
-- constants of JIT kernels (mla.rtc.layout_header(L, block_size)) and the
-- checks (cache poisoning, bleed reports). Semantics of every number:
-- kernels_rtc/include/mla/layout_desc.h.
--
--   local L = mla.layout.define{
--     name = "fp8_ue8m0_64",
--     fields = {                                   -- the logical row, in dim order
--       { "nope", "e4m3", 512, scale = { dtype = "ue8m0", group = 64, policy = "pow2", eps = 1e-4 } },
--       { "rope", "bf16", 64 },
--     },
--     v_dims = 512,                                -- K = all dims unless k_dims says less; V a prefix of K
--   }
--
-- Fields: { name, dtype, count, scale = ... } (or keyed: name=, dtype=, count=).
--   scale = "tensor": one per-tensor f32 scale (a device scalar), q = x / s_t.
--   scale = { dtype = f32|ue8m0|e4m3|bf16, group = n, policy = "pow2"|"amax",
--             eps = 0, eps_on = "scale"|"amax", min = 0, max = 0, qmax = dtype's max }
-- Regions (optional): the page is split into regions, each one row per token,
--   laid out [block_size][row] one after the other. Default: one region
--   "token" holding each field followed by its inline scales.
--   regions = { { name = "data", row = { "nope", "rope" } },
--               { name = "scales", row = { "nope.scale", { pad = 1 } } } }
--   Row items: "field", "field.scale", { pad = n } (bytes writers zero),
--   { align = n } (zeroed padding up to a multiple of n), and any item as a
--   table { "field", at = byte } to pin its offset. A region may set
--   `bytes` (its row size), `align` (alignment of its start in the page) and
--   `chunk` (bytes): rows cut into pieces of that many bytes, stored
--   piece-major [row / chunk][block_size][chunk] (FlashMLA's page-blocked
--   V3.2 cache: NoPE [32][B][16 B], scales [4][B]); every 8-dim quantum and
--   every scale must then lie inside one piece.
-- token_align: token rows (and the view's base) must start at multiples of it
--   (default: the widest element). page_align: page strides are multiples of
--   it; the page is padded up to it (default: token_align).
local core = require "mlalab.core"
local map = require "mlalab.layout_map"

local M = {}
local Layout = {}
Layout.__index = Layout
M.Layout = Layout

local QMAX = { e4m3 = 448, e5m2 = 57344, e2m1 = 6, bf16 = 3.3895313892515355e38, f16 = 65504, f32 = 3.4028234663852886e38 }
local DATA_DTYPES = { f16 = true, bf16 = true, f32 = true, e4m3 = true, e5m2 = true, e2m1 = true }
local SCALE_DTYPES = { f32 = 4, ue8m0 = 1, e4m3 = 1, bf16 = 2 }
local QUANTUM = 8 -- kernels read 8 dims under one scale (layout_check.h)

local function dtype_of(name)
  if type(name) ~= "string" then return nil end
  local ok, info = pcall(core.dtype_info, name)
  if not ok then return nil end
  return info.name, info.bits
end

local function align_up(v, a) return (v + a - 1) // a * a end

local function copy(t)
  if type(t) ~= "table" then return t end
  local o = {}
  for k, v in pairs(t) do o[k] = copy(v) end
  return o
end

-- Errors name the layout and the field; `fail` never returns.
local function failer(name)
  return function(fmt, ...) error(string.format("layout '%s': " .. fmt, name, ...), 0) end
end

local function int_arg(v, fail, what, lo)
  local i = math.tointeger(v)
  if not i then fail("%s must be an integer, got %s", what, tostring(v)) end
  if lo and i < lo then fail("%s = %d must be >= %d", what, i, lo) end
  return i
end

-- Scale of a field, normalized (nil, "tensor" or a group table).
local function parse_scale(s, f, fail)
  if s == nil or s == "none" then return nil end
  if s == "tensor" then return { kind = "tensor" } end
  if type(s) ~= "table" then fail("field '%s': scale must be \"tensor\" or a table, got %s", f.name, tostring(s)) end
  local known = { dtype = 1, group = 1, policy = 1, eps = 1, eps_on = 1, min = 1, max = 1, qmax = 1, kind = 1 }
  for k in pairs(s) do
    if not known[k] then fail("field '%s': unknown scale option '%s'", f.name, tostring(k)) end
  end
  if s.kind == "tensor" then return { kind = "tensor" } end
  local g = { kind = "group" }
  local dt = dtype_of(s.dtype)
  if not dt or not SCALE_DTYPES[dt] then
    fail("field '%s': scale dtype %s is not one of f32, ue8m0, e4m3, bf16", f.name, tostring(s.dtype))
  end
  g.dtype, g.size = dt, SCALE_DTYPES[dt]
  g.group = int_arg(s.group, fail, string.format("field '%s': scale group", f.name), 1)
  if f.count % g.group ~= 0 then
    fail("field '%s': group %d does not divide the field's %d elements", f.name, g.group, f.count)
  end
  if g.group % QUANTUM ~= 0 then
    fail("field '%s': group %d is not a multiple of %d (kernels dequantize %d dims under one scale)", f.name, g.group,
      QUANTUM, QUANTUM)
  end
  g.count = f.count // g.group
  g.policy = s.policy or "pow2"
  if g.policy ~= "pow2" and g.policy ~= "amax" then
    fail("field '%s': scale policy '%s' is neither \"pow2\" nor \"amax\"", f.name, tostring(g.policy))
  end
  g.eps_on = s.eps_on or "scale"
  if g.eps_on ~= "scale" and g.eps_on ~= "amax" then
    fail("field '%s': eps_on '%s' is neither \"scale\" nor \"amax\"", f.name, tostring(g.eps_on))
  end
  local function num(v, what, positive)
    if v == nil then return 0 end
    if type(v) ~= "number" or v ~= v or v == math.huge or v < 0 or (positive and v == 0) then
      fail("field '%s': scale %s must be a finite %s number, got %s", f.name, what, positive and "positive" or "non-negative",
        tostring(v))
    end
    return v
  end
  g.eps, g.min, g.max = num(s.eps, "eps"), num(s.min, "min"), num(s.max, "max")
  if g.eps == 0 and g.min == 0 then
    fail("field '%s': a group scale needs eps > 0 or min > 0 (an all-zero group would get scale 0 and decode to NaN)", f.name)
  end
  if g.min > 0 and g.max > 0 and g.min > g.max then fail("field '%s': scale min %g is above max %g", f.name, g.min, g.max) end
  g.qmax = s.qmax ~= nil and num(s.qmax, "qmax", true) or QMAX[f.dtype]
  return g
end

local function parse_fields(spec, fail)
  if type(spec.fields) ~= "table" or #spec.fields == 0 then fail("fields must be a non-empty list") end
  local fields, by_name, dim = {}, {}, 0
  for i, e in ipairs(spec.fields) do
    if type(e) ~= "table" then fail("fields[%d] must be a table", i) end
    local f = { name = e.name or e[1], dtype = e.dtype or e[2], count = e.count or e[3] }
    if type(f.name) ~= "string" or not f.name:match("^[%a_][%w_]*$") then
      fail("fields[%d]: name must be an identifier, got %s", i, tostring(f.name))
    end
    if by_name[f.name] then fail("field '%s' is defined twice", f.name) end
    local dt, bits = dtype_of(f.dtype)
    if not dt or not DATA_DTYPES[dt] then
      fail("field '%s': dtype %s is not a stored value type (f16, bf16, f32, e4m3, e5m2, e2m1)", f.name, tostring(f.dtype))
    end
    f.dtype, f.bits = dt, bits
    f.count = int_arg(f.count, fail, string.format("field '%s': count", f.name), 1)
    if f.count % QUANTUM ~= 0 then
      fail("field '%s': count %d is not a multiple of %d (kernels read %d dims at a time)", f.name, f.count, QUANTUM, QUANTUM)
    end
    f.bytes = f.count * bits // 8
    f.align = math.max(1, bits // 8)
    f.dim_lo = dim
    dim = dim + f.count
    f.scale = parse_scale(e.scale, f, fail)
    fields[i], by_name[f.name] = f, f
  end
  return fields, by_name, dim
end

-- Row items of the default single region: every field, then its inline scales.
local function default_regions(fields)
  local row = {}
  for _, f in ipairs(fields) do
    row[#row + 1] = f.name
    if f.scale and f.scale.kind == "group" then row[#row + 1] = f.name .. ".scale" end
  end
  return { { name = "token", row = row } }
end

-- Lays out each region's row: items get byte offsets; returns regions.
local function place_regions(spec, by_name, fail)
  local regions, placed, npad = {}, {}, 0
  for ri, rs in ipairs(spec.regions) do
    if type(rs) ~= "table" or type(rs.row) ~= "table" then fail("regions[%d] must be a table with a row list", ri) end
    local r = { name = rs.name or ("region" .. (ri - 1)), index = ri - 1, items = {}, align = 1 }
    local pos = 0
    for ii, it in ipairs(rs.row) do
      local item = type(it) == "table" and it or { it }
      local key, at = item[1], item.at
      local entry
      if item.pad or item.align then
        local n = item.pad and int_arg(item.pad, fail, string.format("region '%s' pad", r.name), 1)
            or align_up(pos, int_arg(item.align, fail, string.format("region '%s' align", r.name), 1)) - pos
        if n > 0 then
          npad = npad + 1
          entry = { kind = "pad", name = "pad" .. npad, bytes = n, align = 1 }
        end
      elseif type(key) == "string" then
        local fname, sfx = key:match("^([%a_][%w_]*)%.(%a+)$")
        if fname then
          local f = by_name[fname]
          if not f then fail("region '%s': row item '%s' names no field", r.name, key) end
          if sfx ~= "scale" and sfx ~= "scales" then fail("region '%s': row item '%s': only '.scale' can follow a field name", r.name, key) end
          if not (f.scale and f.scale.kind == "group") then fail("region '%s': field '%s' has no group scales to place", r.name, fname) end
          entry = { kind = "scale", field = f, name = fname .. ".scale", bytes = f.scale.count * f.scale.size, align = f.scale.size }
        else
          local f = by_name[key]
          if not f then fail("region '%s': row item '%s' names no field", r.name, key) end
          entry = { kind = "data", field = f, name = key, bytes = f.bytes, align = f.align }
        end
        if placed[entry.name] then fail("%s is placed twice (regions '%s' and '%s')", entry.name, placed[entry.name], r.name) end
        placed[entry.name] = r.name
      else
        fail("region '%s': row item %d must be a field name, \"field.scale\", {pad = n} or {align = n}", r.name, ii)
      end
      if entry then
        entry.off = at and int_arg(at, fail, string.format("region '%s': offset of %s", r.name, entry.name), 0) or pos
        -- an explicit offset is checked (alignment, overlap) by layout_check; a derived one is aligned here
        if not at and entry.off % entry.align ~= 0 then
          fail("%s (%s) would start at byte %d of region '%s', not a multiple of its %d-byte alignment; add {align = %d} before it",
            entry.name, entry.kind == "scale" and entry.field.scale.dtype or entry.field and entry.field.dtype or "pad",
            entry.off, r.name, entry.align, entry.align)
        end
        r.items[#r.items + 1] = entry
        pos = math.max(pos, entry.off + entry.bytes)
        r.align = math.max(r.align, entry.align)
      end
    end
    r.row_bytes = rs.bytes and int_arg(rs.bytes, fail, string.format("region '%s' bytes", r.name), 1) or pos
    if r.row_bytes < pos then fail("region '%s': bytes = %d is less than its items' %d bytes", r.name, r.row_bytes, pos) end
    if r.row_bytes == 0 then fail("region '%s' holds nothing", r.name) end
    r.start_align = rs.align and int_arg(rs.align, fail, string.format("region '%s' align", r.name), 1) or r.align
    if rs.chunk ~= nil then
      r.chunk = int_arg(rs.chunk, fail, string.format("region '%s' chunk", r.name), 1)
      if r.chunk >= r.row_bytes or r.row_bytes % r.chunk ~= 0 then
        fail("region '%s': chunk = %d must divide its %d-byte row and be smaller than it", r.name, r.chunk, r.row_bytes)
      end
    end
    regions[ri] = r
  end
  for name, f in pairs(by_name) do
    if not placed[name] then fail("field '%s' is placed in no region row", name) end
    if f.scale and f.scale.kind == "group" and not placed[name .. ".scale"] then
      fail("field '%s': its scales are placed in no region row (add '%s.scale' to a row)", name, name)
    end
  end
  return regions, npad
end

--- Defines a layout from its description (see the header of this file).
function M.define(spec)
  if type(spec) ~= "table" then error("layout.define: a table describing the layout is expected", 2) end
  local name = spec.name or "custom"
  if type(name) ~= "string" or not name:match("^[%a_][%w_%.%-]*$") then
    error("layout.define: name must be an identifier-like string, got " .. tostring(name), 2)
  end
  local fail = failer(name)
  local known = { name = 1, doc = 1, fields = 1, regions = 1, k_dims = 1, v_dims = 1, token_align = 1, page_align = 1,
    upstream = 1 }
  for k in pairs(spec) do
    if not known[k] then fail("unknown key '%s' in the description", tostring(k)) end
  end
  local L = setmetatable({ name = name, doc = spec.doc, upstream = spec.upstream, spec = copy(spec) }, Layout)
  local by_name
  L.fields, by_name, L.dim = parse_fields(spec, fail)
  if L.dim > 4096 then fail("the row has %d dims, at most 4096 are supported", L.dim) end
  L.k_dims = spec.k_dims and int_arg(spec.k_dims, fail, "k_dims", 1) or L.dim
  L.v_dims = spec.v_dims and int_arg(spec.v_dims, fail, "v_dims", 0) or L.k_dims
  if L.k_dims > L.dim then fail("k_dims = %d exceeds the row's %d dims", L.k_dims, L.dim) end
  if L.v_dims > L.k_dims then fail("v_dims = %d exceeds k_dims = %d (V is a prefix of K)", L.v_dims, L.k_dims) end
  local rspec = spec.regions or default_regions(L.fields)
  if type(rspec) ~= "table" then fail("regions must be a list of regions, got %s", type(rspec)) end
  if #rspec == 0 or #rspec > 4 then fail("a page has 1 to 4 regions, %d given", #rspec) end
  for i = 1, #rspec do -- a hole would end the walk over them early
    if type(rspec[i]) ~= "table" then fail("regions[%d] must be a table with a row list", i) end
  end
  L.regions, L.npad = place_regions({ regions = rspec }, by_name, fail)
  if #L.fields + L.npad > 8 then fail("%d fields and %d paddings exceed the descriptor's 8 field slots", #L.fields, L.npad) end
  local widest = 1
  for _, r in ipairs(L.regions) do widest = math.max(widest, r.align) end
  L.token_align = spec.token_align and int_arg(spec.token_align, fail, "token_align", 1) or widest
  L.page_align = spec.page_align and int_arg(spec.page_align, fail, "page_align", 1) or L.token_align
  if L.regions[1].row_bytes % L.token_align ~= 0 then
    fail("region '%s' rows are %d bytes, not a multiple of token_align %d (end the row with {align = %d})",
      L.regions[1].name, L.regions[1].row_bytes, L.token_align, L.token_align)
  end
  L.token_bytes = 0
  for _, r in ipairs(L.regions) do L.token_bytes = L.token_bytes + r.row_bytes end
  L._desc, L._packed = {}, {}
  L:desc(1) -- validates everything the C check knows (alignment, overlaps, ...)
  return L
end

-- Region offsets in a page of `bs` tokens and the padded page size.
function Layout:page_geometry(bs)
  local offs, pos = {}, 0
  for i, r in ipairs(self.regions) do
    pos = align_up(pos, r.start_align)
    offs[i] = pos
    pos = pos + r.row_bytes * bs
  end
  return offs, align_up(pos, self.page_align), pos
end

--- L:page_bytes(bs) -> bytes of a page of bs tokens, padded to page_align (a cache's page stride is at least this).
function Layout:page_bytes(bs) return (select(2, self:page_geometry(bs))) end

--- Offset from a page's base of byte `b` of token `t`'s row in region `reg`
-- (0-based) of a descriptor table `d` (L:desc or core.layout_unpack), with
-- region 0's rows `token_stride` apart: layout_desc.h's mla_region_base and
-- mla_region_step, for Lua-side readers.
function M.region_offset(d, reg, t, b, token_stride)
  local c = d.region_chunk and d.region_chunk[reg + 1] or 0
  if c > 0 then return d.region_off[reg + 1] + b // c * c * d.block_size + t * c + b % c end
  return d.region_off[reg + 1] + t * (reg == 0 and token_stride or d.region_row_bytes[reg + 1]) + b
end

local function build_desc(L, bs)
  local offs, page_bytes = L:page_geometry(bs)
  local d = { name = L.name, dim = L.dim, k_dims = L.k_dims, v_dims = L.v_dims, block_size = bs,
    page_bytes = page_bytes, page_align = L.page_align, token_align = L.token_align,
    region_row_bytes = {}, region_chunk = {}, region_off = {}, fields = {} }
  local where, pads = {}, {}
  for i, r in ipairs(L.regions) do
    d.region_row_bytes[i], d.region_chunk[i], d.region_off[i] = r.row_bytes, r.chunk or 0, offs[i]
    for _, it in ipairs(r.items) do
      if it.kind == "pad" then pads[#pads + 1] = { it, r.index } else where[it.name] = { it, r.index } end
    end
  end
  for _, f in ipairs(L.fields) do
    local at = where[f.name]
    local e = { name = f.name, role = "data", dtype = f.dtype, dim_lo = f.dim_lo, count = f.count, region = at[2],
      byte_off = at[1].off, scale_kind = "none" }
    local s = f.scale
    if s and s.kind == "tensor" then e.scale_kind = "tensor" end
    if s and s.kind == "group" then
      local sa = where[f.name .. ".scale"]
      e.scale_kind, e.group, e.scale_dtype, e.scale_region, e.scale_off = "group", s.group, s.dtype, sa[2], sa[1].off
      e.scale_policy, e.eps_on_amax, e.qmax, e.eps = s.policy, s.eps_on == "amax" and 1 or 0, s.qmax, s.eps
      e.scale_min, e.scale_max = s.min, s.max
    end
    d.fields[#d.fields + 1] = e
  end
  for _, p in ipairs(pads) do
    d.fields[#d.fields + 1] = { name = p[1].name, role = "pad", dtype = "u8", count = p[1].bytes, region = p[2], byte_off = p[1].off }
  end
  d.nfields, d.nregions = #d.fields, #d.region_row_bytes
  return d
end

-- "fields[2]" in a core message -> the field's name.
function Layout:explain(msg, desc)
  return (msg:gsub("fields%[(%d+)%]", function(i)
    local f = desc.fields[tonumber(i) + 1]
    if not f then return "fields[" .. i .. "]" end
    return (f.role == "pad" and "padding '" or "field '") .. f.name .. "'"
  end))
end

--- The mla_layout_desc of this layout for pages of `block_size` tokens, as a
-- table with exactly the C member names (fields: mla_layout_field members
-- plus `name`); what core.layout_pack and mla.rtc.layout_header take.
function Layout:desc(block_size)
  local bs = math.tointeger(block_size)
  if not bs or bs < 1 then error(string.format("layout '%s': block_size must be a positive integer, got %s", self.name, tostring(block_size)), 2) end
  local d = self._desc[bs]
  if not d then
    d = build_desc(self, bs)
    local ok, err = core.layout_check(d)
    if not ok then error(string.format("layout '%s': %s", self.name, self:explain(err, d)), 0) end
    self._desc[bs] = d
  end
  return copy(d)
end

--- The packed descriptor (a string holding the C struct) for kernels.
function Layout:packed(block_size)
  local s = self._packed[block_size]
  if not s then
    s = core.layout_pack(self:desc(block_size))
    self._packed[block_size] = s
  end
  return s
end

--- true if a region stores its rows in pieces (regions' `chunk`): only the
-- generic kernels take such a layout, the specialized ones address whole rows.
function Layout:chunked()
  for _, r in ipairs(self.regions) do if r.chunk then return true end end
  return false
end

--- true if a field uses the per-tensor scale (a cache then keeps one per layer).
function Layout:has_tensor_scale()
  for _, f in ipairs(self.fields) do if f.scale and f.scale.kind == "tensor" then return true end end
  return false
end
--- has_tensor_scale(L or name) -> true if a field of the layout uses the per-tensor scale.
function M.has_tensor_scale(L) return M.get(L):has_tensor_scale() end

--- L:field(name) -> the parsed field of that name ({name, dtype, count, dim_lo, scale, ...}), or nil.
function Layout:field(name)
  for _, f in ipairs(self.fields) do if f.name == name then return f end end
  return nil
end

--- Byte offset inside a page (of `bs` tokens) -> what lives there:
-- { region =, token =, item =, byte = } or { padding = true }.
function Layout:locate(byte, bs) return map.locate(self, byte, bs) end

--- A copy of the description with changes: fields and regions by name,
-- scale options merged, e.g. L:with{ name = "x", scale = { nope = { policy = "amax" } } }.
function Layout:with(changes)
  local spec = copy(self.spec)
  for k, v in pairs(changes) do
    if k == "scale" then
      for fname, opts in pairs(v) do
        local found
        for _, e in ipairs(spec.fields) do
          if (e.name or e[1]) == fname then
            found = true
            if type(e.scale) ~= "table" then error(string.format("layout '%s': field '%s' has no group scale to change", self.name, fname), 2) end
            for ok, ov in pairs(opts) do e.scale[ok] = ov end
          end
        end
        if not found then error(string.format("layout '%s': no field '%s'", self.name, fname), 2) end
      end
    else
      spec[k] = copy(v)
    end
  end
  return M.define(spec)
end

function Layout:__tostring()
  return string.format("layout(%s, %d dims, %d B/token, %d region%s)", self.name, self.dim, self.token_bytes, #self.regions,
    #self.regions > 1 and "s" or "")
end

-- Registry of named layouts ----------------------------------------------

local registry, order = {}, {}

--- Registers a layout under its name (built-ins and user layouts alike).
function M.register(L)
  if getmetatable(L) ~= Layout then error("layout.register: a layout from layout.define is expected", 2) end
  if not registry[L.name] then order[#order + 1] = L.name end
  registry[L.name] = L
  return L
end

--- The layout called `name` (a layout passes through).
function M.get(name)
  if getmetatable(name) == Layout then return name end
  local L = registry[name]
  if not L then
    error(string.format("layout.get: no layout '%s' (known: %s)", tostring(name), table.concat(order, ", ")), 2)
  end
  return L
end

--- Names of the built-in and registered layouts, in definition order.
function M.builtins()
  local o = {}
  for i, n in ipairs(order) do o[i] = n end
  return o
end

--- Byte map of one token and one page, as text.
function M.map(L, block_size) return map.text(M.get(L), block_size or 64) end

--- Prints the byte map (and returns its text).
function M.show(L, block_size)
  local s = M.map(L, block_size)
  io.write(s)
  return s
end

M.is_layout = function(v) return getmetatable(v) == Layout end

for _, spec in ipairs(require "mlalab.layout_builtins") do M.register(M.define(spec)) end

return M
