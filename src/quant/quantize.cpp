#include "quant/quantize.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>
#include <string>

#include "quant/blocks.h"
#include "quant/dequantize.h"
#include "quant/quantize_kernels.h"

namespace fitllm::quant {
namespace {

int round_to_int(float v) {
    return static_cast<int>(std::nearbyint(v));
}  // ties to even
int clamp_int(int v, int lo, int hi) {
    return std::min(std::max(v, lo), hi);
}
float half_rounded(float v) {
    return fp16_to_fp32(fp32_to_fp16(v));
}

// The value of largest magnitude, with its sign (0 for an all-zero range).
float signed_absmax(const float* x, int n) {
    float best = 0.0f;
    for (int i = 0; i < n; ++i) {
        if (std::fabs(x[i]) > std::fabs(best)) best = x[i];
    }
    return best;
}

// ---- Activations, rounded as llama.cpp rounds them ----

// Q8_0 / Q8_1: d = max|x| / 127, q = x * (127 / max|x|) rounded to nearest even, as llama.cpp's
// x86 (AVX) quantize_row_q8_0/q8_1 compute it; its scalar reference (x / d, ties away from zero)
// differs in the last bit often enough to move Gemma 3's logits by ~0.3.
template <typename Block>
void quant_q8_blocks(const float* x, Block* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += 32) {
        float amax = 0.0f;
        for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(x[l]));
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int l = 0; l < 32; ++l) {
            y[i].qs[l] = static_cast<int8_t>(std::nearbyint(x[l] * id));
            sum += y[i].qs[l];
        }
        y[i].d = fp32_to_fp16(d);
        if constexpr (sizeof(Block) == sizeof(BlockQ8_1)) y[i].s = fp32_to_fp16(d * static_cast<float>(sum));
    }
}

// Q8_K: the value of largest magnitude maps to -127; d is a float and bsums are exact.
void quant_q8_K(const float* x, BlockQ8_K* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += kQK) {
        const float max = signed_absmax(x, kQK);
        if (max == 0.0f) {
            y[i] = BlockQ8_K{};
            continue;
        }
        const float iscale = -127.0f / max;
        for (int e = 0; e < kQK; ++e) y[i].qs[e] = static_cast<int8_t>(std::min(127, round_to_int(iscale * x[e])));
        for (int j = 0; j < kQK / 16; ++j) {
            int sum = 0;
            for (int l = 0; l < 16; ++l) sum += y[i].qs[16 * j + l];
            y[i].bsums[j] = static_cast<int16_t>(sum);
        }
        y[i].d = 1.0f / iscale;
    }
}

// ---- Weights: round to nearest ----

// Symmetric blocks of 32 (Q4_0, Q5_0): the value of largest magnitude maps to -2^(bits-1).
template <typename Block, int kBits>
void quant_symmetric32(const float* x, Block* y, int64_t nb) {
    constexpr int kOffset = 1 << (kBits - 1), kMax = (1 << kBits) - 1;
    for (int64_t i = 0; i < nb; ++i, x += 32) {
        const float d = half_rounded(signed_absmax(x, 32) / -static_cast<float>(kOffset));
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[32];
        for (int l = 0; l < 32; ++l) q[l] = clamp_int(round_to_int(x[l] * id) + kOffset, 0, kMax);
        y[i].d = fp32_to_fp16(d);
        for (int l = 0; l < 16; ++l) y[i].qs[l] = static_cast<uint8_t>((q[l] & 0x0F) | ((q[l + 16] & 0x0F) << 4));
        if constexpr (kBits == 5) {
            uint32_t qh = 0;
            for (int l = 0; l < 32; ++l) qh |= static_cast<uint32_t>(q[l] >> 4) << l;
            std::memcpy(y[i].qh, &qh, 4);
        }
    }
}

// Affine blocks of 32 (Q4_1, Q5_1): x = d * q + m over [min, max].
template <typename Block, int kBits>
void quant_affine32(const float* x, Block* y, int64_t nb) {
    constexpr int kMax = (1 << kBits) - 1;
    for (int64_t i = 0; i < nb; ++i, x += 32) {
        const float lo = *std::min_element(x, x + 32), hi = *std::max_element(x, x + 32);
        const float d = half_rounded((hi - lo) / kMax), m = half_rounded(lo);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[32];
        for (int l = 0; l < 32; ++l) q[l] = clamp_int(round_to_int((x[l] - m) * id), 0, kMax);
        y[i].d = fp32_to_fp16(d);
        y[i].m = fp32_to_fp16(m);
        for (int l = 0; l < 16; ++l) y[i].qs[l] = static_cast<uint8_t>((q[l] & 0x0F) | ((q[l + 16] & 0x0F) << 4));
        if constexpr (kBits == 5) {
            uint32_t qh = 0;
            for (int l = 0; l < 32; ++l) qh |= static_cast<uint32_t>(q[l] >> 4) << l;
            std::memcpy(y[i].qh, &qh, 4);
        }
    }
}

// Affine sub-blocks of a k-quant super-block: x ~ scale * q - min with min >= 0, q in [0, qmax];
// scales and mins are then quantized against the super-block's d and dmin with `levels` steps.
struct AffineFit {
    float scale[16];
    float min[16];
    int sc[16];  // quantized scales
    int mn[16];  // quantized mins
    float d, dmin;
};
AffineFit fit_affine(const float* x, int n_sub, int sub_len, int qmax, int levels) {
    AffineFit f{};
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < n_sub; ++j) {
        const float* s = x + j * sub_len;
        const float lo = std::min(0.0f, *std::min_element(s, s + sub_len));
        const float hi = std::max(0.0f, *std::max_element(s, s + sub_len));
        f.scale[j] = (hi - lo) / static_cast<float>(qmax);
        f.min[j] = -lo;
        max_scale = std::max(max_scale, f.scale[j]);
        max_min = std::max(max_min, f.min[j]);
    }
    f.d = half_rounded(max_scale / static_cast<float>(levels));
    f.dmin = half_rounded(max_min / static_cast<float>(levels));
    for (int j = 0; j < n_sub; ++j) {
        f.sc[j] = f.d != 0.0f ? clamp_int(round_to_int(f.scale[j] / f.d), 0, levels) : 0;
        f.mn[j] = f.dmin != 0.0f ? clamp_int(round_to_int(f.min[j] / f.dmin), 0, levels) : 0;
    }
    return f;
}
int affine_q(float x, float step, float offset, int qmax) {
    return step != 0.0f ? clamp_int(round_to_int((x + offset) / step), 0, qmax) : 0;
}

void quant_q2_K(const float* x, BlockQ2_K* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += kQK) {
        const AffineFit f = fit_affine(x, 16, 16, 3, 15);
        BlockQ2_K& b = y[i];
        b = BlockQ2_K{};
        b.d = fp32_to_fp16(f.d);
        b.dmin = fp32_to_fp16(f.dmin);
        for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<uint8_t>(f.sc[j] | (f.mn[j] << 4));
        for (int e = 0; e < kQK; ++e) {
            const int j = e / 16, h = e / 128, g = (e / 32) % 4, l = e % 32;
            const int q = affine_q(x[e], f.d * static_cast<float>(f.sc[j]), f.dmin * static_cast<float>(f.mn[j]), 3);
            b.qs[32 * h + l] |= static_cast<uint8_t>(q << (2 * g));
        }
    }
}

template <typename Block>
void quant_q4_5_K(const float* x, Block* y, int64_t nb) {
    constexpr bool kFive = sizeof(Block) == sizeof(BlockQ5_K);
    constexpr int kQMax = kFive ? 31 : 15;
    for (int64_t i = 0; i < nb; ++i, x += kQK) {
        const AffineFit f = fit_affine(x, 8, 32, kQMax, 63);
        Block& b = y[i];
        b = Block{};
        b.d = fp32_to_fp16(f.d);
        b.dmin = fp32_to_fp16(f.dmin);
        // The packing that unpack_q4k_scales undoes.
        for (int j = 0; j < 4; ++j) {
            b.scales[j] = static_cast<uint8_t>(f.sc[j] | ((f.sc[j + 4] >> 4) << 6));
            b.scales[j + 4] = static_cast<uint8_t>(f.mn[j] | ((f.mn[j + 4] >> 4) << 6));
            b.scales[j + 8] = static_cast<uint8_t>((f.sc[j + 4] & 0x0F) | ((f.mn[j + 4] & 0x0F) << 4));
        }
        for (int e = 0; e < kQK; ++e) {
            const int j = e / 32, l = e % 32;
            const int q =
                affine_q(x[e], f.d * static_cast<float>(f.sc[j]), f.dmin * static_cast<float>(f.mn[j]), kQMax);
            b.qs[32 * (j / 2) + l] |= static_cast<uint8_t>((q & 0x0F) << (4 * (j % 2)));
            if constexpr (kFive) b.qh[l] |= static_cast<uint8_t>((q >> 4) << j);
        }
    }
}

// Symmetric sub-blocks of 16 (Q3_K, Q6_K): the value of largest magnitude maps to -2^(bits-1);
// sub-block scales are signed integers against d, the largest mapping to -scale_levels.
struct SymmetricFit {
    int sc[16];
    float d;
};
SymmetricFit fit_symmetric16(const float* x, int q_offset, int scale_levels, int scale_max) {
    float scale[16];
    for (int j = 0; j < 16; ++j) scale[j] = signed_absmax(x + 16 * j, 16) / -static_cast<float>(q_offset);
    SymmetricFit f{};
    f.d = half_rounded(signed_absmax(scale, 16) / -static_cast<float>(scale_levels));
    for (int j = 0; j < 16; ++j) {
        f.sc[j] = f.d != 0.0f ? clamp_int(round_to_int(scale[j] / f.d), -scale_levels, scale_max) : 0;
    }
    return f;
}
int symmetric_q(float x, float step, int offset) {
    return step != 0.0f ? clamp_int(round_to_int(x / step), -offset, offset - 1) + offset : offset;
}

void quant_q3_K(const float* x, BlockQ3_K* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += kQK) {
        const SymmetricFit f = fit_symmetric16(x, 4, 32, 31);
        BlockQ3_K& b = y[i];
        b = BlockQ3_K{};
        b.d = fp32_to_fp16(f.d);
        for (int j = 0; j < 16; ++j) {  // the packing that unpack_q3k_scales undoes
            const int s = f.sc[j] + 32;
            b.scales[j % 8] |= static_cast<uint8_t>((s & 0x0F) << (4 * (j / 8)));
            b.scales[8 + j % 4] |= static_cast<uint8_t>((s >> 4) << (2 * (j / 4)));
        }
        for (int e = 0; e < kQK; ++e) {
            const int h = e / 128, g = (e / 32) % 4, l = e % 32;
            const int q = symmetric_q(x[e], f.d * static_cast<float>(f.sc[e / 16]), 4);
            b.qs[32 * h + l] |= static_cast<uint8_t>((q & 3) << (2 * g));
            b.hmask[l] |= static_cast<uint8_t>((q >> 2) << (4 * h + g));
        }
    }
}

void quant_q6_K(const float* x, BlockQ6_K* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += kQK) {
        const SymmetricFit f = fit_symmetric16(x, 32, 128, 127);
        BlockQ6_K& b = y[i];
        b = BlockQ6_K{};
        b.d = fp32_to_fp16(f.d);
        for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<int8_t>(f.sc[j]);
        for (int e = 0; e < kQK; ++e) {
            const int h = e / 128, g = (e / 32) % 4, l = e % 32;
            const int q = symmetric_q(x[e], f.d * static_cast<float>(f.sc[e / 16]), 32);
            b.ql[64 * h + 32 * (g % 2) + l] |= static_cast<uint8_t>((q & 0x0F) << (g < 2 ? 0 : 4));
            b.qh[32 * h + l] |= static_cast<uint8_t>((q >> 4) << (2 * g));
        }
    }
}

// ---- IQ4_NL: indices into the fixed table, as llama.cpp picks them ----

// The index of the table value nearest to x, ties going up: x takes index j once 2x reaches the sum
// s_j of values j - 1 and j (exact in float, as llama.cpp compares). The s_j are integers, so
// 2x >= s_j exactly when floor(2x) >= s_j: the index is a table lookup at floor(2x), which costs
// a fraction of a search's mispredicted branches.
constexpr int kTwiceXMin = -256, kTwiceXMax = 255;  // beyond every s_j (-231 .. 202)
constexpr auto kIQ4NLIndexAt = [] {
    std::array<uint8_t, kTwiceXMax - kTwiceXMin + 1> table{};
    for (int s = kTwiceXMin; s <= kTwiceXMax; ++s) {
        int index = 0;
        for (int j = 1; j < 16; ++j) index += s >= kValuesIQ4NL[j - 1] + kValuesIQ4NL[j] ? 1 : 0;
        table[static_cast<size_t>(s - kTwiceXMin)] = static_cast<uint8_t>(index);
    }
    return table;
}();
int nearest_iq4_nl(float x) {
    float x2 = x + x;
    x2 = x2 >= static_cast<float>(kTwiceXMin) ? std::min(x2, static_cast<float>(kTwiceXMax))
                                              : static_cast<float>(kTwiceXMin);  // NaN: index 0
    int floor = static_cast<int>(x2);                                            // truncated toward 0
    floor -= static_cast<float>(floor) > x2 ? 1 : 0;
    return kIQ4NLIndexAt[static_cast<size_t>(floor - kTwiceXMin)];
}

// One block of 32 as llama.cpp's quantize_row_iq4_nl_impl has it without importance weights (each
// x weighted by x^2), float operations in its order so that the bytes come out the same:
//  - the indices are those of the scale mapping the largest |x| to the table's end, -127 (ntry < 0),
//    or to +127 past its other end (ntry > 0); the scale is then the weighted least-squares fit
//    d = sum(w q x) / sum(w q^2) of those table values q;
//  - ntry > 0 also tries the 2 ntry + 1 scales mapping the largest |x| to -127 + t, |t| <= ntry,
//    keeps the fit with the smallest weighted error (largest sum(w q x)^2 / sum(w q^2)) and
//    recomputes the indices for it.
// Blocks with max|x| < 1e-15 get d = 0.
float fit_iq4_nl_block(const float* x, uint8_t* index, int ntry) {
    constexpr float kFirst = kValuesIQ4NL[0];
    float weight[32];
    std::fill(index, index + 32, uint8_t{0});
    float amax = 0.0f, max = 0.0f;
    for (int l = 0; l < 32; ++l) {
        weight[l] = x[l] * x[l];
        if (std::fabs(x[l]) > amax) {
            amax = std::fabs(x[l]);
            max = x[l];
        }
    }
    float d = 0.0f;
    if (amax >= 1e-15f) {
        // sum(w q x) and sum(w q^2) for the indices of the inverse scale id, stored when `keep`.
        auto fit = [&](float id, bool keep, float& sumqx, float& sumq2) {
            sumqx = sumq2 = 0.0f;
            for (int l = 0; l < 32; ++l) {
                const int k = nearest_iq4_nl(id * x[l]);
                if (keep) index[l] = static_cast<uint8_t>(k);
                const float q = kValuesIQ4NL[k];
                sumqx += weight[l] * q * x[l];
                sumq2 += weight[l] * q * q;
            }
        };
        float sumqx, sumq2;
        fit(1.0f / (ntry > 0 ? -max / kFirst : max / kFirst), true, sumqx, sumq2);
        d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
        float best = d * sumqx;
        for (int t = -ntry; t <= ntry; ++t) {
            fit(static_cast<float>(t + kValuesIQ4NL[0]) / max, false, sumqx, sumq2);
            if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
    }
    if (ntry > 0) {
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int l = 0; l < 32; ++l) index[l] = static_cast<uint8_t>(nearest_iq4_nl(id * x[l]));
    }
    return d;
}
void quant_iq4_nl_block(const float* x, BlockIQ4_NL& y, int ntry) {
    uint8_t index[32];
    y.d = fp32_to_fp16(fit_iq4_nl_block(x, index, ntry));
    for (int l = 0; l < 16; ++l) y.qs[l] = static_cast<uint8_t>(index[l] | (index[l + 16] << 4));
}

// ntry -1: llama.cpp's quantize_row_iq4_nl_ref, what its CPU backend writes to an IQ4_NL KV cache.
// ntry 7: its quantize_iq4_nl (the weight quantizer) without an importance matrix.
void quant_iq4_nl(const float* x, BlockIQ4_NL* y, int64_t nb, int ntry) {
    for (int64_t i = 0; i < nb; ++i) quant_iq4_nl_block(x + 32 * i, y[i], ntry);
}

// IQ4_XS, as llama.cpp builds it from IQ4_NL blocks without an importance matrix: each sub-block's
// scale fitted as IQ4_NL's (with its scale search, the fitted float kept), the super-block scale
// d = -max / 32 from the largest of them in magnitude, each sub-block scale rounded to d * l (l in
// -32 .. 31), and the indices recomputed for d * l with the unrounded d, as llama.cpp does.
void quant_iq4_xs(const float* x, BlockIQ4_XS* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += kQK) {
        float scales[kQK / 32];
        float max_scale = 0.0f, amax = 0.0f;
        for (int ib = 0; ib < kQK / 32; ++ib) {
            uint8_t unused[32];
            scales[ib] = fit_iq4_nl_block(x + 32 * ib, unused, 7);
            if (std::fabs(scales[ib]) > amax) amax = std::fabs(scales[ib]), max_scale = scales[ib];
        }
        BlockIQ4_XS& out = y[i];
        out = BlockIQ4_XS{};
        const float d = -max_scale / 32.0f;
        out.d = fp32_to_fp16(d);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int ib = 0; ib < kQK / 32; ++ib) {
            const int l = std::clamp(static_cast<int>(std::lrint(id * scales[ib])), -32, 31);
            const int ls = l + 32;
            out.scales_l[ib / 2] |= static_cast<uint8_t>((ls & 0xF) << (4 * (ib % 2)));
            out.scales_h |= static_cast<uint16_t>((ls >> 4) << (2 * ib));
            const float dl = d * static_cast<float>(l);
            const float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
            uint8_t index[32];
            for (int j = 0; j < 32; ++j) index[j] = static_cast<uint8_t>(nearest_iq4_nl(idl * x[32 * ib + j]));
            for (int j = 0; j < 16; ++j) out.qs[16 * ib + j] = static_cast<uint8_t>(index[j] | (index[j + 16] << 4));
        }
    }
}

// TQ1_0 and TQ2_0 as llama.cpp's quantize_row_tq*_0_ref: d = max |x| of the super-block, each value
// rounded (half away from zero) to -1, 0 or 1 in units of d, stored as t = 0..2.
int ternary(float x, float id) {
    return static_cast<int>(std::lround(x * id)) + 1;
}
float ternary_scale(const float* x, BlockTQ1_0& y) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    y.d = fp32_to_fp16(amax);
    return amax != 0.0f ? 1.0f / amax : 0.0f;
}

// Five trits in a byte: the base-3 number t0 t1 t2 t3 t4 (t0 most significant) as the fraction
// ceil(value * 256 / 243) / 256, so that trit n is the integer part of 3 * (fraction * 3^n mod 1).
uint8_t pack_trits(const int* t, int count) {
    int q = 0;
    for (int k = 0; k < count; ++k) q = 3 * q + t[k];
    for (int k = count; k < 5; ++k) q *= 3;  // the first trit the most significant of five
    return static_cast<uint8_t>((q * 256 + 242) / 243);
}

void quant_tq1_0(const float* x, BlockTQ1_0* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += kQK) {
        const float id = ternary_scale(x, y[i]);
        int t[5];
        for (int m = 0; m < 32; ++m) {  // elements m + 32 n
            for (int n = 0; n < 5; ++n) t[n] = ternary(x[m + 32 * n], id);
            y[i].qs[m] = pack_trits(t, 5);
        }
        for (int m = 0; m < 16; ++m) {  // elements 160 + m + 16 n
            for (int n = 0; n < 5; ++n) t[n] = ternary(x[160 + m + 16 * n], id);
            y[i].qs[32 + m] = pack_trits(t, 5);
        }
        for (int j = 0; j < 4; ++j) {  // elements 240 + j + 4 n
            for (int n = 0; n < 4; ++n) t[n] = ternary(x[240 + j + 4 * n], id);
            y[i].qh[j] = pack_trits(t, 4);
        }
    }
}

void quant_tq2_0(const float* x, BlockTQ2_0* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += kQK) {
        float amax = 0.0f;
        for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
        y[i].d = fp32_to_fp16(amax);
        const float id = amax != 0.0f ? 1.0f / amax : 0.0f;
        for (int h = 0; h < 2; ++h) {
            for (int m = 0; m < 32; ++m) {
                int q = 0;
                for (int n = 0; n < 4; ++n) q |= (ternary(x[128 * h + 32 * n + m], id) & 3) << (2 * n);
                y[i].qs[32 * h + m] = static_cast<uint8_t>(q);
            }
        }
    }
}

// MXFP4 as llama.cpp's quantize_row_mxfp4_ref: the shared exponent e = floor(log2(max |x|)) - 2 + 127
// (so max |x| lands in e2m1's top binade, 4 .. 6 times 2^(e - 127)), each value the nearest of the 16
// (the first on ties).
void quant_mxfp4(const float* x, BlockMXFP4* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += 32) {
        float amax = 0.0f;
        for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(x[l]));
        int e = 0;
        if (amax > 0.0f) e = std::clamp(static_cast<int>(std::floor(std::log2(amax)) - 2.0f + 127.0f), 0, 255);
        y[i].e = static_cast<uint8_t>(e);
        const float d = mxfp4_scale_half(y[i].e);
        auto nearest = [d](float v) {
            int best = 0;
            float best_err = std::fabs(static_cast<float>(kValuesMXFP4[0]) * d - v);
            for (int k = 1; k < 16; ++k) {
                const float err = std::fabs(static_cast<float>(kValuesMXFP4[k]) * d - v);
                if (err < best_err) best = k, best_err = err;
            }
            return best;
        };
        for (int l = 0; l < 16; ++l) y[i].qs[l] = static_cast<uint8_t>(nearest(x[l]) | (nearest(x[l + 16]) << 4));
    }
}

template <typename Block>
Block* as(void* p) {
    return static_cast<Block*>(p);
}

}  // namespace

bool is_grid_iquant(GgmlType type) {
    switch (type) {
        case GgmlType::IQ3_XXS:
        case GgmlType::IQ3_S:
        case GgmlType::IQ2_XXS:
        case GgmlType::IQ2_XS:
        case GgmlType::IQ2_S:
        case GgmlType::IQ1_S:
        case GgmlType::IQ1_M:
            return true;
        default:
            return false;
    }
}

// The reference codecs exist in pairs: every type that dequantizes also quantizes.
bool can_quantize(GgmlType type) {
    return !is_grid_iquant(type) && can_dequantize(type);
}

void quantize_row_at(Isa isa, GgmlType type, const float* src, void* dst, int64_t n) {
    const int64_t nb = whole_blocks("quantize_row", type, n, can_quantize(type));
    // The activation formats, quantized for every matmul of a prompt: AVX2 where the CPU has it,
    // with results identical to the scalar code (quantize_test.cpp checks).
    if (isa >= Isa::Avx2) {
        switch (type) {
            case GgmlType::Q8_0:
                return detail::quant_q8_0_avx2(src, as<BlockQ8_0>(dst), nb);
            case GgmlType::Q8_1:
                return detail::quant_q8_1_avx2(src, as<BlockQ8_1>(dst), nb);
            case GgmlType::Q8_K:
                return detail::quant_q8_K_avx2(src, as<BlockQ8_K>(dst), nb);
            default:
                break;
        }
    }
    switch (type) {
        case GgmlType::F32:
            std::copy(src, src + n, as<float>(dst));
            return;
        case GgmlType::F16:
            for (int64_t i = 0; i < n; ++i) as<uint16_t>(dst)[i] = fp32_to_fp16(src[i]);
            return;
        case GgmlType::BF16:
            for (int64_t i = 0; i < n; ++i) as<uint16_t>(dst)[i] = fp32_to_bf16(src[i]);
            return;
        case GgmlType::Q4_0:
            return quant_symmetric32<BlockQ4_0, 4>(src, as<BlockQ4_0>(dst), nb);
        case GgmlType::Q4_1:
            return quant_affine32<BlockQ4_1, 4>(src, as<BlockQ4_1>(dst), nb);
        case GgmlType::Q5_0:
            return quant_symmetric32<BlockQ5_0, 5>(src, as<BlockQ5_0>(dst), nb);
        case GgmlType::Q5_1:
            return quant_affine32<BlockQ5_1, 5>(src, as<BlockQ5_1>(dst), nb);
        case GgmlType::Q8_0:
            return quant_q8_blocks(src, as<BlockQ8_0>(dst), nb);
        case GgmlType::Q8_1:
            return quant_q8_blocks(src, as<BlockQ8_1>(dst), nb);
        case GgmlType::IQ4_NL:
            return quant_iq4_nl(src, as<BlockIQ4_NL>(dst), nb, -1);
        case GgmlType::IQ4_XS:
            return quant_iq4_xs(src, as<BlockIQ4_XS>(dst), nb);
        case GgmlType::TQ1_0:
            return quant_tq1_0(src, as<BlockTQ1_0>(dst), nb);
        case GgmlType::TQ2_0:
            return quant_tq2_0(src, as<BlockTQ2_0>(dst), nb);
        case GgmlType::MXFP4:
            return quant_mxfp4(src, as<BlockMXFP4>(dst), nb);
        case GgmlType::Q2_K:
            return quant_q2_K(src, as<BlockQ2_K>(dst), nb);
        case GgmlType::Q3_K:
            return quant_q3_K(src, as<BlockQ3_K>(dst), nb);
        case GgmlType::Q4_K:
            return quant_q4_5_K(src, as<BlockQ4_K>(dst), nb);
        case GgmlType::Q5_K:
            return quant_q4_5_K(src, as<BlockQ5_K>(dst), nb);
        case GgmlType::Q6_K:
            return quant_q6_K(src, as<BlockQ6_K>(dst), nb);
        case GgmlType::Q8_K:
            return quant_q8_K(src, as<BlockQ8_K>(dst), nb);
        default:
            return;  // unreachable: checked above
    }
}

void quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
    static const Isa isa = host_cpu_features().best_isa();
    quantize_row_at(isa, type, src, dst, n);
}

void quantize_row_iq4_nl_searched(const float* src, void* dst, int64_t n) {
    const int64_t nb = whole_blocks("quantize_row_iq4_nl_searched", GgmlType::IQ4_NL, n, true);
    quant_iq4_nl(src, as<BlockIQ4_NL>(dst), nb, 7);
}

}  // namespace fitllm::quant
