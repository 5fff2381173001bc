// Parameter validation and the chain's text form.
#include "sampling/sampling_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

namespace fitllm::sampling {
namespace {

// Expects validation to fail with a message naming the parameter and its value.
void expect_rejected(const std::function<void(SamplingParams&)>& change, const std::string& name,
                     const std::string& value) {
    SamplingParams params;
    change(params);
    try {
        validate_sampling_params(params);
        ADD_FAILURE() << name << " = " << value << " was accepted";
    } catch (const SamplingError& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find(name), std::string::npos) << message;
        EXPECT_NE(message.find(value), std::string::npos) << message;
    }
}

TEST(SamplingParams, DefaultsAreValidAndInLlamaCppOrder) {
    EXPECT_NO_THROW(validate_sampling_params(SamplingParams{}));
    EXPECT_EQ(SamplingParams{}.chain, parse_sampler_chain("penalties;top_k;typical_p;top_p;min_p;temperature"));
}

TEST(SamplingParams, BoundaryValuesAreAccepted) {
    SamplingParams params;
    params.temperature = -1.0f;
    params.top_k = 0;
    params.top_p = 1.0f;
    params.min_p = 1.0f;
    params.typical_p = 0.01f;
    params.repeat_penalty = 0.5f;
    params.frequency_penalty = -2.0f;
    params.presence_penalty = -2.0f;
    params.penalty_last_n = 0;
    params.chain.clear();
    EXPECT_NO_THROW(validate_sampling_params(params));
}

TEST(SamplingParams, OutOfRangeValuesNameTheParameter) {
    const float nan = std::nanf("");
    const float inf = std::numeric_limits<float>::infinity();
    expect_rejected([&](SamplingParams& p) { p.temperature = nan; }, "temperature", "nan");
    expect_rejected([](SamplingParams& p) { p.top_k = -1; }, "top_k", "-1");
    expect_rejected([](SamplingParams& p) { p.top_p = 0.0f; }, "top_p", "0");
    expect_rejected([](SamplingParams& p) { p.top_p = 1.5f; }, "top_p", "1.5");
    expect_rejected([&](SamplingParams& p) { p.top_p = nan; }, "top_p", "nan");
    expect_rejected([](SamplingParams& p) { p.min_p = -0.1f; }, "min_p", "-0.1");
    expect_rejected([](SamplingParams& p) { p.min_p = 1.1f; }, "min_p", "1.1");
    expect_rejected([](SamplingParams& p) { p.typical_p = 0.0f; }, "typical_p", "0");
    expect_rejected([](SamplingParams& p) { p.repeat_penalty = 0.0f; }, "repeat_penalty", "0");
    expect_rejected([&](SamplingParams& p) { p.frequency_penalty = inf; }, "frequency_penalty", "inf");
    expect_rejected([&](SamplingParams& p) { p.presence_penalty = nan; }, "presence_penalty", "nan");
    expect_rejected([](SamplingParams& p) { p.penalty_last_n = -1; }, "penalty_last_n", "-1");
    expect_rejected([](SamplingParams& p) { p.chain = {SamplerStep::top_k, SamplerStep::top_k}; }, "top_k", "twice");
}

TEST(SamplingParams, ChainParsesNamesSeparatorsAndAliases) {
    using enum SamplerStep;
    EXPECT_EQ(parse_sampler_chain("penalties;top_k;top_p;min_p;temperature"),
              (std::vector<SamplerStep>{penalties, top_k, top_p, min_p, temperature}));
    EXPECT_EQ(parse_sampler_chain(" temp , top-k;typical ;min-p,top-p "),
              (std::vector<SamplerStep>{temperature, top_k, typical_p, min_p, top_p}));
    EXPECT_EQ(parse_sampler_chain("typ_p"), (std::vector<SamplerStep>{typical_p}));
    EXPECT_TRUE(parse_sampler_chain("").empty());
    EXPECT_TRUE(parse_sampler_chain("  ").empty());
}

TEST(SamplingParams, ChainNamesRoundTrip) {
    for (SamplerStep step : default_sampler_chain()) {
        EXPECT_EQ(parse_sampler_chain(sampler_step_name(step)), std::vector<SamplerStep>{step});
    }
}

TEST(SamplingParams, BadChainsNameTheEntryAndPosition) {
    try {
        parse_sampler_chain("top_k;mirostat;temperature");
        FAIL() << "expected SamplingError";
    } catch (const SamplingError& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find("'mirostat'"), std::string::npos) << message;
        EXPECT_NE(message.find("position 2"), std::string::npos) << message;
    }
    EXPECT_THROW(parse_sampler_chain("top_k;;top_p"), SamplingError);
    EXPECT_THROW(parse_sampler_chain("top_k;top-k"), SamplingError);
}

}  // namespace
}  // namespace fitllm::sampling
