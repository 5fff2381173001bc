#include "quant/quantize_fit.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace fitllm::quant::fit {

float symmetric(int n, int nmax, const float* x, int8_t* L) {
    float max = 0.0f, amax = 0.0f;
    for (int i = 0; i < n; ++i) {
        if (std::fabs(x[i]) > amax) {
            amax = std::fabs(x[i]);
            max = x[i];
        }
    }
    if (amax < kGroupEps) {
        std::fill(L, L + n, int8_t{0});
        return 0.0f;
    }
    auto level = [nmax](float v) { return std::max(-nmax, std::min(nmax - 1, nearest(v))); };
    float iscale = -nmax / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
        const int l = level(iscale * x[i]);
        L[i] = static_cast<int8_t>(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int step = -9; step <= 9; ++step) {
        if (step == 0) continue;
        iscale = -(nmax + 0.1f * step) / max;
        sumlx = suml2 = 0.0f;
        for (int i = 0; i < n; ++i) {
            const int l = level(iscale * x[i]);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(nmax + level(iscale * x[i]));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

float q3(int n, int nmax, const float* x, int8_t* L) {
    float max = 0.0f, amax = 0.0f;
    for (int i = 0; i < n; ++i) {
        if (std::fabs(x[i]) > amax) {
            amax = std::fabs(x[i]);
            max = x[i];
        }
    }
    if (amax < kGroupEps) {
        std::fill(L, L + n, int8_t{0});
        return 0.0f;
    }
    const float iscale = -nmax / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
        const int l = std::max(-nmax, std::min(nmax - 1, nearest(iscale * x[i])));
        L[i] = static_cast<int8_t>(l);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int round = 0; round < 5; ++round) {
        int changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx <= 0.0f) continue;
            float sl2 = suml2 - w * L[i] * L[i];
            const int l = std::max(-nmax, std::min(nmax - 1, nearest(x[i] * sl2 / slx)));
            if (l == L[i]) continue;
            slx += w * x[i] * l;
            sl2 += w * l * l;
            if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = static_cast<int8_t>(l);
                sumlx = slx;
                suml2 = sl2;
                ++changed;
            }
        }
        if (changed == 0) break;
    }
    for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

float affine_search(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* neg_min, float rmin,
                    float rdelta, int nstep, bool use_abs) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if (min > 0.0f) min = 0.0f;
    if (max == min) {
        std::fill(L, L + n, uint8_t{0});
        *neg_min = -min;
        return 0.0f;
    }
    auto error_of = [use_abs](float e) { return use_abs ? std::fabs(e) : e * e; };
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0.0f;
    for (int i = 0; i < n; ++i) {
        L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, nearest(iscale * (x[i] - min)))));
        best_error += weights[i] * error_of(scale * L[i] + min - x[i]);
    }
    uint8_t trial[32];
    for (int step = 0; step <= nstep; ++step) {
        iscale = (rmin + rdelta * step + nmax) / (max - min);
        float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
        for (int i = 0; i < n; ++i) {
            const int l = std::max(0, std::min(nmax, nearest(iscale * (x[i] - min))));
            trial[i] = static_cast<uint8_t>(l);
            const float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (!(D > 0.0f)) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0.0f) {
            this_min = 0.0f;
            this_scale = sum_xl / sum_l2;
        }
        float error = 0.0f;
        for (int i = 0; i < n; ++i) error += weights[i] * error_of(this_scale * trial[i] + this_min - x[i]);
        if (error < best_error) {
            std::copy(trial, trial + n, L);
            best_error = error;
            scale = this_scale;
            min = this_min;
        }
    }
    *neg_min = -min;
    return scale;
}

float symmetric_weighted(int n, int nmax, const float* x, int8_t* L, const float* qw) {
    float max = 0.0f, amax = 0.0f;
    for (int i = 0; i < n; ++i) {
        if (std::fabs(x[i]) > amax) {
            amax = std::fabs(x[i]);
            max = x[i];
        }
    }
    if (amax < kGroupEps) {
        std::fill(L, L + n, int8_t{0});
        return 0.0f;
    }
    auto level = [nmax](float v) { return std::max(-nmax, std::min(nmax - 1, nearest(v))); };
    auto weight = [qw, x](int i) { return qw ? qw[i] : x[i] * x[i]; };
    float iscale = -nmax / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
        const int l = level(iscale * x[i]);
        L[i] = static_cast<int8_t>(l + nmax);
        const float w = weight(i);
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int step = -9; step <= 9; ++step) {
        if (step == 0) continue;
        iscale = -(nmax + 0.1f * step) / max;
        sumlx = suml2 = 0.0f;
        for (int i = 0; i < n; ++i) {
            const int l = level(iscale * x[i]);
            const float w = weight(i);
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(nmax + level(iscale * x[i]));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

float affine_weighted(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* neg_min, float rmin,
                      float rdelta, int nstep) {
    auto weight = [weights, x](int i) { return weights ? weights[i] : x[i] * x[i]; };
    float min = x[0], max = x[0];
    float sum_w = weight(0);
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weight(i);
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0.0f) min = 0.0f;
    if (max <= min) {
        std::fill(L, L + n, uint8_t{0});
        *neg_min = -min;
        return 0.0f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0.0f;
    for (int i = 0; i < n; ++i) {
        L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, nearest(iscale * (x[i] - min)))));
        float diff = scale * L[i] + min - x[i];
        diff = diff * diff;
        best_error += weight(i) * diff;
    }
    uint8_t trial[32];
    for (int step = 0; step <= nstep; ++step) {
        iscale = (rmin + rdelta * step + nmax) / (max - min);
        float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
        for (int i = 0; i < n; ++i) {
            const int l = std::max(0, std::min(nmax, nearest(iscale * (x[i] - min))));
            trial[i] = static_cast<uint8_t>(l);
            const float w = weight(i);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (!(D > 0.0f)) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0.0f) {
            this_min = 0.0f;
            this_scale = sum_xl / sum_l2;
        }
        float error = 0.0f;
        for (int i = 0; i < n; ++i) {
            float diff = this_scale * trial[i] + this_min - x[i];
            diff = diff * diff;
            error += weight(i) * diff;
        }
        if (error < best_error) {
            std::copy(trial, trial + n, L);
            best_error = error;
            scale = this_scale;
            min = this_min;
        }
    }
    *neg_min = -min;
    return scale;
}

float positive(int n, int nmax, const float* x, uint8_t* L, const float* w) {
    float max = 0.0f;
    for (int i = 0; i < n; ++i) max = std::max(max, x[i]);
    if (max < kGroupEps) {
        std::fill(L, L + n, uint8_t{0});
        return 0.0f;
    }
    float iscale = nmax / max;
    for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(nearest(iscale * x[i]));
    const float scale = 1 / iscale;
    float best_mse = 0.0f;
    for (int i = 0; i < n; ++i) {
        const float diff = x[i] - scale * L[i];
        best_mse += w[i] * diff * diff;
    }
    for (int step = -4; step <= 4; ++step) {
        if (step == 0) continue;
        const float iscale_is = (0.1f * step + nmax) / max;
        const float scale_is = 1 / iscale_is;
        float mse = 0.0f;
        for (int i = 0; i < n; ++i) {
            const int l = std::min(nmax, nearest(iscale_is * x[i]));
            const float diff = x[i] - scale_is * l;
            mse += w[i] * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
        const int l = std::min(nmax, nearest(iscale * x[i]));
        L[i] = static_cast<uint8_t>(l);
        sumlx += w[i] * x[i] * l;
        suml2 += w[i] * l * l;
    }
    for (int round = 0; round < 5; ++round) {
        int changed = 0;
        for (int i = 0; i < n; ++i) {
            float slx = sumlx - w[i] * x[i] * L[i];
            float sl2 = suml2 - w[i] * L[i] * L[i];
            if (!(slx > 0.0f && sl2 > 0.0f)) continue;
            const int l = std::min(nmax, nearest(x[i] * sl2 / slx));
            if (l == L[i]) continue;
            slx += w[i] * x[i] * l;
            sl2 += w[i] * l * l;
            if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = static_cast<uint8_t>(l);
                sumlx = slx;
                suml2 = sl2;
                ++changed;
            }
        }
        if (changed == 0) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

float mean_square(const float* x, int64_t n, float factor) {
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) sum += x[j] * x[j];
    return factor * sum / n;
}

void importance(const float* qw, const float* x, int n, float sigma2, float* w) {
    for (int l = 0; l < n; ++l) w[l] = qw[l] * std::sqrt(sigma2 + x[l] * x[l]);
}

}  // namespace fitllm::quant::fit
