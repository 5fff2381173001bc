// `fitllm plan`: the executable end to end, text and JSON, --fit, bad input.
#include "engine/plan.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_support.h"

namespace fitllm::cli {
namespace {

std::string tiny_llama() {
    return (test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf").string();
}

TEST(PlanCommand, TextTable) {
    const auto r = test::run_command(test::fitllm_exe() + " plan -m " + tiny_llama() + " -c 256 -b 64 -t 2 --mem 1G");
    ASSERT_EQ(r.status, 0) << r.output;
    for (const char* part : {"device host", "weights resident", "KV cache", "2 layers x 256 cells, f16/f16", "scratch",
                             "outputs", "logits: 1 x 450 floats", "overhead", "total", "budget", "1.00 GiB", "--mem 1G",
                             "fits               yes", "-c 256 -np 1 -b 64 -ctk f16 -ctv f16"}) {
        EXPECT_NE(r.output.find(part), std::string::npos) << "missing '" << part << "' in:\n" << r.output;
    }
}

TEST(PlanCommand, JsonHasTheSameNumbersAsThePlan) {
    const auto r = test::run_command(test::fitllm_exe() + " plan -m " + tiny_llama() +
                                     " -c 300 -np 2 -b 32 -ctk q8_0 -ctv q4_0 -t 2 --mem 512MiB --json");
    ASSERT_EQ(r.status, 0) << r.output;
    const auto j = nlohmann::json::parse(r.output);
    const auto file = gguf::GgufFile::open(tiny_llama());
    const engine::Plan p = engine::make_plan(engine::model_shape(file), {.n_ctx = 300,
                                                                         .n_seq = 2,
                                                                         .n_batch = 32,
                                                                         .type_k = quant::GgmlType::Q8_0,
                                                                         .type_v = quant::GgmlType::Q4_0,
                                                                         .n_threads = 2,
                                                                         .budget = 512ull << 20});
    EXPECT_EQ(j["settings"]["type_k"], "q8_0");
    EXPECT_EQ(j["settings"]["n_outputs"], 2);
    const auto& host = j["devices"][0];
    EXPECT_EQ(host["name"], "host");
    EXPECT_EQ(host["weights_resident"].get<uint64_t>(), p.weights_resident);
    EXPECT_EQ(host["kv"].get<uint64_t>(), p.kv);
    EXPECT_EQ(host["scratch"].get<uint64_t>(), p.scratch);
    EXPECT_EQ(host["logits"].get<uint64_t>(), p.logits);
    EXPECT_EQ(host["overhead"].get<uint64_t>(), p.overhead);
    EXPECT_EQ(host["total"].get<uint64_t>(), p.total());
    EXPECT_EQ(host["budget"].get<uint64_t>(), 512ull << 20);
    EXPECT_EQ(host["fits"], true);
    EXPECT_FALSE(j.contains("fit"));
}

// -md with -np N: the draft as serve -md runs it, a KV cache and a row of logits per slot; the
// model's rows of logits for every slot's drafts (within -b).
TEST(PlanCommand, ADraftModelWithSlotsIsPlannedAsServeRunsIt) {
    const std::string draft = (test::source_dir() / "tests/model/data/tiny-llama-f16.gguf").string();
    const auto plan = [&](const std::string& np) {
        const auto r = test::run_command(test::fitllm_exe() + " plan -m " + tiny_llama() + " -md " + draft +
                                         " -c 256 -b 64" + np + " -t 2 --mem 1G --json");
        EXPECT_EQ(r.status, 0) << r.output;
        return nlohmann::json::parse(r.output);
    };
    const auto one = plan(""), three = plan(" -np 3");
    EXPECT_EQ(one["draft"]["settings"]["draft_slots"], 1);
    EXPECT_EQ(three["draft"]["settings"]["draft_slots"], 3);
    EXPECT_EQ(three["draft"]["devices"][0]["kv"].get<uint64_t>(), 3 * one["draft"]["devices"][0]["kv"].get<uint64_t>());
    EXPECT_EQ(three["draft"]["devices"][0]["weights_resident"], one["draft"]["devices"][0]["weights_resident"]);
    EXPECT_EQ(one["settings"]["n_outputs"], 9);
    EXPECT_EQ(three["settings"]["n_outputs"], 27);
}

TEST(PlanCommand, FitSaysWhatItChoseAndWhy) {
    const auto file = gguf::GgufFile::open(tiny_llama());
    engine::PlanParams q8{.n_ctx = 65536,
                          .n_batch = 64,
                          .type_k = quant::GgmlType::Q8_0,
                          .type_v = quant::GgmlType::Q8_0,
                          .n_threads = 2};
    const uint64_t budget = engine::make_plan(engine::model_shape(file), q8).total();
    const std::string cmd =
        test::fitllm_exe() + " plan -m " + tiny_llama() + " -c 65536 -b 64 -t 2 --mem " + std::to_string(budget);
    const auto without = test::run_command(cmd);
    EXPECT_EQ(without.status, 3) << without.output;  // does not fit
    EXPECT_NE(without.output.find("fits               no"), std::string::npos) << without.output;

    const auto r = test::run_command(cmd + " --fit");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("--fit: KV cache f16/f16 -> q8_0/q8_0"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("why: over budget by"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("-ctk q8_0 -ctv q8_0"), std::string::npos) << r.output;

    const auto j = nlohmann::json::parse(test::run_command(cmd + " --fit --json").output);
    EXPECT_EQ(j["fit"].size(), 1u);
    EXPECT_EQ(j["devices"][0]["total"].get<uint64_t>(), budget);
}

TEST(PlanCommand, DefaultBudgetComesFromTheSystem) {
    const auto r = test::run_command(test::fitllm_exe() + " plan -m " + tiny_llama() + " -c 256 --json");
    ASSERT_EQ(r.status, 0) << r.output;
    const auto j = nlohmann::json::parse(r.output);
    EXPECT_GT(j["devices"][0]["budget"].get<uint64_t>(), 0u);
    EXPECT_NE(j["devices"][0]["budget_source"].get<std::string>().find("less margin"), std::string::npos);
}

TEST(PlanCommand, BadInputIsAUsageError) {
    const auto bad_mem = test::run_command(test::fitllm_exe() + " plan -m " + tiny_llama() + " --mem 12X 2>&1");
    EXPECT_EQ(bad_mem.status, 2);
    EXPECT_NE(bad_mem.output.find("--mem: bad size '12X'"), std::string::npos) << bad_mem.output;
    const auto bad_type = test::run_command(test::fitllm_exe() + " plan -m " + tiny_llama() + " -ctk q3 2>&1");
    EXPECT_EQ(bad_type.status, 2) << bad_type.output;
    const auto no_model = test::run_command(test::fitllm_exe() + " plan 2>&1");
    EXPECT_EQ(no_model.status, 2) << no_model.output;
    const auto bad_batch = test::run_command(test::fitllm_exe() + " plan -m " + tiny_llama() + " -b 0 --mem 1G 2>&1");
    EXPECT_EQ(bad_batch.status, 2) << bad_batch.output;
}

}  // namespace
}  // namespace fitllm::cli
