// BlockGrid (quant/block_grid.h): the grid of one 32-value block, as the K cache's error-feedback
// rounding uses it.
#include "quant/block_grid.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "quant/dequantize.h"
#include "quant/ggml_type.h"
#include "quant/quantize.h"

namespace fitllm::quant {
namespace {

constexpr GgmlType kTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,
                               GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::IQ4_NL};

std::vector<float> gaussian(int n, uint32_t seed, float mean = 0.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(mean, 1.0f);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = g(rng);
    return x;
}

std::string name(GgmlType t) {
    return std::string(type_name(static_cast<uint32_t>(t)));
}

// A block written with any codes reads back as the grid's values of those codes.
TEST(BlockGrid, WrittenBlocksReadBackAsTheGridsValues) {
    for (GgmlType type : kTypes) {
        for (uint32_t seed = 0; seed < 20; ++seed) {
            const std::vector<float> x = gaussian(32, seed, seed % 2 ? 1.5f : 0.0f);
            const BlockGrid grid = BlockGrid::fit(type, x.data(), seed % 3 == 0);
            std::array<uint8_t, 32> codes{};
            std::mt19937 rng(seed);
            for (int i = 0; i < 32; ++i) {
                codes[static_cast<size_t>(i)] =
                    static_cast<uint8_t>(i % 2 ? grid.nearest(x[static_cast<size_t>(i)])
                                               : rng() % (type == GgmlType::Q8_0                             ? 255
                                                          : type == GgmlType::Q5_0 || type == GgmlType::Q5_1 ? 32
                                                                                                             : 16));
            }
            std::vector<std::byte> block(*row_bytes(type, 32));
            grid.write(codes.data(), block.data());
            std::vector<float> back(32);
            dequantize_row(type, block.data(), back.data(), 32);
            for (int i = 0; i < 32; ++i)
                ASSERT_EQ(back[static_cast<size_t>(i)], grid.value(codes[static_cast<size_t>(i)]))
                    << name(type) << " " << i;
        }
    }
}

// nearest() is the closest value of the grid; the fitted grid rounds about as well as the
// reference quantizer, and the searched one never worse than the fitted one.
TEST(BlockGrid, NearestIsTheClosestAndTheSearchOnlyHelps) {
    for (GgmlType type : kTypes) {
        double fitted = 0.0, searched = 0.0, reference = 0.0;
        for (uint32_t seed = 0; seed < 200; ++seed) {
            const std::vector<float> x = gaussian(32, 1000 + seed);
            const BlockGrid a = BlockGrid::fit(type, x.data(), false), b = BlockGrid::fit(type, x.data(), true);
            const int n_codes = type == GgmlType::Q8_0                             ? 256
                                : type == GgmlType::Q5_0 || type == GgmlType::Q5_1 ? 32
                                                                                   : 16;
            double ea = 0.0, eb = 0.0;
            for (float v : x) {
                const float best = a.value(a.nearest(v));
                for (int c = 0; c < n_codes; ++c) ASSERT_LE(std::fabs(best - v), std::fabs(a.value(c) - v) + 1e-6f);
                ea += std::pow(best - v, 2);
                eb += std::pow(b.value(b.nearest(v)) - v, 2);
            }
            EXPECT_LE(eb, ea * (1 + 1e-6) + 1e-12) << name(type) << " seed " << seed;
            std::vector<std::byte> block(*row_bytes(type, 32));
            quantize_row(type, x.data(), block.data(), 32);
            std::vector<float> back(32);
            dequantize_row(type, block.data(), back.data(), 32);
            for (int i = 0; i < 32; ++i)
                reference += std::pow(back[static_cast<size_t>(i)] - x[static_cast<size_t>(i)], 2);
            fitted += ea;
            searched += eb;
        }
        std::cout << "[ block_grid ] " << name(type) << " squared error: quantize_row " << reference << ", fitted "
                  << fitted << ", searched " << searched << "\n";
        EXPECT_LE(fitted, 1.05 * reference) << name(type);
    }
}

TEST(BlockGrid, ZerosAndOtherTypes) {
    const std::vector<float> zeros(32, 0.0f);
    for (GgmlType type : kTypes) {
        const BlockGrid g = BlockGrid::fit(type, zeros.data(), true);
        EXPECT_EQ(g.value(g.nearest(0.0f)), 0.0f) << name(type);
    }
    EXPECT_FALSE(BlockGrid::supports(GgmlType::F16));
    EXPECT_FALSE(BlockGrid::supports(GgmlType::Q4_K));
    EXPECT_THROW(BlockGrid::fit(GgmlType::Q6_K, zeros.data(), false), std::invalid_argument);
}

}  // namespace
}  // namespace fitllm::quant
