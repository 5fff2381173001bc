// `fitllm serve --expert-cache N`: the flag reaches the model the registry loads, and /metrics
// reports its expert cache (slots, hits, misses, hit rate, bytes read per token); a model without
// one reports none of it.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "server/metrics.h"
#include "server/model_registry.h"
#include "test_support.h"

namespace fitllm {
namespace {

std::string data(const std::string& name) {
    return (test::source_dir() / "tests/model/data" / name).string();
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

TEST(ServeExpertCache, MetricsReportTheCache) {
    server::ModelRegistry registry(
        parse_serve({"-m", data("tiny-qwen3moe-q8_0.gguf"), "-c", "256", "-t", "1", "--expert-cache", "4"}));
    registry.load_startup_model();
    const auto m = registry.models().front().model;
    ASSERT_TRUE(m);
    EXPECT_EQ(m->plan().n_expert_slots, 4);
    server::Metrics metrics;
    std::string text = metrics.prometheus_text(registry, {});
    EXPECT_EQ(metric(text, "fitllm_expert_cache_slots"), 4) << text;
    // (loading warms the model up: some lookups already)
    const double hits0 = metric(text, "fitllm_expert_cache_hits_total");
    const double misses0 = metric(text, "fitllm_expert_cache_misses_total");
    ASSERT_GE(hits0, 0) << text;
    ASSERT_GE(misses0, 0) << text;

    // Three more tokens one at a time (the scheduler is idle): 2 experts x 2 layers looked up each.
    model::Model& model = m->engine().model();
    kv::ModelCache cache = model.make_cache({.n_cells = 64}, 1);
    std::vector<float> row(static_cast<size_t>(model.n_vocab()));
    for (int i = 0; i < 3; ++i) {
        model.forward(std::vector<int32_t>{11 + i}, std::vector<int32_t>{i}, cache, row.data(), false,
                      registry.compute().pool);
    }
    text = metrics.prometheus_text(registry, {});
    const double hits = metric(text, "fitllm_expert_cache_hits_total");
    const double misses = metric(text, "fitllm_expert_cache_misses_total");
    EXPECT_EQ(hits + misses - hits0 - misses0, 12) << text;
    EXPECT_GT(misses, 0) << text;
    EXPECT_DOUBLE_EQ(metric(text, "fitllm_expert_cache_hit_rate"), hits / (hits + misses));
    const double read = metric(text, "fitllm_expert_cache_read_bytes_total");
    EXPECT_GE(read, misses * 3 * 8704) << text;  // each miss: three Q8_0 slices of 8704 bytes
    EXPECT_GT(metric(text, "fitllm_expert_cache_read_bytes_per_token"), 0) << text;
    registry.shutdown();
}

TEST(ServeExpertCache, NoCacheNoMetrics) {
    server::ModelRegistry registry(parse_serve({"-m", data("tiny-qwen3moe-q8_0.gguf"), "-c", "256", "-t", "1"}));
    registry.load_startup_model();
    server::Metrics metrics;
    const std::string text = metrics.prometheus_text(registry, {});
    EXPECT_EQ(text.find("fitllm_expert_cache"), std::string::npos) << text;
    registry.shutdown();
}

}  // namespace
}  // namespace fitllm
