#pragma once
// Binding a model's tensors by name, with their shapes checked against the hyper-parameters.
// The weights are views into the mapped GGUF file: nothing is copied.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "model/hparams.h"
#include "ops/weight_view.h"

namespace fitllm::model {

// Looks tensors up in one file and checks what it finds; every error is a ModelError naming the
// file, the tensor, and the expected and actual shape or type.
class TensorBinder {
public:
    explicit TensorBinder(const gguf::GgufFile& file) : file_(file) {}
    // A matrix of `rows` outputs by `cols` inputs (GGUF ne = [cols, rows]), any type matmul reads.
    ops::WeightView matrix(const std::string& name, int64_t rows, int64_t cols) const;
    // As matrix(), or a view with data == nullptr when the file has no such tensor.
    ops::WeightView optional_matrix(const std::string& name, int64_t rows, int64_t cols) const;
    // A float vector of n values (norm weights, biases).
    const float* vector(const std::string& name, int64_t n) const;
    // As vector(), or nullptr when the file has no such tensor.
    const float* optional_vector(const std::string& name, int64_t n) const;
    // Throws a ModelError naming the tensor if the file has it: for tensors a forward pass would
    // otherwise silently leave out.
    void refuse(const std::string& name, const std::string& why) const;

private:
    const gguf::TensorInfo& find(const std::string& name) const;
    const gguf::GgufFile& file_;
};

// Gemma 3, one block. Shapes as [rows (outputs), cols (inputs)].
struct Gemma3Layer {
    const float* attn_norm = nullptr;       // [n_embd]
    ops::WeightView wq;                     // [n_head * head_dim, n_embd]
    ops::WeightView wk;                     // [n_head_kv * head_dim, n_embd]
    ops::WeightView wv;                     // [n_head_kv * head_dim_v, n_embd]
    const float* q_norm = nullptr;          // [head_dim]
    const float* k_norm = nullptr;          // [head_dim]
    ops::WeightView wo;                     // [n_embd, n_head * head_dim_v]
    const float* post_attn_norm = nullptr;  // [n_embd]
    const float* ffn_norm = nullptr;        // [n_embd]
    ops::WeightView ffn_gate;               // [n_ff, n_embd]
    ops::WeightView ffn_up;                 // [n_ff, n_embd]
    ops::WeightView ffn_down;               // [n_embd, n_ff]
    const float* post_ffn_norm = nullptr;   // [n_embd]
};

// Calls f on every pointer into the file that a layer holds (LayerRef moves them into a stream
// buffer). A field added to a layer must be added here: the static_assert is the reminder.
template <class F>
void for_each_weight(Gemma3Layer& L, F&& f) {
    static_assert(sizeof(Gemma3Layer) == 6 * sizeof(const float*) + 7 * sizeof(ops::WeightView),
                  "a Gemma3Layer field is missing from for_each_weight");
    for (const float** p : {&L.attn_norm, &L.q_norm, &L.k_norm, &L.post_attn_norm, &L.ffn_norm, &L.post_ffn_norm})
        f(*p);
    for (ops::WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_gate, &L.ffn_up, &L.ffn_down}) f(w->data);
}

struct Gemma3Weights {
    ops::WeightView token_embd;          // [n_vocab, n_embd]
    std::vector<Gemma3Layer> layers;     // n_layer
    const float* output_norm = nullptr;  // [n_embd]
    ops::WeightView output;              // [n_vocab, n_embd]; token_embd when tied
};

// Throws ModelError naming the first missing or misshapen tensor.
Gemma3Weights bind_gemma3_weights(const gguf::GgufFile& file, const Hparams& hp);

// Llama and Qwen2, one block: pre-norm attention and SwiGLU feed-forward. Biases are nullptr when
// the file has none.
struct LlamaLayer {
    const float* attn_norm = nullptr;  // [n_embd]
    ops::WeightView wq;                // [n_head * head_dim, n_embd]
    ops::WeightView wk;                // [n_head_kv * head_dim, n_embd]
    ops::WeightView wv;                // [n_head_kv * head_dim, n_embd]
    const float* bq = nullptr;         // [n_head * head_dim]     (Qwen2: required)
    const float* bk = nullptr;         // [n_head_kv * head_dim]  (Qwen2: required)
    const float* bv = nullptr;         // [n_head_kv * head_dim]  (Qwen2: required)
    ops::WeightView wo;                // [n_embd, n_head * head_dim]
    const float* bo = nullptr;         // [n_embd]
    const float* ffn_norm = nullptr;   // [n_embd]
    ops::WeightView ffn_gate;          // [n_ff, n_embd]
    ops::WeightView ffn_up;            // [n_ff, n_embd]
    ops::WeightView ffn_down;          // [n_embd, n_ff]
};

template <class F>
void for_each_weight(LlamaLayer& L, F&& f) {
    static_assert(sizeof(LlamaLayer) == 6 * sizeof(const float*) + 7 * sizeof(ops::WeightView),
                  "a LlamaLayer field is missing from for_each_weight");
    for (const float** p : {&L.attn_norm, &L.bq, &L.bk, &L.bv, &L.bo, &L.ffn_norm}) f(*p);
    for (ops::WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_gate, &L.ffn_up, &L.ffn_down}) f(w->data);
}

struct LlamaWeights {
    ops::WeightView token_embd;          // [n_vocab, n_embd]
    std::vector<LlamaLayer> layers;      // n_layer
    const float* output_norm = nullptr;  // [n_embd]
    ops::WeightView output;              // [n_vocab, n_embd]; token_embd when tied
    const float* rope_freqs = nullptr;   // [n_rot / 2] divisors of the RoPE frequencies (Llama 3.1), or nullptr
};

enum class QkvBias { Optional, Required };

// Binds a "llama" or "qwen2" file (Qwen2 passes QkvBias::Required). Throws ModelError naming the
// first missing or misshapen tensor, or a tensor the forward pass does not use (FFN biases).
LlamaWeights bind_llama_weights(const gguf::GgufFile& file, const Hparams& hp, QkvBias qkv_bias);

}  // namespace fitllm::model
