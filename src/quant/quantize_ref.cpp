#include "quant/quantize_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "quant/blocks.h"
#include "quant/quantize.h"
#include "quant/quantize_iq.h"

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

// Q2_K / Q3_K: 256 levels of 0..3 into 64 bytes, 128 values at a time, a byte holding the values
// 32 apart in its four bit pairs.
void pack_2bit_levels(const int8_t* L, uint8_t* qs) {
    for (int j = 0; j < kQK; j += 128) {
        for (int l = 0; l < 32; ++l)
            qs[j / 4 + l] =
                static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
    }
}

void pack_2bit_levels(const uint8_t* L, uint8_t* qs) {
    pack_2bit_levels(reinterpret_cast<const int8_t*>(L), qs);
}

// Q3_K's sixteen 6-bit scales (0..63, 32 meaning zero): low nibbles in bytes 0..7 (j and j + 8
// sharing one), the high bit pairs in bytes 8..11.
void pack_q3_K_scales(const uint8_t* ls, BlockQ3_K& b) {
    std::memset(b.scales, 0, sizeof b.scales);
    for (int j = 0; j < 16; ++j) {
        if (j < 8) {
            b.scales[j] = static_cast<uint8_t>(ls[j] & 0xF);
        } else {
            b.scales[j - 8] |= static_cast<uint8_t>((ls[j] & 0xF) << 4);
        }
        b.scales[j % 4 + 8] |= static_cast<uint8_t>((ls[j] >> 4) << (2 * (j / 4)));
    }
}

// A Q3_K block's levels from its packed scales and d: each value to the nearest of -4..3 times its
// sub-block's scale, the third bit into hmask and the low two into qs. A sub-block whose scale is
// zero keeps the levels of its fit in L, as llama.cpp's.
void q3_K_levels(const float* x, int8_t* L, BlockQ3_K& b) {
    for (int j = 0; j < 16; ++j) {
        const int low = j < 8 ? b.scales[j] & 0xF : b.scales[j - 8] >> 4;
        const int sc = (low | (((b.scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
        const float d = fp16_to_fp32(b.d) * sc;
        if (d == 0.0f) continue;
        for (int l = 0; l < 16; ++l)
            L[16 * j + l] = static_cast<int8_t>(std::max(-4, std::min(3, nearest(x[16 * j + l] / d))) + 4);
    }
    std::memset(b.hmask, 0, kQK / 8);
    for (int j = 0; j < kQK; ++j) {
        if (L[j] > 3) {
            b.hmask[j % 32] |= static_cast<uint8_t>(1u << (j / 32));
            L[j] = static_cast<int8_t>(L[j] - 4);
        }
    }
    pack_2bit_levels(L, b.qs);
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
        pack_2bit_levels(L, y[i].qs);
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
        std::memset(y[i].scales, 0, sizeof y[i].scales);
        if (max_scale != 0.0f) {
            const float iscale = -32.0f / max_scale;
            uint8_t ls[16];
            for (int j = 0; j < 16; ++j)
                ls[j] = static_cast<uint8_t>(
                    std::max(-32, std::min(31, static_cast<int>(static_cast<int8_t>(nearest(iscale * scales[j]))))) +
                    32);
            pack_q3_K_scales(ls, y[i]);
            y[i].d = fp32_to_fp16(1 / iscale);
        } else {
            y[i].d = fp32_to_fp16(0.0f);
        }
        q3_K_levels(x, L, y[i]);
    }
}

// Q4_K and Q5_K: 8 sub-blocks of 32, each fitted with weights rms(x) + |x|; 6-bit scales and mins.
// A Q4_K / Q5_K block's 256 levels L (0..15 / 0..31) into its nibbles (and Q5_K's fifth bits): 64
// values at a time, sub-blocks 2c in the low nibbles and 2c + 1 in the high.
template <typename Block>
void pack_q45_K_levels(const uint8_t* L, Block& b) {
    constexpr bool kFive = std::is_same_v<Block, BlockQ5_K>;
    if constexpr (kFive) std::memset(b.qh, 0, kQK / 8);
    for (int c = 0; c < 4; ++c) {
        for (int l = 0; l < 32; ++l) {
            int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
            if constexpr (kFive) {
                if (lo > 15) {
                    lo -= 16;
                    b.qh[l] |= static_cast<uint8_t>(1u << (2 * c));
                }
                if (hi > 15) {
                    hi -= 16;
                    b.qh[l] |= static_cast<uint8_t>(2u << (2 * c));
                }
            }
            b.qs[32 * c + l] = static_cast<uint8_t>(lo | (hi << 4));
        }
    }
}

// A Q4_K / Q5_K block's scales ls and mins lm (6 bits each: the packing keeps the low 8 bits of
// what it is given, as llama.cpp's) packed, then each value's level from the packed numbers and d /
// dmin (a sub-block whose scale is zero keeps the levels of its fit in L), then the levels packed.
template <int kNmax, typename Block>
void q45_K_levels(const float* x, const uint8_t* ls, const uint8_t* lm, uint8_t* L, Block& b) {
    for (int j = 0; j < 4; ++j) {
        b.scales[j] = static_cast<uint8_t>(ls[j] | ((ls[j + 4] >> 4) << 6));
        b.scales[j + 4] = static_cast<uint8_t>(lm[j] | ((lm[j + 4] >> 4) << 6));
        b.scales[j + 8] = static_cast<uint8_t>((ls[j + 4] & 0xF) | ((lm[j + 4] & 0xF) << 4));
    }
    for (int j = 0; j < 8; ++j) {
        int sc, m;
        if (j < 4) {
            sc = b.scales[j] & 63;
            m = b.scales[j + 4] & 63;
        } else {
            sc = (b.scales[j + 4] & 0xF) | ((b.scales[j - 4] >> 6) << 4);
            m = (b.scales[j + 4] >> 4) | ((b.scales[j] >> 6) << 4);
        }
        const float d = fp16_to_fp32(b.d) * sc;
        if (d == 0.0f) continue;
        const float dm = fp16_to_fp32(b.dmin) * m;
        for (int l = 0; l < 32; ++l)
            L[32 * j + l] = static_cast<uint8_t>(std::max(0, std::min(kNmax, nearest((x[32 * j + l] + dm) / d))));
    }
    pack_q45_K_levels(L, b);
}

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
        y[i].d = fp32_to_fp16(max_scale / 63.0f);
        y[i].dmin = fp32_to_fp16(max_min / 63.0f);
        q45_K_levels<kNmax>(x, ls, lm, L, y[i]);
    }
}

// ---- with an importance matrix: llama.cpp's quantize_row_*_impl, in its order of float operations ----

// make_qx_quants with rmse_type 1: fit_symmetric's search, the error weighted by qw (x^2 without).
float fit_symmetric_weighted(int n, int nmax, const float* x, int8_t* L, const float* qw) {
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

// make_qkx3_quants: the affine fit of fit_affine_search, squared errors, weights (x^2 without),
// steps from rmin; `max <= min` counts as flat.
float fit_affine_weighted(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* neg_min, float rmin,
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

// make_qp_quants: n non-negative values (sub-block scales or mins) to levels 0..nmax with a
// positive scale: 8 scales around max / nmax tried by weighted squared error, then up to 5 rounds
// moving single levels as fit_q3 does. Returns the scale.
float fit_positive(int n, int nmax, const float* x, uint8_t* L, const float* w) {
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

// sigma^2 of a row or block: the mean of x^2 times `factor`.
float mean_square(const float* x, int64_t n, float factor) {
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) sum += x[j] * x[j];
    return factor * sum / n;
}

// The importance of each value: qw * sqrt(sigma2 + x^2).
void importance(const float* qw, const float* x, int n, float sigma2, float* w) {
    for (int l = 0; l < n; ++l) w[l] = qw[l] * std::sqrt(sigma2 + x[l] * x[l]);
}

template <typename Block, int kBits>
void imp_symmetric32(const float* x, Block* y, int64_t n, const float* qw) {
    const float sigma2 = mean_square(x, n, 1.0f);
    float weight[32];
    int8_t L[32];
    for (int64_t ib = 0; ib < n / 32; ++ib) {
        const float* xb = x + 32 * ib;
        importance(qw + 32 * ib, xb, 32, sigma2, weight);
        y[ib].d = fp32_to_fp16(fit_symmetric_weighted(32, 1 << (kBits - 1), xb, L, weight));
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            const uint8_t q0 = static_cast<uint8_t>(L[j]), q1 = static_cast<uint8_t>(L[j + 16]);
            y[ib].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= ((q0 & 0x10u) >> 4) << j;
            qh |= ((q1 & 0x10u) >> 4) << (j + 16);
        }
        if constexpr (kBits == 5) std::memcpy(y[ib].qh, &qh, 4);
    }
}

template <typename Block, int kBits>
void imp_affine32(const float* x, Block* y, int64_t n, const float* qw) {
    const float sigma2 = mean_square(x, n, 1.0f);
    float weight[32];
    uint8_t L[32];
    for (int64_t ib = 0; ib < n / 32; ++ib) {
        const float* xb = x + 32 * ib;
        importance(qw + 32 * ib, xb, 32, sigma2, weight);
        float min;
        const float d = fit_affine_weighted(32, (1 << kBits) - 1, xb, weight, L, &min, -0.9f, 0.05f, 36);
        y[ib].d = fp32_to_fp16(d);
        y[ib].m = fp32_to_fp16(-min);
        uint32_t qh = 0;
        for (int j = 0; j < 16; ++j) {
            y[ib].qs[j] = static_cast<uint8_t>((L[j] & 0x0F) | ((L[j + 16] & 0x0F) << 4));
            qh |= ((L[j] & 0x10u) >> 4) << j;
            qh |= ((L[j + 16] & 0x10u) >> 4) << (j + 16);
        }
        if constexpr (kBits == 5) std::memcpy(y[ib].qh, &qh, 4);
    }
}

void imp_q2_K(const float* x, BlockQ2_K* y, int64_t nb, const float* qw) {
    uint8_t L[kQK], Ls[16], Lm[16];
    float mins[16], scales[16], sw[16], weight[16];
    for (int64_t i = 0; i < nb; ++i, x += kQK) {
        const float sigma2 = mean_square(x, kQK, 1.0f);
        for (int j = 0; j < 16; ++j) {
            importance(qw + kQK * i + 16 * j, x + 16 * j, 16, sigma2, weight);
            sw[j] = 0.0f;
            for (int l = 0; l < 16; ++l) sw[j] += weight[l];
            scales[j] = fit_affine_weighted(16, 3, x + 16 * j, weight, L + 16 * j, &mins[j], -0.9f, 0.05f, 36);
        }
        y[i].d = fp32_to_fp16(fit_positive(16, 15, scales, Ls, sw));
        y[i].dmin = fp32_to_fp16(fit_positive(16, 15, mins, Lm, sw));
        const float dm = fp16_to_fp32(y[i].d), mm = fp16_to_fp32(y[i].dmin);
        for (int j = 0; j < 16; ++j) y[i].scales[j] = static_cast<uint8_t>(Ls[j] | (Lm[j] << 4));
        for (int j = 0; j < 16; ++j) {
            const float d = dm * (y[i].scales[j] & 0xF);
            if (d == 0.0f) continue;
            const float m = mm * (y[i].scales[j] >> 4);
            for (int l = 0; l < 16; ++l)
                L[16 * j + l] = static_cast<uint8_t>(std::max(0, std::min(3, nearest((x[16 * j + l] + m) / d))));
        }
        pack_2bit_levels(L, y[i].qs);
    }
}

void imp_q3_K(const float* x, BlockQ3_K* y, int64_t nb, const float* qw) {
    int8_t L[kQK];
    uint8_t Ls[16];
    float scales[16], weight[16], sw[16];
    for (int64_t i = 0; i < nb; ++i, x += kQK) {
        const float sigma2 = mean_square(x, kQK, 2.0f);
        for (int j = 0; j < 16; ++j) {
            importance(qw + kQK * i + 16 * j, x + 16 * j, 16, sigma2, weight);
            float sumw = 0.0f;
            for (int l = 0; l < 16; ++l) sumw += weight[l];
            sw[j] = sumw;
            scales[j] = fit_symmetric_weighted(16, 4, x + 16 * j, L + 16 * j, weight);
        }
        const float d_block = fit_symmetric_weighted(16, 32, scales, reinterpret_cast<int8_t*>(Ls), sw);
        pack_q3_K_scales(Ls, y[i]);
        y[i].d = fp32_to_fp16(d_block);
        q3_K_levels(x, L, y[i]);
    }
}

template <typename Block, int kNmax>
void imp_q45_K(const float* x, Block* y, int64_t nb, const float* qw) {
    constexpr bool kFive = kNmax == 31;
    uint8_t L[kQK], Ls[8], Lm[8];
    float weights[32], sw[8], mins[8], scales[8];
    for (int64_t i = 0; i < nb; ++i, x += kQK) {
        const float sigma2 = mean_square(x, kQK, 2.0f);
        for (int j = 0; j < 8; ++j) {
            importance(qw + kQK * i + 32 * j, x + 32 * j, 32, sigma2, weights);
            float sumw = 0.0f;
            for (int l = 0; l < 32; ++l) sumw += weights[l];
            sw[j] = sumw;
            scales[j] = fit_affine_weighted(32, kNmax, x + 32 * j, weights, L + 32 * j, &mins[j], -0.9f, 0.05f, 36);
        }
        const float d_block = fit_positive(8, 63, scales, Ls, sw);
        const float m_block = fit_positive(8, 63, mins, Lm, sw);
        if constexpr (kFive) {
            for (int j = 0; j < 8; ++j) {
                Ls[j] = std::min<uint8_t>(63, Ls[j]);
                Lm[j] = std::min<uint8_t>(63, Lm[j]);
            }
        }
        y[i].d = fp32_to_fp16(d_block);
        y[i].dmin = fp32_to_fp16(m_block);
        q45_K_levels<kNmax>(x, Ls, Lm, L, y[i]);
    }
}

// Q6_K: one search per sub-block of 16 for both ways (make_qx_quants, its error weighted by qw where
// given), so one function.
void q6_K(const float* x, BlockQ6_K* y, int64_t nb, const float* qw) {
    int8_t L[kQK];
    float scales[16];
    for (int64_t i = 0; i < nb; ++i, x += kQK) {
        float max_scale = 0.0f, max_abs = 0.0f;
        for (int j = 0; j < 16; ++j) {
            scales[j] = qw ? fit_symmetric_weighted(16, 32, x + 16 * j, L + 16 * j, qw + kQK * i + 16 * j)
                           : fit_symmetric(16, 32, x + 16 * j, L + 16 * j);
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

// ggml's best_index_int8: the nearest of the 16 sorted table values by bisection (ties up).
int iq4_index(float x) {
    const int8_t* val = kValuesIQ4NL;
    if (x <= val[0]) return 0;
    if (x >= val[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (x < val[mid]) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    return x - val[hi - 1] < val[hi] - x ? hi - 1 : hi;
}

// quantize_row_iq4_nl_impl with ntry 7 for one super-block of `size` values (32: IQ4_NL, 256:
// IQ4_XS) in sub-blocks of 32, weighted by qw * sqrt(sigma2 + x^2).
void imp_iq4(const float* x, int size, const float* qw, uint16_t* dh, uint8_t* q4, uint16_t* scales_h,
             uint8_t* scales_l) {
    constexpr int kTry = 7;
    float sigma2 = 0.0f;
    for (int j = 0; j < size; ++j) sigma2 += x[j] * x[j];
    sigma2 *= 2.0f / size;
    uint8_t L[kQK];
    float scales[8], weight[32];
    std::memset(q4, 0, static_cast<size_t>(size / 2));
    *dh = fp32_to_fp16(0.0f);
    float max_scale = 0.0f, amax_scale = 0.0f;
    const int nsub = size / 32;
    for (int ib = 0; ib < nsub; ++ib) {
        const float* xb = x + 32 * ib;
        uint8_t* Lb = L + 32 * ib;
        importance(qw + 32 * ib, xb, 32, sigma2, weight);
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; ++j) {
            if (std::fabs(xb[j]) > amax) {
                amax = std::fabs(xb[j]);
                max = xb[j];
            }
        }
        if (amax < kGroupEps) {
            scales[ib] = 0.0f;
            continue;
        }
        float d = -max / kValuesIQ4NL[0];
        float id = 1 / d;
        float sumqx = 0.0f, sumq2 = 0.0f;
        for (int j = 0; j < 32; ++j) {
            const int l = iq4_index(id * xb[j]);
            Lb[j] = static_cast<uint8_t>(l);
            const float q = kValuesIQ4NL[l];
            sumqx += weight[j] * q * xb[j];
            sumq2 += weight[j] * q * q;
        }
        d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
        float best = d * sumqx;
        for (int t = -kTry; t <= kTry; ++t) {
            id = (t + kValuesIQ4NL[0]) / max;
            sumqx = sumq2 = 0.0f;
            for (int j = 0; j < 32; ++j) {
                const float q = kValuesIQ4NL[iq4_index(id * xb[j])];
                sumqx += weight[j] * q * xb[j];
                sumq2 += weight[j] * q * q;
            }
            if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        if (std::fabs(d) > amax_scale) {
            amax_scale = std::fabs(d);
            max_scale = d;
        }
    }
    if (nsub > 1) {
        *scales_h = 0;
        const float d = -max_scale / 32;
        *dh = fp32_to_fp16(d);
        const float id = d != 0.0f ? 1 / d : 0.0f;
        for (int ib = 0; ib < nsub; ++ib) {
            int l = std::max(-32, std::min(31, nearest(id * scales[ib])));
            const float dl = d * l;
            const float idl = dl != 0.0f ? 1 / dl : 0.0f;
            for (int j = 0; j < 32; ++j) L[32 * ib + j] = static_cast<uint8_t>(iq4_index(idl * x[32 * ib + j]));
            l += 32;
            const uint8_t l_l = static_cast<uint8_t>(l & 0xF), l_h = static_cast<uint8_t>(l >> 4);
            if (ib % 2 == 0) {
                scales_l[ib / 2] = l_l;
            } else {
                scales_l[ib / 2] |= static_cast<uint8_t>(l_l << 4);
            }
            *scales_h = static_cast<uint16_t>(*scales_h | (l_h << (2 * (ib % 8))));
        }
    } else {
        *dh = fp32_to_fp16(scales[0]);
        const float id = scales[0] != 0.0f ? 1 / scales[0] : 0.0f;
        for (int j = 0; j < size; ++j) L[j] = static_cast<uint8_t>(iq4_index(id * x[j]));
    }
    for (int i = 0; i < size / 32; ++i) {
        for (int j = 0; j < 16; ++j) q4[16 * i + j] = static_cast<uint8_t>(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
    }
}

}  // namespace

float detail::fit_positive_levels(int n, int nmax, const float* x, uint8_t* L, const float* w) {
    return fit_positive(n, nmax, x, L, w);
}

bool can_quantize_model(GgmlType type) {
    if (is_grid_iquant(type)) return true;
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
            return q6_K(src, as<BlockQ6_K>(dst), nb, nullptr);
        case GgmlType::IQ4_NL:
            return quantize_row_iq4_nl_searched(src, dst, n);
        case GgmlType::IQ3_XXS:
            return detail::quantize_row_iq3_xxs(src, dst, n, nullptr);
        case GgmlType::IQ3_S:
            return detail::quantize_row_iq3_s(src, dst, n, nullptr);
        case GgmlType::IQ2_S:
            return detail::quantize_row_iq2_s(src, dst, n, nullptr);
        case GgmlType::IQ2_XXS:
            return detail::quantize_row_iq2_xxs(src, dst, n, nullptr);  // throws: needs weights
        case GgmlType::IQ2_XS:
            return detail::quantize_row_iq2_xs(src, dst, n, nullptr);
        case GgmlType::IQ1_S:
            return detail::quantize_row_iq1_s(src, dst, n, nullptr);  // throws: needs weights
        case GgmlType::IQ1_M:
            return detail::quantize_row_iq1_m(src, dst, n, nullptr);
        default:
            return quantize_row(type, src, dst, n);
    }
}

bool uses_importance(GgmlType type) {
    switch (type) {
        case GgmlType::Q4_0:
        case GgmlType::Q4_1:
        case GgmlType::Q5_0:
        case GgmlType::Q5_1:
        case GgmlType::Q2_K:
        case GgmlType::Q3_K:
        case GgmlType::Q4_K:
        case GgmlType::Q5_K:
        case GgmlType::Q6_K:
        case GgmlType::IQ4_NL:
        case GgmlType::IQ4_XS:
        case GgmlType::IQ3_XXS:
        case GgmlType::IQ3_S:
        case GgmlType::IQ2_S:
        case GgmlType::IQ2_XXS:
        case GgmlType::IQ2_XS:
        case GgmlType::IQ1_S:
        case GgmlType::IQ1_M:
            return true;
        default:
            return false;
    }
}

void quantize_model_row(GgmlType type, const float* src, void* dst, int64_t n, const float* weights) {
    if (weights == nullptr || !uses_importance(type)) return quantize_model_row(type, src, dst, n);
    const int64_t nb = whole_blocks("quantize_model_row", type, n, can_quantize_model(type));
    switch (type) {
        case GgmlType::Q4_0:
            return imp_symmetric32<BlockQ4_0, 4>(src, as<BlockQ4_0>(dst), n, weights);
        case GgmlType::Q5_0:
            return imp_symmetric32<BlockQ5_0, 5>(src, as<BlockQ5_0>(dst), n, weights);
        case GgmlType::Q4_1:
            return imp_affine32<BlockQ4_1, 4>(src, as<BlockQ4_1>(dst), n, weights);
        case GgmlType::Q5_1:
            return imp_affine32<BlockQ5_1, 5>(src, as<BlockQ5_1>(dst), n, weights);
        case GgmlType::Q2_K:
            return imp_q2_K(src, as<BlockQ2_K>(dst), nb, weights);
        case GgmlType::Q3_K:
            return imp_q3_K(src, as<BlockQ3_K>(dst), nb, weights);
        case GgmlType::Q4_K:
            return imp_q45_K<BlockQ4_K, 15>(src, as<BlockQ4_K>(dst), nb, weights);
        case GgmlType::Q5_K:
            return imp_q45_K<BlockQ5_K, 31>(src, as<BlockQ5_K>(dst), nb, weights);
        case GgmlType::Q6_K:
            return q6_K(src, as<BlockQ6_K>(dst), nb, weights);
        case GgmlType::IQ4_NL: {
            auto* y = as<BlockIQ4_NL>(dst);
            for (int64_t i = 0; i < nb; ++i)
                imp_iq4(src + 32 * i, 32, weights + 32 * i, &y[i].d, y[i].qs, nullptr, nullptr);
            return;
        }
        case GgmlType::IQ4_XS: {
            auto* y = as<BlockIQ4_XS>(dst);
            for (int64_t i = 0; i < nb; ++i)
                imp_iq4(src + kQK * i, kQK, weights + kQK * i, &y[i].d, y[i].qs, &y[i].scales_h, y[i].scales_l);
            return;
        }
        case GgmlType::IQ3_XXS:
            return detail::quantize_row_iq3_xxs(src, dst, n, weights);
        case GgmlType::IQ3_S:
            return detail::quantize_row_iq3_s(src, dst, n, weights);
        case GgmlType::IQ2_S:
            return detail::quantize_row_iq2_s(src, dst, n, weights);
        case GgmlType::IQ2_XXS:
            return detail::quantize_row_iq2_xxs(src, dst, n, weights);
        case GgmlType::IQ2_XS:
            return detail::quantize_row_iq2_xs(src, dst, n, weights);
        case GgmlType::IQ1_S:
            return detail::quantize_row_iq1_s(src, dst, n, weights);
        case GgmlType::IQ1_M:
            return detail::quantize_row_iq1_m(src, dst, n, weights);
        default:
            return quantize_model_row(type, src, dst, n);
    }
}

}  // namespace fitllm::quant
