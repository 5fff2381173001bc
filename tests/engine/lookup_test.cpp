// Speculative decoding by prompt lookup (engine/lookup.h, Session::generate_lookup): the drafts
// it looks up, and greedy text token for token the same as generate()'s, with drafts accepted,
// on tiny models (sliding-window pools included), a small context, context shifts, and the demo.
#include "engine/lookup.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/session.h"
#include "engine/speculative_checks.h"
#include "fitllm/error.h"
#include "gguf/gguf_reader.h"
#include "model/model.h"
#include "model/tiny_gemma3.h"
#include "sampling/sampler.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace fitllm {
namespace {

using engine::LookupParams;
using test::expect_same;
using test::Generated;

TEST(LookupDraft, ProposesWhatFollowedTheLongestSuffixFoundEarlier) {
    std::vector<int32_t> out;
    const LookupParams p{.n_draft = 8, .ngram_min = 1, .ngram_max = 3};
    // "1 2 3" occurs at 0 followed by 4 5 6; the last 3 tokens are 1 2 3 again.
    const std::vector<int32_t> h = {1, 2, 3, 4, 5, 6, 9, 1, 2, 3};
    EXPECT_EQ(engine::lookup_draft(h, p, 2, out), 2);
    EXPECT_EQ(out, (std::vector<int32_t>{4, 5}));
    EXPECT_EQ(engine::lookup_draft(h, p, 8, out), 7);  // up to the end of the history: 4 5 6 9 1 2 3
    EXPECT_EQ(out, (std::vector<int32_t>{4, 5, 6, 9, 1, 2, 3}));
    // Longer suffixes first: "7 3" occurs at 2 (followed by 8), while "3" alone also occurs at 0 (followed by 5).
    const std::vector<int32_t> h2 = {3, 5, 7, 3, 8, 1, 7, 3};
    EXPECT_EQ(engine::lookup_draft(h2, p, 1, out), 1);
    EXPECT_EQ(out, (std::vector<int32_t>{8}));
    // Only single tokens asked for: the latest occurrence of "3" with a full continuation, at 3.
    const LookupParams one{.n_draft = 8, .ngram_min = 1, .ngram_max = 1};
    EXPECT_EQ(engine::lookup_draft(h2, one, 2, out), 2);
    EXPECT_EQ(out, (std::vector<int32_t>{8, 1}));
    // The latest occurrence is too close to the end for 3 tokens; an earlier one has them.
    const std::vector<int32_t> h3 = {4, 10, 11, 12, 4, 13, 4};
    EXPECT_EQ(engine::lookup_draft(h3, one, 3, out), 3);
    EXPECT_EQ(out, (std::vector<int32_t>{10, 11, 12}));
    // Nothing to find, or nothing asked for.
    EXPECT_EQ(engine::lookup_draft(std::vector<int32_t>{1, 2, 3}, p, 4, out), 0);
    EXPECT_TRUE(out.empty());
    EXPECT_EQ(engine::lookup_draft(h, p, 0, out), 0);
    EXPECT_EQ(engine::lookup_draft(std::vector<int32_t>{}, p, 4, out), 0);
    // ngram_min 2: a lone repeated token is not enough.
    const LookupParams two{.n_draft = 8, .ngram_min = 2, .ngram_max = 3};
    EXPECT_EQ(engine::lookup_draft(std::vector<int32_t>{5, 6, 7, 5}, two, 2, out), 0);
}

TEST(LookupDraft, ParametersOutOfRangeAreRefused) {
    EXPECT_NO_THROW(engine::check(LookupParams{}));
    EXPECT_THROW(engine::check(LookupParams{.n_draft = 0}), ConfigError);
    EXPECT_THROW(engine::check(LookupParams{.ngram_min = 0}), ConfigError);
    EXPECT_THROW(engine::check(LookupParams{.ngram_min = 3, .ngram_max = 2}), ConfigError);
    EXPECT_THROW(engine::check(LookupParams{.ngram_max = engine::kMaxLookupNgram + 1}), ConfigError);
}

// Greedy generation with or without lookup.
Generated generate(model::Model& m, ops::ThreadPool& pool, ContextConfig context, const std::vector<int32_t>& prompt,
                   int n_predict, const LookupParams* lookup, int32_t eog = -1, float repeat_penalty = 1.0f) {
    if (lookup != nullptr) context.n_outputs = lookup->n_draft + 1;
    engine::Session session(m, context, pool);
    sampling::SamplingParams sp;
    sp.temperature = 0.0f;
    sp.repeat_penalty = repeat_penalty;
    sp.penalty_last_n = 6;
    sampling::Sampler sampler(sp, m.n_vocab());
    Generated r;
    const auto is_eog = [eog](int32_t id) { return id == eog; };
    const auto on_token = [&](int32_t id) {
        r.tokens.push_back(id);
        return true;
    };
    r.stats = lookup != nullptr ? session.generate_lookup(prompt, n_predict, sampler, *lookup, is_eog, on_token)
                                : session.generate(prompt, n_predict, sampler, is_eog, on_token);
    r.n_past = session.n_past();
    return r;
}

std::vector<int32_t> repeating_prompt(int n_vocab, int period, int repeats) {
    std::vector<int32_t> p;
    for (int r = 0; r < repeats; ++r) {
        for (int i = 0; i < period; ++i) p.push_back((i * 7 + 3) % n_vocab);
    }
    p.push_back(3);  // the start of the pattern again
    return p;
}

struct TinyGemma {
    std::vector<std::byte> bytes = test::tiny_gemma3_bytes({.n_layer = 6});
    gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    std::unique_ptr<model::Model> model = model::Model::load(file);
    ops::ThreadPool pool{2};
};

// Tiny Gemma 3 with 5 sliding-window layers (window 4) whose pool is smaller than the context, so
// it is trimmed after every pass: taking back rejected drafts must leave what the next token
// sees (kv::ModelCache::set_window_slack).
TEST(Lookup, GreedyMatchesGenerateOnATinyModelWithWindowPools) {
    TinyGemma t;
    const ContextConfig context{.n_ctx = 256, .n_batch = 16};
    const std::vector<int32_t> prompt = repeating_prompt(t.model->n_vocab(), 6, 4);
    for (const int n_draft : {1, 3, 7}) {
        SCOPED_TRACE("n_draft " + std::to_string(n_draft));
        const LookupParams lookup{.n_draft = n_draft};
        const Generated plain = generate(*t.model, t.pool, context, prompt, 80, nullptr, -1, 1.5f);
        const Generated spec = generate(*t.model, t.pool, context, prompt, 80, &lookup, -1, 1.5f);
        expect_same(plain, spec);
        EXPECT_GT(spec.stats.n_accepted, 0);
        EXPECT_GT(spec.stats.n_draft_passes, 0);
    }
}

TEST(Lookup, GreedyStopsAtTheSameTokenWhenTheContextFillsOrAtEndOfGeneration) {
    TinyGemma t;
    const std::vector<int32_t> prompt = repeating_prompt(t.model->n_vocab(), 5, 3);
    const LookupParams lookup{.n_draft = 6};
    {
        const ContextConfig small{.n_ctx = 40, .n_batch = 16};
        const Generated plain = generate(*t.model, t.pool, small, prompt, 100, nullptr);
        const Generated spec = generate(*t.model, t.pool, small, prompt, 100, &lookup);
        EXPECT_TRUE(plain.stats.context_full);
        expect_same(plain, spec);
        EXPECT_GT(spec.stats.n_accepted, 0);
    }
    {
        // An end-of-generation token the greedy text reaches (its 30th token): both stop there.
        const ContextConfig context{.n_ctx = 256, .n_batch = 16};
        const Generated free = generate(*t.model, t.pool, context, prompt, 30, nullptr);
        const int32_t eog = free.tokens.back();
        const Generated plain = generate(*t.model, t.pool, context, prompt, 100, nullptr, eog);
        const Generated spec = generate(*t.model, t.pool, context, prompt, 100, &lookup, eog);
        EXPECT_LE(plain.tokens.size(), 30u);
        expect_same(plain, spec);
    }
}

TEST(Lookup, GreedyMatchesGenerateThroughContextShifts) {
    TinyGemma t;
    ContextConfig context{.n_ctx = 48, .n_batch = 16};
    context.context_shift = true;
    context.n_keep = 4;
    const std::vector<int32_t> prompt = repeating_prompt(t.model->n_vocab(), 6, 3);
    const LookupParams lookup{.n_draft = 5};
    const Generated plain = generate(*t.model, t.pool, context, prompt, 150, nullptr);
    const Generated spec = generate(*t.model, t.pool, context, prompt, 150, &lookup);
    EXPECT_GT(plain.stats.n_shifts, 2);
    expect_same(plain, spec);
    EXPECT_GT(spec.stats.n_accepted, 0);
}

// A model from llama.cpp's converter and quantizer (Q4_K_M: the batched Q4_K kernels run on the
// draft passes), with a prompt that repeats.
TEST(Lookup, GreedyMatchesGenerateOnQuantizedTinyLlama) {
    for (const char* name : {"tiny-llama-q4_k_m.gguf", "tiny-qwen2-q8_0.gguf"}) {
        SCOPED_TRACE(name);
        const gguf::GgufFile file = gguf::GgufFile::open((test::source_dir() / "tests/model/data" / name).string());
        const auto model = model::Model::load(file);
        ops::ThreadPool pool{2};
        const std::vector<int32_t> prompt = repeating_prompt(model->n_vocab(), 9, 4);
        {
            const ContextConfig context{.n_ctx = 512, .n_batch = 32};
            const LookupParams lookup{.n_draft = 8};
            const Generated plain = generate(*model, pool, context, prompt, 96, nullptr);
            const Generated spec = generate(*model, pool, context, prompt, 96, &lookup);
            expect_same(plain, spec);
            EXPECT_GT(spec.stats.n_accepted, 0);
        }
        {
            // A cache of 64 cells for 37 + 150 tokens: shifts on the way.
            ContextConfig context{.n_ctx = 64, .n_batch = 32};
            context.context_shift = true;
            context.n_keep = 4;
            const LookupParams lookup{.n_draft = 8};
            const Generated plain = generate(*model, pool, context, prompt, 150, nullptr);
            const Generated spec = generate(*model, pool, context, prompt, 150, &lookup);
            EXPECT_GT(plain.stats.n_shifts, 1);
            expect_same(plain, spec);
            EXPECT_GT(spec.stats.n_accepted, 0);
        }
    }
}

// The demo model (Gemma 3 270M Q4_K_M: sliding window 512) on an edit of a text it is given, past
// position 512 so that its window pools trim while drafts are taken back. Draft passes run in the
// one-token arithmetic (model::Batch::token_order), so the tokens are the same.
TEST(Lookup, GreedyMatchesGenerateOnTheDemoModel) {
    const auto path = test::demo_model();
    if (!path) GTEST_SKIP() << "demo model not found (scripts/setup.sh assembles it)";
    const gguf::GgufFile file = gguf::GgufFile::open(path->string());
    const tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_gguf(file);
    const auto model = model::Model::load(file);
    ops::ThreadPool pool{2};
    std::string text =
        "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step. "
        "All that glitters is not gold. Actions speak louder than words. ";
    std::string prompt_text = "<start_of_turn>user\nRepeat this text exactly, word for word:\n\n";
    for (int i = 0; i < 12; ++i) prompt_text += text;
    prompt_text += "<end_of_turn>\n<start_of_turn>model\n";
    const std::vector<int32_t> prompt = tok.tokenize(prompt_text, true, true);
    ASSERT_GT(prompt.size(), 420u);
    const ContextConfig context{.n_ctx = 1024, .n_batch = 64};
    const LookupParams lookup{.n_draft = 10};
    const Generated plain = generate(*model, pool, context, prompt, 120, nullptr);
    const Generated spec = generate(*model, pool, context, prompt, 120, &lookup);
    EXPECT_GT(static_cast<int>(prompt.size()) + plain.stats.n_generated, 512 + 16);
    expect_same(plain, spec);
    EXPECT_GT(spec.stats.n_accepted, spec.stats.n_generated / 2);
}

}  // namespace
}  // namespace fitllm
