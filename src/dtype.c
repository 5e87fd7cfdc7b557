#include "dtype.h"

#include <math.h>
#include <string.h>

static const mla_dtype_info infos[MLA_DTYPE_COUNT] = {
  [MLA_U8] = {"u8", 8, 0, 0},       [MLA_I8] = {"i8", 8, 0, 1},
  [MLA_U16] = {"u16", 16, 0, 0},    [MLA_I16] = {"i16", 16, 0, 1},
  [MLA_I32] = {"i32", 32, 0, 1},    [MLA_I64] = {"i64", 64, 0, 1},
  [MLA_F16] = {"f16", 16, 1, 1},    [MLA_BF16] = {"bf16", 16, 1, 1},
  [MLA_F32] = {"f32", 32, 1, 1},    [MLA_F64] = {"f64", 64, 1, 1},
  [MLA_E4M3] = {"e4m3", 8, 1, 1},   [MLA_E5M2] = {"e5m2", 8, 1, 1},
  [MLA_UE8M0] = {"ue8m0", 8, 1, 0}, [MLA_E2M1] = {"e2m1", 4, 1, 1},
};

static const struct { const char *alias; mla_dtype t; } aliases[] = {
  {"uint8", MLA_U8}, {"int8", MLA_I8}, {"uint16", MLA_U16}, {"int16", MLA_I16},
  {"int32", MLA_I32}, {"int", MLA_I32}, {"int64", MLA_I64}, {"long", MLA_I64},
  {"float16", MLA_F16}, {"half", MLA_F16}, {"bfloat16", MLA_BF16},
  {"float32", MLA_F32}, {"float", MLA_F32}, {"float64", MLA_F64}, {"double", MLA_F64},
  {"float8_e4m3fn", MLA_E4M3}, {"fp8", MLA_E4M3}, {"fp8_e4m3", MLA_E4M3}, {"e4m3fn", MLA_E4M3},
  {"float8_e5m2", MLA_E5M2}, {"fp8_e5m2", MLA_E5M2},
  {"float8_e8m0fnu", MLA_UE8M0}, {"e8m0", MLA_UE8M0},
  {"fp4", MLA_E2M1}, {"float4_e2m1fn_x2", MLA_E2M1}, {"fp4_e2m1", MLA_E2M1},
};

const mla_cvt_opts mla_cvt_default = {1, 1};

const mla_dtype_info *mla_dtype_info_of(mla_dtype t) {
  return (unsigned)t < MLA_DTYPE_COUNT ? &infos[t] : NULL;
}
const char *mla_dtype_name(mla_dtype t) {
  return (unsigned)t < MLA_DTYPE_COUNT ? infos[t].name : "?";
}
int mla_dtype_size(mla_dtype t) { return infos[t].bits / 8; }

int mla_dtype_parse(const char *name, mla_dtype *out) {
  for (int i = 0; i < MLA_DTYPE_COUNT; i++)
    if (strcmp(name, infos[i].name) == 0) { *out = (mla_dtype)i; return 0; }
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcmp(name, aliases[i].alias) == 0) { *out = aliases[i].t; return 0; }
  return -1;
}

static uint64_t dbits(double x) { uint64_t u; memcpy(&u, &x, 8); return u; }
static float bitsf(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static uint32_t fbits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }

/* ---- decoding ---------------------------------------------------------- */

/* 2^k for the normal doubles' exponents, built from its bits: the decoders
 * below scale small integers by it exactly, where ldexp's range checks cost
 * more than the decode itself (the CPU reference decodes every cached code). */
static double pow2i(int k) {
  const uint64_t u = (uint64_t)(k + 1023) << 52;
  double x;
  memcpy(&x, &u, 8);
  return x;
}

double mla_e4m3_to_double(uint8_t b) {
  int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  double v;
  if (e == 15 && m == 7) return NAN;
  v = e == 0 ? m * 0x1p-9 : (8 + m) * pow2i(e - 10);
  return s ? -v : v;
}

double mla_e5m2_to_double(uint8_t b) {
  int s = b >> 7, e = (b >> 2) & 31, m = b & 3;
  double v;
  if (e == 31) v = m ? NAN : INFINITY;
  else v = e == 0 ? m * 0x1p-16 : (4 + m) * pow2i(e - 17);
  return s ? -v : v;
}

double mla_ue8m0_to_double(uint8_t b) { return b == 0xff ? NAN : pow2i((int)b - 127); }

double mla_e2m1_to_double(uint8_t nib) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  double v = mag[nib & 7];
  return (nib & 8) ? -v : v;
}

float mla_bf16_to_float(uint16_t h) { return bitsf((uint32_t)h << 16); }

float mla_f16_to_float(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 31) v = m ? NAN : INFINITY;
  else v = e == 0 ? m * 0x1p-24 : (1024 + m) * pow2i(e - 25);
  return (float)(s ? -v : v);
}

/* ---- encoding to fp8 / fp4 --------------------------------------------- */
/* Mirrors the reference algorithm of __nv_cvt_double_to_fp8/_fp4: truncate
 * the double's significand to the target width, then round to nearest even
 * on the dropped bits, with a separate denormal path. */
typedef struct minifloat {
  int mbits, bias;
  uint64_t mindenorm_o2, overflow, minnorm; /* double bit patterns */
  uint8_t maxnorm;
} minifloat;

static const minifloat fmt_e4m3 = {3, 7, 0x3F50000000000000ULL, 0x407D000000000000ULL,
                                   0x3F90000000000000ULL, 0x7E};
static const minifloat fmt_e5m2 = {2, 15, 0x3EE0000000000000ULL, 0x40EE000000000000ULL - 1,
                                   0x3F10000000000000ULL, 0x7B};
static const minifloat fmt_e2m1 = {1, 1, 0x3FD0000000000000ULL, 0x4018000000000000ULL,
                                   0x3FF0000000000000ULL, 0x7};

static uint8_t mini_round(uint64_t xbits, const minifloat *f) {
  const int sig = f->mbits + 1;
  const uint64_t half = 1ULL << (53 - sig - 1);
  int exp = (int)((xbits >> 52) & 0x7FF) - 1023 + f->bias;
  uint8_t mant = (uint8_t)((xbits >> (53 - sig)) & ((1u << f->mbits) - 1));
  uint64_t absx = xbits & 0x7FFFFFFFFFFFFFFFULL;
  uint8_t res;
  if (absx >= f->minnorm) {
    uint64_t rnd = xbits & ((half << 1) - 1);
    res = (uint8_t)((exp << f->mbits) | mant);
    if (rnd > half || (rnd == half && (mant & 1))) res++;
  } else {
    int shift = 1 - exp;
    uint64_t rnd = (xbits | (1ULL << 52)) & ((half << (shift + 1)) - 1);
    mant |= (uint8_t)(1u << f->mbits);
    res = (uint8_t)(mant >> shift);
    if (rnd > (half << shift) || (rnd == (half << shift) && (res & 1))) res++;
  }
  return res;
}

static uint8_t fp8_encode(double x, const minifloat *f, int saturate, int is_e4m3) {
  uint64_t xb = dbits(x), absx = xb & 0x7FFFFFFFFFFFFFFFULL;
  uint8_t sign = (uint8_t)((xb >> 63) << 7), res;
  if (absx <= f->mindenorm_o2) res = 0;
  else if (absx > 0x7FF0000000000000ULL)
    res = is_e4m3 ? 0x7F : (uint8_t)(0x7E | ((xb >> (53 - 3)) & 3));
  else if (absx > f->overflow) res = saturate ? f->maxnorm : (is_e4m3 ? 0x7F : 0x7C);
  else res = mini_round(xb, f);
  return res | sign;
}

uint8_t mla_double_to_e4m3(double x, int saturate) { return fp8_encode(x, &fmt_e4m3, saturate, 1); }
uint8_t mla_double_to_e5m2(double x, int saturate) { return fp8_encode(x, &fmt_e5m2, saturate, 0); }

uint8_t mla_double_to_e2m1(double x) {
  uint64_t xb = dbits(x), absx = xb & 0x7FFFFFFFFFFFFFFFULL;
  uint8_t sign = (uint8_t)((xb >> 63) << 3), res;
  if (absx <= fmt_e2m1.mindenorm_o2) res = 0;
  else if (absx > fmt_e2m1.overflow) {
    if (absx > 0x7FF0000000000000ULL) sign = 0; /* NaN -> +6 */
    res = fmt_e2m1.maxnorm;
  } else res = mini_round(xb, &fmt_e2m1);
  return res | sign;
}

/* ---- encoding to IEEE half formats ------------------------------------ */
/* Round a double to a binary format with ebits/mbits, nearest even,
 * overflow to infinity, NaN to the canonical 0x7fff (what cvt.rn gives). */
static uint16_t ieee16_encode(double x, int ebits, int mbits) {
  uint64_t xb = dbits(x), absx = xb & 0x7FFFFFFFFFFFFFFFULL;
  uint16_t sign = (uint16_t)((xb >> 63) << 15);
  const int bias = (1 << (ebits - 1)) - 1, emax = (1 << ebits) - 1;
  const uint16_t inf = (uint16_t)(emax << mbits);
  if (absx > 0x7FF0000000000000ULL) return 0x7FFF;
  if (absx == 0x7FF0000000000000ULL) return sign | inf;
  int e = (int)(absx >> 52) - 1023 + bias;
  uint64_t sigd = (absx & ((1ULL << 52) - 1)) | ((absx >> 52) ? (1ULL << 52) : 0);
  int shift = 52 - mbits; /* bits dropped for a normal result */
  if (e < 1) shift += 1 - e, e = 0; /* subnormal: drop more */
  if (shift > 60) return sign; /* far below half the smallest subnormal */
  uint64_t kept = sigd >> shift, rem = sigd & ((1ULL << shift) - 1), half = 1ULL << (shift - 1);
  if (rem > half || (rem == half && (kept & 1))) kept++;
  /* kept includes the implicit bit for normals; adding e<<mbits then works
   * because the implicit bit carries into the exponent field. */
  uint64_t r = e > 0 ? (((uint64_t)(e - 1) << mbits) + kept) : kept;
  if (r >= inf) return sign | inf;
  return sign | (uint16_t)r;
}

uint16_t mla_double_to_bf16(double x) { return ieee16_encode(x, 8, 7); }
uint16_t mla_double_to_f16(double x) { return ieee16_encode(x, 5, 10); }

float mla_double_to_f32(double x) {
  if (x != x) return bitsf(0x7FFFFFFFu);
  return (float)x;
}

/* ---- ue8m0 -------------------------------------------------------------- */
/* Mirrors __nv_cvt_float_to_e8m0: the float is first rounded to bf16 toward
 * zero (rz) or, on its magnitude, toward +inf (rp), then the exponent byte is
 * taken; rp bumps it when any mantissa bit is set above 2^-127. */
static uint16_t f32_to_bf16_rz(uint32_t u) { return (uint16_t)(u >> 16); }
static uint16_t f32_to_bf16_ru_abs(uint32_t u) {
  u &= 0x7FFFFFFFu;
  if (u > 0x7F800000u) return 0x7FFF;
  uint16_t h = (uint16_t)(u >> 16);
  if ((u & 0xFFFFu) && h < 0x7F80u) h++;
  return h;
}

uint8_t mla_double_to_ue8m0(double x, int saturate, int round_up) {
  /* double -> float keeping a sticky bit, as __internal_double_to_float_with_sticky */
  float f = (float)x;
  if (x == x && !isinf(x)) {
    float fz = f;
    double back = (double)fz;
    uint32_t u = fbits(fz);
    if (fabs(back) > fabs(x)) u--; /* truncate toward zero */
    if (back != x && !isinf(fz)) u |= 1u;
    f = bitsf(u);
  }
  uint32_t u = fbits(f);
  uint16_t h = round_up ? f32_to_bf16_ru_abs(u) : f32_to_bf16_rz(u);
  uint8_t res = (uint8_t)(h >> 7);
  if (round_up && (h & 0x7F) && (h & 0x7FFF) > 0x40 && (h & 0x7FFF) < 0x7F80) res++;
  if (saturate && (h & 0x7FFF) <= 0x7F80 && res == 0xFF) res--;
  return res;
}

/* ---- element access ----------------------------------------------------- */

static double int_to_double(int64_t v) { return (double)v; }

int64_t mla_load_int(mla_dtype t, const void *base, int64_t i) {
  const unsigned char *p = (const unsigned char *)base;
  switch (t) {
  case MLA_U8: return p[i];
  case MLA_I8: return ((const int8_t *)p)[i];
  case MLA_U16: return ((const uint16_t *)p)[i];
  case MLA_I16: return ((const int16_t *)p)[i];
  case MLA_I32: return ((const int32_t *)p)[i];
  case MLA_I64: return ((const int64_t *)p)[i];
  default: return (int64_t)mla_load_double(t, base, i);
  }
}

double mla_load_double(mla_dtype t, const void *base, int64_t i) {
  const unsigned char *p = (const unsigned char *)base;
  switch (t) {
  case MLA_F16: return mla_f16_to_float(((const uint16_t *)p)[i]);
  case MLA_BF16: return mla_bf16_to_float(((const uint16_t *)p)[i]);
  case MLA_F32: return ((const float *)p)[i];
  case MLA_F64: return ((const double *)p)[i];
  case MLA_E4M3: return mla_e4m3_to_double(p[i]);
  case MLA_E5M2: return mla_e5m2_to_double(p[i]);
  case MLA_UE8M0: return mla_ue8m0_to_double(p[i]);
  case MLA_E2M1: return mla_e2m1_to_double((uint8_t)((p[i >> 1] >> ((i & 1) * 4)) & 15));
  default: return int_to_double(mla_load_int(t, base, i));
  }
}

/* Float to integer: truncate toward zero, saturate, NaN -> 0 (as __float2int_rz). */
static int64_t sat_int(double v, double lo, double hi) {
  if (v != v) return 0;
  if (v <= lo) return (int64_t)lo;
  if (v >= hi) return (int64_t)hi;
  return (int64_t)v;
}

/* Tensor conversions write one canonical NaN per format (positive, as the
 * GPU's cvt instructions do), so CPU and GPU agree whatever payload came in. */
static int store_nan(mla_dtype t, unsigned char *p, int64_t i) {
  switch (t) {
  case MLA_F16: case MLA_BF16: ((uint16_t *)p)[i] = 0x7FFF; return 1;
  case MLA_F32: ((uint32_t *)p)[i] = 0x7FFFFFFFu; return 1;
  case MLA_F64: ((uint64_t *)p)[i] = 0x7FFFFFFFFFFFFFFFULL; return 1;
  case MLA_E4M3: case MLA_E5M2: p[i] = 0x7F; return 1;
  case MLA_UE8M0: p[i] = 0xFF; return 1;
  default: return 0; /* integers: 0; e2m1: +6, both through the normal path */
  }
}

void mla_store_double(mla_dtype t, void *base, int64_t i, double v, const mla_cvt_opts *o) {
  unsigned char *p = (unsigned char *)base;
  if (!o) o = &mla_cvt_default;
  if (v != v && store_nan(t, p, i)) return;
  switch (t) {
  case MLA_U8: p[i] = (uint8_t)sat_int(v, 0, 255); break;
  case MLA_I8: ((int8_t *)p)[i] = (int8_t)sat_int(v, -128, 127); break;
  case MLA_U16: ((uint16_t *)p)[i] = (uint16_t)sat_int(v, 0, 65535); break;
  case MLA_I16: ((int16_t *)p)[i] = (int16_t)sat_int(v, -32768, 32767); break;
  case MLA_I32: ((int32_t *)p)[i] = (int32_t)sat_int(v, -2147483648.0, 2147483647.0); break;
  case MLA_I64:
    ((int64_t *)p)[i] = v != v ? 0 : v <= -9223372036854775808.0 ? INT64_MIN
                      : v >= 9223372036854775808.0 ? INT64_MAX : (int64_t)v;
    break;
  case MLA_F16: ((uint16_t *)p)[i] = mla_double_to_f16(v); break;
  case MLA_BF16: ((uint16_t *)p)[i] = mla_double_to_bf16(v); break;
  case MLA_F32: ((float *)p)[i] = mla_double_to_f32(v); break;
  case MLA_F64: ((double *)p)[i] = v; break;
  case MLA_E4M3: p[i] = mla_double_to_e4m3(v, o->saturate); break;
  case MLA_E5M2: p[i] = mla_double_to_e5m2(v, o->saturate); break;
  case MLA_UE8M0: p[i] = mla_double_to_ue8m0(v, o->saturate, o->ue8m0_round_up); break;
  case MLA_E2M1: {
    int sh = (int)(i & 1) * 4;
    uint8_t *b = &p[i >> 1];
    *b = (uint8_t)((*b & ~(15 << sh)) | (mla_double_to_e2m1(v) << sh));
    break;
  }
  default: break;
  }
}
