// `fitllm serve --lookup`: the flags reach the scheduler of the model the registry loads, its rows
// of logits for the drafts are in the plan and charged as the buffer, /metrics counts the drafted
// and accepted tokens, and a request's speculative.n_max / speculative.n_min are read (p_min, a
// draft model's, is refused: serve has none).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
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

TEST(ServeSpeculative, BadFlagsAreRefused) {
    for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
             {"-m", tiny_llama(), "--lookup", "--draft-max", "0"},
             {"-m", tiny_llama(), "--lookup", "--lookup-ngram-min", "0"},
             {"-m", tiny_llama(), "--lookup", "--lookup-ngram-min", "4", "--lookup-ngram-max", "3"}}) {
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
    refused({{"prompt", "x"}, {"speculative.p_min", 0.5}}, "speculative.p_min");
}

}  // namespace
}  // namespace fitllm
