// `fitllm serve`'s flags reach the models it loads: the registry made from the parsed command line
// (cli::registry_options) loads each model through the engine with the serve command's whole
// LoadConfig and ContextConfig. Regression tests for what the server did before the engine layer:
// K/V rotation and spill flags accepted and dropped, a plan made without the thread count of its
// pool, logits charged as an up-front figure beside a plain vector.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/commands.h"
#include "engine/plan.h"
#include "memory/pool.h"
#include "server/model_registry.h"
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

TEST(ServeRegistry, KvFlagsReachTheSchedulersCache) {
    const test::TempDir spill;
    // The tiny Llama's heads hold 16 values: not whole blocks of q4_0, so K and V stay f32 here;
    // rotation and the spill are what the old server dropped.
    server::ModelRegistry registry(
        parse_serve({"-m", tiny_llama(), "-c", "8192", "-np", "2", "-t", "1", "--no-kv-rotation", "-ctk", "f32",
                     "--kv-spill-dir", spill.path().string(), "--kv-resident", "7M"}));
    registry.load_startup_model();
    const auto m = registry.models().front().model;
    ASSERT_TRUE(m);
    const kv::ModelCache& cache = m->scheduler().cache();
    const kv::CacheParams& params = cache.pool(0).params();
    EXPECT_FALSE(params.rotate);
    EXPECT_EQ(params.type_k, quant::GgmlType::F32);
    EXPECT_EQ(params.spill_dir, spill.path().string());
    EXPECT_GT(params.resident_limit, 0u);
    EXPECT_GT(m->plan().kv_spilled, 0u) << "the plan knows the spill too";
    EXPECT_EQ(cache.bytes(), m->plan().kv) << "the cache holds what the plan says";
    registry.shutdown();
}

TEST(ServeRegistry, ThePlanHasTheThreadsOfThePool) {
    for (const char* threads : {"1", "3"}) {
        server::ModelRegistry registry(parse_serve({"-m", tiny_llama(), "-c", "256", "-np", "2", "-t", threads}));
        registry.load_startup_model();
        const auto m = registry.models().front().model;
        EXPECT_EQ(m->plan().params.n_threads, registry.compute().pool.size()) << threads;
        EXPECT_EQ(registry.compute().pool.size(), std::stoi(threads));
        registry.shutdown();
    }
}

// The scheduler's logits are a buffer of the "logits" pool: what the pool holds is what the plan
// counts, one row per slot, charged once.
TEST(ServeRegistry, LogitsAreChargedAsTheirBuffer) {
    server::ModelRegistry registry(parse_serve({"-m", tiny_llama(), "-c", "256", "-np", "3", "-t", "1"}));
    registry.load_startup_model();
    const auto m = registry.models().front().model;
    const uint64_t rows = 3 * static_cast<uint64_t>(m->model().n_vocab());
    EXPECT_EQ(m->plan().logits, rows * sizeof(float));
    EXPECT_EQ(registry.device().pool(memory::pool_names::kLogits).live(),
              memory::PoolBuffer<float>::bytes_for(static_cast<size_t>(rows)));
    registry.shutdown();
}

// With a budget below the model's plan, --fit reaches the registry's models too.
TEST(ServeRegistry, FitReachesTheModels) {
    const auto plain = parse_serve({"-m", tiny_llama(), "-c", "16384", "-np", "1", "-t", "1"});
    server::ModelRegistry probe(plain);
    probe.load_startup_model();
    const uint64_t total = probe.models().front().model->plan().total();
    probe.shutdown();
    const std::string mem = std::to_string(total - total / 8);
    server::ModelRegistry tight(
        parse_serve({"-m", tiny_llama(), "-c", "16384", "-np", "1", "-t", "1", "--mem", mem, "--fit"}));
    tight.load_startup_model();
    const auto m = tight.models().front().model;
    EXPECT_TRUE(m->plan().fitted);
    EXPECT_FALSE(m->plan().fit_steps.empty());
    EXPECT_LE(m->plan().total(), tight.device().capacity());
    tight.shutdown();
}

}  // namespace
}  // namespace fitllm
