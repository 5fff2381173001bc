#include "kv/hadamard.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

namespace fitllm::kv {
namespace {

std::vector<float> random_vector(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = dist(rng);
    return x;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
    return s;
}

TEST(Hadamard, MatchesTheExplicitMatrixForEight) {
    const int n = 8;
    const std::vector<float> x = random_vector(n, 1);
    std::vector<float> y = x;
    hadamard_transform(y.data(), n);
    for (int i = 0; i < n; ++i) {
        double expected = 0;
        for (int j = 0; j < n; ++j) {
            const int sign = std::popcount(static_cast<unsigned>(i & j)) % 2 == 0 ? 1 : -1;
            expected += sign * static_cast<double>(x[static_cast<size_t>(j)]);
        }
        expected /= std::sqrt(8.0);
        EXPECT_NEAR(y[static_cast<size_t>(i)], expected, 1e-5) << "row " << i;
    }
}

TEST(Hadamard, IsOrthonormal) {
    for (int n : {1, 2, 4, 32, 64, 128, 256}) {
        // The columns H e_i / sqrt(n) have unit length and are pairwise orthogonal.
        std::vector<std::vector<float>> columns;
        for (int i = 0; i < n; ++i) {
            std::vector<float> e(static_cast<size_t>(n), 0.0f);
            e[static_cast<size_t>(i)] = 1.0f;
            hadamard_transform(e.data(), n);
            columns.push_back(e);
        }
        for (int i = 0; i < n; ++i) {
            for (int j = i; j < n; j += std::max(1, n / 8)) {
                EXPECT_NEAR(dot(columns[static_cast<size_t>(i)], columns[static_cast<size_t>(j)]), i == j ? 1.0 : 0.0,
                            1e-5)
                    << "n " << n << ", columns " << i << ", " << j;
            }
        }
        // Norms and dot products are kept.
        std::vector<float> a = random_vector(n, 2), b = random_vector(n, 3);
        const double ab = dot(a, b), aa = dot(a, a);
        hadamard_transform(a.data(), n);
        hadamard_transform(b.data(), n);
        EXPECT_NEAR(dot(a, b), ab, 1e-4 * std::max(1.0, std::abs(ab))) << "n " << n;
        EXPECT_NEAR(dot(a, a), aa, 1e-4 * aa) << "n " << n;
    }
}

TEST(Hadamard, IsItsOwnInverse) {
    for (int n : {2, 16, 64, 128, 512}) {
        const std::vector<float> x = random_vector(n, 4);
        std::vector<float> y = x;
        hadamard_transform(y.data(), n);
        hadamard_transform(y.data(), n);
        for (int i = 0; i < n; ++i) EXPECT_NEAR(y[static_cast<size_t>(i)], x[static_cast<size_t>(i)], 1e-5);
    }
}

TEST(Hadamard, SpreadsAnOutlier) {
    std::vector<float> x(64, 0.0f);
    x[5] = 8.0f;
    hadamard_transform(x.data(), 64);
    for (float v : x) EXPECT_FLOAT_EQ(std::abs(v), 1.0f);
}

TEST(Hadamard, RowsTransformEachRow) {
    const int n = 32;
    std::vector<float> rows = random_vector(3 * n, 5);
    std::vector<float> expected = rows;
    for (int r = 0; r < 3; ++r) hadamard_transform(expected.data() + r * n, n);
    hadamard_transform_rows(rows.data(), 3, n);
    EXPECT_EQ(rows, expected);
}

TEST(Hadamard, RejectsSizesThatAreNotPowersOfTwo) {
    std::vector<float> x(96);
    EXPECT_THROW(hadamard_transform(x.data(), 96), std::invalid_argument);
    EXPECT_THROW(hadamard_transform(x.data(), 0), std::invalid_argument);
    EXPECT_FALSE(is_power_of_two(96));
    EXPECT_TRUE(is_power_of_two(128));
}

}  // namespace
}  // namespace fitllm::kv
