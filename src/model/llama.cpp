// Llama (2, 3, 3.x; also Mistral, TinyLlama, SmolLM2): pre-norm blocks of grouped-query attention
// with rotary embeddings on adjacent pairs of dims, and a SwiGLU feed-forward.
// Qwen2 (and Qwen2.5) is the same pass with required biases on Q, K and V and rotary embeddings
// on the two halves of each head (NeoX style); small models tie the output matrix to the embedding.
// Reference: the Llama papers, the Qwen2 technical report; llama.cpp's llama and qwen2 graphs for
// the exact order of ops.
#include "model/decoder.h"
#include "model/model.h"
#include "model/weights.h"
#include "ops/activation.h"
#include "ops/embedding.h"
#include "ops/matmul.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/scratch.h"

namespace fitllm::model {
namespace {

// What tells Qwen2 from Llama.
struct Variant {
    QkvBias qkv_bias;
    ops::RopeMode rope_mode;
    bool rope_freqs;  // Llama 3.1+'s per-pair frequency divisors, when the file has them
};
constexpr Variant kLlama{QkvBias::Optional, ops::RopeMode::Normal, true};  // adjacent pairs (x[2i], x[2i+1])
constexpr Variant kQwen2{QkvBias::Required, ops::RopeMode::Neox, false};   // pairs (x[i], x[i + n_rot/2])

class Llama final : public Model {
public:
    Llama(const gguf::GgufFile& file, Hparams hp, Variant variant)
        : variant_(variant), hp_(std::move(hp)), w_(bind_llama_weights(file, hp_, variant.qkv_bias)) {}

    const Hparams& hparams() const override { return hp_; }

    void forward(const Batch& batch, kv::ModelCache& cache, float* logits_out, ops::ThreadPool& pool) override {
        const Hparams& hp = hp_;
        const ops::RopeParams rope = rope_params();
        const BatchRows rows = begin_batch(hp, batch, cache, a_, [&rope](int) { return rope; });
        const int n = rows.n;
        const int64_t E = hp.n_embd;
        const int64_t q_dim = int64_t{hp.n_head} * hp.head_dim;
        const int64_t kv_dim = int64_t{hp.n_head_kv} * hp.head_dim;
        float* x = a_.x.data();
        float* cur = a_.cur.data();

        ops::embedding_rows(w_.token_embd, batch.tokens.data(), n, x);  // x: [n, n_embd]

        for (int il = 0; il < hp.n_layer; ++il) {
            const LlamaLayer& L = w_.layers[static_cast<size_t>(il)];

            // Attention block.
            ops::rms_norm(x, L.attn_norm, hp.norm_eps, n, E, cur);
            ops::matmul(L.wq, cur, n, a_.q.data(), pool, scratch_);  // q: [n, n_head, head_dim]
            ops::matmul(L.wk, cur, n, a_.k.data(), pool, scratch_);  // k: [n, n_head_kv, head_dim]
            ops::matmul(L.wv, cur, n, a_.v.data(), pool, scratch_);  // v: [n, n_head_kv, head_dim]
            if (L.bq) ops::add_bias(a_.q.data(), L.bq, n, q_dim);
            if (L.bk) ops::add_bias(a_.k.data(), L.bk, n, kv_dim);
            if (L.bv) ops::add_bias(a_.v.data(), L.bv, n, kv_dim);
            ops::rope(a_.q.data(), rows.positions, n, hp.n_head, hp.head_dim, rope);
            ops::rope(a_.k.data(), rows.positions, n, hp.n_head_kv, hp.head_dim, rope);
            store_kv(cache, il, a_.k.data(), a_.v.data());
            attend(hp, cache, il, a_.q.data(), rows, hp.attn_scale, /*window=*/0, a_.attn.data(), pool,
                   scratch_);                                           // attn: [n, n_head * head_dim]
            ops::matmul(L.wo, a_.attn.data(), n, cur, pool, scratch_);  // cur: [n, n_embd]
            if (L.bo) ops::add_bias(cur, L.bo, n, E);
            ops::add(x, cur, n * E, x);

            // Feed-forward block: down(silu(gate(h)) * up(h)).
            ops::rms_norm(x, L.ffn_norm, hp.norm_eps, n, E, cur);
            ops::matmul(L.ffn_gate, cur, n, a_.gate.data(), pool, scratch_);  // gate: [n, n_ff]
            ops::matmul(L.ffn_up, cur, n, a_.up.data(), pool, scratch_);      // up: [n, n_ff]
            ops::swiglu(a_.gate.data(), a_.up.data(), int64_t{n} * hp.n_ff, a_.gate.data());
            ops::matmul(L.ffn_down, a_.gate.data(), n, cur, pool, scratch_);  // cur: [n, n_embd]
            ops::add(x, cur, n * E, x);
        }
        cache.end_batch();

        // Output: the rows that want logits.
        const int n_out = output_rows(hp, batch, x, w_.output_norm, cur);
        if (n_out == 0) return;
        ops::matmul(w_.output, cur, n_out, logits_out, pool, scratch_);  // logits: [n_out, n_vocab]
    }

private:
    ops::RopeParams rope_params() const {
        ops::RopeParams rope;
        rope.mode = variant_.rope_mode;
        rope.n_dims = hp_.n_rot;
        rope.freq_base = hp_.rope_base;
        rope.freq_scale = hp_.rope_freq_scale;
        rope.freq_factors = variant_.rope_freqs ? w_.rope_freqs : nullptr;
        return rope;
    }

    Variant variant_;
    Hparams hp_;
    LlamaWeights w_;
    Activations a_;
    ops::Scratch scratch_;
};

}  // namespace

std::unique_ptr<Model> make_llama(const gguf::GgufFile& file, Hparams hp) {
    return std::make_unique<Llama>(file, std::move(hp), kLlama);
}

std::unique_ptr<Model> make_qwen2(const gguf::GgufFile& file, Hparams hp) {
    return std::make_unique<Llama>(file, std::move(hp), kQwen2);
}

}  // namespace fitllm::model
