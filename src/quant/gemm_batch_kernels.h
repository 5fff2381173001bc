#pragma once
// Internal to quant/: the batch-order kernels of llama.cpp's tiled k-quant matmul
// (select_batch_order_gemm). The same rules as dot_kernels.h: files compiled for AVX2 / AVX-512
// define everything with internal linkage.
#include "quant/gemm.h"

namespace fitllm::quant::detail {

// llama.cpp's tiled matmul (ggml-cpu's tiled/, AVX-512 VNNI build) for Q3_K, Q5_K, Q6_K: a batch
// of 8 or more tokens. gemm_batch_ref.cpp defines the arithmetic and picks the kernel for a CPU;
// nullptr for other types.
BatchOrderGemm tiled_batch_order(GgmlType weight_type, const CpuFeatures& features);
GemmFn tiled_order_ref(GgmlType weight_type);
GemmFn tiled_order_avx2(GgmlType weight_type);
GemmFn tiled_order_avx512(GgmlType weight_type, bool vnni);

}  // namespace fitllm::quant::detail
