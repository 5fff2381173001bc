// Sessions inside a memory budget: the KV cache and the logits are charged before they are
// allocated, a session that does not fit is refused with a BudgetError naming the pool, and the
// sessions already running go on as if nothing happened.
#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/parallel.h"
#include "engine/perplexity.h"
#include "engine/plan.h"
#include "engine/session.h"
#include "gguf/gguf_reader.h"
#include "memory/device.h"
#include "memory/pool.h"
#include "model/model.h"
#include "model/tiny_gemma3.h"
#include "model/tiny_llama.h"
#include "sampling/sampler.h"
#include "test_support.h"

namespace fitllm {
namespace {

struct Tiny {
    explicit Tiny(std::vector<std::byte> b) : bytes(std::move(b)) {}
    std::vector<std::byte> bytes;
    gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    std::unique_ptr<model::Model> model = model::Model::load(file);
    ops::ThreadPool pool{2};
};

const std::vector<int32_t> kPrompt = {2, 9, 4, 33, 17, 8, 1};

// Greedy tokens after kPrompt.
std::vector<int32_t> greedy(engine::Session& s, int n) {
    std::vector<int32_t> out;
    std::span<const float> logits = s.feed(kPrompt);
    for (int i = 0; i < n; ++i) {
        int32_t best = 0;
        for (size_t v = 1; v < logits.size(); ++v) {
            if (logits[v] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(v);
        }
        out.push_back(best);
        logits = s.feed(std::span<const int32_t>(&best, 1));
    }
    return out;
}

// The session charges exactly the bytes its cache holds (the plan's KV formula, checked against
// the cache itself) and its logits, and gives them back when it goes.
TEST(SessionBudget, ChargesTheCacheAndTheLogitsAndGivesThemBack) {
    for (auto bytes : {test::tiny_gemma3_bytes(), test::tiny_llama_bytes({})}) {
        Tiny t(std::move(bytes));
        memory::Device host("host", uint64_t{1} << 30);
        for (const int n_ctx : {16, 100, 512}) {
            for (const bool shift : {false, true}) {
                engine::Session s(*t.model,
                                  {.n_ctx = n_ctx,
                                   .n_batch = 8,
                                   .type_k = KvType::f32,  // tiny heads: 16 values, not whole q8_0 blocks
                                   .context_shift = shift},
                                  t.pool, &host);
                EXPECT_EQ(host.pool(memory::pool_names::kKv).live(), s.cache().bytes()) << n_ctx << " " << shift;
                EXPECT_EQ(host.pool(memory::pool_names::kLogits).live(),
                          memory::PoolBuffer<float>::bytes_for(static_cast<size_t>(t.model->n_vocab())));
            }
            EXPECT_EQ(host.live(), 0u);
        }
    }
}

// With KV spill, the plan's KV row is what the cache keeps in memory and charges.
TEST(SessionBudget, SpilledCacheChargesWhatThePlanSays) {
    const test::TempDir dir;
    for (auto bytes : {test::tiny_gemma3_bytes({.n_layer = 12}), test::tiny_llama_bytes({})}) {
        Tiny t(std::move(bytes));
        const engine::Plan unlimited = engine::make_plan(
            engine::model_shape(t.file), {.n_ctx = 1024, .n_batch = 8, .n_threads = 2, .budget = uint64_t{1} << 30});
        // Half the full-attention pool (Gemma 3: its 2 global layers; its window pools stay in).
        ASSERT_EQ(unlimited.kv_pools.front().window, 0);
        const uint64_t limit = unlimited.kv - unlimited.kv_pools.front().bytes / 2;
        memory::Device host("host", uint64_t{1} << 30);
        engine::Session s(*t.model,
                          {.n_ctx = 1024, .n_batch = 8, .kv_spill_dir = dir.path().string(), .kv_resident = limit},
                          t.pool, &host);
        const engine::Plan spilled = engine::make_plan(
            engine::model_shape(t.file),
            {.n_ctx = 1024, .n_batch = 8, .n_threads = 2, .budget = uint64_t{1} << 30, .kv_resident_limit = limit});
        EXPECT_EQ(host.pool(memory::pool_names::kKv).live(), spilled.kv);
        EXPECT_EQ(s.cache().bytes(), spilled.kv);
        EXPECT_LT(spilled.kv, unlimited.kv);
        EXPECT_GT(spilled.kv_spilled, 0u);
        EXPECT_EQ(greedy(s, 4).size(), 4u);
    }
}

// A second session over the budget is refused before it allocates: BudgetError names the pool and
// the bytes; the first session keeps decoding exactly as a session alone does.
TEST(SessionBudget, ASecondSessionOverTheBudgetIsRefusedAndTheFirstGoesOn) {
    Tiny t(test::tiny_llama_bytes({}));
    engine::Session alone(*t.model, {.n_ctx = 64, .n_batch = 4}, t.pool);
    const std::vector<int32_t> expected = greedy(alone, 12);

    memory::Device probe("probe", uint64_t{1} << 30);
    { engine::Session sized(*t.model, {.n_ctx = 64, .n_batch = 4}, t.pool, &probe); }
    const uint64_t one_session = probe.peak();
    ASSERT_GT(one_session, 0u);

    memory::Device host("host", one_session + one_session / 2);  // room for one and a half
    engine::Session first(*t.model, {.n_ctx = 64, .n_batch = 4}, t.pool, &host);
    std::span<const float> logits = first.feed(kPrompt);
    ASSERT_FALSE(logits.empty());
    const uint64_t live_before = host.live();
    try {
        engine::Session second(*t.model, {.n_ctx = 64, .n_batch = 4}, t.pool, &host);
        FAIL() << "a second session fit in " << host.capacity() << " bytes";
    } catch (const memory::BudgetError& e) {
        const std::string what = e.what();
        EXPECT_EQ(e.pool(), "kv");
        EXPECT_NE(what.find("pool 'kv'"), std::string::npos) << what;
        EXPECT_NE(what.find("KV cache"), std::string::npos) << what;
        EXPECT_NE(what.find("in use: kv"), std::string::npos) << what;
        EXPECT_GT(e.requested(), host.capacity() - live_before);
    }
    EXPECT_EQ(host.live(), live_before);  // nothing of the refused session stays charged

    // The first session, interrupted by the refusal, still decodes what a session alone does.
    first.reset();
    EXPECT_EQ(greedy(first, 12), expected);

    // A larger cache for the same session is refused too; a smaller one fits next to it.
    EXPECT_THROW(engine::Session(*t.model, {.n_ctx = 4096, .n_batch = 4}, t.pool, &host), memory::BudgetError);
    engine::Session small(*t.model, {.n_ctx = 16, .n_batch = 4}, t.pool, &host);
    EXPECT_EQ(greedy(first, 12).size(), 12u);
}

// The logits are refused when the cache fitted but the rest does not: the cache's charge goes back.
TEST(SessionBudget, RefusedLogitsGiveTheCacheBack) {
    Tiny t(test::tiny_llama_bytes({}));
    memory::Device probe("probe", uint64_t{1} << 30);
    uint64_t kv = 0;
    {
        engine::Session s(*t.model, {.n_ctx = 64, .n_batch = 4}, t.pool, &probe);
        kv = probe.pool("kv").live();
    }
    memory::Device host("host", kv + 8);  // the cache fits, the logits do not
    try {
        engine::Session s(*t.model, {.n_ctx = 64, .n_batch = 4}, t.pool, &host);
        FAIL() << "the logits fit in 8 bytes";
    } catch (const memory::BudgetError& e) {
        EXPECT_EQ(e.pool(), "logits");
    }
    EXPECT_EQ(host.live(), 0u);
}

// -np and perplexity charge their caches and logits the same way.
TEST(SessionBudget, ParallelAndPerplexityAreChargedToo) {
    Tiny t(test::tiny_llama_bytes({}));
    memory::Device tiny_host("host", 1024);
    std::vector<sampling::Sampler> samplers;
    for (int s = 0; s < 2; ++s)
        samplers.emplace_back(sampling::SamplingParams{.temperature = 0.0f}, t.model->n_vocab());
    EXPECT_THROW(engine::generate_parallel(
                     *t.model, {.n_ctx = 64, .n_batch = 4}, kPrompt, 4, samplers, [](int32_t) { return false; }, t.pool,
                     &tiny_host),
                 memory::BudgetError);
    memory::Device host("host", uint64_t{1} << 30);
    const auto r = engine::generate_parallel(
        *t.model, {.n_ctx = 64, .n_batch = 4}, kPrompt, 4, samplers, [](int32_t) { return false; }, t.pool, &host);
    EXPECT_EQ(r.tokens.size(), 2u);
    EXPECT_GT(host.pool("kv").peak(), 0u);
    EXPECT_EQ(host.pool("logits").peak(), memory::PoolBuffer<float>::bytes_for(2 * size_t(t.model->n_vocab())));
    EXPECT_EQ(host.live(), 0u);

    std::vector<int32_t> text(64);
    for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<int32_t>(i % 40);
    const engine::PerplexityParams pp{.n_ctx = 16, .n_batch = 8};
    EXPECT_THROW(engine::perplexity(*t.model, text, pp, {}, t.pool, &tiny_host), memory::BudgetError);
    memory::Device host2("host", uint64_t{1} << 30);
    EXPECT_GT(engine::perplexity(*t.model, text, pp, {}, t.pool, &host2).ppl, 0.0);
    EXPECT_GT(host2.pool("kv").peak(), 0u);
    EXPECT_GT(host2.pool("logits").peak(), 0u);
}

}  // namespace
}  // namespace fitllm
