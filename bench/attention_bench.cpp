// ops::attention_f16 (llama.cpp's f16 flash-attention arithmetic) in Gemma 3 270M's shape: 4 query
// heads sharing 1 kv head of 256. A prompt of n tokens against itself (causal, kv = n) and one
// decode token against n cached keys, on 1 and 2 threads of ops::ThreadPool. Reports query tokens
// per second, for each kernel (ops::AttentionF16Kernel: Best is what the model runs, OneQuery the
// kernel attention_f16 had before the blocked ones).
//
//   build/bench/attention_bench [--benchmark_filter=Prompt] [--benchmark_min_time=0.5]
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "ops/attention_f16.h"
#include "quant/blocks.h"

namespace {

using fitllm::ops::AttentionParams;
using fitllm::ops::Scratch;
using fitllm::ops::ThreadPool;

constexpr int kHeads = 4, kHeadsKv = 1, kHeadDim = 256;

std::vector<float> gaussian(size_t n, unsigned seed, bool half) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) {
        x = dist(rng);
        if (half) x = fitllm::quant::fp16_to_fp32(fitllm::quant::fp32_to_fp16(x));
    }
    return v;
}

// n_tok new tokens at the end of n_kv cached ones.
void run(benchmark::State& state, int64_t n_tok, int64_t n_kv, int n_threads, fitllm::ops::AttentionF16Kernel kernel) {
    const std::vector<float> q = gaussian(n_tok * kHeads * kHeadDim, 1, false);
    const std::vector<float> k = gaussian(n_kv * kHeadsKv * kHeadDim, 2, true);
    const std::vector<float> v = gaussian(n_kv * kHeadsKv * kHeadDim, 3, true);
    std::vector<int32_t> q_pos(n_tok), kv_pos(n_kv);
    for (int64_t j = 0; j < n_kv; ++j) kv_pos[j] = static_cast<int32_t>(j);
    for (int64_t t = 0; t < n_tok; ++t) q_pos[t] = static_cast<int32_t>(n_kv - n_tok + t);
    AttentionParams p;
    p.n_head = kHeads;
    p.n_head_kv = kHeadsKv;
    p.head_dim = kHeadDim;
    p.scale = 1.0f;
    std::vector<float> out(q.size());
    ThreadPool pool(n_threads);
    Scratch scratch;
    for (auto _ : state) {
        fitllm::ops::attention_f16(q.data(), q_pos.data(), n_tok, k.data(), v.data(), kv_pos.data(), n_kv, p,
                                   out.data(), pool, scratch, kernel);
        benchmark::DoNotOptimize(out.data());
    }
    state.counters["tok/s"] =
        benchmark::Counter(static_cast<double>(n_tok), benchmark::Counter::kIsIterationInvariantRate);
}

using fitllm::ops::AttentionF16Kernel;

void BM_AttentionF16Prompt(benchmark::State& state, AttentionF16Kernel kernel) {
    run(state, state.range(0), state.range(0), static_cast<int>(state.range(1)), kernel);
}
void BM_AttentionF16Decode(benchmark::State& state, AttentionF16Kernel kernel) {
    run(state, 1, state.range(0), static_cast<int>(state.range(1)), kernel);
}

#define FITLLM_ATTENTION_BENCH(kernel)                                           \
    BENCHMARK_CAPTURE(BM_AttentionF16Prompt, kernel, AttentionF16Kernel::kernel) \
        ->ArgsProduct({{128, 512}, {1, 2}})                                      \
        ->UseRealTime()                                                          \
        ->Unit(benchmark::kMillisecond);                                         \
    BENCHMARK_CAPTURE(BM_AttentionF16Decode, kernel, AttentionF16Kernel::kernel) \
        ->ArgsProduct({{512, 4096}, {1, 2}})                                     \
        ->UseRealTime()                                                          \
        ->Unit(benchmark::kMicrosecond)
FITLLM_ATTENTION_BENCH(Best);
FITLLM_ATTENTION_BENCH(Avx2);
FITLLM_ATTENTION_BENCH(OneQuery);

}  // namespace

BENCHMARK_MAIN();
