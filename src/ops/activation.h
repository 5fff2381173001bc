#pragma once
// Element-wise activations and softmax over float rows.
#include <cstdint>

namespace fitllm::ops {

// In place: x = exp(x - max) / sum, computed stably (the max is subtracted before exp).
// The sum is accumulated in double. An all -inf row becomes all zeros.
void softmax(float* x, int64_t n);

float silu(float x);  // x * sigmoid(x)

// GELU in the tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in float.
float gelu_tanh_exact(float x);
// GELU as llama.cpp's CPU backend computes it, which the goldens against llama.cpp need: 0 at or
// below -10, x at or above 10, and between them gelu_tanh_exact of x rounded to f16, the result
// rounded to f16 again (ggml reads it from a 64 Ki-entry f16 table; we round instead of keeping
// a table). Differs from the exact formula by up to ~1e-3 relative.
float gelu(float x);

void silu(const float* x, int64_t n, float* y);  // y may alias x
void gelu(const float* x, int64_t n, float* y);  // gelu(x) per element; y may alias x

// Gated feed-forward: y = act(gate) * up, SwiGLU with silu and GeGLU with gelu. y may alias either.
void swiglu(const float* gate, const float* up, int64_t n, float* y);
void geglu(const float* gate, const float* up, int64_t n, float* y);

// Soft-capping (Gemma 2 logits and attention scores): x = cap * tanh(x / cap), in place.
void softcap(float* x, int64_t n, float cap);

// y = x + b element-wise; y may alias either.
void add(const float* a, const float* b, int64_t n, float* y);
// x[t][i] += bias[i] for each of n_tok rows of n values (Qwen2's Q/K/V biases).
void add_bias(float* x, const float* bias, int64_t n_tok, int64_t n);
// x *= s in place.
void scale(float* x, int64_t n, float s);

}  // namespace fitllm::ops
