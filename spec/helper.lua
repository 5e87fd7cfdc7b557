-- Loaded once before the specs (see .busted). Shared test utilities live in
-- spec/support.lua; this file only makes sure the library loads cleanly.
local mla = require "mlalab"
assert(mla.version, "mlalab did not load")
