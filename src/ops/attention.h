#pragma once
// Grouped-query causal attention of new query tokens over a K/V buffer, with an online softmax
// over tiles of keys: memory stays O(threads * (tile + head_dim)) whatever the context length, with
// no [n_tok, n_kv] score matrix.
//
// K/V layout here is the simplest one, float [n_kv, n_head_kv, head_dim] with a position per
// cell; the KV-cache module replaces it with its own views.
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
};

// Throws std::invalid_argument, naming `function`, unless the head counts and size make sense.
void check_attention_params(const char* function, const AttentionParams& params);

// For each token t and query head h, with kv head g = h / (n_head / n_head_kv):
//   out[t][h] = sum over visible j of softmax_j(scale * q[t][h] · k[j][g]) * v[j][g]
// where key j is visible when kv_pos[j] <= q_pos[t] (causal) and inside the sliding window.
// q, out: [n_tok, n_head, head_dim]; k, v: [n_kv, n_head_kv, head_dim]. A query that sees no key
// gets zeros. Throws std::invalid_argument for inconsistent head counts.
void attention(const float* q, const int32_t* q_pos, int64_t n_tok, const float* k, const float* v,
               const int32_t* kv_pos, int64_t n_kv, const AttentionParams& params, float* out, ThreadPool& pool,
               Scratch& scratch);

}  // namespace fitllm::ops
