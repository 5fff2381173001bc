// Prompt lookup drafting (engine/lookup.h) and Session::generate_speculative (engine/session.h).
#include "engine/lookup.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "engine/drafter.h"
#include "engine/session.h"
#include "fitllm/error.h"

namespace fitllm::engine {

void check(const LookupParams& p) {
    const auto fail = [](const std::string& what) { throw ConfigError("prompt lookup: " + what); };
    if (p.n_draft < 1) fail("--draft-max " + std::to_string(p.n_draft) + " must be at least 1");
    if (p.ngram_min < 1 || p.ngram_min > kMaxLookupNgram) {
        fail("--lookup-ngram-min " + std::to_string(p.ngram_min) + " must be in 1.." + std::to_string(kMaxLookupNgram));
    }
    if (p.ngram_max < p.ngram_min || p.ngram_max > kMaxLookupNgram) {
        fail("--lookup-ngram-max " + std::to_string(p.ngram_max) + " must be in --lookup-ngram-min (" +
             std::to_string(p.ngram_min) + ").." + std::to_string(kMaxLookupNgram));
    }
}

int lookup_draft(std::span<const int32_t> history, const LookupParams& params, int max_tokens,
                 std::vector<int32_t>& out) {
    out.clear();
    const auto len = static_cast<int64_t>(history.size());
    if (max_tokens < 1) return 0;
    for (int n = std::min<int64_t>(params.ngram_max, len - 1); n >= params.ngram_min; --n) {
        const std::span<const int32_t> suffix = history.subspan(static_cast<size_t>(len - n));
        int64_t best = -1;  // where the best occurrence's continuation starts
        int64_t best_len = 0;
        // Latest first; an occurrence at i is followed by history[i + n, len).
        for (int64_t i = len - n - 1; i >= 0; --i) {
            if (!std::equal(suffix.begin(), suffix.end(), history.begin() + i)) continue;
            const int64_t follow = std::min<int64_t>(len - (i + n), max_tokens);
            if (follow > best_len) {
                best = i + n;
                best_len = follow;
                if (follow == max_tokens) break;
            }
        }
        if (best >= 0) {
            out.assign(history.begin() + best, history.begin() + best + best_len);
            return static_cast<int>(best_len);
        }
    }
    return 0;
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// While drafts are checked the window pools keep `slack` positions more than the window, so
// that taking back rejected drafts leaves what the next token sees; afterwards they are trimmed
// back to the window, so that batches of n_batch fit again.
class WindowSlack {
public:
    WindowSlack(kv::ModelCache& cache, int slack) : cache_(cache) { cache_.set_window_slack(slack); }
    ~WindowSlack() {
        cache_.set_window_slack(0);
        cache_.end_batch();
    }
    WindowSlack(const WindowSlack&) = delete;
    WindowSlack& operator=(const WindowSlack&) = delete;

private:
    kv::ModelCache& cache_;
};

}  // namespace

int Session::max_draft(int n_draft) const {
    return std::max(0, std::min({n_draft, n_logit_rows_ - 1, (context_.n_batch - 1) / 2}));
}

GenerationStats Session::generate_lookup(std::span<const int32_t> prompt, int n_predict, sampling::Sampler& sampler,
                                         const LookupParams& lookup, const std::function<bool(int32_t)>& is_eog,
                                         const std::function<bool(int32_t)>& on_token) {
    LookupDrafter drafter(lookup);
    return generate_speculative(prompt, n_predict, sampler, drafter, is_eog, on_token);
}

GenerationStats Session::generate_speculative(std::span<const int32_t> prompt, int n_predict,
                                              sampling::Sampler& sampler, Drafter& drafter,
                                              const std::function<bool(int32_t)>& is_eog,
                                              const std::function<bool(int32_t)>& on_token) {
    const int most = max_draft(drafter.n_draft());
    if (most == 0) return generate(prompt, n_predict, sampler, is_eog, on_token);

    GenerationStats stats;
    const int shifts_before = n_shifts_;
    std::span<const float> logits = feed_prompt(prompt, sampler, stats);

    const size_t n_vocab = static_cast<size_t>(model_.n_vocab());
    // What drafts follow: the context's tokens and the last emitted one (not fed yet).
    std::vector<int32_t> history(tokens_.begin(), tokens_.end());
    history.reserve(static_cast<size_t>(context_.n_ctx) + 1);
    int shifts_seen = n_shifts_;
    std::vector<int32_t> draft, batch;
    draft.reserve(static_cast<size_t>(most));
    batch.reserve(static_cast<size_t>(most) + 1);
    const WindowSlack slack(cache_, most);

    const auto start = std::chrono::steady_clock::now();
    bool done = n_predict <= 0;
    const auto emit = [&](int32_t id) {
        sampler.accept(id);
        history.push_back(id);
        ++stats.n_generated;
        const bool go_on = on_token(id);
        if (!go_on || is_eog(id) || stats.n_generated >= n_predict) done = true;
    };
    if (!done) emit(sampler.sample(logits));
    // Invariant at the top of the loop, as in generate(): every emitted token but the last is fed.
    while (!done) {
        if (!context_.context_shift && n_past_ >= context_.n_ctx) {
            stats.context_full = true;
            break;
        }
        const int32_t last = history.back();
        // Drafts that would not fit without a shift, or that n_predict would not emit, are not
        // worth a row: so shifts and a full context come at generate()'s tokens.
        const int room = std::min(context_.n_ctx - n_past_ - 1, n_predict - stats.n_generated - 1);
        if (drafter.draft(history, std::min(most, room), draft) > 0) {
            batch.assign(1, last);
            batch.insert(batch.end(), draft.begin(), draft.end());
            const int base = n_past_;
            std::span<const float> rows;
            try {
                rows = feed_all(batch);
            } catch (const kv::KvCacheError&) {
                // No room in whole blocks (after a shift left holes): one token at a time below.
                rows = {};
            }
            if (!rows.empty()) {
                ++stats.n_draft_passes;
                stats.n_drafted += static_cast<int>(draft.size());
                int emitted = 0;
                for (size_t i = 0; i <= draft.size() && !done; ++i) {
                    const std::span<const float> row = rows.subspan(i * n_vocab, n_vocab);
                    ++emitted;
                    if (i == draft.size()) {  // every draft accepted: the last row gives one more
                        emit(sampler.sample(row));
                        break;
                    }
                    const sampling::Sampler::DraftVerdict v = sampler.sample_draft(row, draft[i]);
                    emit(v.token);
                    if (!v.accepted) break;
                    ++stats.n_accepted;
                }
                // Keep what was fed up to the last emitted token (not that one, as generate()).
                truncate(base + emitted);
                continue;
            }
        }
        logits = feed(std::span<const int32_t>(&last, 1));
        if (n_shifts_ != shifts_seen) {  // the context dropped tokens: so does the history
            shifts_seen = n_shifts_;
            history.assign(tokens_.begin(), tokens_.end());
        }
        emit(sampler.sample(logits));
    }
    stats.generate_seconds = seconds_since(start);
    stats.n_shifts = n_shifts_ - shifts_before;
    return stats;
}

}  // namespace fitllm::engine
