#include "quant/quantize_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "quant/blocks.h"
#include "quant/quantize.h"

namespace fitllm::quant {
namespace {

template <typename T>
T* as(void* p) {
    return static_cast<T*>(p);
}

// Symmetric blocks of 32 (Q4_0 / Q5_0): d maps the value of largest magnitude to -2^(bits-1);
// q = trunc(x / d + 2^(bits-1) + 0.5) with the unrounded d, at most 2^bits - 1.
template <typename Block, int kBits>
void ref_symmetric32(const float* x, Block* y, int64_t nb) {
    constexpr int kHalf = 1 << (kBits - 1), kTop = (1 << kBits) - 1;
    for (int64_t i = 0; i < nb; ++i, x += 32) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; ++j) {
            if (amax < std::fabs(x[j])) {
                amax = std::fabs(x[j]);
                max = x[j];
            }
        }
        const float d = max / -static_cast<float>(kHalf);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            const int q0 = std::min(kTop, static_cast<int>(static_cast<int8_t>(x[j] * id + (kHalf + 0.5f))));
            const int q1 = std::min(kTop, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + (kHalf + 0.5f))));
            y[i].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
            qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + 16);
        }
        if constexpr (kBits == 5) std::memcpy(y[i].qh, &qh, 4);
    }
}

// Affine blocks of 32 (Q4_1 / Q5_1): m = the block minimum, d = (max - min) / (2^bits - 1), both
// stored rounded to fp16 but used unrounded; q = trunc((x - min) / d + 0.5).
template <typename Block, int kBits>
void ref_affine32(const float* x, Block* y, int64_t nb) {
    constexpr int kTop = (1 << kBits) - 1;
    for (int64_t i = 0; i < nb; ++i, x += 32) {
        float min = std::numeric_limits<float>::max(), max = -std::numeric_limits<float>::max();
        for (int j = 0; j < 32; ++j) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / static_cast<float>(kTop);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        y[i].m = fp32_to_fp16(min);
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            int q0 = static_cast<uint8_t>((x[j] - min) * id + 0.5f);
            int q1 = static_cast<uint8_t>((x[j + 16] - min) * id + 0.5f);
            if constexpr (kBits == 4) {
                q0 = std::min(kTop, static_cast<int>(static_cast<int8_t>((x[j] - min) * id + 0.5f)));
                q1 = std::min(kTop, static_cast<int>(static_cast<int8_t>((x[j + 16] - min) * id + 0.5f)));
            }
            y[i].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
            qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + 16);
        }
        if constexpr (kBits == 5) std::memcpy(y[i].qh, &qh, 4);
    }
}

// Q8_0: d = max|x| / 127, q = x / d rounded half away from zero (roundf).
void ref_q8_0(const float* x, BlockQ8_0* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        for (int j = 0; j < 32; ++j) y[i].qs[j] = static_cast<int8_t>(std::roundf(x[j] * id));
    }
}

// ---- k-quants: llama.cpp's scale searches (quantize_row_qN_K_ref), in its order of float operations ----

constexpr float kGroupEps = 1e-15f;

// Round to nearest, ties to even, for |v| < 2^22: the bits of v + 1.5 * 2^23.
int nearest(float v) {
    const float shifted = v + 12582912.0f;
    int bits;
    std::memcpy(&bits, &shifted, sizeof bits);
    return (bits & 0x007FFFFF) - 0x00400000;
}

// Symmetric fit of n values to L in [0, 2 nmax): the first guess maps the value of largest
// magnitude to -nmax, then 18 neighbouring scales are tried and the best by weighted squared
// error (weights x^2) kept. Returns the scale.
float fit_symmetric(int n, int nmax, const float* x, int8_t* L) {
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

// Q3_K's fit: the first guess as above, then up to 5 rounds moving single values to the level
// that improves the weighted (x^2) fit. L in [0, 2 nmax). Returns the scale.
float fit_q3(int n, int nmax, const float* x, int8_t* L) {
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

// Affine fit x ~ scale * L - min (min >= 0, L in [0, nmax]) with weights: the range's fit, then
// nstep + 1 scales around it, each with the least-squares scale and offset for its levels; the
// smallest weighted error (|e| with use_abs, else e^2) wins. Returns the scale; *neg_min = min.
float fit_affine_search(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* neg_min, float rmin,
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

void ref_q2_K(const float* x, BlockQ2_K* y, int64_t nb) {
    uint8_t L[kQK];
    float weights[16], mins[16], scales[16];
    for (int64_t i = 0; i < nb; ++i, x += kQK) {
        float max_scale = 0.0f, max_min = 0.0f;
        for (int j = 0; j < 16; ++j) {
            for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
            scales[j] = fit_affine_search(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, true);
            max_scale = std::max(max_scale, scales[j]);
            max_min = std::max(max_min, mins[j]);
        }
        if (max_scale > 0.0f) {
            const float iscale = 15.0f / max_scale;
            for (int j = 0; j < 16; ++j) y[i].scales[j] = static_cast<uint8_t>(nearest(iscale * scales[j]));
            y[i].d = fp32_to_fp16(max_scale / 15.0f);
        } else {
            std::fill(y[i].scales, y[i].scales + 16, uint8_t{0});
            y[i].d = fp32_to_fp16(0.0f);
        }
        if (max_min > 0.0f) {
            const float iscale = 15.0f / max_min;
            for (int j = 0; j < 16; ++j) y[i].scales[j] |= static_cast<uint8_t>(nearest(iscale * mins[j]) << 4);
            y[i].dmin = fp32_to_fp16(max_min / 15.0f);
        } else {
            y[i].dmin = fp32_to_fp16(0.0f);
        }
        for (int j = 0; j < 16; ++j) {
            const float d = fp16_to_fp32(y[i].d) * (y[i].scales[j] & 0xF);
            if (d == 0.0f) continue;
            const float dm = fp16_to_fp32(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int l = 0; l < 16; ++l)
                L[16 * j + l] = static_cast<uint8_t>(std::max(0, std::min(3, nearest((x[16 * j + l] + dm) / d))));
        }
        for (int j = 0; j < kQK; j += 128) {
            for (int l = 0; l < 32; ++l)
                y[i].qs[j / 4 + l] =
                    static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
        }
    }
}

void ref_q3_K(const float* x, BlockQ3_K* y, int64_t nb) {
    int8_t L[kQK];
    float scales[16];
    for (int64_t i = 0; i < nb; ++i, x += kQK) {
        float max_scale = 0.0f, amax = 0.0f;
        for (int j = 0; j < 16; ++j) {
            scales[j] = fit_q3(16, 4, x + 16 * j, L + 16 * j);
            if (std::fabs(scales[j]) > amax) {
                amax = std::fabs(scales[j]);
                max_scale = scales[j];
            }
        }
        std::memset(y[i].scales, 0, 12);
        if (max_scale != 0.0f) {
            const float iscale = -32.0f / max_scale;
            for (int j = 0; j < 16; ++j) {
                const int l =
                    std::max(-32, std::min(31, static_cast<int>(static_cast<int8_t>(nearest(iscale * scales[j]))))) +
                    32;
                if (j < 8) {
                    y[i].scales[j] = static_cast<uint8_t>(l & 0xF);
                } else {
                    y[i].scales[j - 8] |= static_cast<uint8_t>((l & 0xF) << 4);
                }
                y[i].scales[j % 4 + 8] |= static_cast<uint8_t>((l >> 4) << (2 * (j / 4)));
            }
            y[i].d = fp32_to_fp16(1 / iscale);
        } else {
            y[i].d = fp32_to_fp16(0.0f);
        }
        for (int j = 0; j < 16; ++j) {
            const int low = j < 8 ? y[i].scales[j] & 0xF : y[i].scales[j - 8] >> 4;
            const int sc = (low | (((y[i].scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
            const float d = fp16_to_fp32(y[i].d) * sc;
            if (d == 0.0f) continue;
            for (int l = 0; l < 16; ++l)
                L[16 * j + l] = static_cast<int8_t>(std::max(-4, std::min(3, nearest(x[16 * j + l] / d))) + 4);
        }
        std::memset(y[i].hmask, 0, kQK / 8);
        for (int j = 0; j < kQK; ++j) {
            if (L[j] > 3) {
                y[i].hmask[j % 32] |= static_cast<uint8_t>(1u << (j / 32));
                L[j] = static_cast<int8_t>(L[j] - 4);
            }
        }
        for (int j = 0; j < kQK; j += 128) {
            for (int l = 0; l < 32; ++l)
                y[i].qs[j / 4 + l] =
                    static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
        }
    }
}

// Q4_K and Q5_K: 8 sub-blocks of 32, each fitted with weights rms(x) + |x|; 6-bit scales and mins.
template <typename Block, int kNmax>
void ref_q45_K(const float* x, Block* y, int64_t nb) {
    constexpr bool kFive = kNmax == 31;
    uint8_t L[kQK];
    float weights[32], mins[8], scales[8];
    for (int64_t i = 0; i < nb; ++i, x += kQK) {
        float max_scale = 0.0f, max_min = 0.0f;
        for (int j = 0; j < 8; ++j) {
            float sum_x2 = 0.0f;
            for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
            const float av_x = std::sqrt(sum_x2 / 32);
            for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
            scales[j] = fit_affine_search(32, kNmax, x + 32 * j, weights, L + 32 * j, &mins[j], kFive ? -0.5f : -1.0f,
                                          0.1f, kFive ? 15 : 20, false);
            max_scale = std::max(max_scale, scales[j]);
            max_min = std::max(max_min, mins[j]);
        }
        const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
        const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
        uint8_t ls[8], lm[8];
        for (int j = 0; j < 8; ++j) {
            ls[j] = std::min<uint8_t>(63, static_cast<uint8_t>(nearest(inv_scale * scales[j])));
            lm[j] = std::min<uint8_t>(63, static_cast<uint8_t>(nearest(inv_min * mins[j])));
        }
        for (int j = 0; j < 4; ++j) {
            y[i].scales[j] = static_cast<uint8_t>(ls[j] | ((ls[j + 4] >> 4) << 6));
            y[i].scales[j + 4] = static_cast<uint8_t>(lm[j] | ((lm[j + 4] >> 4) << 6));
            y[i].scales[j + 8] = static_cast<uint8_t>((ls[j + 4] & 0xF) | ((lm[j + 4] & 0xF) << 4));
        }
        y[i].d = fp32_to_fp16(max_scale / 63.0f);
        y[i].dmin = fp32_to_fp16(max_min / 63.0f);
        for (int j = 0; j < 8; ++j) {
            const float d = fp16_to_fp32(y[i].d) * ls[j];
            if (d == 0.0f) continue;
            const float dm = fp16_to_fp32(y[i].dmin) * lm[j];
            for (int l = 0; l < 32; ++l)
                L[32 * j + l] = static_cast<uint8_t>(std::max(0, std::min(kNmax, nearest((x[32 * j + l] + dm) / d))));
        }
        if constexpr (kFive) std::memset(y[i].qh, 0, kQK / 8);
        for (int c = 0; c < 4; ++c) {  // 64 values: sub-blocks 2c (low nibbles) and 2c + 1 (high)
            for (int l = 0; l < 32; ++l) {
                int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
                if constexpr (kFive) {
                    if (lo > 15) {
                        lo -= 16;
                        y[i].qh[l] |= static_cast<uint8_t>(1u << (2 * c));
                    }
                    if (hi > 15) {
                        hi -= 16;
                        y[i].qh[l] |= static_cast<uint8_t>(2u << (2 * c));
                    }
                }
                y[i].qs[32 * c + l] = static_cast<uint8_t>(lo | (hi << 4));
            }
        }
    }
}

void ref_q6_K(const float* x, BlockQ6_K* y, int64_t nb) {
    int8_t L[kQK];
    float scales[16];
    for (int64_t i = 0; i < nb; ++i, x += kQK) {
        float max_scale = 0.0f, max_abs = 0.0f;
        for (int j = 0; j < 16; ++j) {
            scales[j] = fit_symmetric(16, 32, x + 16 * j, L + 16 * j);
            if (std::fabs(scales[j]) > max_abs) {
                max_abs = std::fabs(scales[j]);
                max_scale = scales[j];
            }
        }
        if (max_abs < kGroupEps) {
            std::memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -128.0f / max_scale;
        y[i].d = fp32_to_fp16(1 / iscale);
        for (int j = 0; j < 16; ++j) y[i].scales[j] = static_cast<int8_t>(std::min(127, nearest(iscale * scales[j])));
        for (int j = 0; j < 16; ++j) {
            const float d = fp16_to_fp32(y[i].d) * y[i].scales[j];
            if (d == 0.0f) continue;
            for (int l = 0; l < 16; ++l)
                L[16 * j + l] = static_cast<int8_t>(std::max(-32, std::min(31, nearest(x[16 * j + l] / d))) + 32);
        }
        for (int h = 0; h < 2; ++h) {
            const int8_t* q = L + 128 * h;
            uint8_t* ql = y[i].ql + 64 * h;
            uint8_t* qh = y[i].qh + 32 * h;
            for (int l = 0; l < 32; ++l) {
                ql[l] = static_cast<uint8_t>((q[l] & 0xF) | ((q[l + 64] & 0xF) << 4));
                ql[l + 32] = static_cast<uint8_t>((q[l + 32] & 0xF) | ((q[l + 96] & 0xF) << 4));
                qh[l] = static_cast<uint8_t>((q[l] >> 4) | ((q[l + 32] >> 4) << 2) | ((q[l + 64] >> 4) << 4) |
                                             ((q[l + 96] >> 4) << 6));
            }
        }
    }
}

}  // namespace

bool can_quantize_model(GgmlType type) {
    return can_quantize(type) && type != GgmlType::Q8_1 && type != GgmlType::Q8_K;
}

void quantize_model_row(GgmlType type, const float* src, void* dst, int64_t n) {
    const int64_t nb = whole_blocks("quantize_model_row", type, n, can_quantize_model(type));
    switch (type) {
        case GgmlType::Q4_0:
            return ref_symmetric32<BlockQ4_0, 4>(src, as<BlockQ4_0>(dst), nb);
        case GgmlType::Q5_0:
            return ref_symmetric32<BlockQ5_0, 5>(src, as<BlockQ5_0>(dst), nb);
        case GgmlType::Q4_1:
            return ref_affine32<BlockQ4_1, 4>(src, as<BlockQ4_1>(dst), nb);
        case GgmlType::Q5_1:
            return ref_affine32<BlockQ5_1, 5>(src, as<BlockQ5_1>(dst), nb);
        case GgmlType::Q8_0:
            return ref_q8_0(src, as<BlockQ8_0>(dst), nb);
        case GgmlType::Q2_K:
            return ref_q2_K(src, as<BlockQ2_K>(dst), nb);
        case GgmlType::Q3_K:
            return ref_q3_K(src, as<BlockQ3_K>(dst), nb);
        case GgmlType::Q4_K:
            return ref_q45_K<BlockQ4_K, 15>(src, as<BlockQ4_K>(dst), nb);
        case GgmlType::Q5_K:
            return ref_q45_K<BlockQ5_K, 31>(src, as<BlockQ5_K>(dst), nb);
        case GgmlType::Q6_K:
            return ref_q6_K(src, as<BlockQ6_K>(dst), nb);
        case GgmlType::IQ4_NL:
            return quantize_row_iq4_nl_searched(src, dst, n);
        default:
            return quantize_row(type, src, dst, n);
    }
}

}  // namespace fitllm::quant
