#pragma once
// The small AVX2 helpers of the quant kernels (dot, tile, small batch, batch order): loads, sums
// across lanes, byte and word shuffles, and the packed 6-bit scales of Q3_K / Q4_K / Q5_K unpacked
// into registers.
// Internal linkage on purpose, as kquant_serial.h: each file that includes this is compiled for its
// own ISA, and one shared out-of-line copy could carry another file's instructions.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace fitllm::quant::detail {
namespace {

template <typename T>
inline const T* as(const void* p) {
    return static_cast<const T*>(p);
}
inline float f16(uint16_t h) {
    return _cvtsh_ss(h);
}
inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
inline __m256i load256(const void* p) {
    return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
inline __m128i load128(const void* p) {
    return _mm_loadu_si128(static_cast<const __m128i*>(p));
}

// The 16 lanes lo (0..7), hi (8..15) summed in _mm512_reduce_add_ps's order (GCC's): halves, then
// quarters, then (l0 + l2) + (l1 + l3): AVX2 kernels that reproduce an AVX-512 reduction.
inline float reduce_add16(__m256 lo, __m256 hi) {
    const __m256 t = _mm256_add_ps(hi, lo);
    const __m128 u = _mm_add_ps(_mm256_extractf128_ps(t, 1), _mm256_castps256_ps128(t));
    const __m128 v = _mm_add_ps(u, _mm_shuffle_ps(u, u, _MM_SHUFFLE(1, 0, 3, 2)));  // (u0+u2, u1+u3, ..)
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, _MM_SHUFFLE(0, 1, 0, 1))));
}

// Bit kFrom of every byte moved to bit kTo, the other bits cleared.
template <int kFrom, int kTo>
inline __m256i move_bit(__m256i v) {
    if constexpr (kFrom > kTo) v = _mm256_srli_epi16(v, kFrom - kTo);
    if constexpr (kFrom < kTo) v = _mm256_slli_epi16(v, kTo - kFrom);
    return _mm256_and_si256(v, _mm256_set1_epi8(static_cast<char>(1 << kTo)));
}

// From 8 words repeated in both 128-bit lanes: word kLow in the low lane, word kHigh in the high one.
template <int kLow, int kHigh>
inline __m256i pick_words(__m256i words) {
    constexpr short lo = (2 * kLow) | ((2 * kLow + 1) << 8), hi = (2 * kHigh) | ((2 * kHigh + 1) << 8);
    return _mm256_shuffle_epi8(words, _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo)));
}

// The 16 sub-block scales of Q2_K / Q3_K / Q6_K as words: both lanes hold scales 0..7 (kHalf 0)
// or 8..15 (kHalf 1), ready for pick_words.
template <int kHalf>
inline __m256i scale_half(__m256i scales16) {
    return _mm256_permute2x128_si256(scales16, scales16, kHalf == 0 ? 0x00 : 0x11);
}

// Q4_K / Q5_K packed scales (see unpack_q4k_scales in blocks.h): bytes 0..7 scales, 8..15 mins.
inline __m128i q4k_scales_mins(const uint8_t* packed) {
    uint32_t w[3];
    std::memcpy(w, packed, 12);
    return _mm_set_epi32(static_cast<int>(((w[2] >> 4) & 0x0F0F0F0Fu) | (((w[1] >> 6) & 0x03030303u) << 4)),
                         static_cast<int>(w[1] & 0x3F3F3F3Fu),
                         static_cast<int>((w[2] & 0x0F0F0F0Fu) | (((w[0] >> 6) & 0x03030303u) << 4)),
                         static_cast<int>(w[0] & 0x3F3F3F3Fu));
}

// Q3_K packed scales (see unpack_q3k_scales in blocks.h) as 16 signed bytes.
inline __m128i q3k_scales(const uint8_t* packed) {
    uint32_t w[3];
    std::memcpy(w, packed, 12);
    const __m128i s = _mm_set_epi32(static_cast<int>(((w[1] >> 4) & 0x0F0F0F0Fu) | (((w[2] >> 6) & 0x03030303u) << 4)),
                                    static_cast<int>(((w[0] >> 4) & 0x0F0F0F0Fu) | (((w[2] >> 4) & 0x03030303u) << 4)),
                                    static_cast<int>((w[1] & 0x0F0F0F0Fu) | (((w[2] >> 2) & 0x03030303u) << 4)),
                                    static_cast<int>((w[0] & 0x0F0F0F0Fu) | ((w[2] & 0x03030303u) << 4)));
    return _mm_sub_epi8(s, _mm_set1_epi8(32));
}

}  // namespace
}  // namespace fitllm::quant::detail
