#include "quant/block_grid.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "quant/blocks.h"

namespace fitllm::quant {
namespace {

// Scales tried around the fitted one: the fitted scale maps the largest |x| to the end of the grid
// (-8 of Q4_0's -8..7); these map it to -8.5 .. -6.5 (Q5_0: -17 .. -13), trading a little
// clipping of that one value for finer steps for the other 31.
constexpr float kSearchFactors[] = {8.0f / 8.5f, 1.0f, 8.0f / 7.5f, 8.0f / 7.0f, 8.0f / 6.5f};

// The element of x with the largest magnitude, sign kept (the first of ties, as llama.cpp picks it).
float signed_max(const float* x) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < BlockGrid::kElements; ++i) {
        if (std::fabs(x[i]) > amax) {
            amax = std::fabs(x[i]);
            max = x[i];
        }
    }
    return max;
}

void put_nibbles(const uint8_t* codes, uint8_t* qs) {
    for (int i = 0; i < 16; ++i) qs[i] = static_cast<uint8_t>((codes[i] & 0x0F) | ((codes[i + 16] & 0x0F) << 4));
}

void put_high_bits(const uint8_t* codes, uint8_t* qh) {
    uint32_t bits = 0;
    for (int i = 0; i < 32; ++i) bits |= static_cast<uint32_t>((codes[i] >> 4) & 1) << i;
    std::memcpy(qh, &bits, 4);
}

}  // namespace

bool BlockGrid::supports(GgmlType type) {
    switch (type) {
        case GgmlType::Q4_0:
        case GgmlType::Q4_1:
        case GgmlType::Q5_0:
        case GgmlType::Q5_1:
        case GgmlType::Q8_0:
        case GgmlType::IQ4_NL:
            return true;
        default:
            return false;
    }
}

BlockGrid::BlockGrid(GgmlType type, uint16_t d, uint16_t m)
    : type_(type), d_bits_(d), m_bits_(m), d_(fp16_to_fp32(d)), m_(fp16_to_fp32(m)) {
    inv_d_ = d_ != 0.0f && std::isfinite(d_) ? 1.0f / d_ : 0.0f;
    switch (type) {
        case GgmlType::Q4_0:
            offset_ = 8, max_code_ = 15;
            break;
        case GgmlType::Q5_0:
            offset_ = 16, max_code_ = 31;
            break;
        case GgmlType::Q8_0:
            offset_ = 128, max_code_ = 255;
            break;
        case GgmlType::Q4_1:
            offset_ = 0, max_code_ = 15;
            break;
        case GgmlType::Q5_1:
            offset_ = 0, max_code_ = 31;
            break;
        default:
            offset_ = 0, max_code_ = 15;
            break;  // IQ4_NL: an index into kValuesIQ4NL
    }
}

BlockGrid BlockGrid::fit(GgmlType type, const float* x, bool search) {
    if (!supports(type)) {
        throw std::invalid_argument(std::string("BlockGrid: no grid for type ") +
                                    std::string(type_name(static_cast<uint32_t>(type))));
    }
    if (type == GgmlType::Q4_1 || type == GgmlType::Q5_1) {
        const auto [lo, hi] = std::minmax_element(x, x + kElements);
        const float levels = type == GgmlType::Q4_1 ? 15.0f : 31.0f;
        return BlockGrid(type, fp32_to_fp16((*hi - *lo) / levels), fp32_to_fp16(*lo));
    }
    if (type == GgmlType::Q8_0) {
        float amax = 0.0f;
        for (int i = 0; i < kElements; ++i) amax = std::max(amax, std::fabs(x[i]));
        return BlockGrid(type, fp32_to_fp16(amax / 127.0f), 0);
    }
    // Q4_0, Q5_0, IQ4_NL: the largest |x| to the grid's negative end.
    const float end = type == GgmlType::Q4_0 ? -8.0f : type == GgmlType::Q5_0 ? -16.0f : kValuesIQ4NL[0];
    const float d = signed_max(x) / end;
    BlockGrid best(type, fp32_to_fp16(d), 0);
    if (!search) return best;
    float best_error = best.squared_error(x);
    for (float f : kSearchFactors) {
        if (f == 1.0f) continue;
        const BlockGrid g(type, fp32_to_fp16(d * f), 0);
        const float e = g.squared_error(x);
        if (e < best_error) best = g, best_error = e;
    }
    return best;
}

int BlockGrid::nearest_nl(float x) const {
    int best = 0;
    float best_distance = std::fabs(x - value(0));
    for (int c = 1; c < 16; ++c) {
        const float distance = std::fabs(x - value(c));
        if (distance < best_distance) best = c, best_distance = distance;
    }
    return best;
}

float BlockGrid::squared_error(const float* x) const {
    float e = 0.0f;
    if (type_ == GgmlType::IQ4_NL) {
        for (int i = 0; i < kElements; ++i) {
            const float r = x[i] - value(nearest(x[i]));
            e += r * r;
        }
        return e;
    }
    // nearest() and value() of the other types, in a loop the compiler vectorizes.
    constexpr float kRound = 12582912.0f;
    const float lo = static_cast<float>(-offset_), hi = static_cast<float>(max_code_ - offset_);
    float lanes[8] = {};  // 8 partial sums: a reduction the compiler may vectorize without reordering
    for (int i = 0; i < kElements; i += 8) {
        for (int l = 0; l < 8; ++l) {
            float q = ((x[i + l] - m_) * inv_d_ + kRound) - kRound;
            q = q < lo ? lo : q;
            q = q > hi ? hi : q;
            const float r = x[i + l] - (d_ * q + m_);
            lanes[l] += r * r;
        }
    }
    for (float v : lanes) e += v;
    return e;
}

void BlockGrid::write(const uint8_t* codes, void* dst) const {
    switch (type_) {
        case GgmlType::Q4_0: {
            BlockQ4_0 b{d_bits_, {}};
            put_nibbles(codes, b.qs);
            std::memcpy(dst, &b, sizeof(b));
            break;
        }
        case GgmlType::IQ4_NL: {
            BlockIQ4_NL b{d_bits_, {}};
            put_nibbles(codes, b.qs);
            std::memcpy(dst, &b, sizeof(b));
            break;
        }
        case GgmlType::Q4_1: {
            BlockQ4_1 b{d_bits_, m_bits_, {}};
            put_nibbles(codes, b.qs);
            std::memcpy(dst, &b, sizeof(b));
            break;
        }
        case GgmlType::Q5_0: {
            BlockQ5_0 b{d_bits_, {}, {}};
            put_high_bits(codes, b.qh);
            put_nibbles(codes, b.qs);
            std::memcpy(dst, &b, sizeof(b));
            break;
        }
        case GgmlType::Q5_1: {
            BlockQ5_1 b{d_bits_, m_bits_, {}, {}};
            put_high_bits(codes, b.qh);
            put_nibbles(codes, b.qs);
            std::memcpy(dst, &b, sizeof(b));
            break;
        }
        default: {  // Q8_0
            BlockQ8_0 b{d_bits_, {}};
            for (int i = 0; i < kElements; ++i) b.qs[i] = static_cast<int8_t>(codes[i] - 128);
            std::memcpy(dst, &b, sizeof(b));
            break;
        }
    }
}

}  // namespace fitllm::quant
