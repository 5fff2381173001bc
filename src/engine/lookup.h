#pragma once
// Prompt lookup (n-gram) drafting for speculative decoding: text that is edited, summarised or
// refactored repeats runs of its prompt, so the tokens that followed the last few tokens where
// they occurred before are a cheap guess at what comes next. Session::generate_lookup feeds the
// guess with the token before it in one forward pass and keeps what the model agrees with
// (sampling::Sampler::sample_draft), so the output is what generate() gives: the same tokens when
// greedy, the same distribution when sampling.
//
//   engine::LookupParams lookup{.n_draft = 10};
//   std::vector<int32_t> draft;
//   engine::lookup_draft(history, lookup, 10, draft);   // empty: nothing to propose
#include <cstdint>
#include <span>
#include <vector>

namespace fitllm::engine {

struct LookupParams {
    int n_draft = 10;   // tokens proposed per forward pass at most (--draft-max)
    int ngram_min = 1;  // the shortest suffix looked up (--lookup-ngram-min)
    int ngram_max = 3;  // the longest (--lookup-ngram-max); longer ones are tried first
};

// Throws ConfigError naming the parameter when one is out of range: n_draft < 1, ngram_min < 1,
// ngram_max < ngram_min, or either above kMaxLookupNgram.
inline constexpr int kMaxLookupNgram = 64;
void check(const LookupParams& params);

// For n = params.ngram_max down to params.ngram_min: finds the last n tokens of history earlier in
// it, and when found writes the tokens that followed there (up to max_tokens) to out and returns
// how many. Among the occurrences of the longest n that has one, the latest that is followed by
// max_tokens tokens wins, else the one followed by the most. Returns 0 (out empty) when no suffix
// occurs earlier or max_tokens < 1. Allocates nothing once out has max_tokens of capacity.
int lookup_draft(std::span<const int32_t> history, const LookupParams& params, int max_tokens,
                 std::vector<int32_t>& out);

}  // namespace fitllm::engine
