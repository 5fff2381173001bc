// Speculative decoding's acceptance rule (Sampler::sample_draft, draft_probability,
// draw_without): whatever token a draft proposes, the token that comes out has the target's
// distribution, and the draft is accepted with the probability the target gives it.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "sampling/candidates.h"
#include "sampling/sampler.h"

namespace fitllm::sampling {
namespace {

// A toy target: 5 tokens with probabilities 0.4, 0.25, 0.2, 0.1, 0.05 at temperature 1.
const std::vector<double> kTarget = {0.4, 0.25, 0.2, 0.1, 0.05};

std::vector<float> toy_logits() {
    std::vector<float> logits;
    for (const double p : kTarget) logits.push_back(static_cast<float>(std::log(p)));
    return logits;
}

SamplingParams plain_params(uint64_t seed) {
    SamplingParams params;
    params.temperature = 1.0f;
    params.top_k = 0;
    params.top_p = 1.0f;
    params.min_p = 0.0f;
    params.seed = seed;
    return params;
}

// 200000 draws: a frequency's standard error is at most 0.0011, so 0.006 is over 5 of them. The
// rules one might get wrong are far off: drawing from the whole target after a rejection gives
// the draft p + (1 - p) p (0.64 instead of 0.4 for token 0, 0.19 instead of 0.1 for token 3);
// keeping the draft whenever it is possible gives it 1.
constexpr int kDraws = 200000;
constexpr double kTolerance = 0.006;

TEST(DraftAcceptance, TheTokenHasTheTargetsDistributionWhateverTheDraft) {
    const std::vector<float> logits = toy_logits();
    for (TokenId draft = 0; draft < static_cast<TokenId>(kTarget.size()); ++draft) {
        SCOPED_TRACE("draft " + std::to_string(draft));
        Sampler sampler(plain_params(1234 + static_cast<uint64_t>(draft)), static_cast<int32_t>(kTarget.size()));
        std::vector<int> count(kTarget.size(), 0);
        int accepted = 0;
        for (int i = 0; i < kDraws; ++i) {
            const Sampler::DraftVerdict v = sampler.sample_draft(logits, draft);
            ++count[static_cast<size_t>(v.token)];
            if (v.accepted) {
                ++accepted;
                EXPECT_EQ(v.token, draft);
            } else {
                ASSERT_NE(v.token, draft) << "a rejected draft came out anyway";
            }
        }
        for (size_t t = 0; t < kTarget.size(); ++t) {
            EXPECT_NEAR(static_cast<double>(count[t]) / kDraws, kTarget[t], kTolerance) << "token " << t;
        }
        EXPECT_NEAR(static_cast<double>(accepted) / kDraws, kTarget[static_cast<size_t>(draft)], kTolerance);
    }
}

TEST(DraftAcceptance, ADraftTheChainCutIsNeverAcceptedAndTheRestKeepTheirShares) {
    // top_k 2 keeps tokens 0 and 1 (0.4 / 0.65 and 0.25 / 0.65); token 4 cannot occur.
    SamplingParams params = plain_params(7);
    params.top_k = 2;
    Sampler sampler(params, static_cast<int32_t>(kTarget.size()));
    const std::vector<float> logits = toy_logits();
    std::vector<int> count(kTarget.size(), 0);
    for (int i = 0; i < kDraws; ++i) {
        const Sampler::DraftVerdict v = sampler.sample_draft(logits, 4);
        EXPECT_FALSE(v.accepted);
        ++count[static_cast<size_t>(v.token)];
    }
    EXPECT_NEAR(static_cast<double>(count[0]) / kDraws, 0.4 / 0.65, kTolerance);
    EXPECT_NEAR(static_cast<double>(count[1]) / kDraws, 0.25 / 0.65, kTolerance);
    EXPECT_EQ(count[2] + count[3] + count[4], 0);
}

TEST(DraftAcceptance, GreedyAcceptsExactlyTheBestToken) {
    SamplingParams params = plain_params(3);
    params.temperature = 0.0f;
    Sampler sampler(params, static_cast<int32_t>(kTarget.size()));
    const std::vector<float> logits = toy_logits();
    for (int i = 0; i < 100; ++i) {
        for (TokenId draft = 0; draft < static_cast<TokenId>(kTarget.size()); ++draft) {
            const Sampler::DraftVerdict v = sampler.sample_draft(logits, draft);
            EXPECT_EQ(v.token, 0);
            EXPECT_EQ(v.accepted, draft == 0);
        }
    }
}

TEST(DraftAcceptance, TheRuleOnACandidateList) {
    CandidateList list;
    list.assign(toy_logits());
    EXPECT_NEAR(draft_probability(list, 1), 0.25, 1e-6);
    // The residual without token 1: 0.4, 0.2, 0.1, 0.05 over 0.75.
    EXPECT_EQ(draw_without(list, 1, 0.0), 0);
    EXPECT_EQ(draw_without(list, 1, 0.4 / 0.75 - 1e-6), 0);
    EXPECT_EQ(draw_without(list, 1, 0.4 / 0.75 + 1e-6), 2);
    EXPECT_EQ(draw_without(list, 1, 0.7 / 0.75 + 1e-6), 4);
    EXPECT_EQ(draw_without(list, 1, 0.999999), 4);
    // Nothing but the draft can occur: it comes back.
    CandidateList one;
    one.assign(std::vector<float>{1.0f});
    EXPECT_NEAR(draft_probability(one, 0), 1.0, 1e-12);
    EXPECT_EQ(draw_without(one, 0, 0.5), 0);
    EXPECT_THROW(Sampler(plain_params(1), 5).sample_draft(toy_logits(), 5), SamplingError);
}

}  // namespace
}  // namespace fitllm::sampling
