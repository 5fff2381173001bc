#pragma once
// Reference dequantization: one row of a GGUF tensor to floats, readable rather than fast.
#include <cstdint>

#include "quant/ggml_type.h"

namespace fitllm::quant {

// F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4, IQ3_XXS,
// IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K.
bool can_dequantize(GgmlType type);

// Writes the n values of a row of `type` starting at src. n must be a whole number of blocks;
// throws std::invalid_argument (naming the type and n) when it is not or the type is unsupported.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

}  // namespace fitllm::quant
