#include "quant/dequantize.h"

#include <stdexcept>
#include <string>
#include <type_traits>

#include "quant/blocks.h"

namespace fitllm::quant {
namespace {

// Each function turns nb blocks into floats; quant_of (blocks.h) knows where element e lives.
// The products are grouped as llama.cpp groups them ((d * scale) * q - dmin * min), so the
// floats come out the same.

// Q4_0, Q5_0: x = d * (q - offset).
template <typename Block, int kOffset>
void dequant_symmetric32(const Block* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += 32) {
        const float d = fp16_to_fp32(x[i].d);
        for (int l = 0; l < 32; ++l) y[l] = d * static_cast<float>(quant_of(x[i], l) - kOffset);
    }
}

// Q4_1, Q5_1: x = d * q + m.
template <typename Block>
void dequant_affine32(const Block* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += 32) {
        const float d = fp16_to_fp32(x[i].d), m = fp16_to_fp32(x[i].m);
        for (int l = 0; l < 32; ++l) y[l] = d * static_cast<float>(quant_of(x[i], l)) + m;
    }
}

template <typename Block>
void dequant_q8(const Block* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += 32) {
        const float d = fp16_to_fp32(x[i].d);
        for (int l = 0; l < 32; ++l) y[l] = d * static_cast<float>(x[i].qs[l]);
    }
}

// IQ4_NL: x = d * kValuesIQ4NL[q].
void dequant_iq4_nl(const BlockIQ4_NL* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += 32) {
        const float d = fp16_to_fp32(x[i].d);
        for (int l = 0; l < 32; ++l) y[l] = d * static_cast<float>(kValuesIQ4NL[quant_of(x[i], l)]);
    }
}

// IQ4_XS: x = (d * (ls - 32)) * kValuesIQ4NL[q], per sub-block of 32.
void dequant_iq4_xs(const BlockIQ4_XS* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += kQK) {
        const float d = fp16_to_fp32(x[i].d);
        for (int e = 0; e < kQK; ++e) {
            const float dl = d * static_cast<float>(iq4_xs_scale(x[i], e / 32));
            y[e] = dl * static_cast<float>(kValuesIQ4NL[quant_of(x[i], e)]);
        }
    }
}

// TQ1_0, TQ2_0: x = (t - 1) * d.
template <typename Block>
void dequant_ternary(const Block* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += kQK) {
        const float d = fp16_to_fp32(x[i].d);
        for (int e = 0; e < kQK; ++e) y[e] = static_cast<float>(quant_of(x[i], e) - 1) * d;
    }
}

// MXFP4: x = kValuesMXFP4[q] * 2^(e - 128).
void dequant_mxfp4(const BlockMXFP4* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += 32) {
        const float d = mxfp4_scale_half(x[i].e);
        for (int l = 0; l < 32; ++l) y[l] = static_cast<float>(kValuesMXFP4[quant_of(x[i], l)]) * d;
    }
}

// The grid i-quants, in ggml's float steps: IQ3_XXS x = (d * (0.5 + s) * 0.5) * v, IQ2 x =
// (d * (0.5 + s) * 0.25) * v, IQ3_S x = (d * (1 + 2 s)) * v; v the signed grid value, s per
// half sub-block (ls = 2 s + 1).
template <typename Block, void (*kSub)(const Block&, int, int8_t*, int*), int kKind>
void dequant_iq_grid(const Block* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        for (int ib = 0; ib < 8; ++ib, y += 32) {
            int8_t v[32];
            int ls[2];
            kSub(x[i], ib, v, ls);
            for (int h = 0; h < 2; ++h) {
                const float s = static_cast<float>((ls[h] - 1) / 2);
                const float db =
                    kKind == 1 ? d * static_cast<float>(ls[h]) : d * (0.5f + s) * (kKind == 4 ? 0.5f : 0.25f);
                for (int l = 16 * h; l < 16 * h + 16; ++l) y[l] = db * static_cast<float>(v[l]);
            }
        }
    }
}

// IQ1_S, IQ1_M: x = (d * ls) * (g + delta), delta = +-1/8: ggml's float steps.
template <typename Block, void (*kSub)(const Block&, int, int8_t*, int*, int*)>
void dequant_iq1(const Block* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        float d;
        if constexpr (std::is_same_v<Block, BlockIQ1_M>) {
            d = fp16_to_fp32(iq1m_scale(x[i]));
        } else {
            d = fp16_to_fp32(x[i].d);
        }
        for (int ib = 0; ib < 8; ++ib, y += 32) {
            int8_t v[32];
            int delta[4], ls[2];
            kSub(x[i], ib, v, delta, ls);
            for (int l = 0; l < 32; ++l) {
                const float dl = d * static_cast<float>(ls[l / 16]);
                y[l] = dl * (static_cast<float>(v[l]) + (delta[l / 8] < 0 ? -0.125f : 0.125f));
            }
        }
    }
}

void dequant_q2_K(const BlockQ2_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += kQK) {
        const float d = fp16_to_fp32(x[i].d), dmin = fp16_to_fp32(x[i].dmin);
        for (int e = 0; e < kQK; ++e) {
            const uint8_t sc = x[i].scales[e / 16];
            y[e] = d * static_cast<float>(sc & 0x0F) * static_cast<float>(quant_of(x[i], e)) -
                   dmin * static_cast<float>(sc >> 4);
        }
    }
}

void dequant_q3_K(const BlockQ3_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += kQK) {
        const float d = fp16_to_fp32(x[i].d);
        const KScales16 s = unpack_q3k_scales(x[i].scales);
        for (int e = 0; e < kQK; ++e) {
            y[e] = d * static_cast<float>(s.scales[e / 16]) * static_cast<float>(quant_of(x[i], e) - 4);
        }
    }
}

// Q4_K and Q5_K share the scale layout.
template <typename Block>
void dequant_q4_5_K(const Block* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += kQK) {
        const float d = fp16_to_fp32(x[i].d), dmin = fp16_to_fp32(x[i].dmin);
        const KScalesMins sm = unpack_q4k_scales(x[i].scales);
        for (int e = 0; e < kQK; ++e) {
            y[e] = d * static_cast<float>(sm.scales[e / 32]) * static_cast<float>(quant_of(x[i], e)) -
                   dmin * static_cast<float>(sm.mins[e / 32]);
        }
    }
}

void dequant_q6_K(const BlockQ6_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += kQK) {
        const float d = fp16_to_fp32(x[i].d);
        for (int e = 0; e < kQK; ++e) {
            y[e] = d * static_cast<float>(x[i].scales[e / 16]) * static_cast<float>(quant_of(x[i], e) - 32);
        }
    }
}

void dequant_q8_K(const BlockQ8_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += kQK) {
        for (int e = 0; e < kQK; ++e) y[e] = x[i].d * static_cast<float>(x[i].qs[e]);
    }
}

template <typename Block>
const Block* as(const void* p) {
    return static_cast<const Block*>(p);
}

}  // namespace

bool can_dequantize(GgmlType type) {
    switch (type) {
        case GgmlType::F32:
        case GgmlType::F16:
        case GgmlType::BF16:
        case GgmlType::Q4_0:
        case GgmlType::Q4_1:
        case GgmlType::Q5_0:
        case GgmlType::Q5_1:
        case GgmlType::Q8_0:
        case GgmlType::Q8_1:
        case GgmlType::IQ4_NL:
        case GgmlType::IQ4_XS:
        case GgmlType::TQ1_0:
        case GgmlType::TQ2_0:
        case GgmlType::MXFP4:
        case GgmlType::IQ3_XXS:
        case GgmlType::IQ3_S:
        case GgmlType::IQ2_XXS:
        case GgmlType::IQ2_XS:
        case GgmlType::IQ2_S:
        case GgmlType::IQ1_S:
        case GgmlType::IQ1_M:
        case GgmlType::Q2_K:
        case GgmlType::Q3_K:
        case GgmlType::Q4_K:
        case GgmlType::Q5_K:
        case GgmlType::Q6_K:
        case GgmlType::Q8_K:
            return true;
        default:
            return false;
    }
}

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
    const int64_t nb = whole_blocks("dequantize_row", type, n, can_dequantize(type));
    switch (type) {
        case GgmlType::F32: {
            const auto* x = as<float>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = x[i];
            return;
        }
        case GgmlType::F16: {
            const auto* x = as<uint16_t>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(x[i]);
            return;
        }
        case GgmlType::BF16: {
            const auto* x = as<uint16_t>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(x[i]);
            return;
        }
        case GgmlType::Q4_0:
            return dequant_symmetric32<BlockQ4_0, 8>(as<BlockQ4_0>(src), dst, nb);
        case GgmlType::Q4_1:
            return dequant_affine32(as<BlockQ4_1>(src), dst, nb);
        case GgmlType::Q5_0:
            return dequant_symmetric32<BlockQ5_0, 16>(as<BlockQ5_0>(src), dst, nb);
        case GgmlType::Q5_1:
            return dequant_affine32(as<BlockQ5_1>(src), dst, nb);
        case GgmlType::Q8_0:
            return dequant_q8(as<BlockQ8_0>(src), dst, nb);
        case GgmlType::Q8_1:
            return dequant_q8(as<BlockQ8_1>(src), dst, nb);
        case GgmlType::IQ4_NL:
            return dequant_iq4_nl(as<BlockIQ4_NL>(src), dst, nb);
        case GgmlType::IQ4_XS:
            return dequant_iq4_xs(as<BlockIQ4_XS>(src), dst, nb);
        case GgmlType::TQ1_0:
            return dequant_ternary(as<BlockTQ1_0>(src), dst, nb);
        case GgmlType::TQ2_0:
            return dequant_ternary(as<BlockTQ2_0>(src), dst, nb);
        case GgmlType::MXFP4:
            return dequant_mxfp4(as<BlockMXFP4>(src), dst, nb);
        case GgmlType::IQ3_XXS:
            return dequant_iq_grid<BlockIQ3_XXS, iq3xxs_subblock, 4>(as<BlockIQ3_XXS>(src), dst, nb);
        case GgmlType::IQ3_S:
            return dequant_iq_grid<BlockIQ3_S, iq3s_subblock, 1>(as<BlockIQ3_S>(src), dst, nb);
        case GgmlType::IQ2_XXS:
            return dequant_iq_grid<BlockIQ2_XXS, iq2xxs_subblock, 8>(as<BlockIQ2_XXS>(src), dst, nb);
        case GgmlType::IQ2_XS:
            return dequant_iq_grid<BlockIQ2_XS, iq2xs_subblock, 8>(as<BlockIQ2_XS>(src), dst, nb);
        case GgmlType::IQ2_S:
            return dequant_iq_grid<BlockIQ2_S, iq2s_subblock, 8>(as<BlockIQ2_S>(src), dst, nb);
        case GgmlType::IQ1_S:
            return dequant_iq1<BlockIQ1_S, iq1s_subblock>(as<BlockIQ1_S>(src), dst, nb);
        case GgmlType::IQ1_M:
            return dequant_iq1<BlockIQ1_M, iq1m_subblock>(as<BlockIQ1_M>(src), dst, nb);
        case GgmlType::Q2_K:
            return dequant_q2_K(as<BlockQ2_K>(src), dst, nb);
        case GgmlType::Q3_K:
            return dequant_q3_K(as<BlockQ3_K>(src), dst, nb);
        case GgmlType::Q4_K:
            return dequant_q4_5_K(as<BlockQ4_K>(src), dst, nb);
        case GgmlType::Q5_K:
            return dequant_q4_5_K(as<BlockQ5_K>(src), dst, nb);
        case GgmlType::Q6_K:
            return dequant_q6_K(as<BlockQ6_K>(src), dst, nb);
        case GgmlType::Q8_K:
            return dequant_q8_K(as<BlockQ8_K>(src), dst, nb);
        default:
            return;  // unreachable: checked above
    }
}

}  // namespace fitllm::quant
