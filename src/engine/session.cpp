#include "engine/session.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <stdexcept>
#include <string>

#include "engine/context.h"
#include "fitllm/error.h"

namespace fitllm::engine {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One sequence: n_seq 1 whatever the engine's context says.
ContextConfig checked(ContextConfig c) {
    c.n_seq = 1;
    check(c);
    if (c.n_ctx == 0) throw ConfigError("session: a context of 0 tokens (resolve it to the model's first)");
    return c;
}

}  // namespace

Session::Session(model::Model& model, const ContextConfig& context, ops::ThreadPool& pool, memory::Device* device)
    : model_(model),
      context_(checked(context)),
      pool_(pool),
      cache_(make_cache(model, context_, device)),
      n_logit_rows_(std::max(1, context_.n_outputs)),
      logits_(make_logits(model, n_logit_rows_, device)),
      positions_(static_cast<size_t>(context_.n_batch)) {
    tokens_.reserve(static_cast<size_t>(context_.n_ctx));
}

int Session::shift_context() {
    const int n_discard = (n_past_ - context_.n_keep) / 2;
    if (n_discard <= 0) return 0;
    cache_.seq_rm(0, context_.n_keep, context_.n_keep + n_discard);
    cache_.seq_add(0, context_.n_keep + n_discard, n_past_, -n_discard);
    tokens_.erase(tokens_.begin() + context_.n_keep, tokens_.begin() + context_.n_keep + n_discard);
    n_past_ -= n_discard;
    ++n_shifts_;
    return n_discard;
}

std::span<const float> Session::feed(std::span<const int32_t> tokens) {
    if (tokens.empty()) throw std::invalid_argument("session: feed() needs at least one token");
    const auto full = [&](size_t n) {
        return kv::KvCacheError("context full: " + std::to_string(n) + " tokens after " + std::to_string(n_past_) +
                                " do not fit in n_ctx = " + std::to_string(context_.n_ctx) +
                                " (raise -c, or --context-shift to drop old tokens)");
    };
    if (!context_.context_shift && tokens.size() > static_cast<size_t>(context_.n_ctx - n_past_)) {
        throw full(tokens.size());
    }
    for (size_t begin = 0; begin < tokens.size(); begin += static_cast<size_t>(context_.n_batch)) {
        const size_t n = std::min(tokens.size() - begin, static_cast<size_t>(context_.n_batch));
        while (n > static_cast<size_t>(context_.n_ctx - n_past_)) {
            if (shift_context() == 0) throw full(n);
        }
        while (true) {
            for (size_t t = 0; t < n; ++t) positions_[t] = n_past_ + static_cast<int32_t>(t);
            try {
                model_.forward(model::Batch{.tokens = tokens.subspan(begin, n),
                                            .positions = std::span<const int32_t>(positions_.data(), n),
                                            .n_vocab_out = vocab_limit_},
                               cache_, logits_.data(), pool_);
                break;
            } catch (const kv::KvCacheError&) {
                // The cells are there but not in whole blocks (holes a shift left): shift again.
                if (!context_.context_shift || shift_context() == 0) throw;
            }
        }
        n_past_ += static_cast<int>(n);
        tokens_.insert(tokens_.end(), tokens.begin() + static_cast<ptrdiff_t>(begin),
                       tokens.begin() + static_cast<ptrdiff_t>(begin + n));
    }
    return {logits_.data(), static_cast<size_t>(model_.n_vocab())};
}

std::span<const float> Session::feed_all(std::span<const int32_t> tokens) {
    const size_t most = static_cast<size_t>(std::min(n_logit_rows_, context_.n_batch));
    if (tokens.empty() || tokens.size() > most) {
        throw std::invalid_argument("session: feed_all() takes 1 to " + std::to_string(most) + " tokens, not " +
                                    std::to_string(tokens.size()));
    }
    if (tokens.size() > static_cast<size_t>(context_.n_ctx - n_past_)) {
        throw kv::KvCacheError("context full: " + std::to_string(tokens.size()) + " tokens after " +
                               std::to_string(n_past_) + " do not fit in n_ctx = " + std::to_string(context_.n_ctx));
    }
    const size_t n = tokens.size();
    for (size_t t = 0; t < n; ++t) positions_[t] = n_past_ + static_cast<int32_t>(t);
    // In the one-token arithmetic: each row's logits are those feed() gives for it, so that drafts
    // verified here pick what decoding without them picks (model::Batch::token_order).
    model_.forward(model::Batch{.tokens = tokens,
                                .positions = std::span<const int32_t>(positions_.data(), n),
                                .all_logits = true,
                                .token_order = true,
                                .n_vocab_out = vocab_limit_},
                   cache_, logits_.data(), pool_);
    n_past_ += static_cast<int>(n);
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
    return {logits_.data(), n * static_cast<size_t>(model_.n_vocab())};
}

void Session::reset() {
    cache_.clear();
    tokens_.clear();
    n_past_ = 0;
}

void Session::truncate(int n) {
    if (n <= 0) return reset();
    if (n >= n_past_) return;
    cache_.seq_rm(0, n, -1);
    tokens_.resize(static_cast<size_t>(n));
    n_past_ = n;
}

std::span<const float> Session::feed_prompt(std::span<const int32_t> prompt, sampling::Sampler& sampler,
                                            GenerationStats& stats) {
    const auto start = std::chrono::steady_clock::now();
    std::span<const float> logits = feed(prompt);
    stats.n_prompt = static_cast<int>(prompt.size());
    stats.prompt_seconds = seconds_since(start);
    for (const int32_t id : prompt) sampler.accept(id);
    return logits;
}

GenerationStats Session::generate(std::span<const int32_t> prompt, int n_predict, sampling::Sampler& sampler,
                                  const std::function<bool(int32_t)>& is_eog,
                                  const std::function<bool(int32_t)>& on_token) {
    GenerationStats stats;
    const int shifts_before = n_shifts_;
    std::span<const float> logits = feed_prompt(prompt, sampler, stats);

    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n_predict; ++i) {
        const int32_t next = sampler.sample(logits);
        sampler.accept(next);
        ++stats.n_generated;
        const bool go_on = on_token(next);
        if (!go_on || is_eog(next) || i + 1 == n_predict) break;
        if (!context_.context_shift && n_past_ >= context_.n_ctx) {
            stats.context_full = true;
            break;
        }
        logits = feed(std::span<const int32_t>(&next, 1));
    }
    stats.generate_seconds = seconds_since(start);
    stats.n_shifts = n_shifts_ - shifts_before;
    return stats;
}

}  // namespace fitllm::engine
