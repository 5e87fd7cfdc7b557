--- Tensor creation, seeds and printing. Tensors themselves live in the C core
-- (mlalab.Tensor userdata); this file adds the Lua-side conveniences.
return function(mla, core)
  local T = core.Tensor -- the methods table every tensor indexes

  -- Creation ---------------------------------------------------------------

  local function opts_of(a, b)
    if type(a) == "table" then return a end
    return { dtype = a, device = b }
  end

  --- mla.empty(shape, dtype|opts, device): uninitialised contiguous tensor.
  function mla.empty(shape, a, b) return core.empty(shape, opts_of(a, b)) end
  --- mla.zeros(shape, dtype|opts, device): a contiguous tensor of zeros (f32 on the default device by default)
  function mla.zeros(shape, a, b) return core.full(shape, 0, opts_of(a, b)) end
  --- mla.ones(shape, dtype|opts, device): a contiguous tensor of ones
  function mla.ones(shape, a, b) return core.full(shape, 1, opts_of(a, b)) end
  --- mla.full(shape, v, dtype|opts, device): a contiguous tensor with every element v
  function mla.full(shape, v, a, b) return core.full(shape, v, opts_of(a, b)) end
  --- mla.arange(n, dtype|opts, device): 0..n-1 (i64 by default)
  function mla.arange(n, a, b) return core.arange(n, opts_of(a, b)) end
  --- mla.tensor(nested table | number, dtype|opts, device)
  function mla.tensor(data, a, b) return core.tensor(data, opts_of(a, b)) end
  mla.is_tensor = core.is_tensor

  -- Seeds: every random call without an explicit seed takes the next one of
  -- a stream derived from the base seed, so a script is reproducible from
  -- MLALAB_SEED (or mla.manual_seed) alone.
  local base_seed = tonumber(os.getenv("MLALAB_SEED") or "") or 0x5eed
  local draws = 0
  --- mla.manual_seed(s): restart the seed stream from base seed s (an integer)
  function mla.manual_seed(s) base_seed, draws = math.tointeger(s) or error("manual_seed: integer expected"), 0 end
  --- mla.seed() -> the base seed (MLALAB_SEED, or the last manual_seed)
  function mla.seed() return base_seed end
  --- mla.next_seed() -> the stream's next seed (what a random call without `seed` takes)
  function mla.next_seed()
    draws = draws + 1
    -- splitmix64 step: distinct, well-mixed seeds for consecutive draws
    local z = base_seed + draws * 0x9E3779B97F4A7C15
    z = (z ~ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ~ (z >> 27)) * 0x94D049BB133111EB
    return z ~ (z >> 31)
  end

  local function rng(kind, shape, o, a_default, b_default, a_key, b_key)
    o = o or {}
    local seed = o.seed or mla.next_seed()
    return core.random(shape, kind, seed, o[a_key] or a_default, o[b_key] or b_default, o.dtype, o.device)
  end
  --- mla.rand(shape, {lo=0, hi=1, seed=, dtype="f32", device=})
  function mla.rand(shape, o) return rng("uniform", shape, o, 0.0, 1.0, "lo", "hi") end
  --- mla.randn(shape, {mean=0, std=1, seed=, dtype="f32", device=})
  function mla.randn(shape, o) return rng("normal", shape, o, 0.0, 1.0, "mean", "std") end
  --- mla.random_bytes(shape, {seed=, dtype="u8", device=}): raw random bits in every element
  function mla.random_bytes(shape, o) return rng("bits", shape, o, 0, 0, "_", "_") end

  --- t:uniform_(lo = 0, hi = 1[, seed]) -> t, the view filled in place with uniform draws in [lo, hi)
  function T:uniform_(lo, hi, seed) return self:random_("uniform", seed or mla.next_seed(), lo or 0, hi or 1) end
  --- t:normal_(mean = 0, std = 1[, seed]) -> t, the view filled in place with normal draws
  function T:normal_(mean, std, seed) return self:random_("normal", seed or mla.next_seed(), mean or 0, std or 1) end
  --- t:random_bytes_([seed]) -> t, every element's bits random (NaN and inf among them for float dtypes)
  function T:random_bytes_(seed) return self:random_("bits", seed or mla.next_seed()) end
  --- t:zero_() -> t, every element set to 0
  function T:zero_() return self:fill(0) end
  --- t:cpu() -> t:to("cpu")
  function T:cpu() return self:to("cpu") end
  --- t:cuda([n]) -> t:to("cuda:n"), or to the first GPU
  function T:cuda(n) return self:to(n and ("cuda:" .. n) or "cuda") end
  --- t:float() -> t:to("f32")
  function T:float() return self:to("f32") end
  --- t:double() -> t:to("f64")
  function T:double() return self:to("f64") end
  --- t:save_npy(path): mla.npy.save(path, t)
  function T:save_npy(path) return mla.npy.save(path, self) end

  -- Devices ------------------------------------------------------------------

  --- mla.device() -> the default device: "cpu" or "cuda:N" (--device, MLALAB_DEVICE, else cuda:0 when usable)
  function mla.device() return core.default_device() end
  --- mla.set_device(d): the default device from now on ("cpu", "cuda", "cuda:N")
  function mla.set_device(d) core.set_default_device(d) end
  --- mla.has_cuda() -> true when a CUDA device is usable
  function mla.has_cuda() return core.device_count() > 0 end
  --- mla.synchronize([device]): wait for the device's work (a fault raises naming the kernel)
  function mla.synchronize(d) core.synchronize(d) end
  mla.device_props = core.device_props
  mla.dtype_info = core.dtype_info

  -- Printing: a short torch-like summary ------------------------------------

  local function fmt_num(v, is_float)
    if not is_float then return string.format("%d", v) end
    if v ~= v then return "nan" end
    if v == math.huge then return "inf" elseif v == -math.huge then return "-inf" end
    return string.format("%.4g", v)
  end

  local function list(t) return "[" .. table.concat(t, ", ") .. "]" end

  --- Values shown: up to 3 at each end of the flattened tensor.
  local function preview(t)
    local n = t:numel()
    if n == 0 then return "[]" end
    local info = core.dtype_info(t.dtype)
    local flat = t:reshape({ n })
    local parts, show = {}, 3
    local function at(i) return fmt_num(flat:get({ i }), info.is_float) end
    if n <= 2 * show then
      for i = 0, n - 1 do parts[#parts + 1] = at(i) end
    else
      for i = 0, show - 1 do parts[#parts + 1] = at(i) end
      parts[#parts + 1] = "..."
      for i = n - show, n - 1 do parts[#parts + 1] = at(i) end
    end
    return list(parts)
  end

  core.Tensor_mt.__tostring = function(t)
    if t:is_closed() then return "tensor(closed)" end
    local s = string.format("tensor(%s, %s, %s", t.dtype, list(t:size()), t.device)
    if not t:is_contiguous() or t:offset() ~= 0 then
      s = s .. string.format(", strides=%s, offset=%d", list(t:stride()), t:offset())
    end
    local ok, p = pcall(preview, t)
    return s .. ") " .. (ok and p or "<" .. tostring(p) .. ">")
  end
  core.Tensor_mt.__len = function(t) return t:dim() > 0 and t:size(0) or 0 end
  core.Tensor_mt.__name = "mlalab.Tensor"
end
