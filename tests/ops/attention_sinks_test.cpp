// gpt-oss's attention sinks (AttentionParams::sinks) in the attention kernels over plain arrays:
// ops::attention, every kernel of attention_f16 and of attention_f16_tiled. Each against exact
// attention in double whose softmax denominator has exp(sink) for the query's head (the f16
// kernels within f16's rounding: q rounded to f16, V summed in f16); the kernels
// that must agree bit for bit still do with sinks; a query that sees no key still gets zeros.
// (The paged cache's kernels: tests/ops/attention_kv_test.cpp, SinksJoinTheSoftmax...)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ops/attention.h"
#include "ops/attention_f16.h"
#include "ops/attention_f16_tiled.h"
#include "ops/scratch.h"
#include "ops/thread_pool.h"

namespace fitllm::ops {
namespace {

struct Data {
    AttentionParams p;
    std::vector<float> q, k, v, sinks;
    std::vector<int32_t> q_pos, kv_pos;
    int64_t n_tok = 0, n_kv = 0;
};

// n_tok queries at the last positions of n_kv keys; K and V hold f16 values (what the f16 kernels
// take). Sinks: one above every score, others near and below them.
Data make(int n_head, int n_head_kv, int head_dim, int64_t n_tok, int64_t n_kv, uint32_t seed) {
    Data d;
    d.p = AttentionParams{.n_head = n_head,
                          .n_head_kv = n_head_kv,
                          .head_dim = head_dim,
                          .scale = 1.0f / std::sqrt(static_cast<float>(head_dim))};
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.5f);
    d.n_tok = n_tok;
    d.n_kv = n_kv;
    d.q.resize(static_cast<size_t>(n_tok * n_head * head_dim));
    d.k.resize(static_cast<size_t>(n_kv * n_head_kv * head_dim));
    d.v.resize(d.k.size());
    for (float& x : d.q) x = normal(rng);
    for (float& x : d.k) x = round_to_f16(normal(rng));
    for (float& x : d.v) x = round_to_f16(normal(rng));
    for (int64_t j = 0; j < n_kv; ++j) d.kv_pos.push_back(static_cast<int32_t>(j));
    for (int64_t t = 0; t < n_tok; ++t) d.q_pos.push_back(static_cast<int32_t>(n_kv - n_tok + t));
    const float pattern[] = {9.0f, -3.0f, 0.7f, 2.5f, -0.5f, 1.0f, 4.0f, -6.0f};
    for (int h = 0; h < n_head; ++h) d.sinks.push_back(pattern[h % 8]);
    d.p.sinks = d.sinks.data();
    return d;
}

std::vector<float> reference(const Data& d, bool with_sinks) {
    const AttentionParams& p = d.p;
    const int64_t D = p.head_dim;
    const int group = p.n_head / p.n_head_kv;
    std::vector<float> out(d.q.size(), 0.0f);
    for (int64_t t = 0; t < d.n_tok; ++t) {
        for (int h = 0; h < p.n_head; ++h) {
            const float* q = d.q.data() + (t * p.n_head + h) * D;
            const int64_t g = h / group;
            std::vector<double> s;
            std::vector<int64_t> seen;
            double max = with_sinks ? d.sinks[h] : -INFINITY;
            for (int64_t j = 0; j < d.n_kv; ++j) {
                if (d.kv_pos[j] > d.q_pos[t]) continue;
                double dot = 0;
                for (int64_t i = 0; i < D; ++i) dot += static_cast<double>(q[i]) * d.k[(j * p.n_head_kv + g) * D + i];
                s.push_back(dot * p.scale);
                seen.push_back(j);
                max = std::max(max, s.back());
            }
            if (seen.empty()) continue;
            double sum = with_sinks ? std::exp(d.sinks[h] - max) : 0.0;
            for (double& x : s) sum += x = std::exp(x - max);
            for (int64_t i = 0; i < D; ++i) {
                double acc = 0;
                for (size_t j = 0; j < seen.size(); ++j) acc += s[j] * d.v[(seen[j] * p.n_head_kv + g) * D + i];
                out[(t * p.n_head + h) * D + i] = static_cast<float>(acc / sum);
            }
        }
    }
    return out;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
    return m;
}

template <class F>
std::vector<float> run(const Data& d, F&& kernel) {
    std::vector<float> out(d.q.size(), NAN);
    ThreadPool pool(2);
    Scratch scratch;
    kernel(out.data(), pool, scratch);
    return out;
}

TEST(AttentionSinks, EveryArrayKernelTakesThem) {
    struct Shape {
        int n_head, n_head_kv, head_dim;
        int64_t n_tok, n_kv;
    };
    for (const Shape sh : {Shape{8, 2, 64, 1, 50}, Shape{8, 2, 64, 9, 90}, Shape{6, 6, 80, 3, 40},
                           Shape{8, 1, 64, 70, 140}, Shape{4, 2, 128, 2, 33}}) {
        const Data d = make(sh.n_head, sh.n_head_kv, sh.head_dim, sh.n_tok, sh.n_kv, 7);
        const std::vector<float> want = reference(d, true);
        ASSERT_GT(max_diff(reference(d, false), want), 0.1) << "the sinks must matter in this test";
        const auto plain = run(d, [&](float* out, ThreadPool& pool, Scratch& scratch) {
            attention(d.q.data(), d.q_pos.data(), d.n_tok, d.k.data(), d.v.data(), d.kv_pos.data(), d.n_kv, d.p, out,
                      pool, scratch);
        });
        EXPECT_LE(max_diff(plain, want), 1e-5) << "attention, head_dim " << sh.head_dim;
        std::vector<float> f16_best;
        for (AttentionF16Kernel kernel :
             {AttentionF16Kernel::Best, AttentionF16Kernel::Avx2, AttentionF16Kernel::OneQuery}) {
            const auto got = run(d, [&](float* out, ThreadPool& pool, Scratch& scratch) {
                attention_f16(d.q.data(), d.q_pos.data(), d.n_tok, d.k.data(), d.v.data(), d.kv_pos.data(), d.n_kv, d.p,
                              out, pool, scratch, kernel);
            });
            EXPECT_LE(max_diff(got, want), 2e-2) << "attention_f16 kernel " << static_cast<int>(kernel);
            if (kernel == AttentionF16Kernel::Best) f16_best = got;
            if (kernel == AttentionF16Kernel::OneQuery) {  // the same order as Best: the same bits
                EXPECT_EQ(0, std::memcmp(got.data(), f16_best.data(), got.size() * sizeof(float)))
                    << "head_dim " << sh.head_dim;
            }
        }
        std::vector<float> tiled_ref;
        for (AttentionTiledKernel kernel : {AttentionTiledKernel::Reference, AttentionTiledKernel::Avx2,
                                            AttentionTiledKernel::Avx512, AttentionTiledKernel::Best}) {
            const auto got = run(d, [&](float* out, ThreadPool& pool, Scratch& scratch) {
                attention_f16_tiled(d.q.data(), d.q_pos.data(), d.n_tok, d.k.data(), d.v.data(), d.kv_pos.data(),
                                    d.n_kv, d.p, out, pool, scratch, kernel);
            });
            EXPECT_LE(max_diff(got, want), 1e-5) << "attention_f16_tiled kernel " << static_cast<int>(kernel);
            if (kernel == AttentionTiledKernel::Reference) tiled_ref = got;
            EXPECT_EQ(0, std::memcmp(got.data(), tiled_ref.data(), got.size() * sizeof(float)))
                << "tiled kernel " << static_cast<int>(kernel) << " vs its reference";
        }
    }
}

TEST(AttentionSinks, AQueryThatSeesNoKeyGetsZeros) {
    Data d = make(4, 2, 64, 2, 10, 3);
    d.q_pos = {-1, -5};  // before every key
    for (const auto& got : {run(d,
                                [&](float*out, ThreadPool&pool, Scratch&scratch) {
                                    attention(d.q.data(), d.q_pos.data(), d.n_tok, d.k.data(), d.v.data(),
                                              d.kv_pos.data(), d.n_kv, d.p, out, pool, scratch);
                                }),
                            run(d,
                                [&](float*out, ThreadPool&pool, Scratch&scratch) {
                                    attention_f16(d.q.data(), d.q_pos.data(), d.n_tok, d.k.data(), d.v.data(),
                                                  d.kv_pos.data(), d.n_kv, d.p, out, pool, scratch);
                                }),
                            run(d, [&](float*out, ThreadPool&pool, Scratch&scratch) {
                                attention_f16_tiled(d.q.data(), d.q_pos.data(), d.n_tok, d.k.data(), d.v.data(),
                                                    d.kv_pos.data(), d.n_kv, d.p, out, pool, scratch);
                            })}) {
        for (float x : got) ASSERT_EQ(x, 0.0f);
    }
}

}  // namespace
}  // namespace fitllm::ops
