// KeyTransform (kv/key_transform.h): the centre and scales of quantized K, and what they buy a
// q4_0 cache whose keys share a large common part (as Gemma 3's do).
#include "kv/key_transform.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kv/cache.h"
#include "kv/cache_test_support.h"

namespace fitllm::kv {
namespace {

using quant::GgmlType;

// n rows of n_head heads of d values: a common part (mean) plus noise whose size varies by
// dimension (large in the first quarter, as learned norm weights make it).
std::vector<float> keys(int64_t n, int n_head, int d, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> noise(0.0f, 1.0f);
    std::vector<float> common(static_cast<size_t>(n_head * d));
    for (float& c : common) c = 3.0f * noise(rng);
    std::vector<float> k(static_cast<size_t>(n * n_head * d));
    for (int64_t r = 0; r < n; ++r) {
        for (int i = 0; i < n_head * d; ++i) {
            const float size = i % d < d / 4 ? 4.0f : 0.5f;
            k[static_cast<size_t>(r * n_head * d + i)] = common[static_cast<size_t>(i)] + size * noise(rng);
        }
    }
    return k;
}

TEST(KeyTransform, TooFewRowsLeaveTheIdentity) {
    const std::vector<float> k = keys(KeyTransform::kMinRows - 1, 1, 32, 1);
    KeyTransform t;
    t.calibrate(k.data(), KeyTransform::kMinRows - 1, 1, 32);
    EXPECT_TRUE(t.calibrated());
    EXPECT_FALSE(t.active());
    EXPECT_EQ(t.q_scale(), nullptr);
    std::vector<float> out(32);
    t.apply(k.data(), 0, 32, out.data());
    EXPECT_EQ(out, std::vector<float>(k.begin(), k.begin() + 32));
    // Calibrated once: more rows later change nothing.
    const std::vector<float> more = keys(64, 1, 32, 2);
    t.calibrate(more.data(), 64, 1, 32);
    EXPECT_FALSE(t.active());
}

TEST(KeyTransform, KeepsEveryQueryKeyDotUpToAConstantAndUndoes) {
    const int n_head = 2, d = 64;
    const int64_t n = 48;
    const std::vector<float> k = keys(n, n_head, d, 3);
    KeyTransform t;
    t.calibrate(k.data(), n, n_head, d);
    ASSERT_TRUE(t.active());
    std::mt19937 rng(4);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (int h = 0; h < n_head; ++h) {
        const float* qs = t.q_scale() + h * d;
        const float* c = t.center() + h * d;
        // The centre is the mean key; the scales are larger where the keys vary less.
        double mean0 = 0.0;
        for (int64_t r = 0; r < n; ++r) mean0 += k[static_cast<size_t>(r * n_head * d + h * d)];
        EXPECT_NEAR(c[0], mean0 / n, 1e-4);
        EXPECT_GT(qs[0], 1.0f);          // 1 / s: dimension 0 varies a lot, gets s < 1
        EXPECT_LT(qs[d / 2 - 1], 1.0f);  // a quiet dimension, s > 1
        std::vector<float> q(d);
        for (float& x : q) x = dist(rng);
        for (int64_t r = 0; r < n; r += 7) {
            const float* key = k.data() + r * n_head * d + h * d;
            std::vector<float> shaped(d), back(d);
            t.apply(key, h, d, shaped.data());
            double want = 0.0, got = 0.0;
            for (int i = 0; i < d; ++i) {
                want += static_cast<double>(q[i]) * (key[i] - c[i]);
                got += static_cast<double>(q[i]) * qs[i] * shaped[i];
            }
            EXPECT_NEAR(got, want, 1e-3 * (std::fabs(want) + 1.0));
            back = shaped;
            t.undo(back.data(), h, d);
            for (int i = 0; i < d; ++i) EXPECT_NEAR(back[i], key[i], 1e-4f) << "dim " << i;
        }
    }
}

// RMS error of the keys read back from a one-layer q4_0 cache (relative to their spread).
double q4_0_key_error(bool rotate, const std::vector<float>& k, int64_t n, int n_head, int d) {
    CacheParams p = test::small_params(static_cast<int>(n));
    p.type_k = GgmlType::Q4_0;
    p.type_v = GgmlType::Q4_0;
    p.rotate = rotate;
    KvCache cache(test::shapes(1, n_head, d, d), p);
    const std::vector<int32_t> cells = test::place_run(cache, 0, 0, static_cast<int>(n));
    cache.store(0, cells, k.data(), k.data());
    EXPECT_EQ(cache.layer_view(0).q_scale != nullptr, rotate);
    double err = 0.0, spread = 0.0;
    std::vector<float> mean(static_cast<size_t>(n_head * d), 0.0f);
    for (int64_t r = 0; r < n; ++r) {
        for (int i = 0; i < n_head * d; ++i)
            mean[static_cast<size_t>(i)] += k[static_cast<size_t>(r * n_head * d + i)] / n;
    }
    std::vector<float> out(static_cast<size_t>(n_head * d));
    for (int64_t r = 0; r < n; ++r) {
        cache.read_k(0, cells[static_cast<size_t>(r)], out.data());
        for (int i = 0; i < n_head * d; ++i) {
            const float x = k[static_cast<size_t>(r * n_head * d + i)];
            err += std::pow(out[static_cast<size_t>(i)] - x, 2);
            spread += std::pow(x - mean[static_cast<size_t>(i)], 2);
        }
    }
    return std::sqrt(err / spread);
}

TEST(KeyTransform, CentredQ4_0KeysLoseLessThanPlainOnes) {
    const int n_head = 1, d = 128;
    const int64_t n = 64;
    const std::vector<float> k = keys(n, n_head, d, 5);
    const double plain = q4_0_key_error(false, k, n, n_head, d);
    const double shaped = q4_0_key_error(true, k, n, n_head, d);
    std::cout << "[ key_transform ] q4_0 key RMS error / spread: plain " << plain << ", centred, scaled and rotated "
              << shaped << "\n";
    EXPECT_LT(shaped, 0.6 * plain);
}

}  // namespace
}  // namespace fitllm::kv
