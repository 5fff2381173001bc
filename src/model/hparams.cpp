#include "model/hparams.h"

#include <cmath>

#include "model/architecture.h"
#include "ops/rope.h"

namespace fitllm::model {

void HparamReader::sliding_window_layers(Hparams& hp, int default_period) const {
    const auto n_layer = static_cast<size_t>(hp.n_layer);
    hp.is_swa.assign(n_layer, false);
    const std::string name = "attention.sliding_window_pattern";
    int period = default_period;
    if (const gguf::Value* v = file_.find(key(name)); v && v->is_array()) {
        if (v->array_type() != gguf::ValueType::BOOL || v->array_size() != n_layer) {
            refuse(name, v->type_name() + " of " + std::to_string(v->array_size()),
                   "expected one bool per layer (" + std::to_string(hp.n_layer) + ")");
        }
        const std::vector<bool> flags = v->array<bool>();
        for (size_t il = 0; il < n_layer; ++il) hp.is_swa[il] = flags[il];
        return;
    } else if (v) {
        const int64_t p = v->to_int();
        if (p < 0 || p > hp.n_layer) refuse(name, std::to_string(p), "must be 0 .. block_count");
        period = static_cast<int>(p);
    }
    for (int il = 0; il < hp.n_layer; ++il)
        hp.is_swa[static_cast<size_t>(il)] = period == 0 || il % period < period - 1;
}

int HparamReader::count(const std::string& name) const {
    const std::string k = key(name);
    if (!file_.has(k)) throw ModelError(file_.source() + ": missing metadata key '" + k + "'");
    const int64_t v = file_.get_int(k);
    if (v <= 0 || v > (int64_t{1} << 30)) {
        throw ModelError(file_.source() + ": metadata '" + k + "' = " + std::to_string(v) +
                         " is out of range; expected a positive count");
    }
    return static_cast<int>(v);
}

float HparamReader::number_or(const std::string& name, float fallback) const {
    return has(name) ? static_cast<float>(file_.get_double(key(name))) : fallback;
}

void HparamReader::refuse(const std::string& name, const std::string& value, const std::string& why) const {
    throw ModelError(file_.source() + ": '" + key(name) + "' = " + value + ": " + why);
}

// llama.cpp applies the linear factor unless rope.scaling.type is "none", and so do we.
float HparamReader::rope_freq_scale() const {
    const std::string type =
        has("rope.scaling.type") ? std::string(file_.get<std::string_view>(key("rope.scaling.type"))) : "linear";
    if (type != "linear" && type != "none") {
        refuse("rope.scaling.type", "'" + type + "'", "not supported (fitllm supports 'linear' and 'none')");
    }
    const std::string factor_name = has("rope.scaling.factor") ? "rope.scaling.factor" : "rope.scale_linear";
    const float factor = number_or(factor_name, 0.0f);
    if (factor < 0.0f || !std::isfinite(factor)) {
        refuse(factor_name, std::to_string(factor), "must be positive (or 0 for none)");
    }
    return (type == "none" || factor == 0.0f) ? 1.0f : 1.0f / factor;
}

void HparamReader::rope_scaling(Hparams& hp) const {
    const std::string type =
        has("rope.scaling.type") ? std::string(file_.get<std::string_view>(key("rope.scaling.type"))) : "linear";
    if (type != "yarn") {
        if (type != "linear" && type != "none") {
            refuse("rope.scaling.type", "'" + type + "'",
                   "not supported (fitllm supports 'linear', 'yarn' and 'none')");
        }
        hp.rope_freq_scale = rope_freq_scale();
        return;
    }
    const float factor = number_or("rope.scaling.factor", 0.0f);
    if (!(factor >= 1.0f) || !std::isfinite(factor)) {
        refuse("rope.scaling.factor", std::to_string(factor), "YaRN needs a factor of at least 1");
    }
    hp.rope_freq_scale = 1.0f / factor;
    hp.rope_ext_factor = number_or("rope.scaling.yarn_ext_factor", 1.0f);
    hp.rope_attn_factor = number_or("rope.scaling.yarn_attn_factor", 1.0f);
    const float beta_fast = number_or("rope.scaling.yarn_beta_fast", 32.0f);
    const float beta_slow = number_or("rope.scaling.yarn_beta_slow", 1.0f);
    const int n_ctx_orig = count_or("rope.scaling.original_context_length", hp.n_ctx_train);
    for (const auto& [name, v] :
         {std::pair{"rope.scaling.yarn_ext_factor", hp.rope_ext_factor},
          std::pair{"rope.scaling.yarn_attn_factor", hp.rope_attn_factor},
          std::pair{"rope.scaling.yarn_beta_fast", beta_fast}, std::pair{"rope.scaling.yarn_beta_slow", beta_slow}}) {
        if (!std::isfinite(v) || v < 0.0f) refuse(name, std::to_string(v), "must be a finite number >= 0");
    }
    ops::yarn_corr_dims(hp.n_rot, n_ctx_orig, hp.rope_base, beta_fast, beta_slow, &hp.rope_corr_low,
                        &hp.rope_corr_high);
}

Hparams read_hparams(const gguf::GgufFile& file) {
    Hparams hp;
    if (!file.has("general.architecture")) {
        throw ModelError(file.source() + ": missing metadata key 'general.architecture'");
    }
    hp.arch = std::string(file.get<std::string_view>("general.architecture"));
    const Architecture* architecture = find_architecture(hp.arch);
    if (architecture == nullptr) {
        throw ModelError(file.source() + ": architecture '" + hp.arch +
                         "' is not supported (fitllm runs: " + architecture_names() + ")");
    }
    const std::string p = hp.arch + ".";
    const HparamReader r(file, hp.arch);
    hp.n_layer = r.count("block_count");
    hp.n_embd = r.count("embedding_length");
    hp.n_head = r.count("attention.head_count");
    hp.n_head_kv = r.count_or("attention.head_count_kv", hp.n_head);
    hp.head_dim = r.count_or("attention.key_length", hp.n_embd / hp.n_head);
    hp.head_dim_v = r.count_or("attention.value_length", hp.head_dim);
    hp.n_ff = r.count("feed_forward_length");
    hp.n_ctx_train = r.count("context_length");
    const std::string eps_key = p + "attention.layer_norm_rms_epsilon";
    if (!file.has(eps_key)) throw ModelError(file.source() + ": missing metadata key '" + eps_key + "'");
    hp.norm_eps = static_cast<float>(file.get_double(eps_key));
    hp.rope_base = r.number_or("rope.freq_base", 10000.0f);
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

    architecture->read_hparams(r, hp);
    // As llama.cpp for every architecture: cos and sin scaled by rope.scaling.attn_factor on top of
    // what the architecture's scaling set (its yarn_attn_factor *= rope_attn_factor).
    const float attn_factor = r.number_or("rope.scaling.attn_factor", 1.0f);
    if (!(attn_factor > 0.0f) || !std::isfinite(attn_factor)) {
        r.refuse("rope.scaling.attn_factor", std::to_string(attn_factor), "must be a positive number");
    }
    hp.rope_attn_factor *= attn_factor;
    return hp;
}

}  // namespace fitllm::model
