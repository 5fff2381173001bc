#include "model/hparams.h"

#include <cmath>

namespace fitllm::model {
namespace {

// The value under `key` as a positive int, or a ModelError naming file and key.
int positive_int(const gguf::GgufFile& file, const std::string& key) {
    if (!file.has(key)) throw ModelError(file.source() + ": missing metadata key '" + key + "'");
    const int64_t v = file.get_int(key);
    if (v <= 0 || v > (int64_t{1} << 30)) {
        throw ModelError(file.source() + ": metadata '" + key + "' = " + std::to_string(v) +
                         " is out of range; expected a positive count");
    }
    return static_cast<int>(v);
}

int optional_int(const gguf::GgufFile& file, const std::string& key, int fallback) {
    return file.has(key) ? positive_int(file, key) : fallback;
}

float optional_float(const gguf::GgufFile& file, const std::string& key, float fallback) {
    return file.has(key) ? static_cast<float>(file.get_double(key)) : fallback;
}

// Linear RoPE scaling: positions scaled by 1 / rope.scaling.factor (or the older
// rope.scale_linear). llama.cpp applies that factor unless rope.scaling.type is "none", and so do
// we; other types (yarn, longrope) are refused by name.
float read_rope_freq_scale(const gguf::GgufFile& file, const std::string& p) {
    const std::string type_key = p + "rope.scaling.type";
    const std::string type = file.has(type_key) ? std::string(file.get<std::string_view>(type_key)) : "linear";
    if (type != "linear" && type != "none") {
        throw ModelError(file.source() + ": '" + type_key + "' = '" + type +
                         "' is not supported (fitllm supports 'linear' and 'none')");
    }
    std::string factor_key = p + "rope.scaling.factor";
    if (!file.has(factor_key)) factor_key = p + "rope.scale_linear";
    const float factor = optional_float(file, factor_key, 0.0f);
    if (factor < 0.0f || !std::isfinite(factor)) {
        throw ModelError(file.source() + ": '" + factor_key + "' = " + std::to_string(factor) +
                         " must be positive (or 0 for none)");
    }
    return (type == "none" || factor == 0.0f) ? 1.0f : 1.0f / factor;
}

// Gemma 3 (llama.cpp's LLM_ARCH_GEMMA3): five sliding-window layers, then one global layer;
// local layers rotate with base 10000 and no position scaling (global layers of the 4B and larger
// models scale linearly, by 1/8); Q is scaled by 1/sqrt(head_dim) (27B: by
// 1/sqrt(n_embd / n_head), which its 62 layers identify).
void read_gemma3(const gguf::GgufFile& file, Hparams& hp) {
    const std::string p = hp.arch + ".";
    hp.sliding_window = optional_int(file, p + "attention.sliding_window", 0);
    hp.is_swa.assign(static_cast<size_t>(hp.n_layer), false);
    if (hp.sliding_window > 0) {
        constexpr int kPattern = 6;  // layers il % 6 < 5 are local
        for (int il = 0; il < hp.n_layer; ++il) hp.is_swa[static_cast<size_t>(il)] = il % kPattern < kPattern - 1;
    }
    hp.rope_base_swa = 10000.0f;
    hp.rope_freq_scale = read_rope_freq_scale(file, p);
    hp.final_logit_softcap = optional_float(file, p + "final_logit_softcapping", 0.0f);
    hp.attn_scale = hp.n_layer == 62 ? 1.0f / std::sqrt(static_cast<float>(hp.n_embd / hp.n_head))
                                     : 1.0f / std::sqrt(static_cast<float>(hp.head_dim));
}

// Llama (2, 3, 3.x, Mistral, TinyLlama, SmolLM2) and Qwen2 (llama.cpp's LLM_ARCH_LLAMA and
// LLM_ARCH_QWEN2): every layer attends globally; the first n_rot dims of each head rotate.
// Llama 3.1's frequency factors come as a tensor (rope_freqs.weight), bound with the weights.
void read_llama_like(const gguf::GgufFile& file, Hparams& hp) {
    const std::string p = hp.arch + ".";
    if (file.has(p + "expert_count") && file.get_int(p + "expert_count") > 0) {
        throw ModelError(file.source() + ": '" + p +
                         "expert_count' = " + std::to_string(file.get_int(p + "expert_count")) +
                         ": mixture-of-experts models (Mixtral) are not supported");
    }
    hp.is_swa.assign(static_cast<size_t>(hp.n_layer), false);
    hp.rope_base_swa = hp.rope_base;
    if (hp.head_dim_v != hp.head_dim) {
        throw ModelError(file.source() + ": '" + p + "attention.value_length' = " + std::to_string(hp.head_dim_v) +
                         " differs from '" + p + "attention.key_length' = " + std::to_string(hp.head_dim) + "; " +
                         hp.arch + " needs equal K and V head sizes");
    }
    hp.n_rot = optional_int(file, p + "rope.dimension_count", hp.head_dim);
    if (hp.n_rot % 2 != 0 || hp.n_rot > hp.head_dim) {
        throw ModelError(file.source() + ": '" + p + "rope.dimension_count' = " + std::to_string(hp.n_rot) +
                         " must be even and at most the head size " + std::to_string(hp.head_dim));
    }

    hp.rope_freq_scale = read_rope_freq_scale(file, p);

    // attention.scale (Granite-style Llamas) replaces 1/sqrt(head_dim) when present.
    const float scale = optional_float(file, p + "attention.scale", 0.0f);
    hp.attn_scale = scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(hp.head_dim));
}

}  // namespace

Hparams read_hparams(const gguf::GgufFile& file) {
    Hparams hp;
    if (!file.has("general.architecture")) {
        throw ModelError(file.source() + ": missing metadata key 'general.architecture'");
    }
    hp.arch = std::string(file.get<std::string_view>("general.architecture"));
    if (hp.arch != "gemma3" && hp.arch != "llama" && hp.arch != "qwen2") {
        throw ModelError(file.source() + ": architecture '" + hp.arch +
                         "' is not supported (fitllm runs: " + kSupportedArchitectures + ")");
    }
    const std::string p = hp.arch + ".";
    hp.n_layer = positive_int(file, p + "block_count");
    hp.n_embd = positive_int(file, p + "embedding_length");
    hp.n_head = positive_int(file, p + "attention.head_count");
    hp.n_head_kv = optional_int(file, p + "attention.head_count_kv", hp.n_head);
    hp.head_dim = optional_int(file, p + "attention.key_length", hp.n_embd / hp.n_head);
    hp.head_dim_v = optional_int(file, p + "attention.value_length", hp.head_dim);
    hp.n_ff = positive_int(file, p + "feed_forward_length");
    hp.n_ctx_train = positive_int(file, p + "context_length");
    const std::string eps_key = p + "attention.layer_norm_rms_epsilon";
    if (!file.has(eps_key)) throw ModelError(file.source() + ": missing metadata key '" + eps_key + "'");
    hp.norm_eps = static_cast<float>(file.get_double(eps_key));
    hp.rope_base = optional_float(file, p + "rope.freq_base", 10000.0f);
    hp.n_rot = hp.head_dim;

    if (hp.n_head % hp.n_head_kv != 0) {
        throw ModelError(file.source() + ": '" + p + "attention.head_count' = " + std::to_string(hp.n_head) +
                         " is not a multiple of '" + p + "attention.head_count_kv' = " + std::to_string(hp.n_head_kv));
    }
    if (hp.head_dim % 2 != 0) {
        throw ModelError(file.source() + ": '" + p + "attention.key_length' = " + std::to_string(hp.head_dim) +
                         " is odd; rotary embeddings need an even head size");
    }
    if (!(hp.norm_eps > 0.0f)) {
        throw ModelError(file.source() + ": '" + eps_key + "' = " + std::to_string(hp.norm_eps) + " must be positive");
    }
    // The vocabulary size is the embedding's row count; the weights check it against the tensor.
    const gguf::TensorInfo* embd = file.find_tensor("token_embd.weight");
    if (!embd) throw ModelError(file.source() + ": missing tensor 'token_embd.weight'");
    hp.n_vocab = static_cast<int>(embd->ne[1]);

    if (hp.arch == "gemma3") {
        read_gemma3(file, hp);
    } else {
        read_llama_like(file, hp);
    }
    return hp;
}

}  // namespace fitllm::model
