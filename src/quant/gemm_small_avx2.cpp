// AVX2 small-batch kernels (select_small_batch): each weight row is loaded and unpacked once and
// dotted with several activation rows, with exactly the operations of dot_avx2.cpp's kernel for the
// type, per (row, token), in the same order, so every result equals that dot bit for bit. Compiled
// with -mavx2 -mfma -mf16c; see dot_kernels.h for the rules this file follows.
//
// Sixteen registers hold the accumulators of 4 tokens for Q8_0 (2 each) and of 2 for BF16 (4 each);
// larger batches take several passes over a row, the later ones from L1 (F16: below).
#include <immintrin.h>

#include <cstdint>
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

constexpr int kQ8Tok = 4;
constexpr int kFloatTok = 2;

// ---- BF16 weights, F32 activations (dot_avx2.cpp's dot_float) ----
// (F16 weights take f16 activations: below.)

template <typename W>
__m256 load_weights8(const W* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

template <typename W>
float weight(W v) {
    return _mm_cvtss_f32(_mm_castsi128_ps(_mm_cvtsi32_si128(static_cast<int>(v) << 16)));
}

template <typename W, int kT>
void float_rows(int n, int n_rows, const uint8_t* w, size_t w_stride, const float* const* a, float* y,
                size_t y_stride) {
    for (int r = 0; r < n_rows; ++r) {
        const auto* x = reinterpret_cast<const W*>(w + static_cast<size_t>(r) * w_stride);
        __m256 acc0[kT], acc1[kT], acc2[kT], acc3[kT];
        float head_sum[kT];
        for (int t = 0; t < kT; ++t) {
            acc0[t] = acc1[t] = acc2[t] = acc3[t] = _mm256_setzero_ps();
            head_sum[t] = 0.0f;
        }
        constexpr uintptr_t kVectorBytes = 8 * sizeof(W);
        const uintptr_t misaligned = reinterpret_cast<uintptr_t>(x) % kVectorBytes;
        int head = misaligned == 0 ? 0 : static_cast<int>((kVectorBytes - misaligned) / sizeof(W));
        if (head > n) head = n;
        for (int k = 0; k < head; ++k) {
            const float v = weight<W>(x[k]);
            for (int t = 0; t < kT; ++t) head_sum[t] += v * a[t][k];
        }
        int i = head;
        for (; i + 32 <= n; i += 32) {
            const __m256 v0 = load_weights8<W>(x + i), v1 = load_weights8<W>(x + i + 8);
            const __m256 v2 = load_weights8<W>(x + i + 16), v3 = load_weights8<W>(x + i + 24);
            for (int t = 0; t < kT; ++t) {
                acc0[t] = _mm256_fmadd_ps(v0, _mm256_loadu_ps(a[t] + i), acc0[t]);
                acc1[t] = _mm256_fmadd_ps(v1, _mm256_loadu_ps(a[t] + i + 8), acc1[t]);
                acc2[t] = _mm256_fmadd_ps(v2, _mm256_loadu_ps(a[t] + i + 16), acc2[t]);
                acc3[t] = _mm256_fmadd_ps(v3, _mm256_loadu_ps(a[t] + i + 24), acc3[t]);
            }
        }
        for (; i + 8 <= n; i += 8) {
            const __m256 v = load_weights8<W>(x + i);
            for (int t = 0; t < kT; ++t) acc0[t] = _mm256_fmadd_ps(v, _mm256_loadu_ps(a[t] + i), acc0[t]);
        }
        float sum[kT];
        for (int t = 0; t < kT; ++t) {
            sum[t] =
                hsum(_mm256_add_ps(_mm256_add_ps(acc0[t], acc1[t]), _mm256_add_ps(acc2[t], acc3[t]))) + head_sum[t];
        }
        for (; i < n; ++i) {
            const float v = weight<W>(x[i]);
            for (int t = 0; t < kT; ++t) sum[t] += v * a[t][i];
        }
        for (int t = 0; t < kT; ++t) y[static_cast<size_t>(t) * y_stride + r] = sum[t];
    }
}

template <typename W>
void float_small(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride,
                 float* y, size_t y_stride) {
    const auto* wb = static_cast<const uint8_t*>(w);
    for (int t0 = 0; t0 < n_tok; t0 += kFloatTok) {
        const int tc = n_tok - t0 < kFloatTok ? n_tok - t0 : kFloatTok;
        const float* a[kFloatTok];
        for (int t = 0; t < tc; ++t) {
            a[t] = reinterpret_cast<const float*>(static_cast<const uint8_t*>(act) + (t0 + t) * act_stride);
        }
        float* yt = y + static_cast<size_t>(t0) * y_stride;
        if (tc == 1)
            float_rows<W, 1>(n, n_rows, wb, w_stride, a, yt, y_stride);
        else
            float_rows<W, 2>(n, n_rows, wb, w_stride, a, yt, y_stride);
    }
}

// ---- F16 weights, F16 activations (dot_avx2.cpp's dot_f16) ----
// The dot keeps eight 8-lane accumulators, accumulator k taking the elements 64i + 8k + l in order,
// and sums them as the AVX-512 dot's four of 16 lanes; each depends only on its own elements. So a
// row runs kK of them at a time (a pass over the row) for up to kF16Tok tokens, every weight vector converted once and
// FMAed into all the tokens' accumulators, and the sums are taken as the dot takes them. The
// activations are converted to f32 once per call (exact), so the FMAs see the dot's very operands.
// A call runs its rows one at a time, all the tokens over each (several groups for more than
// kF16Tok, the later ones from L1), so the weights stream from memory once for up to
// kSmallBatchMaxTokF16 tokens (a draft's check).

constexpr int kF16Tok = 8;

// The accumulators in the order the passes take them: 0 and 4 first (elements 0..7 and 32..39 of
// each 64, every cache line of the row), so that the first pass streams the row from memory in order.
constexpr int kF16Order[8] = {0, 4, 2, 6, 1, 5, 3, 7};

// Pass p: accumulators kF16Order[p * kK .. p * kK + kK - 1] of kT tokens over the np (a multiple
// of 64) leading elements of row x; a[t] the token's f32 activations; into acc[k][t].
template <int kK, int kT>
void f16_pass(int np, const uint16_t* x, const float* const* a, int p, __m256 (*acc)[kF16Tok]) {
    __m256 s[kK][kT];
    for (auto& row : s)
        for (auto& v : row) v = _mm256_setzero_ps();
    for (int i = 0; i < np; i += 64) {
#pragma GCC unroll 8
        for (int k = 0; k < kK; ++k) {
            const int e = i + 8 * kF16Order[p * kK + k];
            const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + e)));
#pragma GCC unroll 8
            for (int t = 0; t < kT; ++t) s[k][t] = _mm256_fmadd_ps(v, _mm256_load_ps(a[t] + e), s[k][t]);
        }
    }
    for (int k = 0; k < kK; ++k)
        for (int t = 0; t < kT; ++t) acc[kF16Order[p * kK + k]][t] = s[k][t];
}

template <int kT>
void f16_row(int n, const uint16_t* x, const float* const* a, float* y, size_t y_stride) {
    // As many accumulators per token as 12 of the 16 registers hold.
    constexpr int kK = kT == 1 ? 8 : kT <= 3 ? 4 : kT <= 6 ? 2 : 1;
    const int np = n & ~63;
    __m256 acc[8][kF16Tok];
    for (int p = 0; p < 8 / kK; ++p) f16_pass<kK, kT>(np, x, a, p, acc);
    for (int t = 0; t < kT; ++t) {
        // accumulator j of the AVX-512 dot is acc[2j] (lanes 0..7) and acc[2j + 1] (lanes 8..15)
        const __m256 lo = _mm256_add_ps(_mm256_add_ps(acc[0][t], acc[4][t]), _mm256_add_ps(acc[2][t], acc[6][t]));
        const __m256 hi = _mm256_add_ps(_mm256_add_ps(acc[1][t], acc[5][t]), _mm256_add_ps(acc[3][t], acc[7][t]));
        double sum = reduce_add16(lo, hi);
        for (int i = np; i < n; ++i) sum += static_cast<double>(f16(x[i]) * a[t][i]);
        y[static_cast<size_t>(t) * y_stride] = static_cast<float>(sum);
    }
}

void f16_small(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride,
               float* y, size_t y_stride) {
    // The activations as f32, each token's row 32-byte aligned.
    const size_t a_floats = (static_cast<size_t>(n) + 7) / 8 * 8;
    auto* af = reinterpret_cast<float*>(small_batch_scratch(static_cast<size_t>(n_tok) * a_floats * sizeof(float)));
    for (int t = 0; t < n_tok; ++t) {
        const auto* h = reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(act) + t * act_stride);
        float* f = af + static_cast<size_t>(t) * a_floats;
        int i = 0;
        for (; i + 8 <= n; i += 8) {
            _mm256_store_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
        }
        for (; i < n; ++i) f[i] = f16(h[i]);
    }
    // Groups of at most kF16Tok tokens, as even as they go (9: 5 and 4).
    const int n_groups = (n_tok + kF16Tok - 1) / kF16Tok;
    const int group = (n_tok + n_groups - 1) / n_groups;
    const auto* wb = static_cast<const uint8_t*>(w);
    for (int r = 0; r < n_rows; ++r) {
        const auto* x = reinterpret_cast<const uint16_t*>(wb + static_cast<size_t>(r) * w_stride);
        for (int t0 = 0; t0 < n_tok; t0 += group) {
            const int tc = n_tok - t0 < group ? n_tok - t0 : group;
            const float* a[kF16Tok];
            for (int t = 0; t < tc; ++t) a[t] = af + static_cast<size_t>(t0 + t) * a_floats;
            float* yt = y + static_cast<size_t>(t0) * y_stride + r;
            switch (tc) {
                case 1:
                    f16_row<1>(n, x, a, yt, y_stride);
                    break;
                case 2:
                    f16_row<2>(n, x, a, yt, y_stride);
                    break;
                case 3:
                    f16_row<3>(n, x, a, yt, y_stride);
                    break;
                case 4:
                    f16_row<4>(n, x, a, yt, y_stride);
                    break;
                case 5:
                    f16_row<5>(n, x, a, yt, y_stride);
                    break;
                case 6:
                    f16_row<6>(n, x, a, yt, y_stride);
                    break;
                case 7:
                    f16_row<7>(n, x, a, yt, y_stride);
                    break;
                default:
                    f16_row<8>(n, x, a, yt, y_stride);
                    break;
            }
        }
    }
}

// ---- Q8_0 with Q8_0 (dot_avx2.cpp's dot_q8_0) ----

template <int kT>
void q8_0_rows(int nb, int n_rows, const uint8_t* w, size_t w_stride, const BlockQ8_0* const* ya,
               const float* const* yd, float* y, size_t y_stride) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = 0; r < n_rows; ++r) {
        const auto* x = reinterpret_cast<const BlockQ8_0*>(w + static_cast<size_t>(r) * w_stride);
        __m256 acc[kT];  // the lanes8 order of dot_ref.cpp: one 8-lane fma a block
        for (int t = 0; t < kT; ++t) acc[t] = _mm256_setzero_ps();
        for (int i = 0; i < nb; ++i) {
            const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs));
            const __m256i xa = _mm256_sign_epi8(xq, xq);
            const float xd = f16(x[i].d);
            for (int t = 0; t < kT; ++t) {
                const __m256i yq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ya[t][i].qs));
                const __m256 sums =
                    _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(xa, _mm256_sign_epi8(yq, xq)), ones));
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(xd * yd[t][i]), sums, acc[t]);
            }
        }
        for (int t = 0; t < kT; ++t) y[static_cast<size_t>(t) * y_stride + r] = hsum(acc[t]);
    }
}

void q8_0_small(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride,
                float* y, size_t y_stride) {
    const int nb = n / 32;
    const auto* wb = static_cast<const uint8_t*>(w);
    // The scales of every token as floats, converted once for all the rows of the call.
    auto* scales = reinterpret_cast<float*>(small_batch_scratch(sizeof(float) * static_cast<size_t>(nb) * n_tok));
    for (int t = 0; t < n_tok; ++t) {
        const auto* src = reinterpret_cast<const BlockQ8_0*>(static_cast<const uint8_t*>(act) + t * act_stride);
        for (int b = 0; b < nb; ++b) scales[static_cast<size_t>(t) * nb + b] = f16(src[b].d);
    }
    for (int t0 = 0; t0 < n_tok; t0 += kQ8Tok) {
        const int tc = n_tok - t0 < kQ8Tok ? n_tok - t0 : kQ8Tok;
        const BlockQ8_0* ya[kQ8Tok];
        const float* yd[kQ8Tok];
        for (int t = 0; t < tc; ++t) {
            ya[t] = reinterpret_cast<const BlockQ8_0*>(static_cast<const uint8_t*>(act) + (t0 + t) * act_stride);
            yd[t] = scales + static_cast<size_t>(t0 + t) * nb;
        }
        float* yt = y + static_cast<size_t>(t0) * y_stride;
        switch (tc) {
            case 1:
                q8_0_rows<1>(nb, n_rows, wb, w_stride, ya, yd, yt, y_stride);
                break;
            case 2:
                q8_0_rows<2>(nb, n_rows, wb, w_stride, ya, yd, yt, y_stride);
                break;
            case 3:
                q8_0_rows<3>(nb, n_rows, wb, w_stride, ya, yd, yt, y_stride);
                break;
            default:
                q8_0_rows<4>(nb, n_rows, wb, w_stride, ya, yd, yt, y_stride);
                break;
        }
    }
}

// ---- Q4_K, Q5_K with Q8_K (dot_avx2_kquants.cpp's dot_q4_5_K) ----

// Per super-block the scales and mins are unpacked once; per 64 elements the quants once, then
// every token's pair sums (integer: their order does not change them).
template <typename Block, int kT>
void q4_5_k_rows(int n, int n_rows, const uint8_t* w, size_t w_stride, const BlockQ8_K* const* ya, float* y,
                 size_t y_stride) {
    constexpr bool kFive = std::is_same_v<Block, BlockQ5_K>;
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    for (int r = 0; r < n_rows; ++r) {
        const auto* x = reinterpret_cast<const Block*>(w + static_cast<size_t>(r) * w_stride);
        // The dot's float steps: Q4_K serial (lanes 0 and 1 of serial), Q5_K lanes8 and summs.
        __m256 acc[kT];
        __m128 serial[kT];
        __m256i min_sums[kT];
        for (int t = 0; t < kT; ++t) {
            acc[t] = _mm256_setzero_ps();
            serial[t] = _mm_setzero_ps();
        }
        for (int i = 0; i < n / kQK; ++i) {
            const __m128i packed = q4k_scales_mins(x[i].scales);
            const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(packed, 8));
            const __m256i mins_twice = _mm256_set_m128i(_mm_unpackhi_epi16(mins, mins), _mm_unpacklo_epi16(mins, mins));
            const float dmin = f16(x[i].dmin), d = f16(x[i].d);
            for (int t = 0; t < kT; ++t) {
                min_sums[t] = _mm256_madd_epi16(load256(ya[t][i].bsums), mins_twice);
                if constexpr (kFive)
                    serial[t] = _mm_fmadd_ss(_mm_set_ss(-ya[t][i].d * dmin), sum_to_float(min_sums[t]), serial[t]);
            }
            const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(packed));
            __m256i high_bits;
            if constexpr (kFive) high_bits = load256(x[i].qh);
            __m256i sumi[kT];
            for (int t = 0; t < kT; ++t) sumi[t] = _mm256_setzero_si256();
            unroll<4>([&](auto c_) {
                constexpr int c = decltype(c_)::value;
                const __m256i q = load256(x[i].qs + 32 * c);
                __m256i lo = _mm256_and_si256(q, nibble);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble);
                if constexpr (kFive) {
                    lo = _mm256_or_si256(lo, move_bit<2 * c, 4>(high_bits));
                    hi = _mm256_or_si256(hi, move_bit<2 * c + 1, 4>(high_bits));
                }
                const __m256i s_lo = pick_words<2 * c, 2 * c>(scales), s_hi = pick_words<2 * c + 1, 2 * c + 1>(scales);
                for (int t = 0; t < kT; ++t) {
                    const __m256i p_lo = _mm256_maddubs_epi16(lo, load256(ya[t][i].qs + 64 * c));
                    const __m256i p_hi = _mm256_maddubs_epi16(hi, load256(ya[t][i].qs + 64 * c + 32));
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p_lo, s_lo));
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p_hi, s_hi));
                }
            });
            for (int t = 0; t < kT; ++t) {
                if constexpr (kFive)
                    acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(ya[t][i].d * d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
                else
                    serial[t] = serial_step(serial[t], sumi[t], min_sums[t], d, dmin, ya[t][i].d);
            }
        }
        for (int t = 0; t < kT; ++t) {
            y[static_cast<size_t>(t) * y_stride + r] =
                kFive ? hsum(acc[t]) + _mm_cvtss_f32(serial[t])
                      : _mm_cvtss_f32(_mm_sub_ss(serial[t], _mm_movehdup_ps(serial[t])));
        }
    }
}

template <typename Block>
void q4_5_k_small(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride,
                  float* y, size_t y_stride) {
    const auto* wb = static_cast<const uint8_t*>(w);
    for (int t0 = 0; t0 < n_tok; t0 += kQ8Tok) {
        const int tc = n_tok - t0 < kQ8Tok ? n_tok - t0 : kQ8Tok;
        const BlockQ8_K* ya[kQ8Tok];
        for (int t = 0; t < tc; ++t) {
            ya[t] = reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(act) + (t0 + t) * act_stride);
        }
        float* yt = y + static_cast<size_t>(t0) * y_stride;
        switch (tc) {
            case 1:
                q4_5_k_rows<Block, 1>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
            case 2:
                q4_5_k_rows<Block, 2>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
            case 3:
                q4_5_k_rows<Block, 3>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
            default:
                q4_5_k_rows<Block, 4>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
        }
    }
}

// ---- Q6_K with Q8_K (dot_avx2_kquants.cpp's dot_q6_K) ----

// Per 32 elements the 6-bit quants once, then every token's pair sums; per token and super-block
// the offset 32 * sum(scale * bsum) and one FMA.
template <int kT>
void q6_k_rows(int n, int n_rows, const uint8_t* w, size_t w_stride, const BlockQ8_K* const* ya, float* y,
               size_t y_stride) {
    const __m256i nibble = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
    for (int r = 0; r < n_rows; ++r) {
        const auto* x = reinterpret_cast<const BlockQ6_K*>(w + static_cast<size_t>(r) * w_stride);
        __m256 acc[kT];
        for (int t = 0; t < kT; ++t) acc[t] = _mm256_setzero_ps();
        for (int i = 0; i < n / kQK; ++i) {
            const __m256i scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales)));
            __m256i sumi[kT];
            for (int t = 0; t < kT; ++t) sumi[t] = _mm256_setzero_si256();
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
                    const __m256i s = pick_words<2 * g, 2 * g + 1>(sc);
                    for (int t = 0; t < kT; ++t) {
                        const __m256i p = _mm256_maddubs_epi16(e, load256(ya[t][i].qs + 128 * h + 32 * g));
                        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p, s));
                    }
                });
            });
            const float d = f16(x[i].d);
            for (int t = 0; t < kT; ++t) {
                const __m256i offsets = _mm256_slli_epi32(_mm256_madd_epi16(load256(ya[t][i].bsums), scales), 5);
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(ya[t][i].d * d),
                                         _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[t], offsets)), acc[t]);
            }
        }
        for (int t = 0; t < kT; ++t) y[static_cast<size_t>(t) * y_stride + r] = hsum(acc[t]);
    }
}

void q6_k_small(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride,
                float* y, size_t y_stride) {
    const auto* wb = static_cast<const uint8_t*>(w);
    for (int t0 = 0; t0 < n_tok; t0 += kQ8Tok) {
        const int tc = n_tok - t0 < kQ8Tok ? n_tok - t0 : kQ8Tok;
        const BlockQ8_K* ya[kQ8Tok];
        for (int t = 0; t < tc; ++t) {
            ya[t] = reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(act) + (t0 + t) * act_stride);
        }
        float* yt = y + static_cast<size_t>(t0) * y_stride;
        switch (tc) {
            case 1:
                q6_k_rows<1>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
            case 2:
                q6_k_rows<2>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
            case 3:
                q6_k_rows<3>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
            default:
                q6_k_rows<4>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
        }
    }
}

}  // namespace

GemmFn small_batch_avx2(GgmlType weight_type) {
    // No F32: GCC vectorizes the scalar head and tail loops of dot_avx2.cpp's F32 dot (products in
    // a vector, sums one by one, unfused), and this file's loops over tokens get other code, so the
    // results would differ in the last bit. F32 weight matrices are rare (the dots run them).
    switch (weight_type) {
        case GgmlType::F16:
            return f16_small;
        case GgmlType::BF16:
            return float_small<uint16_t>;
        case GgmlType::Q8_0:
            return q8_0_small;
        case GgmlType::Q4_K:
            return q4_5_k_small<BlockQ4_K>;
        case GgmlType::Q5_K:
            return q4_5_k_small<BlockQ5_K>;
        case GgmlType::Q6_K:
            return q6_k_small;
        default:
            return nullptr;
    }
}

}  // namespace fitllm::quant::detail
