#pragma once
// Normalizations over the last dimension of [n_tok, n] float rows.
#include <cstdint>

namespace fitllm::ops {

// y = x / sqrt(mean(x^2) + eps) * weight, row by row. weight may be nullptr (no scale). As ggml
// computes it, to the bit: each square rounded to float, their sum accumulated in double, the mean
// rounded to float, then y = x * scale * weight in float. y may alias x.
void rms_norm(const float* x, const float* weight, float eps, int64_t n_tok, int64_t n, float* y);

// y = (x - mean) / sqrt(var + eps) * weight + bias, row by row; weight and bias may be nullptr.
// y may alias x.
void layer_norm(const float* x, const float* weight, const float* bias, float eps, int64_t n_tok, int64_t n, float* y);

}  // namespace fitllm::ops
