#include "ops/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
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
