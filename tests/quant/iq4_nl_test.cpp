// IQ4_NL (the KV cache format of llama.cpp's -ctk / -ctv iq4_nl): the table lookup of dequantize_row
// on a hand-made block, the two quantizers (quantize_row as llama.cpp's quantize_row_iq4_nl_ref,
// quantize_row_iq4_nl_searched as its quantize_iq4_nl without importance weights) on values worked
// out by hand and on Gaussian data. ggml_oracle_test.cpp holds their bytes to llama.cpp's own, and
// dot_test.cpp the dot kernels (IQ4_NL x Q8_0, every ISA level) to the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "quant/blocks.h"
#include "quant/dequantize.h"
#include "quant/dot.h"
#include "quant/quantize.h"
#include "quant_test_data.h"

namespace fitllm::quant {
namespace {

constexpr uint16_t kHalfHalf = 0x3800;

std::vector<BlockIQ4_NL> quantized(const std::vector<float>& x, bool searched) {
    std::vector<BlockIQ4_NL> b(x.size() / 32);
    if (searched)
        quantize_row_iq4_nl_searched(x.data(), b.data(), static_cast<int64_t>(x.size()));
    else
        quantize_row(GgmlType::IQ4_NL, x.data(), b.data(), static_cast<int64_t>(x.size()));
    return b;
}

std::vector<float> dequantized(const std::vector<BlockIQ4_NL>& b) {
    return test::dequantized(GgmlType::IQ4_NL, b.data(), static_cast<int>(b.size() * 32));
}

// RMS error / RMS of x.
double relative_rms(const std::vector<float>& x, const std::vector<float>& y) {
    double err2 = 0, sig2 = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        err2 += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
        sig2 += static_cast<double>(x[i]) * x[i];
    }
    return std::sqrt(err2 / sig2);
}

TEST(IQ4_NL, TypeSupport) {
    EXPECT_TRUE(can_dequantize(GgmlType::IQ4_NL));
    EXPECT_TRUE(can_quantize(GgmlType::IQ4_NL));
    EXPECT_TRUE(has_dot(GgmlType::IQ4_NL));
    EXPECT_EQ(dot_activation_type(GgmlType::IQ4_NL), GgmlType::Q8_0);
    EXPECT_EQ(*row_bytes(GgmlType::IQ4_NL, 4096), 4096u / 32 * sizeof(BlockIQ4_NL));
    std::vector<float> x(64), y(64);
    std::vector<uint8_t> q(64);
    EXPECT_THROW(quantize_row(GgmlType::IQ4_NL, x.data(), q.data(), 33), std::invalid_argument);
    EXPECT_THROW(quantize_row_iq4_nl_searched(x.data(), q.data(), 48), std::invalid_argument);
    EXPECT_THROW(dequantize_row(GgmlType::IQ4_NL, q.data(), y.data(), 16), std::invalid_argument);
}

// Element l < 16 is the low nibble of qs[l], element 16 + l its high nibble; each indexes the table.
TEST(IQ4_NL, DequantizeLooksUpTheTable) {
    BlockIQ4_NL b{};
    b.d = kHalfHalf;
    for (int l = 0; l < 16; ++l) b.qs[l] = static_cast<uint8_t>(l | ((15 - l) << 4));
    const auto y = dequantized({b});
    for (int l = 0; l < 16; ++l) {
        ASSERT_EQ(y[l], 0.5f * kValuesIQ4NL[l]) << l;
        ASSERT_EQ(y[16 + l], 0.5f * kValuesIQ4NL[15 - l]) << l;
    }
    EXPECT_EQ(y[0], -63.5f);
    EXPECT_EQ(y[7], -5.0f);
    EXPECT_EQ(y[8], 0.5f);
    EXPECT_EQ(y[15], 56.5f);
    EXPECT_EQ(y[16], 56.5f);
    EXPECT_EQ(y[31], -63.5f);
}

// Values on the grid (a power of two times the table, -127 the largest magnitude) come back exactly
// from both quantizers: the first scale maps them onto the table and the least-squares refit keeps it.
TEST(IQ4_NL, GridValuesSurvive) {
    for (float c : {1.0f, 0.25f, 1.0f / 64}) {
        std::vector<float> x(64);
        for (int l = 0; l < 64; ++l) x[l] = c * kValuesIQ4NL[(l * 7 + 3) % 16];
        x[5] = -127.0f * c;  // the first of two largest magnitudes (x[11] is the other)
        for (bool searched : {false, true}) {
            const auto b = quantized(x, searched);
            EXPECT_EQ(fp16_to_fp32(b[0].d), c) << c << (searched ? " searched" : "");
            EXPECT_EQ(dequantized(b), x) << c << (searched ? " searched" : "");
        }
    }
}

// The largest |x| goes to the table's -127 end whatever its sign (d takes the sign), and for
// quantize_row the indices are those of that first scale: each value to the nearest table entry.
TEST(IQ4_NL, LargestMagnitudeMapsToMinus127) {
    std::vector<float> x(32, 0.0f);
    x[3] = 12.7f;  // d0 = -0.1: x / d0 = -127
    x[4] = -1.0f;  // +10: table value 13 (index 9) is nearer than 1 (index 8)
    x[5] = 0.7f;   // -7: -10 (index 7) is nearer than 1
    x[6] = -0.6f;  // +6: below the midpoint 7 of 1 and 13, so 1 (index 8)
    const auto b = quantized(x, false);
    auto index = [&](int l) { return l < 16 ? (b[0].qs[l] & 15) : (b[0].qs[l - 16] >> 4); };
    EXPECT_EQ(index(3), 0);
    EXPECT_EQ(index(4), 9);
    EXPECT_EQ(index(5), 7);
    EXPECT_EQ(index(6), 8);
    EXPECT_EQ(index(0), 8);  // zeros: 1 is the nearest value to 0
    EXPECT_LT(fp16_to_fp32(b[0].d), 0.0f);
    // The refit, weighted by x^2, is dominated by x[3]: d stays near -0.1.
    EXPECT_NEAR(fp16_to_fp32(b[0].d), -0.1f, 2e-3f);

    // Ties go to the larger table value: x / d0 = 7 exactly, the midpoint of 1 and 13.
    std::vector<float> t(32, 0.0f);
    t[0] = -127.0f;  // d0 = 1
    t[1] = 7.0f;
    t[2] = -94.0f;  // below -93.5, the midpoint of -104 and -83: -104 (index 1)
    t[3] = -93.5f;  // the midpoint itself: up to -83 (index 2)
    const auto c = quantized(t, false);
    EXPECT_EQ(c[0].qs[1] & 15, 9);
    EXPECT_EQ(c[0].qs[2] & 15, 1);
    EXPECT_EQ(c[0].qs[3] & 15, 2);
}

// Every midpoint between neighbouring table values, and the floats just below and above it: below
// goes down, the midpoint itself and above go up (llama.cpp's best_index_int8). Blocks led by -127,
// so that the first scale is exactly 1 and the indices are those of x itself.
TEST(IQ4_NL, NearestValueAtEveryMidpoint) {
    std::vector<float> x;
    std::vector<int> want;
    for (int j = 1; j < 16; ++j) {
        const float mid = 0.5f * static_cast<float>(kValuesIQ4NL[j - 1] + kValuesIQ4NL[j]);  // exact
        for (float v : {std::nextafter(mid, -1000.0f), mid, std::nextafter(mid, 1000.0f)}) {
            if (x.size() % 32 == 0) {
                x.push_back(-127.0f);
                want.push_back(0);
            }
            x.push_back(v);
            want.push_back(v < mid ? j - 1 : j);
        }
    }
    while (x.size() % 32 != 0) {
        x.push_back(127.0f);  // beyond the last value 113: index 15
        want.push_back(15);
    }
    const auto b = quantized(x, false);
    for (size_t i = 0; i < x.size(); ++i) {
        const BlockIQ4_NL& block = b[i / 32];
        const int l = static_cast<int>(i % 32);
        ASSERT_NE(block.d, 0);
        EXPECT_EQ(l < 16 ? (block.qs[l] & 15) : (block.qs[l - 16] >> 4), want[i]) << "x = " << x[i];
    }
}

// Blocks whose largest |x| is below 1e-15 (llama.cpp's GROUP_MAX_EPS) get d = 0: zeros come back.
TEST(IQ4_NL, ZeroAndTinyBlocks) {
    std::vector<float> x(96, 0.0f);
    for (int l = 32; l < 64; ++l) x[l] = 1e-17f * static_cast<float>(l - 40);
    for (int l = 64; l < 96; ++l) x[l] = 1e-3f * static_cast<float>(l - 70);
    for (bool searched : {false, true}) {
        const auto b = quantized(x, searched);
        EXPECT_EQ(b[0].d, 0);
        EXPECT_EQ(b[1].d, 0);
        const auto y = dequantized(b);
        for (int l = 0; l < 64; ++l) ASSERT_EQ(y[l], 0.0f) << l;
        EXPECT_NE(b[2].d, 0);
        EXPECT_LT(relative_rms({x.begin() + 64, x.end()}, {y.begin() + 64, y.end()}), 0.15);
    }
}

// Gaussian data: the error of each quantizer within its bound, the searched scales better on the
// whole (not necessarily in every block: the search minimizes the x^2-weighted error).
TEST(IQ4_NL, RoundTripErrorWithinBounds) {
    const int n = 8192;
    for (uint32_t seed : {1u, 2u, 3u}) {
        for (float sigma : {1.0f, 0.01f}) {
            const auto x = test::gaussian(n, seed, sigma);
            const double plain = relative_rms(x, dequantized(quantized(x, false)));
            const double searched = relative_rms(x, dequantized(quantized(x, true)));
            EXPECT_LE(plain, 0.095) << "seed " << seed;     // measured 0.0786 .. 0.0788, plus 20%
            EXPECT_LE(searched, 0.092) << "seed " << seed;  // 0.0760 .. 0.0762
            EXPECT_LT(searched, plain) << "seed " << seed;
            if (seed == 1 && sigma == 1.0f)
                std::printf("IQ4_NL relative RMS error %.4g, with the scale search %.4g\n", plain, searched);
        }
    }
}

}  // namespace
}  // namespace fitllm::quant
