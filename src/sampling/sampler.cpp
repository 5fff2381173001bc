#include "sampling/sampler.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

namespace fitllm::sampling {
namespace {

// A logit_bias at or below this bans the token (OpenAI: "-100 should result in a ban").
constexpr float kBanBias = -100.0f;

uint64_t resolve_seed(uint64_t requested) {
    if (requested != kRandomSeed) return requested;
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) | device();
}

void seed_generator(std::mt19937& rng, uint64_t seed) {
    // Both halves of the seed matter, so seeds that differ only in the high bits differ.
    std::seed_seq sequence{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
    rng.seed(sequence);
}

}  // namespace

Sampler::Sampler(SamplingParams params, int32_t vocab_size)
    : params_(std::move(params)), vocab_size_(vocab_size), seed_(resolve_seed(params_.seed)) {
    if (vocab_size <= 0)
        throw SamplingError("sampling: vocab_size = " + std::to_string(vocab_size) + " must be positive");
    validate_sampling_params(params_);
    std::vector<TokenId> banned;
    for (const auto& [id, bias] : params_.logit_bias) {
        if (id < 0 || id >= vocab_size)
            throw SamplingError("sampling: logit_bias names token " + std::to_string(id) +
                                ", outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
        if (bias <= kBanBias) banned.push_back(id);
    }
    std::sort(banned.begin(), banned.end());
    if (std::unique(banned.begin(), banned.end()) - banned.begin() == vocab_size)
        throw SamplingError("sampling: logit_bias bans every token of the vocabulary");
    seed_generator(rng_, seed_);
    window_.assign(static_cast<size_t>(params_.penalty_last_n), 0);
    window_distinct_.reserve(window_.size());
    window_counts_.reserve(window_.size());
    if (params_.grammar) {
        if (!params_.grammar_vocab)
            throw SamplingError("sampling: a grammar needs the model's vocabulary (grammar_vocab)");
        if (params_.grammar_vocab->size() != vocab_size)
            throw SamplingError("sampling: the grammar's vocabulary has " +
                                std::to_string(params_.grammar_vocab->size()) + " tokens, the model " +
                                std::to_string(vocab_size));
        try {
            grammar_ = std::make_unique<GrammarMatcher>(params_.grammar, params_.grammar_vocab);
        } catch (const GrammarError& e) {
            throw SamplingError(std::string("sampling: ") + e.what());
        }
    }
}

void Sampler::narrow(std::span<const float> logits, bool masked) {
    if (logits.size() != static_cast<size_t>(vocab_size_))
        throw SamplingError("sampling: got " + std::to_string(logits.size()) + " logits for a vocabulary of " +
                            std::to_string(vocab_size_) + " tokens");
    if (candidates_.items.capacity() < logits.size()) candidates_.items.reserve(logits.size());  // once, warm after
    candidates_.assign(logits);
    for (const auto& [id, bias] : params_.logit_bias) {  // in id order after assign()
        float& logit = candidates_.items[static_cast<size_t>(id)].logit;
        logit = bias <= kBanBias ? -std::numeric_limits<float>::infinity() : logit + bias;
    }
    if (masked) {
        const std::vector<uint64_t>* mask = nullptr;
        try {
            mask = &grammar_->allowed_tokens();
        } catch (const GrammarError& e) {
            throw SamplingError(std::string("sampling: ") + e.what());
        }
        constexpr float kOff = -std::numeric_limits<float>::infinity();
        bool any = false;
        for (size_t w = 0; w < mask->size(); ++w) {
            const uint64_t bits = (*mask)[w];
            const size_t base = w * 64, end = std::min(base + 64, candidates_.items.size());
            if (bits == ~uint64_t{0}) {
                for (size_t i = base; i < end; ++i) any |= candidates_.items[i].logit != kOff;
                continue;
            }
            for (size_t i = base; i < end; ++i) {
                if (((bits >> (i - base)) & 1) == 0)
                    candidates_.items[i].logit = kOff;
                else
                    any |= candidates_.items[i].logit != kOff;
            }
        }
        if (!any) throw SamplingError("sampling: logit_bias bans every token the grammar allows here");
    }
    for (SamplerStep step : params_.chain) {
        switch (step) {
            case SamplerStep::penalties:
                apply_penalties(candidates_, window_distinct_, window_counts_, params_.repeat_penalty,
                                params_.frequency_penalty, params_.presence_penalty);
                break;
            case SamplerStep::top_k:
                apply_top_k(candidates_, params_.top_k);
                break;
            case SamplerStep::typical_p:
                apply_typical(candidates_, params_.typical_p);
                break;
            case SamplerStep::top_p:
                apply_top_p(candidates_, params_.top_p);
                break;
            case SamplerStep::min_p:
                apply_min_p(candidates_, params_.min_p);
                break;
            case SamplerStep::temperature:
                apply_temperature(candidates_, params_.temperature);
                break;
        }
    }
}

TokenId Sampler::sample(std::span<const float> logits) {
    narrow(logits);
    TokenId token = draw_from(candidates_, next_uniform());
    if (!grammar_) return token;
    bool allowed;
    try {
        allowed = grammar_->allows_token(token);
    } catch (const GrammarError& e) {
        throw SamplingError(std::string("sampling: ") + e.what());
    }
    if (!allowed) {
        narrow(logits, /*masked=*/true);
        token = draw_from(candidates_, next_uniform());
    }
    return commit(token);
}

TokenId Sampler::commit(TokenId token) {
    if (!grammar_) return token;
    try {
        grammar_->accept_token(token);
    } catch (const GrammarError& e) {
        throw SamplingError(std::string("sampling: ") + e.what());
    }
    return token;
}

Sampler::DraftVerdict Sampler::sample_draft(std::span<const float> logits, TokenId draft) {
    if (draft < 0 || draft >= vocab_size_)
        throw SamplingError("sampling: draft token " + std::to_string(draft) + " is outside the vocabulary [0, " +
                            std::to_string(vocab_size_) + ")");
    narrow(logits, /*masked=*/grammar_ != nullptr);
    const double p = draft_probability(candidates_, draft);
    if (next_uniform() < p) return {commit(draft), true};
    const TokenId token = draw_without(candidates_, draft, next_uniform());
    return {commit(token), token == draft};
}

void Sampler::accept(TokenId token) {
    if (token < 0 || token >= vocab_size_)
        throw SamplingError("sampling: accepted token " + std::to_string(token) + " is outside the vocabulary [0, " +
                            std::to_string(vocab_size_) + ")");
    if (window_.empty()) return;
    // At most penalty_last_n distinct tokens: a linear search is cheaper than any index.
    const auto slot = [this](TokenId id) {
        return static_cast<size_t>(std::find(window_distinct_.begin(), window_distinct_.end(), id) -
                                   window_distinct_.begin());
    };
    if (window_filled_ == window_.size()) {
        const size_t i = slot(window_[window_next_]);
        if (--window_counts_[i] == 0) {
            window_distinct_[i] = window_distinct_.back();
            window_counts_[i] = window_counts_.back();
            window_distinct_.pop_back();
            window_counts_.pop_back();
        }
    } else {
        ++window_filled_;
    }
    window_[window_next_] = token;
    if (const size_t i = slot(token); i < window_distinct_.size()) {
        ++window_counts_[i];
    } else {
        window_distinct_.push_back(token);
        window_counts_.push_back(1);
    }
    window_next_ = (window_next_ + 1) % window_.size();
}

void Sampler::reset() {
    window_distinct_.clear();
    window_counts_.clear();
    window_next_ = 0;
    window_filled_ = 0;
    seed_generator(rng_, seed_);
    if (grammar_) grammar_->reset();
}

void Sampler::restart_grammar() {
    if (grammar_) grammar_->reset();
}

void Sampler::release_workspace() {
    candidates_.items.clear();
    candidates_.items.shrink_to_fit();
    candidates_.sorted_prefix = 0;
    candidates_.in_id_order = false;
}

double Sampler::next_uniform() {
    // 53 random bits from two 32-bit draws; mt19937's output is fixed by the standard, so the
    // same seed gives the same tokens with any standard library (uniform_real_distribution's
    // algorithm is not specified).
    const uint64_t high = rng_() >> 5;  // 27 bits
    const uint64_t low = rng_() >> 6;   // 26 bits
    return static_cast<double>((high << 26) | low) * 0x1.0p-53;
}

}  // namespace fitllm::sampling
