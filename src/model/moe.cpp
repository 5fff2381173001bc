#include "model/moe.h"

#include <algorithm>
#include <cstring>

#include "ops/activation.h"

namespace fitllm::model {

void route_token(const float* probs, int n, int k, float scale, int32_t* chosen, float* weights) {
    // k passes of a max over the rest: k and n are small (8 of 128), and the order is llama.cpp's
    // (a descending argsort).
    for (int r = 0; r < k; ++r) {
        int best = -1;
        for (int e = 0; e < n; ++e) {
            bool taken = false;
            for (int j = 0; j < r && !taken; ++j) taken = chosen[j] == e;
            if (!taken && (best < 0 || probs[e] > probs[best])) best = e;
        }
        chosen[r] = best;
        weights[r] = probs[best];
    }
    double sum = 0.0;  // as ggml_sum_rows
    for (int r = 0; r < k; ++r) sum += weights[r];
    const float total = std::max(static_cast<float>(sum), 6.103515625e-5f);  // the smallest normal f16
    for (int r = 0; r < k; ++r) weights[r] /= total;
    if (scale != 0.0f && scale != 1.0f) {
        for (int r = 0; r < k; ++r) weights[r] *= scale;
    }
}

void moe_ffn(const Hparams& hp, const MoeWeights& w, float* h, int m, float* work, const MoeLayout& l,
             std::span<const ops::TokenPlace> places, ops::ThreadPool& pool, ops::Scratch& scratch) {
    const int n_expert = hp.n_expert;
    const int k = hp.n_expert_used;
    const int64_t E = hp.n_embd;
    const int64_t F = hp.n_ff_exp;
    float* probs = work + l.probs;      // [m, n_expert]
    float* ids = work + l.ids;          // [m, k] expert ids
    float* weights = work + l.weights;  // [m, k]
    float* rows = work + l.rows;        // [<= m] token * k + rank, for one expert
    float* in = work + l.in;            // [<= m, E]: the expert's input, then its output
    float* gate = work + l.gate;        // [<= m, F]
    float* up = work + l.up;            // [<= m, F]
    float* outs = work + l.outs;        // [m, k, E]

    // Route: softmax over the experts' scores, the k best, their weights.
    ops::matmul(w.router, h, m, probs, pool, scratch, places);
    int32_t chosen[kMaxExpertsUsed];
    for (int t = 0; t < m; ++t) {
        float* p = probs + int64_t{t} * n_expert;
        ops::softmax(p, n_expert);
        route_token(p, n_expert, k, hp.expert_weights_scale, chosen, weights + int64_t{t} * k);
        for (int r = 0; r < k; ++r) ids[int64_t{t} * k + r] = static_cast<float>(chosen[r]);
    }

    // Each expert once, over the tokens that chose it; its weighted output in their rank's slot.
    for (int e = 0; e < n_expert; ++e) {
        int cnt = 0;
        for (int64_t s = 0; s < int64_t{m} * k; ++s) {
            if (ids[s] == static_cast<float>(e)) rows[cnt++] = static_cast<float>(s);
        }
        if (cnt == 0) continue;
        for (int i = 0; i < cnt; ++i) {
            const auto t = static_cast<int64_t>(rows[i]) / k;
            std::memcpy(in + i * E, h + t * E, static_cast<size_t>(E) * sizeof(float));
        }
        ops::matmul(expert_matrix(w.gate_exps, e, F), in, cnt, gate, pool, scratch);  // gate: [cnt, F]
        ops::matmul(expert_matrix(w.up_exps, e, F), in, cnt, up, pool, scratch);      // up: [cnt, F]
        ops::swiglu(gate, up, int64_t{cnt} * F, gate);
        ops::matmul(expert_matrix(w.down_exps, e, E), gate, cnt, in, pool, scratch);  // in: [cnt, E]
        for (int i = 0; i < cnt; ++i) {
            const auto s = static_cast<int64_t>(rows[i]);
            const float wt = weights[s];
            const float* src = in + i * E;
            float* dst = outs + s * E;
            for (int64_t c = 0; c < E; ++c) dst[c] = src[c] * wt;
        }
    }

    // out = slot 0 + slot 1 + ..., per token.
    for (int t = 0; t < m; ++t) {
        const float* slot = outs + int64_t{t} * k * E;
        float* out = h + int64_t{t} * E;
        std::memcpy(out, slot, static_cast<size_t>(E) * sizeof(float));
        for (int r = 1; r < k; ++r) ops::add(out, slot + r * E, E, out);
    }
}

}  // namespace fitllm::model
