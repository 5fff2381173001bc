#pragma once
// The addresses of sixteen weight rows for the AVX-512 sixteen-row matrix-vector kernels
// (dot_avx512.cpp, dot_avx512_kquants.cpp).
#include <cstddef>
#include <cstdint>

namespace fitllm::quant::detail {

// Row k of 16 (0..7 from lo, 8..15 from hi, `stride` apart) from two bases and strides 1, 3, 5, 7.
struct Rows16 {
    const uint8_t* lo;
    const uint8_t* hi;
    size_t s1, s3, s5, s7;
    const uint8_t* row(int k) const {
        const uint8_t* b = k < 8 ? lo : hi;
        switch (k & 7) {
            case 0:
                return b;
            case 1:
                return b + s1;
            case 2:
                return b + 2 * s1;
            case 3:
                return b + s3;
            case 4:
                return b + 4 * s1;
            case 5:
                return b + s5;
            case 6:
                return b + 2 * s3;
            default:
                return b + s7;
        }
    }
};

}  // namespace fitllm::quant::detail
