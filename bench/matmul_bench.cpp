// ops::matmul on a 4096 x 4096 weight matrix: matrix-vector (decode, n_tok = 1) and 64- and
// 512-token batches (prompt processing: the tiled kernels of quant/gemm.h where a type has them),
// on 1 and 2 threads of ops::ThreadPool; and prompts of 512 tokens through the shapes of
// Gemma 3 270M's layers (MatmulGemma270m: 640 -> 1024 / 256 / 2048 and 2048 -> 640) and the 1B-shaped
// Llama's (MatmulLlama1b: 2048 -> 2048 / 5632 and 5632 -> 2048). Reports GB/s
// of weight bytes streamed, tokens/s and, for the batches, GMAC/s. The matrix is reused between
// iterations, so for the 4-bit types it may sit in L3; bench/dot_bench.cpp has the from-DRAM
// setting for the kernels themselves. FITLLM_NO_GEMM=1 runs the batches on the dots instead.
//
//   build/bench/matmul_bench [--benchmark_filter=Q4_K] [--benchmark_min_time=0.5]
#include <benchmark/benchmark.h>

#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "ops/matmul.h"
#include "quant/quantize.h"

namespace {

using fitllm::ops::Scratch;
using fitllm::ops::ThreadPool;
using fitllm::ops::WeightView;
using fitllm::quant::GgmlType;

constexpr int64_t kRows = 4096, kCols = 4096;
constexpr GgmlType kTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                               GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::F16};

std::vector<float> gaussian(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}

// Built on first use: quantizing 16 M values takes a moment per type.
const std::vector<std::byte>& weights(GgmlType type, int64_t rows = kRows, int64_t cols = kCols) {
    static std::map<std::tuple<GgmlType, int64_t, int64_t>, std::vector<std::byte>> cache;
    std::vector<std::byte>& bytes = cache[{type, rows, cols}];
    if (bytes.empty()) {
        const size_t row_bytes = *fitllm::quant::row_bytes(type, cols);
        bytes.resize(row_bytes * rows);
        const std::vector<float> row = gaussian(cols, 1);
        for (int64_t r = 0; r < rows; ++r) {
            fitllm::quant::quantize_row(type, row.data(), bytes.data() + r * row_bytes, cols);
        }
    }
    return bytes;
}

void BM_Matmul(benchmark::State& state, GgmlType type, int64_t rows, int64_t cols) {
    const int n_tok = static_cast<int>(state.range(0));
    const int n_threads = static_cast<int>(state.range(1));
    const std::vector<std::byte>& w = weights(type, rows, cols);
    const WeightView view{type, rows, cols, w.data(), 0};
    const std::vector<float> x = gaussian(static_cast<size_t>(n_tok * cols), 2);
    std::vector<float> y(static_cast<size_t>(n_tok * rows));
    ThreadPool pool(n_threads);
    Scratch scratch;
    for (auto _ : state) {
        fitllm::ops::matmul(view, x.data(), n_tok, y.data(), pool, scratch);
        benchmark::DoNotOptimize(y.data());
        benchmark::ClobberMemory();
    }
    state.counters["weight_GB/s"] =
        benchmark::Counter(static_cast<double>(w.size()) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
    state.counters["tok/s"] =
        benchmark::Counter(static_cast<double>(n_tok) * state.iterations(), benchmark::Counter::kIsRate);
    if (n_tok > 1) {
        state.counters["GMAC/s"] = benchmark::Counter(
            static_cast<double>(rows * cols) * n_tok * state.iterations() / 1e9, benchmark::Counter::kIsRate);
    }
}

const bool registered = [] {
    for (GgmlType type : kTypes) {
        const std::string name = "Matmul/" + std::string(fitllm::quant::traits(type).name);
        const bool quantized = fitllm::quant::traits(type).is_quantized;
        benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, type, kRows, kCols)
            ->ArgNames({"n_tok", "threads"})
            ->ArgsProduct({quantized ? std::vector<int64_t>{1, 64, 512} : std::vector<int64_t>{1, 64}, {1, 2}})
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
    }
    // Gemma 3 270M: attention q / k+v / o, FFN gate+up / down; the Q4_K_M file holds them as
    // Q5_0, Q8_0 and the k-quants.
    constexpr int64_t kShapes[][2] = {{1024, 640}, {256, 640}, {640, 1024}, {2048, 640}, {640, 2048}};
    for (GgmlType type : {GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
        for (const auto& shape : kShapes) {
            const std::string name = "MatmulGemma270m/" + std::string(fitllm::quant::traits(type).name) + "/" +
                                     std::to_string(shape[0]) + "x" + std::to_string(shape[1]);
            benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, type, shape[0], shape[1])
                ->ArgNames({"n_tok", "threads"})
                ->Args({512, 2})
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
        }
    }
    // The 1B-shaped Llama of bench/bench_vs_llama_cpp.py (2048 wide, FFN 5632): attention q / o,
    // FFN gate / up, FFN down, for the Q4_K and Q6_K tensors of its Q4_K_M file. On a loaded
    // machine the CPU time of the 1-thread runs is the steadiest figure for A/B comparisons.
    constexpr int64_t kLlama1bShapes[][2] = {{2048, 2048}, {5632, 2048}, {2048, 5632}};
    for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q6_K}) {
        for (const auto& shape : kLlama1bShapes) {
            const std::string name = "MatmulLlama1b/" + std::string(fitllm::quant::traits(type).name) + "/" +
                                     std::to_string(shape[0]) + "x" + std::to_string(shape[1]);
            benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, type, shape[0], shape[1])
                ->ArgNames({"n_tok", "threads"})
                ->ArgsProduct({{512}, {1, 2}})
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
        }
    }
    return true;
}();

}  // namespace

BENCHMARK_MAIN();
