// The draft model of speculative decoding (engine/drafter.h).
#include "engine/drafter.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "fitllm/error.h"
#include "kv/cache.h"

namespace fitllm::engine {

void check(const DraftParams& p) {
    const auto fail = [](const std::string& what) { throw ConfigError("draft model: " + what); };
    if (p.n_draft < 1) fail("--draft-max " + std::to_string(p.n_draft) + " must be at least 1");
    if (p.n_min < 0 || p.n_min > p.n_draft) {
        fail("--draft-min " + std::to_string(p.n_min) + " must be in 0..--draft-max (" + std::to_string(p.n_draft) +
             ")");
    }
    if (!(p.p_min >= 0.0f && p.p_min <= 1.0f)) fail("--draft-p-min " + std::to_string(p.p_min) + " must be in 0..1");
    if (p.n_vocab < 0) fail("--draft-vocab " + std::to_string(p.n_vocab) + " must not be negative");
}

ContextConfig draft_context(const ContextConfig& target) {
    ContextConfig c = target;
    c.n_seq = 1;
    c.n_outputs = 1;
    c.context_shift = false;
    c.n_keep = 0;
    c.kv_spill_dir.clear();
    c.kv_resident = 0;
    c.n_cached_prompts = 0;
    c.prompt_cache_ram = 0;
    return c;
}

void check_same_vocab(const tokenizer::Vocab& target, const std::string& target_path, const tokenizer::Vocab& draft,
                      const std::string& draft_path) {
    const std::string both = "the draft model " + draft_path + " and the model " + target_path;
    if (target.size() != draft.size()) {
        throw ConfigError(both + " have different vocabularies: " + std::to_string(draft.size()) + " tokens vs " +
                          std::to_string(target.size()) + "; a draft model must have the model's vocabulary");
    }
    for (size_t i = 0; i < target.size(); ++i) {
        const auto id = static_cast<tokenizer::TokenId>(i);
        if (target.text(id) != draft.text(id)) {
            throw ConfigError(both + " have different vocabularies: token " + std::to_string(i) + " is '" +
                              draft.text(id) + "' in the draft, '" + target.text(id) +
                              "' in the model; a draft model must have the model's vocabulary");
        }
    }
}

namespace {

// The most likely token of logits and its probability (softmax without temperature).
std::pair<int32_t, float> top_token(std::span<const float> logits) {
    const auto best = std::max_element(logits.begin(), logits.end());
    const float top = *best;
    double sum = 0.0;
    for (const float l : logits) sum += std::exp(static_cast<double>(l - top));
    return {static_cast<int32_t>(best - logits.begin()), static_cast<float>(1.0 / sum)};
}

}  // namespace

ModelDrafter::ModelDrafter(model::Model& model, const ContextConfig& context, ops::ThreadPool& pool,
                           const DraftParams& params, memory::Device* device)
    : params_(params),
      session_(model, draft_context(context), pool, device),
      slack_(std::max(0, std::min(params.n_draft, (context.n_batch - 1) / 2))) {
    check(params_);
    session_.cache().set_window_slack(slack_);
    session_.set_vocab_limit(params_.n_vocab);
}

int ModelDrafter::draft(std::span<const int32_t> history, int max_tokens, std::vector<int32_t>& out, float p_min) {
    if (p_min < 0.0f) p_min = params_.p_min;
    const auto start = std::chrono::steady_clock::now();
    const struct Timer {
        std::chrono::steady_clock::time_point start;
        double& total;
        ~Timer() { total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); }
    } timer{start, seconds_};
    out.clear();
    const auto n = static_cast<int>(history.size());
    // The history and the drafts but the last are fed: n + max_tokens - 1 positions.
    max_tokens = std::min({max_tokens, params_.n_draft, session_.n_ctx() - n + 1});
    if (n == 0 || max_tokens < 1 || max_tokens < params_.n_min) return 0;

    // What the session holds that the history (but its last token, fed below for its logits)
    // starts with. Taking back more than the drafts of a pass (a shifted or restarted context)
    // would need positions the window pools no longer hold: start over then.
    const std::span<const int32_t> held = session_.tokens();
    const auto limit = static_cast<size_t>(n - 1);
    size_t same = 0;
    while (same < held.size() && same < limit && held[same] == history[same]) ++same;
    if (held.size() - same > static_cast<size_t>(slack_)) same = 0;
    session_.truncate(static_cast<int>(same));

    kv::ModelCache& cache = session_.cache();
    const std::span<const int32_t> missing = history.subspan(same);
    std::span<const float> logits;
    try {
        if (missing.size() > static_cast<size_t>(slack_) + 1) {
            // Longer than a pass of drafts: the window pools need their room for n_batch tokens.
            cache.set_window_slack(0);
            cache.end_batch();
        }
        logits = session_.feed(missing);
        cache.set_window_slack(slack_);
        n_fed_ += static_cast<int64_t>(missing.size());
        // With --draft-vocab the logits past the first n_vocab are -infinity: they add nothing to
        // the softmax, and skipping them spares most of its exps.
        const auto scored = [&](std::span<const float> l) {
            return params_.n_vocab > 0 && static_cast<size_t>(params_.n_vocab) < l.size()
                       ? l.first(static_cast<size_t>(params_.n_vocab))
                       : l;
        };
        for (int i = 0; i < max_tokens; ++i) {
            const auto [token, p] = top_token(scored(logits));
            if (i > 0 && p < p_min) break;
            out.push_back(token);
            if (i + 1 < max_tokens) logits = session_.feed(std::span<const int32_t>(&token, 1));
        }
    } catch (const kv::KvCacheError&) {
        // No room (cells not in whole blocks): this pass gets no draft, the next starts over.
        cache.set_window_slack(slack_);
        session_.reset();
        out.clear();
        return 0;
    }
    if (static_cast<int>(out.size()) < params_.n_min) out.clear();
    n_proposed_ += static_cast<int64_t>(out.size());
    return static_cast<int>(out.size());
}

}  // namespace fitllm::engine
