#include "sampling/candidates.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <limits>
#include <string>

#include "sampling/sampling_params.h"

namespace fitllm::sampling {
namespace {

float best_logit(const CandidateList& list) {
    if (list.sorted_prefix > 0) return list.items.front().logit;
    float best = -std::numeric_limits<float>::infinity();
    for (const Candidate& c : list.items) best = std::max(best, c.logit);
    return best;
}

}  // namespace

void CandidateList::assign(std::span<const float> logits) {
    items.resize(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) {
        // -inf is a legitimate "never"; NaN and +inf only come from a broken forward pass.
        if (std::isnan(logits[i]) || logits[i] == std::numeric_limits<float>::infinity())
            throw SamplingError("sampling: the logit of token " + std::to_string(i) + " is " +
                                (std::isnan(logits[i]) ? "NaN" : "+inf") + "; the model's output is broken");
        items[i] = Candidate{static_cast<TokenId>(i), logits[i], 0.0f};
    }
    sorted_prefix = 0;
    in_id_order = true;
}

void CandidateList::truncate(size_t n) {
    if (n >= items.size()) return;
    items.resize(n);
    in_id_order = false;
    sorted_prefix = std::min(sorted_prefix, n);
}

void CandidateList::sort_prefix(size_t n) {
    n = std::min(n, items.size());
    if (n <= sorted_prefix) return;
    in_id_order = false;
    // Everything past the sorted prefix ranks below it, so only the tail needs work. For a few
    // wanted items a heap (partial_sort) passes over the tail once with mostly one comparison
    // per item; for many, selecting (nth_element) and then sorting only those is cheaper.
    const auto tail = items.begin() + static_cast<std::ptrdiff_t>(sorted_prefix);
    const auto end_of_wanted = items.begin() + static_cast<std::ptrdiff_t>(n);
    const size_t wanted_from_tail = n - sorted_prefix;
    if (wanted_from_tail <= 1024 && wanted_from_tail * 64 <= items.size() - sorted_prefix) {
        std::partial_sort(tail, end_of_wanted, items.end(), ranks_before);
    } else {
        if (end_of_wanted != items.end()) std::nth_element(tail, end_of_wanted, items.end(), ranks_before);
        std::sort(tail, end_of_wanted, ranks_before);
    }
    sorted_prefix = n;
}

void compute_softmax(CandidateList& list) {
    if (list.items.empty()) return;
    const float max_logit = best_logit(list);
    if (max_logit == -std::numeric_limits<float>::infinity()) {
        // Every candidate is impossible; rather than dividing 0 by 0, treat them alike.
        const float uniform = 1.0f / static_cast<float>(list.size());
        for (Candidate& c : list.items) c.prob = uniform;
        return;
    }
    double sum = 0.0;
    for (Candidate& c : list.items) {
        c.prob = std::exp(c.logit - max_logit);
        sum += c.prob;
    }
    const float inverse = static_cast<float>(1.0 / sum);
    for (Candidate& c : list.items) c.prob *= inverse;
}

void apply_penalties(CandidateList& list, std::span<const TokenId> window_tokens, std::span<const int32_t> counts,
                     float repeat_penalty, float frequency_penalty, float presence_penalty) {
    if (repeat_penalty == 1.0f && frequency_penalty == 0.0f && presence_penalty == 0.0f) return;
    const auto penalize = [&](Candidate& c, int32_t count) {
        if (c.logit <= 0.0f) {
            c.logit *= repeat_penalty;
        } else {
            c.logit /= repeat_penalty;
        }
        c.logit -= static_cast<float>(count) * frequency_penalty + presence_penalty;
    };
    assert(window_tokens.size() == counts.size());
    for (size_t i = 0; i < window_tokens.size(); ++i) {
        const TokenId id = window_tokens[i];
        if (list.in_id_order) {
            assert(static_cast<size_t>(id) < list.items.size() && counts[i] > 0);
            penalize(list.items[static_cast<size_t>(id)], counts[i]);
        } else {
            const auto it =
                std::find_if(list.items.begin(), list.items.end(), [id](const Candidate& c) { return c.id == id; });
            if (it != list.items.end()) penalize(*it, counts[i]);
        }
    }
    list.sorted_prefix = 0;
}

void apply_top_k(CandidateList& list, int32_t k) {
    if (k <= 0 || static_cast<size_t>(k) >= list.size()) return;
    list.sort_prefix(static_cast<size_t>(k));
    list.truncate(static_cast<size_t>(k));
}

namespace {

// top_p when the short sorted prefix did not reach the mass: the cut lies deep in a flat tail
// (tens of thousands of candidates), where sorting would dominate the whole decode step.
// Buckets by logit find the bucket holding the cut in two linear passes; only that bucket is
// sorted. The survivors are the same best-first set a full sort would keep.
void cut_deep_top_p(CandidateList& list, float p, float cumulative) {
    constexpr size_t kBuckets = 1024;
    const auto tail = list.items.begin() + static_cast<std::ptrdiff_t>(list.sorted_prefix);
    const float highest = list.items[list.sorted_prefix - 1].logit;  // nothing in the tail ranks above
    float lowest = highest;
    for (auto it = tail; it != list.items.end(); ++it) {
        if (std::isfinite(it->logit)) lowest = std::min(lowest, it->logit);
    }
    const float scale = highest > lowest ? static_cast<float>(kBuckets - 1) / (highest - lowest) : 0.0f;
    const auto bucket_of = [&](const Candidate& c) -> size_t {
        if (!std::isfinite(c.logit)) return kBuckets - 1;  // -inf: probability 0, last
        return std::min(kBuckets - 1, static_cast<size_t>((highest - c.logit) * scale));
    };
    std::array<float, kBuckets> bucket_mass{};
    for (auto it = tail; it != list.items.end(); ++it) bucket_mass[bucket_of(*it)] += it->prob;

    float mass_before_cut = cumulative;
    size_t cut_bucket = 0;
    for (; cut_bucket < kBuckets; ++cut_bucket) {
        if (mass_before_cut + bucket_mass[cut_bucket] >= p) break;
        mass_before_cut += bucket_mass[cut_bucket];
    }
    if (cut_bucket == kBuckets) return;  // rounding kept the total under p: keep everything

    const auto above_cut =
        std::partition(tail, list.items.end(), [&](const Candidate& c) { return bucket_of(c) < cut_bucket; });
    const auto below_cut =
        std::partition(above_cut, list.items.end(), [&](const Candidate& c) { return bucket_of(c) == cut_bucket; });
    std::sort(above_cut, below_cut, ranks_before);
    // Sum what is certainly kept in list order, then walk the cut bucket best first.
    for (auto it = tail; it != above_cut; ++it) cumulative += it->prob;
    for (auto it = above_cut; it != below_cut; ++it) {
        cumulative += it->prob;
        if (cumulative >= p) {
            list.truncate(static_cast<size_t>(it - list.items.begin()) + 1);
            return;
        }
    }
    list.truncate(static_cast<size_t>(below_cut - list.items.begin()));
}

}  // namespace

void apply_top_p(CandidateList& list, float p) {
    if (p >= 1.0f || list.size() <= 1) return;
    compute_softmax(list);
    // The prefix that reaches p is usually short (tens of tokens): sort only a little first.
    // An earlier step (top_k) may have sorted more already; walk all of that before going deep.
    const size_t first_sorted = std::max(std::min<size_t>(list.size(), 256), list.sorted_prefix);
    list.sort_prefix(first_sorted);
    float cumulative = 0.0f;
    for (size_t i = 0; i < first_sorted; ++i) {
        cumulative += list.items[i].prob;
        if (cumulative >= p) {
            list.truncate(i + 1);
            return;
        }
    }
    if (first_sorted < list.size()) cut_deep_top_p(list, p, cumulative);
}

void apply_min_p(CandidateList& list, float p) {
    if (p <= 0.0f || list.size() <= 1) return;
    // prob_i >= p * prob_best  <=>  logit_i >= logit_best + log(p); no softmax needed.
    const float threshold = best_logit(list) + std::log(p);
    size_t kept = 0;
    size_t kept_in_sorted_prefix = 0;
    for (size_t i = 0; i < list.items.size(); ++i) {
        if (list.items[i].logit < threshold) continue;
        list.items[kept++] = list.items[i];
        if (i < list.sorted_prefix) ++kept_in_sorted_prefix;
    }
    // Removing only the worst keeps the surviving part of a sorted prefix sorted and best.
    assert(kept >= 1);
    if (kept < list.items.size()) list.in_id_order = false;
    list.items.resize(kept);
    list.sorted_prefix = kept_in_sorted_prefix;
}

void apply_typical(CandidateList& list, float p) {
    if (p >= 1.0f || list.size() <= 1) return;
    compute_softmax(list);
    double entropy = 0.0;
    for (const Candidate& c : list.items) {
        if (c.prob > 0.0f) entropy -= static_cast<double>(c.prob) * std::log(static_cast<double>(c.prob));
    }
    const auto distance_from_typical = [entropy](const Candidate& c) {
        return std::abs(-std::log(static_cast<double>(c.prob)) - entropy);
    };
    std::sort(list.items.begin(), list.items.end(), [&](const Candidate& a, const Candidate& b) {
        const double da = distance_from_typical(a);
        const double db = distance_from_typical(b);
        return da < db || (da == db && ranks_before(a, b));
    });
    list.sorted_prefix = 0;  // now in order of typicality, not of logit
    list.in_id_order = false;
    float cumulative = 0.0f;
    for (size_t i = 0; i < list.items.size(); ++i) {
        cumulative += list.items[i].prob;
        // Strictly greater, as llama.cpp's typical sampler (top_p uses >=).
        if (cumulative > p) {
            list.truncate(i + 1);
            return;
        }
    }
}

void apply_temperature(CandidateList& list, float temperature) {
    if (list.items.empty()) return;
    if (temperature <= 0.0f) {
        const auto best = std::min_element(list.items.begin(), list.items.end(), ranks_before);
        list.items.front() = *best;
        list.items.resize(1);
        list.sorted_prefix = 1;
        list.in_id_order = false;
        return;
    }
    if (temperature == 1.0f) return;
    for (Candidate& c : list.items) c.logit /= temperature;  // order unchanged: prefix stays sorted
}

TokenId draw_from(CandidateList& list, double uniform) {
    assert(!list.items.empty());
    if (list.size() == 1) return list.items.front().id;
    compute_softmax(list);
    double total = 0.0;
    for (const Candidate& c : list.items) total += c.prob;
    const double target = uniform * total;
    double cumulative = 0.0;
    for (const Candidate& c : list.items) {
        cumulative += c.prob;
        if (target < cumulative) return c.id;
    }
    // Rounding left the target at the very top of the mass: the last candidate that can occur.
    for (auto it = list.items.rbegin(); it != list.items.rend(); ++it) {
        if (it->prob > 0.0f) return it->id;
    }
    return list.items.back().id;
}

double draft_probability(CandidateList& list, TokenId draft) {
    if (list.items.empty()) return 0.0;
    compute_softmax(list);
    double total = 0.0;
    double p = 0.0;
    for (const Candidate& c : list.items) {
        total += c.prob;
        if (c.id == draft) p = c.prob;
    }
    return total > 0.0 ? p / total : 0.0;
}

TokenId draw_without(const CandidateList& list, TokenId excluded, double uniform) {
    double total = 0.0;
    for (const Candidate& c : list.items) {
        if (c.id != excluded) total += c.prob;
    }
    if (!(total > 0.0)) return excluded;
    const double target = uniform * total;
    double cumulative = 0.0;
    for (const Candidate& c : list.items) {
        if (c.id == excluded) continue;
        cumulative += c.prob;
        if (target < cumulative) return c.id;
    }
    for (auto it = list.items.rbegin(); it != list.items.rend(); ++it) {
        if (it->id != excluded && it->prob > 0.0f) return it->id;
    }
    return excluded;
}

}  // namespace fitllm::sampling
