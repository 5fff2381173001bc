#include "ops/norm.h"

#include <cmath>

namespace fitllm::ops {

void rms_norm(const float* x, const float* weight, float eps, int64_t n_tok, int64_t n, float* y) {
    for (int64_t t = 0; t < n_tok; ++t) {
        const float* xr = x + t * n;
        float* yr = y + t * n;
        // Squares rounded to float and summed in double, as ggml does (its rows' bits, not only
        // their values).
        double sum_sq = 0.0;
        for (int64_t i = 0; i < n; ++i) sum_sq += static_cast<double>(xr[i] * xr[i]);
        const float scale = 1.0f / std::sqrt(static_cast<float>(sum_sq / static_cast<double>(n)) + eps);
        if (weight != nullptr) {
            for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale * weight[i];
        } else {
            for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale;
        }
    }
}

void layer_norm(const float* x, const float* weight, const float* bias, float eps, int64_t n_tok, int64_t n, float* y) {
    for (int64_t t = 0; t < n_tok; ++t) {
        const float* xr = x + t * n;
        float* yr = y + t * n;
        double sum = 0.0;
        for (int64_t i = 0; i < n; ++i) sum += xr[i];
        const double mean = sum / static_cast<double>(n);
        double sum_sq = 0.0;
        for (int64_t i = 0; i < n; ++i) sum_sq += (xr[i] - mean) * (xr[i] - mean);
        const float scale = 1.0f / std::sqrt(static_cast<float>(sum_sq / static_cast<double>(n)) + eps);
        const auto mean_f = static_cast<float>(mean);
        for (int64_t i = 0; i < n; ++i) {
            float v = (xr[i] - mean_f) * scale;
            if (weight != nullptr) v *= weight[i];
            if (bias != nullptr) v += bias[i];
            yr[i] = v;
        }
    }
}

}  // namespace fitllm::ops
