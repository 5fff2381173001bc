#pragma once
// Picks the next token from a model's logits: the configured chain of steps narrows the
// candidates, then one is drawn from what survives.
//
//   Sampler sampler(params, vocab_size);
//   while (generating) {
//       const TokenId next = sampler.sample(logits);  // logits: one float per vocabulary entry
//       sampler.accept(next);                          // feeds the penalty window
//   }
//
// Each Sampler owns its random generator (std::mt19937), so runs with the same seed, params and
// logits give the same tokens, and samplers of concurrent sequences do not disturb each other.
// After the first sample() the decode loop allocates nothing. Not thread-safe: one per sequence.
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "sampling/candidates.h"
#include "sampling/grammar.h"
#include "sampling/sampling_params.h"

namespace fitllm::sampling {

class Sampler {
public:
    // Throws SamplingError when a parameter is out of range, vocab_size is not positive, a
    // logit_bias id is outside the vocabulary or the biases ban every token.
    Sampler(SamplingParams params, int32_t vocab_size);

    // Throws SamplingError when logits.size() != vocab_size or a logit is NaN.
    //
    // With a grammar (params.grammar), the token is one the grammar allows, and sample() advances
    // the grammar by it (accept() does not: it also sees prompt tokens). As llama.cpp does, the
    // token is first drawn without the grammar and kept when the grammar allows it (one walk over
    // its bytes); only otherwise is the mask of allowed tokens (grammar.h, cached per state)
    // applied to the logits before the chain and the token drawn again. So greedy sampling gives
    // the best allowed token. Throws SamplingError when no allowed token survives (the grammar
    // needs text the vocabulary cannot spell, or logit_bias bans every allowed token).
    TokenId sample(std::span<const float> logits);

    // Speculative decoding: the token for these logits, given a draft that proposed `draft` (a
    // point mass). The chain narrows the candidates as sample() does; the draft is accepted with
    // the probability the result gives it, else a token is drawn from that distribution without
    // the draft (candidates.h, draft_probability), so the token has sample()'s distribution. Greedy
    // (temperature <= 0): the best candidate, accepted when it is the draft. Draws one or two
    // random numbers. Throws as sample() does, and SamplingError for a draft outside the vocabulary.
    struct DraftVerdict {
        TokenId token;
        bool accepted;  // token == the draft, taken as proposed
    };
    DraftVerdict sample_draft(std::span<const float> logits, TokenId draft);

    // Records a token generated or taken from the prompt, for the penalties.
    // Throws SamplingError when the token is outside the vocabulary.
    void accept(TokenId token);

    // Forgets the penalty window and restarts the random sequence from the seed (and the grammar
    // from its start).
    void reset();
    // Starts the grammar over (for a new answer), keeping the penalty window and the random
    // sequence where they are. Nothing without a grammar.
    void restart_grammar();
    // Gives back the candidate list's memory (n_vocab candidates, workspace_bytes()) until the next
    // sample(): for a sequence that waits (the scheduler's preempted ones). Its state stays.
    void release_workspace();
    // The bytes of the candidate list one sample() fills: all a Sampler holds that grows with the
    // vocabulary (its penalty window holds penalty_last_n tokens).
    static uint64_t workspace_bytes(int32_t vocab_size) { return uint64_t(vocab_size) * sizeof(Candidate); }

    const SamplingParams& params() const { return params_; }
    // The seed in use: params().seed, or the one drawn when that asked for a random seed.
    uint64_t seed() const { return seed_; }
    int32_t vocab_size() const { return vocab_size_; }
    // The grammar's state (nullptr without a grammar), for tests and measurements.
    const GrammarMatcher* grammar() const { return grammar_.get(); }
    // What survived the chain in the last sample(), before the draw (for logging and tests).
    std::span<const Candidate> last_candidates() const { return candidates_.items; }

private:
    double next_uniform();
    // candidates_ = the chain applied to logits (masked: after the grammar's mask)
    void narrow(std::span<const float> logits, bool masked = false);
    TokenId commit(TokenId token);  // advances the grammar by the token

    SamplingParams params_;
    int32_t vocab_size_;
    uint64_t seed_;
    std::mt19937 rng_;
    CandidateList candidates_;
    // The penalty window as a ring of the last penalty_last_n accepted tokens, and its distinct
    // tokens with how often each occurs (parallel, in no order), kept up to date on accept() so
    // that sample() never recounts.
    std::vector<TokenId> window_;
    size_t window_next_ = 0;
    size_t window_filled_ = 0;
    std::vector<TokenId> window_distinct_;
    std::vector<int32_t> window_counts_;
    std::unique_ptr<GrammarMatcher> grammar_;
};

}  // namespace fitllm::sampling
