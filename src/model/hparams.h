#pragma once
// A model's hyper-parameters, read from GGUF metadata once and checked for consistency, so the
// forward pass can trust them.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fitllm/error.h"
#include "gguf/gguf_reader.h"

namespace fitllm::model {

// A model fitllm cannot run: unknown architecture, missing or inconsistent metadata, missing or
// misshapen tensors. The message names the file, the key or tensor, and what was expected.
class ModelError : public Error {
public:
    using Error::Error;
};

struct Hparams {
    std::string arch;  // general.architecture, e.g. "gemma3", "llama", "qwen2"
    int n_layer = 0;
    int n_embd = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int head_dim = 0;    // per head, for Q and K
    int head_dim_v = 0;  // per head, for V
    int n_ff = 0;
    int n_vocab = 0;
    int n_ctx_train = 0;
    float norm_eps = 1e-6f;

    // Attention: scores are scaled by attn_scale; layers with is_swa[il] see only the last
    // sliding_window positions and rotate with rope_base_swa instead of rope_base.
    float attn_scale = 0.0f;
    int sliding_window = 0;
    std::vector<bool> is_swa;  // one per layer
    float rope_base = 10000.0f;
    float rope_base_swa = 10000.0f;
    // Rotary embeddings: the first n_rot dims of each head rotate (llama, qwen2; gemma3 rotates
    // all of head_dim), positions scaled by rope_freq_scale (1 / linear scaling factor; gemma3's
    // sliding-window layers are not scaled).
    int n_rot = 0;
    float rope_freq_scale = 1.0f;
    // > 0: layers il with (il + 1) % no_rope_every == 0 rotate nothing (SmolLM3's NoPE layers).
    int no_rope_every = 0;
    bool rotates(int il) const { return no_rope_every <= 0 || (il + 1) % no_rope_every != 0; }
    // YaRN (rope.scaling.type "yarn"; llama-family files): the mix of scaled and unscaled angles
    // per pair and the magnitude factor, as ops::RopeParams has them. 0 / 1: none.
    float rope_ext_factor = 0.0f;
    float rope_attn_factor = 1.0f;
    float rope_corr_low = 0.0f, rope_corr_high = 0.0f;
    // Llama-4-style attention temperature (mistral3's attention.temperature_scale; 0: none): Q of
    // the token at position pos is multiplied by attn_temp(pos) = 1 + attn_temp_scale *
    // ln(floor(pos / attn_temp_floor) + 1) after RoPE, as llama.cpp computes it (float quotient
    // and floor, double log).
    float attn_temp_scale = 0.0f;
    int attn_temp_floor = 0;
    float attn_temp(int32_t pos) const {
        const float q = std::floor(static_cast<float>(pos) / static_cast<float>(attn_temp_floor));
        return static_cast<float>(std::log(static_cast<double>(q) + 1.0) * attn_temp_scale + 1.0);
    }
    float final_logit_softcap = 0.0f;  // > 0: logits = cap * tanh(logits / cap)
    // Granite's multipliers (0: none): the embeddings times embedding_scale, each block's output
    // times residual_scale before it joins the residual stream, the logits divided by logit_scale.
    float embedding_scale = 0.0f;
    float residual_scale = 0.0f;
    float logit_scale = 0.0f;
    float attn_softcap = 0.0f;  // > 0: attention scores = cap * tanh(score / cap) (gemma2)
    // Mixture of experts (qwen3moe): each layer's feed-forward block is n_expert experts of
    // n_ff_exp hidden units, of which a router picks n_expert_used per token; 0: a dense block of
    // n_ff. expert_weights_scale (0 or 1: none) scales the picked experts' weights.
    int n_expert = 0;
    int n_expert_used = 0;
    int n_ff_exp = 0;
    float expert_weights_scale = 0.0f;
    bool expert_weights_norm = true;  // the picked weights normalized to sum 1 (qwen2moe: off)
    // qwen2moe's shared expert: a dense SwiGLU of n_ff_shexp hidden units (0: none) that every token
    // runs, its output times sigmoid(gate_inp_shexp . h), added to the routed experts'.
    int n_ff_shexp = 0;
    // gpt-oss's routed experts (llama.cpp's SOFTMAX_WEIGHT gating and SWIGLU_OAI_MOE): the
    // n_expert_used largest router logits (router bias added), their weights a softmax over those
    // logits alone, and each expert's down(swiglu_oai(gate h + b_gate, up h + b_up)) + b_down with
    // the per-expert biases. false: softmax over all experts, then the top ones, and plain SwiGLU.
    bool gpt_oss_experts = false;
    bool is_moe() const { return n_expert > 0; }
};

// Reads and checks the hyper-parameters: the keys every architecture has, then the architecture's
// own (model/architecture.h). Throws ModelError naming the key (and the file) for a missing or
// inconsistent value and naming the architecture when fitllm does not support it.
Hparams read_hparams(const gguf::GgufFile& file);

// An architecture's metadata keys ("<arch>.<key>"), read with ModelErrors that name the file and
// the key: for the architectures' read_hparams functions.
class HparamReader {
public:
    HparamReader(const gguf::GgufFile& file, const std::string& arch) : file_(file), prefix_(arch + ".") {}
    const gguf::GgufFile& file() const { return file_; }
    std::string key(const std::string& name) const { return prefix_ + name; }
    bool has(const std::string& name) const { return file_.has(key(name)); }
    // A count in 1..2^30; ModelError when missing or out of range.
    int count(const std::string& name) const;
    int count_or(const std::string& name, int fallback) const { return has(name) ? count(name) : fallback; }
    float number_or(const std::string& name, float fallback) const;
    // Linear RoPE scaling: 1 / rope.scaling.factor (or the older rope.scale_linear), 1 for none;
    // other scaling types (yarn, longrope) are refused by name.
    float rope_freq_scale() const;
    // Linear or YaRN scaling into hp (its n_rot, rope_base and n_ctx_train read already): YaRN's
    // factor, rope.scaling.original_context_length (else n_ctx_train), yarn_ext_factor (1),
    // yarn_attn_factor (1), yarn_beta_fast (32) and yarn_beta_slow (1); other types refused by name.
    void rope_scaling(Hparams& hp) const;
    // The sliding-window layers into hp.is_swa (n_layer flags, hp.n_layer read already):
    // attention.sliding_window_pattern, one bool per layer where it is an array, else a period
    // (default_period when absent): layers il % period < period - 1 slide, and all of them for a
    // period of 0 (llama.cpp's set_swa_pattern). Refused by name when neither fits the layers.
    void sliding_window_layers(Hparams& hp, int default_period) const;
    // A ModelError "<file>: '<arch>.<name>' = <value>: <why>".
    [[noreturn]] void refuse(const std::string& name, const std::string& value, const std::string& why) const;

private:
    const gguf::GgufFile& file_;
    std::string prefix_;
};

}  // namespace fitllm::model
