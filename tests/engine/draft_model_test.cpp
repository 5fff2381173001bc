// Speculative decoding with a draft model (engine/drafter.h, Session::generate_speculative,
// Engine::load's draft model): greedy text token for token the same as without it, on tiny models
// (another quantization of the model as the draft, window pools, context shifts, a full context)
// and the demo model; a draft with another vocabulary refused; the draft in the plan and the budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/drafter.h"
#include "engine/engine.h"
#include "engine/plan_report.h"
#include "engine/session.h"
#include "engine/speculative_checks.h"
#include "fitllm/error.h"
#include "gguf/gguf_reader.h"
#include "memory/pool.h"
#include "model/model.h"
#include "model/tiny_gemma3.h"
#include "sampling/sampler.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace fitllm {
namespace {

using engine::DraftParams;
using test::expect_same;
using test::Generated;

std::string data(const char* name) {
    return (test::source_dir() / "tests/model/data" / name).string();
}

// Greedy generation on `target`, with a draft model when draft is not null.
Generated generate(model::Model& target, ops::ThreadPool& pool, ContextConfig context,
                   const std::vector<int32_t>& prompt, int n_predict, model::Model* draft, const DraftParams& params,
                   int32_t eog = -1) {
    if (draft != nullptr) context.n_outputs = params.n_draft + 1;
    engine::Session session(target, context, pool);
    sampling::SamplingParams sp;
    sp.temperature = 0.0f;
    sampling::Sampler sampler(sp, target.n_vocab());
    Generated r;
    const auto is_eog = [eog](int32_t id) { return id == eog; };
    const auto on_token = [&](int32_t id) {
        r.tokens.push_back(id);
        return true;
    };
    if (draft != nullptr) {
        engine::ModelDrafter drafter(*draft, context, pool, params);
        r.stats = session.generate_speculative(prompt, n_predict, sampler, drafter, is_eog, on_token);
    } else {
        r.stats = session.generate(prompt, n_predict, sampler, is_eog, on_token);
    }
    r.n_past = session.n_past();
    return r;
}

std::vector<int32_t> some_prompt(int n_vocab, int n) {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back((i * 13 + 5) % n_vocab);
    return p;
}

TEST(DraftModel, ParametersOutOfRangeAreRefused) {
    EXPECT_NO_THROW(engine::check(DraftParams{}));
    EXPECT_THROW(engine::check(DraftParams{.n_draft = 0}), ConfigError);
    EXPECT_THROW(engine::check(DraftParams{.n_draft = 4, .n_min = 5}), ConfigError);
    EXPECT_THROW(engine::check(DraftParams{.n_min = -1}), ConfigError);
    EXPECT_THROW(engine::check(DraftParams{.p_min = 1.5f}), ConfigError);
    EXPECT_THROW(engine::check(DraftParams{.p_min = -0.1f}), ConfigError);
}

// The Q8_0 tiny Llama with its F16 and Q4_K_M siblings as drafts (and itself): the same tokens
// as without a draft; drafts accepted; a full context stops at the same token.
TEST(DraftModel, GreedyMatchesGenerateOnTinyLlamaWithItsOtherQuantizations) {
    const gguf::GgufFile target_file = gguf::GgufFile::open(data("tiny-llama-q8_0.gguf"));
    const auto target = model::Model::load(target_file);
    ops::ThreadPool pool{2};
    const std::vector<int32_t> prompt = some_prompt(target->n_vocab(), 12);
    for (const char* name : {"tiny-llama-f16.gguf", "tiny-llama-q4_k_m.gguf", "tiny-llama-q8_0.gguf"}) {
        SCOPED_TRACE(name);
        const gguf::GgufFile draft_file = gguf::GgufFile::open(data(name));
        const auto draft = model::Model::load(draft_file);
        for (const DraftParams params : {DraftParams{.n_draft = 1}, DraftParams{.n_draft = 6, .p_min = 0.0f},
                                         DraftParams{.n_draft = 8, .n_min = 2}}) {
            SCOPED_TRACE("n_draft " + std::to_string(params.n_draft));
            const ContextConfig context{.n_ctx = 256, .n_batch = 32};
            const Generated plain = generate(*target, pool, context, prompt, 100, nullptr, params);
            const Generated spec = generate(*target, pool, context, prompt, 100, draft.get(), params);
            expect_same(plain, spec);
            EXPECT_GT(spec.stats.n_accepted, 0);
        }
        {
            const ContextConfig small{.n_ctx = 48, .n_batch = 32};
            const DraftParams params{.n_draft = 5, .p_min = 0.0f};
            const Generated plain = generate(*target, pool, small, prompt, 100, nullptr, params);
            const Generated spec = generate(*target, pool, small, prompt, 100, draft.get(), params);
            EXPECT_TRUE(plain.stats.context_full);
            expect_same(plain, spec);
        }
    }
}

// --draft-vocab: the draft scores the first tokens only, drafts nothing else, and the text is
// still the model's.
TEST(DraftModel, AVocabularyLimitDraftsOnlyTheFirstTokensAndKeepsTheText) {
    const gguf::GgufFile target_file = gguf::GgufFile::open(data("tiny-llama-q8_0.gguf"));
    const auto target = model::Model::load(target_file);
    const gguf::GgufFile draft_file = gguf::GgufFile::open(data("tiny-llama-f16.gguf"));
    const auto draft = model::Model::load(draft_file);
    ops::ThreadPool pool{2};
    const std::vector<int32_t> prompt = some_prompt(target->n_vocab(), 12);
    const ContextConfig context{.n_ctx = 256, .n_batch = 32};
    const DraftParams params{.n_draft = 6, .p_min = 0.0f, .n_vocab = 200};
    engine::ModelDrafter drafter(*draft, context, pool, params);
    std::vector<int32_t> out;
    for (int n = 3; n < 12; ++n) {
        ASSERT_EQ(drafter.draft(std::span<const int32_t>(prompt).first(static_cast<size_t>(n)), 6, out), 6);
        for (const int32_t id : out) EXPECT_LT(id, 200);
    }
    const Generated plain = generate(*target, pool, context, prompt, 100, nullptr, params);
    const Generated spec = generate(*target, pool, context, prompt, 100, draft.get(), params);
    expect_same(plain, spec);
    EXPECT_GT(spec.stats.n_accepted, 0);
}

// Tiny Gemma 3 whose sliding-window pools (window 4) trim after every pass, drafted by itself and
// by its 2-layer sibling: rejected drafts are taken back from both caches; and through context
// shifts, after which the draft model starts over.
TEST(DraftModel, GreedyMatchesGenerateWithWindowPoolsAndContextShifts) {
    const std::vector<std::byte> target_bytes = test::tiny_gemma3_bytes({.n_layer = 6});
    const gguf::GgufFile target_file = gguf::GgufFile::parse(target_bytes, "target.gguf");
    const auto target = model::Model::load(target_file);
    const std::vector<std::byte> small_bytes = test::tiny_gemma3_bytes({.n_layer = 2});
    const gguf::GgufFile small_file = gguf::GgufFile::parse(small_bytes, "draft.gguf");
    const auto small = model::Model::load(small_file);
    ops::ThreadPool pool{2};
    const std::vector<int32_t> prompt = some_prompt(target->n_vocab(), 20);
    const DraftParams params{.n_draft = 5, .p_min = 0.0f};
    const ContextConfig context{.n_ctx = 256, .n_batch = 16};
    const Generated plain = generate(*target, pool, context, prompt, 120, nullptr, params);
    {
        const Generated spec = generate(*target, pool, context, prompt, 120, target.get(), params);
        expect_same(plain, spec);
        EXPECT_EQ(spec.stats.n_accepted, spec.stats.n_drafted);  // the model drafts for itself
        EXPECT_GT(spec.stats.n_draft_passes, 10);
    }
    {
        const Generated spec = generate(*target, pool, context, prompt, 120, small.get(), params);
        expect_same(plain, spec);
        EXPECT_LT(spec.stats.n_accepted, spec.stats.n_drafted);  // some rejected and taken back
    }
    ContextConfig shifting{.n_ctx = 48, .n_batch = 16};
    shifting.context_shift = true;
    shifting.n_keep = 4;
    const Generated plain_shifted = generate(*target, pool, shifting, prompt, 150, nullptr, params);
    EXPECT_GT(plain_shifted.stats.n_shifts, 2);
    for (model::Model* draft : {target.get(), small.get()}) {
        const Generated spec = generate(*target, pool, shifting, prompt, 150, draft, params);
        expect_same(plain_shifted, spec);
        EXPECT_GT(spec.stats.n_accepted, 0);
    }
}

// The demo model drafting for its F16 conversion (when bench/speculative.py has made it) or for
// itself, on a chat prompt.
TEST(DraftModel, GreedyMatchesGenerateOnTheDemoModel) {
    const auto path = test::demo_model();
    if (!path) GTEST_SKIP() << "demo model not found (scripts/setup.sh assembles it)";
    const std::filesystem::path f16 = test::source_dir() / ".cache/gemma-3-270m-f16.gguf";
    const std::string target_path = std::filesystem::exists(f16) ? f16.string() : path->string();
    SCOPED_TRACE(target_path);
    const gguf::GgufFile target_file = gguf::GgufFile::open(target_path);
    const gguf::GgufFile draft_file = gguf::GgufFile::open(path->string());
    const tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_gguf(target_file);
    EXPECT_NO_THROW(engine::check_same_vocab(tok.vocab(), target_path,
                                             tokenizer::Tokenizer::from_gguf(draft_file).vocab(), path->string()));
    const auto target = model::Model::load(target_file);
    const auto draft = model::Model::load(draft_file);
    ops::ThreadPool pool{2};
    const std::vector<int32_t> prompt = tok.tokenize(
        "<start_of_turn>user\nWrite a short story about a robot who learns to paint.<end_of_turn>\n"
        "<start_of_turn>model\n",
        true, true);
    const ContextConfig context{.n_ctx = 512, .n_batch = 64};
    const DraftParams params{.n_draft = 8};
    const Generated plain = generate(*target, pool, context, prompt, 48, nullptr, params);
    const Generated spec = generate(*target, pool, context, prompt, 48, draft.get(), params);
    expect_same(plain, spec);
    EXPECT_GT(spec.stats.n_accepted, spec.stats.n_generated / 3);
    const Generated limited =
        generate(*target, pool, context, prompt, 48, draft.get(), DraftParams{.n_draft = 8, .n_vocab = 32768});
    expect_same(plain, limited);
    EXPECT_GT(limited.stats.n_accepted, 0);
}

TEST(DraftModel, ADraftWithAnotherVocabularyIsRefusedNamingBothFiles) {
    const std::string llama = data("tiny-llama-q8_0.gguf");
    const std::string qwen = data("tiny-qwen2-q8_0.gguf");
    const tokenizer::Tokenizer a = tokenizer::Tokenizer::from_gguf(gguf::GgufFile::open(llama));
    const tokenizer::Tokenizer b = tokenizer::Tokenizer::from_gguf(gguf::GgufFile::open(qwen));
    EXPECT_NO_THROW(engine::check_same_vocab(a.vocab(), llama, a.vocab(), llama));
    try {
        engine::check_same_vocab(a.vocab(), llama, b.vocab(), qwen);
        FAIL() << "no error";
    } catch (const ConfigError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(llama), std::string::npos) << what;
        EXPECT_NE(what.find(qwen), std::string::npos) << what;
        EXPECT_NE(what.find("vocabular"), std::string::npos) << what;
    }
    const LoadConfig load{.model_path = llama, .mem = uint64_t{256} << 20};
    try {
        (void)engine::Engine::load(load, ContextConfig{.n_ctx = 256, .n_threads = 1}, nullptr, qwen);
        FAIL() << "no error";
    } catch (const ConfigError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(llama), std::string::npos) << what;
        EXPECT_NE(what.find(qwen), std::string::npos) << what;
    }
}

// The draft model's weights, KV cache and scratch are planned, the model is planned for what the
// budget leaves, and a budget that holds either alone but not both is refused before loading.
TEST(DraftModel, ThePlanAndTheBudgetIncludeTheDraft) {
    const std::string target = data("tiny-llama-q8_0.gguf");
    const std::string draft = data("tiny-llama-f16.gguf");
    const ContextConfig context{.n_ctx = 256, .n_outputs = 9, .n_threads = 1};
    const LoadConfig big{.model_path = target, .mem = uint64_t{256} << 20};
    const engine::PlanOnly alone = engine::plan_only(big, context, "test");
    const engine::PlanOnly both = engine::plan_only(big, context, "test", draft);
    ASSERT_TRUE(both.draft.has_value());
    EXPECT_FALSE(alone.draft.has_value());
    EXPECT_GT(both.draft->weights_resident, 0u);
    EXPECT_GT(both.draft->kv, 0u);
    EXPECT_GT(both.draft->scratch, 0u);
    EXPECT_EQ(both.draft->params.n_ctx, 256);
    EXPECT_EQ(both.draft->params.n_seq, 1);
    EXPECT_EQ(both.plan.params.budget, big.mem - both.draft->total());
    EXPECT_NE(both.budget_source.find("draft model"), std::string::npos) << both.budget_source;
    EXPECT_TRUE(both.plan.fits());
    EXPECT_EQ(both.plan.total(), alone.plan.total());

    // Room for the model alone, and for the draft alone, but not for both.
    const uint64_t mem = std::max(alone.plan.total(), both.draft->total()) + 4096;
    ASSERT_LT(mem, alone.plan.total() + both.draft->total());
    const LoadConfig tight{.model_path = target, .mem = mem};
    EXPECT_TRUE(engine::plan_only(tight, context, "test").plan.fits());
    EXPECT_FALSE(engine::plan_only(tight, context, "test", draft).plan.fits());
    EXPECT_THROW((void)engine::Engine::load(tight, context, nullptr, draft), DoesNotFitError);

    // Both loaded under one budget: the draft's pools are the same host's.
    const auto e = engine::Engine::load(big, context, nullptr, draft);
    ASSERT_NE(e->draft(), nullptr);
    EXPECT_EQ(&e->draft()->host(), &e->host());
    EXPECT_NE(e->plan_text().find("draft model"), std::string::npos);
    EXPECT_NE(e->peak_summary().find("draft model"), std::string::npos);
}

// The draft's plan counts what it adds and nothing twice: its weights, scratch and metadata once,
// its KV cache and row of logits once per slot (serve: a draft session each), and neither the
// runtime's fixed overhead nor a sampler (the model's plan has them; the draft proposes without
// one). What the two engines charge to the overhead pool is the two plans' overhead, exactly.
TEST(DraftModel, TheDraftsPlanIsExactForEachSlot) {
    const std::string target = data("tiny-llama-q8_0.gguf");
    const std::string draft = data("tiny-llama-f16.gguf");
    const ContextConfig context{.n_ctx = 256, .n_outputs = 9, .n_threads = 1};
    const LoadConfig load{.model_path = target, .mem = uint64_t{256} << 20};
    const engine::PlanOnly one = engine::plan_only(load, context, "test", draft);
    const engine::PlanOnly three = engine::plan_only(load, context, "test", draft, 3);
    ASSERT_TRUE(one.draft && three.draft);
    // The draft model alone, planned as a model of its own (for the draft's context).
    const engine::PlanOnly own =
        engine::plan_only(LoadConfig{.model_path = draft, .mem = load.mem}, engine::draft_context(context), "test");
    const engine::Plan& d = *one.draft;
    EXPECT_EQ(d.draft_slots, 1);
    EXPECT_EQ(d.samplers, 0u);
    EXPECT_EQ(d.overhead, engine::kMetadataFactor * d.shape.metadata_bytes);
    EXPECT_GT(own.plan.samplers, 0u);
    EXPECT_EQ(own.plan.total() - d.total(), engine::kFixedOverhead + own.plan.samplers);
    EXPECT_EQ(d.kv, own.plan.kv);
    EXPECT_EQ(d.logits, own.plan.logits);

    const engine::Plan& d3 = *three.draft;
    EXPECT_EQ(d3.draft_slots, 3);
    EXPECT_EQ(d3.kv, 3 * d.kv);
    EXPECT_EQ(d3.logits, 3 * d.logits);
    EXPECT_EQ(d3.weights(), d.weights());
    EXPECT_EQ(d3.scratch, d.scratch);
    EXPECT_EQ(d3.overhead, d.overhead);
    EXPECT_EQ(three.plan.params.budget, load.mem - d3.total());
    EXPECT_NE(three.budget_source.find("for 3 slots"), std::string::npos) << three.budget_source;
    EXPECT_NE(engine::plan_text(d3, "test").find("for each of 3 slots"), std::string::npos);
    EXPECT_EQ(engine::plan_json(d3, "test")["settings"]["draft_slots"], 3);

    // Loaded: the overhead pool holds the two plans' overhead, no more.
    const auto e = engine::Engine::load(load, context, nullptr, draft, 3);
    ASSERT_NE(e->draft(), nullptr);
    EXPECT_EQ(e->draft()->plan().draft_slots, 3);
    EXPECT_EQ(e->draft()->plan().total(), d3.total());
    EXPECT_EQ(e->host().pool(memory::pool_names::kOverhead).live(), e->plan().overhead + d3.overhead);

    // A budget with room for one slot's draft but not three is refused, naming the slots.
    const uint64_t mem = one.plan.total() + d.total() + (d3.total() - d.total()) / 2;
    const LoadConfig tight{.model_path = target, .mem = mem};
    EXPECT_TRUE(engine::plan_only(tight, context, "test", draft, 1).plan.fits());
    EXPECT_FALSE(engine::plan_only(tight, context, "test", draft, 3).plan.fits());
    try {
        (void)engine::Engine::load(tight, context, nullptr, draft, 3);
        ADD_FAILURE() << "three slots' drafts fitted";
    } catch (const DoesNotFitError& err) {
        EXPECT_NE(std::string(err.what()).find("for 3 slots"), std::string::npos) << err.what();
    }
}

}  // namespace
}  // namespace fitllm
