// ops::attention_kv over the paged KV cache in Llama 3.2 1B's attention shape (32 query heads
// sharing 8 kv heads of 64): decode (1 token) and prefill (512 tokens, causal among themselves) at
// the end of a 4k or 16k context, K/V in f16 (llama.cpp's f16 flash-attention arithmetic), q8_0
// and q4_0 (rotated) and bf16 (the tiled f32 kernel). For comparison, attention_f16 over
// the same f16 values as plain float arrays (the layout before the paged cache). Reports query
// tokens per second.
//
//   build/bench/attention_kv_bench [--benchmark_filter=Decode] [--benchmark_min_time=0.5]
//   (FITLLM_BENCH_THREADS=N: threads, default 2)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <vector>

#include "kv/cache.h"
#include "ops/attention_f16.h"
#include "ops/attention_kv.h"

namespace {

using fitllm::ops::AttentionParams;
using fitllm::ops::Scratch;
using fitllm::ops::ThreadPool;
using fitllm::quant::GgmlType;

constexpr int kHeads = 32, kHeadsKv = 8, kHeadDim = 64;

int bench_threads() {
    const char* env = std::getenv("FITLLM_BENCH_THREADS");
    return env != nullptr ? std::max(1, std::atoi(env)) : 2;
}

std::vector<float> gaussian(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}

AttentionParams params() {
    AttentionParams p;
    p.n_head = kHeads;
    p.n_head_kv = kHeadsKv;
    p.head_dim = kHeadDim;
    p.scale = 0.125f;
    return p;
}

// A cache holding one sequence of n_ctx tokens, written in batches of 512 as a prompt would be.
fitllm::kv::KvCache filled_cache(GgmlType type, int n_ctx) {
    fitllm::kv::KvCache cache({fitllm::kv::LayerShape{kHeadsKv, kHeadDim, kHeadDim}},
                              fitllm::kv::CacheParams{.n_cells = n_ctx, .type_k = type, .type_v = type});
    const int width = kHeadsKv * kHeadDim;
    for (int first = 0; first < n_ctx; first += 512) {
        const int n = std::min(512, n_ctx - first);
        std::vector<fitllm::kv::SeqId> seq(n, 0);
        std::vector<fitllm::kv::Pos> pos(n);
        for (int i = 0; i < n; ++i) pos[i] = first + i;
        std::vector<int32_t> cells(n);
        cache.place(seq, pos, cells);
        const std::vector<float> k = gaussian(static_cast<size_t>(n) * width, 2 + first);
        const std::vector<float> v = gaussian(static_cast<size_t>(n) * width, 3 + first);
        cache.store(0, cells, k.data(), v.data());
    }
    return cache;
}

// range(0): the K/V type, an index into kTypes; range(1): context.
constexpr GgmlType kTypes[] = {GgmlType::F16, GgmlType::Q8_0, GgmlType::BF16, GgmlType::Q4_0};
constexpr const char* kTypeNames[] = {"f16", "q8_0", "bf16", "q4_0"};

void run_kv(benchmark::State& state, int n_tok) {
    const GgmlType type = kTypes[state.range(0)];
    const int n_ctx = static_cast<int>(state.range(1));
    const fitllm::kv::KvCache cache = filled_cache(type, n_ctx);
    const std::vector<float> q = gaussian(static_cast<size_t>(n_tok) * kHeads * kHeadDim, 1);
    std::vector<int32_t> q_pos(n_tok);
    for (int t = 0; t < n_tok; ++t) q_pos[t] = n_ctx - n_tok + t;
    const std::vector<fitllm::kv::SeqId> q_seq(n_tok, 0);
    std::vector<float> out(q.size());
    ThreadPool pool(bench_threads());
    Scratch scratch;
    for (auto _ : state) {
        fitllm::ops::attention_kv(q.data(), q_pos.data(), q_seq.data(), n_tok, cache, 0, params(), out.data(), pool,
                                  scratch);
        benchmark::DoNotOptimize(out.data());
    }
    state.SetLabel(kTypeNames[state.range(0)]);
    state.counters["tok/s"] =
        benchmark::Counter(static_cast<double>(n_tok), benchmark::Counter::kIsIterationInvariantRate);
    state.counters["KV_MiB"] = static_cast<double>(cache.bytes()) / (1 << 20);
}

// attention_f16 over contiguous float K/V holding the same f16 values.
void run_f16_arrays(benchmark::State& state, int n_tok) {
    const int n_ctx = static_cast<int>(state.range(0));
    const fitllm::kv::KvCache cache = filled_cache(GgmlType::F16, n_ctx);
    const int width = kHeadsKv * kHeadDim;
    std::vector<float> k(static_cast<size_t>(n_ctx) * width), v(k.size());
    std::vector<int32_t> kv_pos(n_ctx);
    for (int c = 0; c < n_ctx; ++c) {
        cache.read_k(0, c, k.data() + static_cast<size_t>(c) * width);
        cache.read_v(0, c, v.data() + static_cast<size_t>(c) * width);
        kv_pos[c] = cache.cell_pos(c);
    }
    const std::vector<float> q = gaussian(static_cast<size_t>(n_tok) * kHeads * kHeadDim, 1);
    std::vector<int32_t> q_pos(n_tok);
    for (int t = 0; t < n_tok; ++t) q_pos[t] = n_ctx - n_tok + t;
    std::vector<float> out(q.size());
    ThreadPool pool(bench_threads());
    Scratch scratch;
    for (auto _ : state) {
        fitllm::ops::attention_f16(q.data(), q_pos.data(), n_tok, k.data(), v.data(), kv_pos.data(), n_ctx, params(),
                                   out.data(), pool, scratch);
        benchmark::DoNotOptimize(out.data());
    }
    state.counters["tok/s"] =
        benchmark::Counter(static_cast<double>(n_tok), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_AttentionKvDecode(benchmark::State& state) {
    run_kv(state, 1);
}
BENCHMARK(BM_AttentionKvDecode)
    ->ArgsProduct({{0, 1, 2, 3}, {4096, 16384}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

void BM_AttentionKvPrefill(benchmark::State& state) {
    run_kv(state, 512);
}
BENCHMARK(BM_AttentionKvPrefill)
    ->ArgsProduct({{0, 1, 2, 3}, {4096, 16384}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

void BM_AttentionF16ArraysDecode(benchmark::State& state) {
    run_f16_arrays(state, 1);
}
BENCHMARK(BM_AttentionF16ArraysDecode)->Arg(4096)->Arg(16384)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_AttentionF16ArraysPrefill(benchmark::State& state) {
    run_f16_arrays(state, 512);
}
BENCHMARK(BM_AttentionF16ArraysPrefill)->Arg(4096)->Arg(16384)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
