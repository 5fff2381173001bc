// Reference dequantization on hand-made blocks whose values are worked out by hand from the
// layouts in blocks.h (which follow ggml-common.h).
#include "quant/dequantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "quant/blocks.h"

namespace fitllm::quant {
namespace {

constexpr uint16_t kHalfOne = 0x3C00, kHalfHalf = 0x3800, kHalfQuarter = 0x3400, kHalfTwo = 0x4000;
constexpr uint16_t kHalfMinusOne = 0xBC00;

template <typename Block>
std::vector<float> dequant(GgmlType type, const Block& b) {
    std::vector<float> y(traits(type).block_elements);
    dequantize_row(type, &b, y.data(), static_cast<int64_t>(y.size()));
    return y;
}

TEST(Dequantize, HalfAndBfloat) {
    const uint16_t halves[] = {kHalfOne, 0xC000, 0x7BFF, 0x0001, 0x03FF, 0x0400, 0x7C00, 0xFC00, 0x8000, 0x3555};
    std::vector<float> y(std::size(halves));
    dequantize_row(GgmlType::F16, halves, y.data(), static_cast<int64_t>(y.size()));
    EXPECT_EQ(y[0], 1.0f);
    EXPECT_EQ(y[1], -2.0f);
    EXPECT_EQ(y[2], 65504.0f);
    EXPECT_EQ(y[3], std::ldexp(1.0f, -24));     // smallest subnormal
    EXPECT_EQ(y[4], std::ldexp(1023.0f, -24));  // largest subnormal
    EXPECT_EQ(y[5], std::ldexp(1.0f, -14));     // smallest normal
    EXPECT_EQ(y[6], std::numeric_limits<float>::infinity());
    EXPECT_EQ(y[7], -std::numeric_limits<float>::infinity());
    EXPECT_TRUE(y[8] == 0.0f && std::signbit(y[8]));
    EXPECT_EQ(y[9], 0.333251953125f);  // 0x3555: 1/3 rounded to half
    EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7E00)));

    const uint16_t bf[] = {0x3F80, 0xC040, 0x7F80, 0x0001};
    std::vector<float> z(4);
    dequantize_row(GgmlType::BF16, bf, z.data(), 4);
    EXPECT_EQ(z[0], 1.0f);
    EXPECT_EQ(z[1], -3.0f);
    EXPECT_EQ(z[2], std::numeric_limits<float>::infinity());
    EXPECT_EQ(z[3], std::ldexp(1.0f, -133));  // bf16 keeps f32's subnormals
}

TEST(Dequantize, Q4_0AndQ4_1) {
    BlockQ4_0 b{};
    b.d = kHalfHalf;
    for (int l = 0; l < 16; ++l) b.qs[l] = static_cast<uint8_t>(l | ((15 - l) << 4));
    const auto y = dequant(GgmlType::Q4_0, b);
    EXPECT_EQ(y[0], -4.0f);  // (0 - 8) / 2
    EXPECT_EQ(y[9], 0.5f);   // (9 - 8) / 2
    EXPECT_EQ(y[15], 3.5f);
    EXPECT_EQ(y[16], 3.5f);   // high nibble of qs[0] = 15
    EXPECT_EQ(y[31], -4.0f);  // high nibble of qs[15] = 0

    BlockQ4_1 c{};
    c.d = kHalfQuarter;
    c.m = kHalfMinusOne;
    for (int l = 0; l < 16; ++l) c.qs[l] = static_cast<uint8_t>(l | ((15 - l) << 4));
    const auto z = dequant(GgmlType::Q4_1, c);
    EXPECT_EQ(z[0], -1.0f);
    EXPECT_EQ(z[4], 0.0f);
    EXPECT_EQ(z[15], 2.75f);
    EXPECT_EQ(z[16], 2.75f);
    EXPECT_EQ(z[31], -1.0f);
}

TEST(Dequantize, Q5_0AndQ5_1) {
    BlockQ5_0 b{};
    b.d = kHalfOne;
    for (int l = 0; l < 16; ++l) b.qs[l] = static_cast<uint8_t>(l | (l << 4));
    const uint32_t qh = 0x80010003u;  // elements 0, 1, 16, 31 get the fifth bit
    std::memcpy(b.qh, &qh, 4);
    const auto y = dequant(GgmlType::Q5_0, b);
    EXPECT_EQ(y[0], 0.0f);     // 0 + 16 - 16
    EXPECT_EQ(y[1], 1.0f);     // 1 + 16 - 16
    EXPECT_EQ(y[2], -14.0f);   // 2 - 16
    EXPECT_EQ(y[15], -1.0f);   // 15 - 16
    EXPECT_EQ(y[16], 0.0f);    // high nibble of qs[0] = 0, fifth bit set
    EXPECT_EQ(y[17], -15.0f);  // high nibble of qs[1] = 1
    EXPECT_EQ(y[31], 15.0f);   // 15 + 16 - 16

    BlockQ5_1 c{};
    c.d = kHalfHalf;
    c.m = kHalfOne;
    std::memcpy(c.qs, b.qs, 16);
    std::memcpy(c.qh, b.qh, 4);
    const auto z = dequant(GgmlType::Q5_1, c);
    EXPECT_EQ(z[0], 9.0f);    // 16 / 2 + 1
    EXPECT_EQ(z[2], 2.0f);    // 2 / 2 + 1
    EXPECT_EQ(z[31], 16.5f);  // 31 / 2 + 1
}

TEST(Dequantize, Q8_0Q8_1Q8_K) {
    BlockQ8_0 b{};
    b.d = kHalfTwo;
    for (int l = 0; l < 32; ++l) b.qs[l] = static_cast<int8_t>(l - 16);
    const auto y = dequant(GgmlType::Q8_0, b);
    EXPECT_EQ(y[0], -32.0f);
    EXPECT_EQ(y[16], 0.0f);
    EXPECT_EQ(y[31], 30.0f);

    BlockQ8_1 c{};
    c.d = kHalfTwo;
    std::memcpy(c.qs, b.qs, 32);
    EXPECT_EQ(dequant(GgmlType::Q8_1, c), y);

    BlockQ8_K k{};
    k.d = 0.25f;
    for (int e = 0; e < kQK; ++e) k.qs[e] = static_cast<int8_t>(e - 128);
    const auto z = dequant(GgmlType::Q8_K, k);
    EXPECT_EQ(z[0], -32.0f);
    EXPECT_EQ(z[128], 0.0f);
    EXPECT_EQ(z[255], 31.75f);
}

TEST(Dequantize, Q2_K) {
    BlockQ2_K b{};
    b.d = kHalfOne;
    b.dmin = kHalfHalf;
    for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<uint8_t>(j | ((15 - j) << 4));  // scale j, min 15 - j
    std::memset(b.qs, 0xE4, sizeof(b.qs));  // 0b11'10'01'00: q = g for element 128 h + 32 g + l
    const auto y = dequant(GgmlType::Q2_K, b);
    for (int e = 0; e < kQK; ++e) {
        const int j = e / 16, q = (e / 32) % 4;
        ASSERT_EQ(y[e], static_cast<float>(j * q) - 0.5f * static_cast<float>(15 - j)) << e;
    }
    EXPECT_EQ(y[0], -7.5f);    // scale 0, min 15, q 0
    EXPECT_EQ(y[40], -4.5f);   // sub-block 2: scale 2, min 13, q 1
    EXPECT_EQ(y[255], 45.0f);  // sub-block 15: scale 15, min 0, q 3
}

TEST(Dequantize, Q3_K) {
    BlockQ3_K b{};
    b.d = kHalfOne;
    // Every 6-bit scale 33 (= +1): low nibbles 1, top bits 0b10 ...
    std::memset(b.scales, 0x11, 8);
    std::memset(b.scales + 8, 0xAA, 4);
    // ... except scale 5 = 63 (+31) and scale 13 = 0 (-32): both live in byte 5 (low, high nibble)
    // and byte 9 (bits 2..3 and 6..7).
    b.scales[5] = 0x0F;
    b.scales[9] = 0x2E;                           // 0b00'10'11'10: top bits of scales 13, 9, 5, 1
    std::memset(b.qs, 0xE4, sizeof(b.qs));        // low bits = g
    std::memset(b.hmask, 0x55, sizeof(b.hmask));  // high bit set for the even groups 4h + g
    const auto y = dequant(GgmlType::Q3_K, b);
    auto value = [](int e) {  // q - 4 with q = g | high << 2
        const int k = e / 32, g = k % 4;
        return g + (k % 2 == 0 ? 0 : -4);
    };
    for (int e = 0; e < kQK; ++e) {
        const int j = e / 16;
        const int scale = j == 5 ? 31 : j == 13 ? -32 : 1;
        ASSERT_EQ(y[e], static_cast<float>(scale * value(e))) << e;
    }
    EXPECT_EQ(y[32], -3.0f);    // group 1: q = 1, no high bit
    EXPECT_EQ(y[64], 2.0f);     // group 2: q = 2 + 4
    EXPECT_EQ(y[80], 62.0f);    // sub-block 5: 31 * 2
    EXPECT_EQ(y[208], -64.0f);  // sub-block 13, group 6 (h 1, g 2, high bit set): -32 * 2
}

// Scales and mins of Q4_K / Q5_K: {1, 2, 3, 4, 63, 5, 6, 7} and {0, 1, 2, 3, 4, 50, 6, 7}. The
// 6-bit values 4..7 keep their low nibbles in bytes 8..11 and their top bits in bytes 0..7.
constexpr uint8_t kPackedScalesMins[12] = {0xC1, 0x02, 0x03, 0x04, 0x00, 0xC1, 0x02, 0x03, 0x4F, 0x25, 0x66, 0x77};
constexpr int kScales[8] = {1, 2, 3, 4, 63, 5, 6, 7}, kMins[8] = {0, 1, 2, 3, 4, 50, 6, 7};

TEST(Dequantize, Q4_K) {
    BlockQ4_K b{};
    b.d = kHalfOne;
    b.dmin = kHalfOne;
    std::memcpy(b.scales, kPackedScalesMins, 12);
    std::memset(b.qs, 0x21, sizeof(b.qs));  // q = 1 in even sub-blocks (low nibbles), 2 in odd ones
    const auto y = dequant(GgmlType::Q4_K, b);
    for (int e = 0; e < kQK; ++e) {
        const int j = e / 32, q = j % 2 == 0 ? 1 : 2;
        ASSERT_EQ(y[e], static_cast<float>(kScales[j] * q - kMins[j])) << e;
    }
    EXPECT_EQ(y[0], 1.0f);
    EXPECT_EQ(y[32], 3.0f);     // 2 * 2 - 1
    EXPECT_EQ(y[128], 59.0f);   // 63 * 1 - 4
    EXPECT_EQ(y[160], -40.0f);  // 5 * 2 - 50
    EXPECT_EQ(y[255], 7.0f);    // 7 * 2 - 7
}

TEST(Dequantize, Q5_K) {
    BlockQ5_K b{};
    b.d = kHalfOne;
    b.dmin = kHalfHalf;
    std::memcpy(b.scales, kPackedScalesMins, 12);
    std::memset(b.qs, 0x21, sizeof(b.qs));
    std::memset(b.qh, 0x10, sizeof(b.qh));  // fifth bit for sub-block 4 only
    b.qh[3] = 0x90;                         // ... and element 7 * 32 + 3 of sub-block 7
    const auto y = dequant(GgmlType::Q5_K, b);
    for (int e = 0; e < kQK; ++e) {
        const int j = e / 32;
        const int q = (j % 2 == 0 ? 1 : 2) + (j == 4 || e == 227 ? 16 : 0);
        ASSERT_EQ(y[e], static_cast<float>(kScales[j] * q) - 0.5f * static_cast<float>(kMins[j])) << e;
    }
    EXPECT_EQ(y[128], 1069.0f);  // 63 * 17 - 2
    EXPECT_EQ(y[227], 122.5f);   // 7 * 18 - 3.5
}

TEST(Dequantize, Q6_K) {
    BlockQ6_K b{};
    b.d = kHalfHalf;
    for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<int8_t>(j - 8);
    std::memset(b.ql, 0x31, sizeof(b.ql));  // low 4 bits: 1 for groups 0, 1 (low nibbles), 3 for 2, 3
    std::memset(b.qh, 0xE4, sizeof(b.qh));  // high 2 bits = g
    const auto y = dequant(GgmlType::Q6_K, b);
    const int values[4] = {1 - 32, 17 - 32, 35 - 32, 51 - 32};
    for (int e = 0; e < kQK; ++e) {
        ASSERT_EQ(y[e], 0.5f * static_cast<float>((e / 16 - 8) * values[(e / 32) % 4])) << e;
    }
    EXPECT_EQ(y[0], 124.0f);   // 0.5 * -8 * -31
    EXPECT_EQ(y[32], 45.0f);   // 0.5 * -6 * -15
    EXPECT_EQ(y[64], -6.0f);   // 0.5 * -4 * 3
    EXPECT_EQ(y[96], -19.0f);  // 0.5 * -2 * 19
    EXPECT_EQ(y[255], 66.5f);  // 0.5 * 7 * 19
}

// IQ4_XS by hand: sub-block ib's scale is d * (ls - 32), ls split into a low nibble (scales_l) and
// two high bits (scales_h); element 32 ib + l the low (l < 16) or high nibble of qs[16 ib + l % 16].
TEST(Dequantize, Iq4XsByHand) {
    BlockIQ4_XS b{};
    b.d = fp32_to_fp16(0.5f);
    const int ls[8] = {35, 30, 32, 63, 0, 33, 47, 16};  // scales 3, -2, 0, 31, -32, 1, 15, -16
    for (int ib = 0; ib < 8; ++ib) {
        b.scales_l[ib / 2] |= static_cast<uint8_t>((ls[ib] & 0xF) << (4 * (ib % 2)));
        b.scales_h |= static_cast<uint16_t>((ls[ib] >> 4) << (2 * ib));
    }
    for (int i = 0; i < 128; ++i) b.qs[i] = static_cast<uint8_t>((i % 16) | ((15 - i % 16) << 4));
    std::vector<float> y(256);
    dequantize_row(GgmlType::IQ4_XS, &b, y.data(), 256);
    EXPECT_EQ(y[0], 0.5f * 3 * -127);    // sub-block 0, low nibble 0
    EXPECT_EQ(y[16], 0.5f * 3 * 113);    // high nibble 15
    EXPECT_EQ(y[33], 0.5f * -2 * -104);  // sub-block 1, low nibble 1
    EXPECT_EQ(y[64 + 5], 0.0f);          // scale 0
    EXPECT_EQ(y[96 + 31], 0.5f * 31 * -127);
    EXPECT_EQ(y[128 + 15], 0.5f * -32 * 113);
    EXPECT_EQ(y[160 + 20], 0.5f * 1 * 38);  // high nibble 15 - 4 = 11
    EXPECT_EQ(y[224 + 8], 0.5f * -16 * 1);  // low nibble 8
}

// TQ2_0 by hand: element e is bits 2 ((e / 32) % 4) of qs[32 (e / 128) + e % 32], x = d (q - 1).
TEST(Dequantize, Tq2_0ByHand) {
    BlockTQ2_0 b{};
    b.d = fp32_to_fp16(0.25f);
    b.qs[0] = 0b11100100;   // elements 0, 32, 64, 96: q = 0, 1, 2, 3
    b.qs[32 + 5] = 0b0010;  // element 128 + 5: q = 2; element 128 + 32 + 5: q = 0
    std::vector<float> y(256);
    dequantize_row(GgmlType::TQ2_0, &b, y.data(), 256);
    EXPECT_EQ(y[0], -0.25f);
    EXPECT_EQ(y[32], 0.0f);
    EXPECT_EQ(y[64], 0.25f);
    EXPECT_EQ(y[96], 0.5f);  // code 3 decodes to 2 d, as in ggml
    EXPECT_EQ(y[133], 0.25f);
    EXPECT_EQ(y[165], -0.25f);
    EXPECT_EQ(y[1], -0.25f);  // q = 0 everywhere else
}

// TQ1_0 by hand: five trits t0..t4 of a byte are the base-3 digits of ceil(v * 256 / 243) with t0 the
// most significant; element e < 160 is trit e / 32 of qs[e % 32], then 16-byte rows, then qh.
TEST(Dequantize, Tq1_0ByHand) {
    auto pack = [](std::initializer_list<int> trits) {
        int v = 0;
        for (int t : trits) v = 3 * v + t;
        return static_cast<uint8_t>((v * 256 + 242) / 243);
    };
    BlockTQ1_0 b{};
    b.d = fp32_to_fp16(2.0f);
    for (auto& q : b.qs) q = pack({1, 1, 1, 1, 1});  // all zeros
    for (auto& q : b.qh) q = pack({1, 1, 1, 1, 1});
    b.qs[3] = pack({0, 1, 2, 0, 2});       // elements 3, 35, 67, 99, 131
    b.qs[32 + 7] = pack({2, 2, 0, 1, 0});  // elements 167, 183, 199, 215, 231
    b.qh[2] = pack({0, 2, 2, 0, 1});       // elements 242, 246, 250, 254 (the fifth trit unused)
    std::vector<float> y(256);
    dequantize_row(GgmlType::TQ1_0, &b, y.data(), 256);
    const std::pair<int, float> expected[] = {{3, -2.0f},   {35, 0.0f},  {67, 2.0f},   {99, -2.0f},  {131, 2.0f},
                                              {167, 2.0f},  {183, 2.0f}, {199, -2.0f}, {215, 0.0f},  {231, -2.0f},
                                              {242, -2.0f}, {246, 2.0f}, {250, 2.0f},  {254, -2.0f}, {0, 0.0f},
                                              {160, 0.0f},  {255, 0.0f}};
    for (const auto& [e, v] : expected) EXPECT_EQ(y[e], v) << "element " << e;
}

// MXFP4 by hand: x = kValuesMXFP4[q] * 2^(e - 128) (the e2m1 values doubled, the scale halved).
TEST(Dequantize, Mxfp4ByHand) {
    BlockMXFP4 b{};
    b.e = 127;  // 2^0: x = e2m1 value
    for (int l = 0; l < 16; ++l) b.qs[l] = static_cast<uint8_t>(l | ((15 - l) << 4));
    std::vector<float> y(64);
    BlockMXFP4 blocks[2] = {b, b};
    blocks[1].e = 1;  // 2^-126: ggml's subnormal half scale 2^-127
    dequantize_row(GgmlType::MXFP4, blocks, y.data(), 64);
    const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, 0, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int l = 0; l < 16; ++l) {
        EXPECT_EQ(y[l], e2m1[l]) << l;
        EXPECT_EQ(y[16 + l], e2m1[15 - l]) << l;
    }
    EXPECT_EQ(y[32 + 7], 12 * 0x1p-127f);
    EXPECT_EQ(mxfp4_scale_half(0), 0x1p-128f);
    EXPECT_EQ(mxfp4_scale_half(254), 0x1p126f);
}

// The grids of the i-quants (generated from llama.cpp's dequantizer): every point distinct, every
// value one of the type's levels; the IQ2 / IQ3_XXS sign bytes keep the 7 stored bits and an even
// count of minus signs.
template <typename Point, size_t N>
void expect_grid(const Point (&grid)[N], int values, std::initializer_list<int> levels, const char* name) {
    std::vector<Point> sorted(grid, grid + N);
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << name << ": a repeated point";
    int bad = 0;
    for (Point p : grid) {
        for (int j = 0; j < values; ++j) {
            const int v = static_cast<int8_t>(static_cast<uint8_t>(p >> (8 * j)));
            bad += std::find(levels.begin(), levels.end(), v) == levels.end() ? 1 : 0;
        }
    }
    EXPECT_EQ(bad, 0) << name;
}

TEST(Dequantize, IqGridsAndSigns) {
    expect_grid(kIq2xxsGrid, 8, {8, 25, 43}, "IQ2_XXS");
    expect_grid(kIq2xsGrid, 8, {8, 25, 43}, "IQ2_XS");
    expect_grid(kIq2sGrid, 8, {8, 25, 43}, "IQ2_S");
    expect_grid(kIq3xxsGrid, 4, {4, 12, 20, 28, 36, 44, 52, 62}, "IQ3_XXS");
    expect_grid(kIq3sGrid, 4, {1, 3, 5, 7, 9, 11, 13, 15}, "IQ3_S");
    expect_grid(kIq1sGrid, 8, {-1, 0, 1}, "IQ1_S");
    for (int i = 0; i < 128; ++i) {
        EXPECT_EQ(kIqSigns[i] & 127, i);
        EXPECT_EQ(std::popcount(static_cast<unsigned>(kIqSigns[i])) % 2, 0) << i;
    }
}

// IQ2_XXS: d = 1, sub-block 0 with grid points 1, 0, 0, 0, sign bits 1 (group 0: completed with
// bit 7), s = 3 (d (0.5 + 3) / 4 = 0.875); point 1 is (43, 8, 8, 8, 8, 8, 8, 8).
TEST(Dequantize, Iq2XxsByHand) {
    BlockIQ2_XXS b{};
    b.d = 0x3C00;
    const uint32_t w0 = 1, w1 = 1u | (3u << 28);
    std::memcpy(b.qs, &w0, 4);
    std::memcpy(b.qs + 2, &w1, 4);
    std::vector<float> y(256);
    dequantize_row(GgmlType::IQ2_XXS, &b, y.data(), 256);
    EXPECT_EQ(y[0], -0.875f * 43);
    for (int j = 1; j < 7; ++j) EXPECT_EQ(y[j], 0.875f * 8) << j;
    EXPECT_EQ(y[7], -0.875f * 8);
    EXPECT_EQ(y[8], 0.875f * 8);         // point 0, no signs
    EXPECT_EQ(y[32], 0.5f * 0.25f * 8);  // sub-block 1: all zero bytes, s = 0
}

// IQ1_M: the fp16 scale 0.5 (0x3800) in the top nibbles of the scale words; sub-block 0 has
// s = 2 / 1 (ls 5 / 3), grid point 0 (all -1), group 0's delta negative.
TEST(Dequantize, Iq1MByHand) {
    BlockIQ1_M b{};
    const uint16_t w[4] = {static_cast<uint16_t>(2 | (1 << 3)), 0, 0x8000, 0x3000};
    std::memcpy(b.scales, w, sizeof w);
    EXPECT_EQ(iq1m_scale(b), 0x3800);
    b.qh[0] = 0x08;
    std::vector<float> y(256);
    dequantize_row(GgmlType::IQ1_M, &b, y.data(), 256);
    EXPECT_EQ(y[0], 0.5f * 5 * (-1 - 0.125f));
    EXPECT_EQ(y[8], 0.5f * 5 * (-1 + 0.125f));
    EXPECT_EQ(y[16], 0.5f * 3 * (-1 + 0.125f));
}

TEST(Dequantize, RejectsPartialBlocksAndUnknownTypes) {
    std::vector<uint8_t> src(1024);
    std::vector<float> dst(512);
    EXPECT_THROW(dequantize_row(GgmlType::Q4_0, src.data(), dst.data(), 33), std::invalid_argument);
    EXPECT_THROW(dequantize_row(GgmlType::Q4_K, src.data(), dst.data(), 128), std::invalid_argument);
    EXPECT_THROW(dequantize_row(GgmlType::NVFP4, src.data(), dst.data(), 256), std::invalid_argument);
    EXPECT_FALSE(can_dequantize(GgmlType::NVFP4));
    EXPECT_TRUE(can_dequantize(GgmlType::Q8_K));
    try {
        dequantize_row(GgmlType::Q6_K, src.data(), dst.data(), 300);
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("Q6_K"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("300"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace fitllm::quant
