#include "kv/key_transform.h"

#include <algorithm>
#include <cmath>

namespace fitllm::kv {

void KeyTransform::calibrate(const float* k, int64_t n_rows, int n_head, int d) {
    if (calibrated_) return;
    calibrated_ = true;
    if (n_rows < kMinRows || d % 4 != 0) return;
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
    if (!active()) {
        std::copy(head, head + d, out);
        return;
    }
    const float* c = center_.data() + static_cast<size_t>(h) * static_cast<size_t>(d);
    const float* s = scale_.data() + static_cast<size_t>(h) * static_cast<size_t>(d);
    for (int i = 0; i < d; ++i) out[i] = (head[i] - c[i]) * s[i];
}

void KeyTransform::undo(float* head, int h, int d) const {
    if (!active()) return;
    const float* c = center_.data() + static_cast<size_t>(h) * static_cast<size_t>(d);
    const float* qs = q_scale_.data() + static_cast<size_t>(h) * static_cast<size_t>(d);
    for (int i = 0; i < d; ++i) head[i] = head[i] * qs[i] + c[i];
}

}  // namespace fitllm::kv
