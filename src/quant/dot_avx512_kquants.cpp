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

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "quant/blocks.h"
#include "quant/dot_kernels.h"
#include "quant/kquant_avx512.h"
#include "quant/kquant_serial.h"
#include "quant/rows16.h"
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

// ---- Q4_K, many rows at once (matrix-vector) ----
//
// Sixteen rows a step, one row per int32 lane, as dot_avx512.cpp's Q4_0 rows kernel: 16 bytes of
// each of the 16 rows are loaded into 4 registers (rows j, j + 4, j + 8, j + 12 in the 128-bit
// lanes of register j) and transposed so that register q holds dword q of every row, lane k for
// row k. A super-block's first 16 bytes (d, dmin, the packed scales) come out as d | dmin << 16 and
// the packed words w0, w1, w2 of every row; each of its 4 chunks of 32 quant bytes as 8 such
// registers (transposed16x32: rows k and k + 8 share a register, 32 shuffles a chunk where two
// 16-byte transposes take 40), dotted (dpbusd, or maddubs + madd without VNNI) with y's dwords
// broadcast to every lane: the low nibbles are sub-block 2c's, the high ones 2c + 1's. Each
// sub-block's integer sum is multiplied by its row's scale (vpmulld), the mins by y's sub-block
// sums (from bsums). The integer sums are exact, and the float steps each row's serial ones
// (serial_step): per super-block acc = fma(float(scaled), d_w d_a, acc), acc_mins =
// fma(float(mins), dmin_w d_a, acc_mins), then acc - acc_mins: every lane gets its single dot's
// bits.

// sum(u * s) over each 4 bytes into the 32-bit lanes of acc; u unsigned, s signed, and
// 2 * u * |s| < 2^15 so that maddubs does not saturate where there is no VNNI.
template <bool kVnni>
inline __m512i dot_u8s8(__m512i acc, __m512i u, __m512i s) {
    if constexpr (kVnni)
        return _mm512_dpbusd_epi32(acc, u, s);
    else
        return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
}

// The 4 bytes at p in every dword.
inline __m512i broadcast32(const void* p) {
    return _mm512_broadcastd_epi32(_mm_loadu_si32(p));
}

// The 16 bytes at offset `off` of the 16 rows, transposed: dw[q] lane k = dword q of row k.
inline void transposed16(const Rows16& r, size_t off, __m512i dw[4]) {
    __m512i z[4];
    unroll<4>([&](auto j_) {
        constexpr int j = decltype(j_)::value;
        __m512i v = _mm512_castsi128_si512(load128(r.row(j) + off));
        v = _mm512_inserti32x4(v, load128(r.row(j + 4) + off), 1);
        v = _mm512_inserti32x4(v, load128(r.row(j + 8) + off), 2);
        z[j] = _mm512_inserti32x4(v, load128(r.row(j + 12) + off), 3);
    });
    const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    dw[0] = _mm512_unpacklo_epi64(t0, t2);
    dw[1] = _mm512_unpackhi_epi64(t0, t2);
    dw[2] = _mm512_unpacklo_epi64(t1, t3);
    dw[3] = _mm512_unpackhi_epi64(t1, t3);
}

// The 32 bytes at offset `off` of the 16 rows, transposed: dw[q] lane k = dword q of row k. Rows
// k and k + 8 share a register (256-bit halves); two 4x4 transposes inside the 128-bit lanes, then
// the lanes exchanged between the two groups of registers.
inline void transposed16x32(const Rows16& r, size_t off, __m512i dw[8]) {
    __m512i t[2][4];
    unroll<2>([&](auto g_) {
        constexpr int g = decltype(g_)::value;
        __m512i z[4];
        unroll<4>([&](auto j_) {
            constexpr int j = decltype(j_)::value;
            z[j] = _mm512_inserti64x4(_mm512_castsi256_si512(load256(r.row(4 * g + j) + off)),
                                      load256(r.row(4 * g + j + 8) + off), 1);
        });
        const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
        const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
        t[g][0] = _mm512_unpacklo_epi64(t0, t2);
        t[g][1] = _mm512_unpackhi_epi64(t0, t2);
        t[g][2] = _mm512_unpacklo_epi64(t1, t3);
        t[g][3] = _mm512_unpackhi_epi64(t1, t3);
    });
    // t[g][q] lanes: rows 4g..4g+3 dword q, the same rows' dword 4 + q, rows 4g+8.. dword q, dword 4 + q.
    unroll<4>([&](auto q_) {
        constexpr int q = decltype(q_)::value;
        dw[q] = _mm512_mask_shuffle_i64x2(t[0][q], 0xCC, t[1][q], t[1][q], 0x80);
        dw[4 + q] = _mm512_mask_shuffle_i64x2(t[1][q], 0x33, t[0][q], t[0][q], 0x31);
    });
}

// Byte kByte of every dword, as an int32.
template <int kByte>
inline __m512i byte_of(__m512i v) {
    if constexpr (kByte == 3) return _mm512_srli_epi32(v, 24);
    if constexpr (kByte == 0) return _mm512_and_si512(v, _mm512_set1_epi32(0xFF));
    return _mm512_and_si512(_mm512_srli_epi32(v, 8 * kByte), _mm512_set1_epi32(0xFF));
}

// [acc, acc_mins] (lane k for row k) + the float steps of `count` super-blocks of 16 rows, from
// the super-block at r on; y from the same super-block on. Not inlined: the caller's loops would
// take the registers this loop needs.
template <bool kVnni>
__attribute__((noinline)) void rows16_q4_K(Rows16 r, const BlockQ8_K* y, int count, __m512& acc, __m512& acc_mins) {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    const __m512i low6 = _mm512_set1_epi8(0x3F), low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
    const __m512i low_bytes_of_words = _mm512_set1_epi16(0x00FF);
    const size_t ahead = 16 * r.s1;  // the next group's rows, read while these compute
    __m512 a = acc, am = acc_mins;
    for (int i = 0; i < count; ++i, r.lo += sizeof(BlockQ4_K), r.hi += sizeof(BlockQ4_K)) {
        // Each row's lines of this super-block in the next group, into L2 (as the Q4_0 kernel).
        // A plain loop: GCC 12 drops the prefetches inside unroll's lambda.
        for (int k = 0; k < 16; ++k) {
            const char* p = reinterpret_cast<const char*>(r.row(k) + ahead);
            _mm_prefetch(p, _MM_HINT_T1);
            _mm_prefetch(p + 64, _MM_HINT_T1);
            _mm_prefetch(p + 128, _MM_HINT_T1);
        }
        // y's sub-block sums B0..B7 as word pairs: (B0, B2), (B1, B3), (B4, B6), (B5, B7).
        const __m256i b32 = _mm256_madd_epi16(load256(y[i].bsums), _mm256_set1_epi16(1));
        const __m256i pairs = _mm256_blend_epi16(b32, _mm256_slli_epi32(_mm256_shuffle_epi32(b32, 0x0E), 16), 0xAA);
        alignas(32) int32_t bpair[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(bpair), pairs);

        __m512i hdr[4];  // d | dmin << 16, w0, w1, w2 of the packed scales
        transposed16(r, 0, hdr);
        const __m512i sc03 = _mm512_and_si512(hdr[1], low6);
        const __m512i sc47 =
            _mm512_or_si512(_mm512_and_si512(hdr[3], low4), _mm512_and_si512(_mm512_srli_epi32(hdr[1], 2), bits45));
        const __m512i m03 = _mm512_and_si512(hdr[2], low6);
        const __m512i m47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(hdr[3], 4), low4),
                                            _mm512_and_si512(_mm512_srli_epi32(hdr[2], 2), bits45));
        // mins = sum_j m_j B_j: words (m0, m2) and (m1, m3) against (B0, B2) and (B1, B3), etc.
        __m512i mins = _mm512_setzero_si512();
        mins = scaled_sum<kVnni>(mins, _mm512_and_si512(m03, low_bytes_of_words), _mm512_set1_epi32(bpair[0]));
        mins = scaled_sum<kVnni>(mins, _mm512_and_si512(_mm512_srli_epi32(m03, 8), low_bytes_of_words),
                                 _mm512_set1_epi32(bpair[1]));
        mins = scaled_sum<kVnni>(mins, _mm512_and_si512(m47, low_bytes_of_words), _mm512_set1_epi32(bpair[4]));
        mins = scaled_sum<kVnni>(mins, _mm512_and_si512(_mm512_srli_epi32(m47, 8), low_bytes_of_words),
                                 _mm512_set1_epi32(bpair[5]));

        __m512i scaled = _mm512_setzero_si512();
        unroll<4>([&](auto c_) {
            constexpr int c = decltype(c_)::value;
            const int8_t* yq = y[i].qs + 64 * c;
            __m512i low[2], high[2];
            __m512i dw[8];
            transposed16x32(r, 16 + 32 * c, dw);
            unroll<2>([&](auto h_) {
                constexpr int h = decltype(h_)::value;
                low[h] = _mm512_setzero_si512();
                high[h] = _mm512_setzero_si512();
                unroll<4>([&](auto q_) {
                    constexpr int q = decltype(q_)::value;
                    low[h] = dot_u8s8<kVnni>(low[h], _mm512_and_si512(dw[4 * h + q], nibble),
                                             broadcast32(yq + 16 * h + 4 * q));
                    high[h] = dot_u8s8<kVnni>(high[h], _mm512_and_si512(_mm512_srli_epi32(dw[4 * h + q], 4), nibble),
                                              broadcast32(yq + 32 + 16 * h + 4 * q));
                });
            });
            const __m512i s_low = _mm512_add_epi32(low[0], low[1]), s_high = _mm512_add_epi32(high[0], high[1]);
            const __m512i words = c < 2 ? sc03 : sc47;
            scaled = _mm512_add_epi32(scaled, _mm512_mullo_epi32(s_low, byte_of<(2 * c) % 4>(words)));
            scaled = _mm512_add_epi32(scaled, _mm512_mullo_epi32(s_high, byte_of<(2 * c + 1) % 4>(words)));
        });

        const __m512 d_a = _mm512_set1_ps(y[i].d);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr[0]));
        const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(hdr[0], 16)));
        a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(scaled), _mm512_mul_ps(d, d_a), a);
        am = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins), _mm512_mul_ps(dmin, d_a), am);
    }
    acc = a;
    acc_mins = am;
}

template <bool kVnni>
void dot_rows_q4_K(int n, int n_rows, float* out, const void* w, size_t stride, const void* act) {
    const auto* y = as<BlockQ8_K>(act);
    const auto* base = static_cast<const uint8_t*>(w);
    const int nb = n / kQK;
    // Groups of sixteen; past the last one, the last sixteen rows again (each row's float does not
    // depend on its group), or single dots where there are fewer than sixteen rows.
    for (int r = 0; r < n_rows; r += 16) {
        if (n_rows < 16) {
            for (; r < n_rows; ++r)
                dot_q4_5_K<BlockQ4_K, kVnni>(n, out + r, base + static_cast<size_t>(r) * stride, act);
            break;
        }
        if (r + 16 > n_rows) r = n_rows - 16;
        const uint8_t* lo = base + static_cast<size_t>(r) * stride;
        const Rows16 rows{lo, lo + 8 * stride, stride, 3 * stride, 5 * stride, 7 * stride};
        __m512 acc = _mm512_setzero_ps(), acc_mins = _mm512_setzero_ps();
        rows16_q4_K<kVnni>(rows, y, nb, acc, acc_mins);
        _mm512_storeu_ps(out + r, _mm512_sub_ps(acc, acc_mins));
    }
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

DotRowsFn dot_rows_avx512_kquants(GgmlType weight_type, bool vnni) {
    switch (weight_type) {
        case GgmlType::Q4_K:
            return vnni ? dot_rows_q4_K<true> : dot_rows_q4_K<false>;
        default:
            return nullptr;
    }
}

}  // namespace fitllm::quant::detail
