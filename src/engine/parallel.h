#pragma once
// Several continuations of one prompt decoded together (-np N): the prompt is fed once into
// sequence 0 and shared with sequences 1..N-1 by reference (kv seq_cp: no copy; the first write
// into a shared block copies it), then every forward pass decodes one token of each sequence
// still going, in one batch.
//
//   std::vector<sampling::Sampler> samplers = ...;  // one per sequence (own seeds)
//   const auto r = engine::generate_parallel(model, context, prompt, 64, samplers, is_eog, pool, &host);
//   r.tokens[s]: what sequence s generated
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/session.h"
#include "fitllm/config.h"
#include "model/model.h"
#include "ops/thread_pool.h"
#include "sampling/sampler.h"

namespace fitllm::engine {

struct ParallelResult {
    std::vector<std::vector<int32_t>> tokens;  // per sequence, the generated tokens (an EOG token included)
    GenerationStats stats;                     // n_generated: all sequences together
};

// One sequence per sampler (1..kMaxSequences; context.n_seq is taken from them). context.n_ctx is
// the tokens of all sequences together (as llama.cpp's -c with -np): the shared prompt once plus
// every sequence's tokens (the cache's cells: engine/context.h). A sequence stops after n_predict
// tokens or an EOG token; all stop when the cache is full (stats.context_full). Context shift
// does not apply. Throws kv::KvCacheError when the prompt does not fit, std::invalid_argument for
// no samplers or an empty prompt, ConfigError for what check() refuses, and memory::BudgetError
// when device has no room for the cache or the logits (nullptr: uncharged).
ParallelResult generate_parallel(model::Model& model, const ContextConfig& context, std::span<const int32_t> prompt,
                                 int n_predict, std::span<sampling::Sampler> samplers,
                                 const std::function<bool(int32_t)>& is_eog, ops::ThreadPool& pool,
                                 memory::Device* device = nullptr);

}  // namespace fitllm::engine
