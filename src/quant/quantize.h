#pragma once
// Reference quantization: floats to ggml blocks.
//
// Activations: Q8_0, Q8_1 and Q8_K, rounded the way llama.cpp rounds them, so that the integer
// dots see the same inputs as llama.cpp's. Weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K,
// Q4_K, Q5_K, Q6_K) and F16 / BF16: plain round-to-nearest with the scales fitted to each block's
// range (no error search like llama.cpp's quantizer), which is what tests and benchmarks need to
// make data; real models come quantized by llama.cpp.
#include <cstdint>

#include "quant/ggml_type.h"

namespace fitllm::quant {

bool can_quantize(GgmlType type);

// Writes the n values of src as one row of `type` at dst (row_bytes(type, n) bytes). n must be a
// whole number of blocks; throws std::invalid_argument (naming the type and n) otherwise.
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

}  // namespace fitllm::quant
