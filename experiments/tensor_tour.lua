--- A tour of the tensor API on the default device (cuda:0 when a GPU is
-- usable, else cpu). Run: mlalab experiments/tensor_tour.lua
local mla = require "mlalab"

local dev = mla.device()
print("default device: " .. dev)

-- A paged bf16 MLA cache: 4 pages of 64 tokens, 576 values per token.
local cache = mla.randn({ 4, 64, 576 }, { dtype = "bf16", device = dev, seed = 1 })
print("cache        ", cache)

-- Views cost nothing: page 2, tokens 8..15, the 64 RoPE dims.
local rope = cache:select(0, 2):narrow(0, 8, 8):narrow(1, 512, 64)
print("rope view    ", rope)

-- A cross-layer buffer: (blocks, layers, tokens, 576); layer 1 as a strided view.
local xl = mla.zeros({ 4, 3, 64, 576 }, "bf16", dev)
local layer1 = xl:select(1, 1)
print("layer 1 view ", layer1)
layer1:copy(cache)
assert(layer1:equal(cache), "layer view round trip")
assert(xl:select(1, 0):equal(mla.zeros({ 4, 64, 576 }, "bf16", dev)), "neighbour layer untouched")
print("copied the cache into layer 1; layers 0 and 2 still zero")

-- Narrow formats convert bit-exactly (round to nearest even, saturating fp8).
local x = mla.tensor({ 0.1, 1.0, 300.0, 500.0, -1e-9 }, "f32", dev)
print("f32 -> e4m3  ", x:to("e4m3"))
print("f32 -> e2m1  ", mla.tensor({ 0.3, 0.75, 2.5, 5.0, 7.0, -1.25 }, "f32", dev):to("e2m1"))

-- Bytes can be reinterpreted: a 656-byte V3.2 token row holds 4 fp32 scales at 512.
local row = mla.zeros({ 2, 656 }, "u8", dev)
local scales = row:narrow(1, 512, 16):view("f32")
scales:fill(0.5)
print("scale view   ", scales)

-- The same seed draws the same numbers on every device.
local a = mla.randn({ 1000 }, { seed = 7, device = "cpu" })
local b = mla.randn({ 1000 }, { seed = 7, device = dev })
assert(a:equal(b:cpu()), "seeded draws must agree across devices")
print("seed 7 gives identical draws on cpu and " .. dev)
print("tensor tour: ok")
