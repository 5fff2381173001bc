#pragma once
// The simplest KV cache: one sequence, float K/V preallocated for n_ctx tokens in every layer,
// laid out as ops::attention reads it ([n_ctx, n_head_kv, head_dim] per layer), plus the
// position of each cell. Values are rounded to f16 precision when stored, as llama.cpp's default
// f16 cache does, so that greedy decoding matches it.
//
// Sliding-window layers keep every cell for now (the attention masks what they must not see).
#include <cstdint>
#include <vector>

#include "fitllm/error.h"

namespace fitllm::kv {

// The cache is full: says how many cells were asked for and how many are free.
class KvCacheError : public Error {
public:
    using Error::Error;
};

class KvCache {
public:
    KvCache(int n_layer, int n_ctx, int n_head_kv, int head_dim_k, int head_dim_v);

    int capacity() const { return n_ctx_; }
    int size() const { return n_used_; }
    int n_layer() const { return n_layer_; }
    // Bytes held by K, V and positions.
    size_t bytes() const;

    // Takes the next n_tok cells for tokens at `positions` and returns the first one. The cells
    // count in size() at once; store() then fills them layer by layer. Throws KvCacheError when
    // fewer than n_tok cells are free.
    int append(const int32_t* positions, int n_tok);
    // Copies n_tok rows of K ([n_head_kv * head_dim_k] each) and V into cells first.. of `layer`.
    void store(int layer, int first, int n_tok, const float* k, const float* v);

    const float* k(int layer) const { return k_[static_cast<size_t>(layer)].data(); }
    const float* v(int layer) const { return v_[static_cast<size_t>(layer)].data(); }
    const int32_t* positions() const { return pos_.data(); }

    // Forgets every cell (keeps the memory).
    void clear() { n_used_ = 0; }

private:
    int n_layer_;
    int n_ctx_;
    int64_t k_row_;  // floats per cell per layer
    int64_t v_row_;
    int n_used_ = 0;
    std::vector<std::vector<float>> k_;  // per layer: [n_ctx, n_head_kv, head_dim_k]
    std::vector<std::vector<float>> v_;
    std::vector<int32_t> pos_;  // [n_ctx]
};

}  // namespace fitllm::kv
