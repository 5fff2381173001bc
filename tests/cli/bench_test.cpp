// `fitllm bench` on a written tiny Llama: the pp and tg tests, KV options, -np's batched tg test.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "engine/engine.h"
#include "gguf/gguf_reader.h"
#include "model/tiny_llama.h"
#include "test_support.h"

namespace fitllm {
namespace {

TEST(BenchCommand, RunsWithKvOptionsAndParallelSequences) {
    const test::TempDir dir;
    const std::filesystem::path path = dir / "tiny-llama.gguf";
    test::write_file(path, test::tiny_llama_bytes({.rope_freqs = true}));
    const test::CommandResult r = test::run_command(test::fitllm_exe() + " bench -m '" + path.string() +
                                                    "' -p 8 -n 6 -r 1 -t 1 -np 3 -ctk bf16 -ctv f32 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    for (const char* want : {"KV cache: K BF16, V F32", "read bandwidth: ", "| pp8 |", "| tg6 |", "| tg6 x3 |"}) {
        EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
    }
    const test::CommandResult bad = test::run_command(test::fitllm_exe() + " bench -m x.gguf -np 0 2>&1");
    EXPECT_EQ(bad.status, 2) << bad.output;
}

// Each tg test's share of the measured read bandwidth: tokens/s x the weight bytes a token reads
// (every tensor but the token embeddings, which the tiny Llama's untied output leaves at one row)
// over the bandwidth; pp tests get none.
TEST(BenchCommand, TgTestsReportTheirShareOfTheReadBandwidth) {
    const std::string model = (test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf").string();
    const test::CommandResult r =
        test::run_command(test::fitllm_exe() + " bench -m " + model + " -p 8 -n 4 -r 2 -t 1 -np 2 -o json 2>/dev/null");
    ASSERT_EQ(r.status, 0) << r.output;
    const auto rows = nlohmann::json::parse(r.output);
    ASSERT_EQ(rows.size(), 3u) << r.output;
    const gguf::GgufFile file = gguf::GgufFile::open(model);
    ASSERT_NE(file.find_tensor("output.weight"), nullptr);
    uint64_t per_token = 0;
    for (const auto& t : file.tensors()) per_token += t.name == "token_embd.weight" ? 0 : t.n_bytes;
    for (const auto& row : rows) {
        const double bandwidth = row.at("read_bandwidth_bps").get<double>();
        EXPECT_GT(bandwidth, 0.0) << row;
        if (row.at("test") == "pp8") {
            EXPECT_FALSE(row.contains("bandwidth_share")) << row;
            continue;
        }
        const int per_pass = row.at("test") == "tg4 x2" ? 2 : 1;
        EXPECT_EQ(row.at("weights_read_per_token").get<uint64_t>(), per_token) << row;
        EXPECT_NEAR(row.at("bandwidth_share").get<double>(),
                    per_token * row.at("avg_ts").get<double>() / per_pass / bandwidth, 1e-9)
            << row;
    }
}

// The -np test's cache and logits are planned: a budget that holds the pp / tg tests' session but
// not the -np test's sequences is refused before loading (exit 3), where bench used to plan the
// session alone and fail half-way through with a budget error (exit 1).
TEST(BenchCommand, TheParallelTestIsPlannedToo) {
    const std::string model = (test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf").string();
    const LoadConfig load{.model_path = model};
    // The session: -p 8 -n 512, one sequence.
    const uint64_t session =
        engine::plan_only(load, {.n_ctx = 8 + 512 + 1, .n_batch = 512, .n_threads = 1}).plan.total();
    const uint64_t parallel =
        engine::plan_only(load, {.n_ctx = 16 * 512, .n_seq = 16, .n_batch = 512, .n_threads = 1}).plan.total();
    ASSERT_GT(parallel, session + (1u << 20));
    const std::string base = test::fitllm_exe() + " bench -m " + model + " -p 8 -n 512 -r 1 -t 1 -np 16 --mem ";
    const test::CommandResult refused = test::run_command(base + std::to_string(session + (512u << 10)) + " 2>&1");
    EXPECT_EQ(refused.status, 3) << refused.output;
    EXPECT_NE(refused.output.find("does not fit"), std::string::npos) << refused.output;
    const test::CommandResult ran = test::run_command(base + std::to_string(parallel + (512u << 10)) + " 2>&1");
    EXPECT_EQ(ran.status, 0) << ran.output;
    EXPECT_NE(ran.output.find("| tg512 x16 |"), std::string::npos) << ran.output;
}

}  // namespace
}  // namespace fitllm
