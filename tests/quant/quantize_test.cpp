// Reference quantization: conversions, the rounding of the activation formats, and the error of
// quantize -> dequantize for every weight type.
#include "quant/quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "quant/blocks.h"
#include "quant/dequantize.h"
#include "quant/quantize_kernels.h"
#include "quant_test_data.h"

namespace fitllm::quant {
namespace {

TEST(QuantizeHalf, EveryHalfRoundTrips) {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float f = fp16_to_fp32(static_cast<uint16_t>(h));
        if (std::isnan(f)) {
            EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f)))) << std::hex << h;
            continue;
        }
        ASSERT_EQ(fp32_to_fp16(f), h) << std::hex << h;
    }
}

TEST(QuantizeHalf, RoundsToNearestEven) {
    EXPECT_EQ(fp32_to_fp16(1.0f + 0x1p-11f), 0x3C00);             // tie between 1 and 1 + 2^-10: even
    EXPECT_EQ(fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3C02);         // tie: rounds up to even
    EXPECT_EQ(fp32_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);  // above the tie
    EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7BFF);
    EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7BFF);  // below the tie with infinity
    EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7C00);
    EXPECT_EQ(fp32_to_fp16(-1e9f), 0xFC00);
    EXPECT_EQ(fp32_to_fp16(0x1p-25f), 0x0000);  // half the smallest subnormal: even
    EXPECT_EQ(fp32_to_fp16(0x1.8p-25f), 0x0001);
    EXPECT_EQ(fp32_to_fp16(3 * 0x1p-25f), 0x0002);  // 1.5 subnormal steps: even
    EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
    EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::quiet_NaN()) & 0x7C00, 0x7C00);

    EXPECT_EQ(fp32_to_bf16(1.0f), 0x3F80);
    EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie: even
    EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie: even
    EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3F808001u)), 0x3F81);
    EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

// Q8_0 / Q8_1 activations round like llama.cpp's x86 quantize_row_q8_0 (its AVX path, which the
// CPU backend runs): d = max|x| / 127, q = round-to-nearest-even(x * (127 / max|x|)). Its scalar
// reference (1 / d, ties away from zero) moves Gemma 3's logits by ~0.3 against llama.cpp.
TEST(QuantizeActivations, Q8_0RoundsTiesToEven) {
    std::vector<float> x(32, 0.0f);
    x[0] = 127.0f;
    x[1] = 63.5f;
    x[2] = -63.5f;
    x[3] = 0.5f;
    x[4] = -1.49f;
    BlockQ8_0 b{};
    quantize_row(GgmlType::Q8_0, x.data(), &b, 32);
    EXPECT_EQ(fp16_to_fp32(b.d), 1.0f);
    EXPECT_EQ(b.qs[0], 127);
    EXPECT_EQ(b.qs[1], 64);
    EXPECT_EQ(b.qs[2], -64);
    EXPECT_EQ(b.qs[3], 0);  // 0.5: the tie goes to even
    EXPECT_EQ(b.qs[4], -1);
    EXPECT_EQ(b.qs[5], 0);

    BlockQ8_1 c{};
    quantize_row(GgmlType::Q8_1, x.data(), &c, 32);
    EXPECT_EQ(std::vector<int8_t>(c.qs, c.qs + 32), std::vector<int8_t>(b.qs, b.qs + 32));
    EXPECT_EQ(fp16_to_fp32(c.s), 127.0f + 64 - 64 + 0 - 1);  // d * sum(q)
}

// Q8_K: the value of largest magnitude maps to -127, ties go to even, d = 1 / iscale is a float.
TEST(QuantizeActivations, Q8_KMapsLargestToMinus127) {
    std::vector<float> x(256, 0.0f);
    x[0] = -127.0f;  // iscale = 1
    x[1] = 0.5f;
    x[2] = 1.5f;
    x[3] = 2.5f;
    x[17] = -3.0f;
    BlockQ8_K b{};
    quantize_row(GgmlType::Q8_K, x.data(), &b, 256);
    EXPECT_EQ(b.d, 1.0f);
    EXPECT_EQ(b.qs[0], -127);
    EXPECT_EQ(b.qs[1], 0);
    EXPECT_EQ(b.qs[2], 2);
    EXPECT_EQ(b.qs[3], 2);
    EXPECT_EQ(b.bsums[0], -127 + 0 + 2 + 2);
    EXPECT_EQ(b.bsums[1], -3);

    x[0] = 254.0f;  // positive maximum: iscale = -0.5, d = -2
    x[17] = 3.0f;
    quantize_row(GgmlType::Q8_K, x.data(), &b, 256);
    EXPECT_EQ(b.d, -2.0f);
    EXPECT_EQ(b.qs[0], -127);
    EXPECT_EQ(b.qs[17], -2);  // -1.5 rounds to even
    EXPECT_EQ(b.qs[3], -1);   // -1.25

    std::fill(x.begin(), x.end(), 0.0f);
    quantize_row(GgmlType::Q8_K, x.data(), &b, 256);
    EXPECT_EQ(b.d, 0.0f);
    EXPECT_TRUE(std::all_of(b.bsums, b.bsums + 16, [](int16_t s) { return s == 0; }));
}

TEST(QuantizeActivations, BsumsAndSumsAreExact) {
    const auto x = test::gaussian(4096, 11);
    std::vector<BlockQ8_K> k(16);
    quantize_row(GgmlType::Q8_K, x.data(), k.data(), 4096);
    for (const auto& b : k) {
        for (int j = 0; j < 16; ++j) {
            int sum = 0;
            for (int l = 0; l < 16; ++l) sum += b.qs[16 * j + l];
            ASSERT_EQ(b.bsums[j], sum);
        }
        EXPECT_EQ(*std::min_element(b.qs, b.qs + 256), -127);  // -128 never appears
    }
    std::vector<BlockQ8_1> q(128);
    quantize_row(GgmlType::Q8_1, x.data(), q.data(), 4096);
    for (size_t i = 0; i < q.size(); ++i) {
        int sum = 0;
        for (int8_t v : q[i].qs) sum += v;
        float amax = 0;  // s = fp16(d * sum) with d = max|x| / 127 before rounding, as llama.cpp has it
        for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(x[32 * i + l]));
        ASSERT_EQ(q[i].s, fp32_to_fp16(amax / 127.0f * static_cast<float>(sum))) << i;
    }
}

// The SIMD activation quantizers give the scalar code's bytes exactly: Gaussian data at several
// scales, ties (values on the half steps of the grid), blocks of zeros, equal maxima of both signs,
// tiny (subnormal half scales) and large (fp16 overflow of s) values.
std::vector<std::vector<float>> activation_rows() {
    std::vector<std::vector<float>> rows;
    for (uint32_t seed = 0; seed < 6; ++seed) rows.push_back(test::gaussian(4096, 100 + seed, seed < 3 ? 1.0f : 37.0f));
    std::vector<float> ties(4096);
    for (size_t i = 0; i < ties.size(); ++i) ties[i] = static_cast<float>(static_cast<int>(i % 255) - 127) * 0.5f;
    rows.push_back(ties);
    std::vector<float> special = test::gaussian(4096, 7);
    for (int i = 0; i < 32; ++i) special[i] = 0.0f;                                  // a zero block of 32
    for (int i = 256; i < 512; ++i) special[i] = 0.0f;                               // a zero block of 256
    special[600] = 3.0f, special[601] = -3.0f, special[602] = 3.0f;                  // equal maxima, both signs
    special[800] = -5.0f, special[801] = 5.0f;                                       // the first is negative
    for (int i = 1024; i < 1056; ++i) special[i] *= 1e-6f;                           // scales below fp16's normals
    for (int i = 1056; i < 1088; ++i) special[i] = 3000.0f + static_cast<float>(i);  // d * sum(q) beyond 65504
    for (int i = 1536; i < 1792; ++i) special[i] *= 1e-30f;                          // tiny but nonzero
    rows.push_back(special);
    return rows;
}

TEST(QuantizeActivations, SimdMatchesScalarBitForBit) {
    const CpuFeatures cpu = detect_cpu_features();
    if (cpu.best_isa() < Isa::Avx2) GTEST_SKIP() << "no AVX2 on this CPU (" << cpu.describe() << ")";
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K}) {
        int row_index = 0;
        for (const auto& x : activation_rows()) {
            for (int64_t n : {int64_t{256}, int64_t{4096}}) {
                std::vector<uint8_t> scalar(test::bytes_of_row(type, static_cast<int>(n)), 0xAA);
                std::vector<uint8_t> simd(scalar.size(), 0x55);
                quantize_row_at(Isa::Scalar, type, x.data(), scalar.data(), n);
                quantize_row_at(Isa::Avx2, type, x.data(), simd.data(), n);
                ASSERT_EQ(simd, scalar) << traits(type).name << " row " << row_index << " n " << n;
            }
            ++row_index;
        }
    }
}

struct ErrorBound {
    GgmlType type;
    double rms;  // quantize -> dequantize of N(0, 1) data: RMS error / RMS of the data
};

// Measured with these quantizers (8192 values, three seeds) plus ~20% headroom. Round to nearest
// with the scales fitted to each block's range: a little worse than llama.cpp's search-based
// quantizers, which is fine for test data.
constexpr ErrorBound kBounds[] = {
    {GgmlType::F16, 2.5e-4},  {GgmlType::BF16, 2e-3},   {GgmlType::Q8_0, 6.5e-3},  {GgmlType::Q8_1, 6.5e-3},
    {GgmlType::Q8_K, 8.5e-3}, {GgmlType::Q6_K, 2.3e-2}, {GgmlType::Q5_0, 5.2e-2},  {GgmlType::Q5_1, 4.6e-2},
    {GgmlType::Q5_K, 4.6e-2}, {GgmlType::Q4_0, 0.104},  {GgmlType::Q4_1, 0.095},   {GgmlType::Q4_K, 0.095},
    {GgmlType::Q3_K, 0.19},   {GgmlType::Q2_K, 0.40},   {GgmlType::IQ4_NL, 0.095}, {GgmlType::IQ4_XS, 0.095},
    {GgmlType::MXFP4, 0.15},  {GgmlType::TQ2_0, 0.95},  {GgmlType::TQ1_0, 0.95},
};

TEST(QuantizeWeights, RoundTripErrorWithinBounds) {
    const int n = 8192;
    for (const auto& bound : kBounds) {
        SCOPED_TRACE(traits(bound.type).name);
        for (uint32_t seed : {1u, 2u, 3u}) {
            const auto x = test::gaussian(n, seed);
            std::vector<uint8_t> q(test::bytes_of_row(bound.type, n));
            quantize_row(bound.type, x.data(), q.data(), n);
            const auto y = test::dequantized(bound.type, q.data(), n);
            double err2 = 0, sig2 = 0;
            for (int i = 0; i < n; ++i) {
                err2 += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
                sig2 += static_cast<double>(x[i]) * x[i];
            }
            const double rel = std::sqrt(err2 / sig2);
            EXPECT_LE(rel, bound.rms) << "seed " << seed;
            if (seed == 1)
                std::printf("%-5s relative RMS error %.4g\n", std::string(traits(bound.type).name).c_str(), rel);
        }
    }
}

TEST(QuantizeWeights, ExactValuesSurvive) {
    // Values already on a type's grid come back exactly: zeros, and a block of small integers.
    for (const auto& bound : kBounds) {
        SCOPED_TRACE(traits(bound.type).name);
        const int n = 256;
        std::vector<float> zeros(n, 0.0f);
        std::vector<uint8_t> q(test::bytes_of_row(bound.type, n));
        quantize_row(bound.type, zeros.data(), q.data(), n);
        EXPECT_EQ(test::dequantized(bound.type, q.data(), n), zeros);
    }
    std::vector<float> ints(32);
    for (int l = 0; l < 32; ++l) ints[l] = static_cast<float>(l % 16 - 8);  // -8 .. 7: Q4_0's grid with d = 1
    BlockQ4_0 b{};
    quantize_row(GgmlType::Q4_0, ints.data(), &b, 32);
    EXPECT_EQ(test::dequantized(GgmlType::Q4_0, &b, 32), ints);
}

TEST(QuantizeWeights, RejectsPartialBlocks) {
    std::vector<float> x(300);
    std::vector<uint8_t> y(1024);
    EXPECT_THROW(quantize_row(GgmlType::Q4_K, x.data(), y.data(), 300), std::invalid_argument);
    EXPECT_THROW(quantize_row(GgmlType::IQ4_XS, x.data(), y.data(), 300), std::invalid_argument);
    EXPECT_THROW(quantize_row(GgmlType::IQ3_S, x.data(), y.data(), 256), std::invalid_argument);
    EXPECT_FALSE(can_quantize(GgmlType::IQ3_S));
    EXPECT_TRUE(can_quantize(GgmlType::IQ4_NL));
    EXPECT_TRUE(can_quantize(GgmlType::IQ4_XS));
    for (GgmlType t : {GgmlType::TQ1_0, GgmlType::TQ2_0, GgmlType::MXFP4}) {
        EXPECT_TRUE(can_quantize(t));
        EXPECT_THROW(quantize_row(t, x.data(), y.data(), 16), std::invalid_argument);
    }
}

}  // namespace
}  // namespace fitllm::quant
