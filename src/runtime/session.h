#pragma once
// One conversation with a model: its KV cache, the prompt fed in batches, then a decode loop
// that allocates nothing per token.
//
//   runtime::Session session(*model, {.n_ctx = 2048, .n_batch = 512}, pool);
//   const auto stats = session.generate(prompt_ids, 64, sampler, is_eog, [&](TokenId id) {
//       std::fputs(detok.feed(id).c_str(), stdout);
//       return true;  // false stops early
//   });
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"
#include "ops/thread_pool.h"
#include "sampling/sampler.h"

namespace fitllm::runtime {

struct SessionParams {
    int n_ctx = 2048;   // tokens the KV cache holds (prompt and generated)
    int n_batch = 512;  // prompt tokens per forward pass
};

struct GenerationStats {
    int n_prompt = 0;
    double prompt_seconds = 0.0;
    int n_generated = 0;
    double generate_seconds = 0.0;  // from the first sampled token to the last
};

class Session {
public:
    // Throws std::invalid_argument for a non-positive n_ctx or n_batch. The model and the pool
    // must outlive the session.
    Session(model::Model& model, SessionParams params, ops::ThreadPool& pool);

    int n_past() const { return cache_.size(); }
    const kv::KvCache& cache() const { return cache_; }

    // Feeds tokens after those already seen, n_batch at a time, and returns the logits
    // (n_vocab floats) after the last one; valid until the next call. Throws kv::KvCacheError
    // when the context is full.
    std::span<const float> feed(std::span<const int32_t> tokens);
    // Forgets everything fed so far.
    void reset();

    // Feeds the prompt, then samples up to n_predict tokens, calling on_token for each (it may
    // return false to stop). Stops after a token for which is_eog is true (that token is still
    // passed to on_token) or when the context is full.
    GenerationStats generate(std::span<const int32_t> prompt, int n_predict, sampling::Sampler& sampler,
                             const std::function<bool(int32_t)>& is_eog, const std::function<bool(int32_t)>& on_token);

private:
    model::Model& model_;
    SessionParams params_;
    ops::ThreadPool& pool_;
    kv::KvCache cache_;
    std::vector<float> logits_;       // [n_vocab]
    std::vector<int32_t> positions_;  // [n_batch]
};

}  // namespace fitllm::runtime
