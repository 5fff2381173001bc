// How long it takes to read a GGUF header (metadata, vocabulary, tensor infos): fitllm's
// GgufFile::open against llama.cpp's gguf_init_from_file(no_alloc), same file, same run.
//
//   build/bench/gguf_open_bench [MODEL.gguf]    (default: the demo model)
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <string>

#include "gguf/gguf_reader.h"
#include "llama_cpp_lib.h"

namespace {

std::string g_model = FITLLM_SOURCE_DIR "/models/gemma-3-270m-q4_k_m.gguf";

struct GgufInitParams {  // ggml's struct gguf_init_params
    bool no_alloc;
    void** ctx;
};
using GgufInitFromFile = void* (*)(const char*, GgufInitParams);
using GgufFree = void (*)(void*);
using GgufGetNTensors = int64_t (*)(const void*);

void BM_fitllm_open(benchmark::State& state) {
    size_t tensors = 0;
    for (auto _ : state) {
        auto f = fitllm::gguf::GgufFile::open(g_model);
        tensors = f.tensors().size();
        benchmark::DoNotOptimize(tensors);
    }
    state.counters["tensors"] = static_cast<double>(tensors);
}

void BM_llama_cpp_gguf_init(benchmark::State& state) {
    static void* lib = fitllm::bench::open_llama_cpp_lib("libggml-base.so");
    if (!lib) {
        state.SkipWithError("llama.cpp libraries not found");
        return;
    }
    auto init = reinterpret_cast<GgufInitFromFile>(fitllm::bench::find_symbol(lib, "gguf_init_from_file"));
    auto free_ctx = reinterpret_cast<GgufFree>(fitllm::bench::find_symbol(lib, "gguf_free"));
    auto n_tensors = reinterpret_cast<GgufGetNTensors>(fitllm::bench::find_symbol(lib, "gguf_get_n_tensors"));
    if (!init || !free_ctx || !n_tensors) {
        state.SkipWithError("llama.cpp symbols missing");
        return;
    }
    int64_t tensors = 0;
    for (auto _ : state) {
        void* ctx = init(g_model.c_str(), GgufInitParams{true, nullptr});
        if (!ctx) {
            state.SkipWithError("gguf_init_from_file failed");
            return;
        }
        tensors = n_tensors(ctx);
        free_ctx(ctx);
    }
    state.counters["tensors"] = static_cast<double>(tensors);
}

BENCHMARK(BM_fitllm_open)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_llama_cpp_gguf_init)->Unit(benchmark::kMillisecond)->MinTime(1.0);

// Prints Google Benchmark's table, then one line per pair with the ratio to llama.cpp.
class RatioReporter : public benchmark::ConsoleReporter {
public:
    void ReportRuns(const std::vector<Run>& runs) override {
        ConsoleReporter::ReportRuns(runs);
        for (const Run& r : runs) {
            if (!r.error_occurred) ms_[r.benchmark_name()] = r.GetAdjustedRealTime();
        }
    }
    void Finalize() override {
        ConsoleReporter::Finalize();
        const auto a = ms_.find("BM_fitllm_open/min_time:1.000");
        const auto b = ms_.find("BM_llama_cpp_gguf_init/min_time:1.000");
        std::printf("\n%-28s %12s %12s %10s\n", "header load", "fitllm ms", "llama.cpp ms", "speedup");
        if (a == ms_.end() || b == ms_.end()) {
            std::printf("%-28s %12s %12s %10s\n", "demo model", a == ms_.end() ? "-" : "ok", "n/a", "n/a");
            return;
        }
        std::printf("%-28s %12.3f %12.3f %9.2fx\n", "demo model", a->second, b->second, b->second / a->second);
    }

private:
    std::map<std::string, double> ms_;
};

}  // namespace

int main(int argc, char** argv) {
    benchmark::Initialize(&argc, argv);
    if (argc > 1) g_model = argv[1];
    std::printf("model: %s\n", g_model.c_str());
    RatioReporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    benchmark::Shutdown();
    return 0;
}
