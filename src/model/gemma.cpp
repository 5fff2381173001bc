// The Gemma family. Gemma 3 (text): pre- and post-norms around attention and FFN, RMS-normed Q
// and K, GeGLU, the embedding scaled by sqrt(n_embd), five sliding-window layers per global one.
// Gemma 2: the same block without the Q/K norms, every other layer sliding-window, and tanh
// soft-capping of the attention scores and of the final logits.
// References: the Gemma 2 and 3 technical reports; llama.cpp's gemma2 and gemma3 graphs for the
// exact order of ops.
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

// A soft-capping value: the key's, else llama.cpp's default for Gemma 2 (it caps always).
float read_softcap(const HparamReader& r, const std::string& name, float fallback) {
    const float cap = r.number_or(name, fallback);
    if (!(cap > 0.0f) || !std::isfinite(cap)) r.refuse(name, std::to_string(cap), "must be a positive number");
    return cap;
}

// Gemma 2 (llama.cpp's LLM_ARCH_GEMMA2): layers il % 2 == 0 are local (window 4096 unless the
// file says otherwise; attention.sliding_window_pattern, a period or one flag per layer, replaces
// the pattern); local layers rotate with rope.freq_base_swa when given, else with the global base,
// and the same position scaling. Q is scaled by 1/sqrt(head_dim), for the 27B (46 layers) by
// 1/sqrt(n_embd / n_head): llama.cpp's rule for query_pre_attn_scalar. Attention scores are
// capped at 50 and logits at 30 unless the file gives other values.
void read_gemma2_hparams(const HparamReader& r, Hparams& hp) {
    hp.sliding_window = r.count_or("attention.sliding_window", 4096);
    r.sliding_window_layers(hp, 2);
    hp.rope_base_swa = r.number_or("rope.freq_base_swa", hp.rope_base);
    hp.rope_freq_scale = r.rope_freq_scale();
    hp.n_rot = r.count_or("rope.dimension_count", hp.head_dim);
    if (hp.n_rot % 2 != 0 || hp.n_rot > hp.head_dim) {
        r.refuse("rope.dimension_count", std::to_string(hp.n_rot),
                 "must be even and at most the head size " + std::to_string(hp.head_dim));
    }
    hp.attn_softcap = read_softcap(r, "attn_logit_softcapping", 50.0f);
    hp.final_logit_softcap = read_softcap(r, "final_logit_softcapping", 30.0f);
    hp.attn_scale = hp.n_layer == 46 ? 1.0f / std::sqrt(static_cast<float>(hp.n_embd / hp.n_head))
                                     : 1.0f / std::sqrt(static_cast<float>(hp.head_dim));
}

// What the members of the family differ in, past their hyper-parameters.
struct Variant {
    bool qk_norm;              // RMS norms of each head of Q and K before the rotation (Gemma 3)
    bool local_rope_unscaled;  // local layers rotate without the position scaling (Gemma 3)
    bool output_tied_only;     // output.weight is refused: the output is token_embd (Gemma 2)
};
constexpr Variant kGemma3Variant{true, true, false};
constexpr Variant kGemma2Variant{false, false, true};

// One block (Gemma 2: no q_norm and k_norm). Shapes as [rows (outputs), cols (inputs)].
struct GemmaLayer {
    const float* attn_norm = nullptr;       // [n_embd]
    ops::WeightView wq;                     // [n_head * head_dim, n_embd]
    ops::WeightView wk;                     // [n_head_kv * head_dim, n_embd]
    ops::WeightView wv;                     // [n_head_kv * head_dim_v, n_embd]
    const float* q_norm = nullptr;          // [head_dim]; Gemma 2: nullptr
    const float* k_norm = nullptr;          // [head_dim]; Gemma 2: nullptr
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
void for_each_weight(GemmaLayer& L, F&& f) {
    static_assert(sizeof(GemmaLayer) == 6 * sizeof(const float*) + 7 * sizeof(ops::WeightView),
                  "a GemmaLayer field is missing from for_each_weight");
    for (const float** p : {&L.attn_norm, &L.q_norm, &L.k_norm, &L.post_attn_norm, &L.ffn_norm, &L.post_ffn_norm})
        f(*p);
    for (ops::WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_gate, &L.ffn_up, &L.ffn_down}) f(w->data);
}

struct GemmaWeights {
    ops::WeightView token_embd;          // [n_vocab, n_embd]
    std::vector<GemmaLayer> layers;      // n_layer
    const float* output_norm = nullptr;  // [n_embd]
    ops::WeightView output;              // [n_vocab, n_embd]; token_embd when tied
};

// Throws ModelError naming the first missing or misshapen tensor.
GemmaWeights bind_gemma_weights(const gguf::GgufFile& file, const Hparams& hp, const Variant& variant) {
    const TensorBinder b(file);
    GemmaWeights w;
    w.token_embd = b.matrix("token_embd.weight", hp.n_vocab, hp.n_embd);
    w.output_norm = b.vector("output_norm.weight", hp.n_embd);
    if (variant.output_tied_only) {
        // llama.cpp multiplies by token_embd and refuses a file with more tensors than it binds.
        b.refuse("output.weight", "Gemma 2 ties the output matrix to token_embd.weight");
    } else {
        w.output = b.optional_matrix("output.weight", hp.n_vocab, hp.n_embd);
    }
    if (!w.output.data) w.output = w.token_embd;  // tied
    const int64_t q_dim = int64_t{hp.n_head} * hp.head_dim;
    const int64_t k_dim = int64_t{hp.n_head_kv} * hp.head_dim;
    const int64_t v_dim = int64_t{hp.n_head_kv} * hp.head_dim_v;
    const int64_t o_dim = int64_t{hp.n_head} * hp.head_dim_v;
    for (int il = 0; il < hp.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        GemmaLayer L;
        L.attn_norm = b.vector(p + "attn_norm.weight", hp.n_embd);
        L.wq = b.matrix(p + "attn_q.weight", q_dim, hp.n_embd);
        L.wk = b.matrix(p + "attn_k.weight", k_dim, hp.n_embd);
        L.wv = b.matrix(p + "attn_v.weight", v_dim, hp.n_embd);
        if (variant.qk_norm) {
            L.q_norm = b.vector(p + "attn_q_norm.weight", hp.head_dim);
            L.k_norm = b.vector(p + "attn_k_norm.weight", hp.head_dim);
        }
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

class Gemma final : public DecoderModel {
public:
    Gemma(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options, const Variant& variant)
        : DecoderModel(file, std::move(hp), options), variant_(variant), w_(bind_gemma_weights(file, hp_, variant)) {
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
            const LayerRef<GemmaLayer> L = mem_.layer(w_.layers, il);  // waits for a streamed layer
            Exec& o = mem_.enter(il);  // the ops and activations of the device that runs layer il
            float* x = o.x;
            float* cur = o.cur;
            const bool local = hp.is_swa[static_cast<size_t>(il)];

            // Attention block.
            o.rms_norm(x, L->attn_norm, hp.norm_eps, n, E, cur);
            o.matmul(L->wq, cur, n, o.q, places);  // q: [n, n_head, head_dim]
            o.matmul(L->wk, cur, n, o.k, places);  // k: [n, n_head_kv, head_dim]
            o.matmul(L->wv, cur, n, o.v, places);  // v: [n, n_head_kv, head_dim_v]
            if (variant_.qk_norm) {
                o.rms_norm(o.q, L->q_norm, hp.norm_eps, int64_t{n} * hp.n_head, hp.head_dim, o.q);
                o.rms_norm(o.k, L->k_norm, hp.norm_eps, int64_t{n} * hp.n_head_kv, hp.head_dim, o.k);
            }
            const ops::RopeParams rope = rope_params(il);
            o.rope(o.q, rows.positions, n, hp.n_head, hp.head_dim, rope);
            o.rope(o.k, rows.positions, n, hp.n_head_kv, hp.head_dim, rope);
            o.store_kv(cache, il, o.k, o.v, o.q, rows, hp, rope);  // q: for the K transform's fit
            // Q is scaled before attention (not the scores), as llama.cpp does: its f16 rounding of
            // Q then sees the same values. Gemma 2 then caps the scores (hp.attn_softcap) as
            // cap * tanh(q.k / cap).
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

        output_logits(batch, rows, w_.output_norm, w_.output, logits_out);  // Gemma 2: soft-capped
    }

private:
    // Local (sliding-window) layers rotate with their own base (Gemma 3: and no scaling).
    ops::RopeParams rope_params(int il) const {
        const bool local = hp_.is_swa[static_cast<size_t>(il)];
        ops::RopeParams rope;
        rope.mode = ops::RopeMode::Neox;
        rope.n_dims = hp_.n_rot;
        rope.freq_base = local ? hp_.rope_base_swa : hp_.rope_base;
        rope.freq_scale = local && variant_.local_rope_unscaled ? 1.0f : hp_.rope_freq_scale;
        rope.attn_factor = hp_.rope_attn_factor;  // rope.scaling.attn_factor, on every layer as llama.cpp
        return rope;
    }

    Variant variant_;
    GemmaWeights w_;
};

std::unique_ptr<Model> load_gemma3(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options) {
    return std::make_unique<Gemma>(file, std::move(hp), options, kGemma3Variant);
}

std::unique_ptr<Model> load_gemma2(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options) {
    return std::make_unique<Gemma>(file, std::move(hp), options, kGemma2Variant);
}

}  // namespace

extern const Architecture kGemma2{"gemma2", read_gemma2_hparams, load_gemma2};
extern const Architecture kGemma3{"gemma3", read_gemma3_hparams, load_gemma3};

}  // namespace fitllm::model
