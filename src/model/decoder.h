#pragma once
// Pieces the decoder-only forward passes (gemma3.cpp, llama.cpp, qwen2.cpp) share: their working
// memory, the check of a batch, and attention over the KV cache. Internal to model/.
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "model/hparams.h"
#include "ops/attention.h"
#include "ops/attention_f16.h"
#include "ops/scratch.h"
#include "ops/thread_pool.h"

namespace fitllm::model {

// Activations for a batch of tokens; vectors only grow.
struct Activations {
    std::vector<float> x, cur, q, k, v, attn, gate, up;
    void reserve(const Hparams& hp, int n_tok) {
        const auto grow = [n_tok](std::vector<float>& b, int64_t row) {
            const size_t n = static_cast<size_t>(n_tok * row);
            if (b.size() < n) b.resize(n);
        };
        grow(x, hp.n_embd);
        grow(cur, hp.n_embd);
        grow(q, int64_t{hp.n_head} * hp.head_dim);
        grow(k, int64_t{hp.n_head_kv} * hp.head_dim);
        grow(v, int64_t{hp.n_head_kv} * hp.head_dim_v);
        grow(attn, int64_t{hp.n_head} * hp.head_dim_v);
        grow(gate, hp.n_ff);
        grow(up, hp.n_ff);
    }
};

// Throws std::invalid_argument unless there is one position per token and at least one token.
inline void check_batch(const Hparams& hp, std::span<const int32_t> tokens, std::span<const int32_t> positions) {
    if (tokens.size() != positions.size() || tokens.empty()) {
        throw std::invalid_argument(hp.arch + " forward: " + std::to_string(tokens.size()) + " tokens but " +
                                    std::to_string(positions.size()) + " positions");
    }
}

// Attention of the batch's n queries q ([n, n_head, head_dim]) over layer il of the cache, which
// already holds the batch's K/V, as llama.cpp's flash attention computes it over its f16 cache:
// out = softmax(scale * q·k) v, out: [n, n_head * head_dim_v]. window > 0 limits each query to
// the last `window` positions.
inline void attend(const Hparams& hp, const kv::KvCache& cache, int il, const float* q, const int32_t* positions, int n,
                   float scale, int window, float* out, ops::ThreadPool& pool, ops::Scratch& scratch) {
    ops::AttentionParams ap;
    ap.n_head = hp.n_head;
    ap.n_head_kv = hp.n_head_kv;
    ap.head_dim = hp.head_dim;
    ap.scale = scale;
    ap.sliding_window = window;
    ops::attention_f16(q, positions, n, cache.k(il), cache.v(il), cache.positions(), cache.size(), ap, out, pool,
                       scratch);
}

}  // namespace fitllm::model
