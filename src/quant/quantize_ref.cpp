#include "quant/quantize_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "quant/blocks.h"
#include "quant/quantize.h"
#include "quant/quantize_fit.h"
#include "quant/quantize_iq.h"

namespace fitllm::quant {
namespace {

using fit::importance;
using fit::kGroupEps;
using fit::mean_square;
using fit::nearest;

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

// ---- k-quants: llama.cpp's quantize_row_qN_K_ref, its scale searches in quant/quantize_fit.h ----

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
            scales[j] = fit::affine_search(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, true);
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
            scales[j] = fit::q3(16, 4, x + 16 * j, L + 16 * j);
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
            scales[j] = fit::affine_search(32, kNmax, x + 32 * j, weights, L + 32 * j, &mins[j], kFive ? -0.5f : -1.0f,
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

// ---- with an importance matrix: llama.cpp's quantize_row_*_impl, its searches in quant/quantize_fit.h ----

template <typename Block, int kBits>
void imp_symmetric32(const float* x, Block* y, int64_t n, const float* qw) {
    const float sigma2 = mean_square(x, n, 1.0f);
    float weight[32];
    int8_t L[32];
    for (int64_t ib = 0; ib < n / 32; ++ib) {
        const float* xb = x + 32 * ib;
        importance(qw + 32 * ib, xb, 32, sigma2, weight);
        y[ib].d = fp32_to_fp16(fit::symmetric_weighted(32, 1 << (kBits - 1), xb, L, weight));
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
        const float d = fit::affine_weighted(32, (1 << kBits) - 1, xb, weight, L, &min, -0.9f, 0.05f, 36);
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
            scales[j] = fit::affine_weighted(16, 3, x + 16 * j, weight, L + 16 * j, &mins[j], -0.9f, 0.05f, 36);
        }
        y[i].d = fp32_to_fp16(fit::positive(16, 15, scales, Ls, sw));
        y[i].dmin = fp32_to_fp16(fit::positive(16, 15, mins, Lm, sw));
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
            scales[j] = fit::symmetric_weighted(16, 4, x + 16 * j, L + 16 * j, weight);
        }
        const float d_block = fit::symmetric_weighted(16, 32, scales, reinterpret_cast<int8_t*>(Ls), sw);
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
            scales[j] = fit::affine_weighted(32, kNmax, x + 32 * j, weights, L + 32 * j, &mins[j], -0.9f, 0.05f, 36);
        }
        const float d_block = fit::positive(8, 63, scales, Ls, sw);
        const float m_block = fit::positive(8, 63, mins, Lm, sw);
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
            scales[j] = qw ? fit::symmetric_weighted(16, 32, x + 16 * j, L + 16 * j, qw + kQK * i + 16 * j)
                           : fit::symmetric(16, 32, x + 16 * j, L + 16 * j);
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
