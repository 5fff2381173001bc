// The Sampler as the decode loop uses it: the chain, the seed, the penalty window.
#include "sampling/sampler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace fitllm::sampling {
namespace {

// Every step off: the draw is from softmax(logits) at temperature 1.
SamplingParams plain_params(uint64_t seed) {
    SamplingParams params;
    params.temperature = 1.0f;
    params.top_k = 0;
    params.top_p = 1.0f;
    params.min_p = 0.0f;
    params.seed = seed;
    return params;
}

std::vector<float> random_logits(int32_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::vector<float> logits(static_cast<size_t>(n));
    for (float& l : logits) l = normal(rng);
    return logits;
}

std::vector<TokenId> generate(Sampler& sampler, const std::vector<float>& logits, int n) {
    std::vector<TokenId> tokens;
    for (int i = 0; i < n; ++i) {
        tokens.push_back(sampler.sample(logits));
        sampler.accept(tokens.back());
    }
    return tokens;
}

TEST(Sampler, GreedyPicksTheArgmaxLowestIdOnTies) {
    SamplingParams params;
    params.temperature = 0.0f;
    Sampler sampler(params, 5);
    EXPECT_EQ(sampler.sample(std::vector<float>{0.1f, 2.0f, -1.0f, 2.0f, 1.9f}), 1);
    EXPECT_EQ(sampler.sample(std::vector<float>{0.1f, 2.0f, -1.0f, 2.5f, 1.9f}), 3);
    EXPECT_EQ(sampler.last_candidates().size(), 1u);
}

TEST(Sampler, SameSeedGivesTheSameTokensAndOtherSeedsDiffer) {
    const std::vector<float> logits = random_logits(50, 1);
    Sampler first(plain_params(42), 50);
    Sampler second(plain_params(42), 50);
    Sampler other(plain_params(43), 50);
    Sampler other_high_bits(plain_params(42 + (uint64_t{1} << 40)), 50);
    const std::vector<TokenId> tokens = generate(first, logits, 200);
    EXPECT_EQ(generate(second, logits, 200), tokens);
    EXPECT_NE(generate(other, logits, 200), tokens);
    EXPECT_NE(generate(other_high_bits, logits, 200), tokens);
}

TEST(Sampler, ResetRestartsTheSequence) {
    const std::vector<float> logits = random_logits(50, 2);
    SamplingParams params = plain_params(7);
    params.repeat_penalty = 1.3f;
    Sampler sampler(params, 50);
    const std::vector<TokenId> tokens = generate(sampler, logits, 100);
    sampler.reset();
    EXPECT_EQ(generate(sampler, logits, 100), tokens);
}

TEST(Sampler, RandomSeedIsReportedAndReproducible) {
    const std::vector<float> logits = random_logits(50, 3);
    Sampler sampler(plain_params(kRandomSeed), 50);
    EXPECT_NE(sampler.seed(), kRandomSeed);
    Sampler replay(plain_params(sampler.seed()), 50);
    EXPECT_EQ(generate(replay, logits, 100), generate(sampler, logits, 100));
}

// Pearson's chi-square of observed counts against expected probabilities.
double chi_square(const std::vector<int>& observed, const std::vector<double>& probs, int draws) {
    double statistic = 0.0;
    for (size_t i = 0; i < probs.size(); ++i) {
        const double expected = probs[i] * draws;
        statistic += (observed[i] - expected) * (observed[i] - expected) / expected;
    }
    return statistic;
}

TEST(Sampler, DrawsFollowTheDistribution) {
    const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
    std::vector<float> logits;
    for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
    Sampler sampler(plain_params(1234), 4);
    const int draws = 100000;
    std::vector<int> counts(4, 0);
    for (int i = 0; i < draws; ++i) ++counts[static_cast<size_t>(sampler.sample(logits))];
    // 3 degrees of freedom: 16.27 is the 99.9% quantile.
    EXPECT_LT(chi_square(counts, probs, draws), 16.27);
}

TEST(Sampler, TemperatureFlattensTheDistribution) {
    const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
    std::vector<float> logits;
    for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
    SamplingParams params = plain_params(99);
    params.temperature = 2.0f;  // p^(1/2), renormalized
    Sampler sampler(params, 4);
    std::vector<double> expected;
    double total = 0.0;
    for (double p : probs) total += std::sqrt(p);
    for (double p : probs) expected.push_back(std::sqrt(p) / total);
    const int draws = 100000;
    std::vector<int> counts(4, 0);
    for (int i = 0; i < draws; ++i) ++counts[static_cast<size_t>(sampler.sample(logits))];
    EXPECT_LT(chi_square(counts, expected, draws), 16.27);
}

TEST(Sampler, TopKLimitsWhatCanBeDrawn) {
    SamplingParams params = plain_params(5);
    params.top_k = 2;
    Sampler sampler(params, 6);
    const std::vector<float> logits = {0.0f, 1.0f, 0.5f, 1.2f, 0.9f, -1.0f};
    for (int i = 0; i < 1000; ++i) {
        const TokenId token = sampler.sample(logits);
        ASSERT_TRUE(token == 1 || token == 3) << token;
    }
}

TEST(Sampler, PenaltiesLookOnlyAtTheLastNAcceptedTokens) {
    SamplingParams params;
    params.temperature = 0.0f;
    params.repeat_penalty = 2.0f;
    params.penalty_last_n = 2;
    Sampler sampler(params, 3);
    const std::vector<float> logits = {1.0f, 0.9f, 0.0f};
    EXPECT_EQ(sampler.sample(logits), 0);
    sampler.accept(0);  // 1.0 -> 0.5
    EXPECT_EQ(sampler.sample(logits), 1);
    sampler.accept(1);  // window {0, 1}: 0.5 vs 0.45
    EXPECT_EQ(sampler.sample(logits), 0);
    sampler.accept(2);  // window {1, 2}: token 0 left the window
    sampler.accept(2);  // window {2, 2}
    EXPECT_EQ(sampler.sample(logits), 0);
    sampler.accept(0);  // window {2, 0}
    EXPECT_EQ(sampler.sample(logits), 1);
}

TEST(Sampler, FrequencyAndPresencePenaltiesCountOccurrences) {
    SamplingParams params = plain_params(1);
    params.frequency_penalty = 0.25f;
    params.presence_penalty = 1.0f;
    params.penalty_last_n = 8;
    Sampler sampler(params, 3);
    for (TokenId token : {0, 0, 0, 1}) sampler.accept(token);
    sampler.sample(std::vector<float>{5.0f, 5.0f, 5.0f});
    const auto survivors = sampler.last_candidates();
    ASSERT_EQ(survivors.size(), 3u);
    EXPECT_FLOAT_EQ(survivors[0].logit, 5.0f - (3 * 0.25f + 1.0f));
    EXPECT_FLOAT_EQ(survivors[1].logit, 5.0f - (1 * 0.25f + 1.0f));
    EXPECT_FLOAT_EQ(survivors[2].logit, 5.0f);
}

TEST(Sampler, PenaltyWindowMatchesARecountOfTheLastNTokens) {
    SamplingParams params = plain_params(1);
    params.chain = {SamplerStep::penalties};
    params.repeat_penalty = 1.5f;
    params.frequency_penalty = 0.125f;
    params.presence_penalty = 0.25f;
    params.penalty_last_n = 5;
    const int32_t vocab = 10;
    Sampler sampler(params, vocab);
    const std::vector<float> logits = random_logits(vocab, 4);
    std::mt19937 rng(8);
    std::vector<TokenId> history;
    for (int step = 0; step < 300; ++step) {
        if (step == 150) {
            sampler.reset();
            history.clear();
        }
        const auto token = static_cast<TokenId>(rng() % 6);  // few distinct ids: many repeats
        sampler.accept(token);
        history.push_back(token);
        sampler.sample(logits);
        std::vector<int32_t> counts(vocab, 0);
        for (size_t i = history.size() > 5 ? history.size() - 5 : 0; i < history.size(); ++i) ++counts[history[i]];
        for (const Candidate& c : sampler.last_candidates()) {
            float expected = logits[c.id];
            if (counts[c.id] > 0) {
                expected = expected <= 0.0f ? expected * 1.5f : expected / 1.5f;
                expected -= static_cast<float>(counts[c.id]) * 0.125f + 0.25f;
            }
            ASSERT_FLOAT_EQ(c.logit, expected) << "step " << step << ", token " << c.id;
        }
    }
}

TEST(Sampler, ZeroPenaltyWindowTurnsPenaltiesOff) {
    SamplingParams params;
    params.temperature = 0.0f;
    params.repeat_penalty = 10.0f;
    params.penalty_last_n = 0;
    Sampler sampler(params, 2);
    sampler.accept(0);
    EXPECT_EQ(sampler.sample(std::vector<float>{1.0f, 0.5f}), 0);
}

TEST(Sampler, ChainOrderIsConfigurable) {
    // Token 0 is best but penalized below token 1. Penalizing first lets top_k drop token 0;
    // top_k first keeps only token 0, which the penalty can no longer displace.
    SamplingParams params = plain_params(3);
    params.top_k = 1;
    params.repeat_penalty = 10.0f;
    const std::vector<float> logits = {3.0f, 2.9f, 1.0f};

    params.chain = parse_sampler_chain("penalties;top_k");
    Sampler penalties_first(params, 3);
    penalties_first.accept(0);
    EXPECT_EQ(penalties_first.sample(logits), 1);

    params.chain = parse_sampler_chain("top_k;penalties");
    Sampler top_k_first(params, 3);
    top_k_first.accept(0);
    EXPECT_EQ(top_k_first.sample(logits), 0);
}

TEST(Sampler, EmptyChainDrawsFromTheRawLogits) {
    SamplingParams params;  // defaults would cut the tail, but no step runs
    params.chain.clear();
    params.seed = 11;
    Sampler sampler(params, 4);
    sampler.sample(std::vector<float>{0.0f, 1.0f, 2.0f, -30.0f});
    EXPECT_EQ(sampler.last_candidates().size(), 4u);
}

TEST(Sampler, LogitBiasShiftsAndBans) {
    SamplingParams params;
    params.temperature = 0.0f;
    const std::vector<float> logits{0.1f, 2.0f, -1.0f, 1.5f};
    params.logit_bias = {{3, 1.0f}};  // 2.5 beats 2.0
    EXPECT_EQ(Sampler(params, 4).sample(logits), 3);
    params.logit_bias = {{1, -100.0f}, {3, -100.0f}};  // banned: the best of the rest
    EXPECT_EQ(Sampler(params, 4).sample(logits), 0);
    params.logit_bias = {{2, 5.0f}};
    EXPECT_EQ(Sampler(params, 4).sample(logits), 2);
    // A banned token is never drawn, whatever the temperature.
    SamplingParams hot = plain_params(3);
    hot.temperature = 2.0f;
    hot.logit_bias = {{1, -100.0f}};
    Sampler sampler(hot, 4);
    for (int i = 0; i < 200; ++i) EXPECT_NE(sampler.sample(logits), 1);
    params.logit_bias = {{4, 1.0f}};
    EXPECT_THROW(Sampler(params, 4), SamplingError);
    params.logit_bias = {{0, -100.0f}, {1, -100.0f}, {2, -100.0f}, {3, -101.0f}};
    EXPECT_THROW(Sampler(params, 4), SamplingError);
}

TEST(Sampler, WrongLogitCountAndForeignTokensAreErrors) {
    Sampler sampler(SamplingParams{}, 4);
    EXPECT_THROW(sampler.sample(std::vector<float>{0.0f, 1.0f}), SamplingError);
    EXPECT_THROW(sampler.accept(4), SamplingError);
    EXPECT_THROW(sampler.accept(-1), SamplingError);
    EXPECT_THROW(Sampler(SamplingParams{}, 0), SamplingError);
}

TEST(Sampler, LargeVocabularyReusesItsScratchAndStaysFast) {
    const int32_t vocab = 262144;
    const std::vector<float> logits = random_logits(vocab, 9);
    SamplingParams params;  // llama.cpp's defaults: top_k 40, top_p 0.95, min_p 0.05, temp 0.8
    params.seed = 17;
    params.repeat_penalty = 1.1f;
    Sampler sampler(params, vocab);
    sampler.accept(sampler.sample(logits));
    const Candidate* scratch = sampler.last_candidates().data();
    const auto start = std::chrono::steady_clock::now();
    const int samples = 50;
    for (int i = 0; i < samples; ++i) sampler.accept(sampler.sample(logits));
    const double ms_per_sample =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / samples;
    EXPECT_EQ(sampler.last_candidates().data(), scratch) << "the candidate buffer was reallocated";
    RecordProperty("ms_per_sample", std::to_string(ms_per_sample));
    std::printf("sampling a %d-entry vocabulary: %.3f ms per token\n", vocab, ms_per_sample);

    // Without top_k, top_p must still avoid sorting everything; this only has to stay correct.
    params.top_k = 0;
    Sampler no_top_k(params, vocab);
    const TokenId token = no_top_k.sample(logits);
    EXPECT_GE(token, 0);
    EXPECT_LT(token, vocab);
}

}  // namespace
}  // namespace fitllm::sampling
