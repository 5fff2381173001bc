#pragma once
// The values one block of a 32-value type can hold once its scale (and min) are fixed, for a
// quantizer that picks every value itself instead of rounding the whole block at once: the K
// cache's error-feedback rounding (kv/key_transform.h) fits a grid to a block, then rounds its
// values one at a time, each after the errors of the ones before have moved it.
//
//   Q4_0, Q5_0: d * (q - 8), d * (q - 16)   Q8_0: d * q (q in -127..127)
//   Q4_1, Q5_1: d * q + m                   IQ4_NL: d * kValuesIQ4NL[q]
//
// d and m are kept as the fp16 the block stores, so value() is exactly what dequantize_row reads.
#include <cstdint>

#include "quant/blocks.h"
#include "quant/ggml_type.h"

namespace fitllm::quant {

class BlockGrid {
public:
    static constexpr int kElements = 32;

    // Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL.
    static bool supports(GgmlType type);

    // The grid for the 32 values x: the scale (and min) quantize_row fits to them, or with
    // `search` the one of five scales around it (0.94x to 1.23x, the largest |x| rounding to the
    // grid's end or a little inside it) that rounds x with the least squared error. Q4_1 / Q5_1 and
    // Q8_0 always take the fitted one (their grids are as wide as the values, or fine enough).
    // Throws std::invalid_argument for a type supports() rejects.
    static BlockGrid fit(GgmlType type, const float* x, bool search);

    // The code whose value is nearest x (codes: 0 .. 2^bits - 1; Q8_0: q + 128).
    int nearest(float x) const {
        if (type_ == GgmlType::IQ4_NL) return nearest_nl(x);
        // Round to nearest even by adding and taking off 1.5 * 2^23 (the codes are far below 2^22).
        constexpr float kRound = 12582912.0f;
        const float q = ((x - m_) * inv_d_ + kRound) - kRound + static_cast<float>(offset_);
        return static_cast<int>(q < 0.0f                            ? 0.0f
                                : q > static_cast<float>(max_code_) ? static_cast<float>(max_code_)
                                                                    : q);
    }
    float value(int code) const {
        if (type_ == GgmlType::IQ4_NL) return d_ * static_cast<float>(kValuesIQ4NL[code]);
        return d_ * static_cast<float>(code - offset_) + m_;  // m_ is 0 for the symmetric types
    }

    // The block with codes[0..31] on this grid, as quantize_row writes blocks of its type.
    void write(const uint8_t* codes, void* dst) const;

    // The grid as numbers, for vectorized rounding: every type but IQ4_NL is uniform, value(code) =
    // step() * (code - offset()) + min() and nearest(x) = clamp(round((x - min()) * inverse_step())
    // + offset(), 0, max_code()), rounding to nearest even.
    bool uniform() const { return type_ != GgmlType::IQ4_NL; }
    float step() const { return d_; }
    float inverse_step() const { return inv_d_; }
    float min() const { return m_; }
    int offset() const { return offset_; }
    int max_code() const { return max_code_; }

private:
    BlockGrid(GgmlType type, uint16_t d, uint16_t m);
    float squared_error(const float* x) const;
    int nearest_nl(float x) const;

    GgmlType type_;
    uint16_t d_bits_, m_bits_;  // the fp16 the block stores
    float d_, m_, inv_d_;
    int offset_, max_code_;  // symmetric types: value = d * (code - offset_)
};

}  // namespace fitllm::quant
