// AVX-512 (F, BW, VL; VNNI where kVnni) dots for the float types and the blocks of 32. Compiled
// with -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -mf16c; the kVnni = false kernels use no
// VNNI instruction, for AVX-512 CPUs without it. See dot_kernels.h for the rules this file follows.
//
// One 512-bit register holds two blocks of 32: quants of blocks i and i + 1 side by side, their
// 16 partial sums converted to float and scaled with a vector holding d_w d_a of block i in the
// low 8 lanes and of block i + 1 in the high 8.

// GCC 12's AVX-512 headers trip its own uninitialized-variable warnings (the _mm512_undefined_*
// helpers initialize a variable with itself); the warnings point into the header, so silence them there.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "quant/blocks.h"
#include "quant/dot_iq_avx2.h"
#include "quant/dot_kernels.h"
#include "quant/rows16.h"
#include "quant/unroll.h"

namespace fitllm::quant::detail {
namespace {

template <typename T>
const T* as(const void* p) {
    return static_cast<const T*>(p);
}
float f16(uint16_t h) {
    return _cvtsh_ss(h);
}
__m128i load128(const void* p) {
    return _mm_loadu_si128(static_cast<const __m128i*>(p));
}
__m256i load256(const void* p) {
    return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// sum(u * s) over each 4 bytes into the 32-bit lanes of acc; u unsigned, s signed, and
// 2 * u * |s| < 2^15 so that maddubs does not saturate where there is no VNNI.
template <bool kVnni>
__m512i dot_u8s8(__m512i acc, __m512i u, __m512i s) {
    if constexpr (kVnni)
        return _mm512_dpbusd_epi32(acc, u, s);
    else
        return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
}

// ---- F32 and BF16 weights, F32 activations (F16 weights take f16 activations, below) ----

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

template <typename W>
void dot_float(int n, float* out, const void* w, const void* a) {
    const auto* x = as<W>(w);
    const auto* y = as<float>(a);
    constexpr __mmask16 kAll = 0xFFFF;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps(),
           acc3 = _mm512_setzero_ps();
    // Align the weights (streamed from memory) to their vector size: split loads cost a third of
    // the bandwidth when rows start in the middle of a cache line.
    constexpr uintptr_t kVectorBytes = 16 * sizeof(W);
    const uintptr_t misaligned = reinterpret_cast<uintptr_t>(x) % kVectorBytes;
    int i = misaligned == 0 ? 0 : static_cast<int>((kVectorBytes - misaligned) / sizeof(W));
    if (i > n) i = n;
    if (i > 0) {
        const auto head = static_cast<__mmask16>((1u << i) - 1);
        acc3 = _mm512_fmadd_ps(load_weights16<W>(x, head), _mm512_maskz_loadu_ps(head, y), acc3);
    }
    for (; i + 64 <= n; i += 64) {
        acc0 = _mm512_fmadd_ps(load_weights16<W>(x + i, kAll), _mm512_loadu_ps(y + i), acc0);
        acc1 = _mm512_fmadd_ps(load_weights16<W>(x + i + 16, kAll), _mm512_loadu_ps(y + i + 16), acc1);
        acc2 = _mm512_fmadd_ps(load_weights16<W>(x + i + 32, kAll), _mm512_loadu_ps(y + i + 32), acc2);
        acc3 = _mm512_fmadd_ps(load_weights16<W>(x + i + 48, kAll), _mm512_loadu_ps(y + i + 48), acc3);
    }
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? kAll : static_cast<__mmask16>((1u << (n - i)) - 1);
        acc0 = _mm512_fmadd_ps(load_weights16<W>(x + i, m), _mm512_maskz_loadu_ps(m, y + i), acc0);
    }
    *out = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

// ---- F16 weights, F16 activations: dot_ref.cpp's dot_f16 (ggml_vec_dot_f16's order) ----

__m512 load_f16x16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

void dot_f16(int n, float* out, const void* w, const void* a) {
    const auto* x = as<uint16_t>(w);
    const auto* y = as<uint16_t>(a);
    const int np = n & ~63;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps(),
           acc3 = _mm512_setzero_ps();
    for (int i = 0; i < np; i += 64) {
        acc0 = _mm512_fmadd_ps(load_f16x16(x + i), load_f16x16(y + i), acc0);
        acc1 = _mm512_fmadd_ps(load_f16x16(x + i + 16), load_f16x16(y + i + 16), acc1);
        acc2 = _mm512_fmadd_ps(load_f16x16(x + i + 32), load_f16x16(y + i + 32), acc2);
        acc3 = _mm512_fmadd_ps(load_f16x16(x + i + 48), load_f16x16(y + i + 48), acc3);
    }
    double sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc2), _mm512_add_ps(acc1, acc3)));
    for (int i = np; i < n; ++i) sum += static_cast<double>(f16(x[i]) * f16(y[i]));
    *out = static_cast<float>(sum);
}

// ---- Blocks of 32 ----

// The quants of two blocks, unsigned: block b0 in bytes 0..31 (low nibbles = elements 0..15 first),
// b1 in bytes 32..63; the fifth bit added for Q5_0 / Q5_1.
template <typename Block>
__m512i quants_x2(const Block& b0, const Block& b1) {
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(load128(b0.qs)), load128(b1.qs), 1);
    // 128-bit lanes b0, b0, b1, b1; then the second copy of each shifted to its high nibbles.
    const __m512i wide =
        _mm512_permutexvar_epi64(_mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0), _mm512_castsi256_si512(both));
    __m512i q =
        _mm512_and_si512(_mm512_srlv_epi64(wide, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0)), _mm512_set1_epi8(0x0F));
    if constexpr (std::is_same_v<Block, BlockQ5_0> || std::is_same_v<Block, BlockQ5_1>) {
        uint32_t h0, h1;
        std::memcpy(&h0, b0.qh, 4);
        std::memcpy(&h1, b1.qh, 4);
        const __mmask64 fifth = static_cast<__mmask64>(h0) | (static_cast<__mmask64>(h1) << 32);
        q = _mm512_mask_add_epi8(q, fifth, q, _mm512_set1_epi8(16));
    }
    return q;
}

template <typename Block>
__m512i act_x2(const Block& y0, const Block& y1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(load256(y0.qs)), load256(y1.qs), 1);
}

// a[k] * b[k] for four pairs of halves (d_w * d_a of four blocks, or m_w * s_a): one conversion.
__m128 products4(uint16_t a0, uint16_t a1, uint16_t a2, uint16_t a3, uint16_t b0, uint16_t b1, uint16_t b2,
                 uint16_t b3) {
    auto h = [](uint16_t v) { return static_cast<short>(v); };
    const __m256 f = _mm256_cvtph_ps(_mm_setr_epi16(h(a0), h(a1), h(a2), h(a3), h(b0), h(b1), h(b2), h(b3)));
    return _mm_mul_ps(_mm256_castps256_ps128(f), _mm256_extractf128_ps(f, 1));
}

// sum((q - offset) * y) for two blocks, q unsigned below 32.
template <bool kVnni, int kOffset>
__m512i pair_dot(__m512i q, __m512i y) {
    const __m512i zero = _mm512_setzero_si512();
    if constexpr (kOffset == 0) {
        return dot_u8s8<kVnni>(zero, q, y);
    } else if constexpr (kVnni) {
        const __m512i offsets = _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(kOffset), y);
        return _mm512_dpbusd_epi32(_mm512_sub_epi32(zero, offsets), q, y);
    } else {
        const __m512i pairs =
            _mm512_sub_epi16(_mm512_maddubs_epi16(q, y), _mm512_maddubs_epi16(_mm512_set1_epi8(kOffset), y));
        return _mm512_madd_epi16(pairs, _mm512_set1_epi16(1));
    }
}

// llama.cpp's hsum_float_8.
float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// sum over the row's nb blocks of d_w d_a times the block's integer dot, where pair_sums(i, j) gives
// the 16 partial sums of blocks i (low 8 lanes) and j (high 8), each over 4 consecutive elements.
// Integer sums two blocks a register; the float steps in the order dot_ref.cpp defines: lanes8
// (one 8-lane accumulator, block after block, then hsum8) or serial (one float, block after block).
template <bool kLanes8, typename WBlock, typename ABlock, typename PairSums>
float sum_blocks(const WBlock* x, const ABlock* y, int nb, PairSums pair_sums) {
    __m256 lanes = _mm256_setzero_ps();
    __m128 acc = _mm_setzero_ps();
    auto add = [&](int i, __m256i sums8) {
        const float d = f16(x[i].d) * f16(y[i].d);
        if constexpr (kLanes8) {
            lanes = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums8), lanes);
        } else {
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sums8), _mm256_extracti128_si256(sums8, 1));
            s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 1));
            acc = _mm_fmadd_ss(_mm_cvtepi32_ps(s4), _mm_set_ss(d), acc);
        }
    };
    int i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512i sums = pair_sums(i, i + 1);
        add(i, _mm512_castsi512_si256(sums));
        add(i + 1, _mm512_extracti64x4_epi64(sums, 1));
    }
    if (i < nb) add(i, _mm512_castsi512_si256(pair_sums(i, i)));
    return kLanes8 ? hsum8(lanes) : _mm_cvtss_f32(acc);
}

// Q4_0, Q5_0 with Q8_0.
template <typename Block, int kOffset, bool kVnni>
void dot_symmetric32(int n, float* out, const void* w, const void* a) {
    const auto* x = as<Block>(w);
    const auto* y = as<BlockQ8_0>(a);
    constexpr bool kLanes8 = std::is_same_v<Block, BlockQ5_0>;  // Q4_0: serial (dot_ref.cpp)
    *out = sum_blocks<kLanes8>(x, y, n / 32, [&](int i, int j) {
        return pair_dot<kVnni, kOffset>(quants_x2(x[i], x[j]), act_x2(y[i], y[j]));
    });
}

// Q4_1, Q5_1 with Q8_1: d_w d_a sum(q y) + m_w s_a.
template <typename Block, bool kVnni>
void dot_affine32(int n, float* out, const void* w, const void* a) {
    const auto* x = as<Block>(w);
    const auto* y = as<BlockQ8_1>(a);
    const int nb = n / 32;
    __m128 mins = _mm_setzero_ps();
    int i = 0;
    for (; i + 4 <= nb; i += 4) {
        mins = _mm_add_ps(
            mins, products4(x[i].m, x[i + 1].m, x[i + 2].m, x[i + 3].m, y[i].s, y[i + 1].s, y[i + 2].s, y[i + 3].s));
    }
    float tail = 0.0f;
    for (; i < nb; ++i) tail += f16(x[i].m) * f16(y[i].s);
    const float dots = sum_blocks<true>(
        x, y, nb, [&](int b0, int b1) { return pair_dot<kVnni, 0>(quants_x2(x[b0], x[b1]), act_x2(y[b0], y[b1])); });
    mins = _mm_add_ps(mins, _mm_movehl_ps(mins, mins));
    *out = dots + _mm_cvtss_f32(_mm_add_ss(mins, _mm_movehdup_ps(mins))) + tail;
}

// sum(x * y) per 4 bytes, both signed: x's sign moved onto y so the unsigned side is |x|. Exact
// while neither holds -128, which Q8_0 activations and the weights paired with them avoid.
template <bool kVnni>
__m512i signed_pair_dot(__m512i xq, __m512i yq) {
    const __m512i y_signed = _mm512_mask_sub_epi8(yq, _mm512_movepi8_mask(xq), _mm512_setzero_si512(), yq);
    return dot_u8s8<kVnni>(_mm512_setzero_si512(), _mm512_abs_epi8(xq), y_signed);
}

// Q8_0 with Q8_0.
template <bool kVnni>
void dot_q8_0(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockQ8_0>(w);
    const auto* y = as<BlockQ8_0>(a);
    *out = sum_blocks<true>(
        x, y, n / 32, [&](int i, int j) { return signed_pair_dot<kVnni>(act_x2(x[i], x[j]), act_x2(y[i], y[j])); });
}

// IQ4_NL with Q8_0: the nibble indices of two blocks looked up in the 16-value table (one pshufb, the
// table in every 128-bit lane), then the signed x signed dot of Q8_0.
template <bool kVnni>
void dot_iq4_nl(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockIQ4_NL>(w);
    const auto* y = as<BlockQ8_0>(a);
    const __m512i values = _mm512_broadcast_i32x4(load128(kValuesIQ4NL));
    *out = sum_blocks<false>(x, y, n / 32, [&](int i, int j) {
        return signed_pair_dot<kVnni>(_mm512_shuffle_epi8(values, quants_x2(x[i], x[j])), act_x2(y[i], y[j]));
    });
}

// IQ4_XS with Q8_K: two sub-blocks of 32 a register (their 32 bytes of nibbles spread as
// quants_x2 spreads two blocks), looked up and dotted as IQ4_NL, each half's sums scaled by its
// sub-block's ls - 32; the halves folded into dot_ref.cpp's eight lanes (exact in integers), one
// FMA per lane and super-block, hsum at the end: its lanes8 order.
template <bool kVnni>
void dot_iq4_xs(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockIQ4_XS>(w);
    const auto* y = as<BlockQ8_K>(a);
    const __m512i values = _mm512_broadcast_i32x4(load128(kValuesIQ4NL));
    const __m512i spread = _mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0);
    const __m512i shifts = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    __m256 lanes = _mm256_setzero_ps();
    for (int i = 0; i < n / kQK; ++i) {
        __m512i sums = _mm512_setzero_si512();
        for (int ib = 0; ib < kQK / 32; ib += 2) {
            const int ls = x[i].scales_l[ib / 2];
            const int s0 = ((ls & 0xF) | (((x[i].scales_h >> (2 * ib)) & 3) << 4)) - 32;
            const int s1 = ((ls >> 4) | (((x[i].scales_h >> (2 * ib + 2)) & 3) << 4)) - 32;
            const __m512i wide = _mm512_permutexvar_epi64(spread, _mm512_castsi256_si512(load256(x[i].qs + 16 * ib)));
            const __m512i q = _mm512_and_si512(_mm512_srlv_epi64(wide, shifts), _mm512_set1_epi8(0x0F));
            const __m512i dots =
                signed_pair_dot<kVnni>(_mm512_shuffle_epi8(values, q), _mm512_loadu_si512(y[i].qs + 32 * ib));
            const __m512i scales = _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(s0), _mm512_set1_epi32(s1));
            sums = _mm512_add_epi32(sums, _mm512_mullo_epi32(dots, scales));
        }
        // The two sub-blocks' halves folded (exact in integers): lane l of dot_ref.cpp's lanes8.
        const __m256i folded = _mm256_add_epi32(_mm512_castsi512_si256(sums), _mm512_extracti64x4_epi64(sums, 1));
        lanes = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[i].d) * y[i].d), _mm256_cvtepi32_ps(folded), lanes);
    }
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(lanes), _mm256_extractf128_ps(lanes, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    *out = _mm_cvtss_f32(_mm_add_ss(s4, _mm_movehdup_ps(s4)));
}

// ---- Ternary and MXFP4 ----

// The 16 int32 lanes of two 32-byte steps folded into dot_ref.cpp's eight (exact in integers), the
// -1 of every value taken off through bsums (bsums[2l] + bsums[2l + 1] from lane l), and the FMA
// into the row's lanes as its dot_ternary orders it.
__m256 ternary_fma(__m512i sums, const BlockQ8_K& y, uint16_t d_w, __m256 lanes) {
    const __m256i ysum = _mm256_madd_epi16(load256(y.bsums), _mm256_set1_epi16(1));
    const __m256i folded =
        _mm256_sub_epi32(_mm256_add_epi32(_mm512_castsi512_si256(sums), _mm512_extracti64x4_epi64(sums, 1)), ysum);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(folded), _mm256_set1_ps(y.d * f16(d_w)), lanes);
}
float hsum_lanes(__m256 lanes) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(lanes), _mm256_extractf128_ps(lanes, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s4, _mm_movehdup_ps(s4)));
}

// TQ2_0 with Q8_K: all 64 bytes of codes in one register, field f (bits 2f) against y's steps f
// and 4 + f.
template <bool kVnni>
void dot_tq2_0(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockTQ2_0>(w);
    const auto* y = as<BlockQ8_K>(a);
    const __m512i mask = _mm512_set1_epi8(3);
    __m256 lanes = _mm256_setzero_ps();
    for (int i = 0; i < n / kQK; ++i) {
        const __m512i q = _mm512_loadu_si512(x[i].qs);
        __m512i sums = _mm512_setzero_si512();
        for (int f = 0; f < 4; ++f) {
            const __m512i q8 = _mm512_inserti64x4(_mm512_castsi256_si512(load256(y[i].qs + 32 * f)),
                                                  load256(y[i].qs + 128 + 32 * f), 1);
            sums = dot_u8s8<kVnni>(sums, _mm512_and_si512(_mm512_srli_epi16(q, 2 * f), mask), q8);
        }
        lanes = ternary_fma(sums, y[i], x[i].d, lanes);
    }
    *out = hsum_lanes(lanes);
}

// The leading trit of a byte q: (3 q) >> 8 = (q >= 86) + (q >= 171).
__m512i leading_trit(__m512i q) {
    const __mmask64 ge86 = _mm512_cmpge_epu8_mask(q, _mm512_set1_epi8(86));
    const __mmask64 ge171 = _mm512_cmpge_epu8_mask(q, _mm512_set1_epi8(static_cast<char>(171)));
    const __m512i one = _mm512_set1_epi8(1);
    return _mm512_add_epi8(_mm512_maskz_mov_epi8(ge86, one), _mm512_maskz_mov_epi8(ge171, one));
}
__m512i join(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// TQ1_0 with Q8_K: the trits of the 32-byte row (times 1, 3, 9, 27, 81), of the 16-byte row and of
// qh (4 bytes times 1, 3, 9, 27, one dword each) arranged in the order of y, 64 bytes a step.
template <bool kVnni>
void dot_tq1_0(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockTQ1_0>(w);
    const auto* y = as<BlockQ8_K>(a);
    __m256 lanes = _mm256_setzero_ps();
    for (int i = 0; i < n / kQK; ++i) {
        const __m256i p0 = load256(x[i].qs);
        const __m256i p1 = _mm256_add_epi8(p0, _mm256_add_epi8(p0, p0));
        const __m256i p2 = _mm256_add_epi8(p1, _mm256_add_epi8(p1, p1));
        const __m256i p3 = _mm256_add_epi8(p2, _mm256_add_epi8(p2, p2));
        const __m256i p4 = _mm256_add_epi8(p3, _mm256_add_epi8(p3, p3));
        const __m128i r0 = load128(x[i].qs + 32);
        const __m128i r1 = _mm_add_epi8(r0, _mm_add_epi8(r0, r0));
        const __m128i r2 = _mm_add_epi8(r1, _mm_add_epi8(r1, r1));
        const __m128i r3 = _mm_add_epi8(r2, _mm_add_epi8(r2, r2));
        const __m128i r4 = _mm_add_epi8(r3, _mm_add_epi8(r3, r3));
        uint32_t qh;
        std::memcpy(&qh, x[i].qh, 4);
        const __m128i h0 = _mm_set1_epi32(static_cast<int>(qh));
        const __m128i h1 = _mm_add_epi8(h0, _mm_add_epi8(h0, h0));
        const __m128i h2 = _mm_add_epi8(h1, _mm_add_epi8(h1, h1));
        const __m128i h3 = _mm_add_epi8(h2, _mm_add_epi8(h2, h2));
        const __m128i h = _mm_blend_epi32(_mm_blend_epi32(_mm_blend_epi32(h0, h1, 0b0010), h2, 0b0100), h3, 0b1000);
        const __m512i steps[4] = {join(p0, p1), join(p2, p3), join(p4, _mm256_set_m128i(r1, r0)),
                                  join(_mm256_set_m128i(r3, r2), _mm256_set_m128i(h, r4))};
        __m512i sums = _mm512_setzero_si512();
        for (int s = 0; s < 4; ++s)
            sums = dot_u8s8<kVnni>(sums, leading_trit(steps[s]), _mm512_loadu_si512(y[i].qs + 64 * s));
        lanes = ternary_fma(sums, y[i], x[i].d, lanes);
    }
    *out = hsum_lanes(lanes);
}

// ggml's GGML_E8M0_TO_FP32_HALF: 2^(e - 128).
float e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// MXFP4 with Q8_0: two blocks a register (nibbles spread as quants_x2 spreads them), looked up in
// the doubled e2m1 table; the even block's sums in the low 8 lanes and the odd one's in the high 8,
// each with its own scale: dot_ref.cpp's dot_mxfp4 (llama.cpp's two accumulators) in one register.
template <bool kVnni>
void dot_mxfp4(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockMXFP4>(w);
    const auto* y = as<BlockQ8_0>(a);
    const __m512i values = _mm512_broadcast_i32x4(load128(kValuesMXFP4));
    const int nb = n / 32;
    __m512 acc = _mm512_setzero_ps();
    int ib = 0;
    for (; ib + 1 < nb; ib += 2) {
        const __m512i dots =
            signed_pair_dot<kVnni>(_mm512_shuffle_epi8(values, quants_x2(x[ib], x[ib + 1])), act_x2(y[ib], y[ib + 1]));
        const __m512 scales = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(f16(y[ib].d) * e8m0_half(x[ib].e)),
                                                   _mm512_set1_ps(f16(y[ib + 1].d) * e8m0_half(x[ib + 1].e)));
        acc = _mm512_fmadd_ps(scales, _mm512_cvtepi32_ps(dots), acc);
    }
    const __m256 odd = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
    float sum = hsum_lanes(_mm256_add_ps(_mm512_castps512_ps256(acc), odd));
    if (ib < nb) {
        const __m512i dots =
            signed_pair_dot<kVnni>(_mm512_shuffle_epi8(values, quants_x2(x[ib], x[ib])), act_x2(y[ib], y[ib]));
        const __m256i low = _mm512_castsi512_si256(dots);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(low), _mm256_extracti128_si256(low, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        const int sumi = _mm_cvtsi128_si32(s4);
        const __m128 d = _mm_set_ss(f16(y[ib].d) * e8m0_half(x[ib].e));
        sum = _mm_cvtss_f32(_mm_fmadd_ss(d, _mm_cvtsi32_ss(_mm_setzero_ps(), sumi), _mm_set_ss(sum)));
    }
    *out = sum;
}

// ---- Many rows at once (matrix-vector): Q4_0, IQ4_NL ----
//
// Sixteen rows a step, one row per int32 lane. A block's 16 bytes of nibbles are 4 dwords, dword c
// holding elements 4c..4c+3 (low nibbles) and 16+4c..16+4c+3 (high nibbles); the 16 rows' blocks
// are loaded into 4 registers (rows j, j+4, j+8, j+12 in the 128-bit lanes of register j) and
// transposed so that register c holds dword c of every row, lane k for row k. Then each lane's
// integer dot needs no reduction: dword c's nibbles against y's dwords c and 4 + c broadcast to
// every lane (dpbusd, or maddubs + madd without VNNI), 8 steps a block. The unsigned codes' offset
// (Q4_0: q - 8; IQ4_NL: table value + 128, unsigned for dpbusd) comes off as offset * sum(y) of the
// block, computed once per call. Every row's float steps are its single dot's serial ones: acc =
// fma(float(block sum), d_w d_a, acc), block after block, so each lane's result has that dot's bits.

// -kOffset * sum(y) of each block in [b0, b1), into off[i - b0] (maddubs cannot saturate: 2 * 128 *
// 127 < 2^15).
template <int kOffset>
void block_offsets(const BlockQ8_0* y, int b0, int b1, int32_t* off) {
    for (int i = b0; i < b1; ++i) {
        const __m256i pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(static_cast<char>(kOffset)), load256(y[i].qs));
        const __m256i s8 = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
        s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 1));
        off[i - b0] = -_mm_cvtsi128_si32(s4);
    }
}

// The 4 bytes at p in every dword.
__m512i broadcast32(const int8_t* p) {
    return _mm512_broadcastd_epi32(_mm_loadu_si32(p));
}

uint64_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

// acc + the float steps of `count` blocks of 16 rows (lo: their first block, then `stride` apart),
// lane k for row k; y and offsets (-kOffset * sum(y) of each block) from the same block on. codes
// (nibbles) gives the unsigned byte that multiplies y. Not inlined: the caller's loops would take
// the registers this loop needs.
template <typename Block, bool kVnni, typename Codes>
__attribute__((noinline)) __m512 rows16_blocks(const uint8_t* lo, size_t stride, const BlockQ8_0* y,
                                               const int32_t* offsets, int count, __m512 acc, Codes codes) {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    const size_t s1 = stride, s3 = 3 * stride, s5 = 5 * stride, s7 = 7 * stride;
    const uint8_t* hi = lo + 8 * stride;
    const size_t ahead = 16 * stride;  // the next group's rows, read while these compute
    for (int i = 0; i < count; ++i, lo += sizeof(Block), hi += sizeof(Block)) {
        const Rows16 rows{lo, hi, s1, s3, s5, s7};  // row k's block i
        // Every 36 bytes, each row's next line of the next group, into L2: the fastest of the
        // ways measured (into L1 with _MM_HINT_T0: 0.5x; the next group front to back, a line per
        // 64 of its bytes: 0.85x). A plain loop: GCC 12 drops the prefetches inside unroll's lambda.
        if (i % 2 == 0) {
            for (int k = 0; k < 16; ++k) _mm_prefetch(reinterpret_cast<const char*>(rows.row(k) + ahead), _MM_HINT_T1);
        }
        __m512i z[4];
        unroll<4>([&](auto j_) {
            constexpr int j = decltype(j_)::value;
            __m512i v = _mm512_castsi128_si512(load128(rows.row(j) + 2));
            v = _mm512_inserti32x4(v, load128(rows.row(j + 4) + 2), 1);
            v = _mm512_inserti32x4(v, load128(rows.row(j + 8) + 2), 2);
            z[j] = _mm512_inserti32x4(v, load128(rows.row(j + 12) + 2), 3);
        });
        const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
        const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
        const __m512i dwords[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                                   _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
        // Two chains (low and high nibbles), added exactly.
        __m512i low = _mm512_set1_epi32(offsets[i]), high = _mm512_setzero_si512();
        unroll<4>([&](auto c_) {
            constexpr int c = decltype(c_)::value;
            low = dot_u8s8<kVnni>(low, codes(_mm512_and_si512(dwords[c], nibble)), broadcast32(y[i].qs + 4 * c));
            high = dot_u8s8<kVnni>(high, codes(_mm512_and_si512(_mm512_srli_epi32(dwords[c], 4), nibble)),
                                   broadcast32(y[i].qs + 16 + 4 * c));
        });
        // The 16 rows' d, four to a 64-bit word (scalar loads, off the vector ports).
        uint64_t d4[4];
        unroll<4>([&](auto g_) {
            constexpr int g = decltype(g_)::value;
            d4[g] = load_u16(rows.row(4 * g)) | load_u16(rows.row(4 * g + 1)) << 16 |
                    load_u16(rows.row(4 * g + 2)) << 32 | load_u16(rows.row(4 * g + 3)) << 48;
        });
        const __m256i dw = _mm256_setr_epi64x(static_cast<long long>(d4[0]), static_cast<long long>(d4[1]),
                                              static_cast<long long>(d4[2]), static_cast<long long>(d4[3]));
        const __m512 scale = _mm512_mul_ps(_mm512_cvtph_ps(dw), _mm512_set1_ps(f16(y[i].d)));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(low, high)), scale, acc);
    }
    return acc;
}

// Block is BlockQ4_0 or BlockIQ4_NL (d, then 16 bytes of nibbles), kOffset what the unsigned codes
// stand above the weights. The rows past the last sixteen go to `tail`.
template <typename Block, int kOffset, bool kVnni, typename Codes>
void dot_rows16(int n, int n_rows, float* out, const void* w, size_t stride, const void* a, Codes codes,
                DotRowsFn tail) {
    static_assert(sizeof(Block) == 18 && offsetof(Block, qs) == 2);
    const auto* y = as<BlockQ8_0>(a);
    const auto* base = static_cast<const uint8_t*>(w);
    const int nb = n / 32;
    // The offsets of up to kChunk blocks at a time: once per call for rows of up to kChunk blocks,
    // else once per chunk and group.
    constexpr int kChunk = 512;
    alignas(64) int32_t offsets[kChunk];
    const bool once = nb <= kChunk;
    if (once) block_offsets<kOffset>(y, 0, nb, offsets);
    int r = 0;
    for (; r + 16 <= n_rows; r += 16) {
        const uint8_t* rows = base + static_cast<size_t>(r) * stride;
        __m512 acc = _mm512_setzero_ps();
        for (int c0 = 0; c0 < nb; c0 += kChunk) {
            const int count = nb - c0 < kChunk ? nb - c0 : kChunk;
            if (!once) block_offsets<kOffset>(y, c0, c0 + count, offsets);
            acc = rows16_blocks<Block, kVnni>(rows + static_cast<size_t>(c0) * sizeof(Block), stride, y + c0, offsets,
                                              count, acc, codes);
        }
        _mm512_storeu_ps(out + r, acc);
    }
    if (r < n_rows) tail(n, n_rows - r, out + r, base + static_cast<size_t>(r) * stride, stride, a);
}

template <bool kVnni>
void dot_rows_q4_0(int n, int n_rows, float* out, const void* w, size_t stride, const void* a) {
    dot_rows16<BlockQ4_0, 8, kVnni>(
        n, n_rows, out, w, stride, a, [](__m512i q) { return q; }, dot_rows_avx2(GgmlType::Q4_0));
}

// VNNI only: the table's values + 128 reach 241, so maddubs's pair sums could saturate.
void dot_rows_iq4_nl(int n, int n_rows, float* out, const void* w, size_t stride, const void* a) {
    const __m512i values = _mm512_add_epi8(_mm512_broadcast_i32x4(load128(kValuesIQ4NL)), _mm512_set1_epi8(-128));
    dot_rows16<BlockIQ4_NL, 128, true>(
        n, n_rows, out, w, stride, a, [values](__m512i q) { return _mm512_shuffle_epi8(values, q); },
        dot_rows_avx2(GgmlType::IQ4_NL));
}

// ---- Many rows at once (matrix-vector): Q8_0, Q5_0 ----
//
// Two rows a register, each in its single dot's layout (no transpose): row 2p's block in the low
// 256 bits, row 2p + 1's in the high, each int32 lane the sum over 4 consecutive elements, which
// is dot_q8_0's lanes8 order. So every half's float steps are the dot's own: lanes = fma(float(
// sums), d_w d_a, lanes) block after block, hsum8 at the end. Sixteen rows (8 registers) a step,
// their 16 d's converted at once and spread to the halves with one permute each. With VNNI the
// weights go unsigned (w ^ 0x80 = w + 128) and 128 times y's sum over each 4 elements comes off
// first: the exact sum, as the single dot's sign trick gives it while |y| <= 127 (Q8_0 activations
// are); without VNNI, that sign trick itself (maddubs cannot saturate: 2 * 128 * 127 < 2^15).
// Q5_0 (also lanes8) the same way, its two rows' quants built as quants_x2 builds two blocks, the
// offset 16 taken off as its single dot does.

// How lanes8_rows16 prefetches (an enum, not a bool: DotIsolation finds the kVnni = false kernels by
// "false" in their names).
enum class RowsAt { kApart, kBackToBack };

template <typename Block, bool kVnni, RowsAt kRows>
__attribute__((noinline)) void lanes8_rows16(const uint8_t* lo, size_t stride, const BlockQ8_0* y, int nb, float* out) {
    constexpr bool kQ8 = std::is_same_v<Block, BlockQ8_0>;
    const size_t s1 = stride, s3 = 3 * stride, s5 = 5 * stride, s7 = 7 * stride;
    const uint8_t* hi = lo + 8 * stride;
    const size_t ahead = 16 * stride;  // the next group's rows, read while these compute
    // Where the rows are back to back, the group after the next while a group is at most 64 KiB.
    const uint8_t* next = lo + (16 * stride <= 65536 ? 2 : 1) * ahead;
    // What the unsigned bytes stand above the weights (Q8_0 with VNNI: w ^ 0x80).
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(kQ8 ? 0x80 : 16));
    __m512 acc[8];
    unroll<8>([&](auto p_) { acc[decltype(p_)::value] = _mm512_setzero_ps(); });
    for (int i = 0; i < nb; ++i, lo += sizeof(Block), hi += sizeof(Block)) {
        const Rows16 rows{lo, hi, s1, s3, s5, s7};  // row k's block i
        // A later group into L2: where the rows are back to back (a matrix's), its bytes front to
        // back, 16 x 34 of them a block (a throwaway harness, thread CPU time, one thread: 45-57 GB/s
        // from L2 against 32 for rows16_blocks's way; from memory the group after the next gained
        // 5-10% for groups of 640- and 2048-wide rows, lost for 5632); else as rows16_blocks.
        if constexpr (kRows == RowsAt::kBackToBack) {
            const size_t end = static_cast<size_t>(i + 1) * 16 * sizeof(Block);
            for (size_t at = static_cast<size_t>(i) * 16 * sizeof(Block) & ~size_t{63}; at < end; at += 64)
                _mm_prefetch(reinterpret_cast<const char*>(next + at), _MM_HINT_T1);
        } else if (i % 2 == 0) {
            for (int k = 0; k < 16; ++k) _mm_prefetch(reinterpret_cast<const char*>(rows.row(k) + ahead), _MM_HINT_T1);
        }
        const __m512i yy = _mm512_broadcast_i64x4(load256(y[i].qs));
        __m512i off = _mm512_setzero_si512();
        if constexpr (kVnni) off = _mm512_sub_epi32(off, _mm512_dpbusd_epi32(off, bias, yy));
        uint64_t d4[4];
        unroll<4>([&](auto g_) {
            constexpr int g = decltype(g_)::value;
            d4[g] = load_u16(rows.row(4 * g)) | load_u16(rows.row(4 * g + 1)) << 16 |
                    load_u16(rows.row(4 * g + 2)) << 32 | load_u16(rows.row(4 * g + 3)) << 48;
        });
        const __m256i dw = _mm256_setr_epi64x(static_cast<long long>(d4[0]), static_cast<long long>(d4[1]),
                                              static_cast<long long>(d4[2]), static_cast<long long>(d4[3]));
        const __m512 scale = _mm512_mul_ps(_mm512_cvtph_ps(dw), _mm512_set1_ps(f16(y[i].d)));
        unroll<8>([&](auto p_) {
            constexpr int p = decltype(p_)::value;
            __m512i sums;
            if constexpr (kQ8) {
                const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(load256(rows.row(2 * p) + 2)),
                                                     load256(rows.row(2 * p + 1) + 2), 1);
                if constexpr (kVnni)
                    sums = _mm512_dpbusd_epi32(off, _mm512_xor_si512(w, bias), yy);
                else
                    sums = signed_pair_dot<false>(w, yy);
            } else {
                const __m512i q = quants_x2(*as<Block>(rows.row(2 * p)), *as<Block>(rows.row(2 * p + 1)));
                if constexpr (kVnni)
                    sums = _mm512_dpbusd_epi32(off, q, yy);
                else
                    sums = pair_dot<false, 16>(q, yy);
            }
            const __m512 d = _mm512_permutexvar_ps(
                _mm512_set_epi32(2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1,
                                 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p),
                scale);
            acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), d, acc[p]);
        });
    }
    // hsum8 of each half: lanes j + j+4, then + j+2, then + j+1 (the same adds, in each half).
    unroll<8>([&](auto p_) {
        constexpr int p = decltype(p_)::value;
        const __m512 t = _mm512_add_ps(acc[p], _mm512_shuffle_f32x4(acc[p], acc[p], _MM_SHUFFLE(2, 3, 0, 1)));
        const __m512 u = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(1, 0, 3, 2)));
        const __m512 r = _mm512_add_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(2, 3, 0, 1)));
        out[2 * p] = _mm512_cvtss_f32(r);
        out[2 * p + 1] = _mm_cvtss_f32(_mm512_extractf32x4_ps(r, 2));
    });
}

// The rows past the last sixteen take the single dot, row by row.
template <typename Block, bool kVnni>
void dot_rows_lanes8(int n, int n_rows, float* out, const void* w, size_t stride, const void* a) {
    const auto* y = as<BlockQ8_0>(a);
    const auto* base = static_cast<const uint8_t*>(w);
    int r = 0;
    const int nb = n / 32;
    const bool contiguous = stride == static_cast<size_t>(nb) * sizeof(Block);
    for (; r + 16 <= n_rows; r += 16) {
        const uint8_t* rows = base + static_cast<size_t>(r) * stride;
        if (contiguous)
            lanes8_rows16<Block, kVnni, RowsAt::kBackToBack>(rows, stride, y, nb, out + r);
        else
            lanes8_rows16<Block, kVnni, RowsAt::kApart>(rows, stride, y, nb, out + r);
    }
    for (; r < n_rows; ++r) {
        if constexpr (std::is_same_v<Block, BlockQ8_0>)
            dot_q8_0<kVnni>(n, out + r, base + static_cast<size_t>(r) * stride, a);
        else
            dot_symmetric32<Block, 16, kVnni>(n, out + r, base + static_cast<size_t>(r) * stride, a);
    }
}

template <bool kVnni>
DotFn table(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::F32:
            return dot_float<float>;
        case GgmlType::F16:
            return dot_f16;
        case GgmlType::BF16:
            return dot_float<uint16_t>;
        case GgmlType::Q4_0:
            return dot_symmetric32<BlockQ4_0, 8, kVnni>;
        case GgmlType::Q4_1:
            return dot_affine32<BlockQ4_1, kVnni>;
        case GgmlType::Q5_0:
            return dot_symmetric32<BlockQ5_0, 16, kVnni>;
        case GgmlType::Q5_1:
            return dot_affine32<BlockQ5_1, kVnni>;
        case GgmlType::Q8_0:
            return dot_q8_0<kVnni>;
        case GgmlType::IQ4_NL:
            return dot_iq4_nl<kVnni>;
        case GgmlType::IQ4_XS:
            return dot_iq4_xs<kVnni>;
        case GgmlType::TQ1_0:
            return dot_tq1_0<kVnni>;
        case GgmlType::TQ2_0:
            return dot_tq2_0<kVnni>;
        case GgmlType::MXFP4:
            return dot_mxfp4<kVnni>;
        default:
            return iq::dot(weight_type);  // the AVX2 kernels of dot_iq_avx2.h, compiled here
    }
}

}  // namespace

DotFn dot_avx512(GgmlType weight_type, bool vnni) {
    return vnni ? table<true>(weight_type) : table<false>(weight_type);
}

DotRowsFn dot_rows_avx512(GgmlType weight_type, bool vnni) {
    switch (weight_type) {
        case GgmlType::Q4_0:
            return vnni ? dot_rows_q4_0<true> : dot_rows_q4_0<false>;
        case GgmlType::IQ4_NL:
            return vnni ? dot_rows_iq4_nl : nullptr;
        case GgmlType::Q8_0:
            return vnni ? dot_rows_lanes8<BlockQ8_0, true> : dot_rows_lanes8<BlockQ8_0, false>;
        case GgmlType::Q5_0:
            return vnni ? dot_rows_lanes8<BlockQ5_0, true> : dot_rows_lanes8<BlockQ5_0, false>;
        default:
            return nullptr;
    }
}

}  // namespace fitllm::quant::detail
