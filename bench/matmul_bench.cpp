// ops::matmul on a 4096 x 4096 weight matrix: matrix-vector (decode, n_tok = 1) and a 64-token
// batch (prompt processing), on 1 and 2 threads of ops::ThreadPool. Reports GB/s of weight bytes
// streamed and tokens/s. The matrix is reused between iterations, so for the 4-bit types it may
// sit in L3; bench/dot_bench.cpp has the from-DRAM setting for the kernels themselves.
//
//   build/bench/matmul_bench [--benchmark_filter=Q4_K] [--benchmark_min_time=0.5]
#include <benchmark/benchmark.h>

#include <map>
#include <random>
#include <vector>

#include "ops/matmul.h"
#include "quant/quantize.h"

namespace {

using fitllm::ops::Scratch;
using fitllm::ops::ThreadPool;
using fitllm::ops::WeightView;
using fitllm::quant::GgmlType;

constexpr int64_t kRows = 4096, kCols = 4096;
constexpr GgmlType kTypes[] = {GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F16};

std::vector<float> gaussian(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}

// Built on first use: quantizing 16 M values takes a moment per type.
const std::vector<std::byte>& weights(GgmlType type) {
    static std::map<GgmlType, std::vector<std::byte>> cache;
    std::vector<std::byte>& bytes = cache[type];
    if (bytes.empty()) {
        const size_t row_bytes = *fitllm::quant::row_bytes(type, kCols);
        bytes.resize(row_bytes * kRows);
        const std::vector<float> row = gaussian(kCols, 1);
        for (int64_t r = 0; r < kRows; ++r) {
            fitllm::quant::quantize_row(type, row.data(), bytes.data() + r * row_bytes, kCols);
        }
    }
    return bytes;
}

void BM_Matmul(benchmark::State& state, GgmlType type) {
    const int n_tok = static_cast<int>(state.range(0));
    const int n_threads = static_cast<int>(state.range(1));
    const std::vector<std::byte>& w = weights(type);
    const WeightView view{type, kRows, kCols, w.data(), 0};
    const std::vector<float> x = gaussian(static_cast<size_t>(n_tok * kCols), 2);
    std::vector<float> y(static_cast<size_t>(n_tok * kRows));
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
}

const bool registered = [] {
    for (GgmlType type : kTypes) {
        const std::string name = "Matmul/" + std::string(fitllm::quant::traits(type).name);
        benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, type)
            ->ArgNames({"n_tok", "threads"})
            ->ArgsProduct({{1, 64}, {1, 2}})
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
    }
    return true;
}();

}  // namespace

BENCHMARK_MAIN();
