--- mlalab: the Lua library behind `local mla = require "mlalab"`.
-- The C core (mlalab.core) holds tensors, devices and kernels; the modules
-- under lua/mlalab/ hold everything a researcher reads and extends.
local core = require "mlalab.core"

local mla = {}
mla.core = core
mla.version = core.version

require("mlalab.tensor")(mla, core)

-- Submodules load on first use: `mla.layout`, `mla.cache`, `mla.compare`...
local submodules = {
  layout = "mlalab.layout", cache = "mlalab.cache", kernels = "mlalab.kernels", rtc = "mlalab.rtc",
  compare_mod = "mlalab.compare", bench_mod = "mlalab.bench", backend = "mlalab.backend", npy = "mlalab.npy",
  sweep_mod = "mlalab.sweep", isolate_mod = "mlalab.isolate", cli = "mlalab.cli",
}
-- Entry points of the harness, defined here so the modules load on first call.
local function entry(mod, fn) return function(...) return mla[mod][fn](...) end end
mla.compare, mla.assert_close = entry("compare_mod", "compare"), entry("compare_mod", "assert_close")
mla.equivalence, mla.assert_equivalent = entry("compare_mod", "equivalence"), entry("compare_mod", "assert_equivalent")
mla.bench, mla.ab = entry("bench_mod", "bench"), entry("bench_mod", "ab")
mla.sweep = entry("sweep_mod", "sweep")

setmetatable(mla, {
  __index = function(t, k)
    local name = submodules[k]
    if not name then return nil end
    local m = require(name)
    rawset(t, k, m)
    return m
  end,
})

return mla
