// Speculative decoding with a draft model in the continuous-batching scheduler
// (SchedulerOptions::draft_model; serve -md): a ModelDrafter per slot. Greedy text the same as
// without drafts with every slot busy (prompts fed in chunks beside the drafts), through the prompt
// cache and preemption; sampled text from the model's distribution (a two-sample test); a
// cancelled request and finished ones leave no draft cells behind; the draft's sessions are
// charged to the budget.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/scheduler.h"
#include "engine/speculative_checks.h"
#include "gguf/gguf_reader.h"
#include "memory/device.h"
#include "memory/pool.h"
#include "model/model.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::engine {
namespace {

struct Loaded {
    explicit Loaded(const std::string& name)
        : file(gguf::GgufFile::open((test::source_dir() / "tests/model/data" / name).string())),
          tokenizer(tokenizer::Tokenizer::from_gguf(file)),
          model(model::Model::load(file)) {}
    gguf::GgufFile file;
    tokenizer::Tokenizer tokenizer;
    std::unique_ptr<model::Model> model;
};

class SchedulerDraftTest : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        target_ = new Loaded("tiny-llama-q8_0.gguf");
        draft_ = new Loaded("tiny-llama-q4_k_m.gguf");
        compute_ = new Compute(2);
    }
    static void TearDownTestSuite() {
        delete compute_;
        delete draft_;
        delete target_;
    }
    static std::vector<int32_t> ids(const std::string& text) { return target_->tokenizer.tokenize(text, true, false); }
    static GenerationParams greedy(int max_tokens) {
        GenerationParams p;
        p.max_tokens = max_tokens;
        p.sampling.temperature = 0.0f;
        return p;
    }
    // The draft model drafting up to n_draft tokens for every slot of context c.
    static SchedulerOptions with_draft(const ContextConfig& c, int n_draft = 6) {
        SchedulerOptions o;
        o.draft_model = draft_->model.get();
        o.draft_context = c;
        o.draft = DraftParams{.n_draft = n_draft, .p_min = 0.0f};
        return o;
    }
    static std::vector<Job::Update> run_all(Scheduler& s, const std::vector<std::vector<int32_t>>& prompts,
                                            const std::vector<GenerationParams>& params) {
        std::vector<std::shared_ptr<Job>> jobs;
        for (size_t i = 0; i < prompts.size(); ++i) jobs.push_back(s.submit(prompts[i], params[i]));
        std::vector<Job::Update> out;
        for (auto& j : jobs) out.push_back(j->wait_all());
        return out;
    }
    // The stats once the scheduler published what its last step did (a step behind a job's end).
    static SchedulerStats settled(const Scheduler& s) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        return s.stats();
    }

    inline static Loaded* target_ = nullptr;
    inline static Loaded* draft_ = nullptr;
    inline static Compute* compute_ = nullptr;
};

TEST_F(SchedulerDraftTest, GreedyTextIsTheSameWithEverySlotDrafting) {
    std::string long_text;
    for (int i = 0; i < 30; ++i) long_text += "the story goes on and on and on ";
    const std::vector<std::vector<int32_t>> prompts = {ids("Once upon a time there was"), ids(long_text),
                                                       ids("The capital of France is"), ids("one two three four")};
    ASSERT_GT(prompts[1].size(), 100u);
    const ContextConfig c{.n_ctx = 1024, .n_seq = 4, .n_batch = 48, .n_outputs = 4 * 7, .n_cached_prompts = 4};
    const std::vector<GenerationParams> params(prompts.size(), greedy(40));

    Scheduler plain(*target_->model, target_->tokenizer, c, {}, *compute_);
    const std::vector<Job::Update> expected = run_all(plain, prompts, params);
    Scheduler spec(*target_->model, target_->tokenizer, c, with_draft(c), *compute_);
    const std::vector<Job::Update> got = run_all(spec, prompts, params);
    for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(got[i].text, expected[i].text) << "request " << i;
        EXPECT_EQ(got[i].n_generated, expected[i].n_generated) << "request " << i;
        EXPECT_EQ(got[i].reason, expected[i].reason) << "request " << i;
    }
    SchedulerStats st = settled(spec);
    EXPECT_GT(st.n_drafted, 0u);
    EXPECT_GT(st.n_draft_accepted, 0u);
    EXPECT_LE(st.n_draft_accepted, st.n_drafted);
    EXPECT_LT(st.n_steps, plain.stats().n_steps);  // accepted drafts are tokens without a pass
    EXPECT_EQ(st.draft_cells_used, 0) << "finished requests left draft cells behind";

    // The prompt cache: a request that extends a finished one takes its cells in the model's
    // cache; the draft model computes the prefix again, and the text is the same.
    std::vector<int32_t> longer = prompts[0];
    const std::vector<int32_t> more = ids(" a small village by the sea");
    longer.insert(longer.end(), more.begin() + 1, more.end());  // (without its BOS)
    const Job::Update a = plain.submit(longer, greedy(30))->wait_all();
    const Job::Update b = spec.submit(longer, greedy(30))->wait_all();
    EXPECT_EQ(b.text, a.text);
    EXPECT_GT(b.n_cached, 0) << "the prompt cache was not used";
    st = settled(spec);
    EXPECT_GT(st.n_cache_hits, 0u);
    EXPECT_EQ(st.draft_cells_used, 0);

    // speculative.n_max 0: nothing drafted for that request.
    GenerationParams none = greedy(20);
    none.draft_max = 0;
    EXPECT_EQ(spec.submit(prompts[2], none)->wait_all().text, plain.submit(prompts[2], greedy(20))->wait_all().text);
    EXPECT_EQ(settled(spec).n_drafted, st.n_drafted);

    // speculative.p_min 1: the draft model stops after its first token (always drafted), so a step
    // checks one draft at most; the text is the same.
    GenerationParams strict = greedy(30);
    strict.draft_p_min = 1.0f;
    EXPECT_EQ(spec.submit(prompts[0], strict)->wait_all().text, plain.submit(prompts[0], greedy(30))->wait_all().text);
    const SchedulerStats after = settled(spec);
    EXPECT_GT(after.n_drafted, st.n_drafted);
    EXPECT_LE(after.n_drafted - st.n_drafted, after.n_steps - st.n_steps);
}

TEST_F(SchedulerDraftTest, ACancelledRequestFreesItsDraftCells) {
    const ContextConfig c{.n_ctx = 4096, .n_seq = 2, .n_batch = 64, .n_outputs = 2 * 7};
    Scheduler spec(*target_->model, target_->tokenizer, c, with_draft(c), *compute_);
    GenerationParams p = greedy(4000);
    // No end of text: it runs until cancelled.
    const tokenizer::Vocab& vocab = target_->tokenizer.vocab();
    for (int32_t id = 0; id < static_cast<int32_t>(vocab.size()); ++id) {
        if (vocab.is_eog(id)) p.sampling.logit_bias.emplace_back(id, -1000.0f);
    }
    const std::shared_ptr<Job> job = spec.submit(ids("Once upon a time"), p);
    // Wait until it is drafting: its slot's draft session holds cells.
    int cells = 0;
    for (int i = 0; i < 400 && cells == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        cells = spec.stats().draft_cells_used;
    }
    ASSERT_GT(cells, 0) << "the draft model never held cells";
    job->cancel();
    const Job::Update end = job->wait_all();
    ASSERT_EQ(end.reason, FinishReason::cancelled) << "it ended before it was cancelled";
    EXPECT_LT(end.n_generated, 4000);
    EXPECT_EQ(settled(spec).draft_cells_used, 0) << "the cancelled request's draft cells were not freed";
    // The slot serves the next request as if nothing had happened.
    Scheduler plain(*target_->model, target_->tokenizer, c, {}, *compute_);
    const std::vector<int32_t> prompt = ids("The capital of France is");
    EXPECT_EQ(spec.submit(prompt, greedy(30))->wait_all().text, plain.submit(prompt, greedy(30))->wait_all().text);
}

TEST_F(SchedulerDraftTest, PreemptedSequencesResumeWithTheirText) {
    // 2 slots in 160 cells: two requests of ~10 + 120 tokens cannot both stay.
    const ContextConfig c{.n_ctx = 160, .n_seq = 2, .n_batch = 64, .n_outputs = 2 * 7};
    const auto a = ids("Once upon a time there was");
    const auto b = ids("The capital of France is");
    Scheduler plain(*target_->model, target_->tokenizer, c, {}, *compute_);
    const std::string ea = plain.submit(a, greedy(120))->wait_all().text;
    const std::string eb = plain.submit(b, greedy(120))->wait_all().text;
    bool preempted = false;
    for (int attempt = 0; attempt < 10 && !preempted; ++attempt) {
        Scheduler s(*target_->model, target_->tokenizer, c, with_draft(c), *compute_);
        auto ja = s.submit(a, greedy(120));
        auto jb = s.submit(b, greedy(120));
        EXPECT_EQ(ja->wait_all().text, ea);
        EXPECT_EQ(jb->wait_all().text, eb);
        preempted = s.stats().n_preemptions > 0;
        EXPECT_EQ(settled(s).draft_cells_used, 0);
    }
    EXPECT_TRUE(preempted) << "the two requests never overlapped in 10 tries";
}

// Sampling (temperature 1, top-k 4): the tokens the draft model's drafts give follow the model's
// distribution: a two-sample chi-squared test per position against no drafts.
TEST_F(SchedulerDraftTest, SampledTokensFollowTheModelsDistribution) {
    const ContextConfig c{.n_ctx = 256, .n_seq = 4, .n_batch = 64, .n_outputs = 4 * 5};
    const std::vector<int32_t> prompt = ids("Once upon a time there was a");
    constexpr int kSamples = 400, kTokens = 5;
    const auto sample_all = [&](Scheduler& s) {
        std::vector<std::map<int32_t, int>> counts(kTokens);
        std::vector<std::shared_ptr<Job>> jobs;
        const auto take = [&] {
            for (auto& j : jobs) {
                const Job::Update u = j->wait_all();
                for (size_t t = 0; t < u.logprobs.size() && t < kTokens; ++t) ++counts[t][u.logprobs[t].id];
            }
            jobs.clear();
        };
        for (int i = 0; i < kSamples; ++i) {
            GenerationParams p;
            p.max_tokens = kTokens;
            p.top_logprobs = 0;
            p.sampling.temperature = 1.0f;
            p.sampling.top_k = 4;
            p.sampling.seed = 1000 + static_cast<uint64_t>(i);
            jobs.push_back(s.submit(prompt, p));
            if (jobs.size() == 32) take();
        }
        take();
        return counts;
    };
    Scheduler plain(*target_->model, target_->tokenizer, c, {.max_queue = 64}, *compute_);
    SchedulerOptions so = with_draft(c, 4);
    so.max_queue = 64;
    Scheduler spec(*target_->model, target_->tokenizer, c, so, *compute_);
    const auto a = sample_all(plain);
    const auto b = sample_all(spec);
    const SchedulerStats st = settled(spec);
    ASSERT_GT(st.n_drafted, 100u);
    EXPECT_GT(st.n_draft_accepted, 0u);
    EXPECT_LT(st.n_draft_accepted, st.n_drafted);  // rejections happened too
    test::expect_same_distribution(a, b);
}

// Each slot's draft session (its KV cache and row of logits) is charged to the device; lookup and
// a draft model together are refused.
TEST_F(SchedulerDraftTest, EachSlotsDraftSessionIsCharged) {
    const ContextConfig c{.n_ctx = 256, .n_seq = 3, .n_batch = 32, .n_outputs = 3 * 7};
    memory::Device with_draft_device("host", uint64_t{1} << 30);
    memory::Device plain_device("host", uint64_t{1} << 30);
    {
        Scheduler plain(*target_->model, target_->tokenizer, c, {}, *compute_, &plain_device);
        Scheduler spec(*target_->model, target_->tokenizer, c, with_draft(c), *compute_, &with_draft_device);
        const uint64_t draft_kv =
            with_draft_device.pool(memory::pool_names::kKv).live() - plain_device.pool(memory::pool_names::kKv).live();
        // One draft session alone.
        memory::Device one("host", uint64_t{1} << 30);
        const Session session(*draft_->model, draft_context(c), compute_->pool, &one);
        ASSERT_GT(one.pool(memory::pool_names::kKv).live(), 0u);
        EXPECT_EQ(draft_kv, 3 * one.pool(memory::pool_names::kKv).live());
        EXPECT_EQ(with_draft_device.pool(memory::pool_names::kLogits).live() -
                      plain_device.pool(memory::pool_names::kLogits).live(),
                  3 * one.pool(memory::pool_names::kLogits).live());
    }
    SchedulerOptions both = with_draft(c);
    both.lookup = LookupParams{};
    EXPECT_THROW(Scheduler(*target_->model, target_->tokenizer, c, both, *compute_), std::invalid_argument);
}

}  // namespace
}  // namespace fitllm::engine
