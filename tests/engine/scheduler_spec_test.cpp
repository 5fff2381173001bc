// Speculative decoding in the continuous-batching scheduler (SchedulerOptions::lookup): each
// decoding sequence drafts by prompt lookup and checks the drafts in the step's batch. Greedy text
// the same as without drafts (tiny Llama with prompts fed in chunks beside the drafts, tiny Gemma 2
// with its sliding-window pool, the demo model), sampled text from the model's distribution (a
// two-sample test), max_tokens, stop strings, logprobs, grammars, n choices, preemption and the
// prompt cache as without drafts, per-request limits, and the drafted / accepted counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/scheduler.h"
#include "engine/speculative_checks.h"
#include "gguf/gguf_reader.h"
#include "model/model.h"
#include "sampling/grammar.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::engine {
namespace {

struct Loaded {
    explicit Loaded(const std::string& path)
        : file(gguf::GgufFile::open(path)),
          tokenizer(tokenizer::Tokenizer::from_gguf(file)),
          model(model::Model::load(file)) {}
    gguf::GgufFile file;
    tokenizer::Tokenizer tokenizer;
    std::unique_ptr<model::Model> model;
};

class SchedulerSpecTest : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        llama_ = new Loaded((test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf").string());
        compute_ = new Compute(2);
    }
    static void TearDownTestSuite() {
        delete compute_;
        delete llama_;
    }
    static std::vector<int32_t> ids(const Loaded& m, const std::string& text) {
        return m.tokenizer.tokenize(text, true, false);
    }
    static GenerationParams greedy(int max_tokens) {
        GenerationParams p;
        p.max_tokens = max_tokens;
        p.sampling.temperature = 0.0f;
        return p;
    }
    static SchedulerOptions with_lookup(int n_draft = 8) {
        SchedulerOptions o;
        o.lookup = LookupParams{.n_draft = n_draft};
        return o;
    }
    // The prompts submitted together, their answers in order.
    static std::vector<Job::Update> run_all(Scheduler& s, const std::vector<std::vector<int32_t>>& prompts,
                                            const std::vector<GenerationParams>& params) {
        std::vector<std::shared_ptr<Job>> jobs;
        for (size_t i = 0; i < prompts.size(); ++i) jobs.push_back(s.submit(prompts[i], params[i]));
        std::vector<Job::Update> out;
        for (auto& j : jobs) out.push_back(j->wait_all());
        return out;
    }
    // Text that repeats, so that prompt lookup finds drafts the model accepts.
    static std::string repeating(int times) {
        std::string t;
        for (int i = 0; i < times; ++i) t += "one two three four five six seven eight nine ten. ";
        return t;
    }

    static Loaded* llama_;
    static Compute* compute_;
};
Loaded* SchedulerSpecTest::llama_ = nullptr;
Compute* SchedulerSpecTest::compute_ = nullptr;

// model::Batch::token_order_rows: a sequence's rows so flagged, in a batch beside another
// sequence's prompt chunk, give the logits of feeding its tokens one at a time, bit for bit (the
// k-quants' batch kernels would take a run of 8 or more otherwise); the chunk's rows are those
// it gives without the flags.
TEST_F(SchedulerSpecTest, TokenOrderRowsGiveTheOneTokenLogits) {
    Loaded m((test::source_dir() / "tests/model/data/tiny-llama-q4_k_m.gguf").string());
    const auto n_vocab = static_cast<size_t>(m.model->n_vocab());
    ops::ThreadPool& pool = compute_->pool;
    const std::vector<int32_t> chunk = ids(m, repeating(1));                            // sequence 0's prompt chunk
    const std::vector<int32_t> run = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22};  // sequence 1's
    ASSERT_GE(chunk.size(), 16u);
    // One at a time.
    std::vector<float> alone(run.size() * n_vocab);
    {
        kv::ModelCache cache = m.model->make_cache({.n_cells = 256, .n_seq_max = 2}, 64);
        for (size_t t = 0; t < run.size(); ++t) {
            const std::vector<int32_t> tok = {run[t]}, pos = {static_cast<int32_t>(t)};
            m.model->forward({.tokens = tok, .positions = pos}, cache, alone.data() + t * n_vocab, pool);
        }
    }
    // Together, with and without the flags.
    const auto together = [&](bool flags) {
        std::vector<int32_t> tokens, positions;
        std::vector<kv::SeqId> seqs;
        std::vector<uint8_t> output, order;
        for (size_t t = 0; t < chunk.size(); ++t) {
            tokens.push_back(chunk[t]);
            positions.push_back(static_cast<int32_t>(t));
            seqs.push_back(0);
            output.push_back(t + 1 == chunk.size() ? 1 : 0);
            order.push_back(0);
        }
        for (size_t t = 0; t < run.size(); ++t) {
            tokens.push_back(run[t]);
            positions.push_back(static_cast<int32_t>(t));
            seqs.push_back(1);
            output.push_back(1);
            order.push_back(flags ? 1 : 0);
        }
        kv::ModelCache cache = m.model->make_cache({.n_cells = 256, .n_seq_max = 2}, 64);
        std::vector<float> logits((run.size() + 1) * n_vocab);
        m.model->forward({.tokens = tokens,
                          .positions = positions,
                          .seq_ids = seqs,
                          .output = output,
                          .token_order_rows = flags ? std::span<const uint8_t>(order) : std::span<const uint8_t>()},
                         cache, logits.data(), pool);
        return logits;
    };
    const std::vector<float> flagged = together(true), plain = together(false);
    EXPECT_EQ(0, std::memcmp(flagged.data() + n_vocab, alone.data(), alone.size() * sizeof(float)))
        << "the flagged rows are not the one-token logits";
    EXPECT_EQ(0, std::memcmp(flagged.data(), plain.data(), n_vocab * sizeof(float)))
        << "the chunk's row changed with the other sequence's flags";
    if (std::memcmp(plain.data() + n_vocab, alone.data(), alone.size() * sizeof(float)) == 0) {
        std::printf("(without the flags the rows are the one-token logits too on this machine)\n");
    }
    // A flag per token, or none.
    const std::vector<int32_t> tok = {1, 2}, pos = {0, 1};
    const std::vector<uint8_t> one = {1};
    kv::ModelCache cache = m.model->make_cache({.n_cells = 64}, 16);
    std::vector<float> out(n_vocab);
    EXPECT_THROW(m.model->forward({.tokens = tok, .positions = pos, .token_order_rows = one}, cache, out.data(), pool),
                 std::invalid_argument);
}

TEST_F(SchedulerSpecTest, GreedyTextIsTheSameWithDraftsBesidePromptChunks) {
    const Loaded& m = *llama_;
    // A long prompt fed in chunks while the others decode with drafts in the same passes.
    std::string long_text;
    for (int i = 0; i < 30; ++i) long_text += "the story goes on and on and on ";
    const std::vector<std::vector<int32_t>> prompts = {ids(m, repeating(6)), ids(m, long_text),
                                                       ids(m, "Once upon a time"), ids(m, repeating(3) + "one two")};
    ASSERT_GT(prompts[1].size(), 100u);
    const ContextConfig c{.n_ctx = 1024, .n_seq = 4, .n_batch = 48, .n_outputs = 4 * 9};
    const std::vector<GenerationParams> params(prompts.size(), greedy(40));

    Scheduler plain(*m.model, m.tokenizer, c, {}, *compute_);
    const std::vector<Job::Update> expected = run_all(plain, prompts, params);
    Scheduler spec(*m.model, m.tokenizer, c, with_lookup(8), *compute_);
    const std::vector<Job::Update> got = run_all(spec, prompts, params);
    for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(got[i].text, expected[i].text) << "request " << i;
        EXPECT_EQ(got[i].n_generated, expected[i].n_generated) << "request " << i;
        EXPECT_EQ(got[i].reason, expected[i].reason) << "request " << i;
    }
    // Alone too (its prompt fed in one pass, no neighbours).
    const std::vector<Job::Update> alone = run_all(spec, {prompts[0]}, {params[0]});
    EXPECT_EQ(alone[0].text, expected[0].text);

    const SchedulerStats st = spec.stats();
    EXPECT_GT(st.n_drafted, 0u);
    EXPECT_GT(st.n_draft_accepted, 0u);
    EXPECT_LE(st.n_draft_accepted, st.n_drafted);
    EXPECT_EQ(st.n_generated_tokens, plain.stats().n_generated_tokens + static_cast<uint64_t>(alone[0].n_generated));
    // Accepted drafts are tokens without a pass of their own.
    EXPECT_LT(st.n_steps, plain.stats().n_steps + static_cast<uint64_t>(alone[0].n_generated));
    EXPECT_EQ(plain.stats().n_drafted, 0u);
}

TEST_F(SchedulerSpecTest, GreedyTextIsTheSameWithASlidingWindowPool) {
    // Tiny Gemma 2: a window of 32 positions in a pool of its own, trimmed after every pass, so
    // taking back rejected drafts must leave what the next token sees.
    Loaded gemma((test::source_dir() / "tests/model/data/tiny-gemma2-q8_0.gguf").string());
    const ContextConfig c{.n_ctx = 512, .n_seq = 2, .n_batch = 32, .n_outputs = 2 * 9};
    const std::vector<std::vector<int32_t>> prompts = {ids(gemma, repeating(4)), ids(gemma, "Once upon a time")};
    const std::vector<GenerationParams> params(prompts.size(), greedy(120));
    Scheduler plain(*gemma.model, gemma.tokenizer, c, {}, *compute_);
    ASSERT_GT(plain.cache().n_pools(), 1) << "the window layers should have a pool of their own";
    const std::vector<Job::Update> expected = run_all(plain, prompts, params);
    Scheduler spec(*gemma.model, gemma.tokenizer, c, with_lookup(8), *compute_);
    const std::vector<Job::Update> got = run_all(spec, prompts, params);
    for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(got[i].text, expected[i].text) << "request " << i;
        EXPECT_EQ(got[i].n_generated, expected[i].n_generated) << "request " << i;
    }
    EXPECT_GT(spec.stats().n_draft_accepted, 0u);
    EXPECT_EQ(spec.stats().n_preemptions, 0u);  // the window slack fits the pool
}

TEST_F(SchedulerSpecTest, MaxTokensStopStringsLogprobsAndPerRequestLimits) {
    const Loaded& m = *llama_;
    const ContextConfig c{.n_ctx = 512, .n_seq = 2, .n_batch = 64, .n_outputs = 2 * 11};
    const std::vector<int32_t> prompt = ids(m, repeating(5));
    Scheduler plain(*m.model, m.tokenizer, c, {}, *compute_);
    Scheduler spec(*m.model, m.tokenizer, c, with_lookup(10), *compute_);

    // max_tokens: never a token more, whatever the drafts would give.
    for (const int n : {1, 2, 3, 7, 11, 23}) {
        const Job::Update a = plain.submit(prompt, greedy(n))->wait_all();
        const Job::Update b = spec.submit(prompt, greedy(n))->wait_all();
        EXPECT_EQ(b.n_generated, n);
        EXPECT_EQ(b.reason, FinishReason::length);
        EXPECT_EQ(b.text, a.text) << n;
    }
    ASSERT_GT(spec.stats().n_draft_accepted, 0u);

    // A stop string in the middle of what a draft pass gives: the text ends before it.
    const Job::Update full = plain.submit(prompt, greedy(40))->wait_all();
    ASSERT_GT(full.text.size(), 20u);
    GenerationParams stopping = greedy(40);
    stopping.stop = {full.text.substr(12, 4)};
    const Job::Update a = plain.submit(prompt, stopping)->wait_all();
    const Job::Update b = spec.submit(prompt, stopping)->wait_all();
    EXPECT_EQ(a.reason, FinishReason::stop);
    EXPECT_EQ(b.reason, FinishReason::stop);
    EXPECT_EQ(b.text, a.text);
    EXPECT_EQ(b.text.find(stopping.stop[0]), std::string::npos);

    // Logprobs: one per token, the same as without drafts.
    GenerationParams lp = greedy(30);
    lp.top_logprobs = 3;
    const Job::Update la = plain.submit(prompt, lp)->wait_all();
    const Job::Update lb = spec.submit(prompt, lp)->wait_all();
    ASSERT_EQ(lb.logprobs.size(), 30u);
    ASSERT_EQ(la.logprobs.size(), 30u);
    for (size_t i = 0; i < la.logprobs.size(); ++i) {
        EXPECT_EQ(lb.logprobs[i].id, la.logprobs[i].id) << i;
        EXPECT_EQ(lb.logprobs[i].logprob, la.logprobs[i].logprob) << i;
        EXPECT_EQ(lb.logprobs[i].top, la.logprobs[i].top) << i;
    }

    // speculative.n_max 0: no drafts for that request; n_min above what lookup finds: none either.
    const uint64_t drafted = spec.stats().n_drafted;
    GenerationParams none = greedy(20);
    none.draft_max = 0;
    EXPECT_EQ(spec.submit(prompt, none)->wait_all().text, plain.submit(prompt, greedy(20))->wait_all().text);
    GenerationParams fussy = greedy(20);
    fussy.draft_min = 10;
    fussy.draft_max = 10;
    const std::vector<int32_t> short_prompt = ids(m, "Once upon a time");
    EXPECT_EQ(spec.submit(short_prompt, fussy)->wait_all().text,
              plain.submit(short_prompt, greedy(20))->wait_all().text);
    // Publishing lags a step behind the job's end.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(spec.stats().n_drafted, drafted);
    GenerationParams few = greedy(20);
    few.draft_max = 2;
    EXPECT_EQ(spec.submit(prompt, few)->wait_all().text, plain.submit(prompt, greedy(20))->wait_all().text);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_GT(spec.stats().n_drafted, drafted);
}

TEST_F(SchedulerSpecTest, GrammarChoicesAndThePromptCacheAsWithoutDrafts) {
    const Loaded& m = *llama_;
    ContextConfig c{.n_ctx = 1024, .n_seq = 4, .n_batch = 64, .n_outputs = 4 * 9};
    c.n_cached_prompts = 4;
    const std::vector<int32_t> prompt = ids(m, repeating(5));
    Scheduler plain(*m.model, m.tokenizer, c, {}, *compute_);
    Scheduler spec(*m.model, m.tokenizer, c, with_lookup(8), *compute_);

    // A grammar: every drafted token is checked against it (the sampler's mask).
    GenerationParams g = greedy(30);
    g.sampling.grammar = sampling::Grammar::parse("root ::= (\" one\" | \" two\" | \" three\" | \".\")+");
    const Job::Update ga = plain.submit(prompt, g)->wait_all();
    const Job::Update gb = spec.submit(prompt, g)->wait_all();
    EXPECT_EQ(gb.text, ga.text);
    EXPECT_EQ(gb.n_generated, ga.n_generated);

    // n choices of one prompt: each as the request alone.
    const std::string alone = plain.submit(prompt, greedy(24))->wait_all().text;
    auto group = spec.submit_group(prompt, {greedy(24), greedy(24), greedy(24)});
    for (auto& j : group) EXPECT_EQ(j->wait_all().text, alone);

    // The prompt cache: the request again, and its continuation, start from kept cells (which
    // must hold no rejected draft) and give what they give without drafts.
    const Job::Update first = spec.submit(prompt, greedy(30))->wait_all();
    const Job::Update again = spec.submit(prompt, greedy(30))->wait_all();
    EXPECT_EQ(again.text, first.text);
    EXPECT_GT(again.n_cached, 0);
    std::vector<int32_t> longer = prompt;
    const std::vector<int32_t> answer = m.tokenizer.tokenize(first.text, false, false);
    longer.insert(longer.end(), answer.begin(), answer.end());
    const Job::Update cont_spec = spec.submit(longer, greedy(20))->wait_all();
    const Job::Update cont_plain = plain.submit(longer, greedy(20))->wait_all();
    EXPECT_EQ(cont_spec.text, cont_plain.text);
    EXPECT_GT(spec.stats().n_draft_accepted, 0u);
}

TEST_F(SchedulerSpecTest, PreemptedSequencesResumeWithTheirText) {
    const Loaded& m = *llama_;
    // 2 slots in 160 cells: two requests of ~50 + 100 tokens cannot both stay.
    const ContextConfig c{.n_ctx = 160, .n_seq = 2, .n_batch = 64, .n_outputs = 2 * 9};
    const auto a = ids(m, repeating(1));
    const auto b = ids(m, repeating(1) + "one two three");
    ASSERT_LE(a.size() + 100, 160u);
    ASSERT_LE(b.size() + 100, 160u);
    Scheduler plain(*m.model, m.tokenizer, c, {}, *compute_);
    const std::string ea = plain.submit(a, greedy(100))->wait_all().text;
    const std::string eb = plain.submit(b, greedy(100))->wait_all().text;
    bool preempted = false;
    for (int attempt = 0; attempt < 10 && !preempted; ++attempt) {
        Scheduler s(*m.model, m.tokenizer, c, with_lookup(8), *compute_);
        auto ja = s.submit(a, greedy(100));
        auto jb = s.submit(b, greedy(100));
        EXPECT_EQ(ja->wait_all().text, ea);
        EXPECT_EQ(jb->wait_all().text, eb);
        preempted = s.stats().n_preemptions > 0;
    }
    EXPECT_TRUE(preempted) << "the two requests never overlapped in 10 tries";
}

// Sampling (temperature 1, top-k 4): the tokens drafts give follow the model's distribution. A
// two-sample chi-squared test per position on the first tokens of many seeds, with and without
// drafts (the rule is exact, so only chance separates the two).
TEST_F(SchedulerSpecTest, SampledTokensFollowTheModelsDistribution) {
    const Loaded& m = *llama_;
    const ContextConfig c{.n_ctx = 256, .n_seq = 4, .n_batch = 64, .n_outputs = 4 * 7};
    const std::vector<int32_t> prompt = ids(m, repeating(4));
    constexpr int kSamples = 600, kTokens = 6;
    const auto sample_all = [&](Scheduler& s) {
        std::vector<std::map<int32_t, int>> counts(kTokens);
        std::vector<std::shared_ptr<Job>> jobs;
        for (int i = 0; i < kSamples; ++i) {
            GenerationParams p;
            p.max_tokens = kTokens;
            p.top_logprobs = 0;
            p.sampling.temperature = 1.0f;
            p.sampling.top_k = 4;
            p.sampling.seed = 1000 + static_cast<uint64_t>(i);
            jobs.push_back(s.submit(prompt, p));
            if (jobs.size() == 32) {
                for (auto& j : jobs) {
                    const Job::Update u = j->wait_all();
                    for (size_t t = 0; t < u.logprobs.size() && t < kTokens; ++t) ++counts[t][u.logprobs[t].id];
                }
                jobs.clear();
            }
        }
        for (auto& j : jobs) {
            const Job::Update u = j->wait_all();
            for (size_t t = 0; t < u.logprobs.size() && t < kTokens; ++t) ++counts[t][u.logprobs[t].id];
        }
        return counts;
    };
    Scheduler plain(*m.model, m.tokenizer, c, {.max_queue = 64}, *compute_);
    SchedulerOptions so = with_lookup(6);
    so.max_queue = 64;
    Scheduler spec(*m.model, m.tokenizer, c, so, *compute_);
    const auto a = sample_all(plain);
    const auto b = sample_all(spec);
    ASSERT_GT(spec.stats().n_drafted, 100u);
    EXPECT_GT(spec.stats().n_draft_accepted, 0u);
    EXPECT_LT(spec.stats().n_draft_accepted, spec.stats().n_drafted);  // rejections happened too
    test::expect_same_distribution(a, b);
}

// The demo model (Gemma 3 270M Q4_K_M: a window of 512 in pools of their own) on an edit of a text
// it is given, two requests at a time, past position 512.
TEST_F(SchedulerSpecTest, GreedyTextIsTheSameOnTheDemoModel) {
    const auto path = test::demo_model();
    if (!path) GTEST_SKIP() << "demo model not found (scripts/setup.sh assembles it)";
    Loaded demo(path->string());
    const std::string text =
        "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step. "
        "All that glitters is not gold. Actions speak louder than words. ";
    std::string a = "<start_of_turn>user\nRepeat this text exactly, word for word:\n\n";
    for (int i = 0; i < 12; ++i) a += text;
    a += "<end_of_turn>\n<start_of_turn>model\n";
    const std::string b =
        "<start_of_turn>user\nWrite the numbers from one to forty in words, separated by commas."
        "<end_of_turn>\n<start_of_turn>model\n";
    const std::vector<std::vector<int32_t>> prompts = {demo.tokenizer.tokenize(a, true, true),
                                                       demo.tokenizer.tokenize(b, true, true)};
    ASSERT_GT(prompts[0].size(), 420u);
    const ContextConfig c{.n_ctx = 2048, .n_seq = 2, .n_batch = 64, .n_outputs = 2 * 11};
    const std::vector<GenerationParams> params(2, greedy(120));
    Scheduler plain(*demo.model, demo.tokenizer, c, {}, *compute_);
    const std::vector<Job::Update> expected = run_all(plain, prompts, params);
    Scheduler spec(*demo.model, demo.tokenizer, c, with_lookup(10), *compute_);
    const std::vector<Job::Update> got = run_all(spec, prompts, params);
    for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(got[i].text, expected[i].text) << "request " << i;
        EXPECT_EQ(got[i].n_generated, expected[i].n_generated) << "request " << i;
    }
    EXPECT_GT(static_cast<int>(prompts[0].size()) + expected[0].n_generated, 512 + 16);
    const SchedulerStats st = spec.stats();
    EXPECT_GT(st.n_draft_accepted, st.n_generated_tokens / 4);
    EXPECT_LT(st.n_steps, plain.stats().n_steps);
    EXPECT_EQ(st.n_preemptions, 0u);
}

}  // namespace
}  // namespace fitllm::engine
