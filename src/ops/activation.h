#pragma once
// Element-wise activations and softmax over float rows.
#include <cstdint>

namespace fitllm::ops {

// In place: x = exp(x - max) / sum, computed stably (the max is subtracted before exp).
// The sum is accumulated in double. An all -inf row becomes all zeros.
void softmax(float* x, int64_t n);

float silu(float x);  // x * sigmoid(x) = x / (1 + exp(-x)), with std::exp

// exp and silu as llama.cpp's AVX-512 kernels compute them (ggml_v_expf / ggml_v_silu in
// ggml-cpu's vec.h, the variant a -march=native build uses on this kind of CPU): a range reduction
// by ln 2 and a degree-5 polynomial, within ~2 ulp of std::exp. Scalar transcriptions; the array
// functions below use the same formula 16 lanes at a time.
float exp_ggml_simd(float x);
float silu_ggml_simd(float x);  // x / (1 + exp_ggml_simd(0 - x))

// GELU in the tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))), in float as
// ggml_gelu_f32 computes it in llama.cpp's build (1 + (0.044715 x) x one fused multiply-add).
float gelu_tanh_exact(float x);
// GELU as llama.cpp's CPU backend computes it, which the goldens against llama.cpp need: 0 at or
// below -10, x at or above 10, and between them gelu_tanh_exact of x rounded to f16, the result
// rounded to f16 again (ggml reads it from a 64 Ki-entry f16 table indexed by the f16 bits of x;
// fitllm keeps the same table, built on first use). Differs from the exact formula by up to ~1e-3
// relative.
float gelu(float x);

// silu of n values as ggml_vec_silu_f32 computes a row of n: silu_ggml_simd for each whole group of
// 16, silu (std::exp) for the last n % 16. Bit-identical to llama.cpp on rows whose length is a
// multiple of 16 (or when called once per row). y may alias x.
void silu(const float* x, int64_t n, float* y);
void gelu(const float* x, int64_t n, float* y);  // gelu(x) per element; y may alias x

// Gated feed-forward: y = act(gate) * up, SwiGLU with the array silu above (ggml_vec_swiglu_f32,
// same grouping by 16) and GeGLU with gelu. y may alias either.
void swiglu(const float* gate, const float* up, int64_t n, float* y);
void geglu(const float* gate, const float* up, int64_t n, float* y);

// gpt-oss's clamped SwiGLU (ggml_swiglu_oai): with x = min(gate, limit) and u = clamp(up, -limit,
// limit), y = x / (1 + exp(alpha * -x)) * (u + 1), exp by std::exp as ggml's CPU op (gpt-oss: alpha
// 1.702, limit 7). y may alias either.
void swiglu_oai(const float* gate, const float* up, int64_t n, float alpha, float limit, float* y);

// Soft-capping (Gemma 2 logits and attention scores): x = cap * tanh(x / cap), in place.
void softcap(float* x, int64_t n, float cap);

// y = x + b element-wise; y may alias either.
void add(const float* a, const float* b, int64_t n, float* y);
// x[t][i] += bias[i] for each of n_tok rows of n values (Qwen2's Q/K/V biases).
void add_bias(float* x, const float* bias, int64_t n_tok, int64_t n);
// x *= s in place.
void scale(float* x, int64_t n, float s);

}  // namespace fitllm::ops
