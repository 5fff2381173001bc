#pragma once
// Internal to quant/: the tiled kernels of each family, looked up by select_gemm. The same rules
// as dot_kernels.h: files compiled for AVX2 / AVX-512 define everything with internal linkage.
#include "quant/gemm.h"

namespace fitllm::quant::detail {

// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (gemm_avx2.cpp, gemm_avx512.cpp).
GemmKernel gemm_avx2(GgmlType weight_type);
GemmKernel gemm_avx512(GgmlType weight_type, bool vnni);
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (gemm_avx2_kquants.cpp, gemm_avx512_kquants.cpp).
GemmKernel gemm_avx2_kquants(GgmlType weight_type);
GemmKernel gemm_avx512_kquants(GgmlType weight_type, bool vnni);

}  // namespace fitllm::quant::detail
