// Gemma 3 (text): pre- and post-norms around attention and FFN, RMS-normed Q and K, GeGLU, the
// embedding scaled by sqrt(n_embd), five sliding-window layers per global one.
// Reference: the Gemma 3 technical report; llama.cpp's gemma3 graph for the exact order of ops.
#include <algorithm>
#include <cmath>

#include "model/architecture.h"
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

// Gemma 3 (llama.cpp's LLM_ARCH_GEMMA3): five sliding-window layers, then one global layer;
// local layers rotate with base 10000 and no position scaling (global layers of the 4B and larger
// models scale linearly, by 1/8); Q is scaled by 1/sqrt(head_dim) (27B: by
// 1/sqrt(n_embd / n_head), which its 62 layers identify).
void read_gemma3_hparams(const HparamReader& r, Hparams& hp) {
    hp.sliding_window = r.count_or("attention.sliding_window", 0);
    hp.is_swa.assign(static_cast<size_t>(hp.n_layer), false);
    if (hp.sliding_window > 0) {
        constexpr int kPattern = 6;  // layers il % 6 < 5 are local
        for (int il = 0; il < hp.n_layer; ++il) hp.is_swa[static_cast<size_t>(il)] = il % kPattern < kPattern - 1;
    }
    hp.rope_base_swa = 10000.0f;
    hp.rope_freq_scale = r.rope_freq_scale();
    hp.final_logit_softcap = r.number_or("final_logit_softcapping", 0.0f);
    hp.attn_scale = hp.n_layer == 62 ? 1.0f / std::sqrt(static_cast<float>(hp.n_embd / hp.n_head))
                                     : 1.0f / std::sqrt(static_cast<float>(hp.head_dim));
}

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

class Gemma3 final : public DecoderModel {
public:
    Gemma3(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options)
        : DecoderModel(file, std::move(hp), options), w_(bind_gemma3_weights(file, hp_)) {
        mem_.place_weights(w_);  // the offloaded layers' views point at the device's copies
    }

    void forward(const Batch& batch, kv::ModelCache& cache, float* logits_out, ops::ThreadPool& pool) override {
        const Hparams& hp = hp_;
        const BatchRows rows = begin_batch(hp, batch, cache, mem_, pool, [this](int il) { return rope_params(il); });
        const std::span<const ops::TokenPlace> places =
            batch_places(batch, mem_, rows);  // where each token sits in its run
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
                o.matmul(L->ffn_gate, h, m, o.gate, places_of(places, t0, m));  // gate: [m, n_ff]
                o.matmul(L->ffn_up, h, m, o.up, places_of(places, t0, m));      // up: [m, n_ff]
                o.geglu(o.gate, o.up, int64_t{m} * hp.n_ff, o.gate);
                o.matmul(L->ffn_down, o.gate, m, h, places_of(places, t0, m));  // h: [m, n_embd], over its read rows
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

    Gemma3Weights w_;
};

std::unique_ptr<Model> load_gemma3(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options) {
    return std::make_unique<Gemma3>(file, std::move(hp), options);
}

}  // namespace

extern const Architecture kGemma3{"gemma3", read_gemma3_hparams, load_gemma3};

}  // namespace fitllm::model
