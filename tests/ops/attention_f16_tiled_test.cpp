// llama.cpp's tiled flash attention (attention_f16_tiled.h): every instruction-set variant gives
// the scalar reference's bits, the result is attention, and a query's result does not depend on
// the other queries of its call. (Against ggml itself: tests/quant/ggml_oracle_test.cpp.)
#include "ops/attention_f16_tiled.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ops/attention_f16_tiled_kernel.h"
#include "quant/blocks.h"
#include "quant/cpu_features.h"

namespace fitllm::ops {
namespace {

float via_half(float x) {
    return quant::fp16_to_fp32(quant::fp32_to_fp16(x));
}

struct Case {
    int n_head = 8, n_head_kv = 2, head_dim = 128;
    int n_tok = 100, n_prefix = 37;  // queries at positions n_prefix .. n_prefix + n_tok - 1
    float scale = 0.0f;              // 0: 1 / sqrt(head_dim)
    float softcap = 0.0f;
    int window = 0;
    bool f16 = true;  // K/V hold f16 values
};

struct Data {
    std::vector<float> q, k, v;
    std::vector<int32_t> q_pos, kv_pos;
    AttentionParams p;
};

Data make(const Case& c, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    Data d;
    const int n_kv = c.n_prefix + c.n_tok;
    d.q.resize(static_cast<size_t>(c.n_tok) * c.n_head * c.head_dim);
    d.k.resize(static_cast<size_t>(n_kv) * c.n_head_kv * c.head_dim);
    d.v.resize(d.k.size());
    for (float& x : d.q) x = normal(rng);
    for (float& x : d.k) x = c.f16 ? via_half(normal(rng)) : normal(rng);
    for (float& x : d.v) x = c.f16 ? via_half(normal(rng)) : normal(rng);
    for (int t = 0; t < c.n_tok; ++t) d.q_pos.push_back(c.n_prefix + t);
    for (int j = 0; j < n_kv; ++j) d.kv_pos.push_back(j);
    d.p = AttentionParams{.n_head = c.n_head,
                          .n_head_kv = c.n_head_kv,
                          .head_dim = c.head_dim,
                          .scale = c.scale > 0.0f ? c.scale : 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
                          .softcap = c.softcap,
                          .sliding_window = c.window};
    return d;
}

std::vector<float> run(const Data& d, AttentionTiledKernel kernel, int threads = 2) {
    ThreadPool pool(threads);
    Scratch scratch;
    std::vector<float> out(d.q.size(), std::numeric_limits<float>::quiet_NaN());
    attention_f16_tiled(d.q.data(), d.q_pos.data(), static_cast<int64_t>(d.q_pos.size()), d.k.data(), d.v.data(),
                        d.kv_pos.data(), static_cast<int64_t>(d.kv_pos.size()), d.p, out.data(), pool, scratch, kernel);
    return out;
}

int differing(const std::vector<float>& a, const std::vector<float>& b) {
    int n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return n;
}

std::string describe(const Case& c) {
    return "head_dim " + std::to_string(c.head_dim) + ", heads " + std::to_string(c.n_head) + "/" +
           std::to_string(c.n_head_kv) + ", scale " + std::to_string(c.scale) + ", softcap " +
           std::to_string(c.softcap) + ", window " + std::to_string(c.window) + (c.f16 ? ", f16" : ", f32");
}

std::vector<Case> cases() {
    std::vector<Case> all;
    for (int head_dim : {64, 128, 256, 80, 40}) {
        Case c;
        c.head_dim = head_dim;
        all.push_back(c);
    }
    Case c;
    c.window = 50;  // Gemma 3 local layers: tiles the first keys of which no query sees
    all.push_back(c);
    c = Case{};
    c.softcap = 30.0f;
    all.push_back(c);
    c = Case{};
    c.scale = 6.0f;  // weights far below the maximum: the exponential's subnormal results and zeros
    all.push_back(c);
    c = Case{};
    c.f16 = false;
    c.n_head = 6;
    c.n_head_kv = 6;
    c.n_tok = 130;
    all.push_back(c);
    c = Case{};
    c.n_head = 32;
    c.n_head_kv = 1;  // a group wider than an item
    c.n_tok = 70;
    all.push_back(c);
    return all;
}

TEST(AttentionF16Tiled, EveryVariantGivesTheReferenceBits) {
    const quant::CpuFeatures f = quant::detect_cpu_features();
    if (!(f.avx2 && f.fma)) GTEST_SKIP() << "the vector kernels need AVX2 + FMA; only the reference runs here";
    const bool avx512 = fa_tiled::best_isa(f) == fa_tiled::Isa::Avx512;
    uint32_t seed = 1;
    for (const Case& c : cases()) {
        const Data d = make(c, seed++);
        const std::vector<float> want = run(d, AttentionTiledKernel::Reference);
        EXPECT_EQ(differing(run(d, AttentionTiledKernel::Avx2), want), 0) << "AVX2, " << describe(c);
        EXPECT_EQ(differing(run(d, AttentionTiledKernel::Best, 3), want), 0) << "Best, " << describe(c);
        if (avx512) {
            EXPECT_EQ(differing(run(d, AttentionTiledKernel::Avx512), want), 0) << "AVX-512, " << describe(c);
        }
    }
}

// Exact softmax attention in double: the tiled kernel's float sums stay close.
TEST(AttentionF16Tiled, IsAttention) {
    for (Case c : cases()) {
        if (c.scale > 1.0f) continue;
        const Data d = make(c, 99);
        const std::vector<float> got = run(d, AttentionTiledKernel::Best);
        const int d_head = c.head_dim, group = c.n_head / c.n_head_kv;
        double max_err = 0.0;
        for (int t = 0; t < c.n_tok; ++t) {
            for (int h = 0; h < c.n_head; ++h) {
                const float* q = d.q.data() + (static_cast<size_t>(t) * c.n_head + h) * d_head;
                std::vector<double> w;
                std::vector<int> keys;
                double max = -INFINITY;
                for (size_t j = 0; j < d.kv_pos.size(); ++j) {
                    const int kp = d.kv_pos[j], qp = d.q_pos[t];
                    if (kp > qp || (c.window > 0 && kp <= qp - c.window)) continue;
                    const float* k = d.k.data() + (j * c.n_head_kv + h / group) * d_head;
                    double s = 0;
                    for (int i = 0; i < d_head; ++i) s += static_cast<double>(q[i]) * k[i];
                    s *= d.p.scale;
                    if (c.softcap > 0) s = c.softcap * std::tanh(s / c.softcap);
                    w.push_back(s);
                    keys.push_back(static_cast<int>(j));
                    max = std::max(max, s);
                }
                double sum = 0;
                for (double& s : w) sum += s = std::exp(s - max);
                for (int i = 0; i < d_head; ++i) {
                    double acc = 0;
                    for (size_t a = 0; a < keys.size(); ++a) {
                        acc += w[a] * d.v[(static_cast<size_t>(keys[a]) * c.n_head_kv + h / group) * d_head + i];
                    }
                    const double out = got[(static_cast<size_t>(t) * c.n_head + h) * d_head + i];
                    max_err = std::max(max_err, std::abs(out - acc / sum));
                }
            }
        }
        EXPECT_LT(max_err, 2e-5) << describe(c);
    }
}

// llama.cpp cuts its queries into tiles of up to 64 wherever its thread chunks fall; the result of
// a query must not depend on that (nor here on the items of a call).
TEST(AttentionF16Tiled, AQueryDoesNotDependOnTheOthersOfItsCall) {
    Case c;
    c.n_tok = 150;
    const Data all = make(c, 5);
    const std::vector<float> want = run(all, AttentionTiledKernel::Best);
    for (int first : {0, 3, 64, 101}) {
        for (int count : {1, 7, 49}) {
            Data part = all;
            const size_t row = static_cast<size_t>(c.n_head) * c.head_dim;
            part.q.assign(all.q.begin() + first * row, all.q.begin() + (first + count) * row);
            part.q_pos.assign(all.q_pos.begin() + first, all.q_pos.begin() + first + count);
            const std::vector<float> got = run(part, AttentionTiledKernel::Best);
            ASSERT_EQ(0, std::memcmp(got.data(), want.data() + first * row, got.size() * sizeof(float)))
                << "queries " << first << " .. " << first + count - 1;
        }
    }
}

// The exponential of ggml's AVX-512 build: within its stated error of expf, 0 far below, exact at 0.
TEST(AttentionF16Tiled, GgmlExpIsAnExponential) {
    EXPECT_EQ(fa_tiled::ggml_expf(0.0f), 1.0f);
    EXPECT_EQ(fa_tiled::ggml_expf(-std::numeric_limits<float>::infinity()), 0.0f);
    EXPECT_EQ(fa_tiled::ggml_expf(-200.0f), 0.0f);
    for (float x = -103.0f; x <= 0.0f; x += 0.0371f) {
        const double want = std::exp(static_cast<double>(x));
        const float got = fa_tiled::ggml_expf(x);
        if (want < 1.2e-38) {
            EXPECT_NEAR(got, want, 3e-45) << x;  // subnormal results: within a unit of the smallest
        } else {
            EXPECT_NEAR(got / want, 1.0, 3e-7) << x;
        }
    }
}

}  // namespace
}  // namespace fitllm::ops
