--- Byte maps of a layout: what lives at a byte of a page (for bleed reports)
-- and the printed map of one token and one page (mla.layout.show).
local M = {}

local function describe_scale(s)
  if not s then return "" end
  if s.kind == "tensor" then return ", x per-tensor f32 scale" end
  local eps = s.eps > 0 and string.format(", eps %g on the %s", s.eps, s.eps_on) or ""
  local clamp = (s.min > 0 or s.max > 0) and string.format(", clamp [%g, %g]", s.min, s.max) or ""
  return string.format(", %s scale per %d (%s%s%s)", s.dtype, s.group, s.policy, eps, clamp)
end

local function item_text(it)
  if it.kind == "pad" then return string.format("%-12s %d B, written as 0", it.name, it.bytes) end
  local f = it.field
  if it.kind == "scale" then
    return string.format("%-12s %d x %s, one per %d dims of '%s'", it.name, f.scale.count, f.scale.dtype, f.scale.group, f.name)
  end
  return string.format("%-12s %d x %s, dims [%d, %d)%s", it.name, f.count, f.dtype, f.dim_lo, f.dim_lo + f.count,
    describe_scale(f.scale))
end

--- Map of one token (every region's row) and one page of `bs` tokens.
function M.text(L, bs)
  local o = {}
  local function add(fmt, ...) o[#o + 1] = string.format(fmt, ...) end
  local offs, page_bytes, used = L:page_geometry(bs)
  add("layout %s: %d dims (K [0, %d), V [0, %d)), %d B/token%s", L.name, L.dim, L.k_dims, L.v_dims, L.token_bytes,
    #L.regions > 1 and ", page-split" or ", interleaved")
  if L.doc then add("  %s", L.doc) end
  for _, r in ipairs(L.regions) do
    add("  token row, region %d '%s' (%d B/token):", r.index, r.name, r.row_bytes)
    local pos = 0
    local items = {}
    for i, it in ipairs(r.items) do items[i] = it end
    table.sort(items, function(a, b) return a.off < b.off end)
    for _, it in ipairs(items) do
      if it.off > pos then add("    [%5d, %5d)  %-12s %d B, never written", pos, it.off, "(unused)", it.off - pos) end
      add("    [%5d, %5d)  %s", it.off, it.off + it.bytes, item_text(it))
      pos = math.max(pos, it.off + it.bytes)
    end
    if r.row_bytes > pos then add("    [%5d, %5d)  %-12s %d B, never written", pos, r.row_bytes, "(unused)", r.row_bytes - pos) end
  end
  add("  page of %d tokens: %d B (page_align %d, token_align %d)", bs, page_bytes, L.page_align, L.token_align)
  local pos = 0
  for i, r in ipairs(L.regions) do
    if offs[i] > pos then add("    [%7d, %7d)  alignment gap", pos, offs[i]) end
    if r.chunk then
      add("    [%7d, %7d)  %-8s %d pieces x %d x %d B (piece j of token t at +%d j + %d t)", offs[i], offs[i] + r.row_bytes * bs,
        r.name, r.row_bytes // r.chunk, bs, r.chunk, r.chunk * bs, r.chunk)
    else
      add("    [%7d, %7d)  %-8s %d x %d B", offs[i], offs[i] + r.row_bytes * bs, r.name, bs, r.row_bytes)
    end
    pos = offs[i] + r.row_bytes * bs
  end
  if page_bytes > used then add("    [%7d, %7d)  padding to a multiple of %d", used, page_bytes, L.page_align) end
  return table.concat(o, "\n") .. "\n"
end

--- What lives at byte `byte` of a page of `bs` tokens:
-- { region = name, token = t, item = "nope" | "nope.scale" | "pad1" | "(unused)",
--   kind = "data" | "scale" | "pad" | "unused", offset = byte in the item,
--   elem = element (data) or group (scale) index }, or { padding = true }.
function M.locate(L, byte, bs)
  local offs = L:page_geometry(bs)
  for i, r in ipairs(L.regions) do
    local lo = offs[i]
    if byte >= lo and byte < lo + r.row_bytes * bs then
      local t, b
      if r.chunk then -- piece-major: [row / chunk][bs][chunk]
        local rel = byte - lo
        t, b = rel % (r.chunk * bs) // r.chunk, rel // (r.chunk * bs) * r.chunk + rel % r.chunk
      else
        t, b = (byte - lo) // r.row_bytes, (byte - lo) % r.row_bytes
      end
      for _, it in ipairs(r.items) do
        if b >= it.off and b < it.off + it.bytes then
          local res = { region = r.name, token = t, item = it.name, kind = it.kind, offset = b - it.off }
          if it.kind == "data" then res.elem = (b - it.off) * 8 // it.field.bits end
          if it.kind == "scale" then res.elem = (b - it.off) // it.field.scale.size end
          return res
        end
      end
      return { region = r.name, token = t, item = "(unused)", kind = "unused", offset = b }
    end
  end
  return { padding = true }
end

return M
