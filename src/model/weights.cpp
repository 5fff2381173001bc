#include "model/weights.h"

#include "quant/ggml_type.h"

namespace fitllm::model {
namespace {

std::string shape_string(const gguf::TensorInfo& t) {
    std::string s = "[";
    for (uint32_t d = 0; d < t.n_dims; ++d) {
        if (d) s += ", ";
        s += std::to_string(t.ne[d]);
    }
    return s + "]";
}

}  // namespace

const gguf::TensorInfo& TensorBinder::find(const std::string& name) const {
    const gguf::TensorInfo* t = file_.find_tensor(name);
    if (!t) throw ModelError(file_.source() + ": missing tensor '" + name + "'");
    return *t;
}

ops::WeightView TensorBinder::matrix(const std::string& name, int64_t rows, int64_t cols) const {
    const gguf::TensorInfo& t = find(name);
    if (t.n_dims != 2 || t.ne[0] != cols || t.ne[1] != rows) {
        throw ModelError(file_.source() + ": tensor '" + name + "' has shape " + shape_string(t) + "; expected [" +
                         std::to_string(cols) + ", " + std::to_string(rows) + "] (ne order)");
    }
    ops::WeightView w;
    w.type = t.type;
    w.rows = rows;
    w.cols = cols;
    w.data = t.data.data();
    if (w.stride() == 0 || static_cast<uint64_t>(w.stride()) * static_cast<uint64_t>(rows) != t.n_bytes) {
        throw ModelError(file_.source() + ": tensor '" + name + "' of type " +
                         std::string(quant::type_name(static_cast<uint32_t>(t.type))) + " cannot be read as " +
                         std::to_string(rows) + " rows of " + std::to_string(cols) + " values");
    }
    return w;
}

ops::WeightView TensorBinder::optional_matrix(const std::string& name, int64_t rows, int64_t cols) const {
    if (!file_.find_tensor(name)) return {};
    return matrix(name, rows, cols);
}

const float* TensorBinder::vector(const std::string& name, int64_t n) const {
    const gguf::TensorInfo& t = find(name);
    if (t.n_elements != static_cast<uint64_t>(n) || t.ne[0] != n) {
        throw ModelError(file_.source() + ": tensor '" + name + "' has shape " + shape_string(t) + "; expected [" +
                         std::to_string(n) + "]");
    }
    if (t.type != quant::GgmlType::F32) {
        throw ModelError(file_.source() + ": tensor '" + name + "' has type " +
                         std::string(quant::type_name(static_cast<uint32_t>(t.type))) + "; expected F32");
    }
    return reinterpret_cast<const float*>(t.data.data());
}

const float* TensorBinder::optional_vector(const std::string& name, int64_t n) const {
    if (!file_.find_tensor(name)) return nullptr;
    return vector(name, n);
}

void TensorBinder::refuse(const std::string& name, const std::string& why) const {
    if (file_.find_tensor(name)) throw ModelError(file_.source() + ": tensor '" + name + "' is not supported: " + why);
}

Gemma3Weights bind_gemma3_weights(const gguf::GgufFile& file, const Hparams& hp) {
    const TensorBinder b(file);
    Gemma3Weights w;
    w.token_embd = b.matrix("token_embd.weight", hp.n_vocab, hp.n_embd);
    w.output_norm = b.vector("output_norm.weight", hp.n_embd);
    w.output = b.optional_matrix("output.weight", hp.n_vocab, hp.n_embd);
    if (!w.output.data) w.output = w.token_embd;  // tied
    const int64_t q_dim = int64_t{hp.n_head} * hp.head_dim;
    const int64_t k_dim = int64_t{hp.n_head_kv} * hp.head_dim;
    const int64_t v_dim = int64_t{hp.n_head_kv} * hp.head_dim_v;
    const int64_t o_dim = int64_t{hp.n_head} * hp.head_dim_v;
    for (int il = 0; il < hp.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        Gemma3Layer L;
        L.attn_norm = b.vector(p + "attn_norm.weight", hp.n_embd);
        L.wq = b.matrix(p + "attn_q.weight", q_dim, hp.n_embd);
        L.wk = b.matrix(p + "attn_k.weight", k_dim, hp.n_embd);
        L.wv = b.matrix(p + "attn_v.weight", v_dim, hp.n_embd);
        L.q_norm = b.vector(p + "attn_q_norm.weight", hp.head_dim);
        L.k_norm = b.vector(p + "attn_k_norm.weight", hp.head_dim);
        L.wo = b.matrix(p + "attn_output.weight", hp.n_embd, o_dim);
        L.post_attn_norm = b.vector(p + "post_attention_norm.weight", hp.n_embd);
        L.ffn_norm = b.vector(p + "ffn_norm.weight", hp.n_embd);
        L.ffn_gate = b.matrix(p + "ffn_gate.weight", hp.n_ff, hp.n_embd);
        L.ffn_up = b.matrix(p + "ffn_up.weight", hp.n_ff, hp.n_embd);
        L.ffn_down = b.matrix(p + "ffn_down.weight", hp.n_embd, hp.n_ff);
        L.post_ffn_norm = b.vector(p + "post_ffw_norm.weight", hp.n_embd);
        w.layers.push_back(L);
    }
    return w;
}

LlamaWeights bind_llama_weights(const gguf::GgufFile& file, const Hparams& hp, QkvBias qkv_bias) {
    const TensorBinder b(file);
    LlamaWeights w;
    w.token_embd = b.matrix("token_embd.weight", hp.n_vocab, hp.n_embd);
    w.output_norm = b.vector("output_norm.weight", hp.n_embd);
    w.output = b.optional_matrix("output.weight", hp.n_vocab, hp.n_embd);
    if (!w.output.data) w.output = w.token_embd;  // tied
    if (hp.arch == "llama") w.rope_freqs = b.optional_vector("rope_freqs.weight", hp.n_rot / 2);
    const int64_t q_dim = int64_t{hp.n_head} * hp.head_dim;
    const int64_t kv_dim = int64_t{hp.n_head_kv} * hp.head_dim;
    const auto bias = [&](const std::string& name, int64_t n) {
        return qkv_bias == QkvBias::Required ? b.vector(name, n) : b.optional_vector(name, n);
    };
    for (int il = 0; il < hp.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        LlamaLayer L;
        L.attn_norm = b.vector(p + "attn_norm.weight", hp.n_embd);
        L.wq = b.matrix(p + "attn_q.weight", q_dim, hp.n_embd);
        L.wk = b.matrix(p + "attn_k.weight", kv_dim, hp.n_embd);
        L.wv = b.matrix(p + "attn_v.weight", kv_dim, hp.n_embd);
        L.bq = bias(p + "attn_q.bias", q_dim);
        L.bk = bias(p + "attn_k.bias", kv_dim);
        L.bv = bias(p + "attn_v.bias", kv_dim);
        L.wo = b.matrix(p + "attn_output.weight", hp.n_embd, q_dim);
        L.bo = b.optional_vector(p + "attn_output.bias", hp.n_embd);
        L.ffn_norm = b.vector(p + "ffn_norm.weight", hp.n_embd);
        L.ffn_gate = b.matrix(p + "ffn_gate.weight", hp.n_ff, hp.n_embd);
        L.ffn_up = b.matrix(p + "ffn_up.weight", hp.n_ff, hp.n_embd);
        L.ffn_down = b.matrix(p + "ffn_down.weight", hp.n_embd, hp.n_ff);
        for (const char* t : {"ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"}) {
            b.refuse(p + t, "feed-forward biases are not implemented for " + hp.arch);
        }
        w.layers.push_back(L);
    }
    return w;
}

}  // namespace fitllm::model
