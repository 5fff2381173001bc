#pragma once
// Perplexity of a model over a token sequence, computed as llama.cpp's `llama-perplexity` does so
// that the numbers compare:
//   - the tokens are cut into chunks of n_ctx; each chunk is evaluated from an empty cache, with
//     its first token replaced by BOS when the model adds one;
//   - only the second half of each chunk is scored (every token there has at least n_ctx / 2
//     tokens of context): positions first = n_ctx / 2 .. n_ctx - 2 predict the next token;
//   - PPL = exp(mean negative log-likelihood) over all scored tokens, with its standard error.
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "fitllm/config.h"
#include "memory/device.h"
#include "model/model.h"
#include "ops/thread_pool.h"
#include "quant/ggml_type.h"

namespace fitllm::engine {

struct PerplexityParams {
    int n_ctx = 512;
    int n_batch = 512;     // tokens per forward pass in the unscored first half
    int n_chunks = -1;     // < 0: every whole chunk
    int32_t bos = -1;      // >= 0: the first token of each chunk is replaced by it
    int score_batch = 64;  // rows per forward pass in the scored half (logits: score_batch x n_vocab)
    int n_seq = 1;         // chunks evaluated together, one sequence each (-np); the same up to rounding
};

// The context a perplexity run makes, from `kv`'s K/V settings (types, rotation, spill): n_seq
// sequences of n_ctx tokens, batches and rows of logits as perplexity() runs them. The plan of
// the run is made for it (engine::Engine::load), and perplexity() makes its cache and logits so.
ContextConfig perplexity_context(const PerplexityParams& params, ContextConfig kv);

struct PerplexityResult {
    int n_chunks = 0;
    int64_t n_scored = 0;
    double ppl = 0.0;
    double ppl_error = 0.0;  // standard error, as llama.cpp prints it after "+/-"
    double mean_nll = 0.0;   // ln(ppl)
};

// Called after each chunk with its number (1-based) and the running perplexity.
using ChunkFn = std::function<void(int chunk, double running_ppl)>;
// Called for every scored token with its number in scoring order (index: chunk by chunk, position
// by position, 0 .. n_chunks * perplexity_scored_per_chunk(n_ctx) - 1), its n_vocab logits and
// the log-prob of its target. With n_seq > 1 the calls come out of that order; the index says
// where each belongs (runtime/kl_divergence.h compares these distributions with a base run's).
using ScoredTokenFn = std::function<void(int64_t index, std::span<const float> logits, double target_log_prob)>;

// The KV cache has `kv`'s K/V settings; it and the logits are charged to device's pools before
// they are allocated (memory::BudgetError when they do not fit; nullptr: uncharged). Throws
// std::invalid_argument when there are fewer than 2 * n_ctx tokens (llama.cpp's rule) or a
// parameter is out of range.
PerplexityResult perplexity(model::Model& model, std::span<const int32_t> tokens, const PerplexityParams& params,
                            const ContextConfig& kv, ops::ThreadPool& pool, memory::Device* device = nullptr,
                            const ChunkFn& on_chunk = {}, const ScoredTokenFn& on_token = {});

// The chunks perplexity() evaluates for n_tokens tokens (params.n_chunks, n_ctx), and the tokens
// it scores in each: positions n_ctx / 2 .. n_ctx - 2.
int perplexity_chunks(int64_t n_tokens, const PerplexityParams& params);
inline int perplexity_scored_per_chunk(int n_ctx) {
    return n_ctx - 1 - n_ctx / 2;
}

// log softmax(logits)[target]: float exponentials summed in double, as llama.cpp does.
double log_prob(std::span<const float> logits, int32_t target);

}  // namespace fitllm::engine
