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
// IQ4_NL at every level, IQ4_XS with VNNI (gemm_iq4_avx2.cpp, gemm_iq4_avx512.cpp); IQ4_XS at AVX2
// and AVX-512 without VNNI is in gemm_avx2.cpp / gemm_avx512.cpp.
GemmKernel gemm_iq4_avx2(GgmlType weight_type);
GemmKernel gemm_iq4_avx512(GgmlType weight_type, bool vnni);
// The grid i-quants' batch-order kernel at AVX-512 VNNI (gemm_iq_grid_avx512.cpp); nullptr for other
// types. The levels below have theirs from tiled_order_avx2 / tiled_order_avx512 (dot_iq_avx2.h).
GemmFn gemm_iq_grid_avx512_vnni(GgmlType weight_type);

// The small-batch kernels (select_small_batch): F32 (AVX-512 only), F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K
// (gemm_small_avx2.cpp, gemm_small_avx512.cpp); nullptr for other types.
GemmFn small_batch_avx2(GgmlType weight_type);
GemmFn small_batch_avx512(GgmlType weight_type, bool vnni);
// Q5_0's at AVX2: gemm_avx2.cpp's tile in the lanes8 order (its prompts' tile sums in another).
GemmFn lanes8_small_batch_avx2(GgmlType weight_type);

// A buffer of at least `bytes` for the calling thread, 64-byte aligned, valid until its next call
// (gemm.cpp: not inline, so the SIMD files can call it; see dot_kernels.h).
std::byte* small_batch_scratch(size_t bytes);

}  // namespace fitllm::quant::detail
