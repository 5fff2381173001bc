#pragma once
// The candidate list a sampling chain narrows down, and the steps that narrow it. Each step
// follows llama.cpp's sampler of the same name (src/llama-sampling.cpp) so that the same
// parameters keep the same tokens; where fitllm differs it says so.
//
// Speed matters: a vocabulary can have 262144 entries and sampling runs once per generated
// token. So no step sorts the whole list unless it must: the list tracks how long a prefix is
// already sorted (best first) and steps extend that prefix only as far as they need.
#include <cstdint>
#include <span>
#include <vector>

namespace fitllm::sampling {

using TokenId = int32_t;

struct Candidate {
    TokenId id;
    float logit;
    float prob;  // valid only right after compute_softmax()
};

// Best first: higher logit, and on equal logits the lower id, so that every order (and greedy's
// choice) is deterministic.
inline bool ranks_before(const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

struct CandidateList {
    std::vector<Candidate> items;  // capacity kept across calls; resize() never reallocates once warm
    size_t sorted_prefix = 0;      // items[0, sorted_prefix) are the best ones, in ranks_before order
    bool in_id_order = false;      // items[i].id == i for every i, as assign() leaves them

    // Refills from a full logit vector (ids 0..n-1). Throws SamplingError naming the first
    // NaN or +inf logit (-inf is allowed: that token can never be drawn).
    void assign(std::span<const float> logits);
    // Keeps the first n items.
    void truncate(size_t n);
    // Ensures the best n items are at the front, sorted; sorts only what is not sorted yet.
    void sort_prefix(size_t n);
    size_t size() const { return items.size(); }
};

// Sets prob to softmax(logit) over the list (the logits stay as they are).
void compute_softmax(CandidateList& list);

// window_tokens: the distinct ids in the penalty window; counts[i]: how often window_tokens[i]
// occurs there (> 0). Positive logits are divided by repeat_penalty and negative ones multiplied
// (so both move toward "less likely"); then count * frequency + (count > 0) * presence is
// subtracted. Only the window's tokens are visited: through their ids while the list is in id
// order, else by finding each in the list.
void apply_penalties(CandidateList& list, std::span<const TokenId> window_tokens, std::span<const int32_t> counts,
                     float repeat_penalty, float frequency_penalty, float presence_penalty);

// Keeps the k best (k <= 0 or k >= size: no-op).
void apply_top_k(CandidateList& list, int32_t k);

// Keeps the smallest best-first prefix whose probability reaches p (p >= 1: no-op).
void apply_top_p(CandidateList& list, float p);

// Keeps candidates whose probability is at least p times the best one's (p <= 0: no-op).
void apply_min_p(CandidateList& list, float p);

// Locally typical sampling (Meister et al. 2022): keeps the candidates whose surprisal is
// closest to the entropy until their probability exceeds p (p >= 1: no-op). Sorts fully: it is
// off by default and best placed after top_k.
void apply_typical(CandidateList& list, float p);

// Divides logits by the temperature; temperature <= 0 keeps only the best candidate (greedy).
void apply_temperature(CandidateList& list, float temperature);

// Draws one candidate from softmax(logits), with uniform in [0, 1) as the random number.
TokenId draw_from(CandidateList& list, double uniform);

// Speculative decoding with a draft that proposes one token for sure (a point mass q, as prompt
// lookup does) checks it against the target p = softmax(logits) of the list: accept it with
// probability min(1, p(d) / q(d)) = p(d), else draw from the residual max(0, p - q) renormalised,
// which is p with d taken out. Then the token has distribution p whatever the draft was:
// P(d) = p(d), and P(x) = (1 - p(d)) * p(x) / (1 - p(d)) for x != d.
// draft_probability: p(d) (0 when d is not in the list). Computes the softmax.
double draft_probability(CandidateList& list, TokenId draft);
// Draws from p with `excluded` taken out, with uniform in [0, 1); the list's probabilities must
// be computed (draft_probability did). Returns `excluded` only when nothing else can occur.
TokenId draw_without(const CandidateList& list, TokenId excluded, double uniform);

}  // namespace fitllm::sampling
