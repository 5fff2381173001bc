#include "cli/generation_options.h"

#include <cstdint>
#include <exception>

#include "sampling/sampler.h"

namespace fitllm::cli {

float parse_float(const std::string& name, const std::string& text) {
    size_t used = 0;
    float v = 0.0f;
    try {
        v = std::stof(text, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used == 0 || used != text.size()) throw UsageError(name + ": '" + text + "' is not a number");
    return v;
}

void add_sampling_options(ArgParser& p, sampling::SamplingParams& sp) {
    p.option("--temp", "T", "temperature; 0 or less: greedy (default 0.8)",
             [&sp](const std::string& v) { sp.temperature = parse_float("--temp", v); });
    p.option("--top-k", "K", "keep the K most likely tokens; 0: off (default 40)",
             [&sp](const std::string& v) { sp.top_k = static_cast<int32_t>(parse_integer("--top-k", v)); });
    p.option("--top-p", "P", "nucleus sampling; 1: off (default 0.95)",
             [&sp](const std::string& v) { sp.top_p = parse_float("--top-p", v); });
    p.option("--min-p", "P", "drop tokens below P times the most likely; 0: off (default 0.05)",
             [&sp](const std::string& v) { sp.min_p = parse_float("--min-p", v); });
    p.option("--seed", "S", "random seed (default: random)", [&sp](const std::string& v) {
        const long long s = parse_integer("--seed", v);
        if (s < 0) throw UsageError("--seed: '" + v + "' must not be negative");
        sp.seed = static_cast<uint64_t>(s);
    });
    p.option("--repeat-penalty", "R", "penalize repeats of the last 64 tokens; 1: off (default 1)",
             [&sp](const std::string& v) { sp.repeat_penalty = parse_float("--repeat-penalty", v); });
}

void validate_sampling_options(const sampling::SamplingParams& sp) {
    try {
        sampling::validate_sampling_params(sp);
    } catch (const sampling::SamplingError& e) {
        throw UsageError(e.what());
    }
}

}  // namespace fitllm::cli
