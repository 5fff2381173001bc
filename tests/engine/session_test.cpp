// Sessions: prompt batches, the decode loop, stopping, context limits.
#include "engine/session.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf_reader.h"
#include "model/model.h"
#include "model/tiny_gemma3.h"
#include "model/tiny_llama.h"
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
    engine::Session one(*t.model, {.n_ctx = 32, .n_batch = 64}, t.pool);
    engine::Session small(*t.model, {.n_ctx = 32, .n_batch = 3}, t.pool);
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
        engine::Session s(*t.model, {.n_ctx = 32, .n_batch = 4}, t.pool);
        sampling::Sampler sampler = greedy_sampler(t.model->n_vocab());
        const engine::GenerationStats stats = s.generate(
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
    engine::Session s(*t.model, {.n_ctx = 32, .n_batch = 4}, t.pool);
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
    engine::Session s(*t.model, {.n_ctx = 9, .n_batch = 4}, t.pool);
    sampling::Sampler sampler = greedy_sampler(t.model->n_vocab());
    const auto stats = s.generate(
        kPrompt, 10, sampler, [](int32_t) { return false; }, [](int32_t) { return true; });
    EXPECT_EQ(stats.n_generated, 3);  // 7 prompt + 2 fed fill the 9 cells; the third is sampled last
    EXPECT_TRUE(stats.context_full);
    EXPECT_EQ(s.n_past(), 9);

    engine::Session tiny(*t.model, {.n_ctx = 4, .n_batch = 4}, t.pool);
    EXPECT_THROW(tiny.feed(kPrompt), kv::KvCacheError);
    EXPECT_EQ(tiny.n_past(), 0);
    EXPECT_THROW(engine::Session(*t.model, {.n_ctx = 0, .n_batch = 4}, t.pool), ConfigError);
    EXPECT_THROW(engine::Session(*t.model, {.n_ctx = 8, .n_batch = 0}, t.pool), ConfigError);
}

TEST(Session, ContextShiftDropsTheOldestTokensAfterKeepAndGoesOn) {
    // The tiny Llama: one full-attention pool, which keeps the first n_keep tokens (the tiny
    // Gemma's two layers both have a window of 4: its pool keeps only the window).
    const std::vector<std::byte> bytes = test::tiny_llama_bytes({});
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const auto model = model::Model::load(file);
    ops::ThreadPool pool(2);
    // Small contexts and contexts over several blocks of 16 cells, where a shift leaves holes in
    // the blocks at the edges of the dropped range.
    for (const auto& [n_ctx, n_keep] : {std::pair{12, 2}, std::pair{40, 3}, std::pair{70, 0}}) {
        SCOPED_TRACE(n_ctx);
        ContextConfig p{.n_ctx = n_ctx, .n_batch = 4};
        p.context_shift = true;
        p.n_keep = n_keep;
        engine::Session s(*model, p, pool);
        ASSERT_EQ(s.cache().n_pools(), 1);
        sampling::Sampler sampler = greedy_sampler(model->n_vocab());
        const auto stats = s.generate(
            kPrompt, 300, sampler, [](int32_t) { return false; }, [](int32_t) { return true; });
        EXPECT_EQ(stats.n_generated, 300);  // far past n_ctx
        EXPECT_FALSE(stats.context_full);
        EXPECT_GE(stats.n_shifts, 300 / n_ctx);
        EXPECT_LE(s.n_past(), n_ctx);
        EXPECT_EQ(s.cache().seq_pos_min(0), 0);
        EXPECT_EQ(s.cache().seq_pos_max(0), s.n_past() - 1);
    }
}

// After a shift the cache holds the kept tokens and the newest ones at consecutive positions, K
// re-rotated. Here the logits are those of a fresh session fed exactly those tokens (up to the f16
// rounding of K stored again after its rotation) only because both layers of this model see 4
// tokens back: no K/V row the next token reads was computed from a dropped token. With global
// attention they were, as in llama.cpp (tests/engine/context_shift_test.cpp checks those models).
TEST(Session, AfterAContextShiftTheLogitsAreThoseOfTheKeptTokens) {
    Tiny t;
    ContextConfig p{.n_ctx = 16, .n_batch = 16};
    p.context_shift = true;
    p.n_keep = 2;
    engine::Session shifted(*t.model, p, t.pool);
    std::vector<int32_t> tokens(17);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 11 + 3) % 40);
    shifted.feed(std::span<const int32_t>(tokens.data(), 16));  // full
    EXPECT_EQ(shifted.n_past(), 16);
    const std::span<const float> got = shifted.feed(std::span<const int32_t>(&tokens[16], 1));
    EXPECT_EQ(shifted.n_past(), 10);  // (16 - 2) / 2 = 7 dropped, then one more

    std::vector<int32_t> kept = {tokens[0], tokens[1]};
    kept.insert(kept.end(), tokens.begin() + 9, tokens.end());  // 2 + 8 tokens
    engine::Session fresh(*t.model, {.n_ctx = 32, .n_batch = 16}, t.pool);
    const std::span<const float> want = fresh.feed(kept);
    ASSERT_EQ(got.size(), want.size());
    float max_logit = 0.0f, max_diff = 0.0f;
    for (size_t i = 0; i < want.size(); ++i) {
        max_logit = std::max(max_logit, std::fabs(want[i]));
        max_diff = std::max(max_diff, std::fabs(got[i] - want[i]));
    }
    EXPECT_LT(max_diff, 1e-2f * max_logit);

    // Without the shift, the same feed is refused with a clear message.
    engine::Session stopping(*t.model, {.n_ctx = 16, .n_batch = 16}, t.pool);
    stopping.feed(std::span<const int32_t>(tokens.data(), 16));
    try {
        stopping.feed(std::span<const int32_t>(&tokens[16], 1));
        FAIL() << "expected KvCacheError";
    } catch (const kv::KvCacheError& e) {
        EXPECT_NE(std::string(e.what()).find("context full"), std::string::npos) << e.what();
    }
    EXPECT_THROW(engine::Session(*t.model, {.n_ctx = 16, .n_batch = 4, .context_shift = true, .n_keep = 15}, t.pool),
                 ConfigError);
}

}  // namespace
}  // namespace fitllm
