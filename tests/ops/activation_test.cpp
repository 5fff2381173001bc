#include "ops/activation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "quant/blocks.h"

namespace fitllm::ops {
namespace {

TEST(Activation, SoftmaxMatchesDoubleAndIsStable) {
    std::vector<float> x = {1000.0f, 999.0f, 998.0f, -5.0f, 0.0f};  // exp(1000) would overflow
    std::vector<double> want(x.size());
    double sum = 0.0;
    for (size_t i = 0; i < x.size(); ++i) sum += want[i] = std::exp(static_cast<double>(x[i]) - 1000.0);
    softmax(x.data(), static_cast<int64_t>(x.size()));
    double total = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
        EXPECT_NEAR(x[i], want[i] / sum, 1e-6);
        total += x[i];
    }
    EXPECT_NEAR(total, 1.0, 1e-6);
}

TEST(Activation, SoftmaxHandlesMaskedEntries) {
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<float> x = {-inf, 0.0f, -inf, 0.0f};
    softmax(x.data(), 4);
    EXPECT_EQ(x[0], 0.0f);
    EXPECT_FLOAT_EQ(x[1], 0.5f);
    EXPECT_FLOAT_EQ(x[3], 0.5f);
    std::vector<float> all_masked = {-inf, -inf};
    softmax(all_masked.data(), 2);
    EXPECT_EQ(all_masked[0], 0.0f);
    EXPECT_EQ(all_masked[1], 0.0f);
}

TEST(Activation, SiluGeluAndGatedUnitsMatchFormulas) {
    for (double v = -8.0; v <= 8.0; v += 0.37) {
        const auto f = static_cast<float>(v);
        const double silu_want = v / (1.0 + std::exp(-v));
        const double gelu_want = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
        EXPECT_NEAR(silu(f), silu_want, 1e-6 * (1.0 + std::fabs(silu_want)));
        EXPECT_NEAR(gelu_tanh_exact(f), gelu_want, 1e-6 * (1.0 + std::fabs(gelu_want)));
        // The llama.cpp-compatible gelu rounds through f16 (11 significant bits) twice.
        EXPECT_NEAR(gelu(f), gelu_want, 2e-3 * std::fabs(v) + 1e-6);
    }
    EXPECT_EQ(gelu(-10.0f), 0.0f);
    EXPECT_EQ(gelu(-50.0f), 0.0f);
    EXPECT_EQ(gelu(10.0f), 10.0f);
    EXPECT_EQ(gelu(123.5f), 123.5f);
    // Inside (-10, 10) the result is an f16 value, as llama.cpp's table holds.
    for (float v : {-3.3f, -0.01f, 0.123456f, 2.71828f, 9.99f}) {
        const float g = gelu(v);
        EXPECT_EQ(g, quant::fp16_to_fp32(quant::fp32_to_fp16(g))) << v;
    }
    const std::vector<float> gate = {-2.0f, -0.5f, 0.0f, 0.5f, 3.0f};
    const std::vector<float> up = {1.0f, 2.0f, 3.0f, -4.0f, 0.25f};
    std::vector<float> sw(gate.size()), ge(gate.size()), si(gate.size()), gl(gate.size());
    swiglu(gate.data(), up.data(), 5, sw.data());
    geglu(gate.data(), up.data(), 5, ge.data());
    silu(gate.data(), 5, si.data());
    gelu(gate.data(), 5, gl.data());
    for (size_t i = 0; i < gate.size(); ++i) {
        EXPECT_FLOAT_EQ(sw[i], si[i] * up[i]);
        EXPECT_FLOAT_EQ(ge[i], gl[i] * up[i]);
    }
}

float via_half(float x) {
    return quant::fp16_to_fp32(quant::fp32_to_fp16(x));
}

// What gelu computed before it had a table: the formula on x rounded to f16, rounded to f16.
float gelu_by_formula(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return via_half(gelu_tanh_exact(via_half(x)));
}

bool same_bits_or_both_nan(float a, float b) {
    return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) || (std::isnan(a) && std::isnan(b));
}

void expect_gelu_matches_formula(const std::vector<float>& x) {
    const auto n = static_cast<int64_t>(x.size());
    std::vector<float> up(x.size()), array(x.size()), gated(x.size());
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (float& u : up) u = normal(rng);
    gelu(x.data(), n, array.data());
    geglu(x.data(), up.data(), n, gated.data());
    for (size_t i = 0; i < x.size(); ++i) {
        const float want = gelu_by_formula(x[i]);
        ASSERT_TRUE(same_bits_or_both_nan(gelu(x[i]), want))
            << "x " << x[i] << " bits " << std::bit_cast<uint32_t>(x[i]);
        ASSERT_TRUE(same_bits_or_both_nan(array[i], want)) << "x " << x[i] << " at " << i;
        // ggml stores +0 where x <= -10, whatever the sign of up.
        const float want_gated = x[i] <= -10.0f ? 0.0f : want * up[i];
        ASSERT_TRUE(same_bits_or_both_nan(gated[i], want_gated)) << "x " << x[i] << " at " << i;
    }
}

TEST(Activation, GeluTableMatchesTheFormulaOnEveryHalf) {
    std::vector<float> x(1u << 16);
    for (uint32_t h = 0; h < x.size(); ++h) x[h] = quant::fp16_to_fp32(static_cast<uint16_t>(h));
    expect_gelu_matches_formula(x);
}

TEST(Activation, GeluTableMatchesTheFormulaOnRandomFloats) {
    std::mt19937 rng(5);
    std::uniform_int_distribution<uint32_t> any_bits;
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> x;
    for (int i = 0; i < 300000; ++i) {
        uint32_t bits = any_bits(rng);
        if (i % 3 == 0) bits = (bits & 0x807FFFFFu) | ((100u + bits % 40u) << 23);  // |x| in [2^-27, 2^12)
        x.push_back(i % 3 == 2 ? normal(rng) : std::bit_cast<float>(bits));
    }
    for (const float v : {-10.0f, 10.0f, std::nextafter(-10.0f, 0.0f), std::nextafter(10.0f, 0.0f), 9.998f, -9.998f,
                          65504.0f, 65520.0f, -1e30f, 1e-40f, -0.0f, std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
        x.push_back(v);
    }
    x.resize(x.size() + 5, 0.5f);  // and a tail that is not a whole vector
    expect_gelu_matches_formula(x);
}

// The array silu and swiglu give exactly the scalar transcription of ggml's AVX-512 formula on
// whole groups of 16 and std::exp's silu on the rest; the formula stays within a few ulp of
// std::exp.
TEST(Activation, SiluMatchesGgmlSimdFormula) {
    std::mt19937 rng(9);
    std::uniform_int_distribution<uint32_t> any_bits;
    std::normal_distribution<float> normal(0.0f, 4.0f);
    std::vector<float> x;
    for (int i = 0; i < 200000; ++i) {
        uint32_t bits = any_bits(rng);
        bits = (bits & 0x807FFFFFu) | ((90u + bits % 46u) << 23);  // |x| in [2^-37, 2^9)
        x.push_back(i % 2 ? normal(rng) : std::bit_cast<float>(bits));
    }
    for (const float v :
         {0.0f, -0.0f, 88.0f, 88.8f, -88.8f, 89.0f, -89.0f, 100.0f, -100.0f, 133.0f, -133.0f, 200.0f, -200.0f, 1e10f,
          -1e10f, 1e-30f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
        x.push_back(v);
    }
    x.resize((x.size() + 15) / 16 * 16 + 7, -1.25f);  // a tail of 7 goes through std::exp
    const auto n = static_cast<int64_t>(x.size());
    const int64_t whole = n / 16 * 16;
    std::vector<float> up(x.size()), si(x.size()), sw(x.size());
    for (float& u : up) u = normal(rng);
    silu(x.data(), n, si.data());
    swiglu(x.data(), up.data(), n, sw.data());
    double max_rel = 0.0;
    float worst = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        const float want = i < whole ? silu_ggml_simd(x[i]) : silu(x[i]);
        ASSERT_TRUE(same_bits_or_both_nan(si[i], want)) << "x " << x[i] << " at " << i;
        ASSERT_TRUE(same_bits_or_both_nan(sw[i], want * up[i])) << "x " << x[i] << " at " << i;
        const float exact = silu(x[i]);
        if (std::isfinite(exact) && exact != 0.0f && std::fabs(exact) > 1e-30f) {
            const double rel = std::fabs(static_cast<double>(want) - exact) / std::fabs(exact);
            if (rel > max_rel) max_rel = rel, worst = x[i];
        }
    }
    std::printf("max relative difference of the ggml SIMD silu to std::exp's: %.3g (%.2f ulp) at x = %g\n", max_rel,
                max_rel / std::ldexp(1.0, -23), worst);
    EXPECT_LT(max_rel, 8 * std::ldexp(1.0, -23));
    EXPECT_EQ(exp_ggml_simd(0.0f), 1.0f);
    EXPECT_EQ(exp_ggml_simd(-200.0f), 0.0f);
    EXPECT_EQ(exp_ggml_simd(200.0f), std::numeric_limits<float>::infinity());
    EXPECT_TRUE(std::isnan(exp_ggml_simd(std::numeric_limits<float>::quiet_NaN())));
    for (float v = -87.0f; v < 88.0f; v += 0.173f) EXPECT_NEAR(exp_ggml_simd(v), std::exp(v), 4e-7f * std::exp(v)) << v;
}

// gpt-oss's clamped SwiGLU (ggml_swiglu_oai): the gate capped above only, up clamped both ways,
// sigmoid(alpha x) and (up + 1), in double against the formula; in place over the gate.
TEST(Activation, SwigluOaiClampsAsGgml) {
    const std::vector<float> gate = {10.0f, -1.0f, 0.5f, -30.0f, 7.0f, 3.0f};
    const std::vector<float> up = {-10.0f, 0.5f, 20.0f, 1.0f, -7.5f, -1.0f};
    std::vector<float> y = gate;
    swiglu_oai(y.data(), up.data(), static_cast<int64_t>(y.size()), 1.702f, 7.0f, y.data());
    for (size_t i = 0; i < gate.size(); ++i) {
        const double x = std::min(gate[i], 7.0f);
        const double u = std::clamp(up[i], -7.0f, 7.0f);
        const double want = x / (1.0 + std::exp(-1.702 * x)) * (u + 1.0);
        EXPECT_NEAR(y[i], want, 1e-5 * std::max(1.0, std::abs(want))) << i;
    }
    EXPECT_FLOAT_EQ(y[5], 0.0f);  // up -1: (u + 1) = 0, the gate passes nothing
}

TEST(Activation, SoftcapBoundsValuesSmoothly) {
    std::vector<float> x = {-1000.0f, -30.0f, 0.0f, 1.0f, 30.0f, 1000.0f};
    const std::vector<float> orig = x;
    softcap(x.data(), static_cast<int64_t>(x.size()), 30.0f);
    for (size_t i = 0; i < x.size(); ++i) {
        EXPECT_NEAR(x[i], 30.0 * std::tanh(orig[i] / 30.0), 1e-5);
        EXPECT_LE(std::fabs(x[i]), 30.0f);
    }
}

TEST(Activation, AddAndScale) {
    std::vector<float> a = {1, 2, 3}, b = {4, 5, 6};
    add(a.data(), b.data(), 3, a.data());
    EXPECT_EQ(a, (std::vector<float>{5, 7, 9}));
    scale(a.data(), 3, 2.0f);
    EXPECT_EQ(a, (std::vector<float>{10, 14, 18}));
    std::vector<float> rows = {1, 2, 3, 10, 20, 30};
    add_bias(rows.data(), b.data(), 2, 3);
    EXPECT_EQ(rows, (std::vector<float>{5, 7, 9, 14, 25, 36}));
}

}  // namespace
}  // namespace fitllm::ops
