// AVX-512 small-batch kernels (select_small_batch): each weight row is loaded and unpacked once and
// dotted with up to 8 activation rows, with exactly the operations of dot_avx512.cpp's kernel for
// the type, per (row, token), in the same order, so every result equals that dot bit for bit.
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx2 -mfma -mf16c; the kVnni = false
// kernels use no VNNI instruction. See dot_kernels.h for the rules this file follows.
//
// What a row shares between its tokens: the weight loads, Q8_0's |q| and sign mask, the scales
// converted from half precision, and for the float types the conversion to f32. What stays per
// token is the integer dot, its conversion and the FMA into the token's own accumulators.

// GCC 12's AVX-512 headers trip its own uninitialized-variable warnings; see dot_avx512.cpp.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "quant/blocks.h"
#include "quant/gemm_kernels.h"
#include "quant/kquant_avx512.h"
#include "quant/kquant_serial.h"
#include "quant/unroll.h"

namespace fitllm::quant::detail {
namespace {

constexpr int kMaxTok = kSmallBatchMaxTok;  // Q8_0 tokens per pass over a row
constexpr int kFloatTok = 4;                // float types: 4 accumulators per token

// ---- F32 and BF16 weights, F32 activations (dot_avx512.cpp's dot_float) ----
// (F16 weights take f16 activations: below.)

// W is float (F32) or uint16_t (BF16).
template <typename W>
__m512 load_weights16(const W* p, __mmask16 m) {
    if constexpr (std::is_same_v<W, float>) {
        return _mm512_maskz_loadu_ps(m, p);
    } else {
        const __m256i h = _mm256_maskz_loadu_epi16(m, p);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
}

template <typename W, int kT>
void float_rows(int n, int n_rows, const uint8_t* w, size_t w_stride, const float* const* a, float* y,
                size_t y_stride) {
    constexpr __mmask16 kAll = 0xFFFF;
    for (int r = 0; r < n_rows; ++r) {
        const auto* x = reinterpret_cast<const W*>(w + static_cast<size_t>(r) * w_stride);
        __m512 acc0[kT], acc1[kT], acc2[kT], acc3[kT];
        for (int t = 0; t < kT; ++t) acc0[t] = acc1[t] = acc2[t] = acc3[t] = _mm512_setzero_ps();
        constexpr uintptr_t kVectorBytes = 16 * sizeof(W);
        const uintptr_t misaligned = reinterpret_cast<uintptr_t>(x) % kVectorBytes;
        int i = misaligned == 0 ? 0 : static_cast<int>((kVectorBytes - misaligned) / sizeof(W));
        if (i > n) i = n;
        if (i > 0) {
            const auto head = static_cast<__mmask16>((1u << i) - 1);
            const __m512 v = load_weights16<W>(x, head);
            for (int t = 0; t < kT; ++t) acc3[t] = _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(head, a[t]), acc3[t]);
        }
        for (; i + 64 <= n; i += 64) {
            const __m512 v0 = load_weights16<W>(x + i, kAll), v1 = load_weights16<W>(x + i + 16, kAll);
            const __m512 v2 = load_weights16<W>(x + i + 32, kAll), v3 = load_weights16<W>(x + i + 48, kAll);
#pragma GCC unroll 4
            for (int t = 0; t < kT; ++t) {
                acc0[t] = _mm512_fmadd_ps(v0, _mm512_loadu_ps(a[t] + i), acc0[t]);
                acc1[t] = _mm512_fmadd_ps(v1, _mm512_loadu_ps(a[t] + i + 16), acc1[t]);
                acc2[t] = _mm512_fmadd_ps(v2, _mm512_loadu_ps(a[t] + i + 32), acc2[t]);
                acc3[t] = _mm512_fmadd_ps(v3, _mm512_loadu_ps(a[t] + i + 48), acc3[t]);
            }
        }
        for (; i < n; i += 16) {
            const __mmask16 m = n - i >= 16 ? kAll : static_cast<__mmask16>((1u << (n - i)) - 1);
            const __m512 v = load_weights16<W>(x + i, m);
            for (int t = 0; t < kT; ++t) acc0[t] = _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(m, a[t] + i), acc0[t]);
        }
        for (int t = 0; t < kT; ++t) {
            y[static_cast<size_t>(t) * y_stride + r] =
                _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0[t], acc1[t]), _mm512_add_ps(acc2[t], acc3[t])));
        }
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
        switch (tc) {
            case 1:
                float_rows<W, 1>(n, n_rows, wb, w_stride, a, yt, y_stride);
                break;
            case 2:
                float_rows<W, 2>(n, n_rows, wb, w_stride, a, yt, y_stride);
                break;
            case 3:
                float_rows<W, 3>(n, n_rows, wb, w_stride, a, yt, y_stride);
                break;
            default:
                float_rows<W, 4>(n, n_rows, wb, w_stride, a, yt, y_stride);
                break;
        }
    }
}

// ---- F16 weights, F16 activations (dot_avx512.cpp's dot_f16) ----
// The dot keeps four 16-lane accumulators, accumulator j taking the elements 64i + 16j + l in
// order, and sums them as (acc0 + acc2) + (acc1 + acc3); each depends only on its own elements.
// So a row runs kJ of them at a time (a pass over the row) for up to kF16Tok tokens, every weight
// vector converted once and FMAed into all the tokens' accumulators, and the sums are taken as
// the dot takes them. The activations are converted to f32 once per call (exact), so the FMAs see
// the dot's very operands. A call runs its rows one at a time, all the tokens over each (several
// groups for more than kF16Tok, the later ones from L1), so the weights stream from memory once
// for up to kSmallBatchMaxTokF16 tokens (a draft's check).

constexpr int kF16Tok = 8;

// The accumulators in the order the passes take them: with two a pass, 0 and 2 (each pass then
// reads every cache line of the row, so the first one streams the row from memory in order).
constexpr int kF16Order[4] = {0, 2, 1, 3};

// Pass p: accumulators kF16Order[p * kJ .. p * kJ + kJ - 1] of kT tokens over the np (a multiple
// of 64) leading elements of row x; a[t] the token's f32 activations; into acc[j][t].
template <int kJ, int kT>
void f16_pass(int np, const uint16_t* x, const float* const* a, int p, __m512 (*acc)[kF16Tok]) {
    __m512 s[kJ][kT];
    for (auto& row : s)
        for (auto& v : row) v = _mm512_setzero_ps();
    for (int i = 0; i < np; i += 64) {
#pragma GCC unroll 4
        for (int j = 0; j < kJ; ++j) {
            const int e = i + 16 * kF16Order[p * kJ + j];
            const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + e)));
#pragma GCC unroll 8
            for (int t = 0; t < kT; ++t) s[j][t] = _mm512_fmadd_ps(v, _mm512_load_ps(a[t] + e), s[j][t]);
        }
    }
    for (int j = 0; j < kJ; ++j)
        for (int t = 0; t < kT; ++t) acc[kF16Order[p * kJ + j]][t] = s[j][t];
}

template <int kT>
void f16_row(int n, const uint16_t* x, const float* const* a, float* y, size_t y_stride) {
    // As many accumulators per token as 24 registers hold.
    constexpr int kJ = kT <= 6 ? 4 : 2;
    const int np = n & ~63;
    __m512 acc[4][kF16Tok];
    for (int p = 0; p < 4 / kJ; ++p) f16_pass<kJ, kT>(np, x, a, p, acc);
    for (int t = 0; t < kT; ++t) {
        double sum = _mm512_reduce_add_ps(
            _mm512_add_ps(_mm512_add_ps(acc[0][t], acc[2][t]), _mm512_add_ps(acc[1][t], acc[3][t])));
        for (int i = np; i < n; ++i) sum += static_cast<double>(_cvtsh_ss(x[i]) * a[t][i]);
        y[static_cast<size_t>(t) * y_stride] = static_cast<float>(sum);
    }
}

void f16_small(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride,
               float* y, size_t y_stride) {
    // The activations as f32, each token's row 64-byte aligned.
    const size_t a_floats = (static_cast<size_t>(n) + 15) / 16 * 16;
    auto* af = reinterpret_cast<float*>(small_batch_scratch(static_cast<size_t>(n_tok) * a_floats * sizeof(float)));
    for (int t = 0; t < n_tok; ++t) {
        const auto* h = reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(act) + t * act_stride);
        float* f = af + static_cast<size_t>(t) * a_floats;
        for (int i = 0; i < n; i += 16) {
            const __mmask16 m = n - i >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (n - i)) - 1);
            _mm512_store_ps(f + i, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, h + i)));
        }
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

// ---- Q8_0 with Q8_0 (dot_avx512.cpp's dot_q8_0) ----

// The activations of a call, unpacked once: per token its blocks' scales as floats and their quants
// back to back, so that two blocks are one 64-byte load.
struct PreparedQ8 {
    const float* d[kMaxTok];
    const int8_t* q[kMaxTok];
};

PreparedQ8 prepare_q8_0(const uint8_t* act, size_t act_stride, int n_tok, int nb) {
    const size_t d_bytes = (static_cast<size_t>(nb) * 4 + 63) / 64 * 64;
    const size_t per_tok = d_bytes + static_cast<size_t>(nb) * 32;
    std::byte* buf = small_batch_scratch(per_tok * static_cast<size_t>(n_tok));
    PreparedQ8 p{};
    for (int t = 0; t < n_tok; ++t) {
        const auto* src = reinterpret_cast<const BlockQ8_0*>(act + static_cast<size_t>(t) * act_stride);
        auto* d = reinterpret_cast<float*>(buf + static_cast<size_t>(t) * per_tok);
        auto* q = reinterpret_cast<int8_t*>(buf + static_cast<size_t>(t) * per_tok + d_bytes);
        for (int b = 0; b < nb; ++b) {
            d[b] = f16(src[b].d);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * b), load256(src[b].qs));
        }
        p.d[t] = d;
        p.q[t] = q;
    }
    return p;
}

template <bool kVnni>
__m512i dot_u8s8(__m512i u, __m512i s) {
    if constexpr (kVnni)
        return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
    else
        return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
}

__m512i blocks_x2(const int8_t* lo, const int8_t* hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(load256(lo)), load256(hi), 1);
}

// Q5_0's quants of two blocks as unsigned bytes (0..31, standing for q - 16): block b0 in bytes
// 0..31 (low nibbles = elements 0..15 first), b1 in bytes 32..63, the fifth bit added.
__m512i q5_0_quants_x2(const BlockQ5_0& b0, const BlockQ5_0& b1) {
    const __m256i both =
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0.qs))),
                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(b1.qs)), 1);
    const __m512i wide =
        _mm512_permutexvar_epi64(_mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0), _mm512_castsi256_si512(both));
    const __m512i q =
        _mm512_and_si512(_mm512_srlv_epi64(wide, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0)), _mm512_set1_epi8(0x0F));
    uint32_t h0, h1;
    std::memcpy(&h0, b0.qh, 4);
    std::memcpy(&h1, b1.qh, 4);
    const __mmask64 fifth = static_cast<__mmask64>(h0) | (static_cast<__mmask64>(h1) << 32);
    return _mm512_mask_add_epi8(q, fifth, q, _mm512_set1_epi8(16));
}

// As dot_q8_0 / dot_symmetric32<Q5_0>: two blocks in one register (block i in the low 8 lanes,
// i + 1 in the high 8), each lane the exact integer sum of 4 consecutive products (Q8_0: x's sign
// moved onto y, |x| the unsigned side; Q5_0: q y - 16 y), then the lanes8 order of dot_ref.cpp:
// per block one 8-lane fma of d_w d_a into the token's accumulator, hsum at the end.
template <typename Block, bool kVnni, int kT>
void blocks32_rows(int nb, int n_rows, const uint8_t* w, size_t w_stride, const PreparedQ8& a, float* y,
                   size_t y_stride) {
    const __m512i zero = _mm512_setzero_si512();
    for (int r = 0; r < n_rows; ++r) {
        const auto* x = reinterpret_cast<const Block*>(w + static_cast<size_t>(r) * w_stride);
        __m256 lanes[kT];
        for (int t = 0; t < kT; ++t) lanes[t] = _mm256_setzero_ps();
        for (int i = 0; i < nb; i += 2) {
            const bool pair = i + 1 < nb;
            const int j = pair ? i + 1 : i;
            __m512i xq;  // Q8_0: |x|; Q5_0: q (unsigned)
            __mmask64 neg = 0;
            if constexpr (std::is_same_v<Block, BlockQ8_0>) {
                const __m512i xij = blocks_x2(x[i].qs, x[j].qs);
                neg = _mm512_movepi8_mask(xij);
                xq = _mm512_abs_epi8(xij);
            } else {
                xq = q5_0_quants_x2(x[i], x[j]);
            }
            const float xdi = f16(x[i].d), xdj = f16(x[j].d);
#pragma GCC unroll 8
            for (int t = 0; t < kT; ++t) {
                const __m512i yij = blocks_x2(a.q[t] + 32 * i, a.q[t] + 32 * j);
                __m512i p;
                if constexpr (std::is_same_v<Block, BlockQ8_0>) {
                    p = dot_u8s8<kVnni>(xq, _mm512_mask_sub_epi8(yij, neg, zero, yij));
                } else if constexpr (kVnni) {
                    const __m512i offsets = _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(16), yij);
                    p = _mm512_dpbusd_epi32(_mm512_sub_epi32(zero, offsets), xq, yij);
                } else {
                    const __m512i pairs = _mm512_sub_epi16(_mm512_maddubs_epi16(xq, yij),
                                                           _mm512_maddubs_epi16(_mm512_set1_epi8(16), yij));
                    p = _mm512_madd_epi16(pairs, _mm512_set1_epi16(1));
                }
                lanes[t] = _mm256_fmadd_ps(_mm256_set1_ps(xdi * a.d[t][i]),
                                           _mm256_cvtepi32_ps(_mm512_castsi512_si256(p)), lanes[t]);
                if (pair) {
                    lanes[t] = _mm256_fmadd_ps(_mm256_set1_ps(xdj * a.d[t][j]),
                                               _mm256_cvtepi32_ps(_mm512_extracti64x4_epi64(p, 1)), lanes[t]);
                }
            }
        }
        for (int t = 0; t < kT; ++t) y[static_cast<size_t>(t) * y_stride + r] = hsum(lanes[t]);
    }
}

template <typename Block, bool kVnni>
void blocks32_small(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride,
                    float* y, size_t y_stride) {
    const int nb = n / 32;
    const auto* wb = static_cast<const uint8_t*>(w);
    for (int t0 = 0; t0 < n_tok; t0 += kMaxTok) {
        const int tc = n_tok - t0 < kMaxTok ? n_tok - t0 : kMaxTok;
        const PreparedQ8 a =
            prepare_q8_0(static_cast<const uint8_t*>(act) + static_cast<size_t>(t0) * act_stride, act_stride, tc, nb);
        float* yt = y + static_cast<size_t>(t0) * y_stride;
        switch (tc) {
            case 1:
                blocks32_rows<Block, kVnni, 1>(nb, n_rows, wb, w_stride, a, yt, y_stride);
                break;
            case 2:
                blocks32_rows<Block, kVnni, 2>(nb, n_rows, wb, w_stride, a, yt, y_stride);
                break;
            case 3:
                blocks32_rows<Block, kVnni, 3>(nb, n_rows, wb, w_stride, a, yt, y_stride);
                break;
            case 4:
                blocks32_rows<Block, kVnni, 4>(nb, n_rows, wb, w_stride, a, yt, y_stride);
                break;
            case 5:
                blocks32_rows<Block, kVnni, 5>(nb, n_rows, wb, w_stride, a, yt, y_stride);
                break;
            case 6:
                blocks32_rows<Block, kVnni, 6>(nb, n_rows, wb, w_stride, a, yt, y_stride);
                break;
            case 7:
                blocks32_rows<Block, kVnni, 7>(nb, n_rows, wb, w_stride, a, yt, y_stride);
                break;
            default:
                blocks32_rows<Block, kVnni, 8>(nb, n_rows, wb, w_stride, a, yt, y_stride);
                break;
        }
    }
}

// ---- Q4_K, Q5_K with Q8_K (dot_avx512_kquants.cpp's dot_q4_5_K) ----

// The 8 int32 lanes of v summed (exact).
int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

__m256i fold16(__m512i v) {  // lanes l and l + 8 added: llama.cpp's 8 lanes
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

// Shared by the tokens: the scales and mins unpacked, the quants as bytes (64 elements a
// register, sub-blocks 2c and 2c + 1), the sub-block scales spread for vpdpwssd / madd.
template <typename Block, bool kVnni, int kT>
void q4_5_k_rows(int n, int n_rows, const uint8_t* w, size_t w_stride, const BlockQ8_K* const* ya, float* y,
                 size_t y_stride) {
    constexpr bool kFive = std::is_same_v<Block, BlockQ5_K>;
    const __m512i nibble = _mm512_set1_epi8(0x0F), nibble_shift = halves64(0, 4);
    for (int r = 0; r < n_rows; ++r) {
        const auto* x = reinterpret_cast<const Block*>(w + static_cast<size_t>(r) * w_stride);
        // The dot's float steps: Q4_K serial (lanes 0 and 1 of acc), Q5_K lanes8 and summs.
        __m256 lanes[kT];
        __m128 acc[kT];
        for (int t = 0; t < kT; ++t) {
            lanes[t] = _mm256_setzero_ps();
            acc[t] = _mm_setzero_ps();
        }
        for (int i = 0; i < n / kQK; ++i) {
            const __m128i packed = q4k_scales_mins(x[i].scales);
            const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(packed, 8));
            const __m256i mins_twice = _mm256_set_m128i(_mm_unpackhi_epi16(mins, mins), _mm_unpacklo_epi16(mins, mins));
            const float dmin = f16(x[i].dmin), d = f16(x[i].d);
            const __m512i scales = _mm512_castsi128_si512(_mm_cvtepu8_epi16(packed));
            __m512i high_bits;
            if constexpr (kFive) high_bits = twice(x[i].qh);
            __m512i q[4], sc[4];
            unroll<4>([&](auto c_) {
                constexpr int c = decltype(c_)::value;
                q[c] = _mm512_and_si512(_mm512_srlv_epi64(twice(x[i].qs + 32 * c), nibble_shift), nibble);
                if constexpr (kFive) {
                    const __mmask64 fifth = _mm512_test_epi8_mask(high_bits, halves8(1 << (2 * c), 1 << (2 * c + 1)));
                    q[c] = _mm512_mask_add_epi8(q[c], fifth, q[c], _mm512_set1_epi8(16));
                }
                sc[c] = two_scales<2 * c, 2 * c + 1>(scales);
            });
#pragma GCC unroll 8
            for (int t = 0; t < kT; ++t) {
                const BlockQ8_K& yb = ya[t][i];
                const __m256i min_sums = _mm256_madd_epi16(load256(yb.bsums), mins_twice);
                __m512i sumi = _mm512_setzero_si512();
                for (int c = 0; c < 4; ++c) {
                    sumi =
                        scaled_sum<kVnni>(sumi, _mm512_maddubs_epi16(q[c], _mm512_loadu_si512(yb.qs + 64 * c)), sc[c]);
                }
                if constexpr (kFive) {
                    const __m128 mins_f = _mm_cvtepi32_ps(_mm_set1_epi32(hsum_epi32(min_sums)));
                    acc[t] = _mm_fmadd_ss(_mm_set_ss(-yb.d * dmin), mins_f, acc[t]);
                    lanes[t] = _mm256_fmadd_ps(_mm256_set1_ps(yb.d * d), _mm256_cvtepi32_ps(fold16(sumi)), lanes[t]);
                } else {
                    acc[t] = serial_step(acc[t], fold16(sumi), min_sums, d, dmin, yb.d);
                }
            }
        }
        for (int t = 0; t < kT; ++t) {
            y[static_cast<size_t>(t) * y_stride + r] = kFive
                                                           ? hsum(lanes[t]) + _mm_cvtss_f32(acc[t])
                                                           : _mm_cvtss_f32(_mm_sub_ss(acc[t], _mm_movehdup_ps(acc[t])));
        }
    }
}

template <typename Block, bool kVnni>
void q4_5_k_small(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride,
                  float* y, size_t y_stride) {
    const auto* wb = static_cast<const uint8_t*>(w);
    for (int t0 = 0; t0 < n_tok; t0 += kMaxTok) {
        const int tc = n_tok - t0 < kMaxTok ? n_tok - t0 : kMaxTok;
        const BlockQ8_K* ya[kMaxTok];
        for (int t = 0; t < tc; ++t) {
            ya[t] = reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(act) + (t0 + t) * act_stride);
        }
        float* yt = y + static_cast<size_t>(t0) * y_stride;
        switch (tc) {
            case 1:
                q4_5_k_rows<Block, kVnni, 1>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
            case 2:
                q4_5_k_rows<Block, kVnni, 2>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
            case 3:
                q4_5_k_rows<Block, kVnni, 3>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
            case 4:
                q4_5_k_rows<Block, kVnni, 4>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
            case 5:
                q4_5_k_rows<Block, kVnni, 5>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
            case 6:
                q4_5_k_rows<Block, kVnni, 6>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
            case 7:
                q4_5_k_rows<Block, kVnni, 7>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
            default:
                q4_5_k_rows<Block, kVnni, 8>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
        }
    }
}

// ---- Q6_K with Q8_K (dot_avx512_kquants.cpp's dot_q6_K) ----

// Shared by the tokens: the 6-bit quants of the super-block as bytes (4 registers) and their
// sub-block scales spread; per token the pair sums, the offset 32 * sum(scale * bsum), one FMA.
template <bool kVnni, int kT>
void q6_k_rows(int n, int n_rows, const uint8_t* w, size_t w_stride, const BlockQ8_K* const* ya, float* y,
               size_t y_stride) {
    const __m512i nibble = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
    for (int r = 0; r < n_rows; ++r) {
        const auto* x = reinterpret_cast<const BlockQ6_K*>(w + static_cast<size_t>(r) * w_stride);
        __m256 lanes[kT];  // the lanes8 order of dot_ref.cpp
        for (int t = 0; t < kT; ++t) lanes[t] = _mm256_setzero_ps();
        for (int i = 0; i < n / kQK; ++i) {
            const __m256i scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales)));
            const __m512i sc = _mm512_castsi256_si512(scales);
            const float d = f16(x[i].d);
            __m512i q[4], s4[4];
            unroll<2>([&](auto h_) {
                constexpr int h = decltype(h_)::value;
                const __m512i ql = _mm512_loadu_si512(x[i].ql + 64 * h);
                const __m512i qh = twice(x[i].qh + 32 * h);
                q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, nibble),
                                           _mm512_and_si512(_mm512_sllv_epi64(qh, halves64(4, 2)), top));
                q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), nibble),
                                               _mm512_and_si512(_mm512_srlv_epi64(qh, halves64(0, 2)), top));
                s4[2 * h] = four_scales<8 * h>(sc);
                s4[2 * h + 1] = four_scales<8 * h + 4>(sc);
            });
#pragma GCC unroll 8
            for (int t = 0; t < kT; ++t) {
                const BlockQ8_K& yb = ya[t][i];
                const __m256i offsets = _mm256_slli_epi32(_mm256_madd_epi16(load256(yb.bsums), scales), 5);
                __m512i sumi = _mm512_setzero_si512();
                for (int k = 0; k < 4; ++k) {
                    sumi =
                        scaled_sum<kVnni>(sumi, _mm512_maddubs_epi16(q[k], _mm512_loadu_si512(yb.qs + 64 * k)), s4[k]);
                }
                const __m256i sums8 = _mm256_sub_epi32(fold16(sumi), offsets);
                lanes[t] = _mm256_fmadd_ps(_mm256_set1_ps(yb.d * d), _mm256_cvtepi32_ps(sums8), lanes[t]);
            }
        }
        for (int t = 0; t < kT; ++t) y[static_cast<size_t>(t) * y_stride + r] = hsum(lanes[t]);
    }
}

template <bool kVnni>
void q6_k_small(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride,
                float* y, size_t y_stride) {
    const auto* wb = static_cast<const uint8_t*>(w);
    for (int t0 = 0; t0 < n_tok; t0 += kMaxTok) {
        const int tc = n_tok - t0 < kMaxTok ? n_tok - t0 : kMaxTok;
        const BlockQ8_K* ya[kMaxTok];
        for (int t = 0; t < tc; ++t) {
            ya[t] = reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(act) + (t0 + t) * act_stride);
        }
        float* yt = y + static_cast<size_t>(t0) * y_stride;
        switch (tc) {
            case 1:
                q6_k_rows<kVnni, 1>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
            case 2:
                q6_k_rows<kVnni, 2>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
            case 3:
                q6_k_rows<kVnni, 3>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
            case 4:
                q6_k_rows<kVnni, 4>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
            case 5:
                q6_k_rows<kVnni, 5>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
            case 6:
                q6_k_rows<kVnni, 6>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
            case 7:
                q6_k_rows<kVnni, 7>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
            default:
                q6_k_rows<kVnni, 8>(n, n_rows, wb, w_stride, ya, yt, y_stride);
                break;
        }
    }
}

template <bool kVnni>
GemmFn table(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::F32:
            return float_small<float>;
        case GgmlType::F16:
            return f16_small;
        case GgmlType::BF16:
            return float_small<uint16_t>;
        case GgmlType::Q8_0:
            return blocks32_small<BlockQ8_0, kVnni>;
        case GgmlType::Q5_0:
            return blocks32_small<BlockQ5_0, kVnni>;
        case GgmlType::Q4_K:
            return q4_5_k_small<BlockQ4_K, kVnni>;
        case GgmlType::Q5_K:
            return q4_5_k_small<BlockQ5_K, kVnni>;
        case GgmlType::Q6_K:
            return q6_k_small<kVnni>;
        default:
            return nullptr;
    }
}

}  // namespace

GemmFn small_batch_avx512(GgmlType weight_type, bool vnni) {
    return vnni ? table<true>(weight_type) : table<false>(weight_type);
}

}  // namespace fitllm::quant::detail
