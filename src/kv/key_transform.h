#pragma once
// How the KV cache shapes quantized K heads before their Hadamard rotation, so that 4-bit keys
// cost little (issue 5). Per layer and kv head, calibrated once on the first batch of keys the
// layer stores (at least kMinRows rows; a smaller first batch leaves the layer untransformed):
//
//  - centre: the mean key c is subtracted. Keys share a large common part (on Gemma 3 270M the
//    mean is 60-90% of a key's RMS) that would otherwise set every block's scale. Nothing adds it
//    back in attention: it moves all of a query's scores by the same q . c, which the softmax
//    cancels (with logit soft-capping attention_kv adds q . c back before capping).
//  - scale: dimension i is multiplied by s_i = (r / r_i)^(1/2), where r_i is the RMS of the
//    centred keys over the 4 dimensions {2j, 2j+1, 2j+d/2, 2j+1+d/2} holding i (so both RoPE
//    layouts' pairs, which RoPE mixes by position, get one scale) and r their mean. It flattens
//    dimensions whose learned norm weights are large, halfway to whitening; the query is
//    multiplied by 1/s (q_scale) so that q . k stays the same.
//
// Stored heads hold H (s * (k - c)) (H: the rotation), quantized; reading K back undoes it.
#include <cstdint>
#include <vector>

namespace fitllm::kv {

class KeyTransform {
public:
    static constexpr int64_t kMinRows = 16;

    // Whether calibrate() has run (with or without enough rows); then the transform is fixed.
    bool calibrated() const { return calibrated_; }
    // False for the identity (not calibrated, or too few rows).
    bool active() const { return !center_.empty(); }

    // From k: n_rows rows of n_head heads of d values (d a multiple of 4). Runs once.
    void calibrate(const float* k, int64_t n_rows, int n_head, int d);

    // out = s * (head - c) for kv head h (d values); a copy when not active.
    void apply(const float* head, int h, int d, float* out) const;
    // head = head / s + c in place; nothing when not active.
    void undo(float* head, int h, int d) const;

    // [n_head * d]: what attention multiplies q by (1 / s), or nullptr when not active.
    const float* q_scale() const { return active() ? q_scale_.data() : nullptr; }
    // [n_head * d]: the centre c, or nullptr when not active.
    const float* center() const { return active() ? center_.data() : nullptr; }
    // [n_head * d]: the scale s apply() multiplies by, or nullptr when not active.
    const float* scale() const { return active() ? scale_.data() : nullptr; }

private:
    bool calibrated_ = false;
    std::vector<float> center_, scale_, q_scale_;  // [n_head * d] each; empty: identity
};

}  // namespace fitllm::kv
