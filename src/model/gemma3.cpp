// Gemma 3 (text): pre- and post-norms around attention and FFN, RMS-normed Q and K, GeGLU, the
// embedding scaled by sqrt(n_embd), five sliding-window layers per global one.
// Reference: the Gemma 3 technical report; llama.cpp's gemma3 graph for the exact order of ops.
#include <cmath>

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

class Gemma3 final : public Model {
public:
    Gemma3(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options)
        : hp_(std::move(hp)), w_(bind_gemma3_weights(file, hp_)), mem_(file, hp_, options) {}

    const Hparams& hparams() const override { return hp_; }
    int n_streamed_layers() const override { return mem_.n_streamed_layers(); }
    std::vector<FileRange> streamed_ranges() const override { return mem_.streamed_ranges(); }

    void forward(const Batch& batch, kv::ModelCache& cache, float* logits_out, ops::ThreadPool& pool) override {
        const Hparams& hp = hp_;
        Activations& a = mem_.a;
        ops::Scratch& scratch = mem_.scratch;
        const BatchRows rows = begin_batch(hp, batch, cache, a, [this](int il) { return rope_params(il); });
        const int n = rows.n;
        const int64_t E = hp.n_embd;
        float* x = a.x.data();
        float* cur = a.cur.data();

        ops::embedding_rows(w_.token_embd, batch.tokens.data(), n, x);  // x: [n, n_embd]
        ops::scale(x, n * E, std::sqrt(static_cast<float>(hp.n_embd)));

        for (int il = 0; il < hp.n_layer; ++il) {
            const LayerRef<Gemma3Layer> L = mem_.layer(w_.layers, il);  // waits for a streamed layer
            const bool local = hp.is_swa[static_cast<size_t>(il)];

            // Attention block.
            ops::rms_norm(x, L->attn_norm, hp.norm_eps, n, E, cur);
            ops::matmul(L->wq, cur, n, a.q.data(), pool, scratch);  // q: [n, n_head, head_dim]
            ops::matmul(L->wk, cur, n, a.k.data(), pool, scratch);  // k: [n, n_head_kv, head_dim]
            ops::matmul(L->wv, cur, n, a.v.data(), pool, scratch);  // v: [n, n_head_kv, head_dim_v]
            ops::rms_norm(a.q.data(), L->q_norm, hp.norm_eps, int64_t{n} * hp.n_head, hp.head_dim, a.q.data());
            ops::rms_norm(a.k.data(), L->k_norm, hp.norm_eps, int64_t{n} * hp.n_head_kv, hp.head_dim, a.k.data());
            const ops::RopeParams rope = rope_params(il);
            ops::rope(a.q.data(), rows.positions, n, hp.n_head, hp.head_dim, rope);
            ops::rope(a.k.data(), rows.positions, n, hp.n_head_kv, hp.head_dim, rope);
            store_kv(cache, il, a.k.data(), a.v.data());
            // Q is scaled before attention (not the scores), as llama.cpp does: its f16 rounding of
            // Q then sees the same values.
            ops::scale(a.q.data(), int64_t{n} * hp.n_head * hp.head_dim, hp.attn_scale);
            attend(hp, cache, il, a.q.data(), rows, /*scale=*/1.0f, local ? hp.sliding_window : 0, a.attn.data(), pool,
                   scratch);                                           // attn: [n, n_head * head_dim_v]
            ops::matmul(L->wo, a.attn.data(), n, cur, pool, scratch);  // cur: [n, n_embd]
            ops::rms_norm(cur, L->post_attn_norm, hp.norm_eps, n, E, cur);
            ops::add(x, cur, n * E, x);

            // Feed-forward block: down(gelu(gate(h)) * up(h)).
            ops::rms_norm(x, L->ffn_norm, hp.norm_eps, n, E, cur);
            ops::matmul(L->ffn_gate, cur, n, a.gate.data(), pool, scratch);  // gate: [n, n_ff]
            ops::matmul(L->ffn_up, cur, n, a.up.data(), pool, scratch);      // up: [n, n_ff]
            ops::geglu(a.gate.data(), a.up.data(), int64_t{n} * hp.n_ff, a.gate.data());
            ops::matmul(L->ffn_down, a.gate.data(), n, cur, pool, scratch);  // cur: [n, n_embd]
            ops::rms_norm(cur, L->post_ffn_norm, hp.norm_eps, n, E, cur);
            ops::add(x, cur, n * E, x);
        }
        cache.end_batch();

        // Output: the rows that want logits.
        const int n_out = output_rows(hp, batch, x, w_.output_norm, cur);
        if (n_out == 0) return;
        ops::matmul(w_.output, cur, n_out, logits_out, pool, scratch);  // logits: [n_out, n_vocab]
        if (hp.final_logit_softcap > 0.0f) {
            ops::softcap(logits_out, int64_t{n_out} * hp.n_vocab, hp.final_logit_softcap);
        }
    }

private:
    // Local (sliding-window) layers rotate with their own base and no scaling.
    ops::RopeParams rope_params(int il) const {
        const bool local = hp_.is_swa[static_cast<size_t>(il)];
        ops::RopeParams rope;
        rope.mode = ops::RopeMode::Neox;
        rope.n_dims = hp_.head_dim;
        rope.freq_base = local ? hp_.rope_base_swa : hp_.rope_base;
        rope.freq_scale = local ? 1.0f : hp_.rope_freq_scale;
        return rope;
    }

    Hparams hp_;
    Gemma3Weights w_;
    DecoderMemory mem_;
};

}  // namespace

std::unique_ptr<Model> make_gemma3(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options) {
    return std::make_unique<Gemma3>(file, std::move(hp), options);
}

}  // namespace fitllm::model
