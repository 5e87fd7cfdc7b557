/* Element type ids, shared by the C host (src/dtype.h), the kernels baked in
 * with nvcc and JIT kernels compiled by NVRTC. The only list of them. */
#ifndef MLA_DTYPE_IDS_H
#define MLA_DTYPE_IDS_H

typedef enum mla_dtype {
  MLA_U8, MLA_I8, MLA_U16, MLA_I16, MLA_I32, MLA_I64,
  MLA_F16, MLA_BF16, MLA_F32, MLA_F64,
  MLA_E4M3,  /* float8_e4m3fn: no inf, NaN 0x7f/0xff, max 448 */
  MLA_E5M2,  /* float8_e5m2: IEEE-like, max 57344 */
  MLA_UE8M0, /* float8_e8m0fnu: 2^(b-127), 0xff NaN */
  MLA_E2M1,  /* fp4, two per byte, even element in the low nibble */
  MLA_DTYPE_COUNT
} mla_dtype;

#endif
