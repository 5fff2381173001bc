#include "ops/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

namespace fitllm::ops {
namespace {

// Naive attention: every score in double, masked, one softmax per row, weighted sum of V.
std::vector<float> reference_attention(const std::vector<float>& q, const std::vector<int32_t>& q_pos,
                                       const std::vector<float>& k, const std::vector<float>& v,
                                       const std::vector<int32_t>& kv_pos, const AttentionParams& p) {
    const size_t n_tok = q_pos.size(), n_kv = kv_pos.size(), d = p.head_dim;
    std::vector<float> out(n_tok * p.n_head * d, 0.0f);
    for (size_t t = 0; t < n_tok; ++t) {
        for (int h = 0; h < p.n_head; ++h) {
            const size_t g = h / (p.n_head / p.n_head_kv);
            std::vector<double> score(n_kv, -INFINITY);
            double max = -INFINITY;
            for (size_t j = 0; j < n_kv; ++j) {
                if (kv_pos[j] > q_pos[t]) continue;
                if (p.sliding_window > 0 && kv_pos[j] <= q_pos[t] - p.sliding_window) continue;
                double s = 0;
                for (size_t i = 0; i < d; ++i) {
                    s += static_cast<double>(q[(t * p.n_head + h) * d + i]) * k[(j * p.n_head_kv + g) * d + i];
                }
                s *= p.scale;
                if (p.softcap > 0) s = p.softcap * std::tanh(s / p.softcap);
                score[j] = s;
                max = std::max(max, s);
            }
            if (max == -INFINITY) continue;
            double sum = 0;
            for (double& s : score) sum += s = std::exp(s - max);
            for (size_t i = 0; i < d; ++i) {
                double acc = 0;
                for (size_t j = 0; j < n_kv; ++j) acc += score[j] * v[(j * p.n_head_kv + g) * d + i];
                out[(t * p.n_head + h) * d + i] = static_cast<float>(acc / sum);
            }
        }
    }
    return out;
}

void check(const AttentionParams& p, int n_tok, int n_kv, int n_threads, int32_t first_q_pos = -1) {
    std::mt19937 rng(static_cast<unsigned>(n_tok * 131 + n_kv));
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> q(static_cast<size_t>(n_tok * p.n_head * p.head_dim));
    std::vector<float> k(static_cast<size_t>(n_kv * p.n_head_kv * p.head_dim)), v(k.size());
    for (float& x : q) x = dist(rng);
    for (float& x : k) x = dist(rng);
    for (float& x : v) x = dist(rng);
    std::vector<int32_t> kv_pos(static_cast<size_t>(n_kv)), q_pos(static_cast<size_t>(n_tok));
    for (int j = 0; j < n_kv; ++j) kv_pos[j] = j;
    // By default the queries are the last n_tok cells (prefill / decode of a causal sequence).
    const int32_t q0 = first_q_pos >= 0 ? first_q_pos : n_kv - n_tok;
    for (int t = 0; t < n_tok; ++t) q_pos[t] = q0 + t;

    const std::vector<float> want = reference_attention(q, q_pos, k, v, kv_pos, p);
    std::vector<float> got(want.size(), 123.0f);
    ThreadPool pool(n_threads);
    Scratch scratch;
    attention(q.data(), q_pos.data(), n_tok, k.data(), v.data(), kv_pos.data(), n_kv, p, got.data(), pool, scratch);
    for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-5 * (1.0 + std::fabs(want[i])))
            << "n_tok " << n_tok << " n_kv " << n_kv << " threads " << n_threads << " index " << i;
    }
}

AttentionParams params(int n_head, int n_head_kv, int head_dim) {
    AttentionParams p;
    p.n_head = n_head;
    p.n_head_kv = n_head_kv;
    p.head_dim = head_dim;
    p.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    return p;
}

TEST(Attention, GroupedQueryCausalMatchesNaive) {
    for (auto [n_head, n_head_kv] : {std::pair{4, 4}, std::pair{4, 2}, std::pair{6, 1}}) {
        for (int n_kv : {1, 63, 64, 65, 150}) {
            for (int n_tok : {1, 3}) {
                if (n_tok > n_kv) continue;
                check(params(n_head, n_head_kv, 16), n_tok, n_kv, 1 + (n_kv % 3));
            }
        }
    }
}

TEST(Attention, WideHeadsAndThreads) {
    for (int n_threads = 1; n_threads <= 3; ++n_threads) check(params(8, 2, 64), 5, 130, n_threads);
}

TEST(Attention, SoftcapMatchesNaive) {
    AttentionParams p = params(4, 2, 32);
    p.scale = 1.0f;  // large raw scores, so the cap matters
    p.softcap = 5.0f;
    check(p, 4, 100, 2);
}

TEST(Attention, SlidingWindowMatchesNaive) {
    AttentionParams p = params(4, 1, 16);
    for (int window : {1, 10, 64, 100, 1000}) {
        p.sliding_window = window;
        check(p, 6, 200, 2);
    }
}

TEST(Attention, QueryThatSeesNoKeyGetsZeros) {
    // Every cached key lies after the query's position.
    AttentionParams p = params(2, 1, 8);
    const std::vector<float> q(16, 1.0f), k(5 * 8, 1.0f), v(5 * 8, 1.0f);
    const std::vector<int32_t> kv_pos = {10, 11, 12, 13, 14};
    const int32_t q_pos = 3;
    std::vector<float> out(16, 7.0f);
    ThreadPool pool(1);
    Scratch scratch;
    attention(q.data(), &q_pos, 1, k.data(), v.data(), kv_pos.data(), 5, p, out.data(), pool, scratch);
    for (float x : out) EXPECT_EQ(x, 0.0f);
}

TEST(Attention, RejectsHeadCountsThatDoNotGroup) {
    ThreadPool pool(1);
    Scratch scratch;
    float x = 0;
    int32_t pos = 0;
    EXPECT_THROW(attention(&x, &pos, 1, &x, &x, &pos, 1, params(3, 2, 1), &x, pool, scratch), std::invalid_argument);
}

}  // namespace
}  // namespace fitllm::ops
