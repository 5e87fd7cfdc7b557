--- Layouts in JIT kernels: a header of compile-time constants generated from
-- the same Lua description every other module uses (`L:desc(block_size)`, a
-- table keyed by the fields of mla_layout_desc in layout_desc.h), so one
-- kernel source serves every layout and a new layout needs no C++ edit.
-- Kernels `#include "mla_layout.h"` and pass `mla_layout` to the accessors of
-- mla/layout_access.cuh; with a constexpr descriptor every branch folds away.
local core = require "mlalab.core"

local M = {}

M.HEADER_NAME = "mla_layout.h"

-- Enumerations of layout_desc.h and dtype_ids.h, by id.
local DTYPES = { [0] = "u8", "i8", "u16", "i16", "i32", "i64", "f16", "bf16", "f32", "f64", "e4m3", "e5m2", "ue8m0", "e2m1" }
local ROLES = { [0] = "MLA_FIELD_DATA", "MLA_FIELD_PAD" }
local ROLE_NAMES = { data = 0, pad = 1 }
local SCALE_KINDS = { [0] = "MLA_SCALE_NONE", "MLA_SCALE_TENSOR", "MLA_SCALE_GROUP" }
local SCALE_KIND_NAMES = { none = 0, tensor = 1, group = 2 }
local POLICIES = { [0] = "MLA_POLICY_POW2", "MLA_POLICY_AMAX" }
local POLICY_NAMES = { pow2 = 0, amax = 1 }
local MAX_FIELDS, MAX_REGIONS = 8, 4
M.DTYPES = DTYPES

local function fail(fmt, ...) error("layout_header: " .. string.format(fmt, ...), 0) end

local function int_of(v, where, lo, hi)
  if type(v) == "boolean" then v = v and 1 or 0 end
  local i = math.tointeger(v)
  if not i then fail("%s must be an integer, got %s", where, v == nil and "nothing" or tostring(v)) end
  if (lo and i < lo) or (hi and i > hi) then fail("%s = %d is out of range [%s, %s]", where, i, lo or "", hi or "") end
  return i
end

local function enum_of(v, names, count, where)
  if type(v) == "string" then
    local id = names[v:lower()]
    if not id then fail("%s: unknown value '%s'", where, v) end
    return id
  end
  return int_of(v, where, 0, count - 1)
end

local function dtype_of(v, where)
  if type(v) == "string" then
    local ok, info = pcall(core.dtype_info, v)
    if not ok then fail("%s: unknown dtype '%s'", where, v) end
    return info.id
  end
  return int_of(v, where, 0, #DTYPES)
end

local function float_of(v, where)
  if type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge then
    fail("%s must be a finite number, got %s", where, tostring(v))
  end
  return (string.unpack("<f", string.pack("<f", v))) -- the value C stores
end

-- A float literal that reads back as exactly the same float.
local function float_literal(x)
  local s = string.format("%.9g", x)
  if not s:find("[%.e]") then s = s .. ".0" end
  return s .. "f"
end

local function list_of(t, n, where, conv)
  local out = {}
  if t ~= nil and type(t) ~= "table" then fail("%s must be a list", where) end
  t = t or {}
  if #t > n then fail("%s has %d entries, at most %d are allowed", where, #t, n) end
  for i = 1, n do out[i] = conv(t[i] or 0, string.format("%s[%d]", where, i)) end
  return out
end

--- Checks and normalizes a descriptor table (numbers; enums by id).
function M.normalize(desc, block_size)
  if type(desc) ~= "table" then fail("a layout (with :desc) or a descriptor table is expected, got a %s", type(desc)) end
  local d = {}
  d.dim = int_of(desc.dim, "dim", 1)
  d.k_dims = int_of(desc.k_dims or d.dim, "k_dims", 0, d.dim)
  d.v_dims = int_of(desc.v_dims or d.k_dims, "v_dims", 0, d.k_dims)
  local bs = desc.block_size or block_size
  if block_size and desc.block_size and desc.block_size ~= block_size then
    fail("descriptor was made for block_size %d, not %d", desc.block_size, block_size)
  end
  d.block_size = int_of(bs, "block_size", 1)
  if type(desc.fields) ~= "table" or #desc.fields == 0 then fail("fields must be a non-empty list") end
  d.nfields = int_of(desc.nfields or #desc.fields, "nfields", 1, MAX_FIELDS)
  if d.nfields ~= #desc.fields then fail("nfields = %d but %d fields are listed", d.nfields, #desc.fields) end
  d.region_row_bytes = list_of(desc.region_row_bytes, MAX_REGIONS, "region_row_bytes", function(v, w) return int_of(v, w, 0) end)
  d.nregions = int_of(desc.nregions or #desc.region_row_bytes, "nregions", 1, MAX_REGIONS)
  d.region_off = list_of(desc.region_off, MAX_REGIONS, "region_off", function(v, w) return int_of(v, w, 0) end)
  d.region_chunk = list_of(desc.region_chunk, MAX_REGIONS, "region_chunk", function(v, w) return int_of(v, w, 0) end)
  d.page_bytes = int_of(desc.page_bytes, "page_bytes", 1)
  d.page_align = int_of(desc.page_align or 1, "page_align", 1)
  d.token_align = int_of(desc.token_align or 1, "token_align", 1)
  d.name = desc.name
  d.fields = {}
  for i, f in ipairs(desc.fields) do
    local w = function(k) return string.format("fields[%d].%s", i, k) end
    if type(f) ~= "table" then fail("fields[%d] must be a table", i) end
    local role = enum_of(f.role or 0, ROLE_NAMES, 2, w "role")
    local g = {
      name = f.name,
      role = role,
      dtype = dtype_of(f.dtype or 0, w "dtype"),
      dim_lo = int_of(f.dim_lo or 0, w "dim_lo", 0),
      count = int_of(f.count, w "count", 1),
      region = int_of(f.region or 0, w "region", 0, d.nregions - 1),
      byte_off = int_of(f.byte_off, w "byte_off", 0),
      scale_kind = enum_of(f.scale_kind or 0, SCALE_KIND_NAMES, 3, w "scale_kind"),
      group = int_of(f.group or 0, w "group", 0),
      scale_dtype = dtype_of(f.scale_dtype or 0, w "scale_dtype"),
      scale_region = int_of(f.scale_region or 0, w "scale_region", 0, d.nregions - 1),
      scale_off = int_of(f.scale_off or 0, w "scale_off", 0),
      scale_policy = enum_of(f.scale_policy or 0, POLICY_NAMES, 2, w "scale_policy"),
      eps_on_amax = int_of(f.eps_on_amax or 0, w "eps_on_amax", 0, 1),
      qmax = float_of(f.qmax or 0, w "qmax"),
      eps = float_of(f.eps or 0, w "eps"),
      scale_min = float_of(f.scale_min or 0, w "scale_min"),
      scale_max = float_of(f.scale_max or 0, w "scale_max"),
    }
    if g.scale_kind == 2 and g.group <= 0 then fail("%s must be > 0 for group scales", w "group") end
    if g.name ~= nil and (type(g.name) ~= "string" or not g.name:match("^[%a_][%w_]*$")) then
      fail("%s must be an identifier", w "name")
    end
    d.fields[i] = g
  end
  return d
end

local function C(v) return math.tointeger(v) and string.format("%d", v) or tostring(v) end
local function dt(id) return "MLA_" .. DTYPES[id]:upper() end

--- The C aggregate initializer of a normalized descriptor (`{...}`, lines
-- after the first indented by `indent`): the one place descriptor numbers
-- become C text, for JIT headers and for the baked kernels' built-ins header.
function M.initializer(d, indent)
  indent = indent or ""
  local o = {}
  local function add(fmt, ...) o[#o + 1] = string.format(fmt, ...) end
  add("{")
  add("%s  /* dim */ %d, /* k_dims */ %d, /* v_dims */ %d,", indent, d.dim, d.k_dims, d.v_dims)
  add("%s  /* nfields */ %d, /* nregions */ %d, /* block_size */ %d,", indent, d.nfields, d.nregions, d.block_size)
  add("%s  /* region_row_bytes */ {%s},", indent, table.concat(d.region_row_bytes, ", "))
  add("%s  /* region_chunk */ {%s},", indent, table.concat(d.region_chunk, ", "))
  local offs = {}
  for i, v in ipairs(d.region_off) do offs[i] = C(v) .. "LL" end
  add("%s  /* region_off */ {%s},", indent, table.concat(offs, ", "))
  add("%s  /* page_bytes */ %sLL, /* page_align */ %d, /* token_align */ %d,", indent, C(d.page_bytes), d.page_align,
    d.token_align)
  add("%s  /* fields */ {", indent)
  for i, f in ipairs(d.fields) do
    add("%s    /* [%d]%s */ {%s, %s, /* dim_lo */ %d, /* count */ %d, /* region */ %d, /* byte_off */ %d,", indent,
      i - 1, f.name and (" " .. f.name) or "", ROLES[f.role], dt(f.dtype), f.dim_lo, f.count, f.region, f.byte_off)
    add("%s      %s, /* group */ %d, %s, /* scale_region */ %d, /* scale_off */ %d, %s, /* eps_on_amax */ %d,", indent,
      SCALE_KINDS[f.scale_kind], f.group, dt(f.scale_dtype), f.scale_region, f.scale_off, POLICIES[f.scale_policy],
      f.eps_on_amax)
    add("%s      /* qmax */ %s, /* eps */ %s, /* scale_min */ %s, /* scale_max */ %s},", indent, float_literal(f.qmax),
      float_literal(f.eps), float_literal(f.scale_min), float_literal(f.scale_max))
  end
  add("%s  }}", indent)
  return table.concat(o, "\n")
end

--- The header text for a layout (anything with :desc(block_size)) or a descriptor table.
function M.header(layout, block_size)
  local desc, name = layout, nil
  if (type(layout) == "table" or type(layout) == "userdata") and type(layout.desc) == "function" then
    if block_size == nil then fail("block_size is required with a layout") end
    desc = layout:desc(block_size)
    name = layout.name
  end
  local d = M.normalize(desc, block_size)
  name = name or d.name or "custom"
  local o = {}
  local function add(fmt, ...) o[#o + 1] = string.format(fmt, ...) end
  name = (tostring(name):gsub("[^%w_%-%.: ]", "_"))
  add("/* Generated by mlalab (mla.rtc.layout_header) for layout \"%s\", block_size %d. Do not edit.", name, d.block_size)
  add(" * Kernels read `mla_layout` (constexpr mla_layout_desc) through mla/layout_access.cuh. */")
  add("#ifndef MLA_LAYOUT_GENERATED_H")
  add("#define MLA_LAYOUT_GENERATED_H")
  add("#include \"mla/dtype_ids.h\"")
  add("#include \"mla/layout_desc.h\"")
  add("")
  add("#define MLA_LAYOUT_NAME \"%s\"", (tostring(name):gsub("[^%w_%-%.: ]", "_")))
  add("constexpr mla_layout_desc mla_layout = %s;", M.initializer(d, "  "))
  add("")
  add("/* The same numbers as plain constants, for reading and for array sizes. */")
  add("constexpr int MLA_LAYOUT_DIM = %d, MLA_LAYOUT_K_DIMS = %d, MLA_LAYOUT_V_DIMS = %d;", d.dim, d.k_dims, d.v_dims)
  add("constexpr int MLA_LAYOUT_BLOCK_SIZE = %d, MLA_LAYOUT_NFIELDS = %d, MLA_LAYOUT_NREGIONS = %d;", d.block_size,
    d.nfields, d.nregions)
  add("constexpr int MLA_LAYOUT_TOKEN_BYTES = %d; /* region 0 row */", d.region_row_bytes[1])
  add("constexpr long long MLA_LAYOUT_PAGE_BYTES = %sLL;", C(d.page_bytes))
  for i, f in ipairs(d.fields) do
    if f.name then add("constexpr int MLA_LAYOUT_FIELD_%s = %d;", f.name:upper(), i - 1) end
  end
  add("")
  add("#endif")
  return table.concat(o, "\n") .. "\n"
end

M.BUILTINS_HEADER = "kernels_rtc/include/mla/builtin_layouts.h"
M.BUILTINS_BLOCK_SIZE = 64

--- The text of kernels_rtc/include/mla/builtin_layouts.h: the descriptor of
-- every built-in layout at block size 64 as an initializer macro, and an
-- X-macro listing them, so kernels baked in with nvcc can instantiate
-- compile-time-specialized variants whose numbers come from the Lua
-- definitions. The file is generated (scripts/gen-layouts) and committed so
-- the build needs no interpreter; spec/layout_header_spec.lua fails when it is
-- stale. Kernels pick a variant by comparing descriptors, never by name.
function M.builtins_header()
  local layout = require "mlalab.layout"
  local bs = M.BUILTINS_BLOCK_SIZE
  local o = {}
  local function add(fmt, ...) o[#o + 1] = string.format(fmt, ...) end
  add("/* Generated by scripts/gen-layouts (mla.rtc.builtins_header) from lua/mlalab/layout_builtins.lua. Do not edit:")
  add(" * spec/layout_header_spec.lua fails when this file is stale.")
  add(" *")
  add(" * MLA_BUILTIN_DESC_<name> is the aggregate initializer of the mla_layout_desc of a built-in layout at")
  add(" * block_size %d; MLA_BUILTIN_LAYOUTS(X) expands X(name, initializer) for each whose rows are whole (no", bs)
  add(" * chunked region), MLA_BUILTIN_LAYOUTS_ALL(X) for every one (for kernels that address pieces too).")
  add(" * Baked kernels instantiate constexpr-specialized variants from these and select one when the runtime")
  add(" * descriptor equals it. */")
  add("#ifndef MLA_BUILTIN_LAYOUTS_H")
  add("#define MLA_BUILTIN_LAYOUTS_H")
  add("#include \"dtype_ids.h\"")
  add("#include \"layout_desc.h\"")
  add("")
  add("#define MLA_BUILTIN_BLOCK_SIZE %d", bs)
  local names, chunked_ids = {}, {}
  for _, spec in ipairs(require "mlalab.layout_builtins") do
    local name = spec.name
    local L = layout.get(name)
    do
      local d = M.normalize(L:desc(bs), bs)
      local id = name:gsub("[^%w_]", "_")
      local chunked = false
      for r = 1, d.nregions do chunked = chunked or d.region_chunk[r] > 0 end
      if chunked then chunked_ids[#chunked_ids + 1] = id else names[#names + 1] = id end
      add("")
      add("/* %s */", (L.doc or name):gsub("%*/", "* /"))
      add("#define MLA_BUILTIN_DESC_%s %s", id, (M.initializer(d, "    "):gsub("\n", " \\\n")))
    end
  end
  add("")
  local xs = {}
  for i, id in ipairs(names) do xs[i] = string.format("X(%s, MLA_BUILTIN_DESC_%s)", id, id) end
  add("#define MLA_BUILTIN_LAYOUTS(X) %s", table.concat(xs, " \\\n  "))
  -- every built-in: the whole-row ones, then the chunked ones
  xs = { "MLA_BUILTIN_LAYOUTS(X)" }
  for _, id in ipairs(chunked_ids) do xs[#xs + 1] = string.format("X(%s, MLA_BUILTIN_DESC_%s)", id, id) end
  add("#define MLA_BUILTIN_LAYOUTS_ALL(X) %s", table.concat(xs, " \\\n  "))
  add("")
  add("#endif")
  return table.concat(o, "\n") .. "\n"
end

local CACHE_VIEW_OPTIONS = { "block_size", "tensor_scale", "allow_cpu" }

--- Bytes of an mla_cache_view argument (passed by value) for one layer's pages:
-- t is u8 [pages, page_bytes] or [pages, block_size, row] (one-region
-- layouts), e.g. cache:view(i).pages; layout: a layout or its name (then
-- opts.block_size), a descriptor table or a packed descriptor. opts.tensor_scale: an f32
-- tensor of one element on the pages' device, or nil; opts.allow_cpu: accept
-- a CPU tensor (to inspect the bytes). The view is checked against the
-- descriptor as every kernel's is (src/l_layout.c); strides come from the
-- tensor, never from block_size x row bytes.
function M.cache_view(t, layout, opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("cache_view: opts must be a table, got a " .. type(opts), 2) end
  require("mlalab.options").check("cache_view", opts, CACHE_VIEW_OPTIONS)
  if not core.is_tensor(t) then error("cache_view: a tensor of pages is expected, got a " .. type(t), 2) end
  local packed
  if type(layout) == "string" and layout:find("\0", 1, true) then
    packed = layout
  elseif type(layout) == "string" then -- a layout name
    if opts.block_size == nil then error("cache_view: block_size is required with a layout", 2) end
    local ok, L = pcall(function() return require("mlalab.layout").get(layout) end)
    if not ok then error("cache_view: " .. tostring(L), 2) end
    packed = L:packed(opts.block_size)
  elseif (type(layout) == "table" or type(layout) == "userdata") and type(layout.packed) == "function" then
    if opts.block_size == nil then error("cache_view: block_size is required with a layout", 2) end
    packed = layout:packed(opts.block_size)
  elseif type(layout) == "table" then
    local d = M.normalize(layout, opts.block_size)
    local desc = {}
    for k, v in pairs(layout) do desc[k] = v end
    desc.block_size = d.block_size
    packed = core.layout_pack(desc)
  else
    error("cache_view: a layout, a descriptor table or a packed descriptor is expected, got a " .. type(layout), 2)
  end
  local ok, bytes, device = pcall(core.rtc_cache_view, packed, t, opts.tensor_scale)
  if not ok then error("cache_view: " .. tostring(bytes), 2) end
  if device == "cpu" and not opts.allow_cpu then
    error("cache_view: pages must be a CUDA tensor (kernels read them); pass allow_cpu = true to inspect the bytes", 2)
  end
  return bytes
end

return M
