#include "kv/kv_cache.h"

#include <stdexcept>
#include <string>

#include "quant/blocks.h"

namespace fitllm::kv {
namespace {

void store_rounded(const float* src, int64_t n, float* dst) {
    for (int64_t i = 0; i < n; ++i) dst[i] = quant::fp16_to_fp32(quant::fp32_to_fp16(src[i]));
}

}  // namespace

KvCache::KvCache(int n_layer, int n_ctx, int n_head_kv, int head_dim_k, int head_dim_v)
    : n_layer_(n_layer),
      n_ctx_(n_ctx),
      k_row_(int64_t{n_head_kv} * head_dim_k),
      v_row_(int64_t{n_head_kv} * head_dim_v) {
    if (n_layer <= 0 || n_ctx <= 0 || n_head_kv <= 0 || head_dim_k <= 0 || head_dim_v <= 0) {
        throw std::invalid_argument("KvCache: every dimension must be positive (n_layer " + std::to_string(n_layer) +
                                    ", n_ctx " + std::to_string(n_ctx) + ")");
    }
    k_.resize(static_cast<size_t>(n_layer));
    v_.resize(static_cast<size_t>(n_layer));
    for (int il = 0; il < n_layer; ++il) {
        k_[static_cast<size_t>(il)].assign(static_cast<size_t>(n_ctx * k_row_), 0.0f);
        v_[static_cast<size_t>(il)].assign(static_cast<size_t>(n_ctx * v_row_), 0.0f);
    }
    pos_.assign(static_cast<size_t>(n_ctx), 0);
}

size_t KvCache::bytes() const {
    return static_cast<size_t>(n_layer_) * static_cast<size_t>(n_ctx_) * static_cast<size_t>(k_row_ + v_row_) *
               sizeof(float) +
           pos_.size() * sizeof(int32_t);
}

int KvCache::append(const int32_t* positions, int n_tok) {
    if (n_tok < 0 || n_tok > n_ctx_ - n_used_) {
        throw KvCacheError("KV cache full: " + std::to_string(n_tok) + " new tokens, " +
                           std::to_string(n_ctx_ - n_used_) + " of " + std::to_string(n_ctx_) +
                           " cells free (raise the context size, -c)");
    }
    const int first = n_used_;
    for (int t = 0; t < n_tok; ++t) pos_[static_cast<size_t>(first + t)] = positions[t];
    n_used_ += n_tok;
    return first;
}

void KvCache::store(int layer, int first, int n_tok, const float* k, const float* v) {
    if (layer < 0 || layer >= n_layer_ || first < 0 || first + n_tok > n_used_) {
        throw std::out_of_range("KvCache::store: layer " + std::to_string(layer) + ", cells [" + std::to_string(first) +
                                ", " + std::to_string(first + n_tok) + ") outside the " + std::to_string(n_used_) +
                                " cells in use");
    }
    store_rounded(k, n_tok * k_row_, k_[static_cast<size_t>(layer)].data() + first * k_row_);
    store_rounded(v, n_tok * v_row_, v_[static_cast<size_t>(layer)].data() + first * v_row_);
}

}  // namespace fitllm::kv
