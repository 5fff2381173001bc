#include "model/moe.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "ops/activation.h"

namespace fitllm::model {
namespace {

// One token's router scores as llama.cpp's tinyBLAS computes them on AVX-512 (llamafile's sgemm,
// which multiplies F32 weights by a batch of two or more tokens): each score one 16-lane fused
// multiply-add accumulator along the row, then _mm512_reduce_add_ps. cols: a multiple of 16.
__attribute__((target("avx512f"))) void scores_tinyblas(const ops::WeightView& w, const float* x, float* y) {
    for (int64_t r = 0; r < w.rows; ++r) {
        const auto* row = static_cast<const float*>(w.row(r));
        __m512 acc = _mm512_setzero_ps();
        for (int64_t c = 0; c < w.cols; c += 16)
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(row + c), _mm512_loadu_ps(x + c), acc);
        y[r] = _mm512_reduce_add_ps(acc);
    }
}

// The router's scores of m tokens, out: [m, n_expert]. llama.cpp sums an F32 router's batch of two
// or more tokens in tinyBLAS's order (where the rows are a multiple of 4 and the columns of 16) and
// a lone token in its dot's: tokens whose place puts them in a run of two or more take the former where the CPU has
// AVX-512 (the order llama.cpp's build there uses), the others ops::matmul's dot.
void router_scores(const ops::WeightView& w, const float* h, int m, std::span<const ops::TokenPlace> places, float* out,
                   ops::ThreadPool& pool, ops::Scratch& scratch) {
    ops::matmul(w, h, m, out, pool, scratch, places);
    if (w.type != quant::GgmlType::F32 || w.cols % 16 != 0 || w.rows % 4 != 0 || places.empty() ||
        !scratch.features().avx512f)
        return;
    pool.parallel_for(m, [&](int64_t begin, int64_t end, int) {
        for (int64_t t = begin; t < end; ++t) {
            if (places[static_cast<size_t>(t)].run_len >= 2) scores_tinyblas(w, h + t * w.cols, out + t * w.rows);
        }
    });
}

}  // namespace

void router_softmax(float* p, int n) {
    float max = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < n; ++i) max = std::max(max, p[i]);
    double sum = 0.0;
    int i = 0;
    for (; i + 15 < n; i += 16) {
        float v[16];
        for (int j = 0; j < 16; ++j) p[i + j] = v[j] = ops::exp_ggml_simd(p[i + j] - max);
        float half[8], quarter[4];  // _mm512_reduce_add_ps: halves, quarters, then (0+2) + (1+3)
        for (int j = 0; j < 8; ++j) half[j] = v[8 + j] + v[j];
        for (int j = 0; j < 4; ++j) quarter[j] = half[4 + j] + half[j];
        sum += static_cast<double>((quarter[0] + quarter[2]) + (quarter[1] + quarter[3]));
    }
    for (; i < n; ++i) {
        p[i] = std::exp(p[i] - max);
        sum += static_cast<double>(p[i]);
    }
    const auto inv = static_cast<float>(1.0 / sum);
    for (int k = 0; k < n; ++k) p[k] *= inv;
}

void route_token(const float* probs, int n, int k, float scale, int32_t* chosen, float* weights, bool normalize) {
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
    if (normalize) {
        double sum = 0.0;  // as ggml_sum_rows
        for (int r = 0; r < k; ++r) sum += weights[r];
        const float total = std::max(static_cast<float>(sum), 6.103515625e-5f);  // the smallest normal f16
        for (int r = 0; r < k; ++r) weights[r] /= total;
    }
    if (scale != 0.0f && scale != 1.0f) {
        for (int r = 0; r < k; ++r) weights[r] *= scale;
    }
}

void moe_route(const Hparams& hp, const MoeWeights& w, const float* h, int m, float* work, const MoeLayout& l,
               std::span<const ops::TokenPlace> places, ops::ThreadPool& pool, ops::Scratch& scratch) {
    const int n_expert = hp.n_expert;
    const int k = hp.n_expert_used;
    float* probs = work + l.probs;      // [m, n_expert]
    float* ids = work + l.ids;          // [m, k] expert ids
    float* weights = work + l.weights;  // [m, k]

    // Route: softmax over the experts' scores, the k best, their weights (gpt-oss: the k best
    // scores, plus the router bias, and a softmax over those k).
    router_scores(w.router, h, m, places, probs, pool, scratch);
    if (w.router_b != nullptr) ops::add_bias(probs, w.router_b, m, n_expert);
    int32_t chosen[kMaxExpertsUsed];
    for (int t = 0; t < m; ++t) {
        float* p = probs + int64_t{t} * n_expert;
        float* wt = weights + int64_t{t} * k;
        if (hp.gpt_oss_experts) {
            route_token(p, n_expert, k, 0.0f, chosen, wt, /*normalize=*/false);  // the logits
            router_softmax(wt, k);
            if (hp.expert_weights_scale != 0.0f && hp.expert_weights_scale != 1.0f) {
                for (int r = 0; r < k; ++r) wt[r] *= hp.expert_weights_scale;
            }
        } else {
            router_softmax(p, n_expert);
            route_token(p, n_expert, k, hp.expert_weights_scale, chosen, wt, hp.expert_weights_norm);
        }
        for (int r = 0; r < k; ++r) ids[int64_t{t} * k + r] = static_cast<float>(chosen[r]);
    }
}

namespace {

// The rows (token * k + rank, as float values) of the m tokens' routes to expert e, in rows; their
// count.
int rows_of_expert(const float* ids, int64_t n_routes, int e, float* rows) {
    int cnt = 0;
    for (int64_t s = 0; s < n_routes; ++s) {
        if (ids[s] == static_cast<float>(e)) rows[cnt++] = static_cast<float>(s);
    }
    return cnt;
}

}  // namespace

void moe_ffn(const Hparams& hp, const MoeWeights& w, float* h, int m, float* work, const MoeLayout& l,
             std::span<const ops::TokenPlace> places, ops::ThreadPool& pool, ops::Scratch& scratch,
             ExpertCache* experts, int il) {
    const int n_expert = hp.n_expert;
    const int k = hp.n_expert_used;
    const int64_t E = hp.n_embd;
    const int64_t F = hp.n_ff_exp;
    const float* ids = work + l.ids;          // [m, k] expert ids
    const float* weights = work + l.weights;  // [m, k]
    float* rows = work + l.rows;              // [<= m] token * k + rank, for one expert
    float* in = work + l.in;                  // [<= m, E]: the expert's input, then its output
    float* gate = work + l.gate;              // [<= m, F]
    float* up = work + l.up;                  // [<= m, F]
    float* outs = work + l.outs;              // [m, k, E]
    moe_route(hp, w, h, m, work, l, places, pool, scratch);

    // Each expert once, over the tokens that chose it; its weighted output in their rank's slot.
    for (int e = 0; e < n_expert; ++e) {
        const int cnt = rows_of_expert(ids, int64_t{m} * k, e, rows);
        if (cnt == 0) continue;
        for (int i = 0; i < cnt; ++i) {
            const auto t = static_cast<int64_t>(rows[i]) / k;
            std::memcpy(in + i * E, h + t * E, static_cast<size_t>(E) * sizeof(float));
        }
        ops::WeightView wg = expert_matrix(w.gate_exps, e, F);
        ops::WeightView wu = expert_matrix(w.up_exps, e, F);
        ops::WeightView wd = expert_matrix(w.down_exps, e, E);
        if (experts != nullptr) {  // the same bytes, in a slot of the cache
            const ExpertCache::Expert x = experts->get(il, e);
            wg.data = x.gate;
            wu.data = x.up;
            wd.data = x.down;
        }
        ops::matmul(wg, in, cnt, gate, pool, scratch);  // gate: [cnt, F]
        ops::matmul(wu, in, cnt, up, pool, scratch);    // up: [cnt, F]
        if (hp.gpt_oss_experts) {
            if (w.gate_exps_b) ops::add_bias(gate, w.gate_exps_b + int64_t{e} * F, cnt, F);
            if (w.up_exps_b) ops::add_bias(up, w.up_exps_b + int64_t{e} * F, cnt, F);
            ops::swiglu_oai(gate, up, int64_t{cnt} * F, kSwigluOaiAlpha, kSwigluOaiLimit, gate);
        } else {
            ops::swiglu(gate, up, int64_t{cnt} * F, gate);
        }
        ops::matmul(wd, gate, cnt, in, pool, scratch);  // in: [cnt, E]
        if (w.down_exps_b) ops::add_bias(in, w.down_exps_b + int64_t{e} * E, cnt, E);
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

void moe_experts_on_device(backend::Backend& dev, const Hparams& hp, const MoeWeights& w, float* h, int m, float* work,
                           const MoeLayout& l, const DeviceMoeBuffers& b) {
    const int n_expert = hp.n_expert;
    const int k = hp.n_expert_used;
    const int64_t E = hp.n_embd;
    const int64_t F = hp.n_ff_exp;
    const size_t row_bytes = static_cast<size_t>(E) * sizeof(float);
    const float* ids = work + l.ids;
    const float* weights = work + l.weights;
    float* rows = work + l.rows;
    // As moe_ffn, expert by expert: the same matmuls on the same bytes (the device's copies sit at
    // the mapped tensors' alignment), each weighted output in slot rank * m + token of outs.
    for (int e = 0; e < n_expert; ++e) {
        const int cnt = rows_of_expert(ids, int64_t{m} * k, e, rows);
        if (cnt == 0) continue;
        for (int i = 0; i < cnt; ++i) {
            const auto t = static_cast<int64_t>(rows[i]) / k;
            dev.copy_on_device(b.in + i * E, h + t * E, row_bytes);
        }
        dev.matmul(expert_matrix(w.gate_exps, e, F), b.in, cnt, b.gate);  // gate: [cnt, F]
        dev.matmul(expert_matrix(w.up_exps, e, F), b.in, cnt, b.up);      // up: [cnt, F]
        if (hp.gpt_oss_experts) {
            if (w.gate_exps_b) dev.add_bias(b.gate, w.gate_exps_b + int64_t{e} * F, cnt, F);
            if (w.up_exps_b) dev.add_bias(b.up, w.up_exps_b + int64_t{e} * F, cnt, F);
            dev.swiglu_oai(b.gate, b.up, int64_t{cnt} * F, kSwigluOaiAlpha, kSwigluOaiLimit, b.gate);
        } else {
            dev.swiglu(b.gate, b.up, int64_t{cnt} * F, b.gate);
        }
        dev.matmul(expert_matrix(w.down_exps, e, E), b.gate, cnt, b.in);  // in: [cnt, E]
        if (w.down_exps_b) dev.add_bias(b.in, w.down_exps_b + int64_t{e} * E, cnt, E);
        for (int i = 0; i < cnt; ++i) {
            const auto s = static_cast<int64_t>(rows[i]);
            float* dst = b.outs + ((s % k) * m + s / k) * E;
            dev.copy_on_device(dst, b.in + i * E, row_bytes);
            dev.scale(dst, E, weights[s]);
        }
    }
    // out = slot 0 + slot 1 + ..., per token (rank-major slots: one op per rank).
    dev.copy_on_device(h, b.outs, static_cast<size_t>(m) * row_bytes);
    for (int r = 1; r < k; ++r) dev.add(h, b.outs + int64_t{r} * m * E, int64_t{m} * E, h);
}

}  // namespace fitllm::model
