#pragma once
// What the IQ4_NL / IQ4_XS tiled prompt kernels (gemm_iq4_avx2.cpp, gemm_iq4_avx512.cpp) share: the
// codebook + 128 as unsigned bytes, a sub-block's nibbles unpacked through it, and where a
// sub-block's nibbles, scale and activations are. Internal linkage on purpose, as
// transpose_avx2.h: each file that includes this is compiled for its own ISA.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant/blocks.h"

namespace fitllm::quant::detail {
namespace {

inline float f16(uint16_t h) {
    return _cvtsh_ss(h);
}
inline int32_t load_i32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// The 16 codebook values + 128 as unsigned bytes, in both 128-bit lanes.
inline __m256i codebook() {
    alignas(16) uint8_t t[16];
    for (int i = 0; i < 16; ++i) t[i] = static_cast<uint8_t>(kValuesIQ4NL[i] + 128);
    return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
}

// The 32 elements of a sub-block (16 bytes of nibbles: low ones first) as codebook value + 128.
inline __m256i unpack(const uint8_t* qs, __m256i table) {
    const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m256i idx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), _mm256_set1_epi8(0x0F));
    return _mm256_shuffle_epi8(table, idx);
}

// The nibbles of sub-block s of a row (s counted from the row's start); K::W the block type,
// K::kSubs its sub-blocks of 32.
template <typename K>
inline const uint8_t* sub_qs(const typename K::W* row, int s) {
    return row[s / K::kSubs].qs + 16 * (s % K::kSubs);
}
inline int iq4_xs_ls(const BlockIQ4_XS& b, int ib) {
    const int low = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
    const int high = (b.scales_h >> (2 * ib)) & 3;
    return (low | (high << 4)) - 32;
}
// The 32 activation bytes of sub-block s of a Q8_0 / Q8_K row (s counted from the row's start).
inline const int8_t* sub_y(const BlockQ8_0* a, int s) {
    return a[s].qs;
}
inline const int8_t* sub_y(const BlockQ8_K* a, int s) {
    return a[s / 8].qs + 32 * (s % 8);
}

}  // namespace
}  // namespace fitllm::quant::detail
