-- Loaded once before the specs (see .busted). Shared test utilities live in
-- spec/support.lua; this file only makes sure the library loads cleanly.
local mla = require "mlalab"
assert(mla.version, "mlalab did not load")

-- Specs name their devices: tensors created without one are on the CPU, on
-- every machine, so a CPU spec checks the same thing in CI and on a GPU box.
-- GPU specs (#gpu) ask for "cuda" explicitly.
mla.set_device("cpu")
