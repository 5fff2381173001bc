// Scheduler::submit_group(): n requests of one prompt (a server request's n choices) compute the
// prompt once, with or without the prompt cache, and each gives what it gives alone (greedy, or
// sampled with its own seed). On the tiny Llama.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/scheduler.h"
#include "engine/tiny_llama_scheduler.h"
#include "gguf/gguf_reader.h"
#include "model/model.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::engine {
namespace {

class SchedulerGroupTest : public test_fixtures::TinyLlamaScheduler {
protected:
    static std::vector<int32_t> long_prompt() {
        std::string text;
        for (int i = 0; i < 12; ++i) text += "the story goes on and on ";
        return tokenizer_->tokenize(text, true, false);
    }
    static GenerationParams params(int max_tokens, float temperature, uint64_t seed) {
        GenerationParams p;
        p.max_tokens = max_tokens;
        p.sampling.temperature = temperature;
        p.sampling.seed = seed;
        return p;
    }
    // The stats once nothing runs (the step after the last end publishes them).
    static SchedulerStats settled(const Scheduler& s) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while ((!s.idle() || s.stats().n_active != 0) && std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        return s.stats();
    }
};

TEST_F(SchedulerGroupTest, ThePromptIsComputedOnceWithOrWithoutThePromptCache) {
    const std::vector<int32_t> prompt = long_prompt();
    const int n_prompt = static_cast<int>(prompt.size());
    ASSERT_GT(n_prompt, 40);
    for (const int n_cached_prompts : {0, 3}) {
        SCOPED_TRACE("n_cached_prompts " + std::to_string(n_cached_prompts));
        const ContextConfig c{.n_ctx = 512, .n_seq = 3, .n_batch = 64, .n_cached_prompts = n_cached_prompts};
        const Job::Update expected = alone(prompt, params(12, 0.0f, 1), c);
        Scheduler s(*model_, *tokenizer_, c, {}, *compute_);
        const std::vector<std::shared_ptr<Job>> jobs =
            s.submit_group(prompt, {params(12, 0.0f, 1), params(12, 0.0f, 1), params(12, 0.0f, 1)});
        ASSERT_EQ(jobs.size(), 3u);
        for (size_t i = 0; i < jobs.size(); ++i) {
            const Job::Update u = jobs[i]->wait_all();
            EXPECT_EQ(u.reason, FinishReason::length) << "choice " << i;
            EXPECT_EQ(u.text, expected.text) << "choice " << i;
            EXPECT_EQ(u.n_prompt, n_prompt);
            // The first computes the prompt; the others take all of it but its last token.
            EXPECT_EQ(u.n_cached, i == 0 ? 0 : n_prompt - 1) << "choice " << i;
        }
        const SchedulerStats st = settled(s);
        EXPECT_EQ(st.n_prompt_tokens, static_cast<uint64_t>(n_prompt + 2));
        EXPECT_EQ(st.n_prompt_tokens_cached, static_cast<uint64_t>(2 * (n_prompt - 1)));
        EXPECT_EQ(st.n_generated_tokens, 3u * 12u);
    }
}

TEST_F(SchedulerGroupTest, EachSampledRequestGivesWhatItsSeedGivesAlone) {
    const std::vector<int32_t> prompt = long_prompt();
    const ContextConfig c{.n_ctx = 512, .n_seq = 2, .n_batch = 64, .n_cached_prompts = 2};
    const Job::Update a = alone(prompt, params(16, 1.0f, 42), c);
    const Job::Update b = alone(prompt, params(16, 1.0f, 43), c);
    EXPECT_NE(a.text, b.text);  // two seeds, two answers (else the test below proves nothing)
    Scheduler s(*model_, *tokenizer_, c, {}, *compute_);
    const auto jobs = s.submit_group(prompt, {params(16, 1.0f, 42), params(16, 1.0f, 43)});
    EXPECT_EQ(jobs[0]->wait_all().text, a.text);
    EXPECT_EQ(jobs[1]->wait_all().text, b.text);
}

TEST_F(SchedulerGroupTest, TheOthersGoOnWhenTheFirstIsCancelled) {
    const std::vector<int32_t> prompt = long_prompt();
    const ContextConfig c{.n_ctx = 512, .n_seq = 3, .n_batch = 16};
    const Job::Update expected = alone(prompt, params(6, 0.0f, 1), c);
    Scheduler s(*model_, *tokenizer_, c, {}, *compute_);
    const auto jobs = s.submit_group(prompt, {params(6, 0.0f, 1), params(6, 0.0f, 1), params(6, 0.0f, 1)});
    jobs[0]->cancel();  // while it feeds the prompt (in chunks of 16), or before
    EXPECT_EQ(jobs[0]->wait_all().reason, FinishReason::cancelled);
    for (size_t i = 1; i < jobs.size(); ++i) {
        const Job::Update u = jobs[i]->wait_all();
        EXPECT_EQ(u.reason, FinishReason::length) << "choice " << i;
        EXPECT_EQ(u.text, expected.text) << "choice " << i;
    }
}

TEST_F(SchedulerGroupTest, AGroupTheQueueCannotHoldIsRefusedWhole) {
    Scheduler s(*model_, *tokenizer_, {.n_ctx = 256, .n_seq = 2, .n_batch = 64}, {.max_queue = 2}, *compute_);
    const std::vector<int32_t> prompt = tokenizer_->tokenize("Once upon a time", true, false);
    try {
        s.submit_group(prompt, {params(2, 0.0f, 1), params(2, 0.0f, 1), params(2, 0.0f, 1)});
        FAIL() << "3 requests were queued in a queue of 2";
    } catch (const QueueFullError& e) {
        EXPECT_NE(std::string(e.what()).find("asks for 3"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(s.idle());  // none of them was queued
    const auto jobs = s.submit_group(prompt, {params(2, 0.0f, 1), params(2, 0.0f, 1)});
    for (const auto& j : jobs) EXPECT_EQ(j->wait_all().n_generated, 2);
    EXPECT_THROW(s.submit_group(prompt, {}), std::invalid_argument);
}

}  // namespace
}  // namespace fitllm::engine
