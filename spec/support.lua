--- Helpers shared by specs. Every helper asserts something or returns data;
-- none hides a failure.
local mla = require "mlalab"
local S = {}

S.has_gpu = mla.has_cuda() and os.getenv("MLALAB_DEVICE") ~= "cpu"

--- Devices to run a behaviour on: always cpu, plus cuda when usable.
function S.devices()
  local d = { "cpu" }
  if S.has_gpu then d[#d + 1] = "cuda" end
  return d
end

--- Asserts that fn raises an error whose message contains `pattern` (plain text).
function S.assert_error_contains(fn, pattern)
  local ok, err = pcall(fn)
  assert(not ok, "expected an error containing '" .. pattern .. "', but the call succeeded")
  err = tostring(err)
  assert(err:find(pattern, 1, true), "error '" .. err .. "' does not contain '" .. pattern .. "'")
  return err
end

--- Flattened values of a tensor as a Lua array.
function S.values(t)
  local flat = t:contiguous():reshape({ t:numel() })
  return flat:totable()
end

return S
