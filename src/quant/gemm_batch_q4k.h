#pragma once
// Internal to quant/: Q4_K and Q2_K in llama.cpp's batch order, the float order of its repacked
// gemm (ggml-cpu arch/x86/repack.cpp, ggml_gemm_q4_K_8x8_q8_K / ggml_gemm_q2_K_8x8_q8_K), which
// its CPU backend runs on groups of 4 tokens of a batch (repack.cpp forward_mul_mat_one_chunk; the
// last n_tok % 4 go through its gemv, whose order is dot_ref.cpp's serial one). Same contract
// as a GemmFn (quant/gemm.h): every token of the call in the batch order; the caller decides which
// tokens belong to the batch part.
//
// The order, per (weight row, token), with d = d_w d_a and dmin = dmin_w d_a (float products):
//   for each super-block, for each chunk c of kChunk elements (Q4_K: 64 = its sub-blocks 2c and
//   2c + 1 of 32; Q2_K: 128 = its sub-blocks 8c .. 8c + 7 of 16):
//     acc      = fma(float(sum over the chunk of scale_j q y), d, acc)
//     acc_mins = fma(float(sum over the chunk's sub-blocks of min_j sum(y)), dmin, acc_mins)
//   result = acc - acc_mins
// where the integer sums are exact. The one-token order (dot_ref.cpp) does the same per
// super-block, so the two differ in rounding only.
//
// The same rules as dot_kernels.h: the AVX2 / AVX-512 files define everything with internal linkage.
#include "quant/gemm.h"

namespace fitllm::quant::detail {

// The batch-order kernel of Q4_K / Q2_K for this CPU with llama.cpp's rule (select_batch_order_gemm's
// table): it repacks a weight whose row count is a multiple of 8 (Q4_K on AVX2 CPUs, Q2_K on
// AVX-512 ones) and runs its gemm on a batch's tokens in groups of 4 from the first; the last
// n_tok % 4 take its gemv, the one-token order. Empty where llama.cpp does not repack the type.
BatchOrderGemm repacked_batch_order(GgmlType weight_type, const CpuFeatures& features);

// The scalar reference that defines the order (gemm_batch_q4k_ref.cpp); nullptr for other types.
GemmFn gemm_batch_q4k_ref(GgmlType weight_type);

// The SIMD kernels, bit for bit the reference's results. AVX2: Q4_K (llama.cpp repacks Q2_K only
// on AVX-512 CPUs); AVX-512: Q4_K and Q2_K, with VNNI where `vnni`. fn == nullptr for other types.
GemmKernel gemm_batch_q4k_avx2(GgmlType weight_type);
GemmKernel gemm_batch_q4k_avx512(GgmlType weight_type, bool vnni);

}  // namespace fitllm::quant::detail
