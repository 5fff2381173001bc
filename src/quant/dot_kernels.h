#pragma once
// Internal to quant/: the kernel tables of each instruction set, looked up by select_dot.
//
// The files behind the AVX2 and AVX-512 tables are compiled with those instruction sets enabled.
// Everything they define must have internal linkage (anonymous namespaces) and they must not call
// inline functions of shared headers: the linker keeps one copy of an inline function, and it
// could pick one compiled for AVX-512 for a caller that runs on any x86-64.
#include "quant/dot.h"

namespace fitllm::quant::detail {

DotFn dot_ref(GgmlType weight_type);
// 16 lanes summed in _mm512_reduce_add_ps's order (GCC's): the references of kernels that
// reproduce an AVX-512 reduction (dot_ref.cpp's F16 dot, gemm_batch_f16_ref.cpp).
float reduce_add16(const float v[16]);
DotFn dot_avx2(GgmlType weight_type);
// Many rows at once, each in the float order of the type's one-float ("serial") dot, which is the
// same at every ISA level: Q4_0, IQ4_NL (nullptr for the other types).
DotRowsFn dot_rows_avx2(GgmlType weight_type);
DotFn dot_avx2_kquants(GgmlType weight_type);
DotFn dot_avx512(GgmlType weight_type, bool vnni);
DotFn dot_avx512_kquants(GgmlType weight_type, bool vnni);
// The AVX-512 rows kernels where there is one (Q4_0; IQ4_NL with VNNI), in the same serial order
// as dot_rows_avx2's, which they call for the rows past their groups of sixteen; and Q8_0's and
// Q5_0's, each row in its single AVX-512 dot's order (lanes8), the rows past the last sixteen by
// that dot.
DotRowsFn dot_rows_avx512(GgmlType weight_type, bool vnni);
// The k-quants' AVX-512 rows kernels (Q4_K), each row in its single AVX-512 dot's order (the
// serial one, the same at every level); nullptr for the other types.
DotRowsFn dot_rows_avx512_kquants(GgmlType weight_type, bool vnni);

}  // namespace fitllm::quant::detail
