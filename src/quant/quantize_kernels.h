#pragma once
// Internal to quant/: the activation quantizers of quantize_row by instruction set, for tests that
// hold the SIMD versions to the scalar ones bit for bit. The AVX2 file follows the rules of
// dot_kernels.h (internal linkage, no inline functions of shared headers).
#include <cstdint>

#include "quant/blocks.h"
#include "quant/cpu_features.h"

namespace fitllm::quant {

// quantize_row as the given level runs it (levels above AVX2 run the AVX2 code; the CPU must have
// what the level needs).
void quantize_row_at(Isa isa, GgmlType type, const float* src, void* dst, int64_t n);

namespace detail {

// quantize_avx2.cpp: the same results as the scalar code of quantize.cpp, bit for bit.
void quant_q8_0_avx2(const float* x, BlockQ8_0* y, int64_t nb);
void quant_q8_1_avx2(const float* x, BlockQ8_1* y, int64_t nb);
void quant_q8_K_avx2(const float* x, BlockQ8_K* y, int64_t nb);

}  // namespace detail
}  // namespace fitllm::quant
