#include "engine/parallel.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "engine/context.h"
#include "kv/cache.h"

namespace fitllm::engine {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

ParallelResult generate_parallel(model::Model& model, const ContextConfig& context, std::span<const int32_t> prompt,
                                 int n_predict, std::span<sampling::Sampler> samplers,
                                 const std::function<bool(int32_t)>& is_eog, ops::ThreadPool& pool,
                                 memory::Device* device) {
    const int n_seq = static_cast<int>(samplers.size());
    if (n_seq < 1 || n_seq > kv::kMaxSequences || prompt.empty()) {
        throw std::invalid_argument("generate_parallel: " + std::to_string(n_seq) + " sequences (1.." +
                                    std::to_string(kv::kMaxSequences) + ") and " + std::to_string(prompt.size()) +
                                    " prompt tokens (at least 1)");
    }
    ContextConfig params = context;
    params.n_seq = n_seq;
    check(params);
    // n_ctx tokens in all; the cache has room for each sequence's partly used last block too
    // (kv_cells: once they diverge, each writes into a block of its own).
    kv::ModelCache cache = make_cache(model, params, device);
    const size_t n_vocab = static_cast<size_t>(model.n_vocab());
    memory::PoolBuffer<float> logits = make_logits(model, n_seq, device);
    ParallelResult r;
    r.tokens.resize(static_cast<size_t>(n_seq));

    // The prompt, once, in sequence 0, n_batch tokens at a time.
    auto start = std::chrono::steady_clock::now();
    if (static_cast<int>(prompt.size()) > params.n_ctx) {
        throw kv::KvCacheError("context full: the prompt has " + std::to_string(prompt.size()) +
                               " tokens, n_ctx = " + std::to_string(params.n_ctx) + " (raise -c)");
    }
    std::vector<int32_t> pos(std::max(prompt.size(), static_cast<size_t>(n_seq)));
    for (size_t i = 0; i < prompt.size(); ++i) pos[i] = static_cast<int32_t>(i);
    for (size_t b = 0; b < prompt.size(); b += static_cast<size_t>(params.n_batch)) {
        const size_t n = std::min(prompt.size() - b, static_cast<size_t>(params.n_batch));
        model.forward(prompt.subspan(b, n), std::span<const int32_t>(pos.data() + b, n), cache, logits.data(), false,
                      pool);
    }
    for (int s = 1; s < n_seq; ++s) cache.seq_cp(0, s, -1, -1);
    r.stats.n_prompt = static_cast<int>(prompt.size());
    r.stats.prompt_seconds = seconds_since(start);
    for (sampling::Sampler& sampler : samplers) {
        for (const int32_t id : prompt) sampler.accept(id);
    }

    // Every sequence samples from the prompt's logits, then one token per live sequence per pass.
    start = std::chrono::steady_clock::now();
    std::vector<int32_t> tokens, step_pos;
    std::vector<kv::SeqId> seq;
    std::vector<size_t> row(static_cast<size_t>(n_seq), 0);  // each sequence's logits row
    std::vector<bool> live(static_cast<size_t>(n_seq), n_predict > 0);
    int32_t next_pos = static_cast<int32_t>(prompt.size());
    int n_tokens = static_cast<int>(prompt.size());  // in the context: the shared prompt once, then each fed token
    while (true) {
        tokens.clear();
        step_pos.clear();
        seq.clear();
        for (int s = 0; s < n_seq; ++s) {
            const auto i = static_cast<size_t>(s);
            if (!live[i]) continue;
            const int32_t id = samplers[i].sample(std::span<const float>(logits.data() + row[i] * n_vocab, n_vocab));
            samplers[i].accept(id);
            r.tokens[i].push_back(id);
            ++r.stats.n_generated;
            if (is_eog(id) || static_cast<int>(r.tokens[i].size()) >= n_predict) {
                live[i] = false;
                continue;
            }
            row[i] = tokens.size();
            tokens.push_back(id);
            step_pos.push_back(next_pos);
            seq.push_back(s);
        }
        if (tokens.empty()) break;
        if (n_tokens + static_cast<int>(tokens.size()) > params.n_ctx || !cache.has_room(seq)) {
            r.stats.context_full = true;
            break;
        }
        model.forward({.tokens = tokens, .positions = step_pos, .seq_ids = seq, .all_logits = true}, cache,
                      logits.data(), pool);
        ++next_pos;
        n_tokens += static_cast<int>(tokens.size());
    }
    r.stats.generate_seconds = seconds_since(start);
    return r;
}

}  // namespace fitllm::engine
