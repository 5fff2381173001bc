// AVX2 + FMA + F16C dots of the k-quants with Q8_K activations (compiled with -mavx2 -mfma -mf16c;
// see dot_kernels.h for the rules this file follows).
//
// Per 32 elements: maddubs(unsigned quants, y) gives 16-bit pair sums, madd with the sub-block
// scales (as 16-bit words) turns them into 32-bit sums; a super-block's sums are converted to
// float once and scaled by d_w * d_a. Offsets (-4, -32) and mins are applied through Q8_K's
// bsums: sum over a sub-block of (q - offset) y = sum(q y) - offset * bsum.
#include <immintrin.h>

#include <utility>

#include "quant/blocks.h"
#include "quant/dot_kernels.h"
#include "quant/kquant_avx2.h"
#include "quant/kquant_serial.h"
#include "quant/unroll.h"

namespace fitllm::quant::detail {
namespace {

// ---- Q4_K, Q5_K ----

// The float steps of dot_ref.cpp: Q4_K serial, Q5_K lanes8 with the mins in summs.
template <typename Block>
void dot_q4_5_K(int n, float* out, const void* w, const void* a) {
    constexpr bool kFive = std::is_same_v<Block, BlockQ5_K>;
    const auto* x = as<Block>(w);
    const auto* y = as<BlockQ8_K>(a);
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    __m256 lanes = _mm256_setzero_ps();
    __m128 acc = _mm_setzero_ps(), acc_mins = _mm_setzero_ps();
    for (int i = 0; i < n / kQK; ++i) {
        const __m128i packed = q4k_scales_mins(x[i].scales);
        // Mins: sum_j mn_j * (bsum_2j + bsum_2j+1), each min repeated for its two bsums.
        const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(packed, 8));
        const __m256i mins_twice = _mm256_set_m128i(_mm_unpackhi_epi16(mins, mins), _mm_unpacklo_epi16(mins, mins));
        const __m256i min_sums = _mm256_madd_epi16(load256(y[i].bsums), mins_twice);
        if constexpr (kFive)
            acc_mins = _mm_fmadd_ss(_mm_set_ss(-y[i].d * f16(x[i].dmin)), sum_to_float(min_sums), acc_mins);

        const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(packed));
        __m256i high_bits;
        if constexpr (kFive) high_bits = load256(x[i].qh);
        __m256i sumi = _mm256_setzero_si256();
        unroll<4>([&](auto c_) {  // 64 elements: sub-blocks 2c (low nibbles) and 2c + 1 (high)
            constexpr int c = decltype(c_)::value;
            const __m256i q = load256(x[i].qs + 32 * c);
            __m256i lo = _mm256_and_si256(q, nibble);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble);
            if constexpr (kFive) {
                lo = _mm256_or_si256(lo, move_bit<2 * c, 4>(high_bits));
                hi = _mm256_or_si256(hi, move_bit<2 * c + 1, 4>(high_bits));
            }
            const __m256i p_lo = _mm256_maddubs_epi16(lo, load256(y[i].qs + 64 * c));
            const __m256i p_hi = _mm256_maddubs_epi16(hi, load256(y[i].qs + 64 * c + 32));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p_lo, pick_words<2 * c, 2 * c>(scales)));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p_hi, pick_words<2 * c + 1, 2 * c + 1>(scales)));
        });
        if constexpr (kFive)
            lanes = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * f16(x[i].d)), _mm256_cvtepi32_ps(sumi), lanes);
        else
            acc = serial_step(acc, sumi, min_sums, x[i].d, x[i].dmin, y[i].d);
    }
    if constexpr (kFive)
        *out = hsum(lanes) + _mm_cvtss_f32(acc_mins);
    else
        *out = serial_result(acc);
}

// ---- Q2_K, Q3_K, Q6_K: sub-blocks of 16 ----
// Elements 128 h + 32 g + l: a 256-bit group g covers sub-blocks 8h + 2g (low lane) and
// 8h + 2g + 1 (high lane), so one pick_words<2g, 2g + 1> of scale_half<h> scales a group.

void dot_q2_K(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockQ2_K>(w);
    const auto* y = as<BlockQ8_K>(a);
    const __m256i two_bits = _mm256_set1_epi8(3);
    __m128 acc = _mm_setzero_ps();  // the serial order of dot_ref.cpp
    for (int i = 0; i < n / kQK; ++i) {
        const __m128i packed = load128(x[i].scales);
        const __m128i nibble = _mm_set1_epi8(0x0F);
        const __m256i scales = _mm256_cvtepu8_epi16(_mm_and_si128(packed, nibble));
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), nibble));
        const __m256i min_sums = _mm256_madd_epi16(load256(y[i].bsums), mins);

        __m256i sumi = _mm256_setzero_si256();
        unroll<2>([&](auto h_) {
            constexpr int h = decltype(h_)::value;
            const __m256i q = load256(x[i].qs + 32 * h);
            const __m256i sc = scale_half<h>(scales);
            unroll<4>([&](auto g_) {
                constexpr int g = decltype(g_)::value;
                const __m256i e = _mm256_and_si256(_mm256_srli_epi16(q, 2 * g), two_bits);
                const __m256i p = _mm256_maddubs_epi16(e, load256(y[i].qs + 128 * h + 32 * g));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, pick_words<2 * g, 2 * g + 1>(sc)));
            });
        });
        acc = serial_step(acc, sumi, min_sums, x[i].d, x[i].dmin, y[i].d);
    }
    *out = serial_result(acc);
}

void dot_q3_K(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockQ3_K>(w);
    const auto* y = as<BlockQ8_K>(a);
    const __m256i two_bits = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / kQK; ++i) {
        const __m256i scales = _mm256_cvtepi8_epi16(q3k_scales(x[i].scales));
        const __m256i hmask = load256(x[i].hmask);
        __m256i sumi = _mm256_setzero_si256();
        unroll<2>([&](auto h_) {
            constexpr int h = decltype(h_)::value;
            const __m256i q = load256(x[i].qs + 32 * h);
            const __m256i sc = scale_half<h>(scales);
            unroll<4>([&](auto g_) {
                constexpr int g = decltype(g_)::value;
                const __m256i low = _mm256_and_si256(_mm256_srli_epi16(q, 2 * g), two_bits);
                const __m256i e = _mm256_or_si256(low, move_bit<4 * h + g, 2>(hmask));
                // q in 0..7 stands for q - 4: the offset taken off each pair, inside llama.cpp's lanes.
                const __m256i yq = load256(y[i].qs + 128 * h + 32 * g);
                const __m256i p =
                    _mm256_sub_epi16(_mm256_maddubs_epi16(e, yq), _mm256_maddubs_epi16(_mm256_set1_epi8(4), yq));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, pick_words<2 * g, 2 * g + 1>(sc)));
            });
        });
        acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * f16(x[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    *out = hsum(acc);
}

// Already llama.cpp's lanes (dot_ref.cpp): 32-element groups, 4 elements a lane, offsets per lane.
void dot_q6_K(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockQ6_K>(w);
    const auto* y = as<BlockQ8_K>(a);
    const __m256i nibble = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / kQK; ++i) {
        const __m256i scales = _mm256_cvtepi8_epi16(load128(x[i].scales));
        // q in 0..63 stands for q - 32: subtract 32 * sum_j scale_j * bsum_j.
        const __m256i offsets = _mm256_slli_epi32(_mm256_madd_epi16(load256(y[i].bsums), scales), 5);
        __m256i sumi = _mm256_setzero_si256();
        unroll<2>([&](auto h_) {
            constexpr int h = decltype(h_)::value;
            const __m256i ql0 = load256(x[i].ql + 64 * h), ql1 = load256(x[i].ql + 64 * h + 32);
            const __m256i qh = load256(x[i].qh + 32 * h);
            const __m256i sc = scale_half<h>(scales);
            unroll<4>([&](auto g_) {
                constexpr int g = decltype(g_)::value;
                const __m256i ql = g % 2 == 0 ? ql0 : ql1;
                const __m256i low = _mm256_and_si256(g < 2 ? ql : _mm256_srli_epi16(ql, 4), nibble);
                __m256i high;  // bits 2g, 2g + 1 of qh to bits 4, 5
                if constexpr (g < 2)
                    high = _mm256_slli_epi16(qh, 4 - 2 * g);
                else if constexpr (g == 2)
                    high = qh;
                else
                    high = _mm256_srli_epi16(qh, 2);
                const __m256i e = _mm256_or_si256(low, _mm256_and_si256(high, top));
                const __m256i p = _mm256_maddubs_epi16(e, load256(y[i].qs + 128 * h + 32 * g));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, pick_words<2 * g, 2 * g + 1>(sc)));
            });
        });
        sumi = _mm256_sub_epi32(sumi, offsets);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * f16(x[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    *out = hsum(acc);
}

}  // namespace

DotFn dot_avx2_kquants(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::Q2_K:
            return dot_q2_K;
        case GgmlType::Q3_K:
            return dot_q3_K;
        case GgmlType::Q4_K:
            return dot_q4_5_K<BlockQ4_K>;
        case GgmlType::Q5_K:
            return dot_q4_5_K<BlockQ5_K>;
        case GgmlType::Q6_K:
            return dot_q6_K;
        default:
            return nullptr;
    }
}

}  // namespace fitllm::quant::detail
