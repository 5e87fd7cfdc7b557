--- numpy .npy files: mla.npy.load, mla.npy.save, mla.npy.header.
-- Headers v1.0, v2.0 and v3.0, little-endian, any shape (0-d and zero-size
-- too); fortran-order files load transposed back into C order. Narrow
-- formats travel as raw words: bf16 as '<u2', fp8/ue8m0 as '|u1', e2m1 as
-- '|u1' holding two codes per byte (even element in the low nibble, the last
-- dim halved). On load, `as` names the format those words hold; ml_dtypes'
-- files ('<V2' bfloat16, '<V1' float8/float4... , '<f1' float8_e5m2) need it too.
local core = require "mlalab.core"

local npy = {}

local function check_path(fn, path)
  if type(path) ~= "string" then
    error(string.format("npy.%s: path must be a string, got %s", fn, type(path)), 3)
  end
end

local load_options = { as = true, device = true }

-- Calls a core function; its error is raised again at the caller's line
-- (callers must not tail-call this, or that line is lost).
local function call(fn, ...)
  local ok, r = pcall(fn, ...)
  if not ok then error(r, 3) end
  return r
end

--- mla.npy.load(path, {as = "bf16" | "e4m3" | ..., device = "cpu" | "cuda:N"}) -> tensor
-- `as` may also be given directly: mla.npy.load(path, "bf16"). The tensor
-- lands on `device`, by default mlalab's default device.
function npy.load(path, opts)
  check_path("load", path)
  if type(opts) == "string" then opts = { as = opts } end
  opts = opts or {}
  if type(opts) ~= "table" then error("npy.load: options must be a table {as=, device=} or a dtype name, got " .. type(opts), 2) end
  for k in pairs(opts) do
    if not load_options[k] then
      error(string.format("npy.load: unknown option '%s' (expected as=, device=)", tostring(k)), 2)
    end
  end
  if opts.as ~= nil and type(opts.as) ~= "string" then
    error("npy.load: as must be a dtype name such as 'bf16', got " .. type(opts.as), 2)
  end
  local t = call(core.npy_load, path, opts.as, opts.device)
  return t
end

--- mla.npy.save(path, tensor): C order, any device or strides (a
-- contiguous CPU copy is written); narrow formats as raw words.
function npy.save(path, t)
  check_path("save", path)
  if not core.is_tensor(t) then error("npy.save: a tensor is expected as argument 2, got " .. type(t), 2) end
  call(core.npy_save, path, t)
  return t
end

--- mla.npy.header(path) -> {descr=, fortran_order=, shape=, version=, data_offset=, data_bytes=}
function npy.header(path)
  check_path("header", path)
  local h = call(core.npy_header, path)
  return h
end

--- The npy descr a dtype is saved with.
npy.descr = {
  u8 = "|u1", i8 = "|i1", u16 = "<u2", i16 = "<i2", i32 = "<i4", i64 = "<i8",
  f16 = "<f2", f32 = "<f4", f64 = "<f8", bf16 = "<u2",
  e4m3 = "|u1", e5m2 = "|u1", ue8m0 = "|u1", e2m1 = "|u1",
}

return npy
