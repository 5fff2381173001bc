// kv/key_transform.h: what the query-aware K transform costs. Its fit (once per layer, on the first
// rows stored), and per row: a K head stored (transform + error-feedback rounding) against the
// diagonal kind's (scale + Hadamard + plain rounding), and a query shaped for attention.
//   build/bench/key_transform_bench
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kv/hadamard.h"
#include "kv/key_transform.h"
#include "ops/rope.h"
#include "quant/ggml_type.h"
#include "quant/quantize.h"

namespace {

using namespace fitllm;

struct Rows {
    std::vector<float> k, q;
    std::vector<int32_t> pos;
    ops::RopeParams rope;
};

// n tokens of one kv head of d and group query heads, roped (NeoX, base 10000) at 0 .. n - 1.
Rows rows(int n, int d, int group) {
    std::mt19937 rng(1);
    std::normal_distribution<float> g;
    Rows r;
    r.k.resize(static_cast<size_t>(n) * d);
    r.q.resize(static_cast<size_t>(n) * group * d);
    for (float& x : r.k) x = 1.0f + g(rng);
    for (float& x : r.q) x = g(rng);
    for (int t = 0; t < n; ++t) r.pos.push_back(t);
    r.rope.mode = ops::RopeMode::Neox;
    r.rope.n_dims = d;
    ops::rope(r.k.data(), r.pos.data(), n, 1, d, r.rope);
    ops::rope(r.q.data(), r.pos.data(), n, group, d, r.rope);
    return r;
}

kv::KeySample sample(const Rows& r, int d, int group) {
    return kv::KeySample{.k = r.k.data(),
                         .q = r.q.data(),
                         .pos = r.pos.data(),
                         .n_rows = static_cast<int64_t>(r.pos.size()),
                         .n_head_q = group,
                         .rope = ops::rope_frame(r.rope, d)};
}

// Args: head size, query heads per kv head. Per kv head of a layer.
void BM_Fit(benchmark::State& state) {
    const int d = static_cast<int>(state.range(0)), group = static_cast<int>(state.range(1));
    const Rows r = rows(256, d, group);
    for (auto _ : state) {
        kv::KeyTransform t;
        t.calibrate(sample(r, d, group), 1, d, 4096);
        benchmark::DoNotOptimize(t);
    }
}
BENCHMARK(BM_Fit)->Args({128, 4})->Args({256, 4})->Unit(benchmark::kMillisecond);

// Per key: kRows keys stored together, as KvCache::store() hands them over.
void BM_StoreQueryAware(benchmark::State& state) {
    const int d = static_cast<int>(state.range(0));
    const Rows r = rows(256, d, 4);
    kv::KeyTransform t;
    t.calibrate(sample(r, d, 4), 1, d, 4096);
    constexpr int kRows = kv::KeyTransform::kRows;
    const size_t row_bytes = *quant::row_bytes(quant::GgmlType::Q4_0, d);
    std::vector<std::byte> out(kRows * row_bytes);
    std::vector<float> scratch(kv::KeyTransform::kScratchRows * d);
    const float* heads[kRows];
    std::byte* dst[kRows];
    for (int k = 0; k < kRows; ++k) dst[k] = out.data() + k * row_bytes;
    size_t i = 0;
    for (auto _ : state) {
        for (int k = 0; k < kRows; ++k) heads[k] = r.k.data() + (i++ % 256) * d;
        t.encode(heads, kRows, 0, quant::GgmlType::Q4_0, dst, scratch.data());
        benchmark::DoNotOptimize(out.data());
    }
    state.SetItemsProcessed(state.iterations() * kRows);
}
BENCHMARK(BM_StoreQueryAware)->Arg(128)->Arg(256);

void BM_StoreDiagonal(benchmark::State& state) {
    const int d = static_cast<int>(state.range(0));
    const Rows r = rows(256, d, 4);
    kv::KeyTransform t;
    t.calibrate_diagonal(r.k.data(), 256, 1, d);
    std::vector<std::byte> out(*quant::row_bytes(quant::GgmlType::Q4_0, d));
    std::vector<float> scratch(d);
    size_t i = 0;
    for (auto _ : state) {
        t.apply(r.k.data() + (i++ % 256) * d, 0, d, scratch.data());
        kv::hadamard_transform(scratch.data(), d);
        quant::quantize_row(quant::GgmlType::Q4_0, scratch.data(), out.data(), d);
        benchmark::DoNotOptimize(out.data());
    }
    state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_StoreDiagonal)->Arg(128)->Arg(256);

// Per query: kRows queries shaped together, as attention's tiles do.
void BM_ShapeQuery(benchmark::State& state) {
    const int d = static_cast<int>(state.range(0));
    const Rows r = rows(256, d, 4);
    kv::KeyTransform t;
    t.calibrate(sample(r, d, 4), 1, d, 4096);
    constexpr int kRows = kv::KeyTransform::kRows;
    std::vector<float> out(kRows * d);
    size_t i = 0;
    for (auto _ : state) {
        t.shape_queries(r.q.data() + (i++ % 128) * kRows * d, kRows, 0, out.data());
        benchmark::DoNotOptimize(out.data());
    }
    state.SetItemsProcessed(state.iterations() * kRows);
}
BENCHMARK(BM_ShapeQuery)->Arg(128)->Arg(256);

}  // namespace

BENCHMARK_MAIN();
