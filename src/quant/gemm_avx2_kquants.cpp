// AVX2 + FMA + F16C tiled kernels of the k-quants with Q8_K activations (compiled with -mavx2
// -mfma -mf16c; see dot_kernels.h for the rules this file follows).
//
// The arithmetic is that of dot_avx2_kquants.cpp: per 32 elements, maddubs(unsigned quants, y)
// gives 16-bit pair sums and madd with the sub-block scales turns them into 32-bit sums; offsets
// and mins go through Q8_K's bsums. What the tiling adds: each 32 quants of a weight super-block
// are unpacked once, with their scales, and multiplied with the same 32 activations of kTok
// tokens, whose integer sums stay in registers for the whole super-block.
#include <immintrin.h>

#include <cstring>
#include <type_traits>
#include <utility>

#include "quant/blocks.h"
#include "quant/gemm_kernels.h"
#include "quant/kquant_avx2.h"
#include "quant/kquant_serial.h"
#include "quant/unroll.h"

namespace fitllm::quant::detail {
namespace {

// Tokens per pass over the weight rows: kTok integer sums, the unpacked quants and their scales
// fill the 16 registers. Remainders run as passes of 4, 2 and 1.
constexpr int kTok = 8;

// ---- One weight super-block ----
// prepare() unpacks what the whole super-block shares: the sub-block scales as words, and the mins
// (Q2_K, Q4_K, Q5_K: 16 words to madd with the 16 bsums) or the offset correction (Q3_K, Q6_K:
// -offset * scale_j as words, likewise). chunk<k>() gives elements 32k .. 32k + 31 as unsigned
// bytes and their scales lined up with maddubs' pair sums.
struct Prepared {
    __m256i scales;
    __m256i corr;
    float d, dmin;
};

template <typename B>
struct Q45K {
    using Block = B;
    static constexpr bool kMins = true;
    static constexpr int kPairOffset = 0;
    static constexpr bool kFive = std::is_same_v<Block, BlockQ5_K>;
    static constexpr bool kSerial = !kFive;  // Q4_K: serial; Q5_K: 8 lanes and summs
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
        if constexpr (kFive) q = _mm256_or_si256(q, move_bit<k, 4>(load256(b.qh)));
        sc = pick_words<k, k>(p.scales);
    }
};

// -offset * scales as words: the correction of Q3_K / Q6_K, whose stored quants are q + offset.
template <int kShift>
__m256i offset_words(__m256i scales) {
    return _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(scales, kShift));
}

// Q2_K, Q3_K, Q6_K: elements 128 h + 32 g + l (k = 4h + g) are sub-blocks 8h + 2g (low lane) and
// 8h + 2g + 1 (high lane).
template <int k>
__m256i sixteen_scales(const Prepared& p) {
    return pick_words<2 * (k % 4), 2 * (k % 4) + 1>(scale_half<k / 4>(p.scales));
}

struct Q2K {
    using Block = BlockQ2_K;
    static constexpr bool kMins = true;
    static constexpr int kPairOffset = 0;
    static constexpr bool kSerial = true;
    static Prepared prepare(const BlockQ2_K& b) {
        const __m128i packed = load128(b.scales);
        const __m128i nibble = _mm_set1_epi8(0x0F);
        return {_mm256_cvtepu8_epi16(_mm_and_si128(packed, nibble)),
                _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), nibble)), f16(b.d), f16(b.dmin)};
    }
    template <int k>
    static void chunk(const BlockQ2_K& b, const Prepared& p, __m256i& q, __m256i& sc) {
        q = _mm256_and_si256(_mm256_srli_epi16(load256(b.qs + 32 * (k / 4)), 2 * (k % 4)), _mm256_set1_epi8(3));
        sc = sixteen_scales<k>(p);
    }
};

struct Q3K {
    using Block = BlockQ3_K;
    static constexpr bool kMins = false;
    // q in 0..7 stands for q - 4, taken off each pair sum (4 y) so that it lands in llama.cpp's lanes.
    static constexpr int kPairOffset = 4;
    static constexpr bool kSerial = false;
    static Prepared prepare(const BlockQ3_K& b) {
        const __m256i scales = _mm256_cvtepi8_epi16(q3k_scales(b.scales));
        return {scales, _mm256_setzero_si256(), f16(b.d), 0.0f};  // the offset goes inside the pairs
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
    static constexpr int kPairOffset = 0;
    static constexpr bool kSerial = false;
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

// ---- The tile: every row of w times kT tokens ----

template <typename K, int kT>
void rows_times_tokens(int n, int n_rows, const uint8_t* w, size_t w_stride, const uint8_t* act, size_t act_stride,
                       float* y, size_t y_stride) {
    using Block = typename K::Block;
    const BlockQ8_K* a[kT];
    for (int t = 0; t < kT; ++t) a[t] = as<BlockQ8_K>(act + static_cast<size_t>(t) * act_stride);
    for (int r = 0; r < n_rows; ++r) {
        const Block* x = as<Block>(w + static_cast<size_t>(r) * w_stride);
        // The float steps of the dot (dot_avx2_kquants.cpp, dot_ref.cpp's order for the type): Q3_K,
        // Q6_K one 8-lane fma a block; Q5_K likewise, its mins in a scalar chain (summs); Q2_K, Q4_K
        // serial, lanes 0 (sum) and 1 (mins) of a 128-bit chain.
        __m256 acc[kT];
        __m128 acc_serial[kT], summs[kT];
        unroll<kT>([&](auto t_) {
            constexpr int t = decltype(t_)::value;
            acc[t] = _mm256_setzero_ps();
            acc_serial[t] = summs[t] = _mm_setzero_ps();
        });
        for (int i = 0; i < n / kQK; ++i) {
            const Block& b = x[i];
            const Prepared p = K::prepare(b);
            __m256i sumi[kT];
            unroll<kT>([&](auto t_) { sumi[decltype(t_)::value] = _mm256_setzero_si256(); });
            unroll<8>([&](auto k_) {
                constexpr int k = decltype(k_)::value;
                __m256i q, sc;
                K::template chunk<k>(b, p, q, sc);
                unroll<kT>([&](auto t_) {
                    constexpr int t = decltype(t_)::value;
                    const __m256i yq = load256(a[t][i].qs + 32 * k);
                    __m256i pairs = _mm256_maddubs_epi16(q, yq);
                    if constexpr (K::kPairOffset != 0)
                        pairs = _mm256_sub_epi16(pairs, _mm256_maddubs_epi16(_mm256_set1_epi8(K::kPairOffset), yq));
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(pairs, sc));
                });
            });
            unroll<kT>([&](auto t_) {
                constexpr int t = decltype(t_)::value;
                const BlockQ8_K& yb = a[t][i];
                const __m256i corr = _mm256_madd_epi16(load256(yb.bsums), p.corr);
                if constexpr (K::kSerial) {
                    acc_serial[t] = serial_step(acc_serial[t], sumi[t], corr, p.d, p.dmin, yb.d);
                } else {
                    if constexpr (K::kMins)
                        summs[t] = _mm_fmadd_ss(_mm_set_ss(-yb.d * p.dmin), sum_to_float(corr), summs[t]);
                    else
                        sumi[t] = _mm256_add_epi32(sumi[t], corr);
                    acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(yb.d * p.d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
                }
            });
        }
        unroll<kT>([&](auto t_) {
            constexpr int t = decltype(t_)::value;
            float sum;
            if constexpr (K::kSerial) {
                sum = _mm_cvtss_f32(_mm_sub_ss(acc_serial[t], _mm_movehdup_ps(acc_serial[t])));
            } else {
                sum = hsum(acc[t]);
                if constexpr (K::kMins) sum += _mm_cvtss_f32(summs[t]);
            }
            y[t * y_stride + static_cast<size_t>(r)] = sum;
        });
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

GemmKernel gemm_avx2_kquants(GgmlType weight_type) {
    GemmKernel k;
    switch (weight_type) {
        case GgmlType::Q2_K:
            k.fn = gemm<Q2K>;
            break;
        case GgmlType::Q3_K:
            k.fn = gemm<Q3K>;
            break;
        case GgmlType::Q4_K:
            k.fn = gemm<Q45K<BlockQ4_K>>;
            break;
        case GgmlType::Q5_K:
            k.fn = gemm<Q45K<BlockQ5_K>>;
            break;
        case GgmlType::Q6_K:
            k.fn = gemm<Q6K>;
            break;
        default:
            return k;
    }
    k.dot_order = true;
    k.row_tile = 1;
    k.tok_tile = kTok;
    return k;
}

}  // namespace fitllm::quant::detail
