#include "runtime/session.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <stdexcept>
#include <string>

namespace fitllm::runtime {
namespace {

SessionParams checked(SessionParams p) {
    if (p.n_ctx <= 0 || p.n_batch <= 0) {
        throw std::invalid_argument("session: n_ctx = " + std::to_string(p.n_ctx) +
                                    " and n_batch = " + std::to_string(p.n_batch) + " must both be positive");
    }
    if (p.n_keep < 0 || (p.context_shift && p.n_keep >= p.n_ctx - 1)) {
        throw std::invalid_argument(
            "session: n_keep = " + std::to_string(p.n_keep) +
            " must be at least 0 and, with a context shift, below n_ctx - 1 = " + std::to_string(p.n_ctx - 1));
    }
    return p;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

namespace {

// With a context shift, the blocks at the two edges of the dropped range keep holes (cells are
// only filled at the end of a sequence's last block): two blocks more keep n_ctx tokens in.
kv::CacheParams session_cache_params(const SessionParams& params) {
    kv::CacheParams cp = cache_params(params);
    if (params.context_shift) cp.n_cells += 2 * cp.block_size;
    return cp;
}

}  // namespace

kv::CacheParams cache_params(const SessionParams& params, int n_seq) {
    kv::CacheParams cp;
    cp.n_cells = params.n_ctx;
    cp.n_seq_max = n_seq;
    cp.type_k = params.type_k;
    cp.type_v = params.type_v;
    cp.rotate = params.kv_rotation;
    cp.spill_dir = params.kv_spill_dir;
    cp.resident_limit = params.kv_resident_limit;
    return cp;
}

memory::Pool& pool_of(memory::Device* device, const char* name) {
    static memory::Device unlimited("unlimited", std::numeric_limits<uint64_t>::max());
    return (device ? *device : unlimited).pool(name);
}

kv::ModelCache make_charged_cache(const model::Model& model, kv::CacheParams params, int n_batch,
                                  memory::Device* device) {
    if (device) params.pool = &device->pool(memory::pool_names::kKv);
    return model.make_cache(params, n_batch);
}

Session::Session(model::Model& model, SessionParams params, ops::ThreadPool& pool)
    : model_(model),
      params_(checked(params)),
      pool_(pool),
      cache_(make_charged_cache(model, session_cache_params(params_), params_.n_batch, params_.device)),
      logits_(pool_of(params_.device, memory::pool_names::kLogits), static_cast<size_t>(model.n_vocab()), "logits"),
      positions_(static_cast<size_t>(params_.n_batch)) {}

int Session::shift_context() {
    const int n_discard = (n_past_ - params_.n_keep) / 2;
    if (n_discard <= 0) return 0;
    cache_.seq_rm(0, params_.n_keep, params_.n_keep + n_discard);
    cache_.seq_add(0, params_.n_keep + n_discard, n_past_, -n_discard);
    n_past_ -= n_discard;
    ++n_shifts_;
    return n_discard;
}

std::span<const float> Session::feed(std::span<const int32_t> tokens) {
    if (tokens.empty()) throw std::invalid_argument("session: feed() needs at least one token");
    const auto full = [&](size_t n) {
        return kv::KvCacheError("context full: " + std::to_string(n) + " tokens after " + std::to_string(n_past_) +
                                " do not fit in n_ctx = " + std::to_string(params_.n_ctx) +
                                " (raise -c, or --context-shift to drop old tokens)");
    };
    if (!params_.context_shift && tokens.size() > static_cast<size_t>(params_.n_ctx - n_past_)) {
        throw full(tokens.size());
    }
    for (size_t begin = 0; begin < tokens.size(); begin += static_cast<size_t>(params_.n_batch)) {
        const size_t n = std::min(tokens.size() - begin, static_cast<size_t>(params_.n_batch));
        while (n > static_cast<size_t>(params_.n_ctx - n_past_)) {
            if (shift_context() == 0) throw full(n);
        }
        while (true) {
            for (size_t t = 0; t < n; ++t) positions_[t] = n_past_ + static_cast<int32_t>(t);
            try {
                model_.forward(tokens.subspan(begin, n), std::span<const int32_t>(positions_.data(), n), cache_,
                               logits_.data(), /*all_logits=*/false, pool_);
                break;
            } catch (const kv::KvCacheError&) {
                // The cells are there but not in whole blocks (holes a shift left): shift again.
                if (!params_.context_shift || shift_context() == 0) throw;
            }
        }
        n_past_ += static_cast<int>(n);
    }
    return logits_.span();
}

void Session::reset() {
    cache_.clear();
    n_past_ = 0;
}

GenerationStats Session::generate(std::span<const int32_t> prompt, int n_predict, sampling::Sampler& sampler,
                                  const std::function<bool(int32_t)>& is_eog,
                                  const std::function<bool(int32_t)>& on_token) {
    GenerationStats stats;
    const int shifts_before = n_shifts_;
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
        if (!go_on || is_eog(next) || i + 1 == n_predict) break;
        if (!params_.context_shift && n_past_ >= params_.n_ctx) {
            stats.context_full = true;
            break;
        }
        logits = feed(std::span<const int32_t>(&next, 1));
    }
    stats.generate_seconds = seconds_since(start);
    stats.n_shifts = n_shifts_ - shifts_before;
    return stats;
}

}  // namespace fitllm::runtime
