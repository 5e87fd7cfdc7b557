-- Quantize-and-cache variants specialized at compile time on the built-in
-- layouts (src/kernels/kv_write_spec.cuh): for every built-in layout, a write
-- with specialization on runs the built-in's variant, a write with it off runs
-- the generic kernel, and both caches are bit-identical to the CPU reference
-- (mla.kernels.write on cpu, src/ref/). Inputs carry NaNs (several per group,
-- with payloads and signs: the f32 scales keep the first one's bits), +-inf,
-- all-zero and all-minus-zero groups, subnormal and near-max bf16 magnitudes,
-- a huge value among tiny ones; slot mappings with -1 entries, padded rows,
-- i32 and i64 slots, whole rows and k_nope + k_rope slices of a wider
-- projection, writes into layer 30 of a 61-layer block-major cache whose other
-- layers must stay zero. Descriptors or addresses the variants do not take
-- (another block size, source rows not 16-byte aligned) run the generic kernel.
local mla = require "mlalab"
local S = require "support"
local assert_bytes, perm = S.assert_bytes, S.perm
local K = mla.kernels

local BS = 64 -- the block size of the built-in descriptors (builtin_layouts.h)
local LAYER, LAYERS = 30, 61

-- bf16 bit patterns of n rows of dim values: random magnitudes, and every
-- token class below in turn. Returns the rows as a CPU bf16 tensor.
local NAN_A, NAN_B, NEG_NAN = 0x7FC1, 0x7FA5, 0xFFB3
local function special_rows(n, dim)
  local base = S.values(mla.randn({ n, dim }):to("bf16"):view("u16"))
  local function at(t, d) return t * dim + d + 1 end
  local function rnd(lo, hi) return math.random(lo, hi) end
  for t = 0, n - 1 do
    local kind = t % 12
    local g16 = 16 * rnd(0, dim // 16 - 1) -- a 16-dim span inside one group of every built-in
    if kind == 1 then -- NaNs: the first in dim order is the group's amax (payload kept in f32 scales)
      local d = rnd(0, dim - 9)
      base[at(t, d)] = NAN_A
      base[at(t, d + rnd(1, 8))] = NAN_B
      base[at(t, rnd(0, dim - 1))] = NEG_NAN
    elseif kind == 2 then -- a negative NaN first, in the last dims too (RoPE / bf16 copies)
      base[at(t, g16 + 3)] = NEG_NAN
      base[at(t, g16 + 9)] = NAN_A
      base[at(t, dim - 1)] = NAN_B
    elseif kind == 3 then -- infinities
      base[at(t, rnd(0, dim - 1))] = 0x7F80
      base[at(t, rnd(0, dim - 1))] = 0xFF80
    elseif kind == 4 then -- zeros in whole groups (and -0 in others)
      for d = 0, math.min(127, dim - 1) do base[at(t, d)] = 0 end
      for d = g16, g16 + 15 do base[at(t, d)] = 0x8000 end
    elseif kind == 5 then -- subnormal magnitudes only
      for d = 0, dim - 1 do base[at(t, d)] = rnd(0, 0x7F) | (rnd(0, 1) << 15) end
    elseif kind == 6 then -- near the bf16 maximum
      for d = 0, dim - 1 do base[at(t, d)] = (rnd(0x7EF0, 0x7F7F)) | (rnd(0, 1) << 15) end
    elseif kind == 7 then -- one huge value among tiny ones (scales clamp, quotients saturate or flush)
      for d = 0, dim - 1 do base[at(t, d)] = rnd(0x0080, 0x0800) | (rnd(0, 1) << 15) end
      base[at(t, g16 + rnd(0, 15))] = 0x7F00
    elseif kind == 8 then -- large and small normal magnitudes mixed
      for d = 0, dim - 1 do base[at(t, d)] = rnd(0x2000, 0x6000) | (rnd(0, 1) << 15) end
    elseif kind == 9 then -- values on e4m3 / e2m1 rounding boundaries after pow2 scales
      for d = 0, dim - 1 do base[at(t, d)] = (0x3F00 + 0x10 * rnd(0, 15) + 8) | (rnd(0, 1) << 15) end
    end
  end
  return mla.tensor(base, "u16"):view("bf16"):reshape({ n, dim })
end

-- Layer LAYER of a 61-layer block-major cache on the GPU, zeroed, every other byte zero too.
local function gpu_layer(L, nb, bs, scale, layers, layer)
  layers, layer = layers or LAYERS, layer or LAYER
  local c = mla.cache.new { layout = L, num_blocks = nb, block_size = bs, num_layers = layers, order = "block_major",
    device = "cuda", tensor_scale = scale }
  local v = c:view(layer)
  v.pages:fill(0)
  c:poison(layer, "zeros")
  return v, c
end

local function cpu_pool(L, nb, bs, scale)
  local c = mla.cache.new { layout = L, num_blocks = nb, block_size = bs, device = "cpu", tensor_scale = scale }
  local v = c:view(0)
  v.pages:fill(0)
  return v
end

-- Writes with specialization on and off into two GPU caches and on the CPU;
-- asserts both GPU caches equal the CPU's bytes, the variants that ran, and
-- that no byte outside the written slots of the layer changed.
local function check_write(L, o)
  local nb, bs, layer = o.nb or 8, o.bs or BS, o.layer or LAYER
  local n = o.n or (nb * bs - 37)
  local p, sl = perm(nb * bs), {}
  if o.consecutive then
    -- slots in page order from an odd start, so sets of 4 tokens straddle pages, with a hole now and then:
    -- the staged variants copy runs of consecutive slots out as one range of whole sectors
    n = math.min(n, nb * bs - 5)
    for i = 1, n do sl[i] = (i % 41 == 7) and -1 or (i + 4) end
  else
    for i = 1, n do sl[i] = (i % 9 == 4) and -1 or p[i] end
  end
  local idt = o.i32 and "i32" or "i64"
  local rows = o.rows or special_rows(n + 3, L.dim) -- 3 padding rows past the slot mapping
  local ref = cpu_pool(L, nb, bs, o.scale)
  local src = o.src or function(r) return r end
  local a, b = src(rows)
  K.write(ref, mla.tensor(sl, idt), a, b)
  local variants = {}
  for _, spec in ipairs { true, false } do
    local g, c = gpu_layer(L, nb, bs, o.scale, o.layers, layer)
    local rg = rows:cuda()
    local ga, gb = src(rg)
    local was = K.specialize(spec)
    local ok, err = pcall(K.write, g, mla.tensor(sl, idt, "cuda"), ga, gb)
    K.specialize(was)
    assert(ok, err)
    variants[#variants + 1] = K.last_variant()
    assert_bytes(g.pages:cpu(), ref.pages, string.format("%s, specialization %s", L.name, spec and "on" or "off"))
    assert.is_nil(c:check_bleed(layer, { slots = sl }))
  end
  return variants[1], variants[2], ref
end

-- Run by the looping-grid case in a child process (arg[1]: the device): writes 60000+ tokens (several rounds of
-- an H100's resident warps, and a partial one) of four layouts with their specialized variants, checks the bytes
-- against the CPU reference and prints the variants that ran.
local LOOPING_WRITE_CHILD = [[
package.path = "./spec/?.lua;" .. package.path -- busted's lpath: the specs run from the checkout's root
local mla = require "mlalab"
local S = require "support"
local K = mla.kernels
local dev = arg[1] or "cuda"
mla.set_device("cpu") -- the binary defaults to the GPU when it has one; the references stay on the CPU
local ran = {}
for li, name in ipairs { "fp4_v41", "fp8_ds_mla", "indexer_fp8", "bf16" } do
  math.randomseed(0x9157 + li)
  mla.manual_seed(0x9157 + li)
  local L = mla.layout.get(name)
  local n = 60000 + math.random(1, 999)
  local nb = (n + 100) // 64
  local order, sl = S.perm(nb * 64), {}
  for i = 1, n do sl[i] = (i % 9 == 4) and -1 or order[i] end
  local rows = mla.randn({ n, L.dim }):to("bf16")
  local function pool(d)
    local c = mla.cache.new { layout = L, num_blocks = nb, block_size = 64, device = d, tensor_scale = 1.25 }
    local v = c:view(0)
    v.pages:fill(0)
    return v
  end
  local ref, got = pool("cpu"), pool(dev)
  K.write(ref, mla.tensor(sl, "i64"), rows)
  K.write(got, mla.tensor(sl, "i64", dev), rows:to(dev))
  ran[#ran + 1] = K.last_variant()
  S.assert_bytes(got.pages:cpu(), ref.pages, name)
end
print(table.concat(ran, " "))
]]

describe("specialized quantize-and-cache variants #gpu", function()
  local names = mla.layout.builtins()

  it("cover every built-in layout", function()
    local want = { "bf16", "fp8_pertensor", "fp8_ds_mla", "fp8_ds_mla_amax", "fp8_ds_mla_blocked", "fp8_v4", "fp8_v4_vllm",
      "indexer_fp8", "indexer_fp8_ue8m0", "fp4_v41", "fp8_v41" }
    local have = {}
    for _, n in ipairs(names) do have[n] = true end
    for _, n in ipairs(want) do assert.is_true(have[n], n .. " is a built-in layout") end
  end)

  for li, name in ipairs(names) do
    it(name .. ": whole rows with NaN / inf / zero / subnormal / huge groups, bit-identical on and off", function()
      math.randomseed(0x5157 + li)
      mla.manual_seed(0x5157 + li)
      local L = mla.layout.get(name)
      local on, off, ref = check_write(L, { scale = 0.75, i32 = li % 2 == 0 })
      assert.equal(name, on)
      assert.equal("generic", off)
      local nonzero = 0
      for _, x in ipairs(S.values(ref.pages:narrow(0, 0, 1))) do if x ~= 0 then nonzero = nonzero + 1 end end
      assert.is_true(nonzero > 1000, "the reference wrote the first page")
    end)

    it(name .. ": consecutive slots across page boundaries (whole-range copies), bit-identical on and off", function()
      math.randomseed(0x7157 + li)
      mla.manual_seed(0x7157 + li)
      local L = mla.layout.get(name)
      local on, off = check_write(L, { scale = 1.5, consecutive = true })
      assert.equal(name, on)
      assert.equal("generic", off)
    end)

    it(name .. ": k_nope + k_rope slices of a wider projection, power-of-two tensor scale", function()
      math.randomseed(0x6157 + li)
      mla.manual_seed(0x6157 + li)
      local L = mla.layout.get(name)
      local dim = L.dim
      local split = dim > 128 and dim - 64 or 64
      local W = dim + 128 -- row stride 2 * W bytes: 16-byte aligned
      local src = function(r)
        local wide = mla.zeros({ r:size(0), W }, "bf16", r.device)
        wide:narrow(1, 0, split):copy(r:narrow(1, 0, split))
        wide:narrow(1, dim + 32, dim - split):copy(r:narrow(1, split, dim - split))
        return wide:narrow(1, 0, split), wide:narrow(1, dim + 32, dim - split)
      end
      local on, off = check_write(L, { src = src, scale = 0.5, nb = 5, n = 250, i32 = li % 2 == 1 })
      assert.equal(name, on)
      assert.equal("generic", off)
    end)
  end

  -- The writes above fill less than one round of the persistent grid (a tile
  -- for every resident warp); here several rounds on an H100-sized grid and a
  -- partial last one, special rows at both ends.
  for li, name in ipairs(names) do
    it(name .. ": whole rounds and a partial last round (60000+ tokens), bit-identical on and off", function()
      math.randomseed(0x8157 + li)
      mla.manual_seed(0x8157 + li)
      local L = mla.layout.get(name)
      local n = 60000 + math.random(1, 999)
      local rows = mla.randn({ n + 3, L.dim }):to("bf16")
      rows:narrow(0, 0, 240):copy(special_rows(240, L.dim))
      rows:narrow(0, n - 237, 240):copy(special_rows(240, L.dim))
      local on, off = check_write(L, { rows = rows, n = n, nb = (n + 100) // BS, scale = 1.25, layers = 3, layer = 1,
        i32 = li % 2 == 1 })
      assert.equal(name, on)
      assert.equal("generic", off)
    end)
  end

  -- The default grid gives each warp one tile; MLALAB_KV_WRITE_GRID=k launches k x the resident blocks, whose
  -- warps loop over the tiles (slot ids one tile ahead, bf16's cp.async prefetch of the next tile). The knob is
  -- read once per process, so each setting runs in a child process of this binary.
  it("the looping grids (MLALAB_KV_WRITE_GRID=1, 2) write what the CPU reference writes", function()
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write(LOOPING_WRITE_CHILD)
    f:close()
    for _, g in ipairs { "1", "2" } do
      local r = mla.core.spawn { argv = { S.BIN, script, "cuda" }, env = { "MLALAB_KV_WRITE_GRID=" .. g }, input = "",
        timeout = 300 }
      assert(r.exit_code == 0, string.format("MLALAB_KV_WRITE_GRID=%s: exit %d, stderr: %s", g, r.exit_code, r.stderr))
      assert.equal("fp4_v41 fp8_ds_mla indexer_fp8 bf16\n", r.stdout)
    end
    os.remove(script)
  end)

  it("source rows that are not 16-byte aligned, or another block size, run the generic kernel (same bytes)", function()
    math.randomseed(0x7157)
    mla.manual_seed(0x7157)
    local L = mla.layout.get("fp8_ds_mla")
    local odd = function(r) -- rows at a 2-byte offset with an odd row stride
      local wide = mla.zeros({ r:size(0), L.dim + 3 }, "bf16", r.device)
      wide:narrow(1, 1, L.dim):copy(r)
      return wide:narrow(1, 1, L.dim)
    end
    local on = check_write(L, { src = odd, nb = 3, n = 150 })
    assert.equal("generic", on)
    local on2 = check_write(mla.layout.get("fp4_v41"), { bs = 16, nb = 6, n = 80 })
    assert.equal("generic", on2)
  end)

  it("a slot past the cache is skipped, counted and reported; the other tokens are written", function()
    local L = mla.layout.get("fp8_v4")
    local g = gpu_layer(L, 2, BS)
    local rows = special_rows(4, L.dim)
    S.assert_error_contains(function()
      K.write(g, mla.tensor({ 5, 2 * BS + 3, -1, 127 }, "i64", "cuda"), rows:cuda())
    end, "1 out-of-range indices were skipped")
    assert.equal("fp8_v4", K.last_variant())
    -- tokens 0 and 3 landed (row 3 went to slot 127 in the GPU call, row 2 in the reference)
    local want = cpu_pool(L, 2, BS)
    K.write(want, mla.tensor({ 5, -1, -1, 127 }, "i64"), rows)
    assert_bytes(g.pages:cpu(), want.pages, "valid tokens written")
  end)
end)
