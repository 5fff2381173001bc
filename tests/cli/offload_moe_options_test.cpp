// --cpu-moe, --n-cpu-moe and -ot / --override-tensor on the commands: a mixture of experts offloaded
// to the virtual device with its routed experts on the host, or on the device, writes the CPU's
// text; the plan shows per device what is resident; what the forward pass cannot follow is refused
// naming the flag.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "test_support.h"

namespace fitllm {
namespace {

std::string tiny(const std::string& name) {
    return (test::source_dir() / "tests/model/data" / name).string();
}
bool has(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}
std::string text_of(const std::string& command) {
    const auto r = test::run_command(command + " 2>/dev/null");
    EXPECT_EQ(r.status, 0) << command << "\n" << r.output;
    return r.output;
}

TEST(OffloadMoeOptions, HostExpertsOnTheVirtualDeviceGiveTheSameText) {
    const std::string base = test::fitllm_exe() + " run -m " + tiny("tiny-qwen3moe-q4_k_m.gguf") +
                             " -p 'the quick brown fox' -n 12 --temp 0 -t 1 -c 256";
    const std::string cpu = text_of(base);
    ASSERT_FALSE(cpu.empty());
    for (int ngl = 1; ngl <= 3; ++ngl) {  // 2 layers; 3: the output layer too
        const std::string on = base + " --device virtual -ngl " + std::to_string(ngl);
        EXPECT_EQ(text_of(on + " --cpu-moe"), cpu) << ngl;
        EXPECT_EQ(text_of(on + " --n-cpu-moe 2 --no-kv-offload"), cpu) << ngl;
        EXPECT_EQ(text_of(on + " -ot 'ffn_(up|down)_exps=CPU' --override-tensor 'gate_exps=CPU'"), cpu) << ngl;
        EXPECT_EQ(text_of(on + " -ot '.*=CPU'"), cpu) << ngl;  // every matrix on the host: KV-only offload
        EXPECT_EQ(text_of(on + " --cpu-moe -ot 'attn_(q|output)=CPU'"), cpu) << ngl;
        // The experts on the device (llama.cpp's default with -ngl), all or some of them.
        EXPECT_EQ(text_of(on), cpu) << ngl;
        EXPECT_EQ(text_of(on + " --n-cpu-moe 1 --no-kv-offload"), cpu) << ngl;
        EXPECT_EQ(text_of(on + " -ot 'attn_q=CPU'"), cpu) << ngl;
    }
    // Without -ngl the device takes every layer that fits (no --vram: all), the experts on the host.
    EXPECT_EQ(text_of(base + " --device virtual --cpu-moe"), cpu);
}

// KV-only offload of a dense model (llama.cpp's -ngl 99 -ot '.*=CPU'): the CPU's text, and the plan
// keeps no matrix on the device.
TEST(OffloadMoeOptions, KvOnlyOffloadGivesTheSameTextAndPlansNoDeviceWeights) {
    const std::string base = test::fitllm_exe() + " run -m " + tiny("tiny-qwen2-q4_k_m.gguf") +
                             " -p 'the quick brown fox' -n 12 --temp 0 -t 1 -c 256";
    const std::string cpu = text_of(base);
    ASSERT_FALSE(cpu.empty());
    EXPECT_EQ(text_of(base + " --device virtual -ngl 99 -ot '.*=CPU'"), cpu);
    EXPECT_EQ(text_of(base + " --device virtual -ngl 99 -ot '.*=CPU' --no-kv-offload"), cpu);
    EXPECT_EQ(text_of(base + " --device virtual -ngl 2 -ot 'attn_(q|k|v)=CPU'"), cpu);
    EXPECT_EQ(text_of(base + " --device virtual --unified -ngl 99 -ot '.*=CPU'"), cpu);
    const auto r = test::run_command(test::fitllm_exe() + " plan -m " + tiny("tiny-qwen2-q4_k_m.gguf") +
                                     " -c 256 --device virtual -ngl 99 -ot '.*=CPU' --json 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    const auto j = nlohmann::json::parse(r.output);
    const auto& d = j["devices"].back();
    EXPECT_GT(d["host_matrices"].get<int>(), 0) << r.output;
    // Only the 1-D norm weights and biases, which follow their layer.
    EXPECT_LT(d["weights"].get<uint64_t>() * 20, d["host_matrix_bytes"].get<uint64_t>()) << r.output;
    EXPECT_GT(d["kv"].get<uint64_t>(), 0u) << r.output;
    EXPECT_EQ(d["output"], false) << r.output;
}

TEST(OffloadMoeOptions, RefusalsNameTheFlag) {
    const std::string base =
        test::fitllm_exe() + " run -m " + tiny("tiny-qwen3moe-q8_0.gguf") + " -p 'a b' -n 2 -t 1 -c 256";
    // The expert cache serves the host's layers only.
    auto r = test::run_command(base + " --device virtual -ngl 3 --expert-cache 8 2>&1");
    EXPECT_NE(r.status, 0);
    EXPECT_TRUE(has(r.output, "expert cache") && has(r.output, "offload device (virtual)")) << r.output;
    r = test::run_command(base + " --device virtual -ngl 3 -ot 'exps=cuda0' 2>&1");
    EXPECT_NE(r.status, 0);
    EXPECT_TRUE(has(r.output, "-ot 'exps=cuda0'") && has(r.output, "unknown device")) << r.output;
    r = test::run_command(base + " --device virtual -ngl 3 -ot 'exps' 2>&1");
    EXPECT_NE(r.status, 0);
    EXPECT_TRUE(has(r.output, "-ot 'exps'") && has(r.output, "REGEX=DEVICE")) << r.output;
    r = test::run_command(base + " --device virtual -ngl 3 -ot '(exps=CPU' 2>&1");
    EXPECT_NE(r.status, 0);
    EXPECT_TRUE(has(r.output, "-ot '(exps=CPU'") && has(r.output, "not a regular expression")) << r.output;
}

TEST(OffloadMoeOptions, PlanShowsPerDeviceWhatIsResident) {
    const std::string plan = test::fitllm_exe() + " plan -m " + tiny("tiny-qwen3moe-q8_0.gguf") +
                             " -c 256 --device virtual -ngl 3 --cpu-moe";
    const auto r = test::run_command(plan + " 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(has(r.output, "the routed experts of 2 offloaded layers")) << r.output;
    EXPECT_TRUE(has(r.output, "the routed experts of 2 of them stay on the host")) << r.output;
    const auto j = test::run_command(plan + " --json 2>/dev/null");
    ASSERT_EQ(j.status, 0) << j.output;
    const auto json = nlohmann::json::parse(j.output);
    const auto& dev = json.at("devices").at(1);
    EXPECT_EQ(dev.at("name"), "virtual");
    EXPECT_EQ(dev.at("host_expert_layers"), 2);
    EXPECT_GT(dev.at("host_experts").get<uint64_t>(), 0u);
    EXPECT_GT(dev.at("weights").get<uint64_t>(), 0u);
    EXPECT_GT(json.at("devices").at(0).at("weights_resident").get<uint64_t>(), dev.at("host_experts").get<uint64_t>());
    // bench takes the flags too.
    const auto b = test::run_command(test::fitllm_exe() + " bench -m " + tiny("tiny-qwen3moe-q8_0.gguf") +
                                     " -p 8 -n 4 -r 1 -t 1 --device virtual -ngl 3 --cpu-moe 2>&1");
    EXPECT_EQ(b.status, 0) << b.output;
}

}  // namespace
}  // namespace fitllm
