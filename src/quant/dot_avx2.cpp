// AVX2 + FMA + F16C dots for the float types and the blocks of 32 (compiled with -mavx2 -mfma
// -mf16c; see dot_kernels.h for the rules this file follows).
//
// Integer dots run on maddubs (unsigned 8-bit x signed 8-bit, pairs summed to 16 bits) and madd
// (16-bit pairs to 32 bits). The weight quants are kept unsigned (0..15 or 0..31) and the offset
// is subtracted as offset * sum(y), so no pair sum can saturate. One block's 8 partial sums are
// converted to float and scaled by d_w * d_a with one FMA; four blocks a step share one
// conversion of their eight half-precision scales.
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "quant/blocks.h"
#include "quant/dot_iq_avx2.h"
#include "quant/dot_kernels.h"
#include "quant/kquant_avx2.h"

namespace fitllm::quant::detail {
namespace {

// ---- Float weights, F32 activations ----

__m256 load8(const float* p) {
    return _mm256_loadu_ps(p);
}

// Eight weights as floats: F32 (float), or BF16 (uint16_t; F16 weights take f16 activations, below).
template <typename W>
__m256 load_weights8(const W* p) {
    if constexpr (std::is_same_v<W, float>) {
        return _mm256_loadu_ps(p);
    } else {
        const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
    }
}

float bf16_scalar(uint16_t h) {
    return _mm_cvtss_f32(_mm_castsi128_ps(_mm_cvtsi32_si128(static_cast<int>(h) << 16)));
}

// W is float (F32) or uint16_t (BF16).
template <typename W>
void dot_float(int n, float* out, const void* w, const void* a) {
    const auto* x = as<W>(w);
    const auto* y = as<float>(a);
    auto load_w = load_weights8<W>;
    auto weight = [](W v) {
        if constexpr (std::is_same_v<W, float>)
            return v;
        else
            return bf16_scalar(v);
    };
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
           acc3 = _mm256_setzero_ps();
    // Align the weights (streamed from memory) to their vector size: split loads cost bandwidth
    // when rows start in the middle of a cache line.
    constexpr uintptr_t kVectorBytes = 8 * sizeof(W);
    const uintptr_t misaligned = reinterpret_cast<uintptr_t>(x) % kVectorBytes;
    int head = misaligned == 0 ? 0 : static_cast<int>((kVectorBytes - misaligned) / sizeof(W));
    if (head > n) head = n;
    float head_sum = 0.0f;
    for (int k = 0; k < head; ++k) head_sum += weight(x[k]) * y[k];
    int i = head;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(load_w(x + i), load8(y + i), acc0);
        acc1 = _mm256_fmadd_ps(load_w(x + i + 8), load8(y + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(load_w(x + i + 16), load8(y + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(load_w(x + i + 24), load8(y + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load_w(x + i), load8(y + i), acc0);
    float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3))) + head_sum;
    for (; i < n; ++i) sum += weight(x[i]) * y[i];
    *out = sum;
}

// ---- F16 weights, F16 activations: dot_ref.cpp's dot_f16 (ggml_vec_dot_f16's AVX-512 order) ----
// Each 16-lane accumulator of the reference is two 8-lane halves here (lo: lanes 0..7, hi: 8..15).

__m256 load_f16x8(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

void dot_f16(int n, float* out, const void* w, const void* a) {
    const auto* x = as<uint16_t>(w);
    const auto* y = as<uint16_t>(a);
    const int np = n & ~63;
    __m256 acc[8];
    for (auto& v : acc) v = _mm256_setzero_ps();
    for (int i = 0; i < np; i += 64) {
        for (int k = 0; k < 8; ++k) {
            acc[k] = _mm256_fmadd_ps(load_f16x8(x + i + 8 * k), load_f16x8(y + i + 8 * k), acc[k]);
        }
    }
    // accumulator j is acc[2j] (lanes 0..7) and acc[2j + 1] (lanes 8..15)
    const __m256 lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
    const __m256 hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
    double sum = reduce_add16(lo, hi);
    for (int i = np; i < n; ++i) sum += static_cast<double>(f16(x[i]) * f16(y[i]));
    *out = static_cast<float>(sum);
}

// ---- Blocks of 32 ----

// 16 bytes of nibbles -> 32 bytes: the low nibbles (elements 0..15), then the high ones (16..31).
__m256i unpack_nibbles(const uint8_t* qs) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// Byte l is 0x10 where bit l of the 32 bits is set (the 5th bit of Q5_0 / Q5_1).
__m256i fifth_bits(const uint8_t* qh) {
    uint32_t bits;
    std::memcpy(&bits, qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(  // byte l gets byte l / 8 of the bits
        _mm256_set1_epi32(static_cast<int>(bits)),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    const __m256i select = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

__m256i load32(const int8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// sum(q * y) - offset * sum(y) per 4 elements, in 8 int32 lanes; q unsigned below 32.
template <int kOffset>
__m256i block_dot(__m256i q, __m256i y) {
    __m256i pairs = _mm256_maddubs_epi16(q, y);
    if constexpr (kOffset != 0) pairs = _mm256_sub_epi16(pairs, _mm256_maddubs_epi16(_mm256_set1_epi8(kOffset), y));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

template <typename Block>
__m256i quants(const Block& b) {
    if constexpr (std::is_same_v<Block, BlockQ4_0> || std::is_same_v<Block, BlockQ4_1>)
        return unpack_nibbles(b.qs);
    else
        return _mm256_or_si256(unpack_nibbles(b.qs), fifth_bits(b.qh));
}

// a[k] * b[k] for four pairs of halves (d_w * d_a of four blocks, or m_w * s_a): one conversion.
__m128 products4(uint16_t a0, uint16_t a1, uint16_t a2, uint16_t a3, uint16_t b0, uint16_t b1, uint16_t b2,
                 uint16_t b3) {
    auto h = [](uint16_t v) { return static_cast<short>(v); };
    const __m256 f = _mm256_cvtph_ps(_mm_setr_epi16(h(a0), h(a1), h(a2), h(a3), h(b0), h(b1), h(b2), h(b3)));
    return _mm_mul_ps(_mm256_castps256_ps128(f), _mm256_extractf128_ps(f, 1));
}

// sum over the row's nb blocks of d_w d_a times the block's integer dot (block_sums(i): 8 partial
// sums of block i, each over 4 consecutive elements), in the order dot_ref.cpp defines: lanes8
// (one 8-lane accumulator, block after block, then llama.cpp's hsum_float_8) or serial (one float,
// block after block).
template <bool kLanes8, typename WBlock, typename ABlock, typename BlockSums>
float sum_blocks(const WBlock* x, const ABlock* y, int nb, BlockSums block_sums) {
    if constexpr (kLanes8) {
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < nb; ++i) {
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[i].d) * f16(y[i].d)), _mm256_cvtepi32_ps(block_sums(i)), acc);
        }
        return hsum(acc);
    } else {
        __m128 acc = _mm_setzero_ps();
        for (int i = 0; i < nb; ++i) {
            const __m256i s8 = block_sums(i);
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
            s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 1));
            acc = _mm_fmadd_ss(_mm_cvtepi32_ps(s4), _mm_set_ss(f16(x[i].d) * f16(y[i].d)), acc);
        }
        return _mm_cvtss_f32(acc);
    }
}

// Q4_0, Q5_0 with Q8_0.
template <typename Block, int kOffset>
void dot_symmetric32(int n, float* out, const void* w, const void* a) {
    const auto* x = as<Block>(w);
    const auto* y = as<BlockQ8_0>(a);
    constexpr bool kLanes8 = std::is_same_v<Block, BlockQ5_0>;  // Q4_0: serial (dot_ref.cpp)
    *out = sum_blocks<kLanes8>(x, y, n / 32, [&](int i) { return block_dot<kOffset>(quants(x[i]), load32(y[i].qs)); });
}

// Q4_1, Q5_1 with Q8_1: d_w d_a sum(q y) + m_w s_a.
template <typename Block>
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
    const float dots = sum_blocks<true>(x, y, nb, [&](int b) { return block_dot<0>(quants(x[b]), load32(y[b].qs)); });
    mins = _mm_add_ps(mins, _mm_movehl_ps(mins, mins));
    *out = dots + _mm_cvtss_f32(_mm_add_ss(mins, _mm_movehdup_ps(mins))) + tail;
}

// Q8_0 with Q8_0: signed x signed, so move x's sign onto y (maddubs wants one unsigned side).
// Exact while y avoids -128, which Q8_0 activations do (|q| <= 127).
__m256i signed_block_dot(__m256i x, __m256i y) {
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

void dot_q8_0(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockQ8_0>(w);
    const auto* y = as<BlockQ8_0>(a);
    *out = sum_blocks<true>(x, y, n / 32, [&](int i) { return signed_block_dot(load32(x[i].qs), load32(y[i].qs)); });
}

// IQ4_NL with Q8_0: the nibbles are indices into a table of 16 int8 values, looked up with one
// pshufb (the table in both 128-bit lanes); then a signed x signed block dot as for Q8_0
// (|value| <= 127, so maddubs cannot saturate).
void dot_iq4_nl(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockIQ4_NL>(w);
    const auto* y = as<BlockQ8_0>(a);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kValuesIQ4NL)));
    *out = sum_blocks<false>(x, y, n / 32, [&](int i) {
        return signed_block_dot(_mm256_shuffle_epi8(table, unpack_nibbles(x[i].qs)), load32(y[i].qs));
    });
}

// IQ4_XS with Q8_K: per sub-block of 32, the table lookup and signed pair sums of IQ4_NL, the
// pairs scaled by the sub-block's ls - 32 in the madd; the super-block's integer sum (exact) then
// lanes8 order of dot_ref.cpp: one FMA per lane and super-block, hsum at the end.
void dot_iq4_xs(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockIQ4_XS>(w);
    const auto* y = as<BlockQ8_K>(a);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kValuesIQ4NL)));
    __m256 lanes = _mm256_setzero_ps();
    for (int i = 0; i < n / kQK; ++i) {
        __m256i sums = _mm256_setzero_si256();
        uint32_t high = x[i].scales_h;
        for (int ib = 0; ib < kQK / 32; ++ib, high >>= 2) {
            const int scale = (((x[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | ((high & 3) << 4)) - 32;
            const __m256i v = _mm256_shuffle_epi8(table, unpack_nibbles(x[i].qs + 16 * ib));
            const __m256i q8 = load32(y[i].qs + 32 * ib);
            const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(q8, v));
            sums = _mm256_add_epi32(sums, _mm256_madd_epi16(pairs, _mm256_set1_epi16(static_cast<int16_t>(scale))));
        }
        lanes = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sums), lanes);
    }
    *out = hsum(lanes);
}

// ---- Ternary and MXFP4 ----

// Lane l of the eight: (sum of t * y over bytes 4l .. 4l + 3 of each 32-byte step) - (bsums[2l] +
// bsums[2l + 1]), from 16-bit pair sums (at most 8 steps of 2 * 3 * 128 a word: no overflow); the
// FMA into the row's lanes as dot_ref.cpp's dot_ternary orders it.
__m256 ternary_fma(__m256i pair_sums, const BlockQ8_K& y, uint16_t d_w, __m256 lanes) {
    const __m256i words = _mm256_sub_epi16(pair_sums, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums)));
    const __m256i sums = _mm256_madd_epi16(words, _mm256_set1_epi16(1));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(y.d * f16(d_w)), lanes);
}

// TQ2_0 with Q8_K: the four 2-bit fields of 32 bytes against four 32-byte steps of y (unsigned
// codes 0..3 in maddubs), the -1 of each value through bsums.
void dot_tq2_0(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockTQ2_0>(w);
    const auto* y = as<BlockQ8_K>(a);
    const __m256i mask = _mm256_set1_epi8(3);
    __m256 lanes = _mm256_setzero_ps();
    for (int i = 0; i < n / kQK; ++i) {
        __m256i pairs = _mm256_setzero_si256();
        for (int h = 0; h < 2; ++h) {
            const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 32 * h));
            const int8_t* q8 = y[i].qs + 128 * h;
            pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(_mm256_and_si256(q, mask), load32(q8)));
            pairs = _mm256_add_epi16(
                pairs, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 2), mask), load32(q8 + 32)));
            pairs = _mm256_add_epi16(
                pairs, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 4), mask), load32(q8 + 64)));
            pairs = _mm256_add_epi16(
                pairs, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 6), mask), load32(q8 + 96)));
        }
        lanes = ternary_fma(pairs, y[i], x[i].d, lanes);
    }
    *out = hsum(lanes);
}

// Bytes times 3 modulo 256: the next trit of TQ1_0's base-3 fractions moves to the top.
__m256i times3(__m256i v) {
    return _mm256_add_epi8(v, _mm256_add_epi8(v, v));
}
// The leading trit of each byte: (3 q) >> 8, that is (q >= 86) + (q >= 171).
__m256i leading_trit(__m256i q) {
    const __m256i ge86 = _mm256_cmpeq_epi8(_mm256_max_epu8(q, _mm256_set1_epi8(86)), q);
    const __m256i ge171 = _mm256_cmpeq_epi8(_mm256_max_epu8(q, _mm256_set1_epi8(static_cast<char>(171))), q);
    return _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_add_epi8(ge86, ge171));
}

// TQ1_0 with Q8_K: the 32 bytes of five trits against steps 0..4 of y; then the 16 bytes of five
// trits two rows a step (trits 0 / 1, 2 / 3, 4 beside qh's four trits of 4 bytes, one dword each).
void dot_tq1_0(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockTQ1_0>(w);
    const auto* y = as<BlockQ8_K>(a);
    __m256 lanes = _mm256_setzero_ps();
    for (int i = 0; i < n / kQK; ++i) {
        __m256i pairs = _mm256_setzero_si256();
        __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs));
        for (int t = 0; t < 5; ++t, q = times3(q))
            pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(leading_trit(q), load32(y[i].qs + 32 * t)));
        const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].qs + 32));
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
        const __m256i steps[3] = {_mm256_set_m128i(r1, r0), _mm256_set_m128i(r3, r2), _mm256_set_m128i(h, r4)};
        for (int s = 0; s < 3; ++s)
            pairs =
                _mm256_add_epi16(pairs, _mm256_maddubs_epi16(leading_trit(steps[s]), load32(y[i].qs + 160 + 32 * s)));
        lanes = ternary_fma(pairs, y[i], x[i].d, lanes);
    }
    *out = hsum(lanes);
}

// ggml's GGML_E8M0_TO_FP32_HALF: 2^(e - 128).
float e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// MXFP4 with Q8_0: the nibbles looked up in the doubled e2m1 table (pshufb), a signed x signed dot
// as IQ4_NL's; blocks in pairs, even ones in one set of lanes and odd ones in another, as
// dot_ref.cpp's dot_mxfp4 (llama.cpp's order).
void dot_mxfp4(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockMXFP4>(w);
    const auto* y = as<BlockQ8_0>(a);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kValuesMXFP4)));
    auto block_sums = [&](int ib) {
        const __m256i v = _mm256_shuffle_epi8(table, unpack_nibbles(x[ib].qs));
        const __m256i q8 = load32(y[ib].qs);
        const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(q8, v));
        return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
    };
    const int nb = n / 32;
    __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps();
    int ib = 0;
    for (; ib + 1 < nb; ib += 2) {
        even = _mm256_fmadd_ps(_mm256_set1_ps(f16(y[ib].d) * e8m0_half(x[ib].e)), _mm256_cvtepi32_ps(block_sums(ib)),
                               even);
        odd = _mm256_fmadd_ps(_mm256_set1_ps(f16(y[ib + 1].d) * e8m0_half(x[ib + 1].e)),
                              _mm256_cvtepi32_ps(block_sums(ib + 1)), odd);
    }
    float sum = hsum(_mm256_add_ps(even, odd));
    if (ib < nb) {
        const __m256i s = block_sums(ib);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        const __m128 d = _mm_set_ss(f16(y[ib].d) * e8m0_half(x[ib].e));
        sum = _mm_cvtss_f32(_mm_fmadd_ss(d, _mm_cvtepi32_ps(s4), _mm_set_ss(sum)));
    }
    *out = sum;
}

// Rows of `Block`, eight at a time, each in its single dot's serial order (one float per row: acc =
// fma(float(block's integer sum), d_w * d_a, acc), block after block): block_sums(x, i, yq, s)
// gives the eight rows' int32 partials of block i (exact in any order), reduced together by
// horizontal adds, then one 8-lane FMA, a lane per row. The rows past the last eight: `single`.
template <typename Block, typename BlockSums>
void dot_rows8(int n, int n_rows, float* out, const void* w, size_t w_stride, const void* a, BlockSums block_sums,
               void (*single)(int, float*, const void*, const void*)) {
    const auto* y = as<BlockQ8_0>(a);
    const auto* base = static_cast<const uint8_t*>(w);
    const int nb = n / 32;
    constexpr int kRows = 8;
    int r = 0;
    for (; r + kRows <= n_rows; r += kRows) {
        const Block* x[kRows];
        for (int k = 0; k < kRows; ++k)
            x[k] = reinterpret_cast<const Block*>(base + static_cast<size_t>(r + k) * w_stride);
        __m256 acc = _mm256_setzero_ps();
        const size_t ahead = kRows * w_stride;  // the next group's rows, read while these compute
        for (int i = 0; i < nb; ++i) {
            // Every 2 blocks, into L2: 1.35x the speed of every 4 blocks into L1 (measured on Zen 4).
            if (i % 2 == 0) {
                for (int k = 0; k < kRows; ++k)
                    _mm_prefetch(reinterpret_cast<const char*>(x[k] + i) + ahead, _MM_HINT_T1);
            }
            __m256i s[kRows];
            block_sums(x, i, load32(y[i].qs), s);
            // Lane k of `sums`: all eight int32 partials of row k.
            const __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
            const __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
            const __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                                                  _mm256_permute2x128_si256(h0123, h4567, 0x31));
            auto h = [](uint16_t v) { return static_cast<short>(v); };
            const __m256 dw = _mm256_cvtph_ps(_mm_setr_epi16(h(x[0][i].d), h(x[1][i].d), h(x[2][i].d), h(x[3][i].d),
                                                             h(x[4][i].d), h(x[5][i].d), h(x[6][i].d), h(x[7][i].d)));
            const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(f16(y[i].d)));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc);
        }
        _mm256_storeu_ps(out + r, acc);
    }
    for (; r < n_rows; ++r) single(n, out + r, base + static_cast<size_t>(r) * w_stride, a);
}

// Q4_0 in dot_symmetric32<BlockQ4_0>'s order; the offset term (8 * y) is the same for every row of
// a block.
void dot_rows_q4_0(int n, int n_rows, float* out, const void* w, size_t w_stride, const void* a) {
    auto block_sums = [](const BlockQ4_0* const* x, int i, __m256i yq, __m256i* s) {
        const __m256i offset = _mm256_maddubs_epi16(_mm256_set1_epi8(8), yq);
        for (int k = 0; k < 8; ++k) {
            const __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(quants(x[k][i]), yq), offset);
            s[k] = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
        }
    };
    dot_rows8<BlockQ4_0>(n, n_rows, out, w, w_stride, a, block_sums, dot_symmetric32<BlockQ4_0, 8>);
}

// IQ4_NL in dot_iq4_nl's order: its table lookup and signed block dot per row (one chain of FMAs
// per row is what keeps the single dot slow).
void dot_rows_iq4_nl(int n, int n_rows, float* out, const void* w, size_t w_stride, const void* a) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kValuesIQ4NL)));
    auto block_sums = [table](const BlockIQ4_NL* const* x, int i, __m256i yq, __m256i* s) {
        for (int k = 0; k < 8; ++k) s[k] = signed_block_dot(_mm256_shuffle_epi8(table, unpack_nibbles(x[k][i].qs)), yq);
    };
    dot_rows8<BlockIQ4_NL>(n, n_rows, out, w, w_stride, a, block_sums, dot_iq4_nl);
}

}  // namespace

DotRowsFn dot_rows_avx2(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::Q4_0:
            return dot_rows_q4_0;
        case GgmlType::IQ4_NL:
            return dot_rows_iq4_nl;
        default:
            return nullptr;
    }
}

DotFn dot_avx2(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::F32:
            return dot_float<float>;
        case GgmlType::F16:
            return dot_f16;
        case GgmlType::BF16:
            return dot_float<uint16_t>;
        case GgmlType::Q4_0:
            return dot_symmetric32<BlockQ4_0, 8>;
        case GgmlType::Q4_1:
            return dot_affine32<BlockQ4_1>;
        case GgmlType::Q5_0:
            return dot_symmetric32<BlockQ5_0, 16>;
        case GgmlType::Q5_1:
            return dot_affine32<BlockQ5_1>;
        case GgmlType::Q8_0:
            return dot_q8_0;
        case GgmlType::IQ4_NL:
            return dot_iq4_nl;
        case GgmlType::IQ4_XS:
            return dot_iq4_xs;
        case GgmlType::TQ1_0:
            return dot_tq1_0;
        case GgmlType::TQ2_0:
            return dot_tq2_0;
        case GgmlType::MXFP4:
            return dot_mxfp4;
        default:
            return iq::dot(weight_type);  // the grid i-quants (dot_iq_avx2.h), or nullptr
    }
}

}  // namespace fitllm::quant::detail
