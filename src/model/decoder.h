#pragma once
// Pieces the decoder-only forward passes (gemma3.cpp, llama.cpp, qwen2.cpp) share: their working
// memory, the checks and cache bookkeeping around a batch (K shifts, placing, window trimming),
// attention over the KV cache, and the output rows. Internal to model/.
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv/cache.h"
#include "model/hparams.h"
#include "model/model.h"
#include "ops/attention.h"
#include "ops/attention_kv.h"
#include "ops/matmul.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/scratch.h"
#include "ops/thread_pool.h"

namespace fitllm::model {

// Activations for a batch of tokens; vectors only grow.
struct Activations {
    std::vector<float> x, cur, q, k, v, attn, gate, up;
    std::vector<kv::SeqId> seq0;  // sequence ids for a batch that gives none: all 0
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
        if (seq0.size() < static_cast<size_t>(n_tok)) seq0.assign(static_cast<size_t>(n_tok), 0);
    }
};

// A checked batch: n tokens with a position and a sequence id each.
struct BatchRows {
    int n = 0;
    const int32_t* positions = nullptr;
    const kv::SeqId* seq_ids = nullptr;
};

// Throws std::invalid_argument unless the batch has tokens, one position per token, one sequence
// id per token (or none) and one output flag per token (or none).
inline void check_batch(const Hparams& hp, const Batch& b) {
    const size_t n = b.tokens.size();
    const auto bad = [&](const std::string& what) {
        throw std::invalid_argument(hp.arch + " forward: " + std::to_string(n) + " tokens but " + what);
    };
    if (n == 0) bad("a batch needs at least one");
    if (b.positions.size() != n) bad(std::to_string(b.positions.size()) + " positions");
    if (!b.seq_ids.empty() && b.seq_ids.size() != n) bad(std::to_string(b.seq_ids.size()) + " sequence ids");
    if (!b.all_logits && !b.output.empty() && b.output.size() != n) {
        bad(std::to_string(b.output.size()) + " output flags");
    }
}

// Before a batch: checks it, applies the cache's pending K shifts (rope_for(il) gives layer il's
// RoPE parameters; K is rotated by each cell's delta), and places the batch's tokens in the cache.
// Throws kv::KvCacheError (from place) when they do not fit.
template <class RopeFor>
BatchRows begin_batch(const Hparams& hp, const Batch& b, kv::ModelCache& cache, Activations& a, RopeFor&& rope_for) {
    check_batch(hp, b);
    const int n = static_cast<int>(b.tokens.size());
    a.reserve(hp, n);
    if (cache.has_k_shift()) {
        for (int il = 0; il < hp.n_layer; ++il) {
            const ops::RopeParams rope = rope_for(il);
            cache.pool(cache.pool_of(il))
                .apply_k_shift(cache.index_in_pool(il), [&](float* k_rows, const int32_t* deltas, int n_rows) {
                    ops::rope(k_rows, deltas, n_rows, hp.n_head_kv, hp.head_dim, rope);
                });
        }
        cache.clear_k_shift();
    }
    BatchRows rows{n, b.positions.data(), b.seq_ids.empty() ? a.seq0.data() : b.seq_ids.data()};
    cache.place(std::span<const kv::SeqId>(rows.seq_ids, static_cast<size_t>(n)), b.positions);
    return rows;
}

// Writes the batch's K ([n, n_head_kv * head_dim]) and V rows of model layer il into its pool.
inline void store_kv(kv::ModelCache& cache, int il, const float* k, const float* v) {
    const int p = cache.pool_of(il);
    cache.pool(p).store(cache.index_in_pool(il), cache.cells(p), k, v);
}

// Attention of the batch's queries q ([n, n_head, head_dim]) over layer il of the cache, which
// already holds the batch's K/V; each token sees the cells of its own sequence (ops::attention_kv;
// with an f16 cache, llama.cpp's flash-attention arithmetic). out: [n, n_head * head_dim_v].
// window > 0 limits each query to the last `window` positions.
inline void attend(const Hparams& hp, const kv::ModelCache& cache, int il, const float* q, const BatchRows& rows,
                   float scale, int window, float* out, ops::ThreadPool& pool, ops::Scratch& scratch) {
    ops::AttentionParams ap;
    ap.n_head = hp.n_head;
    ap.n_head_kv = hp.n_head_kv;
    ap.head_dim = hp.head_dim;
    ap.scale = scale;
    ap.sliding_window = window;
    cache.will_attend(il);  // a spilled cache brings this layer in and reads the next one ahead
    ops::attention_kv(q, rows.positions, rows.seq_ids, rows.n, cache.pool(cache.pool_of(il)), cache.index_in_pool(il),
                      ap, out, pool, scratch);
}

// The rows of x ([n, n_embd]) that want logits, normed into cur (compacted, batch order); returns
// how many.
inline int output_rows(const Hparams& hp, const Batch& b, const float* x, const float* output_norm, float* cur) {
    const int n = static_cast<int>(b.tokens.size());
    const int64_t E = hp.n_embd;
    if (b.all_logits) {
        ops::rms_norm(x, output_norm, hp.norm_eps, n, E, cur);
        return n;
    }
    if (b.output.empty()) {
        ops::rms_norm(x + (n - 1) * E, output_norm, hp.norm_eps, 1, E, cur);
        return 1;
    }
    int n_out = 0;
    for (int t = 0; t < n; ++t) {
        if (b.output[static_cast<size_t>(t)] == 0) continue;
        ops::rms_norm(x + t * E, output_norm, hp.norm_eps, 1, E, cur + n_out * E);
        ++n_out;
    }
    return n_out;
}

}  // namespace fitllm::model
