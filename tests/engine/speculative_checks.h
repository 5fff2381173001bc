#pragma once
// What a greedy generation gave, with or without drafts (prompt lookup, a draft model), and the
// check that drafting changed none of it.
#include <gtest/gtest.h>

#include <cstdint>
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

}  // namespace fitllm::test
