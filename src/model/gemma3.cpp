// Gemma 3 (text): pre- and post-norms around attention and FFN, RMS-normed Q and K, GeGLU, the
// embedding scaled by sqrt(n_embd), five sliding-window layers per global one.
// Reference: the Gemma 3 technical report; llama.cpp's gemma3 graph for the exact order of ops.
#include <algorithm>
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
        : hp_(std::move(hp)), w_(bind_gemma3_weights(file, hp_)), mem_(file, hp_, options) {
        mem_.place_weights(w_);  // the offloaded layers' views point at the device's copies
    }

    const Hparams& hparams() const override { return hp_; }
    int n_streamed_layers() const override { return mem_.n_streamed_layers(); }
    std::vector<FileRange> streamed_ranges() const override { return mem_.streamed_ranges(); }
    std::vector<FileRange> offloaded_ranges() const override { return mem_.offloaded_ranges(); }
    CachePlacement cache_placement() const override { return mem_.cache_placement(hp_); }

    void forward(const Batch& batch, kv::ModelCache& cache, float* logits_out, ops::ThreadPool& pool) override {
        const Hparams& hp = hp_;
        const BatchRows rows = begin_batch(hp, batch, cache, mem_, pool, [this](int il) { return rope_params(il); });
        const std::span<const ops::TokenPlace> places = batch_places(mem_, rows);  // where each token sits in its run
        const int n = rows.n;
        const int64_t E = hp.n_embd;

        float* x_host = mem_.a.x.data();
        ops::embedding_rows(w_.token_embd, batch.tokens.data(), n, x_host);  // x: [n, n_embd]
        ops::scale(x_host, n * E, std::sqrt(static_cast<float>(hp.n_embd)));

        for (int il = 0; il < hp.n_layer; ++il) {
            const LayerRef<Gemma3Layer> L = mem_.layer(w_.layers, il);  // waits for a streamed layer
            Exec& o = mem_.enter(il);  // the ops and activations of the device that runs layer il
            float* x = o.x;
            float* cur = o.cur;
            const bool local = hp.is_swa[static_cast<size_t>(il)];

            // Attention block.
            o.rms_norm(x, L->attn_norm, hp.norm_eps, n, E, cur);
            o.matmul(L->wq, cur, n, o.q, places);  // q: [n, n_head, head_dim]
            o.matmul(L->wk, cur, n, o.k, places);  // k: [n, n_head_kv, head_dim]
            o.matmul(L->wv, cur, n, o.v, places);  // v: [n, n_head_kv, head_dim_v]
            o.rms_norm(o.q, L->q_norm, hp.norm_eps, int64_t{n} * hp.n_head, hp.head_dim, o.q);
            o.rms_norm(o.k, L->k_norm, hp.norm_eps, int64_t{n} * hp.n_head_kv, hp.head_dim, o.k);
            const ops::RopeParams rope = rope_params(il);
            o.rope(o.q, rows.positions, n, hp.n_head, hp.head_dim, rope);
            o.rope(o.k, rows.positions, n, hp.n_head_kv, hp.head_dim, rope);
            o.store_kv(cache, il, o.k, o.v, o.q, rows, hp, rope);  // q: for the K transform's fit
            // Q is scaled before attention (not the scores), as llama.cpp does: its f16 rounding of
            // Q then sees the same values.
            o.scale(o.q, int64_t{n} * hp.n_head * hp.head_dim, hp.attn_scale);
            attend(o, hp, cache, il, o.q, rows, /*scale=*/1.0f, local ? hp.sliding_window : 0,
                   o.attn);                                  // attn: [n, n_head * head_dim_v]
            o.matmul(L->wo, o.attn, n, o.attn_out, places);  // attn_out: [n, n_embd]
            o.rms_norm(o.attn_out, L->post_attn_norm, hp.norm_eps, n, E, o.attn_out);
            o.add(x, o.attn_out, n * E, x);

            // Feed-forward block: down(gelu(gate(h)) * up(h)), a slice of tokens at a time.
            o.rms_norm(x, L->ffn_norm, hp.norm_eps, n, E, cur);
            for (int t0 = 0; t0 < n; t0 += o.ffn_slice) {
                const int m = std::min(o.ffn_slice, n - t0);
                float* h = cur + t0 * E;
                o.matmul(L->ffn_gate, h, m, o.gate, places.subspan(t0, m));  // gate: [m, n_ff]
                o.matmul(L->ffn_up, h, m, o.up, places.subspan(t0, m));      // up: [m, n_ff]
                o.geglu(o.gate, o.up, int64_t{m} * hp.n_ff, o.gate);
                o.matmul(L->ffn_down, o.gate, m, h, places.subspan(t0, m));  // h: [m, n_embd], over its read rows
            }
            o.rms_norm(cur, L->post_ffn_norm, hp.norm_eps, n, E, cur);
            o.add(x, cur, n * E, x);
        }
        cache.end_batch();

        // Output: the rows that want logits.
        Exec& o = mem_.enter_output();
        const int n_out = output_rows(o, hp, batch, o.x, w_.output_norm, o.cur);
        if (n_out == 0) return;
        float* logits = mem_.logits_target(hp, logits_out, n_out);
        o.matmul(w_.output, o.cur, n_out, logits, output_places(batch, rows, mem_));  // logits: [n_out, n_vocab]
        if (hp.final_logit_softcap > 0.0f) o.softcap(logits, int64_t{n_out} * hp.n_vocab, hp.final_logit_softcap);
        mem_.finish_logits(logits_out, int64_t{n_out} * hp.n_vocab);
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
