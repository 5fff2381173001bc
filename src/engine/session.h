#pragma once
// One conversation with a model: its KV cache (sequence 0 of a kv::ModelCache), the prompt fed in
// batches, then a decode loop that allocates nothing per token. When the context is full it
// either stops (default) or, with context_shift, forgets the oldest tokens after the first n_keep
// and goes on.
//
//   engine::Session session(engine.model(), engine.context(), engine.threads(), &engine.host());
//   const auto stats = session.generate(prompt_ids, 64, sampler, is_eog, [&](TokenId id) {
//       std::fputs(detok.feed(id).c_str(), stdout);
//       return true;  // false stops early
//   });
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/lookup.h"
#include "fitllm/config.h"
#include "kv/cache.h"
#include "memory/pool.h"
#include "model/model.h"
#include "ops/thread_pool.h"
#include "quant/ggml_type.h"
#include "sampling/sampler.h"

namespace fitllm::engine {

class Drafter;  // engine/drafter.h

struct GenerationStats {
    int n_prompt = 0;
    double prompt_seconds = 0.0;
    int n_generated = 0;
    double generate_seconds = 0.0;  // from the first sampled token to the last
    bool context_full = false;      // stopped because the context was full (no context shift)
    int n_shifts = 0;               // context shifts done
    // Speculative decoding (generate_speculative): forward passes that checked a draft, the tokens
    // drafted, and those the model accepted (each an emitted token that cost no pass of its own).
    int n_draft_passes = 0;
    int n_drafted = 0;
    int n_accepted = 0;
};

class Session {
public:
    // A cache of context.n_ctx tokens (engine/context.h; n_seq is 1) and one row of logits,
    // charged to device's pools (nullptr: uncharged). Throws ConfigError for what check() refuses
    // or an n_ctx of 0, and memory::BudgetError when the device has no room for the cache or the
    // logits (nothing is left charged then). The model, the pool and the device must outlive the
    // session.
    Session(model::Model& model, const ContextConfig& context, ops::ThreadPool& pool, memory::Device* device = nullptr);

    // The tokens the context holds: the position the next token gets.
    int n_past() const { return n_past_; }
    int n_ctx() const { return context_.n_ctx; }
    const kv::ModelCache& cache() const { return cache_; }
    kv::ModelCache& cache() { return cache_; }
    // The tokens the context holds, in order (n_past() of them): what was fed, less what
    // truncate(), reset() and context shifts took back.
    std::span<const int32_t> tokens() const { return tokens_; }

    // The most tokens feed_all() takes: context.n_outputs rows of logits (at least 1).
    int n_logit_rows() const { return n_logit_rows_; }

    // Feeds tokens after those already seen, n_batch at a time, and returns the logits
    // (n_vocab floats) after the last one; valid until the next call. When the context is full:
    // throws kv::KvCacheError ("context full ...", nothing fed) or, with context_shift, shifts
    // the context as often as needed.
    std::span<const float> feed(std::span<const int32_t> tokens);
    // Feeds at most min(n_logit_rows(), n_batch) tokens in one forward pass and returns every
    // token's logits (tokens.size() rows of n_vocab floats). Never shifts the context: throws
    // kv::KvCacheError when the tokens do not fit (nothing fed).
    std::span<const float> feed_all(std::span<const int32_t> tokens);
    // Forgets everything fed so far.
    void reset();
    // Forgets the tokens at positions n and after: the next ones are fed after the first n.
    void truncate(int n);
    // n > 0: the forward passes score only tokens 0 .. n - 1 (model::Batch::n_vocab_out; the
    // rest of the logits -infinity); 0: all. A draft model's cheaper output layer.
    void set_vocab_limit(int n) { vocab_limit_ = n; }
    // Context shifts done since the session began.
    int n_shifts() const { return n_shifts_; }
    // The context shift (llama.cpp's): keeps the first n_keep tokens, drops the next
    // (n_past - n_keep) / 2 and moves the rest back over them (their K re-rotated on the next
    // forward pass). Returns the number of tokens dropped (0 when there is nothing to drop).
    int shift_context();

    // Feeds the prompt, then samples up to n_predict tokens, calling on_token for each (it may
    // return false to stop). Stops after a token for which is_eog is true (that token is still
    // passed to on_token), or when the context is full (stats.context_full) unless context_shift.
    GenerationStats generate(std::span<const int32_t> prompt, int n_predict, sampling::Sampler& sampler,
                             const std::function<bool(int32_t)>& is_eog, const std::function<bool(int32_t)>& on_token);

    // generate() with speculative decoding (engine/drafter.h): before each forward pass, up to
    // max_draft(drafter.n_draft()) tokens are drafted from the context's tokens and what was
    // generated, fed after the last token in one pass (feed_all), and checked left to right with
    // Sampler::sample_draft; the first one rejected is replaced by the model's token, and when
    // all are accepted the pass's last row gives one more. The rejected drafts' cells are taken
    // back (truncate). The tokens are generate()'s distribution when sampling, and generate()'s
    // tokens when greedy: feed_all() runs the drafts in the one-token arithmetic
    // (model::Batch::token_order), so each row's logits are those a one-token pass gives.
    // Context full and shifts happen at generate()'s tokens: no draft is fed that would need a
    // shift. Without room for a draft (max_draft() 0) it is generate().
    GenerationStats generate_speculative(std::span<const int32_t> prompt, int n_predict, sampling::Sampler& sampler,
                                         Drafter& drafter, const std::function<bool(int32_t)>& is_eog,
                                         const std::function<bool(int32_t)>& on_token);
    // generate_speculative() with prompt lookup (engine/lookup.h) as the drafter.
    GenerationStats generate_lookup(std::span<const int32_t> prompt, int n_predict, sampling::Sampler& sampler,
                                    const LookupParams& lookup, const std::function<bool(int32_t)>& is_eog,
                                    const std::function<bool(int32_t)>& on_token);
    // The drafts one pass of generate_lookup checks at most: lookup.n_draft, within the rows of
    // logits and half the batch (the sliding-window pools keep that many positions more,
    // kv::ModelCache::set_window_slack).
    int max_draft(int n_draft) const;
    int max_draft(const LookupParams& lookup) const { return max_draft(lookup.n_draft); }

private:
    // generate()'s first step, and generate_lookup()'s: feeds the prompt, shows it to the sampler,
    // records its size and time in stats; returns the logits after it.
    std::span<const float> feed_prompt(std::span<const int32_t> prompt, sampling::Sampler& sampler,
                                       GenerationStats& stats);
    model::Model& model_;
    ContextConfig context_;
    ops::ThreadPool& pool_;
    kv::ModelCache cache_;
    int n_past_ = 0;
    int n_shifts_ = 0;
    int n_logit_rows_;
    memory::PoolBuffer<float> logits_;  // [n_logit_rows, n_vocab]
    std::vector<int32_t> positions_;    // [n_batch]
    std::vector<int32_t> tokens_;       // what the cache holds, reserved for n_ctx
    int vocab_limit_ = 0;
};

}  // namespace fitllm::engine
