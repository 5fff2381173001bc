// Sessions: prompt batches, the decode loop, stopping, context limits.
#include "runtime/session.h"

#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <vector>

#include "gguf/gguf_reader.h"
#include "model/model.h"
#include "model/tiny_gemma3.h"
#include "sampling/sampler.h"

namespace fitllm {
namespace {

struct Tiny {
    std::vector<std::byte> bytes = test::tiny_gemma3_bytes();
    gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    std::unique_ptr<model::Model> model = model::Model::load(file);
    ops::ThreadPool pool{2};
};

sampling::Sampler greedy_sampler(int32_t n_vocab) {
    sampling::SamplingParams p;
    p.temperature = 0.0f;
    return sampling::Sampler(p, n_vocab);
}

const std::vector<int32_t> kPrompt = {2, 9, 4, 33, 17, 8, 1};

TEST(Session, PromptInSmallBatchesGivesTheSameLogitsAsOneBatch) {
    Tiny t;
    runtime::Session one(*t.model, {.n_ctx = 32, .n_batch = 64}, t.pool);
    runtime::Session small(*t.model, {.n_ctx = 32, .n_batch = 3}, t.pool);
    const std::span<const float> a = one.feed(kPrompt);
    const std::span<const float> b = small.feed(kPrompt);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-3f) << i;
    EXPECT_EQ(one.n_past(), 7);
    EXPECT_EQ(small.n_past(), 7);
}

TEST(Session, GenerateIsDeterministicAndCountsTokens) {
    Tiny t;
    std::vector<int32_t> first, second;
    for (auto* out : {&first, &second}) {
        runtime::Session s(*t.model, {.n_ctx = 32, .n_batch = 4}, t.pool);
        sampling::Sampler sampler = greedy_sampler(t.model->n_vocab());
        const runtime::GenerationStats stats = s.generate(
            kPrompt, 10, sampler, [](int32_t) { return false; },
            [&](int32_t id) {
                out->push_back(id);
                return true;
            });
        EXPECT_EQ(stats.n_prompt, 7);
        EXPECT_EQ(stats.n_generated, 10);
        EXPECT_EQ(s.n_past(), 7 + 9);  // the last token is sampled, not fed
    }
    EXPECT_EQ(first, second);
}

TEST(Session, StopsAtEndOfGenerationAndWhenTheCallbackSaysSo) {
    Tiny t;
    runtime::Session s(*t.model, {.n_ctx = 32, .n_batch = 4}, t.pool);
    sampling::Sampler sampler = greedy_sampler(t.model->n_vocab());
    int calls = 0;
    auto stats = s.generate(
        kPrompt, 10, sampler, [](int32_t) { return true; },
        [&](int32_t) {
            ++calls;
            return true;
        });
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(stats.n_generated, 1);

    s.reset();
    EXPECT_EQ(s.n_past(), 0);
    calls = 0;
    stats = s.generate(
        kPrompt, 10, sampler, [](int32_t) { return false; }, [&](int32_t) { return ++calls < 3; });
    EXPECT_EQ(stats.n_generated, 3);
}

TEST(Session, StopsWhenTheContextIsFullAndRefusesAPromptThatDoesNotFit) {
    Tiny t;
    runtime::Session s(*t.model, {.n_ctx = 9, .n_batch = 4}, t.pool);
    sampling::Sampler sampler = greedy_sampler(t.model->n_vocab());
    const auto stats = s.generate(
        kPrompt, 10, sampler, [](int32_t) { return false; }, [](int32_t) { return true; });
    EXPECT_EQ(stats.n_generated, 3);  // 7 prompt + 2 fed fill the 9 cells; the third is sampled last
    EXPECT_EQ(s.n_past(), 9);

    runtime::Session tiny(*t.model, {.n_ctx = 4, .n_batch = 4}, t.pool);
    EXPECT_THROW(tiny.feed(kPrompt), kv::KvCacheError);
    EXPECT_EQ(tiny.n_past(), 0);
    EXPECT_THROW(runtime::Session(*t.model, {.n_ctx = 0, .n_batch = 4}, t.pool), std::invalid_argument);
}

}  // namespace
}  // namespace fitllm
