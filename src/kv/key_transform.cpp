#include "kv/key_transform.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "kv/hadamard.h"
#include "kv/key_transform_kernels.h"
#include "quant/block_grid.h"
#include "quant/dequantize.h"
#include "quant/ggml_type.h"

namespace fitllm::kv {

void KeyTransform::calibrate(const KeySample& sample, int n_head_kv, int d, int n_positions) {
    std::vector<Head> heads;
    const bool rotate = is_power_of_two(d);
    for (int h = 0; h < n_head_kv; ++h) {
        std::optional<Head> head = fit_query_aware_head(sample, h, n_head_kv, d, n_positions, rotate);
        if (!head) return calibrate_diagonal(sample.k, sample.n_rows, n_head_kv, d);
        heads.push_back(std::move(*head));
    }
    kind_ = Kind::QueryAware;
    d_ = d;
    rotate_ = rotate;
    heads_ = std::move(heads);
    center_.clear();
    for (const Head& head : heads_) center_.insert(center_.end(), head.center.begin(), head.center.end());
    scale_.clear();
    q_scale_.clear();
}

void KeyTransform::calibrate_diagonal(const float* k, int64_t n_rows, int n_head, int d) {
    kind_ = Kind::Identity;
    heads_.clear();
    if (n_rows < 1 || d % 4 != 0) return;
    kind_ = Kind::Diagonal;
    d_ = d;
    const auto n = static_cast<size_t>(n_head) * static_cast<size_t>(d);
    center_.assign(n, 0.0f);
    scale_.assign(n, 1.0f);
    q_scale_.assign(n, 1.0f);
    const int64_t row = int64_t{n_head} * d;
    std::vector<double> mean(n, 0.0), var(n, 0.0);
    for (int64_t r = 0; r < n_rows; ++r) {
        for (size_t i = 0; i < n; ++i) mean[i] += k[r * row + static_cast<int64_t>(i)];
    }
    for (double& m : mean) m /= static_cast<double>(n_rows);
    for (int64_t r = 0; r < n_rows; ++r) {
        for (size_t i = 0; i < n; ++i) {
            const double x = k[r * row + static_cast<int64_t>(i)] - mean[i];
            var[i] += x * x;
        }
    }
    const int half = d / 2;
    for (int h = 0; h < n_head; ++h) {
        const size_t base = static_cast<size_t>(h) * static_cast<size_t>(d);
        // RMS of each group of 4 dimensions (j = 0 .. d/4 - 1: dims 2j, 2j+1, 2j+half, 2j+1+half).
        std::vector<double> group(static_cast<size_t>(d / 4));
        double total = 0.0;
        for (int j = 0; j < d / 4; ++j) {
            const int dims[4] = {2 * j, 2 * j + 1, 2 * j + half, 2 * j + 1 + half};
            double sum = 0.0;
            for (int i : dims) sum += var[base + static_cast<size_t>(i)];
            group[static_cast<size_t>(j)] = std::sqrt(sum / (4.0 * static_cast<double>(n_rows)));
            total += group[static_cast<size_t>(j)];
        }
        const double mean_rms = total / (d / 4);
        for (int j = 0; j < d / 4; ++j) {
            // Nearly constant dimensions would get huge scales: floor them at 1% of the mean.
            const double r = std::max(group[static_cast<size_t>(j)], 0.01 * mean_rms);
            const double s = mean_rms > 0.0 ? std::sqrt(mean_rms / r) : 1.0;
            const int dims[4] = {2 * j, 2 * j + 1, 2 * j + half, 2 * j + 1 + half};
            for (int i : dims) {
                scale_[base + static_cast<size_t>(i)] = static_cast<float>(s);
                q_scale_[base + static_cast<size_t>(i)] = static_cast<float>(1.0 / s);
            }
        }
        for (int i = 0; i < d; ++i) center_[base + static_cast<size_t>(i)] = static_cast<float>(mean[base + i]);
    }
}

void KeyTransform::apply(const float* head, int h, int d, float* out) const {
    if (kind_ != Kind::Diagonal) {
        std::copy(head, head + d, out);
        return;
    }
    const float* c = center_.data() + static_cast<size_t>(h) * static_cast<size_t>(d);
    const float* s = scale_.data() + static_cast<size_t>(h) * static_cast<size_t>(d);
    for (int i = 0; i < d; ++i) out[i] = (head[i] - c[i]) * s[i];
}

void KeyTransform::undo(float* head, int h, int d) const {
    if (kind_ != Kind::Diagonal) return;
    const float* c = center_.data() + static_cast<size_t>(h) * static_cast<size_t>(d);
    const float* qs = q_scale_.data() + static_cast<size_t>(h) * static_cast<size_t>(d);
    for (int i = 0; i < d; ++i) head[i] = head[i] * qs[i] + c[i];
}

void KeyTransform::encode(const float* const* heads, int n, int h, quant::GgmlType type, std::byte* const* dst,
                          float* scratch) const {
    const Head& t = heads_[static_cast<size_t>(h)];
    float* r = scratch;                                    // the centred keys
    float* w = scratch + static_cast<size_t>(kRows) * d_;  // the stored values, rounded one by one
    for (int k = 0; k < n; ++k) {
        for (int i = 0; i < d_; ++i) r[k * d_ + i] = heads[k][i] - t.center[static_cast<size_t>(i)];
    }
    key_kernels::rows_times(r, n, t.t_transposed, w);  // w = T r, row by row
    if (rotate_) hadamard_transform_rows(w, n, d_);
    std::array<float, kRows * quant::BlockGrid::kElements> error{};
    key_kernels::round_with_feedback(w, n, t.u, type, dst, error.data());
}

void KeyTransform::encode(const float* head, int h, quant::GgmlType type, void* dst, float* scratch) const {
    std::byte* out = static_cast<std::byte*>(dst);
    encode(&head, 1, h, type, &out, scratch);
}

void KeyTransform::decode(const void* src, int h, quant::GgmlType type, float* head) const {
    const Head& t = heads_[static_cast<size_t>(h)];
    quant::dequantize_row(type, src, head, d_);
    if (rotate_) hadamard_transform(head, d_);  // its own inverse
    for (int j = 0; j < d_; ++j) {              // head = T^-1 head, in place: value j reads values j and after
        const float* row = t.t_inverse.row(j);
        float sum = 0.0f;
        for (int i = j; i < d_; ++i) sum += row[i] * head[i];
        head[j] = sum + t.center[static_cast<size_t>(j)];
    }
}

void KeyTransform::shape_queries(const float* q, int n, int h, float* out) const {
    const Head& t = heads_[static_cast<size_t>(h)];
    for (int k0 = 0; k0 < n; k0 += kRows) {
        const int m = std::min(kRows, n - k0);
        // Rows: (T^-T q)^T = q^T T^-1.
        key_kernels::rows_times(q + static_cast<size_t>(k0) * d_, m, t.t_inverse, out + static_cast<size_t>(k0) * d_);
        if (rotate_) hadamard_transform_rows(out + static_cast<size_t>(k0) * d_, m, d_);
    }
}

void KeyTransform::shape_query(const float* q, int h, float* out) const {
    shape_queries(q, 1, h, out);
}

int KeyTransform::n_head_kv() const {
    if (kind_ == Kind::QueryAware) return static_cast<int>(heads_.size());
    return kind_ == Kind::Diagonal && d_ > 0 ? static_cast<int>(center_.size()) / d_ : 0;
}

std::vector<std::span<const float>> KeyTransform::numbers() const {
    std::vector<std::span<const float>> out;
    if (kind_ == Kind::Diagonal) {
        out = {center_, scale_, q_scale_};
    } else if (kind_ == Kind::QueryAware) {
        for (const Head& h : heads_) {
            out.insert(out.end(), {h.center, h.t_transposed.packed(), h.t_inverse.packed(), h.u.packed()});
        }
    }
    return out;
}

std::vector<std::span<float>> KeyTransform::prepare_numbers(Kind kind, int n_head_kv, int d) {
    *this = KeyTransform();
    if (kind == Kind::Identity) return {};
    if (n_head_kv < 1 || d < 4 || d % (kind == Kind::QueryAware ? 8 : 4) != 0) {
        throw std::invalid_argument("K transform: " + std::to_string(n_head_kv) + " heads of " + std::to_string(d) +
                                    " values cannot have this kind");
    }
    kind_ = kind;
    d_ = d;
    const auto n = static_cast<size_t>(n_head_kv) * static_cast<size_t>(d);
    center_.assign(n, 0.0f);
    std::vector<std::span<float>> out;
    if (kind == Kind::Diagonal) {
        scale_.assign(n, 0.0f);
        q_scale_.assign(n, 0.0f);
        return {center_, scale_, q_scale_};
    }
    rotate_ = is_power_of_two(d);  // as calibrate() decides
    heads_.resize(static_cast<size_t>(n_head_kv));
    for (Head& h : heads_) {
        h.center.assign(static_cast<size_t>(d), 0.0f);
        h.t_transposed = PaddedTriangle(d, /*upper=*/false);
        h.t_inverse = PaddedTriangle(d, /*upper=*/true);
        h.u = PaddedTriangle(d, /*upper=*/true);
        out.insert(out.end(), {h.center, h.t_transposed.packed(), h.t_inverse.packed(), h.u.packed()});
    }
    return out;
}

void KeyTransform::finish_numbers() {
    if (kind_ != Kind::QueryAware) return;
    center_.clear();
    for (Head& h : heads_) {
        h.t_transposed.zero_padding();
        h.t_inverse.zero_padding();
        h.u.zero_padding();
        center_.insert(center_.end(), h.center.begin(), h.center.end());
    }
}

size_t KeyTransform::bytes_for(int n_head_kv, int d) {
    const auto n = static_cast<size_t>(d);
    // c, then T^T, T^-1 and U as padded triangles (with their row offsets).
    return static_cast<size_t>(n_head_kv) *
           (n * sizeof(float) + 3 * (PaddedTriangle::floats_for(d) * sizeof(float) + n * sizeof(ptrdiff_t)));
}

}  // namespace fitllm::kv
