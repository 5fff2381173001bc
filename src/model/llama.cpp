// Llama (2, 3, 3.x; also Mistral, TinyLlama, SmolLM2): pre-norm blocks of grouped-query attention
// with rotary embeddings on adjacent pairs of dims, and a SwiGLU feed-forward.
// Qwen2 (and Qwen2.5) is the same pass with required biases on Q, K and V and rotary embeddings
// on the two halves of each head (NeoX style); small models tie the output matrix to the embedding.
// Qwen3 (dense) drops the biases and RMS-norms each head of Q and K (one weight vector of head_dim
// shared by the heads) before the rotation; its head size is its own (128), not n_embd / n_head.
// Qwen3-MoE is Qwen3 with a mixture of experts for each feed-forward block (model/moe.h: softmax
// routing, the top n_expert_used experts, weights normalized to sum 1), no dense FFN.
// Mixtral is a "llama" file with expert_count > 0: Llama's attention, the same routing, each
// expert feed_forward_length wide (the variant is picked at load from expert_count).
// Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B) is Qwen2's attention with routed experts whose weights
// are the softmax probabilities as they are (not normalized), plus a shared expert every token
// runs: a dense SwiGLU whose output, times sigmoid(gate_inp_shexp . h), joins the routed sum.
// SmolLM3 is Llama whose every fourth layer has no rotary embeddings (NoPE).
// Mistral 3 (Ministral 3, Mistral Small 3.x text) is Llama with YaRN's magnitude set by
// yarn_log_multiplier and Llama 4's attention temperature: Q times a factor that grows with the
// token's position, in steps of the original context length.
// Granite (IBM Granite 3.x dense) is Llama with four multipliers: the embeddings', each block
// output's before the residual add, the attention scale, and a divisor of the logits.
// OLMo 2 has no norms before its blocks but one after each (attention output and FFN output,
// before the residual add), and RMS-norms Q and K whole (one weight per row of all heads) before
// the rotation, which pairs the halves of each head (NeoX style).
// gpt-oss (OpenAI gpt-oss-20b / 120b; llama.cpp's LLM_ARCH_OPENAI_MOE) is Qwen2's attention
// (Q/K/V and output biases, NeoX RoPE with YaRN) with attention sinks (a learned logit per head in
// the softmax's denominator), sliding-window attention on every other layer (the even ones), the
// FFN norm named post_attention_norm, and routed experts with biases, top-k-then-softmax routing
// and the clamped SwiGLU (model/moe.h, Hparams::gpt_oss_experts).
// Reference: the Llama papers, the Qwen2 and Qwen3 technical reports, the Granite 3.0 and OLMo 2
// reports; llama.cpp's llama, qwen2, qwen2moe, qwen3, qwen3moe, granite, olmo2, smollm3, mistral3 and openai-moe graphs
// (and llama_context's YaRN attention factor) for the exact order of ops.
#include <algorithm>
#include <cmath>

#include "model/architecture.h"
#include "model/decoder.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/weights.h"
#include "ops/activation.h"
#include "ops/embedding.h"
#include "ops/matmul.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/scratch.h"

namespace fitllm::model {
namespace {

// Llama (2, 3, 3.x, Mistral, TinyLlama, SmolLM2), Qwen2 and Qwen3 (llama.cpp's LLM_ARCH_LLAMA,
// LLM_ARCH_QWEN2 and LLM_ARCH_QWEN3): every layer attends globally; the first n_rot dims of each head rotate.
// Llama 3.1's frequency factors come as a tensor (rope_freqs.weight), bound with the weights.
void read_attention_hparams(const HparamReader& r, Hparams& hp) {
    hp.is_swa.assign(static_cast<size_t>(hp.n_layer), false);
    hp.rope_base_swa = hp.rope_base;
    if (hp.head_dim_v != hp.head_dim) {
        r.refuse("attention.value_length", std::to_string(hp.head_dim_v),
                 "differs from '" + r.key("attention.key_length") + "' = " + std::to_string(hp.head_dim) + "; " +
                     hp.arch + " needs equal K and V head sizes");
    }
    hp.n_rot = r.count_or("rope.dimension_count", hp.head_dim);
    if (hp.n_rot % 2 != 0 || hp.n_rot > hp.head_dim) {
        r.refuse("rope.dimension_count", std::to_string(hp.n_rot),
                 "must be even and at most the head size " + std::to_string(hp.head_dim));
    }
    r.rope_scaling(hp);  // linear or YaRN (Qwen2.5 / Qwen3 long context)
    // attention.scale (Granite-style Llamas) replaces 1/sqrt(head_dim) when present.
    const float scale = r.number_or("attention.scale", 0.0f);
    hp.attn_scale = scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(hp.head_dim));
}

// Llama's relatives (Qwen2, Qwen3, Granite, SmolLM3, Mistral 3) with a dense feed-forward block
// only: experts in those are refused; a "llama" file with them is Mixtral (read_llama_arch_hparams).
void read_llama_hparams(const HparamReader& r, Hparams& hp) {
    if (r.has("expert_count") && r.file().get_int(r.key("expert_count")) != 0) {
        r.refuse(
            "expert_count", std::to_string(r.file().get_int(r.key("expert_count"))),
            "mixture-of-experts models are supported as 'llama' (Mixtral) and 'qwen3moe' files, not as " + hp.arch);
    }
    read_attention_hparams(r, hp);
}

// The routed experts' counts (qwen3moe, Mixtral): expert_count and expert_used_count required.
void read_expert_counts(const HparamReader& r, Hparams& hp) {
    hp.n_expert = r.count("expert_count");
    hp.n_expert_used = r.count("expert_used_count");
    if (hp.n_expert > kMaxExperts) {
        r.refuse("expert_count", std::to_string(hp.n_expert), "more than " + std::to_string(kMaxExperts));
    }
    if (hp.n_expert_used > hp.n_expert || hp.n_expert_used > kMaxExpertsUsed) {
        r.refuse("expert_used_count", std::to_string(hp.n_expert_used),
                 "must be at most '" + r.key("expert_count") + "' = " + std::to_string(hp.n_expert) + " and " +
                     std::to_string(kMaxExpertsUsed));
    }
}

// "llama" (llama.cpp's LLM_ARCH_LLAMA): dense, or Mixtral when expert_count is non-zero. Mixtral's
// experts are feed_forward_length wide each (llama.cpp's llama builds them with n_ff; it reads no
// expert_feed_forward_length nor expert_weights_scale for llama), softmax-routed, the top
// expert_used_count weights normalized to sum 1, no shared expert.
void read_llama_arch_hparams(const HparamReader& r, Hparams& hp) {
    if (r.has("expert_count") && r.file().get_int(r.key("expert_count")) != 0) {
        read_expert_counts(r, hp);
        hp.n_ff_exp = hp.n_ff;
        hp.expert_weights_scale = 0.0f;
    }
    read_attention_hparams(r, hp);
}

// SmolLM3 (llama.cpp's LLM_ARCH_SMOLLM3): layers 3, 7, 11, ... without RoPE (llama.cpp's fixed
// n_no_rope_layer_step of 4; the files carry no key for it).
void read_smollm3_hparams(const HparamReader& r, Hparams& hp) {
    read_llama_hparams(r, hp);
    hp.no_rope_every = 4;
}

// Mistral 3 (llama.cpp's LLM_ARCH_MISTRAL3): attention.temperature_scale (0 or absent: none) with
// its step the YaRN original context (rope.scaling.original_context_length, else context_length);
// rope.scaling.yarn_log_multiplier L (0 or absent: none) sets YaRN's magnitude factor as llama.cpp
// does: mscale(1) / mscale(L) / (1 + 0.1 ln factor), mscale(m) = 0.1 m ln factor + 1, before
// the rotation's own 1 + 0.1 ln factor. Experts are refused (read_llama_hparams).
void read_mistral3_hparams(const HparamReader& r, Hparams& hp) {
    read_llama_hparams(r, hp);
    const float log_mul = r.number_or("rope.scaling.yarn_log_multiplier", 0.0f);
    if (!std::isfinite(log_mul) || log_mul < 0.0f) {
        r.refuse("rope.scaling.yarn_log_multiplier", std::to_string(log_mul), "must be a finite number >= 0");
    }
    if (log_mul != 0.0f && hp.rope_ext_factor != 0.0f) {
        const float factor = 1.0f / hp.rope_freq_scale;
        const auto mscale = [factor](float m) { return factor <= 1.0f ? 1.0f : 0.1f * m * std::log(factor) + 1.0f; };
        hp.rope_attn_factor = mscale(1.0f) / mscale(log_mul);
        hp.rope_attn_factor *= 1.0f / (1.0f + 0.1f * std::log(factor));
    }
    hp.attn_temp_scale = r.number_or("attention.temperature_scale", 0.0f);
    if (!std::isfinite(hp.attn_temp_scale)) {
        r.refuse("attention.temperature_scale", std::to_string(hp.attn_temp_scale), "must be finite");
    }
    if (hp.attn_temp_scale != 0.0f) {
        hp.attn_temp_floor = r.count_or("rope.scaling.original_context_length", hp.n_ctx_train);
    }
}

// Granite (llama.cpp's LLM_ARCH_GRANITE): logit_scale required, the other multipliers optional.
// rope.scaling.finetuned false means no rotary embeddings at all there, which fitllm refuses.
void read_granite_hparams(const HparamReader& r, Hparams& hp) {
    read_llama_hparams(r, hp);
    if (!r.has("logit_scale")) r.refuse("logit_scale", "(missing)", "Granite files must have it");
    hp.logit_scale = r.number_or("logit_scale", 0.0f);
    hp.residual_scale = r.number_or("residual_scale", 0.0f);
    hp.embedding_scale = r.number_or("embedding_scale", 0.0f);
    for (const char* key : {"logit_scale", "residual_scale", "embedding_scale"}) {
        const float v = r.number_or(key, 0.0f);
        if (!std::isfinite(v)) r.refuse(key, std::to_string(v), "must be finite");
    }
    if (r.has("rope.scaling.finetuned") && !r.file().get<bool>(r.key("rope.scaling.finetuned"))) {
        r.refuse("rope.scaling.finetuned", "false", "Granite without rotary embeddings is not supported");
    }
}

// OLMo 2 (llama.cpp's LLM_ARCH_OLMO2): OLMo 3's sliding-window layers (a sliding_window key) are
// not supported.
void read_olmo2_hparams(const HparamReader& r, Hparams& hp) {
    if (r.has("attention.sliding_window") && r.count_or("attention.sliding_window", 0) > 0) {
        r.refuse("attention.sliding_window", std::to_string(r.count("attention.sliding_window")),
                 "OLMo 3's sliding-window layers are not supported");
    }
    read_attention_hparams(r, hp);
    if (hp.head_dim * hp.n_head != hp.n_embd) {
        r.refuse("attention.key_length", std::to_string(hp.head_dim),
                 "OLMo 2 needs n_embd / n_head = " + std::to_string(hp.n_embd / hp.n_head));
    }
}

// Qwen3-MoE (llama.cpp's LLM_ARCH_QWEN3MOE): Qwen3's attention; expert_feed_forward_length falls
// back to feed_forward_length / expert_used_count as llama.cpp's does.
void read_qwen3moe_hparams(const HparamReader& r, Hparams& hp) {
    read_expert_counts(r, hp);
    hp.n_ff_exp = r.count_or("expert_feed_forward_length", hp.n_ff / hp.n_expert_used);
    hp.expert_weights_scale = r.number_or("expert_weights_scale", 0.0f);
    if (!std::isfinite(hp.expert_weights_scale)) {
        r.refuse("expert_weights_scale", std::to_string(hp.expert_weights_scale), "must be finite");
    }
    read_attention_hparams(r, hp);
}

// Qwen2-MoE (llama.cpp's LLM_ARCH_QWEN2MOE): expert_feed_forward_length falls back to
// feed_forward_length / expert_used_count and expert_shared_feed_forward_length to
// feed_forward_length, as llama.cpp's do. The routed weights are not normalized (llama.cpp's
// qwen2moe graph) unless the file sets expert_weights_norm true (HF's norm_topk_prob); no
// expert_weights_scale. n_ff becomes the shared expert's width: the dense block every token runs.
void read_qwen2moe_hparams(const HparamReader& r, Hparams& hp) {
    read_expert_counts(r, hp);
    hp.n_ff_exp = r.count_or("expert_feed_forward_length", hp.n_ff / hp.n_expert_used);
    hp.n_ff_shexp = r.count_or("expert_shared_feed_forward_length", hp.n_ff);
    hp.n_ff = hp.n_ff_shexp;
    hp.expert_weights_scale = 0.0f;
    hp.expert_weights_norm = r.has("expert_weights_norm") && r.file().get<bool>(r.key("expert_weights_norm"));
    read_attention_hparams(r, hp);
}

// gpt-oss (llama.cpp's LLM_ARCH_OPENAI_MOE): expert_feed_forward_length and attention.sliding_window
// required; sliding-window layers il % period < period - 1 with the period
// attention.sliding_window_pattern (2 when absent: the even layers), one bool per layer where the
// key is an array; they rotate with rope.freq_base_swa when given, else the global base (both with
// the file's YaRN). The routed weights are a softmax over the chosen logits (no normalization);
// expert_weights_scale as the file says (none when absent).
void read_gpt_oss_hparams(const HparamReader& r, Hparams& hp) {
    read_expert_counts(r, hp);
    hp.n_ff_exp = r.count("expert_feed_forward_length");
    hp.expert_weights_norm = false;
    hp.expert_weights_scale = r.number_or("expert_weights_scale", 0.0f);
    if (!std::isfinite(hp.expert_weights_scale)) {
        r.refuse("expert_weights_scale", std::to_string(hp.expert_weights_scale), "must be finite");
    }
    hp.gpt_oss_experts = true;
    read_attention_hparams(r, hp);
    hp.sliding_window = r.count("attention.sliding_window");
    r.sliding_window_layers(hp, 2);
    hp.rope_base_swa = r.number_or("rope.freq_base_swa", hp.rope_base);
}

// qwen2moe's shared expert, dense (it runs on the layer's device; --cpu-moe keeps only the routed
// experts on the host): gate_inp [1, n_embd] (a vector in the file), gate and up [n_ff_shexp,
// n_embd], down [n_embd, n_ff_shexp].
struct SharedExpert {
    ops::WeightView gate_inp, gate, up, down;
};

// Llama, Qwen2 and Qwen3, one block: pre-norm attention and SwiGLU feed-forward. Biases and the
// Q/K norms are nullptr when the architecture has none; Qwen3-MoE has experts (moe) instead of
// ffn_gate, ffn_up and ffn_down; OLMo 2 has post-norms instead of pre-norms.
struct LlamaLayer {
    const float* attn_norm = nullptr;       // [n_embd]  (OLMo 2: none)
    ops::WeightView wq;                     // [n_head * head_dim, n_embd]
    ops::WeightView wk;                     // [n_head_kv * head_dim, n_embd]
    ops::WeightView wv;                     // [n_head_kv * head_dim, n_embd]
    const float* bq = nullptr;              // [n_head * head_dim]     (Qwen2: required)
    const float* bk = nullptr;              // [n_head_kv * head_dim]  (Qwen2: required)
    const float* bv = nullptr;              // [n_head_kv * head_dim]  (Qwen2: required)
    const float* q_norm = nullptr;          // [head_dim]  (Qwen3: required; OLMo 2: [n_head * head_dim])
    const float* k_norm = nullptr;          // [head_dim]  (Qwen3: required; OLMo 2: [n_head_kv * head_dim])
    ops::WeightView wo;                     // [n_embd, n_head * head_dim]
    const float* bo = nullptr;              // [n_embd]
    const float* ffn_norm = nullptr;        // [n_embd]  (OLMo 2: none)
    const float* attn_post_norm = nullptr;  // [n_embd]  (OLMo 2: required)
    const float* attn_sinks = nullptr;      // [n_head]  (gpt-oss: required)
    const float* ffn_post_norm = nullptr;   // [n_embd]  (OLMo 2: required)
    ops::WeightView ffn_gate;               // [n_ff, n_embd]
    ops::WeightView ffn_up;                 // [n_ff, n_embd]
    ops::WeightView ffn_down;               // [n_embd, n_ff]
    MoeWeights moe;                         // router [n_expert, n_embd] and experts (Qwen3-MoE, Mixtral)
    SharedExpert shexp;                     // Qwen2-MoE's shared expert
};

template <class F>
void for_each_weight(LlamaLayer& L, F&& f) {
    static_assert(sizeof(LlamaLayer) == 15 * sizeof(const float*) + 15 * sizeof(ops::WeightView),
                  "a LlamaLayer field is missing from for_each_weight");
    for (const float** p :
         {&L.attn_norm, &L.bq, &L.bk, &L.bv, &L.q_norm, &L.k_norm, &L.bo, &L.ffn_norm, &L.attn_post_norm,
          &L.ffn_post_norm, &L.attn_sinks, &L.moe.router_b, &L.moe.gate_exps_b, &L.moe.up_exps_b, &L.moe.down_exps_b})
        f(*p);
    for (ops::WeightView* w :
         {&L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_gate, &L.ffn_up, &L.ffn_down, &L.moe.router, &L.moe.gate_exps,
          &L.moe.up_exps, &L.moe.down_exps, &L.shexp.gate_inp, &L.shexp.gate, &L.shexp.up, &L.shexp.down})
        f(w->data);
}

struct LlamaWeights {
    ops::WeightView token_embd;          // [n_vocab, n_embd]
    std::vector<LlamaLayer> layers;      // n_layer
    const float* output_norm = nullptr;  // [n_embd]
    ops::WeightView output;              // [n_vocab, n_embd]; token_embd when tied
    const float* rope_freqs = nullptr;   // [n_rot / 2] divisors of the RoPE frequencies (Llama 3.1), or nullptr
};

enum class QkvBias { Optional, Required, None };
enum class QkNorm { None, PerHead, Whole };  // RMS norms of Q and K before the rotation

// What tells Qwen2, Qwen3, Granite and OLMo 2 from Llama.
struct Variant {
    QkvBias qkv_bias;
    QkNorm qk_norm;  // per head (Qwen3) or over all heads of a token (OLMo 2)
    ops::RopeMode rope_mode;
    bool rope_freqs;             // Llama 3.1+'s per-pair frequency divisors, when the file has them
    bool moe = false;            // routed experts instead of the dense FFN (Qwen3-MoE, Mixtral; model/moe.h)
    bool post_norms = false;     // norms after the attention and FFN blocks instead of before (OLMo 2)
    bool shared_expert = false;  // beside the routed experts (Qwen2-MoE)
    // gpt-oss: attention sinks, every other layer sliding-window (Hparams::is_swa), the output
    // projection's bias required, the FFN norm named post_attention_norm, expert and router biases.
    bool gpt_oss = false;
};
constexpr Variant kLlamaVariant{QkvBias::Optional, QkNorm::None, ops::RopeMode::Normal,
                                true};                                                         // pairs (x[2i], x[2i+1])
constexpr Variant kQwen2Variant{QkvBias::Required, QkNorm::None, ops::RopeMode::Neox, false};  // (x[i], x[i + n_rot/2])
constexpr Variant kQwen3Variant{QkvBias::None, QkNorm::PerHead, ops::RopeMode::Neox, false};
constexpr Variant kMixtralVariant{QkvBias::Optional, QkNorm::None, ops::RopeMode::Normal, true, /*moe=*/true};
constexpr Variant kQwen2MoeVariant{QkvBias::Required, QkNorm::None, ops::RopeMode::Neox,   false,
                                   /*moe=*/true,      false,        /*shared_expert=*/true};
constexpr Variant kQwen3MoeVariant{QkvBias::None, QkNorm::PerHead, ops::RopeMode::Neox, false, /*moe=*/true};
constexpr Variant kSmolLm3Variant{QkvBias::Optional, QkNorm::None, ops::RopeMode::Normal, false};
constexpr Variant kGptOssVariant{
    QkvBias::Required, QkNorm::None, ops::RopeMode::Neox, false, /*moe=*/true, false, false, /*gpt_oss=*/true};
constexpr Variant kOlmo2Variant{QkvBias::None, QkNorm::Whole, ops::RopeMode::Neox, false, false, /*post_norms=*/true};

// Binds a "llama", "qwen2" or "qwen3" file. Throws ModelError naming the first missing or
// misshapen tensor, or a tensor the forward pass does not use (FFN biases; Qwen3's Q/K/V biases).
LlamaWeights bind_llama_weights(const gguf::GgufFile& file, const Hparams& hp, const Variant& variant) {
    const TensorBinder b(file);
    LlamaWeights w;
    w.token_embd = b.matrix("token_embd.weight", hp.n_vocab, hp.n_embd);
    w.output_norm = b.vector("output_norm.weight", hp.n_embd);
    w.output = b.optional_matrix("output.weight", hp.n_vocab, hp.n_embd);
    if (!w.output.data) w.output = w.token_embd;  // tied
    if (variant.rope_freqs) w.rope_freqs = b.optional_vector("rope_freqs.weight", hp.n_rot / 2);
    const int64_t q_dim = int64_t{hp.n_head} * hp.head_dim;
    const int64_t kv_dim = int64_t{hp.n_head_kv} * hp.head_dim;
    const auto bias = [&](const std::string& name, int64_t n) -> const float* {
        switch (variant.qkv_bias) {
            case QkvBias::Required:
                return b.vector(name, n);
            case QkvBias::Optional:
                return b.optional_vector(name, n);
            case QkvBias::None:
                b.refuse(name, hp.arch + " has no Q/K/V biases");
                return nullptr;
        }
        return nullptr;
    };
    for (int il = 0; il < hp.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        LlamaLayer L;
        if (!variant.post_norms) L.attn_norm = b.vector(p + "attn_norm.weight", hp.n_embd);
        L.wq = b.matrix(p + "attn_q.weight", q_dim, hp.n_embd);
        L.wk = b.matrix(p + "attn_k.weight", kv_dim, hp.n_embd);
        L.wv = b.matrix(p + "attn_v.weight", kv_dim, hp.n_embd);
        L.bq = bias(p + "attn_q.bias", q_dim);
        L.bk = bias(p + "attn_k.bias", kv_dim);
        L.bv = bias(p + "attn_v.bias", kv_dim);
        if (variant.qk_norm != QkNorm::None) {
            const bool whole = variant.qk_norm == QkNorm::Whole;
            L.q_norm = b.vector(p + "attn_q_norm.weight", whole ? q_dim : hp.head_dim);
            L.k_norm = b.vector(p + "attn_k_norm.weight", whole ? kv_dim : hp.head_dim);
        }
        L.wo = b.matrix(p + "attn_output.weight", hp.n_embd, q_dim);
        L.bo = variant.gpt_oss ? b.vector(p + "attn_output.bias", hp.n_embd)
                               : b.optional_vector(p + "attn_output.bias", hp.n_embd);
        if (variant.gpt_oss) {
            L.attn_sinks = b.vector(p + "attn_sinks.weight", hp.n_head);
        } else {
            b.refuse(p + "attn_sinks.weight", "attention sinks are implemented for gpt-oss only, not " + hp.arch);
        }
        if (variant.post_norms) {
            L.attn_post_norm = b.vector(p + "post_attention_norm.weight", hp.n_embd);
            L.ffn_post_norm = b.vector(p + "post_ffw_norm.weight", hp.n_embd);
            for (const char* t : {"attn_norm.weight", "ffn_norm.weight"}) {
                b.refuse(p + t, hp.arch + " has no norms before its blocks");
            }
        } else if (variant.gpt_oss) {  // the norm before the experts, under llama.cpp's attn_post_norm name
            L.ffn_norm = b.vector(p + "post_attention_norm.weight", hp.n_embd);
            b.refuse(p + "ffn_norm.weight", "gpt-oss's FFN norm is post_attention_norm");
        } else {
            L.ffn_norm = b.vector(p + "ffn_norm.weight", hp.n_embd);
        }
        if (variant.moe) {
            L.moe.router = b.matrix(p + "ffn_gate_inp.weight", hp.n_expert, hp.n_embd);
            L.moe.gate_exps = b.experts(p + "ffn_gate_exps.weight", hp.n_expert, hp.n_ff_exp, hp.n_embd);
            L.moe.up_exps = b.experts(p + "ffn_up_exps.weight", hp.n_expert, hp.n_ff_exp, hp.n_embd);
            L.moe.down_exps = b.experts(p + "ffn_down_exps.weight", hp.n_expert, hp.n_embd, hp.n_ff_exp);
            if (variant.gpt_oss) {
                L.moe.router_b = b.vector(p + "ffn_gate_inp.bias", hp.n_expert);
                L.moe.gate_exps_b = b.vectors(p + "ffn_gate_exps.bias", hp.n_expert, hp.n_ff_exp);
                L.moe.up_exps_b = b.vectors(p + "ffn_up_exps.bias", hp.n_expert, hp.n_ff_exp);
                L.moe.down_exps_b = b.vectors(p + "ffn_down_exps.bias", hp.n_expert, hp.n_embd);
            } else {
                for (const char* t :
                     {"ffn_gate_inp.bias", "ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias"}) {
                    b.refuse(p + t, "expert biases are implemented for gpt-oss only, not " + hp.arch);
                }
            }
            b.refuse(
                p + "ffn_gate_up_exps.weight",
                "fused gate and up experts are not supported; convert with separate ffn_gate_exps and ffn_up_exps");
            if (variant.shared_expert) {
                L.shexp.gate_inp = {.type = quant::GgmlType::F32,
                                    .rows = 1,
                                    .cols = hp.n_embd,
                                    .data = b.vector(p + "ffn_gate_inp_shexp.weight", hp.n_embd)};
                L.shexp.gate = b.matrix(p + "ffn_gate_shexp.weight", hp.n_ff_shexp, hp.n_embd);
                L.shexp.up = b.matrix(p + "ffn_up_shexp.weight", hp.n_ff_shexp, hp.n_embd);
                L.shexp.down = b.matrix(p + "ffn_down_shexp.weight", hp.n_embd, hp.n_ff_shexp);
            } else {
                for (const char* t : {"ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight",
                                      "ffn_down_shexp.weight"}) {
                    b.refuse(p + t, hp.arch + " has no shared expert");
                }
            }
            b.refuse(p + "exp_probs_b.bias", hp.arch + " has no expert selection bias");
        } else {
            L.ffn_gate = b.matrix(p + "ffn_gate.weight", hp.n_ff, hp.n_embd);
            L.ffn_up = b.matrix(p + "ffn_up.weight", hp.n_ff, hp.n_embd);
            L.ffn_down = b.matrix(p + "ffn_down.weight", hp.n_embd, hp.n_ff);
        }
        for (const char* t : {"ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"}) {
            b.refuse(p + t, "feed-forward biases are not implemented for " + hp.arch);
        }
        w.layers.push_back(L);
    }
    return w;
}

class Llama final : public DecoderModel {
public:
    Llama(const gguf::GgufFile& file, Hparams hp, Variant variant, const LoadOptions& options)
        : DecoderModel(file, std::move(hp), options), variant_(variant), w_(bind_llama_weights(file, hp_, variant)) {
        mem_.place_weights(w_);  // the offloaded layers' views point at the device's copies
    }

    void forward(const Batch& batch, kv::ModelCache& cache, float* logits_out, ops::ThreadPool& pool) override {
        const Hparams& hp = hp_;
        const ops::RopeParams rope = rope_params();
        ops::RopeParams rope_swa = rope;  // gpt-oss's sliding-window layers: their own base
        rope_swa.freq_base = hp.rope_base_swa;
        const ops::RopeParams no_rope{.n_dims = 0};  // SmolLM3's NoPE layers
        const auto rope_of = [&](int il) -> const ops::RopeParams& {
            if (!hp.rotates(il)) return no_rope;
            return variant_.gpt_oss && hp.is_swa[static_cast<size_t>(il)] ? rope_swa : rope;
        };
        const BatchRows rows = begin_batch(hp, batch, cache, mem_, pool, rope_of);
        const std::span<const ops::TokenPlace> places =
            batch_places(batch, mem_, rows);  // where each token sits in its run
        const int n = rows.n;
        const int64_t E = hp.n_embd;
        const int64_t q_dim = int64_t{hp.n_head} * hp.head_dim;
        const int64_t kv_dim = int64_t{hp.n_head_kv} * hp.head_dim;
        const MoeLayout moe = activation_layout(hp, n).moe;  // in the host's work buffer

        ops::embedding_rows(w_.token_embd, batch.tokens.data(), n, mem_.a.x.data());             // x: [n, n_embd]
        if (hp.embedding_scale != 0.0f) ops::scale(mem_.a.x.data(), n * E, hp.embedding_scale);  // Granite
        if (ExpertCache* experts = mem_.experts()) experts->count_tokens(n);

        for (int il = 0; il < hp.n_layer; ++il) {
            const LayerRef<LlamaLayer> L = mem_.layer(w_.layers, il);  // waits for a streamed layer
            Exec& o = mem_.enter(il);  // the ops and activations of the device that runs layer il
            float* x = o.x;
            float* cur = o.cur;

            // Attention block (OLMo 2: on x itself).
            const float* attn_in = x;
            if (L->attn_norm) {
                o.rms_norm(x, L->attn_norm, hp.norm_eps, n, E, cur);
                attn_in = cur;
            }
            o.matmul(L->wq, attn_in, n, o.q, places);  // q: [n, n_head, head_dim]
            o.matmul(L->wk, attn_in, n, o.k, places);  // k: [n, n_head_kv, head_dim]
            o.matmul(L->wv, attn_in, n, o.v, places);  // v: [n, n_head_kv, head_dim]
            if (L->bq) o.add_bias(o.q, L->bq, n, q_dim);
            if (L->bk) o.add_bias(o.k, L->bk, n, kv_dim);
            if (L->bv) o.add_bias(o.v, L->bv, n, kv_dim);
            if (variant_.qk_norm == QkNorm::PerHead) {
                o.rms_norm(o.q, L->q_norm, hp.norm_eps, int64_t{n} * hp.n_head, hp.head_dim, o.q);
                o.rms_norm(o.k, L->k_norm, hp.norm_eps, int64_t{n} * hp.n_head_kv, hp.head_dim, o.k);
            } else if (variant_.qk_norm == QkNorm::Whole) {
                o.rms_norm(o.q, L->q_norm, hp.norm_eps, n, q_dim, o.q);
                o.rms_norm(o.k, L->k_norm, hp.norm_eps, n, kv_dim, o.k);
            }
            o.rope(o.q, rows.positions, n, hp.n_head, hp.head_dim, rope_of(il));
            o.rope(o.k, rows.positions, n, hp.n_head_kv, hp.head_dim, rope_of(il));
            o.store_kv(cache, il, o.k, o.v, o.q, rows, hp, rope_of(il));           // q: for the K transform's fit
            if (hp.attn_temp_scale != 0.0f) scale_by_temperature(o, rows, q_dim);  // Mistral 3
            const int window = variant_.gpt_oss && hp.is_swa[static_cast<size_t>(il)] ? hp.sliding_window : 0;
            attend(o, hp, cache, il, o.q, rows, hp.attn_scale, window, o.attn,
                   L->attn_sinks);                           // attn: [n, n_head * head_dim]
            o.matmul(L->wo, o.attn, n, o.attn_out, places);  // attn_out: [n, n_embd]
            if (L->bo) o.add_bias(o.attn_out, L->bo, n, E);
            if (L->attn_post_norm) o.rms_norm(o.attn_out, L->attn_post_norm, hp.norm_eps, n, E, o.attn_out);
            if (hp.residual_scale != 0.0f) o.scale(o.attn_out, n * E, hp.residual_scale);  // Granite
            o.add(x, o.attn_out, n * E, x);

            // Feed-forward block: down(silu(gate(h)) * up(h)), a slice of tokens at a time; with
            // experts, the chosen experts' outputs weighted and summed. The host routes: an
            // offloaded layer's normed rows go to the host's cur; its experts run on the device
            // (moe_experts_on_device), or, kept on the host (model/offload.h experts_on_host), there,
            // and the block's output comes back.
            if (L->ffn_norm) {
                o.rms_norm(x, L->ffn_norm, hp.norm_eps, n, E, cur);
            } else {
                o.copy(x, n * E, cur);  // OLMo 2: the block's input is x itself
            }
            for (int t0 = 0; t0 < n; t0 += o.ffn_slice) {
                const int m = std::min(o.ffn_slice, n - t0);
                float* h = cur + t0 * E;
                if (variant_.moe) {
                    float* hh = o.on_device() ? mem_.a.cur.data() + t0 * E : h;
                    const bool dev_experts = o.on_device() && !mem_.placement().host_experts(il);
                    // Qwen2-MoE: the shared expert's output first (it hands h to the host).
                    const float* shared = variant_.shared_expert ? shared_expert(o, L->shexp, h, hh, m, moe,
                                                                                 places_of(places, t0, m), dev_experts)
                                                                 : nullptr;
                    if (o.on_device() && !shared) mem_.to_host(hh, h, m * E);
                    if (dev_experts) {
                        float* work = mem_.a.work.data();
                        moe_route(hp, L->moe, hh, m, work, moe, places_of(places, t0, m), pool, mem_.scratch);
                        const DeviceMoeBuffers b = mem_.device_moe();
                        moe_experts_on_device(*mem_.placement().device, hp, L->moe, h, m, work, moe, b);
                        if (shared) {  // routed + shared, as on the host
                            mem_.to_device(b.in, shared, m * E);
                            o.add(h, b.in, m * E, h);
                        }
                        continue;
                    }
                    moe_ffn(hp, L->moe, hh, m, mem_.a.work.data(), moe, places_of(places, t0, m), pool, mem_.scratch,
                            mem_.experts(), il);
                    if (shared) ops::add(hh, shared, m * E, hh);  // routed + shared, as llama.cpp adds them
                    if (o.on_device()) mem_.to_device(h, hh, m * E);
                    continue;
                }
                o.matmul(L->ffn_gate, h, m, o.gate, places_of(places, t0, m));  // gate: [m, n_ff]
                o.matmul(L->ffn_up, h, m, o.up, places_of(places, t0, m));      // up: [m, n_ff]
                o.swiglu(o.gate, o.up, int64_t{m} * hp.n_ff, o.gate);
                o.matmul(L->ffn_down, o.gate, m, h, places_of(places, t0, m));  // h: [m, n_embd], over its read rows
            }
            if (L->ffn_post_norm) o.rms_norm(cur, L->ffn_post_norm, hp.norm_eps, n, E, cur);
            if (hp.residual_scale != 0.0f) o.scale(cur, n * E, hp.residual_scale);  // Granite
            o.add(x, cur, n * E, x);
            // One token: read ahead the experts layer il + 1's router would choose from x now
            // (its input, but for that layer's attention), while that attention computes.
            ExpertCache* experts = mem_.experts();
            if (experts && experts->prefetching() && n == 1 && il + 1 < hp.n_layer)
                prefetch_experts(*experts, il + 1, x, pool);
        }
        cache.end_batch();

        output_logits(batch, rows, w_.output_norm, w_.output, logits_out);
    }

private:
    // Qwen2-MoE's shared expert over m tokens whose normed input h [m, n_embd] is on o's device:
    // down(silu(gate h) * up h) times sigmoid(gate_inp . h) per token, as llama.cpp's qwen2moe graph
    // (its sigmoid is silu(x) / x), on that device; returns it in the host's work buffer (l.sh_out),
    // where moe_ffn leaves it alone. hh: the host's copy of h for the routing (h itself on the
    // host; on a device, copied here before h takes the expert's output, or, with the routed
    // experts on the device (dev_experts), h kept for them and the output in their outs buffer).
    const float* shared_expert(Exec& o, const SharedExpert& w, float* h, float* hh, int m, const MoeLayout& l,
                               std::span<const ops::TokenPlace> places, bool dev_experts) {
        const int64_t E = hp_.n_embd;
        const int64_t F = hp_.n_ff_shexp;
        float* work = mem_.a.work.data();
        float* gate = o.on_device() ? o.gate : work + l.sh_gate;  // [m, F]
        float* up = o.on_device() ? o.up : work + l.sh_up;        // [m, F]
        float* out = work + l.sh_out;                             // [m, E] (host)
        float* g = work + l.sh_w;                                 // [m] (host)
        o.matmul(w.gate, h, m, gate, places);
        o.matmul(w.up, h, m, up, places);
        o.swiglu(gate, up, int64_t{m} * F, gate);
        float* g_here = o.on_device() ? o.up : g;  // up is free after the swiglu
        o.matmul(w.gate_inp, h, m, g_here, places);
        if (o.on_device()) {
            mem_.to_host(hh, h, m * E);
            float* down = dev_experts ? mem_.device_moe().outs : h;  // h is free now, unless the experts read it
            o.matmul(w.down, gate, m, down, places);
            mem_.to_host(out, down, m * E);
            mem_.to_host(g, g_here, m);
        } else {
            o.matmul(w.down, gate, m, out, places);
        }
        for (int t = 0; t < m; ++t) {
            const float x = g[t];
            ops::scale(out + t * E, E, x == 0.0f ? 0.5f : ops::silu(x) / x);
        }
        return out;
    }

    // Q (q_dim per token) times the attention temperature of each token's position (Mistral 3),
    // one scale per run of tokens with the same factor.
    void scale_by_temperature(Exec& o, const BatchRows& rows, int64_t q_dim) const {
        for (int t0 = 0; t0 < rows.n;) {
            const float f = hp_.attn_temp(rows.positions[t0]);
            int t1 = t0 + 1;
            while (t1 < rows.n && hp_.attn_temp(rows.positions[t1]) == f) ++t1;
            if (f != 1.0f) o.scale(o.q + t0 * q_dim, (t1 - t0) * q_dim, f);
            t0 = t1;
        }
    }

    // The experts layer il's router picks for the token whose hidden state is x (before that
    // layer's attention: a guess), queued for the expert cache to read ahead. Changes no output.
    void prefetch_experts(ExpertCache& experts, int il, const float* x, ops::ThreadPool& pool) {
        const Hparams& hp = hp_;
        const LlamaLayer& L = w_.layers[static_cast<size_t>(il)];
        predict_.resize(static_cast<size_t>(hp.n_embd + hp.n_expert));
        float* h = predict_.data();
        float* scores = h + hp.n_embd;
        ops::rms_norm(x, L.ffn_norm, hp.norm_eps, 1, hp.n_embd, h);
        ops::matmul(L.moe.router, h, 1, scores, pool, mem_.scratch);
        if (L.moe.router_b) ops::add(scores, L.moe.router_b, hp.n_expert, scores);  // gpt-oss
        int32_t chosen[kMaxExpertsUsed];
        for (int r = 0; r < hp.n_expert_used; ++r) {
            int best = -1;
            for (int e = 0; e < hp.n_expert; ++e) {
                bool taken = false;
                for (int j = 0; j < r && !taken; ++j) taken = chosen[j] == e;
                if (!taken && (best < 0 || scores[e] > scores[best])) best = e;
            }
            chosen[r] = best;
        }
        experts.prefetch(il, chosen, hp.n_expert_used);
    }

    ops::RopeParams rope_params() const {
        return hparams_rope(hp_, variant_.rope_mode, variant_.rope_freqs ? w_.rope_freqs : nullptr);
    }

    Variant variant_;
    LlamaWeights w_;
    std::vector<float> predict_;  // prefetch_experts(): n_embd + n_expert floats (not charged: a few KiB)
};

std::unique_ptr<Model> load_llama(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options) {
    return std::make_unique<Llama>(file, std::move(hp), kLlamaVariant, options);
}

std::unique_ptr<Model> load_qwen2(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options) {
    return std::make_unique<Llama>(file, std::move(hp), kQwen2Variant, options);
}

std::unique_ptr<Model> load_qwen3(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options) {
    return std::make_unique<Llama>(file, std::move(hp), kQwen3Variant, options);
}

std::unique_ptr<Model> load_smollm3(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options) {
    return std::make_unique<Llama>(file, std::move(hp), kSmolLm3Variant, options);
}

std::unique_ptr<Model> load_olmo2(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options) {
    return std::make_unique<Llama>(file, std::move(hp), kOlmo2Variant, options);
}

std::unique_ptr<Model> load_qwen2moe(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options) {
    return std::make_unique<Llama>(file, std::move(hp), kQwen2MoeVariant, options);
}

// gpt-oss: attention sinks run on the CPU and the virtual device (ops::attention_kv); a device
// whose attention lacks them (CUDA's) is refused before anything is loaded.
std::unique_ptr<Model> load_gpt_oss(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options) {
    if (options.offload != nullptr && options.n_offload_layers > 0 && !options.offload->attention_sinks()) {
        throw std::invalid_argument(file.source() + ": " + hp.arch + "'s attention sinks are not implemented on " +
                                    options.offload->name() +
                                    "; run it on the CPU (no -ngl) or on the virtual device (--device virtual)");
    }
    return std::make_unique<Llama>(file, std::move(hp), kGptOssVariant, options);
}

std::unique_ptr<Model> load_qwen3moe(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options) {
    return std::make_unique<Llama>(file, std::move(hp), kQwen3MoeVariant, options);
}

// "llama": Mixtral (the llama variant with routed experts) when the file declares experts.
std::unique_ptr<Model> load_llama_arch(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options) {
    if (hp.n_expert == 0) return load_llama(file, std::move(hp), options);
    return std::make_unique<Llama>(file, std::move(hp), kMixtralVariant, options);
}

}  // namespace

extern const Architecture kLlama{"llama", read_llama_arch_hparams, load_llama_arch};
extern const Architecture kQwen2{"qwen2", read_llama_hparams, load_qwen2};
extern const Architecture kQwen3{"qwen3", read_llama_hparams, load_qwen3};
extern const Architecture kGranite{"granite", read_granite_hparams, load_llama};
extern const Architecture kOlmo2{"olmo2", read_olmo2_hparams, load_olmo2};
extern const Architecture kSmolLm3{"smollm3", read_smollm3_hparams, load_smollm3};
extern const Architecture kMistral3{"mistral3", read_mistral3_hparams, load_llama};
extern const Architecture kQwen3Moe{"qwen3moe", read_qwen3moe_hparams, load_qwen3moe};
extern const Architecture kQwen2Moe{"qwen2moe", read_qwen2moe_hparams, load_qwen2moe};
extern const Architecture kGptOss{"gpt-oss", read_gpt_oss_hparams, load_gpt_oss};

}  // namespace fitllm::model
