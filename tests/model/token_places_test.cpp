// model::token_places: where each token of a batch sits in its sequence's run (what ops::matmul
// needs to give llama.cpp's batch-kernel bits for a prompt): contiguous runs, interleaved
// sequences, a decode step of separate sequences.
#include <gtest/gtest.h>

#include <vector>

#include "model/decoder.h"

namespace fitllm::model {
namespace {

std::vector<ops::TokenPlace> places_of(const std::vector<kv::SeqId>& seq) {
    std::vector<ops::TokenPlace> out(seq.size(), ops::TokenPlace{-1, -1});
    token_places(seq.data(), static_cast<int>(seq.size()), out.data());
    return out;
}

void expect_places(const std::vector<kv::SeqId>& seq, const std::vector<ops::TokenPlace>& expected) {
    const auto got = places_of(seq);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t t = 0; t < got.size(); ++t) {
        EXPECT_EQ(got[t].run_len, expected[t].run_len) << "token " << t;
        EXPECT_EQ(got[t].run_pos, expected[t].run_pos) << "token " << t;
    }
}

TEST(TokenPlaces, ContiguousRuns) {
    expect_places({0, 0, 0}, {{3, 0}, {3, 1}, {3, 2}});
    expect_places({4, 4, 1, 1, 1, 7}, {{2, 0}, {2, 1}, {3, 0}, {3, 1}, {3, 2}, {1, 0}});
}

TEST(TokenPlaces, SeparateSequencesAreRunsOfOne) {
    expect_places({0, 1, 2, 3}, {{1, 0}, {1, 0}, {1, 0}, {1, 0}});
}

TEST(TokenPlaces, InterleavedSequencesCountPerSequence) {
    expect_places({0, 1, 0, 0, 1, 2}, {{3, 0}, {2, 0}, {3, 1}, {3, 2}, {2, 1}, {1, 0}});
}

}  // namespace
}  // namespace fitllm::model
