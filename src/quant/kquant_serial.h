#pragma once
// The float steps of the k-quant dots in dot_ref.cpp's serial order (llama.cpp's), in SSE/AVX2
// registers, shared by the AVX2 and AVX-512 dot, tile and small-batch kernels.
// Internal linkage on purpose: each file that includes this is compiled for its own ISA, and one
// shared out-of-line copy could carry another file's instructions.
#include <immintrin.h>

#include <cstdint>

namespace fitllm::quant::detail {
namespace {

// One super-block: [acc, acc_mins] += [sum(sums8), sum(mins8)] * [d_w d_a, dmin_w d_a], both
// chains in one 128-bit FMA (lanes 0 and 1); the two integer sums share their horizontal adds.
inline __m128 serial_step(__m128 acc, __m256i sums8, __m256i mins8, float d, float dmin, float d_a) {
    __m256i t = _mm256_hadd_epi32(sums8, mins8);  // s01 s23 m01 m23 | s45 s67 m45 m67
    t = _mm256_hadd_epi32(t, t);                  // s0123 m0123 .. | s4567 m4567 ..
    const __m128i both = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    return _mm_fmadd_ps(_mm_cvtepi32_ps(both), _mm_mul_ps(_mm_setr_ps(d, dmin, 0.0f, 0.0f), _mm_set1_ps(d_a)), acc);
}

// The same with the weight's scales as f16 bits (converted exactly: the same values as above).
inline __m128 serial_step(__m128 acc, __m256i sums8, __m256i mins8, uint16_t d, uint16_t dmin, float d_a) {
    const __m128 scales =
        _mm_cvtph_ps(_mm_setr_epi16(static_cast<short>(d), static_cast<short>(dmin), 0, 0, 0, 0, 0, 0));
    return serial_step(acc, sums8, mins8, _mm_cvtss_f32(scales), _mm_cvtss_f32(_mm_movehdup_ps(scales)), d_a);
}

// acc - acc_mins, the super-blocks' result.
inline float serial_result(__m128 acc) {
    return _mm_cvtss_f32(_mm_sub_ss(acc, _mm_movehdup_ps(acc)));
}

// The sum of the 8 int32 lanes, as one float (exact below 2^24, rounded as llama.cpp's cvt above).
inline __m128 sum_to_float(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtepi32_ps(s);
}

}  // namespace
}  // namespace fitllm::quant::detail
