// The public API (include/fitllm/fitllm.h, fitllm_c.h) through libfitllm.so, as a program links
// it: the same text as the engine's own session, the errors with their numbers, the C ABI's status
// codes, one generation at a time.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fitllm/fitllm.h"
#include "fitllm/fitllm_c.h"
#include "test_support.h"

namespace fitllm {
namespace {

std::string tiny_llama() {
    return (test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf").string();
}

Engine load_tiny() {
    return Engine::load({.model_path = tiny_llama(), .mem = 64u << 20}, {.n_ctx = 256, .n_threads = 1});
}

TEST(Api, GeneratesStreamsAndReusesItsCache) {
    Engine engine = load_tiny();
    EXPECT_EQ(engine.architecture(), "llama");
    EXPECT_EQ(engine.context().n_ctx, 256);
    const GenerateOptions greedy{.max_tokens = 12, .sampling = {.temperature = 0}};
    std::string streamed;
    const Completion c = engine.generate("Once upon a time", greedy, [&](std::string_view piece) {
        streamed += piece;
        return true;
    });
    EXPECT_EQ(streamed, c.text);
    EXPECT_EQ(c.tokens.size(), 12u);
    EXPECT_EQ(c.finish_reason, FinishReason::length);
    EXPECT_EQ(c.n_prompt_fed, c.n_prompt);
    // The same prompt again: its last token is computed again for its logits, the rest reused.
    const Completion again = engine.generate("Once upon a time", greedy);
    EXPECT_EQ(again.n_prompt_fed, 1);
    EXPECT_EQ(again.tokens.size(), 12u);
    // A callback returning false stops it.
    int pieces = 0;
    const Completion stopped =
        engine.generate("Once upon a time", greedy, [&](std::string_view) { return ++pieces < 2; });
    EXPECT_EQ(stopped.finish_reason, FinishReason::cancelled);
    EXPECT_LT(stopped.tokens.size(), 12u);
}

TEST(Api, OneGenerationAtATime) {
    Engine engine = load_tiny();
    Generation g = engine.start("Hello", {.max_tokens = 4});
    EXPECT_THROW(engine.generate("Hello"), Error);
    while (g.next()) {
    }
    EXPECT_TRUE(g.done());
    EXPECT_EQ(g.result().tokens.size(), 4u);
    EXPECT_NO_THROW(engine.generate("Hello", {.max_tokens = 2}));
}

TEST(Api, PlansAndReportsMemory) {
    const PlanReport plan = Engine::plan({.model_path = tiny_llama(), .mem = 64u << 20}, {.n_ctx = 256});
    EXPECT_TRUE(plan.fits);
    EXPECT_NE(plan.text.find("weights resident"), std::string::npos);
    Engine engine = load_tiny();
    engine.generate("Hello", {.max_tokens = 2});
    const MemoryReport m = engine.memory();
    ASSERT_FALSE(m.devices.empty());
    EXPECT_EQ(m.devices[0].name, "host");
    EXPECT_EQ(m.devices[0].capacity, 64u << 20);
    EXPECT_LE(m.devices[0].peak, m.devices[0].capacity);
    EXPECT_EQ(m.plan_total, engine.plan().total);
}

TEST(Api, ErrorsCarryTheirNumbers) {
    try {
        Engine::load({.model_path = tiny_llama(), .mem = 1u << 20});
        FAIL() << "a 1 MiB budget fit";
    } catch (const DoesNotFitError& e) {
        EXPECT_EQ(e.budget(), 1u << 20);
        EXPECT_GT(e.needed(), e.budget());
        EXPECT_NE(e.plan_text().find("fits               no"), std::string::npos);
    }
    EXPECT_THROW(Engine::load({.model_path = tiny_llama()}, {.n_seq = 0}), ConfigError);
    EXPECT_THROW(parse_kv_type("q9_9"), ConfigError);
    EXPECT_THROW(Engine::load({.model_path = "/nonexistent.gguf"}), Error);
    Engine engine = load_tiny();
    EXPECT_THROW(engine.generate("", {.add_special = false}), ConfigError);  // no tokens at all
}

TEST(Api, CAbiReportsStatusAndNumbers) {
    fitllm_load_config load = fitllm_load_config_default();
    const std::string path = tiny_llama();
    load.model_path = path.c_str();
    load.mem = 1u << 20;
    fitllm_engine* engine = nullptr;
    EXPECT_EQ(fitllm_engine_load(&load, nullptr, &engine), FITLLM_DOES_NOT_FIT);
    EXPECT_EQ(engine, nullptr);
    EXPECT_EQ(fitllm_last_error()->status, FITLLM_DOES_NOT_FIT);
    EXPECT_EQ(fitllm_last_error()->budget, 1u << 20);
    EXPECT_GT(fitllm_last_error()->bytes, 1u << 20);
    EXPECT_NE(std::string(fitllm_last_error()->message).find("does not fit"), std::string::npos);

    fitllm_context_config context = fitllm_context_config_default();
    context.type_k = "nope";
    load.mem = 64u << 20;
    EXPECT_EQ(fitllm_engine_load(&load, &context, &engine), FITLLM_CONFIG_ERROR);
    EXPECT_EQ(fitllm_engine_load(nullptr, nullptr, &engine), FITLLM_BAD_ARGUMENT);

    context.type_k = nullptr;
    context.n_ctx = 256;
    ASSERT_EQ(fitllm_engine_load(&load, &context, &engine), FITLLM_OK) << fitllm_last_error()->message;
    size_t n = 0;
    EXPECT_EQ(fitllm_tokenize(engine, "Hello world", false, false, nullptr, 0, &n), FITLLM_OK);
    std::vector<int32_t> ids(n);
    EXPECT_EQ(fitllm_tokenize(engine, "Hello world", false, false, ids.data(), ids.size(), &n), FITLLM_OK);
    char* text = nullptr;
    EXPECT_EQ(fitllm_detokenize(engine, ids.data(), ids.size(), &text), FITLLM_OK);
    EXPECT_STREQ(text, "Hello world");
    fitllm_string_free(text);

    fitllm_generate_options options = fitllm_generate_options_default();
    options.max_tokens = 8;
    options.temperature = 0;
    EXPECT_EQ(fitllm_generate(engine, "Once upon a time", &options, nullptr, nullptr, &text), FITLLM_OK);
    Engine cpp = load_tiny();
    EXPECT_EQ(std::string(text),
              cpp.generate("Once upon a time", {.max_tokens = 8, .sampling = {.temperature = 0}}).text);
    fitllm_string_free(text);
    EXPECT_EQ(fitllm_perplexity(engine, "too short", 64, -1, nullptr, nullptr), FITLLM_BAD_ARGUMENT);
    double ppl = 0;
    EXPECT_EQ(fitllm_perplexity(engine, "too short", 64, -1, &ppl, nullptr), FITLLM_CONFIG_ERROR);
    fitllm_engine_free(engine);
}

}  // namespace
}  // namespace fitllm
