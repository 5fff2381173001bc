// Continuations decoded together (-np): each sequence, sharing the prompt's cells, generates what
// a session alone generates with the same sampler seed.
#include "engine/parallel.h"

#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <vector>

#include "engine/session.h"
#include "gguf/gguf_reader.h"
#include "model/model.h"
#include "model/tiny_gemma3.h"
#include "sampling/sampler.h"

namespace fitllm {
namespace {

const std::vector<int32_t> kPrompt = {2, 9, 4, 33, 17, 8, 1};

sampling::Sampler seeded(uint64_t seed, int32_t n_vocab) {
    sampling::SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = seed;
    return sampling::Sampler(p, n_vocab);
}

TEST(GenerateParallel, EachSequenceGeneratesWhatItWouldAlone) {
    const std::vector<std::byte> bytes = test::tiny_gemma3_bytes();
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const auto model = model::Model::load(file);
    ops::ThreadPool pool(2);
    const int n_seq = 3, n_predict = 12;
    std::vector<sampling::Sampler> samplers;
    for (int s = 0; s < n_seq; ++s) samplers.push_back(seeded(100 + s, model->n_vocab()));
    const engine::ParallelResult r = engine::generate_parallel(
        *model, {.n_ctx = 64, .n_batch = 4}, kPrompt, n_predict, samplers, [](int32_t) { return false; }, pool);
    ASSERT_EQ(r.tokens.size(), 3u);
    EXPECT_EQ(r.stats.n_generated, n_seq * n_predict);
    EXPECT_FALSE(r.stats.context_full);

    for (int s = 0; s < n_seq; ++s) {
        engine::Session alone(*model, {.n_ctx = 64, .n_batch = 4}, pool);
        sampling::Sampler sampler = seeded(100 + s, model->n_vocab());
        std::vector<int32_t> want;
        alone.generate(
            kPrompt, n_predict, sampler, [](int32_t) { return false; },
            [&](int32_t id) {
                want.push_back(id);
                return true;
            });
        EXPECT_EQ(r.tokens[static_cast<size_t>(s)], want) << "sequence " << s;
    }
    EXPECT_NE(r.tokens[0], r.tokens[1]);  // different seeds, different continuations
}

TEST(GenerateParallel, StopsWhenTheSharedContextIsFull) {
    const std::vector<std::byte> bytes = test::tiny_gemma3_bytes();
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const auto model = model::Model::load(file);
    ops::ThreadPool pool(1);
    std::vector<sampling::Sampler> samplers;
    for (int s = 0; s < 2; ++s) samplers.push_back(seeded(7 + s, model->n_vocab()));
    // 7 prompt cells + 2 per step: 16 cells hold 4 steps.
    const engine::ParallelResult r = engine::generate_parallel(
        *model, {.n_ctx = 16, .n_batch = 8}, kPrompt, 50, samplers, [](int32_t) { return false; }, pool);
    EXPECT_TRUE(r.stats.context_full);
    EXPECT_EQ(r.tokens[0].size(), 5u);  // 4 fed + the one sampled last
    EXPECT_EQ(r.tokens[1].size(), 5u);
}

}  // namespace
}  // namespace fitllm
