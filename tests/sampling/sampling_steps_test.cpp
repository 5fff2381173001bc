// Each step of the chain on hand-made logits: which candidates survive, in which order, with
// which probabilities (see sampling/candidates.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "sampling/candidates.h"
#include "sampling/sampling_params.h"

namespace fitllm::sampling {
namespace {

CandidateList list_of(const std::vector<float>& logits) {
    CandidateList list;
    list.assign(logits);
    return list;
}

// Logits whose softmax is exactly the given probabilities (up to float rounding).
std::vector<float> logits_of_probs(const std::vector<float>& probs) {
    std::vector<float> logits;
    for (float p : probs) logits.push_back(std::log(p));
    return logits;
}

std::vector<TokenId> ids_of(const CandidateList& list) {
    std::vector<TokenId> ids;
    for (const Candidate& c : list.items) ids.push_back(c.id);
    return ids;
}

TEST(SamplingSteps, SoftmaxGivesNormalizedProbabilities) {
    CandidateList list = list_of(logits_of_probs({0.1f, 0.2f, 0.3f, 0.4f}));
    compute_softmax(list);
    EXPECT_NEAR(list.items[0].prob, 0.1f, 1e-6);
    EXPECT_NEAR(list.items[1].prob, 0.2f, 1e-6);
    EXPECT_NEAR(list.items[2].prob, 0.3f, 1e-6);
    EXPECT_NEAR(list.items[3].prob, 0.4f, 1e-6);
}

TEST(SamplingSteps, SoftmaxOfOnlyImpossibleCandidatesIsUniform) {
    const float minus_inf = -std::numeric_limits<float>::infinity();
    CandidateList list = list_of({minus_inf, minus_inf});
    compute_softmax(list);
    EXPECT_FLOAT_EQ(list.items[0].prob, 0.5f);
    EXPECT_FLOAT_EQ(list.items[1].prob, 0.5f);
}

TEST(SamplingSteps, NanLogitIsAnErrorNamingTheToken) {
    CandidateList list;
    try {
        list.assign(std::vector<float>{0.0f, 1.0f, std::nanf("")});
        FAIL() << "expected SamplingError";
    } catch (const SamplingError& e) {
        EXPECT_NE(std::string(e.what()).find("token 2"), std::string::npos) << e.what();
    }
    EXPECT_THROW(list.assign(std::vector<float>{std::numeric_limits<float>::infinity()}), SamplingError);
    EXPECT_NO_THROW(list.assign(std::vector<float>{-std::numeric_limits<float>::infinity(), 0.0f}));
}

TEST(SamplingSteps, TopKKeepsTheBestSortedWithTiesByLowerId) {
    CandidateList list = list_of({1.0f, 5.0f, 3.0f, 5.0f, 2.0f});
    apply_top_k(list, 3);
    EXPECT_EQ(ids_of(list), (std::vector<TokenId>{1, 3, 2}));
    EXPECT_EQ(list.sorted_prefix, 3u);
}

TEST(SamplingSteps, TopKZeroOrLargerThanListIsANoOp) {
    CandidateList list = list_of({1.0f, 5.0f, 3.0f});
    apply_top_k(list, 0);
    EXPECT_EQ(ids_of(list), (std::vector<TokenId>{0, 1, 2}));
    apply_top_k(list, 3);
    EXPECT_EQ(ids_of(list), (std::vector<TokenId>{0, 1, 2}));
}

TEST(SamplingSteps, TopKOnALargeVocabularyMatchesAFullSort) {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> logits(262144);
    for (float& l : logits) l = normal(rng);
    CandidateList list = list_of(logits);
    apply_top_k(list, 40);

    CandidateList reference = list_of(logits);
    std::sort(reference.items.begin(), reference.items.end(), ranks_before);
    reference.items.resize(40);
    EXPECT_EQ(ids_of(list), ids_of(reference));
}

TEST(SamplingSteps, TopPKeepsTheSmallestPrefixReachingP) {
    // ids by probability: 2 (0.5), 0 (0.3), 3 (0.15), 1 (0.05)
    const std::vector<float> logits = logits_of_probs({0.3f, 0.05f, 0.5f, 0.15f});
    CandidateList list = list_of(logits);
    apply_top_p(list, 0.4f);
    EXPECT_EQ(ids_of(list), (std::vector<TokenId>{2}));
    list = list_of(logits);
    apply_top_p(list, 0.7f);
    EXPECT_EQ(ids_of(list), (std::vector<TokenId>{2, 0}));
    list = list_of(logits);
    apply_top_p(list, 0.9f);
    EXPECT_EQ(ids_of(list), (std::vector<TokenId>{2, 0, 3}));
    list = list_of(logits);
    apply_top_p(list, 1.0f);
    EXPECT_EQ(list.size(), 4u);
}

TEST(SamplingSteps, TopPGrowsItsSortedPrefixWhenTheMassIsSpread) {
    // 100000 equal candidates: half the mass needs 50000 of them, far past the first sort.
    CandidateList list = list_of(std::vector<float>(100000, 0.0f));
    apply_top_p(list, 0.5f);
    // The running sum is a float, as in llama.cpp, so 50000 additions drift by a few dozen.
    EXPECT_NEAR(static_cast<double>(list.size()), 50000.0, 100.0);
    for (size_t i = 0; i < list.size(); ++i) ASSERT_EQ(list.items[i].id, static_cast<TokenId>(i));
}

TEST(SamplingSteps, TopPAfterALargeTopKWalksTheWholeSortedList) {
    CandidateList list = list_of(std::vector<float>(5000, 0.0f));
    apply_top_k(list, 1000);
    apply_top_p(list, 0.5f);
    EXPECT_NEAR(static_cast<double>(list.size()), 500.0, 2.0);
    EXPECT_EQ(list.sorted_prefix, list.size());
}

TEST(SamplingSteps, DeepTopPKeepsTheSameSetAsAFullSort) {
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::vector<float> logits(50000);
    for (float& l : logits) l = normal(rng);
    logits[17] = -std::numeric_limits<float>::infinity();
    for (float p : {0.3f, 0.8f, 0.95f, 0.999f}) {
        CandidateList list = list_of(logits);
        apply_top_p(list, p);

        CandidateList reference = list_of(logits);
        compute_softmax(reference);
        std::sort(reference.items.begin(), reference.items.end(), ranks_before);
        size_t reference_size = reference.size();
        float cumulative = 0.0f;
        for (size_t i = 0; i < reference.size(); ++i) {
            cumulative += reference.items[i].prob;
            if (cumulative >= p) {
                reference_size = i + 1;
                break;
            }
        }
        ASSERT_GT(list.size(), 256u) << "p = " << p << " should need the deep path";
        // Float sums in another order may move the cut by a few candidates.
        ASSERT_NEAR(static_cast<double>(list.size()), static_cast<double>(reference_size), 8.0) << "p = " << p;
        std::vector<TokenId> kept = ids_of(list);
        std::sort(kept.begin(), kept.end());
        reference.items.resize(list.size());
        std::vector<TokenId> best = ids_of(reference);
        std::sort(best.begin(), best.end());
        EXPECT_EQ(kept, best) << "p = " << p << ": not the best candidates";
    }
}

TEST(SamplingSteps, MinPKeepsCandidatesWithinAFactorOfTheBest) {
    const std::vector<float> logits = logits_of_probs({0.3f, 0.05f, 0.5f, 0.15f});
    CandidateList list = list_of(logits);
    apply_min_p(list, 0.2f);  // threshold 0.1: 0.05 goes
    EXPECT_EQ(ids_of(list), (std::vector<TokenId>{0, 2, 3}));
    compute_softmax(list);
    EXPECT_NEAR(list.items[0].prob, 0.3f / 0.95f, 1e-6);
    EXPECT_NEAR(list.items[1].prob, 0.5f / 0.95f, 1e-6);
    EXPECT_NEAR(list.items[2].prob, 0.15f / 0.95f, 1e-6);

    list = list_of(logits);
    apply_min_p(list, 0.65f);  // threshold 0.325: only the best
    EXPECT_EQ(ids_of(list), (std::vector<TokenId>{2}));
    list = list_of(logits);
    apply_min_p(list, 0.0f);
    EXPECT_EQ(list.size(), 4u);
}

TEST(SamplingSteps, MinPAfterTopKKeepsTheListSorted) {
    CandidateList list = list_of(logits_of_probs({0.3f, 0.05f, 0.5f, 0.15f}));
    apply_top_k(list, 3);
    apply_min_p(list, 0.4f);  // threshold 0.2: 0.15 goes
    EXPECT_EQ(ids_of(list), (std::vector<TokenId>{2, 0}));
    EXPECT_EQ(list.sorted_prefix, 2u);
}

TEST(SamplingSteps, TypicalKeepsCandidatesClosestToTheEntropy) {
    // Entropy 1.2799 nats; surprisals 0.916 (0.4), 1.204 (0.3), 1.609 (0.2), 2.303 (0.1), so the
    // order of typicality is 0.3, 0.2, 0.4, 0.1.
    const std::vector<float> logits = logits_of_probs({0.4f, 0.3f, 0.2f, 0.1f});
    CandidateList list = list_of(logits);
    apply_typical(list, 0.45f);
    EXPECT_EQ(ids_of(list), (std::vector<TokenId>{1, 2}));
    list = list_of(logits);
    apply_typical(list, 0.75f);
    EXPECT_EQ(ids_of(list), (std::vector<TokenId>{1, 2, 0}));
    EXPECT_EQ(list.sorted_prefix, 0u);
    list = list_of(logits);
    apply_typical(list, 1.0f);
    EXPECT_EQ(ids_of(list), (std::vector<TokenId>{0, 1, 2, 3}));
}

TEST(SamplingSteps, TemperatureScalesLogits) {
    CandidateList list = list_of({1.0f, 2.0f, -4.0f});
    apply_temperature(list, 2.0f);
    EXPECT_FLOAT_EQ(list.items[0].logit, 0.5f);
    EXPECT_FLOAT_EQ(list.items[1].logit, 1.0f);
    EXPECT_FLOAT_EQ(list.items[2].logit, -2.0f);
}

TEST(SamplingSteps, ZeroOrNegativeTemperatureKeepsOnlyTheBestLowestIdOnTies) {
    CandidateList list = list_of({3.0f, 7.0f, 7.0f, 1.0f});
    apply_temperature(list, 0.0f);
    EXPECT_EQ(ids_of(list), (std::vector<TokenId>{1}));
    list = list_of({3.0f, 7.0f, 7.0f, 1.0f});
    apply_temperature(list, -1.0f);
    EXPECT_EQ(ids_of(list), (std::vector<TokenId>{1}));
}

TEST(SamplingSteps, PenaltiesFollowLlamaCppSemantics) {
    const std::vector<float> logits = {2.0f, -2.0f, 1.0f, 0.5f, 0.0f};
    const std::vector<TokenId> window_tokens = {3, 0, 4, 1};
    const std::vector<int32_t> counts = {3, 1, 1, 2};  // of the window's tokens
    const auto expect_penalized = [](const Candidate& c) {
        const float expected[] = {
            2.0f / 2.0f - (1 * 0.1f + 0.5f),   // positive: divided
            -2.0f * 2.0f - (2 * 0.1f + 0.5f),  // negative: multiplied
            1.0f,                              // not in the window
            0.5f / 2.0f - (3 * 0.1f + 0.5f),
            0.0f - (1 * 0.1f + 0.5f),
        };
        EXPECT_FLOAT_EQ(c.logit, expected[c.id]) << "token " << c.id;
    };
    // In id order (penalties first in the chain): only the window's tokens are visited.
    CandidateList list = list_of(logits);
    ASSERT_TRUE(list.in_id_order);
    apply_penalties(list, window_tokens, counts, /*repeat=*/2.0f, /*frequency=*/0.1f, /*presence=*/0.5f);
    for (const Candidate& c : list.items) expect_penalized(c);
    // Reordered by an earlier step: every candidate is looked up.
    list = list_of(logits);
    apply_top_k(list, 4);
    ASSERT_FALSE(list.in_id_order);
    apply_penalties(list, window_tokens, counts, 2.0f, 0.1f, 0.5f);
    EXPECT_EQ(list.size(), 4u);
    for (const Candidate& c : list.items) expect_penalized(c);
}

TEST(SamplingSteps, DrawWalksTheCumulativeDistribution) {
    const std::vector<float> logits = logits_of_probs({0.5f, 0.3f, 0.2f});
    const auto draw = [&](double uniform) {
        CandidateList list = list_of(logits);
        return draw_from(list, uniform);
    };
    EXPECT_EQ(draw(0.0), 0);
    EXPECT_EQ(draw(0.49), 0);
    EXPECT_EQ(draw(0.51), 1);
    EXPECT_EQ(draw(0.79), 1);
    EXPECT_EQ(draw(0.81), 2);
    EXPECT_EQ(draw(0.9999999), 2);
}

TEST(SamplingSteps, DrawNeverPicksAnImpossibleCandidate) {
    CandidateList list = list_of({0.0f, 0.0f, -std::numeric_limits<float>::infinity()});
    EXPECT_EQ(draw_from(list, 0.9999999999), 1);
}

}  // namespace
}  // namespace fitllm::sampling
