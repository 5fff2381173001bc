// Qwen2 (and Qwen2.5): Llama's blocks with biases on the Q, K and V projections and rotary
// embeddings on the two halves of each head (NeoX style); small models tie the output matrix to
// the embedding.
// Reference: the Qwen2 technical report; llama.cpp's qwen2 graph for the exact order of ops.
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

class Qwen2 final : public Model {
public:
    Qwen2(const gguf::GgufFile& file, Hparams hp)
        : hp_(std::move(hp)), w_(bind_llama_weights(file, hp_, QkvBias::Required)) {}

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
            ops::add_bias(a_.q.data(), L.bq, n, q_dim);
            ops::add_bias(a_.k.data(), L.bk, n, kv_dim);
            ops::add_bias(a_.v.data(), L.bv, n, kv_dim);
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
        rope.mode = ops::RopeMode::Neox;  // pairs (x[i], x[i + n_rot/2])
        rope.n_dims = hp_.n_rot;
        rope.freq_base = hp_.rope_base;
        rope.freq_scale = hp_.rope_freq_scale;
        return rope;
    }

    Hparams hp_;
    LlamaWeights w_;
    Activations a_;
    ops::Scratch scratch_;
};

}  // namespace

std::unique_ptr<Model> make_qwen2(const gguf::GgufFile& file, Hparams hp) {
    return std::make_unique<Qwen2>(file, std::move(hp));
}

}  // namespace fitllm::model
