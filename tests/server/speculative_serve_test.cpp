// `fitllm serve --lookup` and `-md`: the flags reach the scheduler of the model the registry loads, its rows
// of logits for the drafts are in the plan and charged as the buffer, /metrics counts the drafted
// and accepted tokens, and a request's speculative.n_max / n_min / p_min are read.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "engine/engine.h"
#include "memory/pool.h"
#include "server/api_error.h"
#include "server/metrics.h"
#include "server/model_registry.h"
#include "server/request.h"
#include "test_support.h"

namespace fitllm {
namespace {

std::string tiny_llama() {
    return (test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf").string();
}

server::RegistryOptions parse_serve(std::vector<std::string> args) {
    cli::ServeOptions o;
    cli::ArgParser p = cli::serve_parser(o);
    EXPECT_TRUE(p.parse(args));
    cli::validate(o);
    return cli::registry_options(o);
}

// The value of `name{model="..."}` in Prometheus text; -1 when absent.
double metric(const std::string& text, const std::string& name) {
    const std::string key = name + "{model=\"";
    const size_t at = text.find(key);
    if (at == std::string::npos) return -1;
    const size_t value = text.find("} ", at);
    return std::stod(text.substr(value + 2, text.find('\n', value) - value - 2));
}

TEST(ServeSpeculative, LookupReachesTheSchedulerAndTheMetricsCountIt) {
    const server::RegistryOptions options =
        parse_serve({"-m", tiny_llama(), "-c", "512", "-np", "2", "-t", "1", "--lookup", "--draft-max", "6"});
    ASSERT_TRUE(options.scheduler.lookup);
    EXPECT_EQ(options.scheduler.lookup->n_draft, 6);
    EXPECT_EQ(options.context.n_outputs, 2 * 7);  // a row for each slot's token and its drafts
    server::ModelRegistry registry(options);
    registry.load_startup_model();
    const auto m = registry.models().front().model;
    ASSERT_TRUE(m);
    const uint64_t rows = 2 * 7 * static_cast<uint64_t>(m->model().n_vocab());
    EXPECT_EQ(m->plan().logits, rows * sizeof(float));
    EXPECT_EQ(registry.device().pool(memory::pool_names::kLogits).live(),
              memory::PoolBuffer<float>::bytes_for(static_cast<size_t>(rows)));

    std::string text;
    for (int i = 0; i < 6; ++i) text += "one two three four five six seven eight. ";
    engine::GenerationParams p;
    p.max_tokens = 40;
    p.sampling.temperature = 0.0f;
    const engine::Job::Update u =
        m->scheduler().submit(m->engine().tokenizer().tokenize(text, true, false), p)->wait_all();
    EXPECT_EQ(u.n_generated, 40);
    server::Metrics metrics;
    const std::string out = metrics.prometheus_text(registry, {});
    const double drafted = metric(out, "fitllm_spec_drafted_total");
    const double accepted = metric(out, "fitllm_spec_accepted_total");
    EXPECT_GT(drafted, 0) << out;
    EXPECT_GT(accepted, 0) << out;
    EXPECT_LE(accepted, drafted);
    registry.shutdown();
}

TEST(ServeSpeculative, WithoutLookupNothingIsDrafted) {
    const server::RegistryOptions options = parse_serve({"-m", tiny_llama(), "-c", "256", "-np", "2", "-t", "1"});
    EXPECT_FALSE(options.scheduler.lookup);
    EXPECT_EQ(options.context.n_outputs, 0);
    server::ModelRegistry registry(options);
    registry.load_startup_model();
    server::Metrics metrics;
    EXPECT_EQ(metric(metrics.prometheus_text(registry, {}), "fitllm_spec_drafted_total"), 0);
    registry.shutdown();
}

// -md: the draft model is loaded with the model, planned for every slot (its KV cache and row of
// logits each), each slot drafts with it; the text is the server's without it, and /metrics counts
// the drafts.
TEST(ServeSpeculative, ADraftModelDraftsForEverySlot) {
    const std::string draft = (test::source_dir() / "tests/model/data/tiny-llama-q4_k_m.gguf").string();
    const server::RegistryOptions options = parse_serve({"-m", tiny_llama(), "-c", "512", "-np", "3", "-t", "1", "-md",
                                                         draft, "--draft-max", "5", "--draft-p-min", "0"});
    EXPECT_FALSE(options.scheduler.lookup);
    EXPECT_EQ(options.draft_model_path, draft);
    EXPECT_EQ(options.scheduler.draft.n_draft, 5);
    EXPECT_EQ(options.scheduler.draft.p_min, 0.0f);
    EXPECT_EQ(options.context.n_outputs, 3 * 6);
    server::ModelRegistry registry(options);
    registry.load_startup_model();
    const auto m = registry.models().front().model;
    ASSERT_TRUE(m);
    const engine::Engine* d = m->engine().draft();
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(d->plan().draft_slots, 3);
    // Three draft sessions' caches beside the model's, as planned.
    EXPECT_EQ(registry.device().pool(memory::pool_names::kKv).live(), m->scheduler().kv_bytes() + d->plan().kv);

    const server::RegistryOptions plain_options = parse_serve({"-m", tiny_llama(), "-c", "512", "-np", "3", "-t", "1"});
    server::ModelRegistry plain(plain_options);
    plain.load_startup_model();
    const auto pm = plain.models().front().model;
    std::vector<std::shared_ptr<engine::Job>> with, without;
    engine::GenerationParams p;
    p.max_tokens = 40;
    p.sampling.temperature = 0.0f;
    for (const char* text : {"Once upon a time", "The capital of France is", "one two three four five"}) {
        with.push_back(m->scheduler().submit(m->engine().tokenizer().tokenize(text, true, false), p));
        without.push_back(pm->scheduler().submit(pm->engine().tokenizer().tokenize(text, true, false), p));
    }
    for (size_t i = 0; i < with.size(); ++i) EXPECT_EQ(with[i]->wait_all().text, without[i]->wait_all().text) << i;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    server::Metrics metrics;
    const std::string out = metrics.prometheus_text(registry, {});
    EXPECT_GT(metric(out, "fitllm_spec_drafted_total"), 0) << out;
    EXPECT_GT(metric(out, "fitllm_spec_accepted_total"), 0) << out;
    EXPECT_LE(metric(out, "fitllm_spec_accepted_total"), metric(out, "fitllm_spec_drafted_total"));
    plain.shutdown();
    registry.shutdown();
}

TEST(ServeSpeculative, ADraftModelThatDoesNotFitIsRefusedWithItsNumbers) {
    const std::string draft = (test::source_dir() / "tests/model/data/tiny-llama-f16.gguf").string();
    // Room for the model, not for it and eight slots' drafts.
    const engine::PlanOnly alone =
        engine::plan_only(LoadConfig{.model_path = tiny_llama(), .mem = uint64_t{1} << 30},
                          ContextConfig{.n_ctx = 512, .n_seq = 8, .n_batch = 256, .n_threads = 1});
    const std::string mem = std::to_string(alone.plan.total() + (uint64_t{1} << 20));
    server::ModelRegistry registry(parse_serve(
        {"-m", tiny_llama(), "-c", "512", "-np", "8", "-t", "1", "--cache-prompts", "0", "--mem", mem, "-md", draft}));
    try {
        registry.load_startup_model();
        ADD_FAILURE() << "loaded";
    } catch (const server::ApiError& e) {
        EXPECT_EQ(e.status(), 507);
        const std::string what = e.what();
        EXPECT_NE(what.find("for the draft model"), std::string::npos) << what;
        EXPECT_NE(what.find("for 8 slots"), std::string::npos) << what;
    }
    registry.shutdown();
}

TEST(ServeSpeculative, BadFlagsAreRefused) {
    for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
             {"-m", tiny_llama(), "--lookup", "--draft-max", "0"},
             {"-m", tiny_llama(), "--lookup", "--lookup-ngram-min", "0"},
             {"-m", tiny_llama(), "--lookup", "--lookup-ngram-min", "4", "--lookup-ngram-max", "3"},
             {"-m", tiny_llama(), "--lookup", "-md", tiny_llama()},
             {"--models-dir", "/tmp", "-md", tiny_llama()},
             {"-m", tiny_llama(), "-md", tiny_llama(), "--draft-p-min", "2"}}) {
        cli::ServeOptions o;
        cli::ArgParser p = cli::serve_parser(o);
        EXPECT_ANY_THROW({
            p.parse(args);
            cli::validate(o);
        }) << args.back();
    }
}

TEST(ServeSpeculative, RequestFieldsOfLlamaServer) {
    using nlohmann::json;
    const auto parse = [](const json& body) { return server::parse_completion_request(body, /*chat=*/false); };
    const server::CompletionRequest plain = parse({{"prompt", "x"}});
    EXPECT_EQ(plain.params.draft_max, -1);
    EXPECT_EQ(plain.params.draft_min, 0);
    const server::CompletionRequest r = parse({{"prompt", "x"}, {"speculative.n_max", 4}, {"speculative.n_min", 2}});
    EXPECT_EQ(r.params.draft_max, 4);
    EXPECT_EQ(r.params.draft_min, 2);
    EXPECT_EQ(parse({{"prompt", "x"}, {"speculative.n_max", 0}}).params.draft_max, 0);
    const auto refused = [&](const json& body, const std::string& param) {
        try {
            parse(body);
            ADD_FAILURE() << "accepted: " << body.dump();
        } catch (const server::ApiError& e) {
            EXPECT_EQ(e.status(), 400);
            EXPECT_EQ(e.param().value_or(""), param) << e.what();
        }
    };
    refused({{"prompt", "x"}, {"speculative.n_max", -1}}, "speculative.n_max");
    refused({{"prompt", "x"}, {"speculative.n_max", "4"}}, "speculative.n_max");
    refused({{"prompt", "x"}, {"speculative.n_min", 300}}, "speculative.n_min");
    refused({{"prompt", "x"}, {"speculative.n_max", 2}, {"speculative.n_min", 3}}, "speculative.n_min");
    refused({{"prompt", "x"}, {"speculative.p_min", 1.5}}, "speculative.p_min");
    refused({{"prompt", "x"}, {"speculative.p_min", "0.5"}}, "speculative.p_min");
    EXPECT_EQ(plain.params.draft_p_min, -1.0f);
    EXPECT_EQ(parse({{"prompt", "x"}, {"speculative.p_min", 0.5}}).params.draft_p_min, 0.5f);
}

}  // namespace
}  // namespace fitllm
