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
    Llama(const gguf::GgufFile& file, Hparams hp, Variant variant, const LoadOptions& options)
        : variant_(variant),
          hp_(std::move(hp)),
          w_(bind_llama_weights(file, hp_, variant.qkv_bias)),
          mem_(file, hp_, options) {}

    const Hparams& hparams() const override { return hp_; }
    int n_streamed_layers() const override { return mem_.n_streamed_layers(); }
    std::vector<FileRange> streamed_ranges() const override { return mem_.streamed_ranges(); }

    void forward(const Batch& batch, kv::ModelCache& cache, float* logits_out, ops::ThreadPool& pool) override {
        const Hparams& hp = hp_;
        Activations& a = mem_.a;
        ops::Scratch& scratch = mem_.scratch;
        const ops::RopeParams rope = rope_params();
        const BatchRows rows = begin_batch(hp, batch, cache, a, [&rope](int) { return rope; });
        const int n = rows.n;
        const int64_t E = hp.n_embd;
        const int64_t q_dim = int64_t{hp.n_head} * hp.head_dim;
        const int64_t kv_dim = int64_t{hp.n_head_kv} * hp.head_dim;
        float* x = a.x.data();
        float* cur = a.cur.data();

        ops::embedding_rows(w_.token_embd, batch.tokens.data(), n, x);  // x: [n, n_embd]

        for (int il = 0; il < hp.n_layer; ++il) {
            const LayerRef<LlamaLayer> L = mem_.layer(w_.layers, il);  // waits for a streamed layer

            // Attention block.
            ops::rms_norm(x, L->attn_norm, hp.norm_eps, n, E, cur);
            ops::matmul(L->wq, cur, n, a.q.data(), pool, scratch);  // q: [n, n_head, head_dim]
            ops::matmul(L->wk, cur, n, a.k.data(), pool, scratch);  // k: [n, n_head_kv, head_dim]
            ops::matmul(L->wv, cur, n, a.v.data(), pool, scratch);  // v: [n, n_head_kv, head_dim]
            if (L->bq) ops::add_bias(a.q.data(), L->bq, n, q_dim);
            if (L->bk) ops::add_bias(a.k.data(), L->bk, n, kv_dim);
            if (L->bv) ops::add_bias(a.v.data(), L->bv, n, kv_dim);
            ops::rope(a.q.data(), rows.positions, n, hp.n_head, hp.head_dim, rope);
            ops::rope(a.k.data(), rows.positions, n, hp.n_head_kv, hp.head_dim, rope);
            store_kv(cache, il, a.k.data(), a.v.data());
            attend(hp, cache, il, a.q.data(), rows, hp.attn_scale, /*window=*/0, a.attn.data(), pool,
                   scratch);                                           // attn: [n, n_head * head_dim]
            ops::matmul(L->wo, a.attn.data(), n, cur, pool, scratch);  // cur: [n, n_embd]
            if (L->bo) ops::add_bias(cur, L->bo, n, E);
            ops::add(x, cur, n * E, x);

            // Feed-forward block: down(silu(gate(h)) * up(h)).
            ops::rms_norm(x, L->ffn_norm, hp.norm_eps, n, E, cur);
            ops::matmul(L->ffn_gate, cur, n, a.gate.data(), pool, scratch);  // gate: [n, n_ff]
            ops::matmul(L->ffn_up, cur, n, a.up.data(), pool, scratch);      // up: [n, n_ff]
            ops::swiglu(a.gate.data(), a.up.data(), int64_t{n} * hp.n_ff, a.gate.data());
            ops::matmul(L->ffn_down, a.gate.data(), n, cur, pool, scratch);  // cur: [n, n_embd]
            ops::add(x, cur, n * E, x);
        }
        cache.end_batch();

        // Output: the rows that want logits.
        const int n_out = output_rows(hp, batch, x, w_.output_norm, cur);
        if (n_out == 0) return;
        ops::matmul(w_.output, cur, n_out, logits_out, pool, scratch);  // logits: [n_out, n_vocab]
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
    DecoderMemory mem_;
};

}  // namespace

std::unique_ptr<Model> make_llama(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options) {
    return std::make_unique<Llama>(file, std::move(hp), kLlama, options);
}

std::unique_ptr<Model> make_qwen2(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options) {
    return std::make_unique<Llama>(file, std::move(hp), kQwen2, options);
}

}  // namespace fitllm::model
