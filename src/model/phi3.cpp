// Phi-3 (mini, medium; 3.5-mini; 4-mini): Llama's pre-norm block with Q, K and V fused into one
// matrix (attn_qkv: Q's rows, then K's, then V's; some files have them apart), gate and up fused
// into one (ffn_up of 2 n_ff rows: gate's, then up's, as ggml_swiglu splits them), NeoX-style
// rotary embeddings on the first rope.dimension_count dims of each head (Phi-4-mini: 3/4 of them),
// and LongRoPE for the 128k files: per-pair frequency divisors, rope_factors_short.weight for a
// context of at most rope.scaling.original_context_length positions per sequence and
// rope_factors_long.weight beyond, cos and sin scaled by rope.scaling.attn_factor (read for every
// architecture by read_hparams; the converter writes sqrt(1 + ln(s) / ln(n_ctx_orig)), s the context extension).
// Reference: the Phi-3 technical report; llama.cpp's phi3 graph and its get_rope_factors for the
// exact order of ops and the choice of factors. Phi-3-small (blocksparse attention) has no GGUF
// form llama.cpp reads; Phi-3.5-MoE is the "phimoe" architecture: both refused.
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

// Phi-3 (llama.cpp's LLM_ARCH_PHI3): every layer attends globally. The files may say
// attention.sliding_window (Phi-3-mini-4k: 2047), but llama.cpp turns Phi's window off (its
// pull 13676) and so do we: same logits. Q is scaled by 1/sqrt(head_dim).
void read_phi3_hparams(const HparamReader& r, Hparams& hp) {
    if (r.has("expert_count") && r.file().get_int(r.key("expert_count")) > 0) {
        r.refuse("expert_count", std::to_string(r.file().get_int(r.key("expert_count"))),
                 "mixture-of-experts Phi (Phi-3.5-MoE) is not supported");
    }
    hp.is_swa.assign(static_cast<size_t>(hp.n_layer), false);
    hp.sliding_window = 0;
    hp.rope_base_swa = hp.rope_base;
    if (hp.head_dim_v != hp.head_dim) {
        r.refuse("attention.value_length", std::to_string(hp.head_dim_v),
                 "differs from '" + r.key("attention.key_length") + "' = " + std::to_string(hp.head_dim) +
                     "; phi3 needs equal K and V head sizes");
    }
    hp.n_rot = r.count_or("rope.dimension_count", hp.head_dim);
    if (hp.n_rot % 2 != 0 || hp.n_rot > hp.head_dim) {
        r.refuse("rope.dimension_count", std::to_string(hp.n_rot),
                 "must be even and at most the head size " + std::to_string(hp.head_dim));
    }
    // The converter writes no scaling type for LongRoPE (the factors are tensors); a file that
    // says "longrope" gets llama.cpp's treatment of it: a linear factor when given, no YaRN mix.
    const std::string type =
        r.has("rope.scaling.type") ? std::string(r.file().get<std::string_view>(r.key("rope.scaling.type"))) : "linear";
    if (type == "longrope") {
        const float factor = r.number_or("rope.scaling.factor", 0.0f);
        if (factor < 0.0f || !std::isfinite(factor)) {
            r.refuse("rope.scaling.factor", std::to_string(factor), "must be positive (or 0 for none)");
        }
        hp.rope_freq_scale = factor == 0.0f ? 1.0f : 1.0f / factor;
    } else {
        r.rope_scaling(hp);  // linear, none or YaRN; others refused by name
    }
    hp.attn_scale = 1.0f / std::sqrt(static_cast<float>(hp.head_dim));
}

// Phi-3, one block. Fused files hold wqkv and ffn_up_gate only, as the file's tensors (so that a
// stream buffer or a device copy replaces them whole); the forward pass takes Q, K, V, gate and up
// as row ranges of them.
struct Phi3Layer {
    const float* attn_norm = nullptr;  // [n_embd]
    ops::WeightView wqkv;              // [(n_head + 2 n_head_kv) * head_dim, n_embd], or none
    ops::WeightView wq;                // [n_head * head_dim, n_embd] (files without wqkv)
    ops::WeightView wk;                // [n_head_kv * head_dim, n_embd]
    ops::WeightView wv;                // [n_head_kv * head_dim, n_embd]
    ops::WeightView wo;                // [n_embd, n_head * head_dim]
    const float* ffn_norm = nullptr;   // [n_embd]
    ops::WeightView ffn_up_gate;       // [2 n_ff, n_embd]: gate's rows, then up's
    ops::WeightView ffn_down;          // [n_embd, n_ff]
};

template <class F>
void for_each_weight(Phi3Layer& L, F&& f) {
    static_assert(sizeof(Phi3Layer) == 2 * sizeof(const float*) + 7 * sizeof(ops::WeightView),
                  "a Phi3Layer field is missing from for_each_weight");
    for (const float** p : {&L.attn_norm, &L.ffn_norm}) f(*p);
    for (ops::WeightView* w : {&L.wqkv, &L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_up_gate, &L.ffn_down}) f(w->data);
}

// Rows [first, first + n) of a matrix, as a matrix of its own.
ops::WeightView rows_of(const ops::WeightView& w, int64_t first, int64_t n) {
    ops::WeightView v = w;
    v.rows = n;
    v.data = w.data ? w.row(first) : nullptr;
    return v;
}

struct Phi3Weights {
    ops::WeightView token_embd;          // [n_vocab, n_embd]
    std::vector<Phi3Layer> layers;       // n_layer
    const float* output_norm = nullptr;  // [n_embd]
    ops::WeightView output;              // [n_vocab, n_embd]; token_embd when tied
    // LongRoPE's per-pair divisors of the frequencies ([n_rot / 2] each), or nullptr.
    const float* rope_long = nullptr;
    const float* rope_short = nullptr;
};

// Throws ModelError naming the first missing or misshapen tensor, or one the pass would leave out.
Phi3Weights bind_phi3_weights(const gguf::GgufFile& file, const Hparams& hp) {
    const TensorBinder b(file);
    Phi3Weights w;
    w.token_embd = b.matrix("token_embd.weight", hp.n_vocab, hp.n_embd);
    w.output_norm = b.vector("output_norm.weight", hp.n_embd);
    w.output = b.optional_matrix("output.weight", hp.n_vocab, hp.n_embd);
    if (!w.output.data) w.output = w.token_embd;  // tied
    b.refuse("output.bias", "output biases are not implemented for phi3");
    w.rope_long = b.optional_vector("rope_factors_long.weight", hp.n_rot / 2);
    w.rope_short = b.optional_vector("rope_factors_short.weight", hp.n_rot / 2);
    if ((w.rope_long == nullptr) != (w.rope_short == nullptr)) {
        throw ModelError(file.source() + ": tensor '" +
                         (w.rope_long ? "rope_factors_short.weight" : "rope_factors_long.weight") +
                         "' is missing; LongRoPE needs both the short and the long factors");
    }
    const int64_t q_dim = int64_t{hp.n_head} * hp.head_dim;
    const int64_t kv_dim = int64_t{hp.n_head_kv} * hp.head_dim;
    for (int il = 0; il < hp.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        Phi3Layer L;
        L.attn_norm = b.vector(p + "attn_norm.weight", hp.n_embd);
        L.wqkv = b.optional_matrix(p + "attn_qkv.weight", q_dim + 2 * kv_dim, hp.n_embd);
        if (L.wqkv.data) {
            for (const char* t : {"attn_q.weight", "attn_k.weight", "attn_v.weight"}) {
                b.refuse(p + t, "the file also has '" + p + "attn_qkv.weight'");
            }
        } else {
            L.wq = b.matrix(p + "attn_q.weight", q_dim, hp.n_embd);
            L.wk = b.matrix(p + "attn_k.weight", kv_dim, hp.n_embd);
            L.wv = b.matrix(p + "attn_v.weight", kv_dim, hp.n_embd);
        }
        L.wo = b.matrix(p + "attn_output.weight", hp.n_embd, q_dim);
        L.ffn_norm = b.vector(p + "ffn_norm.weight", hp.n_embd);
        L.ffn_up_gate = b.matrix(p + "ffn_up.weight", 2 * int64_t{hp.n_ff}, hp.n_embd);
        L.ffn_down = b.matrix(p + "ffn_down.weight", hp.n_embd, hp.n_ff);
        for (const char* t : {"attn_qkv.bias", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias",
                              "attn_norm.bias", "ffn_norm.bias", "ffn_up.bias", "ffn_down.bias"}) {
            b.refuse(p + t, "biases are not implemented for phi3");
        }
        for (const char* t : {"ffn_gate.weight", "ffn_gate_inp.weight"}) {
            b.refuse(p + t, "phi3 has one fused gate-up matrix (ffn_up.weight) and no experts");
        }
        w.layers.push_back(L);
    }
    return w;
}

class Phi3 final : public DecoderModel {
public:
    Phi3(const gguf::GgufFile& file, Hparams hp, int n_ctx_orig, const LoadOptions& options)
        : DecoderModel(file, std::move(hp), options), n_ctx_orig_(n_ctx_orig), w_(bind_phi3_weights(file, hp_)) {
        mem_.place_weights(w_);  // the offloaded layers' views point at the device's copies
    }

    void forward(const Batch& batch, kv::ModelCache& cache, float* logits_out, ops::ThreadPool& pool) override {
        const Hparams& hp = hp_;
        const ops::RopeParams rope = rope_params(cache);
        const BatchRows rows = begin_batch(hp, batch, cache, mem_, pool, [&rope](int) { return rope; });
        const std::span<const ops::TokenPlace> places =
            batch_places(batch, mem_, rows);  // where each token sits in its run
        const int n = rows.n;
        const int64_t E = hp.n_embd;
        const int64_t q_dim = int64_t{hp.n_head} * hp.head_dim;
        const int64_t kv_dim = int64_t{hp.n_head_kv} * hp.head_dim;

        ops::embedding_rows(w_.token_embd, batch.tokens.data(), n, mem_.a.x.data());  // x: [n, n_embd]

        for (int il = 0; il < hp.n_layer; ++il) {
            const LayerRef<Phi3Layer> L = mem_.layer(w_.layers, il);  // waits for a streamed layer
            Exec& o = mem_.enter(il);  // the ops and activations of the device that runs layer il
            float* x = o.x;
            float* cur = o.cur;

            // Attention block; Q scaled after the rotation, as llama.cpp does.
            o.rms_norm(x, L->attn_norm, hp.norm_eps, n, E, cur);
            const bool fused = L->wqkv.data != nullptr;
            o.matmul(fused ? rows_of(L->wqkv, 0, q_dim) : L->wq, cur, n, o.q, places);  // q: [n, n_head, head_dim]
            o.matmul(fused ? rows_of(L->wqkv, q_dim, kv_dim) : L->wk, cur, n, o.k, places);
            o.matmul(fused ? rows_of(L->wqkv, q_dim + kv_dim, kv_dim) : L->wv, cur, n, o.v, places);
            o.rope(o.q, rows.positions, n, hp.n_head, hp.head_dim, rope);
            o.rope(o.k, rows.positions, n, hp.n_head_kv, hp.head_dim, rope);
            o.store_kv(cache, il, o.k, o.v, o.q, rows, hp, rope);  // q: for the K transform's fit
            o.scale(o.q, int64_t{n} * q_dim, hp.attn_scale);
            attend(o, hp, cache, il, o.q, rows, /*scale=*/1.0f, /*window=*/0, o.attn);  // attn: [n, q_dim]
            o.matmul(L->wo, o.attn, n, o.attn_out, places);                             // attn_out: [n, n_embd]
            o.add(x, o.attn_out, n * E, x);

            // Feed-forward block: down(silu(gate(h)) * up(h)), gate and up the two halves of
            // ffn_up's rows, a slice of tokens at a time.
            o.rms_norm(x, L->ffn_norm, hp.norm_eps, n, E, cur);
            const ops::WeightView gate = rows_of(L->ffn_up_gate, 0, hp.n_ff);
            const ops::WeightView up = rows_of(L->ffn_up_gate, hp.n_ff, hp.n_ff);
            for (int t0 = 0; t0 < n; t0 += o.ffn_slice) {
                const int m = std::min(o.ffn_slice, n - t0);
                float* h = cur + t0 * E;
                o.matmul(gate, h, m, o.gate, places_of(places, t0, m));  // gate: [m, n_ff]
                o.matmul(up, h, m, o.up, places_of(places, t0, m));      // up: [m, n_ff]
                o.swiglu(o.gate, o.up, int64_t{m} * hp.n_ff, o.gate);
                o.matmul(L->ffn_down, o.gate, m, h, places_of(places, t0, m));  // h: [m, n_embd], over its read rows
            }
            o.add(x, cur, n * E, x);
        }
        cache.end_batch();

        output_logits(batch, rows, w_.output_norm, w_.output, logits_out);
    }

private:
    // LongRoPE picks its factors by the context a sequence may take, as llama.cpp's
    // get_rope_factors does by n_ctx_seq: the long ones beyond the original context.
    ops::RopeParams rope_params(const kv::ModelCache& cache) const {
        return hparams_rope(hp_, ops::RopeMode::Neox, cache.n_positions() > n_ctx_orig_ ? w_.rope_long : w_.rope_short);
    }

    int n_ctx_orig_;
    Phi3Weights w_;
};

std::unique_ptr<Model> load_phi3(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options) {
    const HparamReader r(file, hp.arch);
    const int n_ctx_orig = r.count_or("rope.scaling.original_context_length", hp.n_ctx_train);
    return std::make_unique<Phi3>(file, std::move(hp), n_ctx_orig, options);
}

}  // namespace

extern const Architecture kPhi3{"phi3", read_phi3_hparams, load_phi3};

}  // namespace fitllm::model
