#include "ops/activation.h"

#include <cmath>
#include <limits>

#include "quant/blocks.h"

namespace fitllm::ops {

void softmax(float* x, int64_t n) {
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) max = std::fmax(max, x[i]);
    if (max == -std::numeric_limits<float>::infinity()) {
        for (int64_t i = 0; i < n; ++i) x[i] = 0.0f;
        return;
    }
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - max);
        sum += x[i];
    }
    const auto inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float silu(float x) {
    return x / (1.0f + std::exp(-x));
}

float gelu_tanh_exact(float x) {
    constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
    constexpr float kCubic = 0.044715f;
    return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kCubic * x * x)));
}

float gelu(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    const float x_half = quant::fp16_to_fp32(quant::fp32_to_fp16(x));
    return quant::fp16_to_fp32(quant::fp32_to_fp16(gelu_tanh_exact(x_half)));
}

void silu(const float* x, int64_t n, float* y) {
    for (int64_t i = 0; i < n; ++i) y[i] = silu(x[i]);
}

void gelu(const float* x, int64_t n, float* y) {
    for (int64_t i = 0; i < n; ++i) y[i] = gelu(x[i]);
}

void swiglu(const float* gate, const float* up, int64_t n, float* y) {
    for (int64_t i = 0; i < n; ++i) y[i] = silu(gate[i]) * up[i];
}

void geglu(const float* gate, const float* up, int64_t n, float* y) {
    for (int64_t i = 0; i < n; ++i) y[i] = gelu(gate[i]) * up[i];
}

void softcap(float* x, int64_t n, float cap) {
    const float inv_cap = 1.0f / cap;
    for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] * inv_cap);
}

void add(const float* a, const float* b, int64_t n, float* y) {
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void add_bias(float* x, const float* bias, int64_t n_tok, int64_t n) {
    for (int64_t t = 0; t < n_tok; ++t) add(x + t * n, bias, n, x + t * n);
}

void scale(float* x, int64_t n, float s) {
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace fitllm::ops
