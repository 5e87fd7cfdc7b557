-- The built-in layouts' descriptors baked into the nvcc kernels
-- (kernels_rtc/include/mla/builtin_layouts.h) are generated from the Lua
-- definitions and committed so the build needs no interpreter; this spec is
-- what keeps the two from drifting apart.
local mla = require "mlalab"
local rtc_layout = require "mlalab.rtc_layout"

describe("builtin_layouts.h", function()
  it("is what scripts/gen-layouts generates from lua/mlalab/layout_builtins.lua", function()
    local f = assert(io.open(rtc_layout.BUILTINS_HEADER, "rb"))
    local committed = f:read("a")
    f:close()
    local fresh = mla.rtc.builtins_header()
    if committed ~= fresh then
      error(rtc_layout.BUILTINS_HEADER .. " is stale: run scripts/gen-layouts and commit it", 0)
    end
  end)

  it("lists every built-in layout with its block-64 descriptor numbers", function()
    local text = mla.rtc.builtins_header()
    for _, spec in ipairs(require "mlalab.layout_builtins") do
      local L = mla.layout.get(spec.name)
      local d = L:desc(64)
      local init = text:match("#define MLA_BUILTIN_DESC_" .. spec.name .. " (.-)\n\n")
      assert.is_truthy(init, spec.name)
      assert.is_truthy(init:find("/* page_bytes */ " .. math.tointeger(d.page_bytes) .. "LL", 1, true), spec.name)
      -- MLA_BUILTIN_LAYOUTS lists the built-ins whose rows are whole, MLA_BUILTIN_LAYOUTS_ALL every one
      local chunked = false
      for r = 1, d.nregions do chunked = chunked or d.region_chunk[r] > 0 end
      local whole = text:match("#define MLA_BUILTIN_LAYOUTS%(X%)(.-)\n#define")
      local all = text:match("#define MLA_BUILTIN_LAYOUTS_ALL%(X%)(.-)\n\n")
      local x = "X(" .. spec.name .. ", MLA_BUILTIN_DESC_" .. spec.name .. ")"
      assert.equal(not chunked, whole:find(x, 1, true) ~= nil, spec.name)
      assert.is_truthy(all:find(chunked and x or "MLA_BUILTIN_LAYOUTS(X)", 1, true), spec.name)
      assert.is_truthy(init:find("/* region_chunk */ {" .. table.concat(d.region_chunk, ", "), 1, true), spec.name)
    end
  end)

  it("compiles with NVRTC as built-in types whose equality is a constant expression", function()
    local src = [[
#include "mla/builtin_spec.cuh"
#include "mla/layout_match.h"
MLA_BUILTIN_LAYOUTS(MLA_BUILTIN_SPEC)
static_assert(mla_layout_desc_same(&spec_fp8_v4::host, &spec_fp8_v4_vllm::host, 1), "same bytes for readers");
static_assert(!mla_layout_desc_same(&spec_fp8_v4::host, &spec_fp8_v4_vllm::host, 0), "different eps placement");
static_assert(!mla_layout_desc_same(&spec_fp8_ds_mla::host, &spec_fp8_v4::host, 1), "different layouts");
extern "C" __global__ void probe(long long *o) { o[0] = spec_fp8_ds_mla::d().page_bytes; }
]]
    local m = mla.rtc.compile { source = src, name = "builtin_layouts_probe.cu", arch = "sm_90a" }
    assert.is_truthy(m)
  end)
end)
