// Compile-time-specialized variants of the KV gathers and requant for the
// built-in layouts (kernels_rtc/include/mla/builtin_layouts.h).
//
// Each built-in descriptor becomes a type spec_<name> whose `host` member is
// the constexpr descriptor; fld<L, F> and slot<L, S> turn it into scalar
// constants (field offsets, dtypes, scale groups, the lane -> chunk slots of
// a token row) that device code uses as immediates, so a specialized kernel
// does no plan lookup at all: lane j of a warp owns chunks j, j + 32, ... of
// each field, and the field's dtype, addresses and scale arithmetic are fixed
// at compile time. Page and token strides, storage offsets, num_pages and the
// tensor scale stay runtime values read from the view (64-bit addresses).
//
// Selection (host): a descriptor runs the variant of the first built-in whose
// descriptor equals it for reading (mla_layout_desc_same(.., 1)); layouts that
// differ only in writer fields (fp8_ds_mla / fp8_ds_mla_amax, fp8_v4 /
// fp8_v4_vllm, indexer_fp8 / indexer_fp8_ue8m0) share one instantiation. The
// specialized code assumes 16-byte-aligned views (base, page and token
// strides); every token_align-16 layout guarantees it, and a view that is
// not (an indexer view with a 4-byte page stride) runs the generic kernel.
// Chunked built-ins (fp8_ds_mla_blocked) are instantiated too: a field's
// chunk j lives in the piece of its row byte (chunk_addr), the piece
// offset a shift and a mask of j; the raw variants take whole rows only
// (raw_out_ok), requant a destination whose pads lie in whole rows.
#ifndef MLA_KV_GATHER_SPEC_CUH
#define MLA_KV_GATHER_SPEC_CUH

#include <utility>

#include "kv_common.cuh"
#include "mla/builtin_layouts.h"
#include "mla/layout_match.h"

namespace mla_kvs {

using namespace mla_kv;

// ---- the built-ins as types ----

enum builtin_index {
#define MLA_KVS_ENUM(n, init) idx_##n,
  MLA_BUILTIN_LAYOUTS_ALL(MLA_KVS_ENUM)
#undef MLA_KVS_ENUM
      kNumBuiltins
};

constexpr mla_layout_desc kBuiltins[] = {
#define MLA_KVS_INIT(n, init) init,
    MLA_BUILTIN_LAYOUTS_ALL(MLA_KVS_INIT)
#undef MLA_KVS_INIT
};

constexpr const char *kBuiltinNames[] = {
#define MLA_KVS_NAME(n, init) #n,
    MLA_BUILTIN_LAYOUTS_ALL(MLA_KVS_NAME)
#undef MLA_KVS_NAME
};

#define MLA_KVS_DEF(n, init)                                                                                           \
  struct spec_##n {                                                                                                    \
    static constexpr mla_layout_desc host = init;                                                                      \
    static constexpr const char *name = #n;                                                                            \
    static constexpr int index = idx_##n;                                                                              \
  };
MLA_BUILTIN_LAYOUTS_ALL(MLA_KVS_DEF)
#undef MLA_KVS_DEF

// The instantiated variant of a built-in: the first one equal to it for reading.
constexpr int canonical_of(int i) {
  for (int j = 0; j < i; j++)
    if (mla_layout_desc_same(&kBuiltins[j], &kBuiltins[i], 1)) return j;
  return i;
}
template <class S> constexpr bool is_canonical() { return canonical_of(S::index) == S::index; }

// ---- compile-time facts of a descriptor ----

constexpr int chunk_bytes_of(int dtype) {
  return dtype == MLA_E2M1 ? 4 : dtype == MLA_F32 ? 32 : (dtype == MLA_BF16 || dtype == MLA_F16) ? 16 : 8;
}
constexpr int scale_bytes_of(int sdtype) { return sdtype == MLA_F32 ? 4 : sdtype == MLA_BF16 ? 2 : 1; }
// Largest power of two <= 16 dividing x (16 for 0).
constexpr int pow2_div16(int64_t x) { return x % 16 == 0 ? 16 : x % 8 == 0 ? 8 : x % 4 == 0 ? 4 : x % 2 == 0 ? 2 : 1; }
constexpr int min_i(int a, int b) { return a < b ? a : b; }

template <class L, int F> struct fld {
  static constexpr mla_layout_field f = L::host.fields[F];
  static constexpr bool data = f.role == MLA_FIELD_DATA;
  static constexpr int dtype = f.dtype, dim_lo = f.dim_lo, count = f.count, byte_off = f.byte_off;
  static constexpr int region = f.region;
  static constexpr int nch = data ? count / 8 : 0; // chunks
  static constexpr int iters = (nch + 31) / 32;   // lane passes
  static constexpr int c0 = dim_lo / 8;           // first chunk in the row
  static constexpr int cb = chunk_bytes_of(dtype);
  static constexpr int64_t off = L::host.region_off[region] + byte_off; // of token 0's row in the page
  static constexpr int pc = L::host.region_chunk[region];                // piece bytes, 0: whole rows
  static constexpr int64_t pstride = (int64_t)pc * L::host.block_size;   // between a token's pieces
  static constexpr int64_t roff = L::host.region_off[region];
  // 0: the view's token stride; a chunked region's tokens are a piece apart
  static constexpr int row = pc ? pc : region == 0 ? 0 : L::host.region_row_bytes[region];
  // alignment of a chunk's address in a 16-byte-aligned view
  static constexpr int align = min_i(min_i(pow2_div16(off), pow2_div16(cb)), row ? pow2_div16(row) : 16);
  static constexpr bool vec = align >= min_i(cb, 16);
  static constexpr int skind = f.scale_kind;
  static constexpr int sdtype = f.scale_dtype;
  static constexpr int ss = scale_bytes_of(sdtype);
  static constexpr int gch = skind == MLA_SCALE_GROUP ? f.group / 8 : 1; // chunks per scale group
  static constexpr int64_t soff = skind == MLA_SCALE_GROUP ? L::host.region_off[f.scale_region] + f.scale_off : 0;
  static constexpr int spc = skind == MLA_SCALE_GROUP ? L::host.region_chunk[f.scale_region] : 0;
  static constexpr int64_t spstride = (int64_t)spc * L::host.block_size;
  static constexpr int64_t sroff = skind == MLA_SCALE_GROUP ? L::host.region_off[f.scale_region] : 0;
  static constexpr int srow = spc ? spc
                              : skind == MLA_SCALE_GROUP && f.scale_region != 0 ? L::host.region_row_bytes[f.scale_region] : 0;
  static constexpr int salign = min_i(min_i(pow2_div16(soff), ss), srow ? pow2_div16(srow) : 16);
  static constexpr bool svec = salign >= ss;
  static constexpr bool fast = dtype == MLA_E4M3 || dtype == MLA_E2M1 || dtype == MLA_BF16; // straight-line decode
};

// Lane passes of a token row, field by field: slot s is pass k of field f.
constexpr int count_slots(const mla_layout_desc &d) {
  int n = 0;
  for (int f = 0; f < d.nfields; f++)
    if (d.fields[f].role == MLA_FIELD_DATA) n += (d.fields[f].count / 8 + 31) / 32;
  return n;
}
constexpr int slot_field(const mla_layout_desc &d, int s) {
  for (int f = 0; f < d.nfields; f++) {
    const int k = d.fields[f].role == MLA_FIELD_DATA ? (d.fields[f].count / 8 + 31) / 32 : 0;
    if (s < k) return f;
    s -= k;
  }
  return -1;
}
constexpr int slot_pass(const mla_layout_desc &d, int s) {
  for (int f = 0; f < d.nfields; f++) {
    const int k = d.fields[f].role == MLA_FIELD_DATA ? (d.fields[f].count / 8 + 31) / 32 : 0;
    if (s < k) return s;
    s -= k;
  }
  return -1;
}
constexpr bool uses_tensor_scale(const mla_layout_desc &d) {
  for (int f = 0; f < d.nfields; f++)
    if (d.fields[f].role == MLA_FIELD_DATA && d.fields[f].scale_kind == MLA_SCALE_TENSOR) return true;
  return false;
}

template <class L> struct lay {
  static constexpr int nslots = count_slots(L::host);
  static constexpr int bs = L::host.block_size;
  static constexpr int dim = L::host.dim;
  static constexpr bool tensor = uses_tensor_scale(L::host);
  static constexpr int nregions = L::host.nregions;
};

template <class L, int S> struct slot {
  static constexpr int f = slot_field(L::host, S);
  static constexpr int k = slot_pass(L::host, S);
};

// Calls fn(std::integral_constant<int, i>) for i in [0, N).
template <class Fn, int... I> __host__ __device__ __forceinline__ void static_for_(Fn &&fn, std::integer_sequence<int, I...>) {
  (fn(std::integral_constant<int, I>{}), ...);
}
template <int N, class Fn> __host__ __device__ __forceinline__ void static_for(Fn &&fn) {
  static_for_(fn, std::make_integer_sequence<int, N>{});
}

// ---- chunk loads and dequantization with a compile-time field ----

// The stored bytes of chunk j of field Fd of the token row at `pg` (page) / t.
template <class Fd>
__device__ __forceinline__ const unsigned char *chunk_addr(const unsigned char *pg, int t, int64_t token_stride, int j) {
  if constexpr (Fd::pc == 0) {
    return pg + Fd::off + (int64_t)j * Fd::cb + (Fd::row ? (int64_t)t * Fd::row : (int64_t)t * token_stride);
  } else { // the piece of row byte b (layout_desc.h, mla_region_base)
    const int b = Fd::byte_off + j * Fd::cb;
    return pg + Fd::roff + (int64_t)(b / Fd::pc) * Fd::pstride + b % Fd::pc + (int64_t)t * Fd::pc;
  }
}
template <class Fd>
__device__ __forceinline__ const unsigned char *scale_addr(const unsigned char *pg, int t, int64_t token_stride, int j) {
  if constexpr (Fd::spc == 0) {
    return pg + Fd::soff + (int64_t)(j / Fd::gch) * Fd::ss + (Fd::srow ? (int64_t)t * Fd::srow : (int64_t)t * token_stride);
  } else {
    const int b = Fd::f.scale_off + (j / Fd::gch) * Fd::ss;
    return pg + Fd::sroff + (int64_t)(b / Fd::spc) * Fd::spstride + b % Fd::spc + (int64_t)t * Fd::spc;
  }
}

template <class Fd> __device__ __forceinline__ uint4 load_raw(const unsigned char *p) {
  if constexpr (Fd::vec && Fd::cb == 8) {
    const uint2 v = __ldg(reinterpret_cast<const uint2 *>(p));
    return make_uint4(v.x, v.y, 0, 0);
  } else if constexpr (Fd::vec && Fd::cb == 4) {
    return make_uint4(__ldg(reinterpret_cast<const uint32_t *>(p)), 0, 0, 0);
  } else if constexpr (Fd::vec && Fd::cb >= 16) {
    return __ldg(reinterpret_cast<const uint4 *>(p)); // f32 chunks: the first half (dequant reads the rest)
  } else {
    return mla::load_chunk_raw(Fd::dtype, p);
  }
}

template <class Fd> __device__ __forceinline__ uint32_t load_scale(const unsigned char *p) {
  if constexpr (Fd::skind != MLA_SCALE_GROUP) return 0;
  else if constexpr (Fd::ss == 4 && Fd::svec) return __ldg(reinterpret_cast<const uint32_t *>(p));
  else if constexpr (Fd::ss == 2 && Fd::svec) return __ldg(reinterpret_cast<const unsigned short *>(p));
  else if constexpr (Fd::ss == 1) return __ldg(p);
  else return mla::load_scale_raw(Fd::sdtype, p);
}

// 8 dims as bf16: decode(q) * scale in fp32, rounded once (the reference's
// product); unscaled bf16 is the stored value with NaNs made the canonical
// 0x7fff, as bf16 -> fp32 -> bf16 gives. p: the chunk's address (f32 and
// the other slow dtypes re-read it).
template <class Fd> __device__ __forceinline__ uint4 dequant(uint4 raw, uint32_t sbits, float ts, const unsigned char *p) {
  if constexpr (Fd::dtype == MLA_BF16 && Fd::skind == MLA_SCALE_NONE) {
    return mla::bf16x8_canon_nan(raw);
  } else {
    float x[8];
    if constexpr (Fd::dtype == MLA_E4M3) mla::e4m3x8_decode(make_uint2(raw.x, raw.y), x);
    else if constexpr (Fd::dtype == MLA_E2M1) mla::e2m1x8_decode(raw.x, x);
    else if constexpr (Fd::dtype == MLA_BF16) mla::unpack_bf16x8(raw, x);
    else mla::decode_chunk(Fd::dtype, raw, p, x);
    if constexpr (Fd::skind != MLA_SCALE_NONE) {
      const float s = Fd::skind == MLA_SCALE_TENSOR ? ts : mla_decode_scale(Fd::sdtype, sbits);
#pragma unroll
      for (int i = 0; i < 8; i++) x[i] = __fmul_rn(x[i], s);
    }
    return mla::pack_bf16x8(x);
  }
}

// ---- host: launch geometry ----

inline int env_int(const char *name, int dflt) {
  const char *e = getenv(name);
  return e && atoi(e) > 0 ? atoi(e) : dflt;
}

// Blocks for `steps` warp steps: `waves` times the blocks resident at once
// (MLALAB_KV_SPEC_GRID overrides it, for tuning), capped by the work. Warps
// loop over the steps; more waves measured faster than one persistent wave on
// the H100 (sparse fp8_ds_mla gather, 262144 rows: 1 wave 90.0% of memcpy,
// 4 waves 91.6%, 16 waves 94.3%).
template <class K> int spec_grid(K kernel, int threads, int64_t steps, int waves) {
  static const int env = env_int("MLALAB_KV_SPEC_GRID", 0);
  const int mult = env ? env : waves;
  int dev = 0, sms = 0, per_sm = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0);
  int64_t g = (int64_t)(sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1) * mult;
  const int64_t need = (steps + threads / 32 - 1) / (threads / 32);
  if (need < g) g = need;
  return g < 1 ? 1 : (int)g;
}

// ---- host: selection ----

// The name to record for a descriptor served by built-in variant i: the
// built-in it equals exactly, else the variant's own.
inline const char *builtin_name(const mla_layout_desc &d, int i) {
  for (int j = 0; j < kNumBuiltins; j++)
    if (mla_layout_desc_same(&d, &kBuiltins[j], 0)) return kBuiltinNames[j];
  return kBuiltinNames[i];
}

inline bool view_aligned16(const mla_cache_view &v) {
  return (((uintptr_t)v.base | (uintptr_t)v.page_stride | (uintptr_t)v.token_stride) & 15) == 0;
}

// Calls fn(spec_X{}) for the built-in variant serving d (specialization on,
// view 16-byte aligned); returns its recorded name, or NULL (run generic).
template <class Fn> const char *with_builtin(const mla_layout_desc &d, const mla_cache_view &v, Fn &&fn) {
  if (!mla_cuda_kv_specialize() || !view_aligned16(v)) return nullptr;
  const char *name = nullptr;
#define MLA_KVS_TRY(n, init)                                                                                           \
  if constexpr (is_canonical<spec_##n>()) {                                                                            \
    if (!name && mla_layout_desc_same(&d, &spec_##n::host, 1)) {                                                       \
      fn(spec_##n{});                                                                                                  \
      name = builtin_name(d, spec_##n::index);                                                                         \
    }                                                                                                                  \
  }
  MLA_BUILTIN_LAYOUTS_ALL(MLA_KVS_TRY)
#undef MLA_KVS_TRY
  return name;
}

} // namespace mla_kvs

#endif
