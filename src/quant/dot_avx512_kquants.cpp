// AVX-512 (F, BW, VL; VNNI where kVnni) dots of the k-quants with Q8_K activations. Compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -mf16c; the kVnni = false kernels use no VNNI
// instruction. See dot_kernels.h for the rules this file follows.
//
// 64 elements per register: maddubs(unsigned quants, y) gives 16-bit pair sums, which are scaled
// by a register of 16-bit sub-block scales and summed to 32 bits: vpdpwssd with VNNI, madd + add
// without. Offsets and mins go through Q8_K's bsums, as in the AVX2 kernels.

// GCC 12's AVX-512 headers trip its own uninitialized-variable warnings (the _mm512_undefined_*
// helpers initialize a variable with itself); the warnings point into the header, so silence them there.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <type_traits>
#include <utility>

#include "quant/blocks.h"
#include "quant/dot_kernels.h"
#include "quant/kquant_avx512.h"
#include "quant/kquant_serial.h"
#include "quant/unroll.h"

namespace fitllm::quant::detail {
namespace {

// ---- Q4_K, Q5_K: 64 elements = sub-blocks 2c (low nibbles) and 2c + 1 (high nibbles) ----

template <typename Block, bool kVnni>
void dot_q4_5_K(int n, float* out, const void* w, const void* a) {
    constexpr bool kFive = std::is_same_v<Block, BlockQ5_K>;
    const auto* x = as<Block>(w);
    const auto* y = as<BlockQ8_K>(a);
    const __m512i nibble = _mm512_set1_epi8(0x0F), nibble_shift = halves64(0, 4);
    // The float steps of dot_ref.cpp: Q4_K serial, Q5_K lanes8 with the mins in summs.
    __m256 lanes = _mm256_setzero_ps();
    __m128 acc = _mm_setzero_ps(), acc_mins = _mm_setzero_ps();
    for (int i = 0; i < n / kQK; ++i) {
        const __m128i packed = q4k_scales_mins(x[i].scales);
        const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(packed, 8));
        const __m256i mins_twice = _mm256_set_m128i(_mm_unpackhi_epi16(mins, mins), _mm_unpacklo_epi16(mins, mins));
        const __m256i min_sums = _mm256_madd_epi16(load256(y[i].bsums), mins_twice);
        if constexpr (kFive) {
            const __m128 mins_f =
                _mm_cvtepi32_ps(_mm_set1_epi32(_mm512_reduce_add_epi32(_mm512_zextsi256_si512(min_sums))));
            acc_mins = _mm_fmadd_ss(_mm_set_ss(-y[i].d * f16(x[i].dmin)), mins_f, acc_mins);
        }

        const __m512i scales = _mm512_castsi128_si512(_mm_cvtepu8_epi16(packed));  // words 0..7
        __m512i high_bits;
        if constexpr (kFive) high_bits = twice(x[i].qh);
        __m512i sumi = _mm512_setzero_si512();
        unroll<4>([&](auto c_) {
            constexpr int c = decltype(c_)::value;
            __m512i q = _mm512_and_si512(_mm512_srlv_epi64(twice(x[i].qs + 32 * c), nibble_shift), nibble);
            if constexpr (kFive) {
                const __mmask64 fifth = _mm512_test_epi8_mask(high_bits, halves8(1 << (2 * c), 1 << (2 * c + 1)));
                q = _mm512_mask_add_epi8(q, fifth, q, _mm512_set1_epi8(16));
            }
            const __m512i p = _mm512_maddubs_epi16(q, load512(y[i].qs + 64 * c));
            sumi = scaled_sum<kVnni>(sumi, p, two_scales<2 * c, 2 * c + 1>(scales));
        });
        const __m256i sums8 = _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64(sumi, 1));
        if constexpr (kFive)
            lanes = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * f16(x[i].d)), _mm256_cvtepi32_ps(sums8), lanes);
        else
            acc = serial_step(acc, sums8, min_sums, x[i].d, x[i].dmin, y[i].d);
    }
    if constexpr (kFive)
        *out = hsum(lanes) + _mm_cvtss_f32(acc_mins);
    else
        *out = serial_result(acc);
}

// ---- Q2_K, Q3_K, Q6_K: sub-blocks of 16 ----
// Elements 128 h + 64 part + 16 k + l: the 128-bit lane k of a register of 64 elements is
// sub-block 8h + 4 part + k, scaled by four_scales<8h + 4 part>.

template <bool kVnni>
void dot_q2_K(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockQ2_K>(w);
    const auto* y = as<BlockQ8_K>(a);
    const __m512i two_bits = _mm512_set1_epi8(3);
    __m128 acc = _mm_setzero_ps();  // the serial order of dot_ref.cpp
    for (int i = 0; i < n / kQK; ++i) {
        const __m128i packed = load128(x[i].scales);
        const __m128i nibble = _mm_set1_epi8(0x0F);
        const __m256i scales = _mm256_cvtepu8_epi16(_mm_and_si128(packed, nibble));
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), nibble));
        const __m256i min_sums = _mm256_madd_epi16(load256(y[i].bsums), mins);

        const __m512i sc = _mm512_castsi256_si512(scales);
        __m512i sumi = _mm512_setzero_si512();
        unroll<2>([&](auto h_) {
            constexpr int h = decltype(h_)::value;
            const __m512i q = twice(x[i].qs + 32 * h);
            const __m512i q01 = _mm512_and_si512(_mm512_srlv_epi64(q, halves64(0, 2)), two_bits);  // groups 0, 1
            const __m512i q23 = _mm512_and_si512(_mm512_srlv_epi64(q, halves64(4, 6)), two_bits);  // groups 2, 3
            const __m512i p01 = _mm512_maddubs_epi16(q01, load512(y[i].qs + 128 * h));
            const __m512i p23 = _mm512_maddubs_epi16(q23, load512(y[i].qs + 128 * h + 64));
            sumi = scaled_sum<kVnni>(sumi, p01, four_scales<8 * h>(sc));
            sumi = scaled_sum<kVnni>(sumi, p23, four_scales<8 * h + 4>(sc));
        });
        acc = serial_step(acc, _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64(sumi, 1)),
                          min_sums, x[i].d, x[i].dmin, y[i].d);
    }
    *out = serial_result(acc);
}

template <bool kVnni>
void dot_q3_K(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockQ3_K>(w);
    const auto* y = as<BlockQ8_K>(a);
    const __m512i two_bits = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    __m256 lanes = _mm256_setzero_ps();  // the lanes8 order of dot_ref.cpp
    for (int i = 0; i < n / kQK; ++i) {
        const __m256i scales = _mm256_cvtepi8_epi16(q3k_scales(x[i].scales));
        const __m512i sc = _mm512_castsi256_si512(scales);
        const __m512i hmask = twice(x[i].hmask);
        __m512i sumi = _mm512_setzero_si512();
        unroll<2>([&](auto h_) {
            constexpr int h = decltype(h_)::value;
            const __m512i q = twice(x[i].qs + 32 * h);
            __m512i q01 = _mm512_and_si512(_mm512_srlv_epi64(q, halves64(0, 2)), two_bits);
            __m512i q23 = _mm512_and_si512(_mm512_srlv_epi64(q, halves64(4, 6)), two_bits);
            // The third bit of group g is bit 4h + g of hmask.
            q01 =
                _mm512_mask_add_epi8(q01, _mm512_test_epi8_mask(hmask, halves8(1 << (4 * h), 2 << (4 * h))), q01, four);
            q23 =
                _mm512_mask_add_epi8(q23, _mm512_test_epi8_mask(hmask, halves8(4 << (4 * h), 8 << (4 * h))), q23, four);
            // q in 0..7 stands for q - 4: the offset taken off each pair, inside llama.cpp's lanes.
            const __m512i y01 = load512(y[i].qs + 128 * h), y23 = load512(y[i].qs + 128 * h + 64);
            const __m512i p01 = _mm512_sub_epi16(_mm512_maddubs_epi16(q01, y01), _mm512_maddubs_epi16(four, y01));
            const __m512i p23 = _mm512_sub_epi16(_mm512_maddubs_epi16(q23, y23), _mm512_maddubs_epi16(four, y23));
            sumi = scaled_sum<kVnni>(sumi, p01, four_scales<8 * h>(sc));
            sumi = scaled_sum<kVnni>(sumi, p23, four_scales<8 * h + 4>(sc));
        });
        const __m256i sums8 = _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64(sumi, 1));
        lanes = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * f16(x[i].d)), _mm256_cvtepi32_ps(sums8), lanes);
    }
    *out = hsum(lanes);
}

template <bool kVnni>
void dot_q6_K(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockQ6_K>(w);
    const auto* y = as<BlockQ8_K>(a);
    const __m512i nibble = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
    __m256 lanes = _mm256_setzero_ps();  // the lanes8 order of dot_ref.cpp
    for (int i = 0; i < n / kQK; ++i) {
        const __m256i scales = _mm256_cvtepi8_epi16(load128(x[i].scales));
        // q in 0..63 stands for q - 32: subtract 32 * sum_j scale_j * bsum_j.
        const __m256i offsets = _mm256_slli_epi32(_mm256_madd_epi16(load256(y[i].bsums), scales), 5);
        const __m512i sc = _mm512_castsi256_si512(scales);
        __m512i sumi = _mm512_setzero_si512();
        unroll<2>([&](auto h_) {
            constexpr int h = decltype(h_)::value;
            const __m512i ql = load512(x[i].ql + 64 * h);  // low nibbles: groups 0, 1; high nibbles: 2, 3
            const __m512i qh = twice(x[i].qh + 32 * h);    // bits 2g, 2g + 1 of group g
            const __m512i q01 = _mm512_or_si512(_mm512_and_si512(ql, nibble),
                                                _mm512_and_si512(_mm512_sllv_epi64(qh, halves64(4, 2)), top));
            const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), nibble),
                                                _mm512_and_si512(_mm512_srlv_epi64(qh, halves64(0, 2)), top));
            const __m512i p01 = _mm512_maddubs_epi16(q01, load512(y[i].qs + 128 * h));
            const __m512i p23 = _mm512_maddubs_epi16(q23, load512(y[i].qs + 128 * h + 64));
            sumi = scaled_sum<kVnni>(sumi, p01, four_scales<8 * h>(sc));
            sumi = scaled_sum<kVnni>(sumi, p23, four_scales<8 * h + 4>(sc));
        });
        // Lane l of llama.cpp's sums: elements with (e mod 32) in [4l, 4l + 4), which sumi holds in
        // its lanes l and l + 8; offsets already has llama.cpp's lanes.
        const __m256i sums8 = _mm256_sub_epi32(
            _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64(sumi, 1)), offsets);
        lanes = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * f16(x[i].d)), _mm256_cvtepi32_ps(sums8), lanes);
    }
    *out = hsum(lanes);
}

template <bool kVnni>
DotFn table(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::Q2_K:
            return dot_q2_K<kVnni>;
        case GgmlType::Q3_K:
            return dot_q3_K<kVnni>;
        case GgmlType::Q4_K:
            return dot_q4_5_K<BlockQ4_K, kVnni>;
        case GgmlType::Q5_K:
            return dot_q4_5_K<BlockQ5_K, kVnni>;
        case GgmlType::Q6_K:
            return dot_q6_K<kVnni>;
        default:
            return nullptr;
    }
}

}  // namespace

DotFn dot_avx512_kquants(GgmlType weight_type, bool vnni) {
    return vnni ? table<true>(weight_type) : table<false>(weight_type);
}

}  // namespace fitllm::quant::detail
