--- mlalab: the Lua library behind `local mla = require "mlalab"`.
-- The C core (mlalab.core) holds tensors, devices and kernels; the modules
-- under lua/mlalab/ hold everything a researcher reads and extends.
local core = require "mlalab.core"

local mla = {}
mla.core = core
mla.version = core.version

require("mlalab.tensor")(mla, core)

-- Submodules load on first use: `mla.layout` is require "mlalab.layout", and
-- so for every file under lua/mlalab/. A few names differ from their module
-- because the plain name is an entry point (mla.compare is a function).
local renamed = {
  compare_mod = "mlalab.compare", bench_mod = "mlalab.bench", sweep_mod = "mlalab.sweep",
  isolate_mod = "mlalab.isolate",
}
local function module_of(k)
  if renamed[k] then return renamed[k] end
  if type(k) ~= "string" or not k:match("^[%a_][%w_]*$") then return nil end
  local name = "mlalab." .. k
  if package.loaded[name] or package.searchpath(name, package.path) then return name end
  return nil
end
-- Entry points of the harness, defined here so the modules load on first call.
local function entry(mod, fn) return function(...) return mla[mod][fn](...) end end
mla.compare, mla.assert_close = entry("compare_mod", "compare"), entry("compare_mod", "assert_close")
mla.equivalence, mla.assert_equivalent = entry("compare_mod", "equivalence"), entry("compare_mod", "assert_equivalent")
mla.bench, mla.ab = entry("bench_mod", "bench"), entry("bench_mod", "ab")
mla.sweep = entry("sweep_mod", "sweep")
mla.pair = entry("backend", "pair")

setmetatable(mla, {
  __index = function(t, k)
    local name = module_of(k)
    if not name then return nil end
    local m = require(name)
    rawset(t, k, m)
    return m
  end,
})

return mla
