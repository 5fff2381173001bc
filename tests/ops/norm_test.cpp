#include "ops/norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace fitllm::ops {
namespace {

std::vector<float> random_values(size_t n, float sigma, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, sigma);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}

TEST(Norm, RmsNormMatchesDoubleReference) {
    const int64_t n_tok = 3;
    for (int64_t n : {1, 7, 64, 1000}) {
        const auto x = random_values(static_cast<size_t>(n_tok * n), 3.0f, 1);
        const auto w = random_values(static_cast<size_t>(n), 1.0f, 2);
        const float eps = 1e-6f;
        std::vector<float> y(x.size());
        rms_norm(x.data(), w.data(), eps, n_tok, n, y.data());
        for (int64_t t = 0; t < n_tok; ++t) {
            double ss = 0.0;
            for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[t * n + i]) * x[t * n + i];
            const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
            for (int64_t i = 0; i < n; ++i) {
                const double want = x[t * n + i] * inv * w[i];
                ASSERT_NEAR(y[t * n + i], want, 1e-5 * (1.0 + std::fabs(want))) << n << " " << t << " " << i;
            }
        }
        // Without a weight, and in place.
        std::vector<float> in_place = x;
        rms_norm(in_place.data(), nullptr, eps, n_tok, n, in_place.data());
        for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(in_place[i] * w[i], y[i], 1e-5 * (1.0 + std::fabs(y[i])));
    }
}

// ggml's bits: each square rounded to float before the double sum, the mean rounded to float,
// then x * scale * weight. Squaring in double gives another scale for some rows, so this pins it.
TEST(Norm, RmsNormRoundsAsGgml) {
    const int64_t n_tok = 64, n = 640;
    const auto x = random_values(static_cast<size_t>(n_tok * n), 1000.0f, 3);
    const auto w = random_values(static_cast<size_t>(n), 1.0f, 4);
    const float eps = 1e-6f;
    std::vector<float> y(x.size());
    rms_norm(x.data(), w.data(), eps, n_tok, n, y.data());
    int scale_differs = 0;
    for (int64_t t = 0; t < n_tok; ++t) {
        const float* xr = x.data() + t * n;
        double sum = 0.0, sum_exact = 0.0;
        for (int64_t i = 0; i < n; ++i) {
            volatile float square = xr[i] * xr[i];
            sum += square;
            sum_exact += static_cast<double>(xr[i]) * xr[i];
        }
        const float scale = 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(n)) + eps);
        const float scale_exact = 1.0f / std::sqrt(static_cast<float>(sum_exact / static_cast<double>(n)) + eps);
        scale_differs += scale != scale_exact;
        for (int64_t i = 0; i < n; ++i) {
            volatile float scaled = xr[i] * scale;
            ASSERT_EQ(y[t * n + i], scaled * w[i]) << "row " << t << " index " << i;
        }
    }
    EXPECT_GT(scale_differs, 0) << "no row tells float squares from double ones";
}

TEST(Norm, LayerNormMatchesDoubleReference) {
    const int64_t n_tok = 2;
    const int64_t n = 100;
    auto x = random_values(static_cast<size_t>(n_tok * n), 2.0f, 3);
    for (float& v : x) v += 5.0f;  // a large mean, which layer norm must remove
    const auto w = random_values(static_cast<size_t>(n), 1.0f, 4);
    const auto b = random_values(static_cast<size_t>(n), 1.0f, 5);
    std::vector<float> y(x.size());
    layer_norm(x.data(), w.data(), b.data(), 1e-5f, n_tok, n, y.data());
    for (int64_t t = 0; t < n_tok; ++t) {
        double mean = 0.0;
        for (int64_t i = 0; i < n; ++i) mean += x[t * n + i];
        mean /= n;
        double var = 0.0;
        for (int64_t i = 0; i < n; ++i) var += (x[t * n + i] - mean) * (x[t * n + i] - mean);
        var /= n;
        for (int64_t i = 0; i < n; ++i) {
            const double want = (x[t * n + i] - mean) / std::sqrt(var + 1e-5) * w[i] + b[i];
            ASSERT_NEAR(y[t * n + i], want, 1e-5 * (1.0 + std::fabs(want)));
        }
    }
}

}  // namespace
}  // namespace fitllm::ops
