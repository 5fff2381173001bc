// AVX2 + FMA + F16C kernels of llama.cpp's batch order for Q3_K, Q5_K, Q6_K (gemm_batch_ref.cpp
// defines the arithmetic; these give its bits). Compiled with -mavx2 -mfma -mf16c; see
// dot_kernels.h for the rules this file follows.
//
// Each 32 quants of a weight super-block are unpacked once, with their scales, and multiplied with
// the same 32 activations of up to 8 tokens, whose integer sums stay in registers for the whole
// super-block. The sums are then reduced to one lane per token, so the float steps of the 8 tokens
// run side by side in one register: r = float(sum) * d_w (Q5_K: minus dmin_w * float(mins sum),
// fused), out = fma(r, d_a, out).
#include <immintrin.h>

#include <cstring>
#include <type_traits>
#include <utility>

#include "quant/blocks.h"
#include "quant/dot_iq_avx2.h"
#include "quant/gemm_batch_kernels.h"
#include "quant/kquant_avx2.h"
#include "quant/unroll.h"

namespace fitllm::quant::detail {
namespace {

constexpr int kTok = 8;

// ---- One weight super-block ----
// prepare() unpacks what the whole super-block shares: the sub-block scales as words, and the mins
// (Q5_K: 16 words to madd with the 16 bsums) or the offset correction (Q3_K, Q6_K: -offset *
// scale_j as words, likewise). chunk<k>() gives elements 32k .. 32k + 31 as unsigned bytes and
// their scales lined up with maddubs' pair sums.
struct Prepared {
    __m256i scales;
    __m256i corr;
    float d, dmin;
};

struct Q5K {
    using Block = BlockQ5_K;
    static constexpr bool kMins = true;
    static Prepared prepare(const Block& b) {
        const __m128i packed = q4k_scales_mins(b.scales);
        // Each min twice: sub-block j of 32 covers bsums 2j and 2j + 1.
        const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(packed, 8));
        return {_mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(packed)),
                _mm256_set_m128i(_mm_unpackhi_epi16(mins, mins), _mm_unpacklo_epi16(mins, mins)), f16(b.d),
                f16(b.dmin)};
    }
    template <int k>
    static void chunk(const Block& b, const Prepared& p, __m256i& q, __m256i& sc) {
        const __m256i nibble = _mm256_set1_epi8(0x0F);
        const __m256i bytes = load256(b.qs + 32 * (k / 2));  // sub-block k: low (k even) or high nibbles
        q = _mm256_and_si256(k % 2 == 0 ? bytes : _mm256_srli_epi16(bytes, 4), nibble);
        q = _mm256_or_si256(q, move_bit<k, 4>(load256(b.qh)));
        sc = pick_words<k, k>(p.scales);
    }
};

// -offset * scales as words: the correction of Q3_K / Q6_K, whose stored quants are q + offset.
template <int kShift>
__m256i offset_words(__m256i scales) {
    return _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(scales, kShift));
}

// Q3_K, Q6_K: elements 128 h + 32 g + l (k = 4h + g) are sub-blocks 8h + 2g (low lane) and
// 8h + 2g + 1 (high lane).
template <int k>
__m256i sixteen_scales(const Prepared& p) {
    return pick_words<2 * (k % 4), 2 * (k % 4) + 1>(scale_half<k / 4>(p.scales));
}

struct Q3K {
    using Block = BlockQ3_K;
    static constexpr bool kMins = false;
    static Prepared prepare(const BlockQ3_K& b) {
        const __m256i scales = _mm256_cvtepi8_epi16(q3k_scales(b.scales));
        return {scales, offset_words<2>(scales), f16(b.d), 0.0f};  // q in 0..7 stands for q - 4
    }
    template <int k>
    static void chunk(const BlockQ3_K& b, const Prepared& p, __m256i& q, __m256i& sc) {
        const __m256i low =
            _mm256_and_si256(_mm256_srli_epi16(load256(b.qs + 32 * (k / 4)), 2 * (k % 4)), _mm256_set1_epi8(3));
        q = _mm256_or_si256(low, move_bit<k, 2>(load256(b.hmask)));  // bit 4h + g = k of hmask
        sc = sixteen_scales<k>(p);
    }
};

struct Q6K {
    using Block = BlockQ6_K;
    static constexpr bool kMins = false;
    static Prepared prepare(const BlockQ6_K& b) {
        const __m256i scales = _mm256_cvtepi8_epi16(load128(b.scales));
        return {scales, offset_words<5>(scales), f16(b.d), 0.0f};  // q in 0..63 stands for q - 32
    }
    template <int k>
    static void chunk(const BlockQ6_K& b, const Prepared& p, __m256i& q, __m256i& sc) {
        constexpr int h = k / 4, g = k % 4;
        const __m256i ql = load256(b.ql + 64 * h + 32 * (g % 2));
        const __m256i low = _mm256_and_si256(g < 2 ? ql : _mm256_srli_epi16(ql, 4), _mm256_set1_epi8(0x0F));
        const __m256i qh = load256(b.qh + 32 * h);
        __m256i high;  // bits 2g, 2g + 1 of qh to bits 4, 5
        if constexpr (g < 2)
            high = _mm256_slli_epi16(qh, 4 - 2 * g);
        else if constexpr (g == 2)
            high = qh;
        else
            high = _mm256_srli_epi16(qh, 2);
        q = _mm256_or_si256(low, _mm256_and_si256(high, _mm256_set1_epi8(0x30)));
        sc = sixteen_scales<k>(p);
    }
};

// tree8(v)[t] = the sum of the 8 lanes of v[t] (exact): the integer totals of 8 tokens, one per lane.
[[gnu::always_inline]] inline __m256i tree8(const __m256i* v) {
    const __m256i q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    const __m128i t03 = _mm_add_epi32(_mm256_castsi256_si128(q0), _mm256_extracti128_si256(q0, 1));
    const __m128i t47 = _mm_add_epi32(_mm256_castsi256_si128(q1), _mm256_extracti128_si256(q1, 1));
    return _mm256_set_m128i(t47, t03);
}

// Every row of w times kT <= 8 tokens (lanes kT.. of the float steps see zeros and are dropped).
template <typename K, int kT>
void rows_times_tokens(int n, int n_rows, const uint8_t* w, size_t w_stride, const uint8_t* act, size_t act_stride,
                       float* y, size_t y_stride) {
    using Block = typename K::Block;
    const BlockQ8_K* a[kT];
    for (int t = 0; t < kT; ++t) a[t] = as<BlockQ8_K>(act + static_cast<size_t>(t) * act_stride);
    for (int r = 0; r < n_rows; ++r) {
        const Block* x = as<Block>(w + static_cast<size_t>(r) * w_stride);
        __m256 out = _mm256_setzero_ps();
        for (int i = 0; i < n / kQK; ++i) {
            const Block& b = x[i];
            const Prepared p = K::prepare(b);
            __m256i sums[kTok], mins[kTok];
            unroll<kTok>(
                [&](auto t_) { sums[decltype(t_)::value] = mins[decltype(t_)::value] = _mm256_setzero_si256(); });
            unroll<8>([&](auto k_) {
                constexpr int k = decltype(k_)::value;
                __m256i q, sc;
                K::template chunk<k>(b, p, q, sc);
                unroll<kT>([&](auto t_) {
                    constexpr int t = decltype(t_)::value;
                    const __m256i pairs = _mm256_maddubs_epi16(q, load256(a[t][i].qs + 32 * k));
                    sums[t] = _mm256_add_epi32(sums[t], _mm256_madd_epi16(pairs, sc));
                });
            });
            alignas(32) float d_a[kTok] = {};
            unroll<kT>([&](auto t_) {
                constexpr int t = decltype(t_)::value;
                const BlockQ8_K& yb = a[t][i];
                const __m256i corr = _mm256_madd_epi16(load256(yb.bsums), p.corr);
                if constexpr (K::kMins)
                    mins[t] = corr;
                else
                    sums[t] = _mm256_add_epi32(sums[t], corr);
                d_a[t] = yb.d;
            });
            __m256 block = _mm256_mul_ps(_mm256_cvtepi32_ps(tree8(sums)), _mm256_set1_ps(p.d));
            if constexpr (K::kMins)
                block = _mm256_fnmadd_ps(_mm256_set1_ps(p.dmin), _mm256_cvtepi32_ps(tree8(mins)), block);
            out = _mm256_fmadd_ps(block, _mm256_load_ps(d_a), out);
        }
        alignas(32) float lanes[kTok];
        _mm256_store_ps(lanes, out);
        for (int t = 0; t < kT; ++t) y[t * y_stride + static_cast<size_t>(r)] = lanes[t];
    }
}

template <typename K>
void gemm(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride, float* y,
          size_t y_stride) {
    const auto* wb = as<uint8_t>(w);
    const auto* ab = as<uint8_t>(act);
    int t = 0;
    auto pass = [&](auto kind) {
        constexpr int kT = decltype(kind)::value;
        rows_times_tokens<K, kT>(n, n_rows, wb, w_stride, ab + static_cast<size_t>(t) * act_stride, act_stride,
                                 y + static_cast<size_t>(t) * y_stride, y_stride);
        t += kT;
    };
    while (n_tok - t >= kTok) pass(std::integral_constant<int, kTok>{});
    if (n_tok - t >= 4) pass(std::integral_constant<int, 4>{});
    if (n_tok - t >= 2) pass(std::integral_constant<int, 2>{});
    if (n_tok - t >= 1) pass(std::integral_constant<int, 1>{});
}

}  // namespace

GemmFn tiled_order_avx2(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::Q3_K:
            return gemm<Q3K>;
        case GgmlType::Q5_K:
            return gemm<Q5K>;
        case GgmlType::Q6_K:
            return gemm<Q6K>;
        default:
            return iq::tiled_gemm(weight_type);  // the grid i-quants (dot_iq_avx2.h), or nullptr
    }
}

}  // namespace fitllm::quant::detail
