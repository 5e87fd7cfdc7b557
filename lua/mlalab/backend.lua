--- Backends and their pairing (`mla.backend`, `mla.pair`).
--
-- A backend is a contract, written as data: the phases it serves, the cache
-- layouts it reads, how it reads them ("paged": through slot ids into the
-- stored pages; "flat_bf16": bf16 rows indexed directly, as FlashMLA's sparse
-- prefill reads `kv [s_kv, 1, 576]`), whether it is sparse (top-k indices)
-- or dense (block table), and the function that runs it. The built-ins are
-- the lab's models of the contracts of real serving backends (see
-- ../shared/reference/kernels-and-indices.md §10 and the sglang seeds), not
-- those kernels themselves.
--
-- Pairing resolves, for a stored layout and a (prefill, decode) pair, what
-- each phase reads, the conversion it needs, where that conversion runs, the
-- top-k transform each phase must use, and the extra bytes moved per layer.
-- The top-k transform is a function of (stored layout, consuming backend,
-- conversion), never of the other phase's choice: the two bugs that
-- cancelled each other in sglang #21011 came from decode consulting the
-- prefill setting.
--
-- Running: each built-in's `run` is one attention call (backend.attend) on
-- what its phase reads; pair:run{...} executes both phases end to end against
-- the CPU reference (mlalab.pair_run, on a mlalab.pair_scenario, with the
-- conversions of mlalab.pair_convert).
local backend = {}

local registry, order = {}, {}

local PHASES = { prefill = true, decode = true }
local INPUTS = { paged = true, flat_bf16 = true }

local function fail(fmt, ...) error(string.format(fmt, ...), 3) end

local function set_of(list, what, name)
  if type(list) == "string" then list = { list } end
  if type(list) ~= "table" or #list == 0 then fail("backend '%s': %s must be a non-empty list", name, what) end
  local s = {}
  for _, v in ipairs(list) do s[v] = true end
  return s, list
end

--- backend.register{name=, phases={"prefill","decode"}, reads={"fp8_ds_mla"}, input="paged"|"flat_bf16",
--   sparse=true|false, run=function(ctx) -> out, lse (see backend.attend), doc="...", models="upstream kernel it models",
--   supports=function(problem) -> true | false, reason (optional: h_q, topk, page size limits)}
function backend.register(b)
  if type(b) ~= "table" then error("backend.register: a table is expected", 2) end
  local name = b.name
  if type(name) ~= "string" or not name:match("^[%a_][%w_]*$") then error("backend.register: name must be an identifier", 2) end
  local phases, plist = set_of(b.phases, "phases", name)
  for p in pairs(phases) do
    if not PHASES[p] then fail("backend '%s': unknown phase '%s' (prefill or decode)", name, tostring(p)) end
  end
  local reads, rlist = set_of(b.reads, "reads", name)
  local input = b.input or "paged"
  if not INPUTS[input] then fail("backend '%s': input must be 'paged' or 'flat_bf16', got '%s'", name, tostring(input)) end
  if input == "flat_bf16" and not (#rlist == 1 and rlist[1] == "bf16") then
    fail("backend '%s': a flat_bf16 backend reads bf16 rows only", name)
  end
  if type(b.sparse) ~= "boolean" then fail("backend '%s': sparse must be true or false", name) end
  if b.run ~= nil and type(b.run) ~= "function" then fail("backend '%s': run must be a function", name) end
  local layout = require "mlalab.layout"
  for _, l in ipairs(rlist) do
    if not pcall(layout.get, l) then fail("backend '%s': reads unknown layout '%s'", name, l) end
  end
  local rec = {
    name = name, phases = phases, phase_list = plist, reads = reads, read_list = rlist, input = input,
    sparse = b.sparse, run = b.run, doc = b.doc or "", models = b.models, supports = b.supports,
  }
  if not registry[name] then order[#order + 1] = name end
  registry[name] = rec
  return rec
end

--- The backend of that name (error listing the registered ones otherwise).
function backend.get(name)
  if type(name) == "table" and name.phases then return name end
  local b = registry[name]
  if not b then error(string.format("backend: no backend '%s' (registered: %s)", tostring(name), table.concat(order, ", ")), 2) end
  return b
end

--- Names of the registered backends, in registration order.
function backend.list()
  local out = {}
  for i, n in ipairs(order) do out[i] = n end
  return out
end

-- Conversions between a stored layout and what a backend reads. `where`:
-- "prefill" runs once per prefill (the pool is then read by every layer call
-- of that prefill), "call" runs on every attention call. bytes(tokens, L)
-- counts bytes read + written per layer for `tokens` cache tokens.
local conversions = {
  {
    name = "requant", from = "fp8_pertensor", to = "fp8_ds_mla", lossless = true,
    doc = "repack 576 B per-tensor fp8 into 656 B (nope bytes copied, scales = the tensor scale, rope fp8 -> bf16)",
    where = { prefill = "prefill", decode = "call" },
  },
  {
    name = "quantize", from = "bf16", to = "fp8_ds_mla", lossless = false,
    doc = "quantize the bf16 pool to 656 B on every call (what a kv-fp8-only kernel does with a bf16 pool)",
    where = { prefill = "call", decode = "call" },
  },
  {
    name = "relayout", from = "fp8_ds_mla", to = "fp8_ds_mla_blocked", lossless = true,
    doc = "move each 656 B row into FlashMLA's dense page-blocked pieces (codes and scale bits unchanged)",
    where = { prefill = "prefill", decode = "call" },
  },
  {
    name = "relayout", from = "fp8_ds_mla_blocked", to = "fp8_ds_mla", lossless = true,
    doc = "gather the page-blocked pieces back into 656 B rows (codes and scale bits unchanged)",
    where = { prefill = "prefill", decode = "call" },
  },
  {
    name = "dequant_pool", from = "*", to = "bf16", lossless = false, opt_in = true,
    doc = "dequantize the whole pool to bf16 pages on every call (the fallback of vLLM #41962: memory and bytes "
      .. "scale with the pool, not with what is referenced)",
    where = { prefill = "call", decode = "call" },
  },
  {
    name = "dequant_ragged", from = "*", to = "bf16", flat = true, lossless = true,
    doc = "gather-dequantize the requests' tokens into ragged bf16 rows (RAGGED top-k: position + request offset)",
    where = { prefill = "call", decode = "call" },
  },
}
backend.conversions = conversions

local function token_bytes(layout_name, block_size)
  local layout = require "mlalab.layout"
  local d = layout.get(layout_name):desc(block_size or 64)
  return d.page_bytes / d.block_size
end

local function find_conversion(stored, b, allow)
  if b.reads[stored] then return nil end
  for _, c in ipairs(conversions) do
    if c.opt_in and not allow[c.name] then goto next end
    local from_ok = c.from == "*" or c.from == stored
    if from_ok and c.from ~= c.to and b.reads[c.to] and (c.flat or false) == (b.input == "flat_bf16") then
      return c
    end
    ::next::
  end
  return false
end

--- The top-k transform a phase needs: "dense" for dense backends, "RAGGED"
-- when it reads ragged bf16 rows made by dequant_ragged, "PAGED" otherwise
-- (slot ids of the pages it reads; on a bf16 pool these are also the rows a
-- flat_bf16 backend indexes).
function backend.topk_transform(b, conversion)
  if not b.sparse then return "dense" end
  if conversion and conversion.flat then return "RAGGED" end
  return "PAGED"
end

-- Why a phase cannot read the stored layout: { phase, backend, short, message }.
local function why_not(stored, b, phase, allow)
  local reads = table.concat(b.read_list, ", ")
  local hints = {}
  for _, c in ipairs(conversions) do
    if b.reads[c.to] and c.from ~= "*" and c.from ~= stored then
      hints[#hints + 1] = string.format("store %s and convert with %s", c.from, c.name)
    end
  end
  for _, l in ipairs(b.read_list) do hints[#hints + 1] = "store " .. l end
  for _, c in ipairs(conversions) do
    if c.opt_in and not allow[c.name] and b.reads[c.to] and (c.flat or false) == (b.input == "flat_bf16") then
      hints[#hints + 1] = string.format("allow = {'%s'} (%s)", c.name, c.doc)
    end
  end
  -- the reason, from the stored layout's scales
  local why = "none is defined"
  for _, f in ipairs(require("mlalab.layout").get(stored).fields) do
    if f.scale and f.scale.kind == "group" then
      why = string.format("per-%d scales cannot become one tensor scale losslessly", f.scale.group)
      break
    end
  end
  local msg = string.format("%s backend '%s' reads %s, and no conversion from the stored layout %s exists (%s); "
    .. "to make it work: %s", phase, b.name, reads, stored, why, table.concat(hints, ", or "))
  return { phase = phase, backend = b.name, stored = stored, hints = hints, message = msg,
    short = string.format("%s %s reads %s, not %s", phase, b.name, table.concat(b.read_list, "|"), stored) }
end

local Pair = {}
Pair.__index = Pair

local PAIR_KEYS = { "prefill", "decode", "store", "kv_dtype", "block_size", "allow" }
-- Conversions a pairing takes only when `allow` names them (legal but wasteful).
local OPT_IN = {}
for _, c in ipairs(conversions) do
  if c.opt_in then OPT_IN[c.name] = true end
end

--- mla.pair{prefill=name, decode=name, store=layout | kv_dtype="bf16"|"fp8", block_size=64, allow={...}}
-- `allow` opts into conversions that are legal but wasteful (dequant_pool).
-- -> a resolved pairing, or an error saying why the pair cannot work and
-- which conversion or stored layout would make it work.
-- With kv_dtype instead of store, the stored layout is the one the decode
-- backend reads natively for that dtype (decode runs every step; a
-- conversion belongs on the prefill side).
function backend.pair(o)
  local p, refusal = backend.resolve(o, 3)
  if not p then error("pair: " .. refusal.message, 2) end
  return p
end

--- backend.resolve(o): as backend.pair, but a pair no conversion can make
-- work returns nil and the refusal { phase, backend, stored, short, message,
-- hints } instead of raising (malformed arguments still raise).
function backend.resolve(o, level)
  level = level or 2
  if type(o) ~= "table" then error("pair: {prefill=, decode=, store= | kv_dtype=} expected", level) end
  require("mlalab.options").check("pair", o, PAIR_KEYS, level)
  if o.block_size ~= nil and (math.type(o.block_size) ~= "integer" or o.block_size < 1 or o.block_size > 0x7fffffff) then
    error(string.format("pair: block_size must be an integer in [1, 2^31 - 1], got %s", tostring(o.block_size)), level)
  end
  if o.allow ~= nil then
    if type(o.allow) ~= "table" then error("pair: allow must be a list of conversion names, got " .. type(o.allow), level) end
    for _, n in ipairs(o.allow) do
      if not OPT_IN[n] then
        local names = {}
        for k in pairs(OPT_IN) do names[#names + 1] = k end
        table.sort(names)
        error(string.format("pair: allow names '%s', which is no opt-in conversion (%s)", tostring(n),
          table.concat(names, ", ")), level)
      end
    end
  end
  local pre = backend.get(o.prefill or error("pair: prefill backend missing", level))
  local dec = backend.get(o.decode or error("pair: decode backend missing", level))
  if not pre.phases.prefill then error(string.format("pair: '%s' is not a prefill backend", pre.name), level) end
  if not dec.phases.decode then error(string.format("pair: '%s' is not a decode backend", dec.name), level) end
  local stored = o.store
  if not stored then
    local kv = o.kv_dtype or error("pair: give store=<layout name> or kv_dtype='bf16'|'fp8'", level)
    if kv == "bf16" or kv == "auto" then
      stored = "bf16"
    elseif kv == "fp8" then
      for _, l in ipairs(dec.read_list) do
        if l ~= "bf16" then stored = l break end
      end
      if not stored then
        error(string.format("pair: kv_dtype fp8 with decode backend '%s', which reads no fp8 layout (%s)", dec.name,
          table.concat(dec.read_list, ", ")), level)
      end
    else
      error(string.format("pair: unknown kv_dtype '%s' (bf16 or fp8; or name the layout with store=)", tostring(kv)), level)
    end
  end
  local layout = require "mlalab.layout"
  if not pcall(layout.get, stored) then error(string.format("pair: unknown stored layout '%s'", tostring(stored)), level) end
  local bs = o.block_size or 64
  local allow = {}
  for _, n in ipairs(o.allow or {}) do allow[n] = true end
  local p = setmetatable({ stored = stored, block_size = bs }, Pair)
  for _, ph in ipairs { { "prefill", pre }, { "decode", dec } } do
    local phase, b = ph[1], ph[2]
    local conv = find_conversion(stored, b, allow)
    if conv == false then return nil, why_not(stored, b, phase, allow) end
    local reads = conv and conv.to or stored
    p[phase] = {
      backend = b, conversion = conv, reads = reads, flat = conv and conv.flat or false,
      where = conv and conv.where[phase] or nil, topk = backend.topk_transform(b, conv),
    }
  end
  return p
end

--- Extra bytes moved per layer by conversions, for a pool of `pool_tokens`
-- cache tokens of which `ctx_tokens` are referenced by the prefill batch.
function Pair:extra_bytes(pool_tokens, ctx_tokens, decode_steps)
  local total, parts = 0, {}
  for _, phase in ipairs { "prefill", "decode" } do
    local ph = self[phase]
    local c = ph.conversion
    if c then
      local tin, tout = token_bytes(self.stored, self.block_size), token_bytes(c.to, self.block_size)
      local n = c.flat and ctx_tokens or pool_tokens
      local per = n * (tin + tout)
      local times = phase == "decode" and (decode_steps or 1) or 1
      parts[phase] = per * times
      total = total + per * times
    end
  end
  return total, parts
end

--- pair:describe() -> one line: the stored layout, and for each phase its backend, what it reads (after
-- which conversion, run where) and its top-k transform (also tostring(pair)).
function Pair:describe()
  local out = { string.format("stored %s", self.stored) }
  for _, phase in ipairs { "prefill", "decode" } do
    local ph = self[phase]
    out[#out + 1] = string.format("%s: %s reads %s%s, top-k %s", phase, ph.backend.name, ph.reads,
      ph.conversion and string.format(" after %s (per %s)", ph.conversion.name, ph.where) or "", ph.topk)
  end
  return table.concat(out, "; ")
end
Pair.__tostring = Pair.describe

--- pair:run{...}: runs both phases end to end against the CPU reference
-- (mlalab.pair_run); -> a result with ok, phases.prefill / phases.decode.
function Pair:run(o) return require("mlalab.pair_run").run(self, o) end

--- The run of every built-in: one attention call over the cache table the
-- phase reads (ctx.cache), sparse through ctx.indices or dense through
-- ctx.block_table and ctx.cache_lens, with mla.attention.decode (baked on a
-- GPU, the CPU reference on the CPU, or ctx.impl). -> out, lse.
-- ctx: q, cache, indices | block_table + cache_lens, impl, check, out, lse, scale.
function backend.attend(ctx)
  local a = { q = ctx.q, cache = ctx.cache, impl = ctx.impl, check = ctx.check, out = ctx.out, lse = ctx.lse,
    scale = ctx.scale }
  if ctx.indices then a.indices = ctx.indices else a.block_table, a.cache_lens = ctx.block_table, ctx.cache_lens end
  return require("mlalab.attention").decode(a)
end

-- Built-in backend contracts ---------------------------------------------------------

backend.register {
  name = "sparse_prefill_bf16", phases = { "prefill" }, reads = { "bf16" }, input = "flat_bf16", sparse = true,
  models = "FlashMLA flash_mla_sparse_fwd (sglang flashmla_sparse)", run = backend.attend,
  doc = "sparse prefill over flat bf16 rows [s_kv, 576]; indices are row ids, -1 invalid. On a bf16 pool the rows "
    .. "are the pool's slots (PAGED); on a quantized pool the requests' tokens are dequantized to ragged rows (RAGGED).",
}
backend.register {
  name = "sparse_kv_fp8", phases = { "prefill", "decode" }, reads = { "fp8_ds_mla" }, input = "paged", sparse = true,
  models = "FlashMLA flash_mla_with_kvcache sparse, FP8 656 B (sglang flashmla_kv)", run = backend.attend,
  doc = "sparse attention reading 656 B fp8_ds_mla pages through slot ids (page * page_size + offset).",
}
backend.register {
  name = "trtllm_fp8", phases = { "prefill", "decode" }, reads = { "fp8_pertensor", "bf16" }, input = "paged", sparse = true,
  models = "TensorRT-LLM gen MLA (sglang trtllm), 576 B fp8 with one tensor scale", run = backend.attend,
  doc = "sparse attention reading 576 B per-tensor fp8 (or bf16) pages through slot ids.",
}
backend.register {
  name = "dense_bf16", phases = { "prefill", "decode" }, reads = { "bf16" }, input = "paged", sparse = false,
  models = "a dense paged bf16 MLA kernel (FlashMLA dense decode / fa3)", run = backend.attend,
  doc = "dense attention over bf16 pages through a block table and cache lengths.",
}
backend.register {
  name = "dense_fp8_blocked", phases = { "decode" }, reads = { "fp8_ds_mla_blocked" }, input = "paged", sparse = false,
  models = "FlashMLA flash_mla_with_kvcache dense, V3.2 FP8 page-blocked 656 B", run = backend.attend,
  doc = "dense attention over FlashMLA's page-blocked 656 B fp8 pages (NoPE pieces, then scales, then RoPE) through "
    .. "a block table and cache lengths.",
}

return backend
