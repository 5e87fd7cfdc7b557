--- Helpers shared by specs. Every helper asserts something or returns data;
-- none hides a failure.
local mla = require "mlalab"
local S = {}

S.has_gpu = mla.has_cuda() and os.getenv("MLALAB_DEVICE") ~= "cpu"

-- The mlalab binary running the specs, for child processes.
S.BIN = (package.loaded["mlalab.paths"] or {}).exe or os.getenv("MLALAB_BIN") or "./build/mlalab"

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

--- Inside a describe block of #gpu specs: tensors created without a device
-- go to `dev` (spec/helper.lua makes the CPU the default everywhere else).
-- busted's hooks live in the spec file's environment, so the file passes them:
--   S.on_device("cuda", before_each, after_each)
function S.on_device(dev, before_each, after_each)
  local prev
  before_each(function()
    prev = mla.device()
    mla.set_device(dev)
  end)
  after_each(function() mla.set_device(prev) end)
end

--- Flattened values of a tensor as a Lua array.
function S.values(t)
  local flat = t:contiguous():reshape({ t:numel() })
  return flat:totable()
end

--- Asserts two tensors hold the same bytes; names the first differing byte.
function S.assert_bytes(a, b, what)
  local x, y = mla.core.tensor_bytes(a), mla.core.tensor_bytes(b)
  assert(#x == #y, string.format("%s: %d bytes vs %d", what, #x, #y))
  if x ~= y then
    for i = 1, #x do
      if x:byte(i) ~= y:byte(i) then
        error(string.format("%s: first difference at byte %d of %d: 0x%02x vs 0x%02x", what, i - 1, #x, x:byte(i),
          y:byte(i)), 2)
      end
    end
  end
end

--- A 0-based permutation of [0, n) drawn with math.random.
function S.perm(n)
  local p = {}
  for i = 1, n do p[i] = i - 1 end
  for i = n, 2, -1 do
    local j = math.random(i)
    p[i], p[j] = p[j], p[i]
  end
  return p
end

--- What FlashMLA's tests put in unused block-table entries.
S.GARBAGE = 2147480000

--- A random batch for the dense gather: lengths (some 0), starts, a permuted
-- block table with garbage past each request's pages.
function S.dense_batch(nb, bs, B, with_starts)
  local p = S.perm(nb)
  local lens, starts, cu, bt, used = {}, {}, { 0 }, {}, 1
  local cols = 0
  for r = 1, B do
    lens[r] = (r % 4 == 2) and 0 or math.random(0, 2 * bs + 3)
    starts[r] = with_starts and math.random(0, bs + 2) or 0
    cu[r + 1] = cu[r] + lens[r]
    cols = math.max(cols, (starts[r] + lens[r] + bs - 1) // bs)
  end
  cols = cols + 1
  for r = 1, B do
    bt[r] = {}
    local need = (starts[r] + lens[r] + bs - 1) // bs
    for j = 1, cols do
      if j <= need then
        bt[r][j] = p[(used - 1) % nb + 1]
        used = used + 1
      else
        bt[r][j] = S.GARBAGE
      end
    end
  end
  -- the slot each output row must come from
  local slots = {}
  for r = 1, B do
    for i = 0, lens[r] - 1 do
      local pos = starts[r] + i
      slots[#slots + 1] = bt[r][pos // bs + 1] * bs + pos % bs
    end
  end
  return { bt = bt, cu = cu, starts = starts, slots = slots, total = cu[B + 1] }
end

return S
