#pragma once
// What a Sampler does, as the user configures it (CLI flags today, request fields later).
// Defaults and semantics follow llama.cpp's common sampling parameters, so the same flags give
// the same kind of output.
#include <cstdint>
#include <limits>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "fitllm/error.h"

namespace fitllm::sampling {

class Grammar;
class GrammarVocab;

// Parameters that cannot work (names the parameter and its value).
class SamplingError : public Error {
public:
    using Error::Error;
};

// One step of the chain. The final draw from the surviving distribution is implicit and
// always last, so it is not a step.
enum class SamplerStep { penalties, top_k, typical_p, top_p, min_p, temperature };

// llama.cpp's default order: penalties -> top_k -> typical -> top_p -> min_p -> temperature.
inline std::vector<SamplerStep> default_sampler_chain() {
    return {SamplerStep::penalties, SamplerStep::top_k, SamplerStep::typical_p,
            SamplerStep::top_p,     SamplerStep::min_p, SamplerStep::temperature};
}

// A value of uint64 max asks for a seed from std::random_device; Sampler::seed() tells which.
inline constexpr uint64_t kRandomSeed = std::numeric_limits<uint64_t>::max();

struct SamplingParams {
    float temperature = 0.8f;        // <= 0: greedy (only the most likely candidate survives)
    int32_t top_k = 40;              // 0: off
    float top_p = 0.95f;             // (0, 1]; 1: off
    float min_p = 0.05f;             // [0, 1]; 0: off; relative to the most likely candidate
    float typical_p = 1.0f;          // (0, 1]; 1: off
    float repeat_penalty = 1.0f;     // > 0; 1: off
    float frequency_penalty = 0.0f;  // subtracted once per occurrence in the window
    float presence_penalty = 0.0f;   // subtracted once if the token occurs in the window
    int32_t penalty_last_n = 64;     // window of accepted tokens the penalties look at; 0: off
    uint64_t seed = kRandomSeed;
    std::vector<SamplerStep> chain = default_sampler_chain();
    // Added to a token's logit before the chain (OpenAI's logit_bias); a bias of -100 or less
    // bans the token (its logit becomes -inf). Ids must be in the vocabulary (Sampler checks).
    std::vector<std::pair<int32_t, float>> logit_bias;
    // Constrained sampling (grammar.h): only tokens the grammar allows are drawn, an
    // end-of-generation token only where the grammar may end. grammar_vocab is the model's
    // vocabulary as the grammar sees it (engine::Scheduler fills it in from its tokenizer).
    std::shared_ptr<const Grammar> grammar;
    std::shared_ptr<const GrammarVocab> grammar_vocab;
};

// Throws SamplingError for the first parameter out of range, e.g.
// "sampling: top_p = 1.5 is out of range; expected a value in (0, 1] (1 turns it off)".
void validate_sampling_params(const SamplingParams& params);

// Parses a chain such as "penalties;top_k;top_p;min_p;temperature" (llama.cpp's --samplers
// form; ',' separates too). Names: penalties, top_k, typical_p, top_p, min_p, temperature;
// llama.cpp's aliases top-k, typical, typ_p, top-p, min-p, temp are accepted. An empty spec
// gives an empty chain (draw from the raw logits). Unknown or repeated names throw
// SamplingError naming the entry and its position.
std::vector<SamplerStep> parse_sampler_chain(std::string_view spec);

// The canonical name, as parse_sampler_chain accepts it.
std::string_view sampler_step_name(SamplerStep step);

}  // namespace fitllm::sampling
