#pragma once
// Test data for the quant/ kernels: rows of every weight type, from floats or from random bytes.
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <vector>

#include "quant/blocks.h"
#include "quant/cpu_features.h"
#include "quant/dequantize.h"
#include "quant/ggml_type.h"
#include "quant/quantize.h"

namespace fitllm::quant {

// For GoogleTest messages: "avx2" rather than the enum's bytes.
inline void PrintTo(Isa isa, std::ostream* os) {
    *os << isa_name(isa);
}

}  // namespace fitllm::quant

namespace fitllm::quant::test {

// Every weight type with a dot kernel.
inline constexpr GgmlType kDotWeightTypes[] = {
    GgmlType::F32,     GgmlType::F16,    GgmlType::BF16,  GgmlType::Q4_0,    GgmlType::Q4_1,
    GgmlType::Q5_0,    GgmlType::Q5_1,   GgmlType::Q8_0,  GgmlType::Q2_K,    GgmlType::Q3_K,
    GgmlType::Q4_K,    GgmlType::Q5_K,   GgmlType::Q6_K,  GgmlType::IQ4_NL,  GgmlType::IQ4_XS,
    GgmlType::TQ1_0,   GgmlType::TQ2_0,  GgmlType::MXFP4, GgmlType::IQ3_XXS, GgmlType::IQ3_S,
    GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ1_S,   GgmlType::IQ1_M,
};

inline size_t bytes_of_row(GgmlType type, int n) {
    return *row_bytes(type, static_cast<uint64_t>(n));
}

inline std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, sigma);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

template <typename Block, typename F>
void for_each_block(std::vector<uint8_t>& data, F set) {
    auto* blocks = reinterpret_cast<Block*>(data.data());
    for (size_t i = 0; i < data.size() / sizeof(Block); ++i) set(blocks[i]);
}

// Random bits everywhere, then a sane half-precision value (magnitude 1e-3 .. 1e-1, either sign)
// in each scale field, so every quant and sub-block scale pattern shows up without inf or NaN.
inline std::vector<uint8_t> random_blocks(GgmlType type, size_t bytes, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> data(bytes);
    for (auto& b : data) b = static_cast<uint8_t>(rng());
    std::uniform_real_distribution<float> mag(1e-3f, 1e-1f);
    auto scale = [&] { return fp32_to_fp16((rng() & 1 ? -1.0f : 1.0f) * mag(rng)); };
    auto d = [&](auto& b) { b.d = scale(); };
    auto d_m = [&](auto& b) {
        b.d = scale();
        b.m = scale();
    };
    auto d_dmin = [&](auto& b) {
        b.d = scale();
        b.dmin = scale();
    };
    switch (type) {
        case GgmlType::F32: {
            const auto v = gaussian(bytes / 4, seed);
            std::memcpy(data.data(), v.data(), bytes);
            break;
        }
        case GgmlType::F16:
        case GgmlType::BF16: {
            const auto v = gaussian(bytes / 2, seed);
            for (size_t i = 0; i < v.size(); ++i) {
                const uint16_t h = type == GgmlType::F16 ? fp32_to_fp16(v[i]) : fp32_to_bf16(v[i]);
                std::memcpy(data.data() + 2 * i, &h, 2);
            }
            break;
        }
        case GgmlType::Q4_0:
            for_each_block<BlockQ4_0>(data, d);
            break;
        case GgmlType::Q5_0:
            for_each_block<BlockQ5_0>(data, d);
            break;
        case GgmlType::Q8_0:
            for_each_block<BlockQ8_0>(data, d);
            break;
        case GgmlType::IQ4_NL:
            for_each_block<BlockIQ4_NL>(data, d);
            break;
        case GgmlType::IQ4_XS:
            for_each_block<BlockIQ4_XS>(data, d);
            break;
        case GgmlType::TQ1_0:
            for_each_block<BlockTQ1_0>(data, d);
            break;
        case GgmlType::TQ2_0:
            for_each_block<BlockTQ2_0>(data, d);
            break;
        case GgmlType::IQ3_XXS:  // every byte pattern is a valid grid index / sign / scale
            for_each_block<BlockIQ3_XXS>(data, d);
            break;
        case GgmlType::IQ3_S:
            for_each_block<BlockIQ3_S>(data, d);
            break;
        case GgmlType::IQ2_XXS:
            for_each_block<BlockIQ2_XXS>(data, d);
            break;
        case GgmlType::IQ2_XS:
            for_each_block<BlockIQ2_XS>(data, d);
            break;
        case GgmlType::IQ2_S:
            for_each_block<BlockIQ2_S>(data, d);
            break;
        case GgmlType::IQ1_S:
            for_each_block<BlockIQ1_S>(data, d);
            break;
        case GgmlType::IQ1_M:  // the fp16 scale in the top nibbles of the four scale words
            for_each_block<BlockIQ1_M>(data, [&](BlockIQ1_M& b) {
                const uint16_t h = scale();
                uint16_t w[4];
                std::memcpy(w, b.scales, sizeof w);
                for (int k = 0; k < 4; ++k)
                    w[k] = static_cast<uint16_t>((w[k] & 0x0FFF) | (((h >> (4 * k)) & 15) << 12));
                std::memcpy(b.scales, w, sizeof w);
            });
            break;
        case GgmlType::MXFP4:  // shared exponents 2^-17 .. 2^0 (values up to 6)
            for_each_block<BlockMXFP4>(data, [&](BlockMXFP4& b) { b.e = static_cast<uint8_t>(110 + rng() % 18); });
            break;
        case GgmlType::Q4_1:
            for_each_block<BlockQ4_1>(data, d_m);
            break;
        case GgmlType::Q5_1:
            for_each_block<BlockQ5_1>(data, d_m);
            break;
        case GgmlType::Q2_K:
            for_each_block<BlockQ2_K>(data, d_dmin);
            break;
        case GgmlType::Q3_K:
            for_each_block<BlockQ3_K>(data, d);
            break;
        case GgmlType::Q4_K:
            for_each_block<BlockQ4_K>(data, d_dmin);
            break;
        case GgmlType::Q5_K:
            for_each_block<BlockQ5_K>(data, d_dmin);
            break;
        case GgmlType::Q6_K:
            for_each_block<BlockQ6_K>(data, d);
            break;
        default:
            break;
    }
    return data;
}

// `rows` rows of n weights: quantized Gaussian floats, or random blocks (also for the types
// quantize_row does not write: the i-quants on grids, which only quantize_model_row's searches do).
inline std::vector<uint8_t> weight_rows(GgmlType type, int rows, int n, uint32_t seed, bool from_floats) {
    const size_t row = bytes_of_row(type, n);
    if (!from_floats || !can_quantize(type)) return random_blocks(type, row * static_cast<size_t>(rows), seed);
    std::vector<uint8_t> data(row * static_cast<size_t>(rows));
    const auto x = gaussian(static_cast<size_t>(rows) * static_cast<size_t>(n), seed, 0.05f);
    for (int r = 0; r < rows; ++r) quantize_row(type, x.data() + static_cast<size_t>(r) * n, data.data() + r * row, n);
    return data;
}

inline std::vector<float> dequantized(GgmlType type, const void* row, int n) {
    std::vector<float> v(static_cast<size_t>(n));
    dequantize_row(type, row, v.data(), n);
    return v;
}

}  // namespace fitllm::quant::test
