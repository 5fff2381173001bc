// The expert cache (model/expert_cache.h, issue 21): the plan's split of a mixture-of-experts
// file into dense weights and routed experts against its tensors, the cache's logits against the
// resident run's (bit for bit, prompt and decode), its counters, and the budgets it refuses.
#include "model/expert_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/plan.h"
#include "engine/plan_report.h"
#include "fitllm/error.h"
#include "gguf/gguf_reader.h"
#include "memory/device.h"
#include "memory/pool.h"
#include "model/model.h"
#include "ops/thread_pool.h"
#include "test_support.h"
#include "util/text.h"

namespace fitllm {
namespace {

std::string generated(const std::string& name) {
    return (test::source_dir() / "tests/model/data" / name).string();
}

std::vector<int32_t> prompt_of(int n) {
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = (i * 37 + 11) % 300;
    return tokens;
}

// A prompt of 40 tokens in one batch (all its logits), then n_decode greedy tokens one at a time
// (each step's logits), all rows in one vector.
std::vector<float> prompt_and_decode(model::Model& m, int n_decode, ops::ThreadPool& pool) {
    const std::vector<int32_t> tokens = prompt_of(40);
    std::vector<int32_t> pos(tokens.size());
    std::iota(pos.begin(), pos.end(), 0);
    kv::ModelCache cache = m.make_cache({.n_cells = 256}, static_cast<int>(tokens.size()));
    const auto n_vocab = static_cast<size_t>(m.n_vocab());
    std::vector<float> out(tokens.size() * n_vocab);
    m.forward(tokens, pos, cache, out.data(), /*all_logits=*/true, pool);
    for (int i = 0; i < n_decode; ++i) {
        const float* last = out.data() + out.size() - n_vocab;
        const auto next = static_cast<int32_t>(std::max_element(last, last + n_vocab) - last);
        const int32_t at = static_cast<int32_t>(tokens.size()) + i;
        std::vector<float> row(n_vocab);
        m.forward(std::vector<int32_t>{next}, std::vector<int32_t>{at}, cache, row.data(), false, pool);
        out.insert(out.end(), row.begin(), row.end());
    }
    return out;
}

const char* const kFiles[] = {"tiny-qwen3moe-f16.gguf", "tiny-qwen3moe-q8_0.gguf", "tiny-qwen3moe-q4_k_m.gguf",
                              "tiny-mixtral-f16.gguf",  "tiny-mixtral-q8_0.gguf",  "tiny-mixtral-q4_k_m.gguf",
                              "tiny-qwen2moe-f16.gguf", "tiny-qwen2moe-q8_0.gguf", "tiny-qwen2moe-q4_k_m.gguf",
                              "tiny-gpt-oss-f16.gguf",  "tiny-gpt-oss-q8_0.gguf",  "tiny-gpt-oss-mxfp4_moe.gguf"};

TEST(ExpertPlan, SplitsDenseAndExpertBytesAsTheFileHasThem) {
    for (const char* name : kFiles) {
        const gguf::GgufFile file = gguf::GgufFile::open(generated(name));
        const engine::ModelShape shape = engine::model_shape(file);
        const model::Hparams& hp = shape.hp;
        uint64_t all = 0, experts = 0, shared = 0;
        std::vector<uint64_t> per_layer(static_cast<size_t>(hp.n_layer), 0);
        uint64_t largest[3] = {};
        for (const gguf::TensorInfo& t : file.tensors()) {
            all += t.n_bytes;
            if (t.name.find("_shexp.") != std::string::npos) shared += t.n_bytes;
            for (int m = 0; m < 3; ++m) {
                if (t.name.ends_with(std::string(".") + model::kExpertTensors[m])) {
                    experts += t.n_bytes;
                    per_layer[static_cast<size_t>(engine::tensor_layer(t.name))] += t.n_bytes;
                    ASSERT_EQ(t.ne[2], uint64_t(hp.n_expert)) << t.name;
                    largest[m] = std::max(largest[m], t.n_bytes / uint64_t(hp.n_expert));
                }
            }
        }
        ASSERT_GT(experts, 0u) << name;
        EXPECT_EQ(shape.expert_bytes, experts) << name;
        EXPECT_EQ(shape.layer_expert_bytes, per_layer) << name;
        EXPECT_EQ(shape.dense_bytes(), all - experts) << name;
        EXPECT_EQ(shape.shared_expert_bytes, shared) << name;
        EXPECT_EQ(shared > 0, hp.n_ff_shexp > 0) << name;  // qwen2moe's files have one, the others none
        uint64_t slot = 0;
        for (const uint64_t b : largest) slot += (b + 4095) / 4096 * 4096 + 4096;
        EXPECT_EQ(shape.expert_slot_bytes, slot) << name;

        // Resident, the experts are weights like the others; cached, only the dense part stays.
        const engine::Plan resident = engine::make_plan(shape, {.n_ctx = 256});
        const engine::Plan cached = engine::make_plan(shape, {.n_ctx = 256, .expert_slots = 5});
        EXPECT_EQ(resident.weights_resident, all);
        EXPECT_EQ(resident.n_expert_slots, 0);
        EXPECT_EQ(cached.weights_resident, all - experts) << name;
        EXPECT_EQ(cached.n_expert_slots, 5);
        EXPECT_EQ(cached.expert_cache, 5 * slot + 4096) << name;
        EXPECT_EQ(cached.total(), resident.total() - experts + cached.expert_cache) << name;
        // Uniform routing: 5 of 16 experts hit, each token reads 2 used x 2 layers x the rest.
        const int n_all = hp.n_expert * hp.n_layer;
        EXPECT_DOUBLE_EQ(cached.expert_miss_rate, 1.0 - 5.0 / n_all);
        EXPECT_EQ(cached.expert_read_per_token,
                  uint64_t(double(hp.n_expert_used * hp.n_layer) * (double(experts) / n_all) * (1.0 - 5.0 / n_all)));
        const std::string text = engine::plan_text(cached, "test");
        EXPECT_NE(text.find("routed experts"), std::string::npos) << text;
        EXPECT_NE(text.find("2 layers x 8 experts x "), std::string::npos) << text;
        EXPECT_NE(text.find("expert cache"), std::string::npos) << text;
        EXPECT_NE(text.find("5 of 16 experts"), std::string::npos) << text;
        EXPECT_EQ(text.find("shared experts (") != std::string::npos, shared > 0) << text;
        const auto json = engine::plan_json(cached, "test");
        EXPECT_EQ(json.at("experts").at("shared_expert_bytes"), shared);
        EXPECT_EQ(json.at("experts").at("expert_bytes"), experts);
        EXPECT_EQ(json.at("experts").at("dense_bytes"), all - experts);
        EXPECT_EQ(json.at("experts").at("n_slots"), 5);
    }
}

TEST(ExpertPlan, AutoTakesWhatTheBudgetHoldsAndFitPicksTheCache) {
    const gguf::GgufFile file = gguf::GgufFile::open(generated("tiny-qwen3moe-q8_0.gguf"));
    const engine::ModelShape shape = engine::model_shape(file);
    // (a q4_0 KV cache: nothing left for fit_plan to quantize first)
    engine::PlanParams q{.n_ctx = 256, .type_k = quant::GgmlType::Q4_0, .type_v = quant::GgmlType::Q4_0};
    const engine::Plan resident = engine::make_plan(shape, q);
    q.expert_slots = 4;
    const engine::Plan smallest = engine::make_plan(shape, q);
    ASSERT_LT(smallest.total(), resident.total());
    const uint64_t budget = smallest.total() + 3 * shape.expert_slot_bytes + 100;
    q.budget = budget;
    q.expert_slots = engine::PlanParams::kExpertSlotsAuto;
    const engine::Plan autop = engine::make_plan(shape, q);
    EXPECT_EQ(autop.n_expert_slots, 7);
    EXPECT_TRUE(autop.fits());

    q.expert_slots = engine::PlanParams::kExpertSlotsNotSet;
    const engine::Plan fitted = engine::fit_plan(shape, q);
    ASSERT_TRUE(fitted.fits()) << engine::plan_text(fitted, "test");
    EXPECT_EQ(fitted.n_expert_slots, 7);
    EXPECT_EQ(fitted.params.n_streamed_layers, 0);
    bool said = false;
    for (const engine::FitStep& s : fitted.fit_steps) said |= s.change == "expert cache of 7 of 16 experts";
    EXPECT_TRUE(said) << engine::plan_text(fitted, "test");
    // Under the fewest slots, fit says why not and streams layers instead.
    q.budget = smallest.total() - 1;
    const engine::Plan streamed = engine::fit_plan(shape, q);
    EXPECT_EQ(streamed.n_expert_slots, 0);
    ASSERT_FALSE(streamed.fit_steps.empty());
    EXPECT_EQ(streamed.fit_steps.front().change, "no expert cache") << engine::plan_text(streamed, "test");
}

TEST(ExpertPlan, TooFewSlotsAreRefusedWithTheNumbers) {
    const gguf::GgufFile file = gguf::GgufFile::open(generated("tiny-qwen3moe-q8_0.gguf"));
    const engine::ModelShape shape = engine::model_shape(file);
    try {
        engine::make_plan(shape, {.n_ctx = 256, .expert_slots = 3});
        FAIL() << "planned 3 slots";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("an expert cache of 3 slots is too small: it needs at least 4 (2 experts "
                                             "used x 2 layers"),
                  std::string::npos)
            << e.what();
    }
    // A budget under the dense weights plus the fewest slots: refused before loading, naming them.
    const engine::Plan smallest = engine::make_plan(shape, {.n_ctx = 256, .expert_slots = 4});
    LoadConfig load{.model_path = generated("tiny-qwen3moe-q8_0.gguf"), .mem = smallest.total() - 1};
    load.expert_slots = LoadConfig::kExpertsAuto;
    try {
        engine::Engine::load(load, ContextConfig{.n_ctx = 256});
        FAIL() << "loaded over the budget";
    } catch (const DoesNotFitError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("too small for an expert cache: the dense weights " +
                            util::human_bytes(smallest.weights_resident)),
                  std::string::npos)
            << what;
        EXPECT_NE(what.find("4 slots x 48.0 KiB"), std::string::npos) << what;
        EXPECT_NE(what.find("(at least 4: 2 experts used x 2 layers)"), std::string::npos) << what;
        EXPECT_NE(what.find("over the budget of"), std::string::npos) << what;
    }
    // Not a mixture of experts.
    const engine::ModelShape dense = engine::model_shape(gguf::GgufFile::open(generated("tiny-qwen3-q8_0.gguf")));
    EXPECT_THROW(engine::make_plan(dense, {.n_ctx = 256, .expert_slots = 8}), std::invalid_argument);
}

// With and without reading ahead (prefetch only changes what is in the slots), O_DIRECT and
// buffered, either eviction: the resident run's logits, bit for bit, for the prompt and each
// decoded token.
TEST(ExpertCache, GivesTheResidentLogitsBitForBit) {
    ops::ThreadPool pool(2);
    for (const char* name : kFiles) {
        const gguf::GgufFile file = gguf::GgufFile::open(generated(name));
        const auto resident = model::Model::load(file);
        const std::vector<float> want = prompt_and_decode(*resident, 12, pool);
        for (int variant = 0; variant < 8; ++variant) {
            const bool direct = (variant & 1) != 0, prefetch = (variant & 2) != 0;
            const ExpertEvict evict = (variant & 4) != 0 ? ExpertEvict::lfu : ExpertEvict::lru;
            {
                memory::Device host("host", UINT64_MAX);
                const auto cached = model::Model::load(file, {.device = &host,
                                                              .stream_direct_io = direct,
                                                              .expert_slots = 4,
                                                              .expert_prefetch = prefetch,
                                                              .expert_evict = evict});
                const std::vector<float> got = prompt_and_decode(*cached, 12, pool);
                const std::string what = std::string(name) + (direct ? " O_DIRECT" : " buffered") +
                                         (prefetch ? " prefetch " : " no prefetch ") +
                                         std::string(model::expert_evict_name(evict));
                ASSERT_EQ(got.size(), want.size());
                EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << what;
                const model::ExpertCacheStats x = cached->expert_cache_stats();
                EXPECT_EQ(x.n_slots, 4);
                EXPECT_EQ(x.evict, evict);
                EXPECT_GT(x.top_fifth_share, 0.0) << what;
                EXPECT_LE(x.top_fifth_share, 1.0) << what;
                EXPECT_GT(x.misses, 4u) << what;  // 4 slots for 16 experts: evictions, read again
                EXPECT_GT(x.hits, 0u) << what;
                EXPECT_EQ(x.tokens, 40u + 12u);
                if (!prefetch) {
                    EXPECT_EQ(x.prefetched, 0u) << what;  // (with it: as the reader thread runs)
                }
                EXPECT_LE(x.prefetch_used, x.prefetched);
                for (const memory::PoolStats& p : host.pools()) {
                    if (p.name == memory::pool_names::kExperts) {
                        EXPECT_EQ(p.peak, model::expert_cache_bytes(x.slot_bytes, 4));
                    }
                }
            }
        }
    }
}

TEST(ExpertCache, CountersAddUp) {
    const gguf::GgufFile file = gguf::GgufFile::open(generated("tiny-qwen3moe-q8_0.gguf"));
    const model::Hparams hp = model::read_hparams(file);
    const uint64_t per_expert = 3 * 8704;  // 69632 / 8 for each of gate, up, down (Q8_0)
    ops::ThreadPool pool(2);
    // Every expert has a slot: each is read once, then only hit (no read-ahead: each read counts).
    const auto all = model::Model::load(file, {.expert_slots = hp.n_expert * hp.n_layer, .expert_prefetch = false});
    prompt_and_decode(*all, 0, pool);
    const model::ExpertCacheStats a = all->expert_cache_stats();
    EXPECT_LE(a.misses, uint64_t(hp.n_expert * hp.n_layer));
    EXPECT_GE(a.bytes_read, a.misses * per_expert);
    EXPECT_LE(a.bytes_read, a.misses * (per_expert + 3 * 2 * 4096));
    prompt_and_decode(*all, 10, pool);
    const model::ExpertCacheStats b = all->expert_cache_stats();
    // 10 decode steps look up n_used experts per layer each: more hits, and misses only for
    // experts the first prompt never chose.
    EXPECT_GE(b.hits + b.misses, a.hits + a.misses + 10u * uint64_t(hp.n_expert_used * hp.n_layer));
    EXPECT_LE(b.misses, uint64_t(hp.n_expert * hp.n_layer));
    EXPECT_GT(b.hit_rate(), a.hit_rate());
    EXPECT_DOUBLE_EQ(b.bytes_per_token(), double(b.bytes_read) / double(b.tokens));

    // One token at a time with the fewest slots: exactly n_used x n_layer lookups per token, read
    // ahead or not.
    const auto few = model::Model::load(file, {.expert_slots = model::min_expert_slots(hp)});
    kv::ModelCache cache = few->make_cache({.n_cells = 64}, 1);
    std::vector<float> row(static_cast<size_t>(few->n_vocab()));
    for (int i = 0; i < 6; ++i) {
        few->forward(std::vector<int32_t>{(i * 37 + 11) % 300}, std::vector<int32_t>{i}, cache, row.data(), false,
                     pool);
        const model::ExpertCacheStats x = few->expert_cache_stats();
        EXPECT_EQ(x.hits + x.misses, uint64_t(i + 1) * uint64_t(hp.n_expert_used * hp.n_layer));
    }
    const model::ExpertCacheStats f = few->expert_cache_stats();
    EXPECT_LE(f.prefetch_used, f.prefetched);
    EXPECT_NE(model::expert_cache_text(f).find("expert cache: 4 slots, "), std::string::npos);
}

// Read-ahead: queued experts are read by the reader thread into slots, a later get() of one is a
// hit (and counts as used), one already in a slot is not read again, and the bytes are the file's.
TEST(ExpertCache, PrefetchReadsAheadIntoSlots) {
    const gguf::GgufFile file = gguf::GgufFile::open(generated("tiny-qwen3moe-q8_0.gguf"));
    const model::Hparams hp = model::read_hparams(file);
    memory::Device host("host", UINT64_MAX);
    for (const bool direct : {true, false}) {
        model::ExpertCache cache(file, hp, 4, host.pool(memory::pool_names::kExperts), direct, /*prefetch=*/true);
        ASSERT_TRUE(cache.prefetching());
        const int32_t ids[] = {3, 5};
        cache.prefetch(1, ids, 2);
        cache.drain();
        model::ExpertCacheStats x = cache.stats();
        EXPECT_EQ(x.prefetched, 2u);
        EXPECT_EQ(x.hits + x.misses, 0u);
        const model::ExpertCache::Expert e = cache.get(1, 5);
        x = cache.stats();
        EXPECT_EQ(x.hits, 1u);
        EXPECT_EQ(x.misses, 0u);
        EXPECT_EQ(x.prefetch_used, 1u);
        // The bytes of expert 5 of blk.1.ffn_up_exps.weight, as the mapping has them.
        const gguf::TensorInfo* up = file.find_tensor("blk.1.ffn_up_exps.weight");
        ASSERT_NE(up, nullptr);
        const uint64_t each = up->n_bytes / uint64_t(hp.n_expert);
        EXPECT_EQ(0, std::memcmp(e.up, up->data.data() + 5 * each, each));
        cache.prefetch(1, ids, 2);  // both in slots: nothing to read
        cache.drain();
        EXPECT_EQ(cache.stats().prefetched, 2u);
        cache.get(0, 3);  // a miss, read by get() itself
        EXPECT_EQ(cache.stats().misses, 1u);
    }
    // Without its thread, prefetch() does nothing.
    model::ExpertCache off(file, hp, 4, host.pool(memory::pool_names::kExperts), true, /*prefetch=*/false);
    const int32_t one[] = {0};
    off.prefetch(0, one, 1);
    off.drain();
    EXPECT_EQ(off.stats().prefetched, 0u);
}

// lfu keeps the expert looked up most often where lru gives it up to four newer ones, and lets
// it go once its count has aged below the others'.
TEST(ExpertCache, LfuKeepsTheBusyExpertUntilItsCountAges) {
    const gguf::GgufFile file = gguf::GgufFile::open(generated("tiny-qwen3moe-q8_0.gguf"));
    const model::Hparams hp = model::read_hparams(file);
    ASSERT_EQ(model::min_expert_slots(hp), 4);
    ASSERT_GE(hp.n_expert, 8);
    memory::Device host("host", UINT64_MAX);
    for (const ExpertEvict evict : {ExpertEvict::lru, ExpertEvict::lfu}) {
        const std::string what(model::expert_evict_name(evict));
        model::ExpertCache cache(file, hp, 4, host.pool(memory::pool_names::kExperts), true, false, evict);
        for (int i = 0; i < 5; ++i) cache.get(0, 0);   // 1 miss, 4 hits
        for (int e = 1; e <= 5; ++e) cache.get(0, e);  // 5 misses: the fifth evicts a slot
        EXPECT_EQ(cache.stats().misses, 6u) << what;
        cache.get(0, 0);
        const model::ExpertCacheStats x = cache.stats();
        EXPECT_EQ(x.misses, evict == ExpertEvict::lfu ? 6u : 7u) << what;
        EXPECT_EQ(x.hits, evict == ExpertEvict::lfu ? 5u : 4u) << what;
        EXPECT_EQ(x.evict, evict);
        EXPECT_NE(model::expert_cache_text(x).find(what + " eviction"), std::string::npos)
            << model::expert_cache_text(x);
        if (evict == ExpertEvict::lfu) {
            // 200 more lookups of expert 0, then 14 other experts in turn for 8 of the counts'
            // half-lives (about 73 lookups each, fewer than expert 0's): aged, expert 0's count
            // halves to nothing while each of theirs gets about 9 a half-life, so it loses its slot.
            for (int i = 0; i < 200; ++i) cache.get(0, 0);
            const int n = 8 * model::kLfuAgeTokens * model::min_expert_slots(hp);
            for (int i = 0; i < n; ++i) cache.get(i / 7 % 2, 1 + i % 7);
            const uint64_t misses = cache.stats().misses;
            cache.get(0, 0);
            EXPECT_EQ(cache.stats().misses, misses + 1) << what;
        }
    }
}

TEST(ExpertCache, TopFifthShareIsTheBusiestFifthsShareOfEachLayer) {
    // 2 layers of 10 experts: the busiest 2 of each.
    std::vector<uint64_t> counts(20, 0);
    counts[3] = 6, counts[7] = 2, counts[1] = 1, counts[0] = 1;        // layer 0: 6 + 2 of 10
    for (int e = 10; e < 20; ++e) counts[static_cast<size_t>(e)] = 1;  // layer 1: 2 of 10
    EXPECT_DOUBLE_EQ(model::top_fifth_share(counts, 2, 10), 10.0 / 20.0);
    EXPECT_DOUBLE_EQ(model::top_fifth_share(std::vector<uint64_t>(20, 0), 2, 10), 0.0);
    EXPECT_DOUBLE_EQ(model::top_fifth_share(counts, 3, 10), 0.0);  // the wrong size
    // Fewer than 5 experts: the busiest one.
    EXPECT_DOUBLE_EQ(model::top_fifth_share({3, 1}, 1, 2), 0.75);
}

TEST(ExpertCache, RefusesTooFewSlotsAndSlotsOverBudget) {
    const gguf::GgufFile file = gguf::GgufFile::open(generated("tiny-qwen3moe-q8_0.gguf"));
    EXPECT_THROW(model::Model::load(file, {.expert_slots = 3}), std::invalid_argument);
    memory::Device small("host", 100'000);
    EXPECT_THROW(model::Model::load(file, {.device = &small, .expert_slots = 4}), memory::BudgetError);
    EXPECT_EQ(small.live(), 0u);
}

}  // namespace
}  // namespace fitllm
