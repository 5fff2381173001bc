#pragma once
// What a greedy generation gave, with or without drafts (prompt lookup, a draft model), and the
// check that drafting changed none of it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "engine/session.h"

namespace fitllm::test {

struct Generated {
    std::vector<int32_t> tokens;
    engine::GenerationStats stats;
    int n_past = 0;
};

// The same tokens, and the same end (context full, shifts, what the session holds).
inline void expect_same(const Generated& plain, const Generated& spec) {
    EXPECT_EQ(spec.tokens, plain.tokens);
    EXPECT_EQ(spec.stats.n_generated, plain.stats.n_generated);
    EXPECT_EQ(spec.stats.context_full, plain.stats.context_full);
    EXPECT_EQ(spec.stats.n_shifts, plain.stats.n_shifts);
    EXPECT_EQ(spec.n_past, plain.n_past);
    EXPECT_LE(spec.stats.n_accepted, spec.stats.n_drafted);
}

// Token counts per generated position (token id -> draws) from two samplers that should have the
// same distribution: a chi-squared test of homogeneity at each position (tokens with under 10
// draws in all pooled into one bin), each below the 99.9th percentile of its degrees of freedom.
inline void expect_same_distribution(const std::vector<std::map<int32_t, int>>& a,
                                     const std::vector<std::map<int32_t, int>>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t t = 0; t < a.size(); ++t) {
        std::map<int32_t, std::pair<int, int>> bins;
        for (const auto& [id, n] : a[t]) bins[id].first += n;
        for (const auto& [id, n] : b[t]) bins[id].second += n;
        double chi2 = 0.0;
        int dof = -1;
        std::pair<int, int> rare{0, 0};
        const auto add = [&](int x, int y) {
            const double e = (x + y) / 2.0;
            chi2 += (x - e) * (x - e) / e + (y - e) * (y - e) / e;
            ++dof;
        };
        for (const auto& [id, xy] : bins) {
            if (xy.first + xy.second < 10) {
                rare.first += xy.first;
                rare.second += xy.second;
            } else {
                add(xy.first, xy.second);
            }
        }
        if (rare.first + rare.second > 0) add(rare.first, rare.second);
        if (dof < 1) continue;
        // The 99.9th percentile of chi-squared with dof degrees of freedom (Wilson-Hilferty).
        const double z = 3.09, k = dof;
        const double limit = k * std::pow(1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k)), 3.0);
        EXPECT_LT(chi2, limit) << "token " << t << ": " << dof << " degrees of freedom";
    }
}

}  // namespace fitllm::test
