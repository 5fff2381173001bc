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
    Gemma3(const gguf::GgufFile& file, Hparams hp) : hp_(std::move(hp)), w_(bind_gemma3_weights(file, hp_)) {}

    const Hparams& hparams() const override { return hp_; }

    void forward(const Batch& batch, kv::ModelCache& cache, float* logits_out, ops::ThreadPool& pool) override {
        const Hparams& hp = hp_;
        const BatchRows rows = begin_batch(hp, batch, cache, a_, [this](int il) { return rope_params(il); });
        const int n = rows.n;
        const int64_t E = hp.n_embd;
        float* x = a_.x.data();
        float* cur = a_.cur.data();

        ops::embedding_rows(w_.token_embd, batch.tokens.data(), n, x);  // x: [n, n_embd]
        ops::scale(x, n * E, std::sqrt(static_cast<float>(hp.n_embd)));

        for (int il = 0; il < hp.n_layer; ++il) {
            const Gemma3Layer& L = w_.layers[static_cast<size_t>(il)];
            const bool local = hp.is_swa[static_cast<size_t>(il)];

            // Attention block.
            ops::rms_norm(x, L.attn_norm, hp.norm_eps, n, E, cur);
            ops::matmul(L.wq, cur, n, a_.q.data(), pool, scratch_);  // q: [n, n_head, head_dim]
            ops::matmul(L.wk, cur, n, a_.k.data(), pool, scratch_);  // k: [n, n_head_kv, head_dim]
            ops::matmul(L.wv, cur, n, a_.v.data(), pool, scratch_);  // v: [n, n_head_kv, head_dim_v]
            ops::rms_norm(a_.q.data(), L.q_norm, hp.norm_eps, int64_t{n} * hp.n_head, hp.head_dim, a_.q.data());
            ops::rms_norm(a_.k.data(), L.k_norm, hp.norm_eps, int64_t{n} * hp.n_head_kv, hp.head_dim, a_.k.data());
            const ops::RopeParams rope = rope_params(il);
            ops::rope(a_.q.data(), rows.positions, n, hp.n_head, hp.head_dim, rope);
            ops::rope(a_.k.data(), rows.positions, n, hp.n_head_kv, hp.head_dim, rope);
            store_kv(cache, il, a_.k.data(), a_.v.data());
            // Q is scaled before attention (not the scores), as llama.cpp does: its f16 rounding of
            // Q then sees the same values.
            ops::scale(a_.q.data(), int64_t{n} * hp.n_head * hp.head_dim, hp.attn_scale);
            attend(hp, cache, il, a_.q.data(), rows, /*scale=*/1.0f, local ? hp.sliding_window : 0, a_.attn.data(),
                   pool, scratch_);                                     // attn: [n, n_head * head_dim_v]
            ops::matmul(L.wo, a_.attn.data(), n, cur, pool, scratch_);  // cur: [n, n_embd]
            ops::rms_norm(cur, L.post_attn_norm, hp.norm_eps, n, E, cur);
            ops::add(x, cur, n * E, x);

            // Feed-forward block: down(gelu(gate(h)) * up(h)).
            ops::rms_norm(x, L.ffn_norm, hp.norm_eps, n, E, cur);
            ops::matmul(L.ffn_gate, cur, n, a_.gate.data(), pool, scratch_);  // gate: [n, n_ff]
            ops::matmul(L.ffn_up, cur, n, a_.up.data(), pool, scratch_);      // up: [n, n_ff]
            ops::geglu(a_.gate.data(), a_.up.data(), int64_t{n} * hp.n_ff, a_.gate.data());
            ops::matmul(L.ffn_down, a_.gate.data(), n, cur, pool, scratch_);  // cur: [n, n_embd]
            ops::rms_norm(cur, L.post_ffn_norm, hp.norm_eps, n, E, cur);
            ops::add(x, cur, n * E, x);
        }
        cache.end_batch();

        // Output: the rows that want logits.
        const int n_out = output_rows(hp, batch, x, w_.output_norm, cur);
        if (n_out == 0) return;
        ops::matmul(w_.output, cur, n_out, logits_out, pool, scratch_);  // logits: [n_out, n_vocab]
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
    Activations a_;
    ops::Scratch scratch_;
};

}  // namespace

std::unique_ptr<Model> make_gemma3(const gguf::GgufFile& file, Hparams hp) {
    return std::make_unique<Gemma3>(file, std::move(hp));
}

}  // namespace fitllm::model
