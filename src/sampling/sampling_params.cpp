#include "sampling/sampling_params.h"

#include <array>
#include <cmath>
#include <sstream>
#include <string>

namespace fitllm::sampling {
namespace {

// Floats print as the user typed them (1.5, not 1.500000), integers as integers.
template <typename Number>
[[noreturn]] void throw_out_of_range(std::string_view name, Number value, std::string_view expected) {
    std::ostringstream message;
    message << "sampling: " << name << " = " << value << " is out of range; expected " << expected;
    throw SamplingError(message.str());
}

void require_finite(std::string_view name, float value) {
    if (!std::isfinite(value)) throw_out_of_range(name, value, "a finite number");
}

struct NamedStep {
    std::string_view name;
    SamplerStep step;
};

// Canonical names first: sampler_step_name returns the first match.
constexpr std::array kStepNames = {
    NamedStep{"penalties", SamplerStep::penalties}, NamedStep{"top_k", SamplerStep::top_k},
    NamedStep{"typical_p", SamplerStep::typical_p}, NamedStep{"top_p", SamplerStep::top_p},
    NamedStep{"min_p", SamplerStep::min_p},         NamedStep{"temperature", SamplerStep::temperature},
    NamedStep{"top-k", SamplerStep::top_k},         NamedStep{"typical", SamplerStep::typical_p},
    NamedStep{"typ_p", SamplerStep::typical_p},     NamedStep{"top-p", SamplerStep::top_p},
    NamedStep{"min-p", SamplerStep::min_p},         NamedStep{"temp", SamplerStep::temperature},
};

std::string_view trim(std::string_view text) {
    const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
    while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
    while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
    return text;
}

}  // namespace

void validate_sampling_params(const SamplingParams& params) {
    // NaN compares false with everything, so the range checks below are written to reject it.
    require_finite("temperature", params.temperature);
    if (params.top_k < 0) throw_out_of_range("top_k", params.top_k, "a value >= 0 (0 turns it off)");
    if (!(params.top_p > 0.0f && params.top_p <= 1.0f))
        throw_out_of_range("top_p", params.top_p, "a value in (0, 1] (1 turns it off)");
    if (!(params.min_p >= 0.0f && params.min_p <= 1.0f))
        throw_out_of_range("min_p", params.min_p, "a value in [0, 1] (0 turns it off)");
    if (!(params.typical_p > 0.0f && params.typical_p <= 1.0f))
        throw_out_of_range("typical_p", params.typical_p, "a value in (0, 1] (1 turns it off)");
    require_finite("repeat_penalty", params.repeat_penalty);
    if (!(params.repeat_penalty > 0.0f))
        throw_out_of_range("repeat_penalty", params.repeat_penalty, "a value > 0 (1 turns it off)");
    for (const auto& [id, bias] : params.logit_bias) {
        if (std::isnan(bias)) throw_out_of_range("logit_bias[" + std::to_string(id) + "]", bias, "a number");
    }
    require_finite("frequency_penalty", params.frequency_penalty);
    require_finite("presence_penalty", params.presence_penalty);
    if (params.penalty_last_n < 0)
        throw_out_of_range("penalty_last_n", params.penalty_last_n, "a value >= 0 (0 turns penalties off)");
    for (size_t i = 0; i < params.chain.size(); ++i) {
        for (size_t j = 0; j < i; ++j) {
            if (params.chain[i] == params.chain[j])
                throw SamplingError("sampling: chain names '" + std::string(sampler_step_name(params.chain[i])) +
                                    "' twice (positions " + std::to_string(j + 1) + " and " + std::to_string(i + 1) +
                                    ")");
        }
    }
}

std::vector<SamplerStep> parse_sampler_chain(std::string_view spec) {
    std::vector<SamplerStep> chain;
    if (trim(spec).empty()) return chain;
    size_t position = 0;
    while (true) {
        ++position;
        const size_t separator = spec.find_first_of(";,");
        const std::string_view entry = trim(spec.substr(0, separator));
        const NamedStep* match = nullptr;
        for (const NamedStep& named : kStepNames) {
            if (named.name == entry) match = &named;
        }
        if (match == nullptr) {
            throw SamplingError("sampling: unknown sampler '" + std::string(entry) + "' at position " +
                                std::to_string(position) +
                                " of the chain; known: penalties, top_k, typical_p, top_p, min_p, temperature");
        }
        for (SamplerStep earlier : chain) {
            if (earlier == match->step)
                throw SamplingError("sampling: sampler '" + std::string(entry) + "' at position " +
                                    std::to_string(position) + " repeats an earlier entry of the chain");
        }
        chain.push_back(match->step);
        if (separator == std::string_view::npos) break;
        spec.remove_prefix(separator + 1);
    }
    return chain;
}

std::string_view sampler_step_name(SamplerStep step) {
    for (const NamedStep& named : kStepNames) {
        if (named.step == step) return named.name;
    }
    return "unknown";
}

}  // namespace fitllm::sampling
