#pragma once
// The small AVX-512 helpers of the k-quant kernels (dot, tile, batch order), on top of the AVX2
// ones (kquant_avx2.h): 512-bit loads, the word sums with or without VNNI, and the sub-block scales
// spread over lanes. Internal linkage on purpose, as kquant_serial.h. Include <immintrin.h> first
// (the AVX-512 files silence GCC 12's warnings inside it).
#include <immintrin.h>

#include "quant/kquant_avx2.h"

namespace fitllm::quant::detail {
namespace {

inline __m512i load512(const void* p) {
    return _mm512_loadu_si512(p);
}
// 32 bytes in both halves.
inline __m512i twice(const void* p) {
    return _mm512_broadcast_i64x4(load256(p));
}

// acc + sum over word pairs of p * scales.
template <bool kVnni>
inline __m512i scaled_sum(__m512i acc, __m512i p, __m512i scales) {
    if constexpr (kVnni)
        return _mm512_dpwssd_epi32(acc, p, scales);
    else
        return _mm512_add_epi32(acc, _mm512_madd_epi16(p, scales));
}

// Per-64-bit-lane constants for the low and the high 256 bits.
inline __m512i halves64(long long lo, long long hi) {
    return _mm512_set_epi64(hi, hi, hi, hi, lo, lo, lo, lo);
}
inline __m512i halves8(int lo, int hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi8(static_cast<char>(lo))),
                              _mm256_set1_epi8(static_cast<char>(hi)), 1);
}

// Words kFirst .. kFirst + 3 of `words`, each repeated over one 128-bit lane: the scales of four
// sub-blocks of 16 for the 16-bit pair sums of 64 elements.
template <int kFirst>
inline __m512i four_scales(__m512i words) {
    constexpr auto rep = [](long long w) { return w * 0x0001000100010001LL; };
    const __m512i idx = _mm512_set_epi64(rep(kFirst + 3), rep(kFirst + 3), rep(kFirst + 2), rep(kFirst + 2),
                                         rep(kFirst + 1), rep(kFirst + 1), rep(kFirst), rep(kFirst));
    return _mm512_permutexvar_epi16(idx, words);
}

// Words kLow (low 256 bits) and kHigh (high 256 bits): the scales of two sub-blocks of 32.
template <int kLow, int kHigh>
inline __m512i two_scales(__m512i words) {
    constexpr auto rep = [](long long w) { return w * 0x0001000100010001LL; };
    return _mm512_permutexvar_epi16(halves64(rep(kLow), rep(kHigh)), words);
}

}  // namespace
}  // namespace fitllm::quant::detail
