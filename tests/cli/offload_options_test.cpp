// --device, -ngl, --vram and --no-kv-offload on the commands (run, bench, plan): the virtual device
// runs any number of the last layers with the same text as the CPU, the plan shows each device's
// share, a device budget that cannot hold the asked layers is refused before loading, --fit (or no
// -ngl) picks as many layers as fit --vram, and the run's summary shows the device's pools.
// Unified mode (--unified, --device virtual-unified): the same text, one budget, no weight copies.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "server/metrics.h"
#include "server/model_registry.h"
#include "test_support.h"

namespace fitllm {
namespace {

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
            test::fitllm_exe() + " run -m " + tiny(model) + " -p 'the quick brown fox' -n 12 --temp 0 -t 1 -c 256";
        const std::string cpu = text_of(base);
        ASSERT_FALSE(cpu.empty());
        for (int ngl = 0; ngl <= 3; ++ngl) {  // 2 layers; 3: the output layer too
            EXPECT_EQ(text_of(base + " --device virtual -ngl " + std::to_string(ngl)), cpu) << model << " -ngl " << ngl;
        }
        EXPECT_EQ(text_of(base + " --device virtual -ngl 3 --no-kv-offload"), cpu) << model;
    }
}

TEST(OffloadOptions, SummaryShowsTheDevicePoolsAndStaysWithinItsPlan) {
    const auto r = test::run_command(test::fitllm_exe() + " run -m " + tiny("tiny-llama-q8_0.gguf") +
                                     " -p 'a b c' -n 4 --temp 0 -t 1 -c 256 --device virtual -ngl 3 --vram 64M 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    for (const char* part : {"virtual: ", "weights", "kv", "scratch"}) {
        EXPECT_TRUE(has(r.output, part)) << "missing '" << part << "' in:\n" << r.output;
    }
}

TEST(OffloadOptions, PlanShowsEachDevice) {
    const auto r = test::run_command(test::fitllm_exe() + " plan -m " + tiny("tiny-llama-q8_0.gguf") +
                                     " -c 256 --device virtual -ngl 1 --vram 64M 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    for (const char* part : {"device host", "device virtual", "1 of 2 layers (-ngl 1)", "--vram"}) {
        EXPECT_TRUE(has(r.output, part)) << "missing '" << part << "' in:\n" << r.output;
    }
    const auto j = test::run_command(test::fitllm_exe() + " plan -m " + tiny("tiny-llama-q8_0.gguf") +
                                     " -c 256 --device virtual -ngl 3 --json 2>&1");
    ASSERT_EQ(j.status, 0) << j.output;
    for (const char* part : {"\"name\": \"virtual\"", "\"n_gpu_layers\": 3", "\"output\": true"}) {
        EXPECT_TRUE(has(j.output, part)) << "missing '" << part << "' in:\n" << j.output;
    }
}

TEST(OffloadOptions, ADeviceBudgetTooSmallIsRefusedOrFitted) {
    const std::string base = test::fitllm_exe() + " run -m " + tiny("tiny-llama-q8_0.gguf") +
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
    const std::string base = test::fitllm_exe() + " run -m " + tiny("tiny-llama-q8_0.gguf") + " -p a -n 1 -t 1";
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
    const auto r = test::run_command(test::fitllm_exe() + " bench -m " + tiny("tiny-llama-q8_0.gguf") +
                                     " -p 16 -n 4 -r 1 -t 1 --device virtual -ngl 3 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(has(r.output, "pp16")) << r.output;
}

TEST(OffloadOptions, EverySplitOnAUnifiedDeviceGivesTheSameText) {
    for (const char* model : {"tiny-llama-q8_0.gguf", "tiny-qwen2-q4_k_m.gguf"}) {
        const std::string base =
            test::fitllm_exe() + " run -m " + tiny(model) + " -p 'the quick brown fox' -n 12 --temp 0 -t 1 -c 256";
        const std::string cpu = text_of(base);
        ASSERT_FALSE(cpu.empty());
        for (int ngl = 0; ngl <= 3; ++ngl) {
            EXPECT_EQ(text_of(base + " --device virtual-unified -ngl " + std::to_string(ngl)), cpu)
                << model << " -ngl " << ngl;
        }
        EXPECT_EQ(text_of(base + " --device virtual --unified"), cpu) << model;  // every layer by default
        EXPECT_EQ(text_of(base + " --device virtual-unified -ngl 3 --no-kv-offload"), cpu) << model;
    }
}

// The summary says the unified device charged the host's pools; the host's weights pool is what
// the CPU-only run's is (nothing copied, nothing given back).
TEST(OffloadOptions, UnifiedSummaryShowsOneBudgetAndNoCopies) {
    const std::string base = test::fitllm_exe() + " run -m " + tiny("tiny-llama-q8_0.gguf") +
                             " -p 'a b c' -n 4 --temp 0 -t 1 -c 256 --mem 64M";
    const auto cpu = test::run_command(base + " 2>&1");
    const auto r = test::run_command(base + " --device virtual-unified -ngl 3 2>&1");
    ASSERT_EQ(cpu.status, 0) << cpu.output;
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(has(r.output, "virtual-unified (unified) charged the host's pools")) << r.output;
    const std::regex weights("pools \\(peak\\): [^|]*weights ([0-9.]+ [KMG]?i?B)");
    std::smatch a, b;
    ASSERT_TRUE(std::regex_search(cpu.output, a, weights)) << cpu.output;
    ASSERT_TRUE(std::regex_search(r.output, b, weights)) << r.output;
    EXPECT_EQ(a[1], b[1]);
}

TEST(OffloadOptions, PlanShowsAUnifiedDeviceInsideTheHostsShare) {
    const std::string base = test::fitllm_exe() + " plan -m " + tiny("tiny-llama-q8_0.gguf") + " -c 256 --mem 64M";
    const auto r = test::run_command(base + " --device virtual --unified -ngl 3 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    for (const char* part : {"device virtual-unified (unified: shares the host's memory and budget",
                             "read in place from the mapped file, no copy", "in the host's total",
                             "virtual-unified reads 2 of them in place"}) {
        EXPECT_TRUE(has(r.output, part)) << "missing '" << part << "' in:\n" << r.output;
    }
    EXPECT_FALSE(has(r.output, "--vram")) << r.output;
    const auto j = test::run_command(base + " --device virtual-unified -ngl 3 --json 2>/dev/null");
    ASSERT_EQ(j.status, 0) << j.output;
    const auto cpu = test::run_command(base + " --json 2>/dev/null");
    ASSERT_EQ(cpu.status, 0) << cpu.output;
    const auto plan = nlohmann::json::parse(j.output);
    const auto cpu_plan = nlohmann::json::parse(cpu.output);
    ASSERT_EQ(plan["devices"].size(), 2u);
    const auto& host = plan["devices"][0];
    const auto& dev = plan["devices"][1];
    EXPECT_EQ(dev["name"], "virtual-unified");
    EXPECT_EQ(dev["unified"], true);
    EXPECT_EQ(dev["in_host_total"], true);
    EXPECT_TRUE(dev["budget"].is_null());
    EXPECT_EQ(dev["weights"], 0);
    EXPECT_GT(dev["weights_in_place"].get<uint64_t>(), 0u);
    EXPECT_EQ(plan["settings"]["unified"], true);
    // One budget: the device's KV and scratch are in the host's, its weights are the host's.
    EXPECT_EQ(host["weights_resident"], cpu_plan["devices"][0]["weights_resident"]);
    EXPECT_EQ(host["scratch"].get<uint64_t>(),
              cpu_plan["devices"][0]["scratch"].get<uint64_t>() + dev["scratch"].get<uint64_t>());
    EXPECT_GE(host["kv"].get<uint64_t>(), dev["kv"].get<uint64_t>());
    EXPECT_EQ(host["total"].get<uint64_t>(),
              cpu_plan["devices"][0]["total"].get<uint64_t>() +
                  (host["kv"].get<uint64_t>() - cpu_plan["devices"][0]["kv"].get<uint64_t>()) +
                  dev["scratch"].get<uint64_t>());
}

TEST(OffloadOptions, UnifiedRefusesVramAndIsRefusedOverMemNamingThePool) {
    const std::string model = tiny("tiny-llama-q8_0.gguf");
    const std::string run = test::fitllm_exe() + " run -m " + model + " -p 'a b c' -n 4 --temp 0 -t 1";
    for (const char* args :
         {" --device virtual-unified --vram 64M", " --device virtual --unified --vram 1G", " --unified -p x"}) {
        const auto r = test::run_command(run + args + " 2>&1");
        EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
        if (std::string(args).find("--vram") != std::string::npos) {
            EXPECT_TRUE(has(r.output, "--mem")) << r.output;
        }
    }
    // Unknown names, also where nothing is opened (plan).
    for (const std::string& command : {run, test::fitllm_exe() + " plan -m " + model}) {
        for (const char* args : {" --device nosuch --unified", " --device nosuch-unified"}) {
            const auto r = test::run_command(command + args + " 2>&1");
            EXPECT_EQ(r.status, 2) << command << args << "\n" << r.output;
            EXPECT_TRUE(has(r.output, "unknown device")) << r.output;
        }
    }
    // A budget that holds what is charged before the KV cache (the device's and the host's
    // together) and half of it: the KV is refused, in the host's pool.
    const auto j = test::run_command(test::fitllm_exe() + " plan -m " + model +
                                     " -c 8192 -t 1 --mem 1G --device virtual-unified --json 2>/dev/null");
    ASSERT_EQ(j.status, 0) << j.output;
    const auto host = nlohmann::json::parse(j.output)["devices"][0];
    const uint64_t before_kv = host["overhead"].get<uint64_t>() + host["weights_resident"].get<uint64_t>();
    const auto refused = test::run_command(run + " -c 8192 --device virtual-unified --mem " +
                                           std::to_string(before_kv + host["kv"].get<uint64_t>() / 2) + " 2>&1");
    EXPECT_EQ(refused.status, 3) << refused.output;
    EXPECT_TRUE(has(refused.output, "pool 'kv'")) << refused.output;
    EXPECT_TRUE(has(refused.output, "device 'host'")) << refused.output;
    EXPECT_FALSE(has(refused.output, "prompt:")) << refused.output;  // before loading
    // --fit, with all but half of the KV cache: a quantized one, every layer still on the device.
    const uint64_t mem = host["total"].get<uint64_t>() - host["kv"].get<uint64_t>() / 2;
    const auto fitted =
        test::run_command(run + " -c 8192 --device virtual-unified --fit --mem " + std::to_string(mem) + " 2>&1");
    ASSERT_EQ(fitted.status, 0) << fitted.output;
    EXPECT_TRUE(has(fitted.output, "--fit: offload 2 of 2 layers and the output layer to virtual-unified"))
        << fitted.output;
    EXPECT_TRUE(has(fitted.output, "KV cache f16/f16 -> q8_0/q8_0")) << fitted.output;
}

// The demo model with every layer on a unified device: the process's peak RSS stays that of the
// CPU-only run (the device reads the mapped weights; a copy would add 235 MiB, the separate
// virtual device's 526 MiB against the CPU's 302 MiB).
TEST(OffloadOptions, UnifiedDoesNotDoubleTheResidentSetOnTheDemoModel) {
    const auto path = test::demo_model();
    if (!path) GTEST_SKIP() << "demo model absent (scripts/setup.sh downloads it)";
    const std::string base =
        test::fitllm_exe() + " run -m " + path->string() + " -p 'Hello' -n 4 --temp 0 -t 2 -c 256 2>&1 >/dev/null";
    const std::regex rss("peak RSS ([0-9.]+) MiB");
    const auto peak = [&](const std::string& args) {
        const auto r = test::run_command(base + args);
        EXPECT_EQ(r.status, 0) << r.output;
        std::smatch m;
        EXPECT_TRUE(std::regex_search(r.output, m, rss)) << r.output;
        return m.empty() ? 0.0 : std::stod(m[1]);
    };
    const double cpu = peak("");
    const double unified = peak(" --device virtual-unified -ngl 19");
    ASSERT_GT(cpu, 100.0);
    // (A margin that AddressSanitizer's shadow and quarantine stay within, less than half a copy.)
    EXPECT_LT(unified, cpu + 100.0) << "cpu " << cpu << " MiB, unified " << unified << " MiB";
}

// fitllm serve's registry opens the unified device on its own budget; /v1/memory (memory_report)
// names it on the host's entry (its charges are in the host's pools), and the model's plan has
// its share, unified.
TEST(OffloadOptions, ServeReportsAUnifiedDevice) {
    server::ModelRegistry registry({.model_path = tiny("tiny-llama-q8_0.gguf"),
                                    .load = {.mem = 256ull << 20, .offload = {.device = "virtual-unified"}},
                                    .context = {.n_ctx = 256, .n_seq = 1, .n_batch = 16, .n_threads = 1}});
    ASSERT_NE(registry.offload(), nullptr);
    EXPECT_TRUE(registry.offload()->unified());
    EXPECT_EQ(&registry.offload()->memory(), &registry.device());
    registry.load_startup_model();
    const nlohmann::json report = server::memory_report(registry);
    // One memory, one device entry: the host's, naming the device that shares it.
    ASSERT_EQ(report["devices"].size(), 1u) << report.dump(2);
    EXPECT_EQ(report["devices"][0]["name"], "host");
    EXPECT_EQ(report["devices"][0]["unified_devices"], nlohmann::json::array({"virtual-unified"}));
    const auto& plan_dev = report["models"][0]["plan_devices"]["virtual-unified"];
    EXPECT_EQ(plan_dev["unified"], true) << report.dump(2);
    EXPECT_EQ(plan_dev["n_layer"], 2);
    EXPECT_EQ(plan_dev["weights"], 0);
    registry.shutdown();
}

}  // namespace
}  // namespace fitllm
