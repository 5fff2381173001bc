#pragma once
// Internal to quant/: F16 weights in llama.cpp's batch order, that of llamafile's sgemm (ggml-cpu
// llamafile/sgemm.cpp, tinyBLAS over f16 A and B), which its CPU backend runs for a batch of 2 or
// more tokens when the weight's row count is a multiple of 4 and its column count a multiple of
// the vector (16 floats on AVX-512, the oracle's build); one token takes ggml_vec_dot_f16
// (dot_ref.cpp's dot_f16). Activations are f16 in both (llama.cpp's vec_dot_type for F16).
//
// The order, per (weight row, token): one accumulator of 16 lanes, lane l taking the elements
// 16i + l, acc = fma(w, a, acc) for i = 0, 1, ...; then the lanes reduced as _mm512_reduce_add_ps
// does. Same contract as a GemmFn (quant/gemm.h); n a multiple of 16.
//
// The same rules as dot_kernels.h: the AVX2 / AVX-512 files define everything with internal linkage.
#include "quant/gemm.h"

namespace fitllm::quant::detail {

// The F16 batch-order kernel for this CPU with llama.cpp's rule; empty for other types.
BatchOrderGemm sgemm_batch_order(GgmlType weight_type, const CpuFeatures& features);

// The scalar reference that defines the order; the SIMD kernels give its bits.
void gemm_batch_f16_ref(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act,
                        size_t act_stride, float* y, size_t y_stride);
void gemm_batch_f16_avx2(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act,
                         size_t act_stride, float* y, size_t y_stride);
void gemm_batch_f16_avx512(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act,
                           size_t act_stride, float* y, size_t y_stride);

}  // namespace fitllm::quant::detail
