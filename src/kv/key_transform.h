#pragma once
// How the KV cache stores quantized K heads so that 4-bit keys cost little (issue 5). What a key's
// quantization error costs is the error it puts in the scores, q . e, so the cache shapes each K
// head for the queries that will read it. Two kinds, calibrated once per layer and kv head:
//
// Query-aware (4- and 5-bit K in caches on the host; kv/key_calibration.cpp fits it from the keys
// and queries of the first rows the layer stores, see KvCache::calibrate_keys):
//   stored = Q_U(H T (k - c)), and attention dots the stored head with H T^-T q, so scores are
//   q . (k - c) up to the rounding (the softmax cancels the q . c every score of a query shares).
//   - c: the mean key. Keys share a large common part (on Gemma 3 270M 60-90% of a key's energy).
//   - T (d x d, upper triangular): spends the 4 bits where the queries look. With Ck and Cq the
//     covariance of the centred keys and the second moment of the queries, the best linear map for
//     uniform rounding has T^T T = Ck^-1/2 (Ck^1/2 Cq Ck^1/2)^1/2 Ck^-1/2; with the error-feedback
//     rounding below the exponent 1/4 does better (measured). RoPE turns keys and queries with their
//     position, so Ck and Cq are first taken in RoPE's unrotated frame and then averaged over the
//     rotations of every position the cache will hold (in closed form per pair of frequencies):
//     covariances taken straight from the first rows hold only for those rows' positions.
//   - H: the normalized Walsh-Hadamard transform (kv/hadamard.h), which spreads what is left of
//     the outliers over the head (when d is a power of two).
//   - Q_U: the type's blocks, rounded one value at a time with the error of each pushed onto the
//     values after it (GPTQ's update, with the fixed metric of the scores' error in the stored
//     frame, M = H T^-T Cq T^-1 H; U is the upper Cholesky factor of (M + damping)^-1), each block's
//     scale picked among a few for the least squared error (quant/block_grid.h).
//   On Gemma 3 270M this takes the KL divergence that q4_0 keys add to the next-token distribution
//   from 0.026 (the diagonal kind below) to 0.005; README "KV cache".
//
// Diagonal (q8_0 K, whose error is at the cache's noise floor with it; devices whose kernels take
// per-dimension factors, CUDA): stored = Q(H (s * (k - c)))
//   and attention multiplies q by 1 / s before H. c as above (the mean of the first rows), and
//   s_i = (r / r_i)^(1/2) where r_i is the RMS of the centred keys over the 4 dimensions
//   {2j, 2j+1, 2j+d/2, 2j+1+d/2} holding i (both RoPE layouts' pairs get one scale) and r their
//   mean: it flattens dimensions whose learned norm weights are large, halfway to whitening.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kv/key_transform_kernels.h"
#include "quant/ggml_type.h"

namespace fitllm::kv {

// How RoPE turned the rows that calibrate a transform: pair j rotates dims (first[j], second[j]) of
// each head by the angle theta[j] * position, as ops::rope does (x_f' = x_f cos - x_s sin,
// x_s' = x_f sin + x_s cos); dims in no pair are not rotated. Empty: no RoPE.
struct RopeFrame {
    std::vector<int> first, second;
    std::vector<double> theta;
};

// What calibrates a layer's K transform: n_rows tokens at positions pos, their K after RoPE
// ([n_rows, n_head_kv * d]) and Q after RoPE ([n_rows, n_head_q * d]; query head h reads kv head
// h / (n_head_q / n_head_kv)). q == nullptr: K alone (the diagonal kind only).
struct KeySample {
    const float* k = nullptr;
    const float* q = nullptr;
    const int32_t* pos = nullptr;
    int64_t n_rows = 0;
    int n_head_q = 0;
    RopeFrame rope;
};

class KeyTransform {
public:
    enum class Kind { Identity, Diagonal, QueryAware };

    // The query-aware kind from `sample` (kv/key_calibration.cpp), for keys at positions
    // 0 .. n_positions - 1. Falls back to the diagonal kind when the fit fails (a covariance that
    // is not positive definite even after the shrinkage, non-finite input).
    void calibrate(const KeySample& sample, int n_head_kv, int d, int n_positions);
    // The diagonal kind from n_rows rows of K ([n_rows, n_head_kv * d], d a multiple of 4).
    void calibrate_diagonal(const float* k, int64_t n_rows, int n_head_kv, int d);

    Kind kind() const { return kind_; }
    bool active() const { return kind_ != Kind::Identity; }
    bool query_aware() const { return kind_ == Kind::QueryAware; }

    // Query-aware: writes kv head h of n <= kRows keys (heads[k]: d floats) as rows of `type` (a
    // quant::BlockGrid type) at dst[k]; scratch holds kScratchRows * d floats. Allocates nothing.
    // Rows go through together so that T and U are read once for all of them.
    static constexpr int kRows = key_kernels::kRows;
    static constexpr int kScratchRows = 2 * kRows;
    void encode(const float* const* heads, int n, int h, quant::GgmlType type, std::byte* const* dst,
                float* scratch) const;
    void encode(const float* head, int h, quant::GgmlType type, void* dst, float* scratch) const;  // one key
    // Query-aware: the key back (d floats) from its row at src.
    void decode(const void* src, int h, quant::GgmlType type, float* head) const;
    // Query-aware: what attention dots with the stored heads of kv head h instead of q: H T^-T q,
    // for n contiguous rows of d (q and out do not overlap).
    void shape_queries(const float* q, int n, int h, float* out) const;
    void shape_query(const float* q, int h, float* out) const;

    // Diagonal: out = s * (head - c) for kv head h; undo: head = head / s + c in place.
    void apply(const float* head, int h, int d, float* out) const;
    void undo(float* head, int h, int d) const;
    // [n_head_kv * d]: the centre c (both kinds); the diagonal kind's s and 1 / s. nullptr when
    // not of that kind.
    const float* center() const { return active() ? center_.data() : nullptr; }
    const float* scale() const { return kind_ == Kind::Diagonal ? scale_.data() : nullptr; }
    const float* q_scale() const { return kind_ == Kind::Diagonal ? q_scale_.data() : nullptr; }

    // The kv heads and head size it was fitted for (0 for the identity).
    int n_head_kv() const;
    int head_dim() const { return d_; }

    // Its numbers, for a file that keeps the transform across runs (engine/prompt_cache.h): the
    // diagonal kind's c, s and 1 / s; the query-aware kind's c, T^T, T^-1 and U of each kv head in
    // turn (the triangles' stored floats, PaddedTriangle::packed()); none for the identity.
    std::vector<std::span<const float>> numbers() const;
    // Makes this a transform of `kind` for n_head_kv heads of d, all zeros, and gives where its
    // numbers() lie, to be filled; then finish_numbers(). Filled with another transform's numbers(),
    // it is that transform, bit for bit. Throws std::invalid_argument for a shape the kind cannot
    // have (d not a multiple of 4, or of 8 for the query-aware kind; n_head_kv < 1).
    std::vector<std::span<float>> prepare_numbers(Kind kind, int n_head_kv, int d);
    void finish_numbers();

    // The bytes a query-aware transform of these heads holds (c, T twice and U in packed triangles).
    static size_t bytes_for(int n_head_kv, int d);

    // One kv head's query-aware transform (kv/key_calibration.cpp builds them): c, and T^T (keys
    // are stored from k^T T^T), T^-1 (queries are shaped by q^T T^-1) and U, as the kernels of
    // kv/key_transform_kernels.h take them.
    struct Head {
        std::vector<float> center;
        PaddedTriangle t_transposed, t_inverse, u;
    };

private:
    Kind kind_ = Kind::Identity;
    int d_ = 0;
    bool rotate_ = false;                          // query-aware: H applied (d a power of two)
    std::vector<float> center_, scale_, q_scale_;  // [n_head_kv * d] each (scale: diagonal only)
    std::vector<Head> heads_;                      // query-aware
};

// kv/key_calibration.cpp: kv head h's query-aware transform from the sample, or nullopt when the fit
// fails. `rotate`: the stored frame has H in it.
std::optional<KeyTransform::Head> fit_query_aware_head(const KeySample& sample, int h, int n_head_kv, int d,
                                                       int n_positions, bool rotate);

// The bytes of working memory fit_query_aware_head uses at most (for the KV cache's charge).
size_t query_aware_fit_bytes(int d);

// The mean over positions p = 0 .. n_positions - 1 of R(p) m (m: d values), and of R(p) S R(p)^T
// (S: d x d, row-major), R(p) rope's rotation at p, in closed form: how the fit takes the keys'
// and queries' moments from RoPE's unrotated frame to every position the cache will hold.
std::vector<double> rotation_mean(const std::vector<double>& m, const RopeFrame& rope, int n_positions);
std::vector<double> rotation_mean_moment(const std::vector<double>& s, int d, const RopeFrame& rope, int n_positions);

}  // namespace fitllm::kv
