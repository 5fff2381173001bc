#pragma once
// One conversation with a model: its KV cache (sequence 0 of a kv::ModelCache), the prompt fed in
// batches, then a decode loop that allocates nothing per token. When the context is full it
// either stops (default) or, with context_shift, forgets the oldest tokens after the first n_keep
// and goes on.
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

#include "kv/cache.h"
#include "memory/pool.h"
#include "model/model.h"
#include "ops/thread_pool.h"
#include "quant/ggml_type.h"
#include "sampling/sampler.h"

namespace fitllm::runtime {

struct SessionParams {
    int n_ctx = 2048;                               // tokens the KV cache holds (prompt and generated)
    int n_batch = 512;                              // prompt tokens per forward pass
    quant::GgmlType type_k = quant::GgmlType::F16;  // K/V storage (-ctk / -ctv)
    quant::GgmlType type_v = quant::GgmlType::F16;
    // KV spill (kv/cache.h): kv::CacheParams::spill_dir (--kv-spill-dir) and resident_limit
    // (--kv-resident; 0: no limit).
    std::string kv_spill_dir;
    uint64_t kv_resident_limit = 0;
    bool kv_rotation = true;     // Hadamard-rotate quantized K/V heads (--no-kv-rotation: false)
    bool context_shift = false;  // when full: drop old tokens and go on instead of stopping
    int n_keep = 0;              // with context_shift: the first n_keep tokens always stay
    // The budget's device: the KV cache is charged to its "kv" pool and the logits to "logits"
    // before they are allocated (memory::BudgetError when they do not fit). nullptr: uncharged.
    // Must outlive the session.
    memory::Device* device = nullptr;
};

// The cache parameters a session (or another single-stream user) makes its cache with.
kv::CacheParams cache_params(const SessionParams& params, int n_seq = 1);

// model.make_cache(params, n_batch) with its bytes charged to device's "kv" pool before it
// allocates (kv::CacheParams::pool): throws memory::BudgetError, allocating nothing, when they do
// not fit. device nullptr: nothing charged.
kv::ModelCache make_charged_cache(const model::Model& model, kv::CacheParams params, int n_batch,
                                  memory::Device* device);

// device's pool of that name, or (device nullptr) the pool of a device without a limit.
memory::Pool& pool_of(memory::Device* device, const char* name);

struct GenerationStats {
    int n_prompt = 0;
    double prompt_seconds = 0.0;
    int n_generated = 0;
    double generate_seconds = 0.0;  // from the first sampled token to the last
    bool context_full = false;      // stopped because the context was full (no context shift)
    int n_shifts = 0;               // context shifts done
};

class Session {
public:
    // Throws std::invalid_argument for a non-positive n_ctx or n_batch, a negative n_keep, or an
    // n_keep that leaves no room with context_shift (and what kv::ModelCache throws), and
    // memory::BudgetError when params.device has no room for the cache or the logits (nothing is
    // left charged then). The model and the pool must outlive the session.
    Session(model::Model& model, SessionParams params, ops::ThreadPool& pool);

    // The tokens the context holds: the position the next token gets.
    int n_past() const { return n_past_; }
    int n_ctx() const { return params_.n_ctx; }
    const kv::ModelCache& cache() const { return cache_; }

    // Feeds tokens after those already seen, n_batch at a time, and returns the logits
    // (n_vocab floats) after the last one; valid until the next call. When the context is full:
    // throws kv::KvCacheError ("context full ...", nothing fed) or, with context_shift, shifts
    // the context as often as needed.
    std::span<const float> feed(std::span<const int32_t> tokens);
    // Forgets everything fed so far.
    void reset();
    // The context shift (llama.cpp's): keeps the first n_keep tokens, drops the next
    // (n_past - n_keep) / 2 and moves the rest back over them (their K re-rotated on the next
    // forward pass). Returns the number of tokens dropped (0 when there is nothing to drop).
    int shift_context();

    // Feeds the prompt, then samples up to n_predict tokens, calling on_token for each (it may
    // return false to stop). Stops after a token for which is_eog is true (that token is still
    // passed to on_token), or when the context is full (stats.context_full) unless context_shift.
    GenerationStats generate(std::span<const int32_t> prompt, int n_predict, sampling::Sampler& sampler,
                             const std::function<bool(int32_t)>& is_eog, const std::function<bool(int32_t)>& on_token);

private:
    model::Model& model_;
    SessionParams params_;
    ops::ThreadPool& pool_;
    kv::ModelCache cache_;
    int n_past_ = 0;
    int n_shifts_ = 0;
    memory::PoolBuffer<float> logits_;  // [n_vocab]
    std::vector<int32_t> positions_;    // [n_batch]
};

}  // namespace fitllm::runtime
