// Compile-time views of the built-in layouts for the specialized decode
// kernels (attn_slice_spec.cuh for 16-row tiles, attn_decode_wg.cuh's
// compiled-in dequant): the descriptors as types (from builtin_layouts.h;
// selected in attn_decode.cu by mla_layout_desc_same, never by name), and how
// each 8-dim chunk of K is rebuilt from a stage row (kind, byte offset, scale
// offset), evaluated at compile time, so the kernels' loops are straight-line
// code with immediate offsets. Page / token strides, region base offsets of
// the view and the tensor scale stay runtime.
#ifndef MLA_ATTN_SPEC_LAYOUTS_CUH
#define MLA_ATTN_SPEC_LAYOUTS_CUH

#include <utility>

#include "attn_decode_kernel.cuh"
#include "mla/builtin_spec.cuh"

namespace mla_attn_spec {

enum spec_kind { SK_ZERO, SK_COPY, SK_FP8_ONE, SK_FP8_TENSOR, SK_FP8_F32, SK_FP8_UE8M0, SK_BAD };

struct spec_chunk {
  int kind, src, scale_src, esize;
};

// Byte offset of region r's token row in a stage row (the launcher's rule: rows rounded to 16).
__host__ __device__ constexpr int stage_off(const mla_layout_desc &d, int r) {
  int o = 0;
  for (int k = 0; k < r && k < MLA_LAYOUT_MAX_REGIONS; k++) o += (d.region_row_bytes[k] + 15) / 16 * 16;
  return o;
}

// cp.async size for region r of a spec (the row bytes, or a chunked region's
// piece, allow it; the launcher checks the view).
__host__ __device__ constexpr int region_gran(const mla_layout_desc &d, int r) {
  const int n = d.region_chunk[r] > 0 ? d.region_chunk[r] : d.region_row_bytes[r];
  return n % 16 == 0 ? 16 : n % 8 == 0 ? 8 : n % 4 == 0 ? 4 : 1;
}

// How dims [d0, d0 + 8) are rebuilt from a stage row.
__host__ __device__ constexpr spec_chunk chunk_at(const mla_layout_desc &d, int d0) {
  for (int f = 0; f < d.nfields && f < MLA_LAYOUT_MAX_FIELDS; f++) {
    const mla_layout_field &fd = d.fields[f];
    if (fd.role != MLA_FIELD_DATA || d0 < fd.dim_lo || d0 >= fd.dim_lo + fd.count) continue;
    if (d0 + 8 > fd.dim_lo + fd.count) return {SK_BAD, 0, 0, 0};
    const int e = d0 - fd.dim_lo;
    const int base = stage_off(d, fd.region) + fd.byte_off;
    if (fd.dtype == MLA_BF16) {
      if (fd.scale_kind != MLA_SCALE_NONE || (base + 2 * e) % 16) return {SK_BAD, 0, 0, 0};
      return {SK_COPY, base + 2 * e, -1, 2};
    }
    if (fd.dtype != MLA_E4M3 || (base + e) % 8) return {SK_BAD, 0, 0, 0};
    if (fd.scale_kind == MLA_SCALE_NONE) return {SK_FP8_ONE, base + e, -1, 1};
    if (fd.scale_kind == MLA_SCALE_TENSOR) return {SK_FP8_TENSOR, base + e, -1, 1};
    if (e / fd.group != (e + 7) / fd.group) return {SK_BAD, 0, 0, 0};
    const int ss = stage_off(d, fd.scale_region) + fd.scale_off;
    if (fd.scale_dtype == MLA_F32) {
      const int at = ss + (e / fd.group) * 4;
      return at % 4 ? spec_chunk{SK_BAD, 0, 0, 0} : spec_chunk{SK_FP8_F32, base + e, at, 1};
    }
    if (fd.scale_dtype == MLA_UE8M0) return {SK_FP8_UE8M0, base + e, ss + e / fd.group, 1};
    return {SK_BAD, 0, 0, 0};
  }
  return {SK_ZERO, 0, -1, 0};
}

__host__ __device__ constexpr bool is_fp8_kind(int k) { return k >= SK_FP8_ONE && k <= SK_FP8_UE8M0; }

// The built-in layouts as types (mla/builtin_spec.cuh). Only the read-distinct
// fp8 layouts get kernels (fp8_ds_mla_amax and fp8_v4_vllm read the same
// bytes the same way).
MLA_BUILTIN_SPEC(fp8_pertensor, MLA_BUILTIN_DESC_fp8_pertensor)
MLA_BUILTIN_SPEC(fp8_ds_mla, MLA_BUILTIN_DESC_fp8_ds_mla)
MLA_BUILTIN_SPEC(fp8_v4, MLA_BUILTIN_DESC_fp8_v4)
// page-blocked V3.2 (chunked regions): the register-fed kernels only (rf_ok), whose loads address pieces
MLA_BUILTIN_SPEC(fp8_ds_mla_blocked, MLA_BUILTIN_DESC_fp8_ds_mla_blocked)

template <int... J, class F> __device__ __forceinline__ void static_for_(std::integer_sequence<int, J...>, F &&f) {
  (f(std::integral_constant<int, J>{}), ...);
}
template <int N, class F> __device__ __forceinline__ void static_for(F &&f) {
  static_for_(std::make_integer_sequence<int, N>{}, f);
}

// Chunk c (kind KIND, c.src the first byte of its 8 values) of a stage row as
// 8 bf16: e4m3 codes times their scale, each product rounded once.
template <int KIND> __device__ __forceinline__ uint4 convert(const unsigned char *row, const spec_chunk &c, float tscale) {
  if constexpr (KIND == SK_COPY) return *reinterpret_cast<const uint4 *>(row + c.src);
  else {
    float sc = 1.0f;
    if constexpr (KIND == SK_FP8_TENSOR) sc = tscale;
    else if constexpr (KIND == SK_FP8_F32) sc = *reinterpret_cast<const float *>(row + c.scale_src);
    else if constexpr (KIND == SK_FP8_UE8M0) sc = mla_decode_scale(MLA_UE8M0, row[c.scale_src]);
    return mla::e4m3x8_scaled_bf16(*reinterpret_cast<const uint2 *>(row + c.src), sc);
  }
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

} // namespace mla_attn_spec

#endif
