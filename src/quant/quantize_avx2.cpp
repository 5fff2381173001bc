// AVX2 activation quantizers (Q8_0, Q8_1, Q8_K), compiled with -mavx2 -mfma -mf16c. They round
// exactly as the scalar code of quantize.cpp: the same float operations in the same order per
// value (x * id, or iscale * x), rounded to nearest even by cvtps_epi32 as nearbyint does, and the
// fp16 scales rounded to nearest even by F16C as fp32_to_fp16 does. See dot_kernels.h for the rules
// this file follows.
#include <immintrin.h>

#include <cstdint>

#include "quant/quantize_kernels.h"

namespace fitllm::quant::detail {
namespace {

__m256 abs8(__m256 v) {
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}

float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

uint16_t to_half(float f) {
    return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}

// 32 int32 (four registers, in order) to 32 int8 with signed saturation, in order.
__m256i pack32(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);  // 128-bit lanes interleaved
    const __m256i bytes = _mm256_packs_epi16(ab, cd);
    return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

template <typename Block, bool kSum>
void quant_q8(const float* x, Block* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += 32) {
        const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8), v2 = _mm256_loadu_ps(x + 16),
                     v3 = _mm256_loadu_ps(x + 24);
        const float amax = hmax(_mm256_max_ps(_mm256_max_ps(abs8(v0), abs8(v1)), _mm256_max_ps(abs8(v2), abs8(v3))));
        const float d = amax / 127.0f;
        const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
        const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, id)), q1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, id));
        const __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, id)), q3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, id));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs), pack32(q0, q1, q2, q3));
        y[i].d = to_half(d);
        if constexpr (kSum) {
            const int32_t sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3)));
            y[i].s = to_half(d * static_cast<float>(sum));
        }
    }
}

}  // namespace

void quant_q8_0_avx2(const float* x, BlockQ8_0* y, int64_t nb) {
    quant_q8<BlockQ8_0, false>(x, y, nb);
}

void quant_q8_1_avx2(const float* x, BlockQ8_1* y, int64_t nb) {
    quant_q8<BlockQ8_1, true>(x, y, nb);
}

// The value of largest magnitude (the first of them) maps to -127; d is a float, bsums exact.
void quant_q8_K_avx2(const float* x, BlockQ8_K* y, int64_t nb) {
    constexpr int kQK = 256;
    for (int64_t i = 0; i < nb; ++i, x += kQK) {
        __m256 m = _mm256_setzero_ps();
        for (int e = 0; e < kQK; e += 8) m = _mm256_max_ps(m, abs8(_mm256_loadu_ps(x + e)));
        const float amax = hmax(m);
        BlockQ8_K& b = y[i];
        if (amax == 0.0f) {
            b.d = 0.0f;
            for (int e = 0; e < kQK; e += 32)
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(b.qs + e), _mm256_setzero_si256());
            for (int j = 0; j < kQK / 16; ++j) b.bsums[j] = 0;
            continue;
        }
        const __m256 target = _mm256_set1_ps(amax);
        int first = 0;
        for (int e = 0; e < kQK; e += 8) {
            const int hits = _mm256_movemask_ps(_mm256_cmp_ps(abs8(_mm256_loadu_ps(x + e)), target, _CMP_EQ_OQ));
            if (hits != 0) {
                first = e + __builtin_ctz(static_cast<unsigned>(hits));
                break;
            }
        }
        const float iscale = -127.0f / x[first];
        const __m256 s = _mm256_set1_ps(iscale);
        const __m256i top = _mm256_set1_epi32(127);
        for (int e = 0; e < kQK; e += 32) {
            __m256i q[4];
            for (int k = 0; k < 4; ++k) {
                q[k] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(s, _mm256_loadu_ps(x + e + 8 * k))), top);
            }
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(b.qs + e), pack32(q[0], q[1], q[2], q[3]));
            b.bsums[e / 16] = static_cast<int16_t>(hsum_i32(_mm256_add_epi32(q[0], q[1])));
            b.bsums[e / 16 + 1] = static_cast<int16_t>(hsum_i32(_mm256_add_epi32(q[2], q[3])));
        }
        b.d = 1.0f / iscale;
    }
}

}  // namespace fitllm::quant::detail
