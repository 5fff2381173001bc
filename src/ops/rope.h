#pragma once
// Rotary position embeddings, applied in place to Q or K laid out as [n_tok, n_head, head_dim].
#include <cstdint>

#include "kv/key_transform.h"

namespace fitllm::ops {

enum class RopeMode {
    Normal,  // rotates adjacent pairs (x[2i], x[2i+1]): Llama, Mistral
    Neox,    // rotates (x[i], x[i + n_dims/2]): GPT-NeoX, Qwen2, Gemma, Phi
};

struct RopeParams {
    RopeMode mode = RopeMode::Normal;
    int n_dims = 0;  // rotated dimensions per head (<= head_dim; the rest pass through)
    float freq_base = 10000.0f;
    float freq_scale = 1.0f;  // linear position scaling: 1 / (context extension factor)
    // Optional per-pair divisors of the frequency (n_dims / 2 values; Llama 3's rope_freqs), or
    // nullptr.
    const float* freq_factors = nullptr;
    // YaRN (ext_factor != 0): pairs below corr_low keep the unscaled angle, pairs above
    // corr_high the scaled one, those between a linear mix (times ext_factor); cos and sin are
    // multiplied by attn_factor * (1 + 0.1 ln(1 / freq_scale)). ext_factor 0 and attn_factor 1:
    // plain (linear) scaling, as llama.cpp's rope_yarn computes it then.
    float ext_factor = 0.0f;
    float attn_factor = 1.0f;
    float corr_low = 0.0f, corr_high = 0.0f;
};

// YaRN's correction range (llama.cpp's ggml_rope_yarn_corr_dims): the pairs whose wavelength
// fits beta_fast (low end, floored) to beta_slow (high end, ceiled) times into n_ctx_orig
// positions, clamped to 0 .. n_dims - 1.
void yarn_corr_dims(int n_dims, int n_ctx_orig, float freq_base, float beta_fast, float beta_slow, float* low,
                    float* high);

// For each token t, each head and each pair i < n_dims / 2 rotates by the angle
//   pos[t] * freq_scale * freq_base^(-2i / n_dims) / freq_factors[i]
// (YaRN: mixed with the unscaled angle per pair, and scaled, as RopeParams says).
// The angle is built as ggml builds it (a float running product of the per-pair ratio), so the
// result matches llama.cpp's to the last bits rather than only to the formula.
// Throws std::invalid_argument for an odd n_dims or n_dims > head_dim.
void rope(float* x, const int32_t* pos, int64_t n_tok, int n_head, int head_dim, const RopeParams& params);

// The rotation of p by itself: attn_factor such that rope() multiplies cos and sin by 1 (YaRN's
// and LongRoPE's magnitude left out). For turning K that rope() scaled once already to other
// positions (a KV cache shift): scaled again, its norm would grow by that factor each shift.
RopeParams rotation_only(RopeParams p);

// Which dims of a head rope() turns together and by what angle per position (in double: for the
// KV cache's K transform, kv/key_transform.h, which averages over the rotations).
kv::RopeFrame rope_frame(const RopeParams& params, int head_dim);

}  // namespace fitllm::ops
