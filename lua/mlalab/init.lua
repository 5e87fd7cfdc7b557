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
