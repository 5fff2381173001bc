#include "runtime/perplexity.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv/kv_cache.h"

namespace fitllm::runtime {

double log_prob(std::span<const float> logits, int32_t target) {
    float max = logits[0];
    for (const float v : logits) max = std::max(max, v);
    double sum = 0.0;
    for (const float v : logits) sum += static_cast<double>(std::exp(v - max));  // float exp, double sum
    return static_cast<double>(logits[static_cast<size_t>(target)] - max) - std::log(sum);
}

PerplexityResult perplexity(model::Model& model, std::span<const int32_t> tokens, const PerplexityParams& p,
                            ops::ThreadPool& pool, const ChunkFn& on_chunk) {
    if (p.n_ctx < 4 || p.n_batch < 1 || p.score_batch < 1) {
        throw std::invalid_argument("perplexity: n_ctx = " + std::to_string(p.n_ctx) +
                                    " must be at least 4 and the batch sizes positive");
    }
    const int64_t n_tokens = static_cast<int64_t>(tokens.size());
    if (n_tokens < 2 * int64_t{p.n_ctx}) {
        throw std::invalid_argument("perplexity: the text has " + std::to_string(n_tokens) +
                                    " tokens; n_ctx = " + std::to_string(p.n_ctx) + " needs at least " +
                                    std::to_string(2 * p.n_ctx) + " (use a longer text or a smaller -c)");
    }
    const int64_t n_whole = n_tokens / p.n_ctx;
    const int n_chunks = static_cast<int>(p.n_chunks < 0 ? n_whole : std::min<int64_t>(p.n_chunks, n_whole));
    const int n_vocab = model.n_vocab();
    const int first = p.n_ctx / 2;

    kv::KvCache cache = model.make_cache(p.n_ctx);
    std::vector<int32_t> chunk(static_cast<size_t>(p.n_ctx));
    std::vector<int32_t> positions(static_cast<size_t>(p.n_ctx));
    for (int i = 0; i < p.n_ctx; ++i) positions[static_cast<size_t>(i)] = i;
    const int score_batch = std::min(p.score_batch, p.n_ctx - first);
    std::vector<float> logits(static_cast<size_t>(score_batch) * static_cast<size_t>(n_vocab));

    PerplexityResult r;
    double nll = 0.0;
    double nll2 = 0.0;
    for (int c = 0; c < n_chunks; ++c) {
        const auto start = static_cast<size_t>(c) * static_cast<size_t>(p.n_ctx);
        std::copy_n(tokens.begin() + static_cast<std::ptrdiff_t>(start), p.n_ctx, chunk.begin());
        if (p.bos >= 0) chunk[0] = p.bos;
        cache.clear();
        // Context half: no logits needed.
        for (int b = 0; b < first; b += p.n_batch) {
            const int n = std::min(p.n_batch, first - b);
            model.forward(std::span<const int32_t>(chunk.data() + b, static_cast<size_t>(n)),
                          std::span<const int32_t>(positions.data() + b, static_cast<size_t>(n)), cache, logits.data(),
                          /*all_logits=*/false, pool);
        }
        // Scored half: every position but the last predicts the token after it.
        for (int b = first; b < p.n_ctx; b += score_batch) {
            const int n = std::min(score_batch, p.n_ctx - b);
            model.forward(std::span<const int32_t>(chunk.data() + b, static_cast<size_t>(n)),
                          std::span<const int32_t>(positions.data() + b, static_cast<size_t>(n)), cache, logits.data(),
                          /*all_logits=*/true, pool);
            for (int t = 0; t < n && b + t + 1 < p.n_ctx; ++t) {
                // Scored against the file's token, not the BOS substitute (only chunk[0] differs).
                const int32_t target = tokens[start + static_cast<size_t>(b + t + 1)];
                const double lp = log_prob(std::span<const float>(logits.data() + static_cast<size_t>(t) * n_vocab,
                                                                  static_cast<size_t>(n_vocab)),
                                           target);
                nll -= lp;
                nll2 += lp * lp;
                ++r.n_scored;
            }
        }
        ++r.n_chunks;
        if (on_chunk) on_chunk(c + 1, std::exp(nll / static_cast<double>(r.n_scored)));
    }
    const double mean = nll / static_cast<double>(r.n_scored);
    r.ppl = std::exp(mean);
    const double var = nll2 / static_cast<double>(r.n_scored) - mean * mean;
    r.ppl_error = var > 0.0 && r.n_scored > 1 ? std::sqrt(var / static_cast<double>(r.n_scored - 1)) * r.ppl : 0.0;
    return r;
}

}  // namespace fitllm::runtime
