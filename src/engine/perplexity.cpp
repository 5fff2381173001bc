#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/context.h"
#include "engine/session.h"
#include "kv/cache.h"

namespace fitllm::engine {

double log_prob(std::span<const float> logits, int32_t target) {
    float max = logits[0];
    for (const float v : logits) max = std::max(max, v);
    double sum = 0.0;
    for (const float v : logits) sum += static_cast<double>(std::exp(v - max));  // float exp, double sum
    return static_cast<double>(logits[static_cast<size_t>(target)] - max) - std::log(sum);
}

int perplexity_chunks(int64_t n_tokens, const PerplexityParams& p) {
    const int64_t n_whole = p.n_ctx > 0 ? n_tokens / p.n_ctx : 0;
    return static_cast<int>(p.n_chunks < 0 ? n_whole : std::min<int64_t>(p.n_chunks, n_whole));
}

namespace {

// Tokens per sequence per forward pass: n_batch / score_batch rows in all, shared by the sequences.
struct Batches {
    int ctx;    // in the unscored first half of a chunk
    int score;  // in the scored half
};

Batches batches(const PerplexityParams& p, int n_seq) {
    return {std::max(1, p.n_batch / n_seq), std::max(1, std::min(p.score_batch / n_seq, p.n_ctx - p.n_ctx / 2))};
}

}  // namespace

ContextConfig perplexity_context(const PerplexityParams& p, ContextConfig kv) {
    const Batches b = batches(p, p.n_seq);
    kv.n_ctx = p.n_ctx * p.n_seq;
    kv.n_seq = p.n_seq;
    kv.n_batch = p.n_seq * std::max(b.ctx, b.score);
    kv.n_outputs = p.n_seq * b.score;
    kv.context_shift = false;
    return kv;
}

PerplexityResult perplexity(model::Model& model, std::span<const int32_t> tokens, const PerplexityParams& p,
                            const ContextConfig& kv, ops::ThreadPool& pool, memory::Device* device,
                            const ChunkFn& on_chunk, const ScoredTokenFn& on_token) {
    if (p.n_ctx < 4 || p.n_batch < 1 || p.score_batch < 1 || p.n_seq < 1 || p.n_seq > kv::kMaxSequences) {
        throw std::invalid_argument("perplexity: n_ctx = " + std::to_string(p.n_ctx) +
                                    " must be at least 4, the batch sizes positive and n_seq = " +
                                    std::to_string(p.n_seq) + " in 1.." + std::to_string(kv::kMaxSequences));
    }
    const int64_t n_tokens = static_cast<int64_t>(tokens.size());
    if (n_tokens < 2 * int64_t{p.n_ctx}) {
        throw std::invalid_argument("perplexity: the text has " + std::to_string(n_tokens) +
                                    " tokens; n_ctx = " + std::to_string(p.n_ctx) + " needs at least " +
                                    std::to_string(2 * p.n_ctx) + " (use a longer text or a smaller -c)");
    }
    const int n_chunks = perplexity_chunks(n_tokens, p);
    const int n_vocab = model.n_vocab();
    const int first = p.n_ctx / 2;
    const int scored_per_chunk = perplexity_scored_per_chunk(p.n_ctx);
    PerplexityParams at_once = p;  // at most one sequence per chunk
    at_once.n_seq = std::min(p.n_seq, std::max(n_chunks, 1));
    const int n_seq = at_once.n_seq;
    const auto [ctx_batch, score_batch] = batches(at_once, n_seq);
    const ContextConfig context = perplexity_context(at_once, kv);
    kv::ModelCache cache = make_cache(model, context, device, /*max_position=*/p.n_ctx);
    std::vector<int32_t> chunks(static_cast<size_t>(n_seq) * static_cast<size_t>(p.n_ctx));
    const size_t max_rows = static_cast<size_t>(n_seq) * static_cast<size_t>(std::max(ctx_batch, score_batch));
    std::vector<int32_t> batch_tokens(max_rows), batch_pos(max_rows);
    std::vector<kv::SeqId> batch_seq(max_rows);
    memory::PoolBuffer<float> logits = make_logits(model, context.n_outputs, device);
    std::vector<double> seq_nll(static_cast<size_t>(n_seq)), seq_nll2(static_cast<size_t>(n_seq));

    // One forward pass over tokens [b, b + n) of every sequence's chunk.
    const auto run = [&](int n_group, int b, int n, bool all_logits) {
        size_t r = 0;
        for (int s = 0; s < n_group; ++s) {
            for (int t = 0; t < n; ++t, ++r) {
                batch_tokens[r] =
                    chunks[static_cast<size_t>(s) * static_cast<size_t>(p.n_ctx) + static_cast<size_t>(b + t)];
                batch_pos[r] = b + t;
                batch_seq[r] = s;
            }
        }
        model::Batch batch;
        batch.tokens = std::span<const int32_t>(batch_tokens.data(), r);
        batch.positions = std::span<const int32_t>(batch_pos.data(), r);
        batch.seq_ids = std::span<const kv::SeqId>(batch_seq.data(), r);
        batch.all_logits = all_logits;
        model.forward(batch, cache, logits.data(), pool);
    };

    PerplexityResult r;
    double nll = 0.0;
    double nll2 = 0.0;
    for (int c0 = 0; c0 < n_chunks; c0 += n_seq) {
        const int n_group = std::min(n_seq, n_chunks - c0);
        for (int s = 0; s < n_group; ++s) {
            const auto start = static_cast<size_t>(c0 + s) * static_cast<size_t>(p.n_ctx);
            int32_t* chunk = chunks.data() + static_cast<size_t>(s) * static_cast<size_t>(p.n_ctx);
            std::copy_n(tokens.begin() + static_cast<std::ptrdiff_t>(start), p.n_ctx, chunk);
            if (p.bos >= 0) chunk[0] = p.bos;
            seq_nll[static_cast<size_t>(s)] = 0.0;
            seq_nll2[static_cast<size_t>(s)] = 0.0;
        }
        cache.clear();
        // Context half: no logits needed.
        for (int b = 0; b < first; b += ctx_batch) run(n_group, b, std::min(ctx_batch, first - b), false);
        // Scored half: every position but the last predicts the token after it.
        for (int b = first; b < p.n_ctx; b += score_batch) {
            const int n = std::min(score_batch, p.n_ctx - b);
            run(n_group, b, n, true);
            for (int s = 0; s < n_group; ++s) {
                const auto start = static_cast<size_t>(c0 + s) * static_cast<size_t>(p.n_ctx);
                for (int t = 0; t < n && b + t + 1 < p.n_ctx; ++t) {
                    // Scored against the file's token, not the BOS substitute (only chunk[0] differs).
                    const int32_t target = tokens[start + static_cast<size_t>(b + t + 1)];
                    const size_t row = static_cast<size_t>(s) * static_cast<size_t>(n) + static_cast<size_t>(t);
                    const std::span<const float> row_logits(logits.data() + row * n_vocab,
                                                            static_cast<size_t>(n_vocab));
                    const double lp = log_prob(row_logits, target);
                    seq_nll[static_cast<size_t>(s)] -= lp;
                    seq_nll2[static_cast<size_t>(s)] += lp * lp;
                    if (on_token) on_token(int64_t{c0 + s} * scored_per_chunk + (b + t - first), row_logits, lp);
                }
            }
        }
        // Chunk by chunk, in order.
        for (int s = 0; s < n_group; ++s) {
            nll += seq_nll[static_cast<size_t>(s)];
            nll2 += seq_nll2[static_cast<size_t>(s)];
            r.n_scored += scored_per_chunk;
            ++r.n_chunks;
            if (on_chunk) on_chunk(c0 + s + 1, std::exp(nll / static_cast<double>(r.n_scored)));
        }
    }
    const double mean = nll / static_cast<double>(r.n_scored);
    r.mean_nll = mean;
    r.ppl = std::exp(mean);
    const double var = nll2 / static_cast<double>(r.n_scored) - mean * mean;
    r.ppl_error = var > 0.0 && r.n_scored > 1 ? std::sqrt(var / static_cast<double>(r.n_scored - 1)) * r.ppl : 0.0;
    return r;
}

}  // namespace fitllm::engine
