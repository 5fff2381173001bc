// Llama (2, 3, 3.x; also Mistral, TinyLlama, SmolLM2): pre-norm blocks of grouped-query attention
// with rotary embeddings on adjacent pairs of dims, and a SwiGLU feed-forward.
// Qwen2 (and Qwen2.5) is the same pass with required biases on Q, K and V and rotary embeddings
// on the two halves of each head (NeoX style); small models tie the output matrix to the embedding.
// Reference: the Llama papers, the Qwen2 technical report; llama.cpp's llama and qwen2 graphs for
// the exact order of ops.
#include <algorithm>

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
          mem_(file, hp_, options) {
        mem_.place_weights(w_);  // the offloaded layers' views point at the device's copies
    }

    const Hparams& hparams() const override { return hp_; }
    int n_streamed_layers() const override { return mem_.n_streamed_layers(); }
    std::vector<FileRange> streamed_ranges() const override { return mem_.streamed_ranges(); }
    std::vector<FileRange> offloaded_ranges() const override { return mem_.offloaded_ranges(); }
    CachePlacement cache_placement() const override { return mem_.cache_placement(hp_); }

    void forward(const Batch& batch, kv::ModelCache& cache, float* logits_out, ops::ThreadPool& pool) override {
        const Hparams& hp = hp_;
        const ops::RopeParams rope = rope_params();
        const BatchRows rows = begin_batch(hp, batch, cache, mem_, pool, [&rope](int) { return rope; });
        const std::span<const ops::TokenPlace> places = batch_places(mem_, rows);  // where each token sits in its run
        const int n = rows.n;
        const int64_t E = hp.n_embd;
        const int64_t q_dim = int64_t{hp.n_head} * hp.head_dim;
        const int64_t kv_dim = int64_t{hp.n_head_kv} * hp.head_dim;

        ops::embedding_rows(w_.token_embd, batch.tokens.data(), n, mem_.a.x.data());  // x: [n, n_embd]

        for (int il = 0; il < hp.n_layer; ++il) {
            const LayerRef<LlamaLayer> L = mem_.layer(w_.layers, il);  // waits for a streamed layer
            Exec& o = mem_.enter(il);  // the ops and activations of the device that runs layer il
            float* x = o.x;
            float* cur = o.cur;

            // Attention block.
            o.rms_norm(x, L->attn_norm, hp.norm_eps, n, E, cur);
            o.matmul(L->wq, cur, n, o.q, places);  // q: [n, n_head, head_dim]
            o.matmul(L->wk, cur, n, o.k, places);  // k: [n, n_head_kv, head_dim]
            o.matmul(L->wv, cur, n, o.v, places);  // v: [n, n_head_kv, head_dim]
            if (L->bq) o.add_bias(o.q, L->bq, n, q_dim);
            if (L->bk) o.add_bias(o.k, L->bk, n, kv_dim);
            if (L->bv) o.add_bias(o.v, L->bv, n, kv_dim);
            o.rope(o.q, rows.positions, n, hp.n_head, hp.head_dim, rope);
            o.rope(o.k, rows.positions, n, hp.n_head_kv, hp.head_dim, rope);
            o.store_kv(cache, il, o.k, o.v, o.q, rows, hp, rope);                      // q: for the K transform's fit
            attend(o, hp, cache, il, o.q, rows, hp.attn_scale, /*window=*/0, o.attn);  // attn: [n, n_head * head_dim]
            o.matmul(L->wo, o.attn, n, o.attn_out, places);                            // attn_out: [n, n_embd]
            if (L->bo) o.add_bias(o.attn_out, L->bo, n, E);
            o.add(x, o.attn_out, n * E, x);

            // Feed-forward block: down(silu(gate(h)) * up(h)), a slice of tokens at a time.
            o.rms_norm(x, L->ffn_norm, hp.norm_eps, n, E, cur);
            for (int t0 = 0; t0 < n; t0 += o.ffn_slice) {
                const int m = std::min(o.ffn_slice, n - t0);
                float* h = cur + t0 * E;
                o.matmul(L->ffn_gate, h, m, o.gate, places.subspan(t0, m));  // gate: [m, n_ff]
                o.matmul(L->ffn_up, h, m, o.up, places.subspan(t0, m));      // up: [m, n_ff]
                o.swiglu(o.gate, o.up, int64_t{m} * hp.n_ff, o.gate);
                o.matmul(L->ffn_down, o.gate, m, h, places.subspan(t0, m));  // h: [m, n_embd], over its read rows
            }
            o.add(x, cur, n * E, x);
        }
        cache.end_batch();

        // Output: the rows that want logits.
        Exec& o = mem_.enter_output();
        const int n_out = output_rows(o, hp, batch, o.x, w_.output_norm, o.cur);
        if (n_out == 0) return;
        o.matmul(w_.output, o.cur, n_out, mem_.logits_target(hp, logits_out, n_out),
                 output_places(batch, rows, mem_));  // logits: [n_out, n_vocab]
        mem_.finish_logits(logits_out, int64_t{n_out} * hp.n_vocab);
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
