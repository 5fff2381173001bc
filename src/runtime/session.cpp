#include "runtime/session.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

namespace fitllm::runtime {
namespace {

SessionParams checked(SessionParams p) {
    if (p.n_ctx <= 0 || p.n_batch <= 0) {
        throw std::invalid_argument("session: n_ctx = " + std::to_string(p.n_ctx) +
                                    " and n_batch = " + std::to_string(p.n_batch) + " must both be positive");
    }
    return p;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

Session::Session(model::Model& model, SessionParams params, ops::ThreadPool& pool)
    : model_(model),
      params_(checked(params)),
      pool_(pool),
      cache_(model.make_cache(params_.n_ctx)),
      logits_(static_cast<size_t>(model.n_vocab())),
      positions_(static_cast<size_t>(params_.n_batch)) {}

std::span<const float> Session::feed(std::span<const int32_t> tokens) {
    if (tokens.empty()) throw std::invalid_argument("session: feed() needs at least one token");
    if (tokens.size() > static_cast<size_t>(cache_.capacity() - cache_.size())) {
        throw kv::KvCacheError("context full: " + std::to_string(tokens.size()) + " tokens after " +
                               std::to_string(cache_.size()) +
                               " do not fit in n_ctx = " + std::to_string(cache_.capacity()) + " (raise -c)");
    }
    for (size_t begin = 0; begin < tokens.size(); begin += static_cast<size_t>(params_.n_batch)) {
        const size_t n = std::min(tokens.size() - begin, static_cast<size_t>(params_.n_batch));
        for (size_t t = 0; t < n; ++t) positions_[t] = cache_.size() + static_cast<int32_t>(t);
        model_.forward(tokens.subspan(begin, n), std::span<const int32_t>(positions_.data(), n), cache_, logits_.data(),
                       /*all_logits=*/false, pool_);
    }
    return logits_;
}

void Session::reset() {
    cache_.clear();
}

GenerationStats Session::generate(std::span<const int32_t> prompt, int n_predict, sampling::Sampler& sampler,
                                  const std::function<bool(int32_t)>& is_eog,
                                  const std::function<bool(int32_t)>& on_token) {
    GenerationStats stats;
    auto start = std::chrono::steady_clock::now();
    std::span<const float> logits = feed(prompt);
    stats.n_prompt = static_cast<int>(prompt.size());
    stats.prompt_seconds = seconds_since(start);
    for (const int32_t id : prompt) sampler.accept(id);

    start = std::chrono::steady_clock::now();
    for (int i = 0; i < n_predict; ++i) {
        const int32_t next = sampler.sample(logits);
        sampler.accept(next);
        ++stats.n_generated;
        const bool go_on = on_token(next);
        if (!go_on || is_eog(next) || i + 1 == n_predict || cache_.size() >= cache_.capacity()) break;
        logits = feed(std::span<const int32_t>(&next, 1));
    }
    stats.generate_seconds = seconds_since(start);
    return stats;
}

}  // namespace fitllm::runtime
