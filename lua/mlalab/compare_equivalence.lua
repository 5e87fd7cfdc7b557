--- The cross-layer equivalence check (vLLM #45111 as a one-call test): run
-- a kernel on a contiguous cache and on a per-layer view carved from a
-- block-major cross-layer buffer whose neighbours are poisoned, then
--   1. the view really is strided: not contiguous, page stride layers*page_bytes,
--      offset layer*page_bytes (checked before anything runs);
--   2. every output is bit-identical between the two runs;
--   3. the two caches end with identical bytes (what a write kernel wrote);
--   4. zero bleed: every byte outside the layer is unchanged, else the first
--      corrupted byte is reported as (block, layer, byte);
--   5. the check is not dead: a read kernel's outputs are not all zero, a
--      write kernel changed the cache.
-- Generic over plain tensors: the buffer is u8 [blocks, layers, page_bytes].
return function(M, mla)
  local Equiv = {}
  Equiv.__index = Equiv

  local OPTION_NAMES = { "run", "kind", "page_bytes", "layout", "name", "blocks", "layers", "layer", "device", "seed",
    "poison", "payload", "compare", "nonzero", "raise" }

  local function check_spec(s)
    if type(s) ~= "table" then error("equivalence: a table {run=, page_bytes=, ...} expected", 3) end
    if type(s.run) ~= "function" then error("equivalence: run = function(cache, ctx) expected", 3) end
    require("mlalab.options").check("equivalence", s, OPTION_NAMES, 3)
    local kind = s.kind or "read"
    if kind ~= "read" and kind ~= "write" then error("equivalence: kind must be 'read' or 'write'", 3) end
    local pb = s.page_bytes or (s.layout and s.layout.page_bytes)
    if not math.tointeger(pb) or pb < 1 then error("equivalence: page_bytes (a positive integer) is required", 3) end
    local c = {
      name = s.name or "kernel", kind = kind, page_bytes = pb, blocks = s.blocks or 4, layers = s.layers or 3,
      device = s.device or mla.device(), seed = s.seed or mla.next_seed(), layout = s.layout,
      poison = s.poison or (kind == "read" and "random" or "zeros"), payload = s.payload, run = s.run,
      compare = s.compare or "exact", nonzero = s.nonzero,
    }
    c.layer = s.layer or 1
    if c.blocks < 2 then error("equivalence: blocks must be >= 2 (one block cannot show a wrong page stride)", 3) end
    if c.layers < 2 then error("equivalence: layers must be >= 2 (no neighbours, nothing to poison)", 3) end
    if c.layer < 0 or c.layer >= c.layers then
      error(string.format("equivalence: layer %d out of range 0..%d", c.layer, c.layers - 1), 3)
    end
    if c.nonzero == nil then c.nonzero = true end
    return c
  end

  local function fill_payload(c, t)
    local p = c.payload
    if p == nil then
      if c.kind == "read" then t:random_bytes_(c.seed) else t:zero_() end
    elseif mla.is_tensor(p) then
      t:copy(p)
    elseif type(p) == "function" then
      p(t)
    else
      error("equivalence: payload must be a tensor or a function(t)", 4)
    end
  end

  local function poison(c, buf, ctx)
    local p = c.poison
    if p == "random" then buf:random_bytes_(c.seed ~ 0x9e3779b9)
    elseif p == "zeros" then buf:zero_()
    elseif math.tointeger(p) then buf:fill(p)
    elseif type(p) == "function" then p(buf, ctx)
    else error("equivalence: poison must be 'random', 'zeros', a byte value or a function(buf, ctx)", 4) end
  end

  --- Outputs as {key -> tensor}: a tensor, a table of tensors, or nil.
  local function outputs(v, what)
    if v == nil then return {} end
    if mla.is_tensor(v) then return { out = v } end
    if type(v) ~= "table" then error("equivalence: run returned a " .. type(v) .. " from the " .. what .. " run", 4) end
    local o = {}
    for k, t in pairs(v) do
      if not mla.is_tensor(t) then error("equivalence: output '" .. tostring(k) .. "' is not a tensor", 4) end
      o[tostring(k)] = t
    end
    return o
  end

  local function sorted_keys(t)
    local k = {}
    for key in pairs(t) do k[#k + 1] = key end
    table.sort(k)
    return k
  end

  local function describe(c, byte)
    local L = c.layout
    if type(L) == "function" then return L(byte) end
    if type(L) == "table" and type(L.field_at) == "function" then return L.field_at(L, byte) end
    return nil
  end

  function Equiv:add(name, ok, detail)
    self.checks[#self.checks + 1] = { name = name, ok = ok, detail = detail or "" }
    if not ok then self.ok = false end
  end

  function Equiv:row()
    local failed = {}
    for _, ch in ipairs(self.checks) do
      if not ch.ok then failed[#failed + 1] = ch.name end
    end
    return string.format("%-6s %-28s %-5s layer %d of %d, %d blocks x %d B   %s", self.ok and "PASS" or "FAIL",
      self.name, self.kind, self.layer, self.layers, self.blocks, self.page_bytes,
      #failed == 0 and "all checks passed" or "failed: " .. table.concat(failed, ", "))
  end
  Equiv.__tostring = Equiv.row

  function Equiv:report()
    local lines = { self:row() }
    for _, ch in ipairs(self.checks) do
      lines[#lines + 1] = string.format("  %-4s %-22s %s", ch.ok and "ok" or "FAIL", ch.name, ch.detail)
    end
    return table.concat(lines, "\n")
  end

  --- The first corrupted byte outside the layer, in (block, layer, byte) order.
  local function bleed(c, buf, before)
    local total, first = 0, nil
    for l = 0, c.layers - 1 do
      if l ~= c.layer then
        local r = M.compare(buf:select(1, l), before:select(1, l), { mode = "exact", first = 1 })
        total = total + r.bits_diff
        local m = r.first[1]
        if m then
          local cand = { block = m.at[1], layer = l, byte = m.at[2], before = m.b, after = m.a }
          if not first or cand.block < first.block or (cand.block == first.block and cand.layer < first.layer) then
            first = cand
          end
        end
      end
    end
    return total, first
  end

  --- mla.equivalence{run=function(cache, ctx) ... end, page_bytes=, blocks=4,
  -- layers=3, layer=1, kind="read"|"write", poison=, payload=, device=,
  -- seed=, layout=, compare="exact", nonzero=true, raise=false}
  function M.equivalence(spec)
    local c = check_spec(spec)
    local res = setmetatable({ name = c.name, kind = c.kind, layer = c.layer, layers = c.layers, blocks = c.blocks,
      page_bytes = c.page_bytes, seed = c.seed, checks = {}, ok = true, outputs = {} }, Equiv)
    local dev = c.device
    local contiguous = mla.empty({ c.blocks, c.page_bytes }, "u8", dev)
    fill_payload(c, contiguous)
    local initial = contiguous:clone()
    local buf = mla.empty({ c.blocks, c.layers, c.page_bytes }, "u8", dev)
    local ctx_v = { name = c.name, layer = c.layer, layers = c.layers, blocks = c.blocks, page_bytes = c.page_bytes,
      contiguous = false, seed = c.seed }
    poison(c, buf, ctx_v)
    local view = buf:select(1, c.layer)
    -- the premise of the test: a kernel that assumes packed pages must be able to fail
    if view:is_contiguous() then error("equivalence: internal: the per-layer view is contiguous", 2) end
    if view:stride(0) ~= c.layers * c.page_bytes or view:offset() ~= c.layer * c.page_bytes then
      error(string.format("equivalence: internal: view stride %d offset %d, expected %d and %d", view:stride(0),
        view:offset(), c.layers * c.page_bytes, c.layer * c.page_bytes), 2)
    end
    view:copy(contiguous)
    local before = buf:clone()
    res.view, res.buffer, res.contiguous = view, buf, contiguous

    local ctx_c = {}
    for k, v in pairs(ctx_v) do ctx_c[k] = v end
    ctx_c.contiguous = true
    local out_c = outputs(c.run(contiguous, ctx_c), "contiguous")
    local out_v = outputs(c.run(view, ctx_v), "strided")
    res.outputs = { contiguous = out_c, view = out_v }

    -- 2. outputs, bit for bit
    local any_nonzero, n_out = false, 0
    for _, k in ipairs(sorted_keys(out_c)) do
      n_out = n_out + 1
      local tv = out_v[k]
      if not tv then
        res:add("output " .. k, false, "missing from the strided run")
      else
        local o = {}
        if type(c.compare) == "table" then
          for ck, cv in pairs(c.compare) do o[ck] = cv end
        elseif M.presets[c.compare] then
          o.preset = c.compare
        else
          o.mode = c.compare
        end
        o.name = k
        local ok, r = pcall(M.compare, tv, out_c[k], o)
        if not ok then
          res:add("output " .. k, false, tostring(r))
        else
          res:add("output " .. k, r.ok, r.ok and string.format("%d elements identical", r.compared)
            or (r.reasons[1] or "") .. (r.first[1] and string.format(" (first at %s: %s vs %s)",
              "[" .. table.concat(r.first[1].at, ",") .. "]", M.num(r.first[1].a), M.num(r.first[1].b)) or ""))
          local s = r.sums
          if s.bb > 0 or r.nan_b > 0 or r.inf_b > 0 then any_nonzero = true end
        end
      end
    end
    for k in pairs(out_v) do
      if not out_c[k] then res:add("output " .. k, false, "missing from the contiguous run") end
    end

    -- 3. the caches hold the same bytes
    local rc = M.compare(view, contiguous, { mode = "exact", first = 1 })
    local m = rc.first[1]
    res:add("cache bytes", rc.ok, rc.ok and string.format("%d bytes identical", rc.compared)
      or string.format("%d bytes differ, first at block %d byte %d%s: view 0x%02x, contiguous 0x%02x", rc.bits_diff,
        m.at[1], m.at[2], describe(c, m.at[2]) and " (" .. describe(c, m.at[2]) .. ")" or "", m.abits, m.bbits))

    -- 4. zero bleed
    local n_bad, first = bleed(c, buf, before)
    res.bleed = { bytes = n_bad, first = first }
    if first then
      local where = describe(c, first.byte)
      res:add("zero bleed", false, string.format("%d neighbour bytes changed; first at block %d, layer %d, byte %d%s: "
        .. "0x%02x -> 0x%02x", n_bad, first.block, first.layer, first.byte, where and " (" .. where .. ")" or "",
        math.tointeger(first.before) or 0, math.tointeger(first.after) or 0))
    else
      res:add("zero bleed", true, string.format("%d neighbour bytes unchanged", (c.layers - 1) * c.blocks * c.page_bytes))
    end

    -- 5. not a dead check
    if c.nonzero then
      if c.kind == "read" then
        res:add("outputs not all zero", n_out > 0 and any_nonzero,
          n_out == 0 and "a read kernel returned no outputs" or (any_nonzero and "" or "every output is zero"))
      else
        local changed = not M.compare(contiguous, initial, "exact").ok
        res:add("kernel wrote", changed, changed and "" or "the write kernel left the cache unchanged")
      end
    end
    if spec.raise and not res.ok then error("equivalence failed\n" .. res:report(), 2) end
    return res
  end

  --- Raises with the report unless the equivalence check passes.
  function M.assert_equivalent(spec)
    local r = M.equivalence(spec)
    if not r.ok then error("equivalence failed\n" .. r:report(), 2) end
    return r
  end
end
