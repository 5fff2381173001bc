// --device, -ngl, --vram and --no-kv-offload on the commands (run, bench, plan): the virtual device
// runs any number of the last layers with the same text as the CPU, the plan shows each device's
// share, a device budget that cannot hold the asked layers is refused before loading, --fit (or no
// -ngl) picks as many layers as fit --vram, and the run's summary shows the device's pools.
#include <gtest/gtest.h>

#include <string>

#include "test_support.h"

namespace fitllm {
namespace {

std::string fitllm_exe() {
    return std::string(FITLLM_BINARY_DIR) + "/fitllm";
}
std::string tiny(const std::string& name) {
    return (test::source_dir() / "tests/model/data" / name).string();
}
bool has(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}
// The generated text of a run (stdout), without the summary (stderr).
std::string text_of(const std::string& command) {
    const auto r = test::run_command(command + " 2>/dev/null");
    EXPECT_EQ(r.status, 0) << command << "\n" << r.output;
    return r.output;
}

TEST(OffloadOptions, EverySplitOnTheVirtualDeviceGivesTheSameText) {
    for (const char* model : {"tiny-llama-q8_0.gguf", "tiny-qwen2-q4_k_m.gguf"}) {
        const std::string base =
            fitllm_exe() + " run -m " + tiny(model) + " -p 'the quick brown fox' -n 12 --temp 0 -t 1 -c 256";
        const std::string cpu = text_of(base);
        ASSERT_FALSE(cpu.empty());
        for (int ngl = 0; ngl <= 3; ++ngl) {  // 2 layers; 3: the output layer too
            EXPECT_EQ(text_of(base + " --device virtual -ngl " + std::to_string(ngl)), cpu) << model << " -ngl " << ngl;
        }
        EXPECT_EQ(text_of(base + " --device virtual -ngl 3 --no-kv-offload"), cpu) << model;
    }
}

TEST(OffloadOptions, SummaryShowsTheDevicePoolsAndStaysWithinItsPlan) {
    const auto r = test::run_command(fitllm_exe() + " run -m " + tiny("tiny-llama-q8_0.gguf") +
                                     " -p 'a b c' -n 4 --temp 0 -t 1 -c 256 --device virtual -ngl 3 --vram 64M 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    for (const char* part : {"virtual: ", "weights", "kv", "scratch"}) {
        EXPECT_TRUE(has(r.output, part)) << "missing '" << part << "' in:\n" << r.output;
    }
}

TEST(OffloadOptions, PlanShowsEachDevice) {
    const auto r = test::run_command(fitllm_exe() + " plan -m " + tiny("tiny-llama-q8_0.gguf") +
                                     " -c 256 --device virtual -ngl 1 --vram 64M 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    for (const char* part : {"device host", "device virtual", "1 of 2 layers (-ngl 1)", "--vram"}) {
        EXPECT_TRUE(has(r.output, part)) << "missing '" << part << "' in:\n" << r.output;
    }
    const auto j = test::run_command(fitllm_exe() + " plan -m " + tiny("tiny-llama-q8_0.gguf") +
                                     " -c 256 --device virtual -ngl 3 --json 2>&1");
    ASSERT_EQ(j.status, 0) << j.output;
    for (const char* part : {"\"name\": \"virtual\"", "\"n_gpu_layers\": 3", "\"output\": true"}) {
        EXPECT_TRUE(has(j.output, part)) << "missing '" << part << "' in:\n" << j.output;
    }
}

TEST(OffloadOptions, ADeviceBudgetTooSmallIsRefusedOrFitted) {
    const std::string base = fitllm_exe() + " run -m " + tiny("tiny-llama-q8_0.gguf") +
                             " -p 'a b c' -n 4 --temp 0 -t 1 -c 256 --device virtual --vram 200K";
    const auto refused = test::run_command(base + " -ngl 3 2>&1");
    EXPECT_EQ(refused.status, 3) << refused.output;
    EXPECT_TRUE(has(refused.output, "device 'virtual'")) << refused.output;
    EXPECT_FALSE(has(refused.output, "prompt:")) << refused.output;  // before loading

    // Without -ngl: as many layers as fit (here fewer than all), and the same text.
    const auto fitted = test::run_command(base + " --fit 2>&1");
    ASSERT_EQ(fitted.status, 0) << fitted.output;
    EXPECT_TRUE(has(fitted.output, "--fit: offload ")) << fitted.output;
    EXPECT_TRUE(has(fitted.output, "layers to virtual")) << fitted.output;
}

TEST(OffloadOptions, BadValuesAreUsageErrors) {
    const std::string base = fitllm_exe() + " run -m " + tiny("tiny-llama-q8_0.gguf") + " -p a -n 1 -t 1";
    for (const char* args : {" -ngl -1", " -ngl x", " --device nosuch -ngl 1", " --device virtual --vram 12Q"}) {
        const auto r = test::run_command(base + args + " 2>&1");
        EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
    }
    // -ngl without a device on a machine without a GPU says what to do.
    const auto r = test::run_command(base + " -ngl 2 2>&1");
    if (r.status == 0) GTEST_SKIP() << "a CUDA device is present: -ngl used it";
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_TRUE(has(r.output, "--device virtual")) << r.output;
}

TEST(OffloadOptions, BenchTakesNgl) {
    const auto r = test::run_command(fitllm_exe() + " bench -m " + tiny("tiny-llama-q8_0.gguf") +
                                     " -p 16 -n 4 -r 1 -t 1 --device virtual -ngl 3 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(has(r.output, "pp16")) << r.output;
}

}  // namespace
}  // namespace fitllm
