// Attention with llama.cpp's f16 accumulation, and its f16 rounding helper.
#include "ops/attention_f16.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "quant/blocks.h"
#include "quant/cpu_features.h"

namespace fitllm::ops {
namespace {

float via_half(float x) {
    return quant::fp16_to_fp32(quant::fp32_to_fp16(x));
}

TEST(AttentionF16, RoundToF16MatchesTheReferenceConversion) {
    std::mt19937 rng(7);
    std::uniform_int_distribution<uint32_t> any_bits;
    for (int i = 0; i < 200000; ++i) {
        uint32_t bits = any_bits(rng);
        if (i % 2) bits = (bits & 0x807FFFFFu) | ((100u + bits % 60u) << 23);  // mostly the f16 range
        float x;
        std::memcpy(&x, &bits, sizeof x);
        if (std::isnan(x)) continue;
        ASSERT_EQ(round_to_f16(x), via_half(x)) << "bits " << std::hex << bits;
    }
    for (const float x : {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, -70000.0f, 6.1035156e-05f, 5.9604645e-08f,
                          2.9802322e-08f, 8.9406967e-08f, 1.0f + 1.0f / 2048.0f, 1.0f + 3.0f / 2048.0f}) {
        EXPECT_EQ(round_to_f16(x), via_half(x)) << x;
    }
    EXPECT_TRUE(std::isnan(round_to_f16(std::numeric_limits<float>::quiet_NaN())));
}

// With f16-representable inputs the result stays within f16 accumulation error of the float op.
TEST(AttentionF16, AgreesWithFloatAttentionToHalfPrecision) {
    const int n_tok = 5, n_kv = 9, n_head = 4, n_head_kv = 2, d = 64;
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> q(n_tok * n_head * d), k(n_kv * n_head_kv * d), v(n_kv * n_head_kv * d);
    for (float& x : q) x = normal(rng);
    for (float& x : k) x = via_half(normal(rng));
    for (float& x : v) x = via_half(normal(rng));
    std::vector<int32_t> q_pos = {4, 5, 6, 7, 8}, kv_pos = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    AttentionParams p{.n_head = n_head, .n_head_kv = n_head_kv, .head_dim = d, .scale = 0.125f, .sliding_window = 3};
    ThreadPool pool(2);
    Scratch scratch;
    std::vector<float> expected(q.size()), got(q.size());
    attention(q.data(), q_pos.data(), n_tok, k.data(), v.data(), kv_pos.data(), n_kv, p, expected.data(), pool,
              scratch);
    attention_f16(q.data(), q_pos.data(), n_tok, k.data(), v.data(), kv_pos.data(), n_kv, p, got.data(), pool, scratch);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-2f) << i;
}

// The kernels' vectorized exp is std::exp, bit for bit, over the arguments the softmax gives
// (<= 0, -inf, NaN) and beyond.
TEST(AttentionF16, KernelExpIsStdExp) {
    std::mt19937 rng(23);
    std::uniform_int_distribution<uint32_t> any_bits;
    std::uniform_real_distribution<float> moderate(-110.0f, 0.0f);
    std::vector<float> x;
    for (int i = 0; i < 600000; ++i) {
        const uint32_t bits = any_bits(rng);
        x.push_back(i % 3 == 0 ? moderate(rng) : std::bit_cast<float>(i % 3 == 1 ? bits | 0x80000000u : bits));
    }
    for (const float v : {0.0f, -0.0f, -88.0f, -87.99f, -103.5f, -104.0f, -150.0f, 88.5f, 89.0f, 1e-30f, -1e-30f,
                          -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::denorm_min()}) {
        x.push_back(v);
    }
    for (const AttentionF16Kernel kernel : {AttentionF16Kernel::Best, AttentionF16Kernel::Avx2}) {
        for (size_t i = 0; i < x.size(); i += 8) {
            const int n = static_cast<int>(std::min<size_t>(8, x.size() - i)) - static_cast<int>(i / 8 % 3);
            if (n <= 0) continue;
            float y[8];
            attention_f16_exp(x.data() + i, n, y, kernel);
            for (int l = 0; l < n; ++l) {
                const float want = std::exp(x[i + l]);
                ASSERT_TRUE(std::bit_cast<uint32_t>(y[l]) == std::bit_cast<uint32_t>(want) ||
                            (std::isnan(y[l]) && std::isnan(want)))
                    << "exp(" << x[i + l] << ") = " << y[l] << ", std::exp " << want;
            }
        }
    }
}

// ggml_vec_dot_f16(k, q) as llama.cpp's build with `lanes`-lane vectors computes it: 4 fused
// accumulators of `lanes` lanes over steps of 4 * lanes; sum0 += sum2, sum1 += sum3, sum0 += sum1;
// then the reduction of the AVX2 build (halves, then two horizontal adds) or of the AVX-512 one
// (GCC's _mm512_reduce_add_ps: halves, halves, then lanes {0,1} + {2,3} and the two); the elements
// past the last whole step added in double.
float ggml_dot_f16(const float* k, const float* q, int d, int lanes) {
    std::vector<float> sum(4 * lanes, 0.0f);
    const int step = 4 * lanes;
    int i = 0;
    for (; i + step <= d; i += step) {
        for (int j = 0; j < 4; ++j) {
            for (int l = 0; l < lanes; ++l) {
                sum[j * lanes + l] = std::fma(k[i + j * lanes + l], q[i + j * lanes + l], sum[j * lanes + l]);
            }
        }
    }
    std::vector<float> x(lanes);
    for (int l = 0; l < lanes; ++l) {
        x[l] = (sum[0 * lanes + l] + sum[2 * lanes + l]) + (sum[1 * lanes + l] + sum[3 * lanes + l]);
    }
    float reduced;
    if (lanes == 8) {
        float t[4];
        for (int l = 0; l < 4; ++l) t[l] = x[l] + x[l + 4];
        reduced = (t[0] + t[1]) + (t[2] + t[3]);  // _mm_hadd_ps twice
    } else {
        float h[8], t[4];
        for (int l = 0; l < 8; ++l) h[l] = x[l + 8] + x[l];
        for (int l = 0; l < 4; ++l) t[l] = h[l + 4] + h[l];
        reduced = (t[0] + t[2]) + (t[1] + t[3]);
    }
    double total = reduced;
    for (; i < d; ++i) total += static_cast<double>(k[i] * q[i]);
    return static_cast<float>(total);
}

// llama.cpp's f16 flash attention written out plainly for one query at a time: q rounded to f16,
// q·k as ggml_dot_f16 with `lanes`-lane vectors, keys in order with an online softmax (the
// soft-cap folded into the scale as ggml does), the V accumulator rounded to f16 after every
// rescale and multiply-add.
void reference_attention_f16(const float* q, const int32_t* q_pos, int64_t n_tok, const float* k, const float* v,
                             const int32_t* kv_pos, int64_t n_kv, const AttentionParams& p, int lanes, float* out) {
    const int d = p.head_dim;
    const int group = p.n_head / p.n_head_kv;
    std::vector<float> q16(d), acc(d);
    for (int64_t t = 0; t < n_tok; ++t) {
        for (int h = 0; h < p.n_head; ++h) {
            const float* qr = q + (t * p.n_head + h) * d;
            for (int i = 0; i < d; ++i) q16[i] = via_half(qr[i]);
            std::fill(acc.begin(), acc.end(), 0.0f);
            float running_max = -std::numeric_limits<float>::infinity();
            float sum = 0.0f;
            for (int64_t j = 0; j < n_kv; ++j) {
                if (kv_pos[j] > q_pos[t]) continue;
                if (p.sliding_window > 0 && kv_pos[j] <= q_pos[t] - p.sliding_window) continue;
                const float* kj = k + (j * p.n_head_kv + h / group) * d;
                const float* vj = v + (j * p.n_head_kv + h / group) * d;
                const float dot = ggml_dot_f16(kj, q16.data(), d, lanes);
                float s = dot * p.scale;
                if (p.softcap > 0.0f) s = p.softcap * std::tanh(dot * (p.scale / p.softcap));
                float rescale = 1.0f, weight = 1.0f;
                if (s > running_max) {
                    rescale = std::exp(running_max - s);
                    running_max = s;
                    for (int i = 0; i < d; ++i) acc[i] = via_half(acc[i] * rescale);
                } else {
                    weight = std::exp(s - running_max);
                }
                for (int i = 0; i < d; ++i) acc[i] = via_half(std::fma(vj[i], weight, acc[i]));
                sum = std::fma(sum, rescale, weight);
            }
            const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
            float* o = out + (t * p.n_head + h) * d;
            for (int i = 0; i < d; ++i) o[i] = acc[i] * inv;
        }
    }
}

struct Case {
    int n_tok, n_kv, n_head, n_head_kv, d, sliding_window, threads;
    float softcap;
    bool shuffled;  // kv cells out of position order, one of them unused
};

// Bit for bit the reference, whatever the kernel, the blocking of queries and the split over threads:
// with ggml's AVX2 dot order for the Avx2 kernel (and on CPUs without AVX-512), with its AVX-512
// order for Best and OneQuery on a CPU with AVX-512.
TEST(AttentionF16, BitIdenticalToTheReference) {
    const Case cases[] = {
        {7, 7, 4, 1, 256, 0, 2, 0.0f, false},    {33, 40, 4, 1, 256, 0, 2, 0.0f, false},
        {1, 50, 4, 1, 256, 0, 2, 0.0f, false},   {19, 30, 8, 2, 64, 5, 3, 0.0f, false},
        {12, 12, 16, 1, 32, 0, 2, 0.0f, false},  {9, 20, 6, 6, 128, 0, 1, 0.0f, true},
        {10, 24, 12, 4, 64, 0, 2, 30.0f, true},  {5, 16, 2, 1, 96, 4, 2, 0.0f, false},
        {64, 64, 4, 1, 256, 16, 2, 0.0f, false}, {11, 15, 14, 2, 64, 0, 2, 0.0f, false},
        {6, 40, 32, 8, 128, 0, 2, 0.0f, false},  {5, 16, 2, 1, 80, 0, 2, 0.0f, false},
    };
    const quant::CpuFeatures f = quant::host_cpu_features();
    const int host_lanes = f.avx2 && f.fma && f.f16c && f.avx512f && f.avx512vl ? 16 : 8;
    std::mt19937 rng(17);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    int orders_differ = 0;
    for (const Case& c : cases) {
        SCOPED_TRACE(testing::Message() << "n_tok " << c.n_tok << " n_kv " << c.n_kv << " heads " << c.n_head << "/"
                                        << c.n_head_kv << " d " << c.d);
        std::vector<float> q(c.n_tok * c.n_head * c.d), k(c.n_kv * c.n_head_kv * c.d), v(k.size());
        for (float& x : q) x = 0.4f * normal(rng);
        for (float& x : k) x = via_half(normal(rng));
        for (float& x : v) x = via_half(normal(rng));
        std::vector<int32_t> kv_pos(c.n_kv), q_pos(c.n_tok);
        const int first = c.n_kv - c.n_tok;
        for (int j = 0; j < c.n_kv; ++j) kv_pos[j] = j;
        for (int t = 0; t < c.n_tok; ++t) q_pos[t] = first + t;
        if (c.shuffled) {
            std::shuffle(kv_pos.begin(), kv_pos.end(), rng);
            kv_pos[c.n_kv / 2] = 1 << 30;  // an unused cell: never visible
        }
        const AttentionParams p{.n_head = c.n_head,
                                .n_head_kv = c.n_head_kv,
                                .head_dim = c.d,
                                .scale = 1.0f / std::sqrt(static_cast<float>(c.d)),
                                .softcap = c.softcap,
                                .sliding_window = c.sliding_window};
        ThreadPool pool(c.threads);
        Scratch scratch;
        std::vector<float> want_avx2(q.size()), want_host(q.size());
        reference_attention_f16(q.data(), q_pos.data(), c.n_tok, k.data(), v.data(), kv_pos.data(), c.n_kv, p, 8,
                                want_avx2.data());
        reference_attention_f16(q.data(), q_pos.data(), c.n_tok, k.data(), v.data(), kv_pos.data(), c.n_kv, p,
                                host_lanes, want_host.data());
        orders_differ += want_avx2 != want_host;
        for (const AttentionF16Kernel kernel :
             {AttentionF16Kernel::Best, AttentionF16Kernel::Avx2, AttentionF16Kernel::OneQuery}) {
            SCOPED_TRACE(testing::Message() << "kernel " << static_cast<int>(kernel));
            const std::vector<float>& want = kernel == AttentionF16Kernel::Avx2 ? want_avx2 : want_host;
            std::vector<float> got(q.size(), -1.0f);
            attention_f16(q.data(), q_pos.data(), c.n_tok, k.data(), v.data(), kv_pos.data(), c.n_kv, p, got.data(),
                          pool, scratch, kernel);
            for (size_t i = 0; i < got.size(); ++i) {
                ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
                    << "at " << i << ": " << got[i] << " vs " << want[i];
            }
        }
    }
    if (host_lanes == 16) {
        EXPECT_GT(orders_differ, 0) << "no case tells the AVX-512 dot order from the AVX2 one";
    }
}

}  // namespace
}  // namespace fitllm::ops
