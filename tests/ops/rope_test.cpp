#include "ops/rope.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

namespace fitllm::ops {
namespace {

// The formula, in double: pair i of each head turns by pos * scale * base^(-2i/n_dims) / factor.
std::vector<float> reference_rope(const std::vector<float>& x, const std::vector<int32_t>& pos, int n_head,
                                  int head_dim, const RopeParams& p) {
    std::vector<float> y = x;
    const int half = p.n_dims / 2;
    for (size_t t = 0; t < pos.size(); ++t) {
        for (int h = 0; h < n_head; ++h) {
            const size_t base = (t * n_head + h) * head_dim;
            for (int i = 0; i < half; ++i) {
                double angle = pos[t] * static_cast<double>(p.freq_scale) *
                               std::pow(static_cast<double>(p.freq_base), -2.0 * i / p.n_dims);
                if (p.freq_factors != nullptr) angle /= p.freq_factors[i];
                const size_t ia = base + (p.mode == RopeMode::Normal ? 2 * i : i);
                const size_t ib = ia + (p.mode == RopeMode::Normal ? 1 : half);
                const double a = x[ia], b = x[ib];
                y[ia] = static_cast<float>(a * std::cos(angle) - b * std::sin(angle));
                y[ib] = static_cast<float>(a * std::sin(angle) + b * std::cos(angle));
            }
        }
    }
    return y;
}

void check_against_reference(const RopeParams& p, int n_head, int head_dim) {
    const std::vector<int32_t> pos = {0, 1, 5, 17, 63, 200};
    std::mt19937 rng(11);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(pos.size() * n_head * head_dim);
    for (float& v : x) v = dist(rng);
    const std::vector<float> want = reference_rope(x, pos, n_head, head_dim, p);
    std::vector<float> got = x;
    rope(got.data(), pos.data(), static_cast<int64_t>(pos.size()), n_head, head_dim, p);
    for (size_t t = 0; t < pos.size(); ++t) {
        // The float angle drifts by a few ulps of pos * theta; allow for it.
        const double tolerance = 2e-6 * (4.0 + pos[t]) * 4.0;
        for (size_t i = 0; i < static_cast<size_t>(n_head * head_dim); ++i) {
            const size_t at = t * n_head * head_dim + i;
            ASSERT_NEAR(got[at], want[at], tolerance) << "token " << t << " index " << i;
        }
    }
}

TEST(Rope, NormalModeMatchesFormula) {
    check_against_reference(RopeParams{RopeMode::Normal, 64, 10000.0f, 1.0f, nullptr}, 3, 64);
}

TEST(Rope, NeoxModeMatchesFormula) {
    check_against_reference(RopeParams{RopeMode::Neox, 32, 1000000.0f, 1.0f, nullptr}, 2, 32);
}

TEST(Rope, PartialRotaryLeavesTheRestAlone) {
    const RopeParams p{RopeMode::Neox, 16, 10000.0f, 1.0f, nullptr};
    check_against_reference(p, 2, 40);
    std::vector<float> x(2 * 40, 0.5f);
    const int32_t pos = 9;
    rope(x.data(), &pos, 1, 2, 40, p);
    for (int h = 0; h < 2; ++h) {
        for (int i = 16; i < 40; ++i) EXPECT_EQ(x[h * 40 + i], 0.5f);
    }
}

TEST(Rope, LinearScalingAndFrequencyFactors) {
    std::vector<float> factors(16);
    for (size_t i = 0; i < factors.size(); ++i) factors[i] = 1.0f + 0.5f * static_cast<float>(i);
    check_against_reference(RopeParams{RopeMode::Normal, 32, 500000.0f, 0.25f, factors.data()}, 2, 32);
}

TEST(Rope, PositionZeroIsIdentityAndNormIsKept) {
    std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};
    const int32_t zero = 0;
    std::vector<float> y = x;
    rope(y.data(), &zero, 1, 1, 8, RopeParams{RopeMode::Normal, 8, 10000.0f, 1.0f, nullptr});
    EXPECT_EQ(x, y);
    const int32_t far = 12345;
    rope(y.data(), &far, 1, 1, 8, RopeParams{RopeMode::Neox, 8, 10000.0f, 1.0f, nullptr});
    double before = 0, after = 0;
    for (size_t i = 0; i < x.size(); ++i) before += x[i] * x[i], after += y[i] * y[i];
    EXPECT_NEAR(before, after, 1e-3);
}

// llama.cpp's bits, not only the formula's value: the angle as a float running product of the
// per-pair ratio, and each output one FMA (x0 * cos - x1 * sin with only x1 * sin rounded first).
// The unfused form differs in the last bit for some elements, so this pins the fused one.
TEST(Rope, RotatesWithOneFmaPerOutputAsLlamaCpp) {
    for (const RopeMode mode : {RopeMode::Normal, RopeMode::Neox}) {
        const int n_head = 3, head_dim = 64, half = 32;
        const std::vector<int32_t> pos = {1, 7, 300, 4097};
        std::mt19937 rng(5);
        std::normal_distribution<float> dist(0.0f, 30.0f);
        std::vector<float> x(pos.size() * n_head * head_dim);
        for (float& v : x) v = dist(rng);
        const RopeParams p{mode, head_dim, 1000000.0f, 1.0f, nullptr};
        std::vector<float> got = x;
        rope(got.data(), pos.data(), static_cast<int64_t>(pos.size()), n_head, head_dim, p);
        const float ratio = std::pow(p.freq_base, -2.0f / static_cast<float>(head_dim));
        int unfused_differs = 0;
        for (size_t t = 0; t < pos.size(); ++t) {
            float theta = static_cast<float>(pos[t]);
            for (int i = 0; i < half; ++i) {
                const float c = std::cos(theta), s = std::sin(theta);
                for (int h = 0; h < n_head; ++h) {
                    const size_t base = (t * n_head + h) * head_dim;
                    const size_t ia = base + (mode == RopeMode::Normal ? 2 * i : i);
                    const size_t ib = ia + (mode == RopeMode::Normal ? 1 : half);
                    const float a = x[ia], b = x[ib];
                    volatile float as = a * s, bc = b * c, ac = a * c, bs = b * s;  // no contraction
                    ASSERT_EQ(got[ia], std::fma(a, c, -(b * s))) << "token " << t << " pair " << i;
                    ASSERT_EQ(got[ib], std::fma(a, s, b * c)) << "token " << t << " pair " << i;
                    unfused_differs += (ac - bs != got[ia]) + (as + bc != got[ib]);
                }
                theta *= ratio;
            }
        }
        EXPECT_GT(unfused_differs, 0) << "no element tells the fused rotation from the unfused one";
    }
}

TEST(Rope, RejectsBadDimensions) {
    std::vector<float> x(8);
    const int32_t pos = 1;
    EXPECT_THROW(rope(x.data(), &pos, 1, 1, 8, RopeParams{RopeMode::Normal, 7}), std::invalid_argument);
    EXPECT_THROW(rope(x.data(), &pos, 1, 1, 8, RopeParams{RopeMode::Normal, 10}), std::invalid_argument);
}

// A K shift turns K rotated at position p on to p + delta: with YaRN's or LongRoPE's magnitude
// (attn_factor) that must be rotation_only(), or K grows by the factor once more each shift.
TEST(Rope, RotationOnlyTurnsRotatedRowsOnWithoutScalingThemAgain) {
    RopeParams yarn{.mode = RopeMode::Neox, .n_dims = 16, .freq_base = 10000.0f, .freq_scale = 0.25f};
    yarn.ext_factor = 1.0f;
    yarn.attn_factor = 1.0f;  // mscale 1 + 0.1 ln 4
    yarn.corr_low = 2.0f;
    yarn.corr_high = 5.0f;
    RopeParams longrope{.mode = RopeMode::Neox, .n_dims = 16, .freq_base = 10000.0f};
    longrope.attn_factor = 1.19f;
    for (const RopeParams& p : {yarn, longrope}) {
        std::mt19937 rng(7);
        std::normal_distribution<float> dist;
        std::vector<float> x(2 * 16);
        for (float& v : x) v = dist(rng);
        const std::vector<int32_t> at = {20, 31}, delta = {-12, -30}, after = {8, 1};
        std::vector<float> shifted = x, direct = x;
        rope(shifted.data(), at.data(), 2, 1, 16, p);
        rope(shifted.data(), delta.data(), 2, 1, 16, rotation_only(p));
        rope(direct.data(), after.data(), 2, 1, 16, p);
        for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(shifted[i], direct[i], 1e-4f) << i;
        RopeParams plain = p;  // the bug this guards against: the shift scaled as well
        std::vector<float> twice = x;
        rope(twice.data(), at.data(), 2, 1, 16, p);
        rope(twice.data(), delta.data(), 2, 1, 16, plain);
        float most = 0.0f;
        for (size_t i = 0; i < x.size(); ++i) most = std::max(most, std::fabs(twice[i] - direct[i]));
        EXPECT_GT(most, 0.05f);
    }
}

}  // namespace
}  // namespace fitllm::ops
