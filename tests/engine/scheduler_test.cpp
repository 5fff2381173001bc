// The continuous-batching scheduler without HTTP, on the tiny Llama: requests decoded together
// give what each gives alone (greedy), prompts fed in chunks, preemption under KV pressure
// (recompute, then resume), cancellation, the queue bound and the context check.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "engine/tiny_llama_scheduler.h"
#include "gguf/gguf_reader.h"
#include "memory/budget.h"
#include "memory/pool.h"
#include "model/model.h"
#include "sampling/grammar.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::engine {
namespace {

class SchedulerTest : public test_fixtures::TinyLlamaScheduler {
protected:
    static GenerationParams greedy(int max_tokens) {
        GenerationParams p;
        p.max_tokens = max_tokens;
        p.sampling.temperature = 0.0f;
        return p;
    }
    static Job::Update alone(const std::vector<int32_t>& prompt, int max_tokens, const ContextConfig& c) {
        return TinyLlamaScheduler::alone(prompt, greedy(max_tokens), c);
    }
};

TEST_F(SchedulerTest, RequestsDecodedTogetherGiveWhatEachGivesAlone) {
    std::string long_text;
    for (int i = 0; i < 40; ++i) long_text += "the story goes on and on ";
    const std::vector<std::vector<int32_t>> prompts = {ids("Once upon a time"), ids(long_text),
                                                       ids("The quick brown fox"), ids("In a hole")};
    ASSERT_GT(prompts[1].size(), 100u);  // fed in chunks of at most n_batch - (decoding sequences)
    const ContextConfig o{.n_ctx = 1024, .n_seq = 4, .n_batch = 32};
    std::vector<Job::Update> expected;
    for (const auto& p : prompts) expected.push_back(alone(p, 24, o));

    Scheduler s(*model_, *tokenizer_, o, {}, *compute_);
    std::vector<std::shared_ptr<Job>> jobs;
    for (const auto& p : prompts) jobs.push_back(s.submit(p, greedy(24)));
    for (size_t i = 0; i < jobs.size(); ++i) {
        const Job::Update u = jobs[i]->wait_all();
        EXPECT_EQ(u.reason, FinishReason::length);
        EXPECT_EQ(u.n_generated, 24);
        EXPECT_EQ(u.text, expected[i].text) << "request " << i;
    }
    const SchedulerStats st = s.stats();
    EXPECT_EQ(st.n_generated_tokens, 4u * 24u);
    EXPECT_EQ(st.n_preemptions, 0u);
    // Fewer forward passes than one request after the other would take (the long prompt alone is
    // several chunks of 32).
    EXPECT_LT(st.n_steps, 4u * 24u);
}

// The warm-up pass (n_batch tokens of id 0, at load) leaves no K transform behind: a quantized K's
// transform is fitted from the first request's keys, not from the same token over and over.
TEST_F(SchedulerTest, TheWarmUpFitsNoKeyTransform) {
    const ContextConfig o{.n_ctx = 256, .n_seq = 1, .n_batch = 32, .type_k = KvType::q4_0, .type_v = KvType::q4_0};
    Scheduler s(*model_, *tokenizer_, o, {}, *compute_);
    const kv::KvCache& pool = s.cache().pool(0);
    ASSERT_TRUE(pool.shapes_keys());
    for (int l = 0; l < pool.n_layer(); ++l) EXPECT_TRUE(pool.needs_key_calibration(l)) << "layer " << l;
    s.submit(ids("Once upon a time there was a little house by the river"), greedy(2))->wait_all();
    for (int l = 0; l < pool.n_layer(); ++l) EXPECT_NE(pool.key_transform(l), nullptr) << "layer " << l;
}

TEST_F(SchedulerTest, PreemptedSequenceIsRecomputedAndResumes) {
    // 2 slots in 96 cells (+ a block each): two requests of ~15 + 60 tokens cannot both stay.
    const ContextConfig o{.n_ctx = 96, .n_seq = 2, .n_batch = 64};
    const auto a = ids("Once upon a time");
    const auto b = ids("The quick brown");
    ASSERT_LE(a.size() + 60, 96u);
    ASSERT_LE(b.size() + 60, 96u);
    ASSERT_GT(a.size() + b.size() + 120, 96u + 32u);
    const Job::Update ea = alone(a, 60, o), eb = alone(b, 60, o);

    // The tiny model decodes 60 tokens in a few milliseconds: on a busy machine the scheduler may
    // finish `a` before `b` is submitted, and nothing is preempted. Try a few times for the two to
    // overlap; every try must give each request its text alone.
    bool preempted = false;
    for (int attempt = 0; attempt < 10 && !preempted; ++attempt) {
        Scheduler s(*model_, *tokenizer_, o, {}, *compute_);
        auto ja = s.submit(a, greedy(60));
        auto jb = s.submit(b, greedy(60));
        const Job::Update ua = ja->wait_all(), ub = jb->wait_all();
        EXPECT_EQ(ua.text, ea.text);
        EXPECT_EQ(ub.text, eb.text);
        EXPECT_EQ(ub.n_generated, 60);
        EXPECT_EQ(ua.n_preemptions + ub.n_preemptions, static_cast<int>(s.stats().n_preemptions));
        if (s.stats().n_preemptions == 0) continue;
        EXPECT_EQ(ua.n_preemptions, 0);  // the older one keeps its cells
        preempted = true;
    }
    EXPECT_TRUE(preempted) << "the two requests never overlapped in 10 tries";
}

TEST_F(SchedulerTest, CancelledRequestFreesItsSlot) {
    Scheduler s(*model_, *tokenizer_, {.n_ctx = 1024, .n_seq = 1, .n_batch = 256}, {}, *compute_);
    auto long_job = s.submit(ids("Once upon a time"), greedy(900));
    while (long_job->wait(std::chrono::milliseconds(100)).text.empty()) {
    }
    long_job->cancel();
    const auto start = std::chrono::steady_clock::now();
    const Job::Update u = s.submit(ids("Hello"), greedy(4))->wait_all();
    EXPECT_EQ(u.n_generated, 4);
    EXPECT_EQ(long_job->wait_all().reason, FinishReason::cancelled);
    EXPECT_LT(long_job->wait_all().n_generated, 900);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
    // The cells are released and the stats published after the step that finished the job.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (s.stats().kv_cells_used != 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(s.stats().kv_cells_used, 0);
}

TEST_F(SchedulerTest, LogprobsOfTheSampledTokens) {
    Scheduler s(*model_, *tokenizer_, {.n_ctx = 256, .n_seq = 1, .n_batch = 64}, {}, *compute_);
    GenerationParams p = greedy(12);
    p.top_logprobs = 4;
    const Job::Update u = s.submit(ids("Once upon a time"), p)->wait_all();
    ASSERT_EQ(u.reason, FinishReason::length);
    ASSERT_EQ(u.logprobs.size(), 12u);  // one a sampled token
    std::vector<int32_t> generated;
    for (const TokenLogprob& e : u.logprobs) {
        ASSERT_EQ(e.top.size(), 4u);
        EXPECT_EQ(e.top[0].first, e.id);  // greedy takes the best
        EXPECT_FLOAT_EQ(e.top[0].second, e.logprob);
        EXPECT_LE(e.logprob, 0.0f);
        double mass = 0.0;
        for (size_t i = 0; i < e.top.size(); ++i) {
            if (i > 0) {
                EXPECT_GE(e.top[i - 1].second, e.top[i].second);
            }
            mass += std::exp(static_cast<double>(e.top[i].second));
        }
        EXPECT_LE(mass, 1.0 + 1e-5);
        generated.push_back(e.id);
    }
    EXPECT_EQ(tokenizer_->detokenize(generated, false, false), u.text);                      // the tokens of the text
    EXPECT_TRUE(s.submit(ids("Once upon a time"), greedy(4))->wait_all().logprobs.empty());  // not asked for
}

TEST_F(SchedulerTest, PenaltiesCountThePromptOnlyWhenAsked) {
    // OpenAI's presence/frequency penalties look at the generated text (penalize_prompt false);
    // llama.cpp's at the last penalty_last_n tokens, prompt included. A prompt of every ordinary
    // token but the first 8 of the vocabulary, and a frequency penalty that no logit survives: a
    // first token sampled from the prompt's tokens only happens when the prompt is not counted.
    const int n_vocab = model_->n_vocab();
    std::vector<int32_t> prompt = ids("");
    for (int32_t id = 8; id < n_vocab; ++id) {
        if (!tokenizer_->vocab().is_eog(id)) prompt.push_back(id);
    }
    Scheduler s(*model_, *tokenizer_, {.n_ctx = n_vocab + 16, .n_seq = 1, .n_batch = 64}, {}, *compute_);
    const auto first_token = [&](float frequency, bool penalize_prompt, uint64_t seed) {
        GenerationParams p;
        p.max_tokens = 1;
        p.top_logprobs = 0;
        p.sampling.temperature = 1.0f;
        p.sampling.seed = seed;
        p.sampling.penalty_last_n = n_vocab;
        p.sampling.frequency_penalty = frequency;
        p.penalize_prompt = penalize_prompt;
        const Job::Update u = s.submit(prompt, p)->wait_all();
        return u.logprobs.empty() ? -1 : u.logprobs[0].id;
    };
    const auto in_prompt = [&](int32_t id) { return std::find(prompt.begin(), prompt.end(), id) != prompt.end(); };
    int n_from_prompt = 0;
    for (uint64_t seed = 1; seed <= 8; ++seed) {
        const int32_t plain = first_token(0.0f, true, seed);
        n_from_prompt += in_prompt(plain) ? 1 : 0;
        EXPECT_EQ(first_token(100.0f, false, seed), plain) << seed;  // nothing generated yet to penalize
        EXPECT_FALSE(in_prompt(first_token(100.0f, true, seed))) << seed;
    }
    EXPECT_GT(n_from_prompt, 0) << "the prompt holds almost every token: unpenalized draws come from it";
}

TEST_F(SchedulerTest, TheGrammarVocabularyIsChargedToTheBudget) {
    memory::Device host("host", uint64_t{1} << 34);
    Scheduler s(*model_, *tokenizer_, {.n_ctx = 64, .n_seq = 1, .n_batch = 16}, {}, *compute_, &host);
    memory::Pool& overhead = host.pool(memory::pool_names::kOverhead);
    const uint64_t before = overhead.live();
    const auto vocab = s.grammar_vocab();
    ASSERT_TRUE(vocab);
    EXPECT_EQ(overhead.live() - before, vocab->memory_bytes());
    EXPECT_EQ(s.grammar_vocab(), vocab);  // built once
    EXPECT_EQ(overhead.live() - before, vocab->memory_bytes());
}

TEST_F(SchedulerTest, FullQueueRefusesAndTooLongRequestIsRefused) {
    Scheduler s(*model_, *tokenizer_, {.n_ctx = 256, .n_seq = 1, .n_batch = 256}, {.max_queue = 1}, *compute_);
    auto running = s.submit(ids("Once upon a time"), greedy(200));
    while (s.stats().n_active == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto waiting = s.submit(ids("a"), greedy(2));
    EXPECT_THROW(s.submit(ids("b"), greedy(2)), QueueFullError);
    running->cancel();
    EXPECT_EQ(waiting->wait_all().n_generated, 2);

    try {
        s.submit(ids("Once upon a time"), greedy(256));
        FAIL() << "prompt + max_tokens over n_ctx was accepted";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("256"), std::string::npos) << e.what();
    }
    EXPECT_THROW(s.submit({}, greedy(2)), std::invalid_argument);
}

// SchedulerOptions::gather_gap: after a busy spell that decoded requests together, requests that
// come to the idle scheduler close together share the step that computes their prompts; a slot
// filled ends the wait; a request after a spell of one request alone does not wait.
TEST_F(SchedulerTest, RequestsThatComeTogetherShareTheStepOfTheirPrompts) {
    using Clock = std::chrono::steady_clock;
    const auto seconds_since = [](Clock::time_point t) {
        return std::chrono::duration<double>(Clock::now() - t).count();
    };
    SchedulerOptions options;
    options.gather_gap = std::chrono::milliseconds(1500);
    options.gather_max = std::chrono::milliseconds(3000);
    Scheduler s(*model_, *tokenizer_, {.n_ctx = 512, .n_seq = 3, .n_batch = 64}, options, *compute_);
    // A spell of two requests decoded together (nothing before it: no wait).
    // Two choices of one prompt, queued at once: decoded together (they give 24 tokens or more,
    // RequestsDecodedTogetherGiveWhatEachGivesAlone), so the spell is shared.
    for (const auto& job : s.submit_group(ids("Once upon a time"), {greedy(24), greedy(24)})) job->wait_all();
    while (!s.idle()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the scheduler waits for work

    // Two requests 100 ms apart: one step computes both prompts (each wants one token).
    const uint64_t steps = s.stats().n_steps;
    const Clock::time_point start = Clock::now();
    auto c = s.submit(ids("In a hole in the ground"), greedy(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto d = s.submit(ids("It was a dark night"), greedy(1));
    EXPECT_EQ(c->wait_all().n_generated, 1);
    EXPECT_EQ(d->wait_all().n_generated, 1);
    EXPECT_EQ(s.stats().n_steps, steps + 1);
    EXPECT_GE(seconds_since(start), 1.5);  // one slot was left: it waited gather_gap after d
    while (!s.idle()) std::this_thread::sleep_for(std::chrono::milliseconds(1));

    // A lone request after that spell waits once; then the spell was one request's: no wait.
    Clock::time_point t = Clock::now();
    EXPECT_EQ(s.submit(ids("Hello"), greedy(1))->wait_all().n_generated, 1);
    EXPECT_GE(seconds_since(t), 1.5);
    while (!s.idle()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    t = Clock::now();
    EXPECT_EQ(s.submit(ids("Hello again"), greedy(1))->wait_all().n_generated, 1);
    EXPECT_LT(seconds_since(t), 1.0);
}

// The wait ends once the slots are taken, and a request that comes while others decode never waits.
TEST_F(SchedulerTest, GatheringStopsWhenTheSlotsAreTakenAndNeverDelaysDecoding) {
    using Clock = std::chrono::steady_clock;
    SchedulerOptions options;
    options.gather_gap = std::chrono::milliseconds(3000);
    options.gather_max = std::chrono::milliseconds(6000);
    Scheduler s(*model_, *tokenizer_, {.n_ctx = 512, .n_seq = 2, .n_batch = 64}, options, *compute_);
    // Two choices of one prompt, queued at once: decoded together (they give 24 tokens or more,
    // RequestsDecodedTogetherGiveWhatEachGivesAlone), so the spell is shared.
    for (const auto& job : s.submit_group(ids("Once upon a time"), {greedy(24), greedy(24)})) job->wait_all();
    while (!s.idle()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));

    const uint64_t steps = s.stats().n_steps;
    Clock::time_point start = Clock::now();
    auto c = s.submit(ids("In a hole in the ground"), greedy(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto d = s.submit(ids("It was a dark night"), greedy(1));
    c->wait_all();
    d->wait_all();
    EXPECT_EQ(s.stats().n_steps, steps + 1);
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 2.5);  // both slots taken: no more wait
    while (!s.idle()) std::this_thread::sleep_for(std::chrono::milliseconds(1));

    // The spell was shared, so the next request waits for company; one that comes while it
    // decodes joins the running batch at once.
    auto e = s.submit(ids("Far away"), greedy(200));
    while (e->wait(std::chrono::milliseconds(100)).text.empty() && !s.idle()) {
    }
    start = Clock::now();
    EXPECT_EQ(s.submit(ids("Nearby"), greedy(1))->wait_all().n_generated, 1);
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 2.5);
    e->cancel();
}

}  // namespace
}  // namespace fitllm::engine
