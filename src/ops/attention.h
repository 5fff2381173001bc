#pragma once
// Grouped-query causal attention of new query tokens over a K/V buffer, with an online softmax
// over tiles of keys: memory stays O(threads * (tile + head_dim)) whatever the context length, with
// no [n_tok, n_kv] score matrix.
//
// K/V layout here is the simplest one, float [n_kv, n_head_kv, head_dim] with a position per
// cell; the KV-cache module replaces it with its own views.
#include <cmath>
#include <cstdint>

#include "ops/scratch.h"
#include "ops/thread_pool.h"

namespace fitllm::ops {

struct AttentionParams {
    int n_head = 0;     // query heads
    int n_head_kv = 0;  // key/value heads; n_head is a multiple of it (grouped-query attention)
    int head_dim = 0;
    float scale = 0.0f;      // multiplies q·k; usually 1 / sqrt(head_dim)
    float softcap = 0.0f;    // > 0: scores become softcap * tanh(score / softcap) (Gemma 2)
    int sliding_window = 0;  // > 0: a query at p sees only keys at positions > p - sliding_window
    // [n_head] or nullptr: gpt-oss's attention sinks, one learned logit per query head that joins
    // the softmax's denominator and carries no value (apply_sink).
    const float* sinks = nullptr;
};

// A query's sink `sink` taken into its online softmax after the last key, as ggml's flash
// attention does it: with the running maximum `max` and sum `sum` of the weights, a sink above the
// maximum becomes the maximum (sum = sum * exp(max - sink) + 1, fused), otherwise sum += exp(sink -
// max). Returns the factor the query's weighted sum of V is multiplied by before the division by
// sum: exp(max - sink) in the first case, 1 in the second. A query that saw no key (max -inf) gets
// sum 1 and factor 0: zeros, as without a sink.
inline float apply_sink(float sink, float max, float& sum) {
    if (sink > max) {
        const float ms = std::exp(max - sink);
        sum = std::fma(sum, ms, 1.0f);
        return ms;
    }
    sum = sum + std::exp(sink - max);
    return 1.0f;
}

// Throws std::invalid_argument, naming `function`, unless the head counts and size make sense.
void check_attention_params(const char* function, const AttentionParams& params);

// For each token t and query head h, with kv head g = h / (n_head / n_head_kv):
//   out[t][h] = sum over visible j of softmax_j(scale * q[t][h] · k[j][g]) * v[j][g]
// where key j is visible when kv_pos[j] <= q_pos[t] (causal) and inside the sliding window; with
// sinks, the softmax's denominator also has exp(sinks[h]) (apply_sink).
// q, out: [n_tok, n_head, head_dim]; k, v: [n_kv, n_head_kv, head_dim]. A query that sees no key
// gets zeros. Throws std::invalid_argument for inconsistent head counts.
void attention(const float* q, const int32_t* q_pos, int64_t n_tok, const float* k, const float* v,
               const int32_t* kv_pos, int64_t n_kv, const AttentionParams& params, float* out, ThreadPool& pool,
               Scratch& scratch);

}  // namespace fitllm::ops
