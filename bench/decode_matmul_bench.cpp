// ops::matmul for small batches of decode tokens (one token of each of n sequences, n = 1, 2, 4, 8)
// through every linear layer of the 156M-parameter Llama of bench/server_load.py (16 layers, 768
// wide, FFN 2304, 2 KV heads of 64, 32000-token output): one iteration runs the 113 matmuls of a
// forward pass, each on its own weights (132 MiB in Q8_0: more than L3, so they stream from DRAM
// as in a real decode step). Reports ms per step and tokens/s; the cost of n tokens against one
// is the ratio of the n_tok rows' times. FITLLM_NO_SMALL_BATCH=1 runs the small batches the way
// they ran before the small-batch kernels (quant/gemm.h select_small_batch), for A/B runs:
//
//   build/bench/decode_matmul_bench --benchmark_filter=Q8_0
//   FITLLM_NO_SMALL_BATCH=1 build/bench/decode_matmul_bench --benchmark_filter=Q8_0
#include <benchmark/benchmark.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ops/matmul.h"
#include "quant/quantize.h"

namespace {

using fitllm::ops::Scratch;
using fitllm::ops::ThreadPool;
using fitllm::ops::WeightView;
using fitllm::quant::GgmlType;

constexpr int64_t kLayers = 16, kEmbd = 768, kKv = 128, kFf = 2304, kVocab = 32000;

struct Shape {
    int64_t rows, cols;
};

// The matmuls of one forward pass, in order.
std::vector<Shape> shapes() {
    std::vector<Shape> s;
    for (int64_t l = 0; l < kLayers; ++l) {
        for (Shape layer : {Shape{kEmbd, kEmbd}, Shape{kKv, kEmbd}, Shape{kKv, kEmbd}, Shape{kEmbd, kEmbd},
                            Shape{kFf, kEmbd}, Shape{kFf, kEmbd}, Shape{kEmbd, kFf}}) {
            s.push_back(layer);
        }
    }
    s.push_back({kVocab, kEmbd});
    return s;
}

std::vector<float> gaussian(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}

// Every matrix of the model, built on first use: a few random rows quantized, copied down the
// matrix (the values do not change the speed).
const std::vector<std::vector<std::byte>>& model_weights(GgmlType type) {
    static std::map<GgmlType, std::vector<std::vector<std::byte>>> cache;
    auto& mats = cache[type];
    if (mats.empty()) {
        for (const Shape& s : shapes()) {
            const size_t row_bytes = *fitllm::quant::row_bytes(type, s.cols);
            constexpr int64_t kDistinct = 16;
            std::vector<std::byte> rows(row_bytes * kDistinct);
            for (int64_t r = 0; r < kDistinct; ++r) {
                const std::vector<float> v = gaussian(static_cast<size_t>(s.cols), static_cast<unsigned>(r + 1));
                fitllm::quant::quantize_row(type, v.data(), rows.data() + r * row_bytes, s.cols);
            }
            std::vector<std::byte>& m = mats.emplace_back(row_bytes * s.rows);
            for (int64_t r = 0; r < s.rows; ++r) {
                std::memcpy(m.data() + r * row_bytes, rows.data() + (r % kDistinct) * row_bytes, row_bytes);
            }
        }
    }
    return mats;
}

void BM_DecodeStep(benchmark::State& state, GgmlType type) {
    const int n_tok = static_cast<int>(state.range(0));
    const int n_threads = static_cast<int>(state.range(1));
    const std::vector<Shape> s = shapes();
    const auto& mats = model_weights(type);
    size_t bytes = 0;
    for (const auto& m : mats) bytes += m.size();
    const std::vector<float> x = gaussian(static_cast<size_t>(n_tok * kFf), 3);
    std::vector<float> y(static_cast<size_t>(n_tok * kVocab));
    ThreadPool pool(n_threads);
    Scratch scratch;
    for (auto _ : state) {
        for (size_t i = 0; i < s.size(); ++i) {
            const WeightView view{type, s[i].rows, s[i].cols, mats[i].data(), 0};
            fitllm::ops::matmul(view, x.data(), n_tok, y.data(), pool, scratch);
        }
        benchmark::DoNotOptimize(y.data());
        benchmark::ClobberMemory();
    }
    state.counters["weight_GB/s"] =
        benchmark::Counter(static_cast<double>(bytes) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
    state.counters["tok/s"] =
        benchmark::Counter(static_cast<double>(n_tok) * state.iterations(), benchmark::Counter::kIsRate);
}

const bool registered = [] {
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::F16}) {
        const std::string name = "DecodeStep156m/" + std::string(fitllm::quant::traits(type).name);
        benchmark::RegisterBenchmark(name.c_str(), BM_DecodeStep, type)
            ->ArgNames({"n_tok", "threads"})
            ->ArgsProduct({{1, 2, 4, 8}, {1, 2}})
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
    }
    return true;
}();

}  // namespace

BENCHMARK_MAIN();
