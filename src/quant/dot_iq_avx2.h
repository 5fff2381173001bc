#pragma once
// AVX2 dots of the grid i-quants (IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M) with Q8_K, in dot_ref.cpp's
// lanes8 order (llama.cpp's ggml_vec_dot_iq*_q8_K for AVX2): bit for bit the reference's floats.
//
// Included by dot_avx2.cpp and dot_avx512.cpp: the AVX-512 levels run these same AVX2 kernels,
// compiled in that file; also by gemm_batch_avx2.cpp / gemm_batch_avx512.cpp (the batch kernel
// below) and gemm_iq_grid_avx512.cpp (the unpackers). Internal linkage on purpose (see dot_kernels.h): nothing here
// calls an inline function of a shared header; the grids (iq_grids.h) are constant data.
//
// A sub-block of 32: the grid points are gathered into one vector (set_epi32 / set_epi64x), the
// sign bits expanded to bytes of -1 / +1 and moved onto the activations (sign_epi8; Q8_K values are
// never -128), maddubs multiplies the unsigned magnitudes with them, madd applies the scale
// integer and sums the pairs: lane l of the 8 int32 lanes holds elements 4l .. 4l + 3.
#include <immintrin.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "quant/blocks.h"
#include "quant/dot.h"
#include "quant/gemm.h"
#include "quant/gemm_kernels.h"
#include "quant/iq_grids.h"
#include "quant/transpose_avx2.h"

namespace fitllm::quant::detail {
namespace {
namespace iq {

inline uint32_t u32_at(const void* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

inline float to_f32(uint16_t h) {
    return _cvtsh_ss(h);
}

// llama.cpp's hsum_float_8: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// 32 sign bits (bit e for element e) as bytes: -1 where set, +1 elsewhere.
inline __m256i sign_bytes(uint32_t bits) {
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(static_cast<int>(bits)),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
    const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_or_si256(set, _mm256_set1_epi8(1));
}

// kIqSigns[i] as 8 bytes: -1 where its bit is set, +1 elsewhere (the completed sign bytes of a
// 7-bit index, one 64-bit load instead of the bit spread of sign_bytes).
struct SignByteTable {
    uint64_t v[128];
};
constexpr SignByteTable make_sign_byte_table() {
    SignByteTable t{};
    for (int i = 0; i < 128; ++i) {
        uint64_t bytes = 0;
        for (int j = 0; j < 8; ++j) bytes |= uint64_t{((kIqSigns[i] >> j) & 1) ? 0xFFu : 0x01u} << (8 * j);
        t.v[i] = bytes;
    }
    return t;
}
constexpr SignByteTable kSignBytes = make_sign_byte_table();

// The sign bytes of 4 seven-bit indices (bits 0, 7, 14, 21 of w onward).
inline __m256i xxs_sign_bytes(uint32_t w) {
    return _mm256_set_epi64x(
        static_cast<long long>(kSignBytes.v[(w >> 21) & 127]), static_cast<long long>(kSignBytes.v[(w >> 14) & 127]),
        static_cast<long long>(kSignBytes.v[(w >> 7) & 127]), static_cast<long long>(kSignBytes.v[w & 127]));
}

// The sign bytes of IQ2_XS's 4 points (the top 7 bits of each 16-bit index).
inline __m256i xs_sign_bytes(const uint16_t* q) {
    return _mm256_set_epi64x(
        static_cast<long long>(kSignBytes.v[q[3] >> 9]), static_cast<long long>(kSignBytes.v[q[2] >> 9]),
        static_cast<long long>(kSignBytes.v[q[1] >> 9]), static_cast<long long>(kSignBytes.v[q[0] >> 9]));
}

// The scales of a sub-block as 16-bit words for madd: lo on its first 16 elements, hi on the rest
// (one broadcast where they are the same).
inline __m256i scale_words(int ls_lo, int ls_hi) {
    return _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(ls_hi)), _mm_set1_epi16(static_cast<int16_t>(ls_lo)));
}
inline __m256i scale_words(int ls) {
    return _mm256_set1_epi16(static_cast<int16_t>(ls));
}

// Lanes of sum(grid * sign * q8) over one sub-block, signs given as bytes of -1 / +1.
inline __m256i grid_lanes_b(__m256i grid, __m256i sign_b, const int8_t* q8, __m256i ls) {
    const __m256i q = _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8)), sign_b);
    const __m256i pairs = _mm256_maddubs_epi16(grid, q);
    return _mm256_madd_epi16(pairs, ls);
}

// Lanes of sum(grid * sign * q8) over one sub-block, each times its scale (per 16 elements: lo, hi).
inline __m256i grid_lanes(__m256i grid, uint32_t signs, const int8_t* q8, __m256i ls) {
    const __m256i q = _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8)), sign_bytes(signs));
    const __m256i pairs = _mm256_maddubs_epi16(grid, q);
    return _mm256_madd_epi16(pairs, ls);
}

// Eight 4-value grid points: index k is qs[k] | bit k of high << 8 (IQ3_S's ninth bits; 0 for IQ3_XXS).
inline __m256i grid4x8(const uint32_t* grid, const uint8_t* qs, int high) {
    auto idx = [&](int k) { return qs[k] | (((high >> k) & 1) << 8); };
    return _mm256_set_epi32(static_cast<int>(grid[idx(7)]), static_cast<int>(grid[idx(6)]),
                            static_cast<int>(grid[idx(5)]), static_cast<int>(grid[idx(4)]),
                            static_cast<int>(grid[idx(3)]), static_cast<int>(grid[idx(2)]),
                            static_cast<int>(grid[idx(1)]), static_cast<int>(grid[idx(0)]));
}

inline void dot_iq3_xxs(int n, float* out, const void* w, const void* a) {
    const auto* x = static_cast<const BlockIQ3_XXS*>(w);
    const auto* y = static_cast<const BlockQ8_K*>(a);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / kQK; ++i) {
        __m256i sums = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ++ib) {
            const uint32_t aux = u32_at(x[i].qs + kQK / 4 + 4 * ib);
            const int ls = 2 * static_cast<int>(aux >> 28) + 1;
            const __m256i grid = grid4x8(kIq3xxsGrid, x[i].qs + 8 * ib, 0);
            sums = _mm256_add_epi32(sums, grid_lanes_b(grid, xxs_sign_bytes(aux), y[i].qs + 32 * ib, scale_words(ls)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(to_f32(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sums), acc);
    }
    *out = 0.25f * hsum8(acc);
}

// Grid indices, 16 words at a time (n16 times): word p of pass j is qs[16 j + p] | the high bits
// picked from qh, that is: qh's byte control[p] (rep, plus `step` each pass; a control byte with
// its top bit set gives 0) times mult[p] in 16 bits, shifted right by kShift, masked.
template <int kShift = 0>
inline void grid_indices(const uint8_t* qs, __m256i qh, __m256i rep, int step, __m256i mult, __m256i mask, int n16,
                         uint16_t* idx) {
    for (int j = 0; j < n16; ++j) {
        const __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16 * j)));
        const __m256i high = _mm256_mullo_epi16(_mm256_shuffle_epi8(qh, rep), mult);
        const __m256i bits = _mm256_and_si256(kShift > 0 ? _mm256_srli_epi16(high, kShift) : high, mask);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + 16 * j), _mm256_or_si256(q, bits));
        rep = _mm256_add_epi8(rep, _mm256_set1_epi8(static_cast<char>(step)));
    }
}

// IQ3_S's 64 grid indices of a super-block, 16 (two sub-blocks) at a time: point k of sub-block ib
// is qs[8 ib + k] | bit k of qh[ib] << 8 (qh times 2^(8 - k) in 16 bits, masked).
inline void iq3s_indices(const BlockIQ3_S& b, uint16_t* idx) {
    const __m256i qh = _mm256_broadcastq_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qh)));
    // Byte 2j of qh as the first 8 words, byte 2j + 1 as the next 8 (top bit set: a zero byte).
    const __m256i rep =
        _mm256_set_epi64x(static_cast<long long>(0x8001800180018001), static_cast<long long>(0x8001800180018001),
                          static_cast<long long>(0x8000800080008000), static_cast<long long>(0x8000800080008000));
    const __m256i mult = _mm256_set_epi16(2, 4, 8, 16, 32, 64, 128, 256, 2, 4, 8, 16, 32, 64, 128, 256);
    grid_indices(b.qs, qh, rep, 2, mult, _mm256_set1_epi16(0x100), 4, idx);
}

// Eight 4-value grid points from their indices.
inline __m256i grid4x8(const uint32_t* grid, const uint16_t* k) {
    return _mm256_set_epi32(static_cast<int>(grid[k[7]]), static_cast<int>(grid[k[6]]), static_cast<int>(grid[k[5]]),
                            static_cast<int>(grid[k[4]]), static_cast<int>(grid[k[3]]), static_cast<int>(grid[k[2]]),
                            static_cast<int>(grid[k[1]]), static_cast<int>(grid[k[0]]));
}

inline void dot_iq3_s(int n, float* out, const void* w, const void* a) {
    const auto* x = static_cast<const BlockIQ3_S*>(w);
    const auto* y = static_cast<const BlockQ8_K*>(a);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / kQK; ++i) {
        alignas(32) uint16_t idx[64];
        iq3s_indices(x[i], idx);
        __m256i sums = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ++ib) {
            const int ls = 2 * ((x[i].scales[ib / 2] >> (4 * (ib % 2))) & 15) + 1;
            const __m256i grid = grid4x8(kIq3sGrid, idx + 8 * ib);
            sums = _mm256_add_epi32(sums,
                                    grid_lanes(grid, u32_at(x[i].signs + 4 * ib), y[i].qs + 32 * ib, scale_words(ls)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(to_f32(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sums), acc);
    }
    *out = hsum8(acc);
}

// Four 8-value grid points.
inline __m256i grid8x4(uint64_t p0, uint64_t p1, uint64_t p2, uint64_t p3) {
    return _mm256_set_epi64x(static_cast<long long>(p3), static_cast<long long>(p2), static_cast<long long>(p1),
                             static_cast<long long>(p0));
}

// The IQ2 dots: per sub-block the grid vector, the 32 sign bits and the two scales (Sub), the
// same lanes8 steps as IQ3, times 1/8.
template <typename Block, typename Sub>
void dot_iq2(int n, float* out, const void* w, const void* a, Sub sub) {
    const auto* x = static_cast<const Block*>(w);
    const auto* y = static_cast<const BlockQ8_K*>(a);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / kQK; ++i) {
        __m256i sums = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ++ib) {
            __m256i grid, signs;
            int ls_lo, ls_hi;
            sub(x[i], ib, grid, signs, ls_lo, ls_hi);
            sums = _mm256_add_epi32(sums, grid_lanes_b(grid, signs, y[i].qs + 32 * ib, scale_words(ls_lo, ls_hi)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(to_f32(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sums), acc);
    }
    *out = 0.125f * hsum8(acc);
}

inline void dot_iq2_xxs(int n, float* out, const void* w, const void* a) {
    dot_iq2<BlockIQ2_XXS>(
        n, out, w, a, [](const BlockIQ2_XXS& b, int ib, __m256i& grid, __m256i& signs, int& lo, int& hi) {
            const auto* bytes = reinterpret_cast<const uint8_t*>(b.qs) + 8 * ib;
            const uint32_t w1 = u32_at(bytes + 4);
            grid = grid8x4(kIq2xxsGrid[bytes[0]], kIq2xxsGrid[bytes[1]], kIq2xxsGrid[bytes[2]], kIq2xxsGrid[bytes[3]]);
            signs = xxs_sign_bytes(w1);
            lo = hi = 2 * static_cast<int>(w1 >> 28) + 1;
        });
}

inline void dot_iq2_xs(int n, float* out, const void* w, const void* a) {
    dot_iq2<BlockIQ2_XS>(
        n, out, w, a, [](const BlockIQ2_XS& b, int ib, __m256i& grid, __m256i& signs, int& lo, int& hi) {
            const uint16_t* q = b.qs + 4 * ib;
            grid =
                grid8x4(kIq2xsGrid[q[0] & 511], kIq2xsGrid[q[1] & 511], kIq2xsGrid[q[2] & 511], kIq2xsGrid[q[3] & 511]);
            signs = xs_sign_bytes(q);
            lo = 2 * (b.scales[ib] & 15) + 1;
            hi = 2 * (b.scales[ib] >> 4) + 1;
        });
}

// IQ2_S's 32 grid indices of a super-block, 16 at a time: point k of sub-block ib is
// qs[4 ib + k] | bits 2k, 2k + 1 of qh[ib] << 8 (qh times 2^(8 - 2k) in 16 bits, masked).
inline void iq2s_indices(const BlockIQ2_S& b, uint16_t* idx) {
    const __m256i qh = _mm256_broadcastq_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qh)));
    // Bytes ib of qh as words, each 4 times (a control byte with its top bit set gives 0).
    const __m256i rep_lo = _mm256_set_epi64x(0x8003800380038003, 0x8002800280028002, 0x8001800180018001,
                                             static_cast<long long>(0x8000800080008000));
    grid_indices(b.qs, qh, rep_lo, 4, _mm256_set1_epi64x(0x0004001000400100), _mm256_set1_epi16(0x300), 2, idx);
}

inline void dot_iq2_s(int n, float* out, const void* w, const void* a) {
    const auto* x = static_cast<const BlockIQ2_S*>(w);
    const auto* y = static_cast<const BlockQ8_K*>(a);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / kQK; ++i) {
        alignas(32) uint16_t idx[32];
        iq2s_indices(x[i], idx);
        __m256i sums = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ++ib) {
            const uint16_t* k = idx + 4 * ib;
            const __m256i grid = grid8x4(kIq2sGrid[k[0]], kIq2sGrid[k[1]], kIq2sGrid[k[2]], kIq2sGrid[k[3]]);
            const __m256i ls = scale_words(2 * (x[i].scales[ib] & 15) + 1, 2 * (x[i].scales[ib] >> 4) + 1);
            sums = _mm256_add_epi32(sums, grid_lanes(grid, u32_at(x[i].qs + kQK / 8 + 4 * ib), y[i].qs + 32 * ib, ls));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(to_f32(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sums), acc);
    }
    *out = 0.125f * hsum8(acc);
}

// IQ1: lanes of sum(w * q8) for bytes w in {-1, 0, 1} (grid values or delta signs), each times its
// scale: |w| unsigned, w's sign moved onto the activations.
inline __m256i signed_lanes(__m256i w, const int8_t* q8, __m256i ls) {
    const __m256i q = _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8)), w);
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), q);
    return _mm256_madd_epi16(pairs, ls);
}

// IQ1_M's delta signs of sub-block ib as bytes: -1 (negative delta) or +1 per group of 8, group g
// from bit 3 (g even) or 7 (g odd) of qh[2 ib + g / 2]; qh is the 16 bytes in both halves.
inline __m256i delta_signs(__m256i qh, int ib) {
    const __m256i sel = _mm256_add_epi8(_mm256_set_m128i(_mm_set1_epi8(1), _mm_setzero_si128()),
                                        _mm256_set1_epi8(static_cast<char>(2 * ib)));
    const __m256i bit = _mm256_set_epi64x(static_cast<long long>(0x8080808080808080), 0x0808080808080808,
                                          static_cast<long long>(0x8080808080808080), 0x0808080808080808);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, sel), bit), bit);
    return _mm256_or_si256(set, _mm256_set1_epi8(1));
}

// Lanes of sum(delta * q8) times the scales, for delta bytes of -1 / +1.
inline __m256i delta_lanes(__m256i delta, const int8_t* q8, __m256i ls) {
    const __m256i q = _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8)), delta);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), ls);
}

// IQ1_S's 32 grid indices of a super-block, computed 16 at a time: point k of sub-block ib is
// qs[4 ib + k] | bits 3k .. 3k + 2 of qh[ib] << 8 (qh times 2^(9 - 3k) in 16 bits, then >> 1 and
// masked: no per-word variable shift in AVX2).
inline void iq1s_indices(const BlockIQ1_S& b, uint16_t* idx) {
    const __m256i qh = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qh)));
    // Words ib of qh, each repeated 4 times: sub-blocks 0, 1 | 2, 3 (first half), 4, 5 | 6, 7.
    const __m256i rep_lo =
        _mm256_set_epi64x(0x0706070607060706, 0x0504050405040504, 0x0302030203020302, 0x0100010001000100);
    grid_indices<1>(b.qs, qh, rep_lo, 8, _mm256_set1_epi64x(0x0001000800400200), _mm256_set1_epi16(0x700), 2, idx);
}

inline void dot_iq1_s(int n, float* out, const void* w, const void* a) {
    const auto* x = static_cast<const BlockIQ1_S*>(w);
    const auto* y = static_cast<const BlockQ8_K*>(a);
    __m256 acc = _mm256_setzero_ps();
    float acc1 = 0.0f;
    for (int i = 0; i < n / kQK; ++i) {
        alignas(32) uint16_t idx[32];
        iq1s_indices(x[i], idx);
        __m256i sums = _mm256_setzero_si256();
        int delta_sum = 0;
        for (int ib = 0; ib < 8; ++ib) {
            const int qh = x[i].qh[ib];
            const uint16_t* k = idx + 4 * ib;
            const __m256i grid = grid8x4(kIq1sGrid[k[0]], kIq1sGrid[k[1]], kIq1sGrid[k[2]], kIq1sGrid[k[3]]);
            const int ls = 2 * ((qh >> 12) & 7) + 1;
            sums = _mm256_add_epi32(sums, signed_lanes(grid, y[i].qs + 32 * ib, scale_words(ls)));
            delta_sum += ls * (1 - ((qh >> 14) & 2)) * (y[i].bsums[2 * ib] + y[i].bsums[2 * ib + 1]);
        }
        const float d = y[i].d * to_f32(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc);
        acc1 = std::fma(d, static_cast<float>(delta_sum), acc1);
    }
    *out = hsum8(acc) + 0.125f * acc1;
}

// IQ1_M's 32 grid indices of a super-block, 16 at a time: point k of sub-block ib is
// qs[4 ib + k] | (qh[2 ib + k / 2] >> (k odd ? 4 : 0) & 7) << 8 (qh times 256 or 16, masked).
inline void iq1m_indices(const BlockIQ1_M& b, uint16_t* idx) {
    const __m256i qh = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qh)));
    // Byte p / 2 of qh as word p (top bit set: a zero byte).
    const __m256i rep_lo =
        _mm256_set_epi64x(static_cast<long long>(0x8007800780068006), static_cast<long long>(0x8005800580048004),
                          static_cast<long long>(0x8003800380028002), static_cast<long long>(0x8001800180008000));
    grid_indices(b.qs, qh, rep_lo, 8, _mm256_set1_epi32(0x00100100), _mm256_set1_epi16(0x700), 2, idx);
}

inline void dot_iq1_m(int n, float* out, const void* w, const void* a) {
    const auto* x = static_cast<const BlockIQ1_M*>(w);
    const auto* y = static_cast<const BlockQ8_K*>(a);
    __m256 acc = _mm256_setzero_ps(), acc_delta = _mm256_setzero_ps();
    for (int i = 0; i < n / kQK; ++i) {
        uint16_t sc[4];
        std::memcpy(sc, x[i].scales, sizeof sc);
        const auto scale =
            static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) | ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000));
        alignas(32) uint16_t idx[32];
        iq1m_indices(x[i], idx);
        const __m256i qh = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].qh)));
        __m256i sums = _mm256_setzero_si256(), delta_sums = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ++ib) {
            const uint16_t* k = idx + 4 * ib;
            const __m256i grid = grid8x4(kIq1sGrid[k[0]], kIq1sGrid[k[1]], kIq1sGrid[k[2]], kIq1sGrid[k[3]]);
            const __m256i delta = delta_signs(qh, ib);
            const int s = sc[ib / 2] >> (6 * (ib % 2));
            const __m256i ls = scale_words(2 * (s & 7) + 1, 2 * ((s >> 3) & 7) + 1);
            sums = _mm256_add_epi32(sums, signed_lanes(grid, y[i].qs + 32 * ib, ls));
            delta_sums = _mm256_add_epi32(delta_sums, delta_lanes(delta, y[i].qs + 32 * ib, ls));
        }
        const __m256 d = _mm256_set1_ps(y[i].d * to_f32(scale));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums), acc);
        acc_delta = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(delta_sums), acc_delta);
    }
    *out = hsum8(acc) + 0.125f * hsum8(acc_delta);
}

// ---- llama.cpp's tiled-matmul order (ggml-cpu's tiled/: a batch of 8 or more tokens) ----
// Per super-block the exact integer sum of ls * w * y (w the signed grid value; IQ1: 8 g + delta,
// its 1/8 folded into the scale), then block = float(sum) * (d_w / kDiv), out = fma(block, d_a, out).
// gemm_batch_ref.cpp holds the scalar reference.

// A super-block unpacked once for all the tokens of a batch: per sub-block the signed weight bytes
// (the grid value times its sign; IQ1: 8 g + delta), per 16 elements the scale. sum(ls * v * q8)
// is the reference's exact integer sum.
struct Unpacked {
    __m256i v[8];
    int32_t ls[16];  // per group of 16 elements
};

inline void unpack_iq3_xxs(const BlockIQ3_XXS& x, Unpacked& u) {
    for (int ib = 0; ib < 8; ++ib) {
        const uint32_t aux = u32_at(x.qs + kQK / 4 + 4 * ib);
        u.ls[2 * ib] = u.ls[2 * ib + 1] = 2 * static_cast<int>(aux >> 28) + 1;
        u.v[ib] = _mm256_sign_epi8(grid4x8(kIq3xxsGrid, x.qs + 8 * ib, 0), xxs_sign_bytes(aux));
    }
}

inline void unpack_iq3_s(const BlockIQ3_S& x, Unpacked& u) {
    alignas(32) uint16_t idx[64];
    iq3s_indices(x, idx);
    for (int ib = 0; ib < 8; ++ib) {
        u.ls[2 * ib] = u.ls[2 * ib + 1] = 2 * ((x.scales[ib / 2] >> (4 * (ib % 2))) & 15) + 1;
        u.v[ib] = _mm256_sign_epi8(grid4x8(kIq3sGrid, idx + 8 * ib), sign_bytes(u32_at(x.signs + 4 * ib)));
    }
}

inline void unpack_iq2_xxs(const BlockIQ2_XXS& x, Unpacked& u) {
    for (int ib = 0; ib < 8; ++ib) {
        const auto* bytes = reinterpret_cast<const uint8_t*>(x.qs) + 8 * ib;
        const uint32_t w1 = u32_at(bytes + 4);
        u.ls[2 * ib] = u.ls[2 * ib + 1] = 2 * static_cast<int>(w1 >> 28) + 1;
        u.v[ib] = _mm256_sign_epi8(
            grid8x4(kIq2xxsGrid[bytes[0]], kIq2xxsGrid[bytes[1]], kIq2xxsGrid[bytes[2]], kIq2xxsGrid[bytes[3]]),
            xxs_sign_bytes(w1));
    }
}

inline void unpack_iq2_xs(const BlockIQ2_XS& x, Unpacked& u) {
    for (int ib = 0; ib < 8; ++ib) {
        const uint16_t* q = x.qs + 4 * ib;
        u.ls[2 * ib] = 2 * (x.scales[ib] & 15) + 1;
        u.ls[2 * ib + 1] = 2 * (x.scales[ib] >> 4) + 1;
        u.v[ib] = _mm256_sign_epi8(
            grid8x4(kIq2xsGrid[q[0] & 511], kIq2xsGrid[q[1] & 511], kIq2xsGrid[q[2] & 511], kIq2xsGrid[q[3] & 511]),
            xs_sign_bytes(q));
    }
}

inline void unpack_iq2_s(const BlockIQ2_S& x, Unpacked& u) {
    alignas(32) uint16_t idx[32];
    iq2s_indices(x, idx);
    for (int ib = 0; ib < 8; ++ib) {
        const uint16_t* k = idx + 4 * ib;
        u.ls[2 * ib] = 2 * (x.scales[ib] & 15) + 1;
        u.ls[2 * ib + 1] = 2 * (x.scales[ib] >> 4) + 1;
        u.v[ib] = _mm256_sign_epi8(grid8x4(kIq2sGrid[k[0]], kIq2sGrid[k[1]], kIq2sGrid[k[2]], kIq2sGrid[k[3]]),
                                   sign_bytes(u32_at(x.qs + kQK / 8 + 4 * ib)));
    }
}

inline void unpack_iq1_s(const BlockIQ1_S& x, Unpacked& u) {
    alignas(32) uint16_t idx[32];
    iq1s_indices(x, idx);
    const __m256i eight = _mm256_set1_epi8(8);
    for (int ib = 0; ib < 8; ++ib) {
        const int qh = x.qh[ib];
        const uint16_t* k = idx + 4 * ib;
        const __m256i grid = grid8x4(kIq1sGrid[k[0]], kIq1sGrid[k[1]], kIq1sGrid[k[2]], kIq1sGrid[k[3]]);
        u.ls[2 * ib] = u.ls[2 * ib + 1] = 2 * ((qh >> 12) & 7) + 1;
        const __m256i delta = _mm256_set1_epi8(static_cast<char>(1 - ((qh >> 14) & 2)));
        u.v[ib] = _mm256_add_epi8(_mm256_sign_epi8(eight, grid), delta);
    }
}

inline void unpack_iq1_m(const BlockIQ1_M& x, Unpacked& u) {
    uint16_t sc[4];
    std::memcpy(sc, x.scales, sizeof sc);
    alignas(32) uint16_t idx[32];
    iq1m_indices(x, idx);
    const __m256i qh = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.qh)));
    const __m256i eight = _mm256_set1_epi8(8);
    for (int ib = 0; ib < 8; ++ib) {
        const uint16_t* k = idx + 4 * ib;
        const __m256i grid = grid8x4(kIq1sGrid[k[0]], kIq1sGrid[k[1]], kIq1sGrid[k[2]], kIq1sGrid[k[3]]);
        const int s = sc[ib / 2] >> (6 * (ib % 2));
        u.ls[2 * ib] = 2 * (s & 7) + 1;
        u.ls[2 * ib + 1] = 2 * ((s >> 3) & 7) + 1;
        u.v[ib] = _mm256_add_epi8(_mm256_sign_epi8(eight, grid), delta_signs(qh, ib));
    }
}

template <typename Block>
inline float block_d(const Block& x) {
    if constexpr (std::is_same_v<Block, BlockIQ1_M>) {
        uint16_t sc[4];
        std::memcpy(sc, x.scales, sizeof sc);
        return to_f32(
            static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) | ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000)));
    } else {
        return to_f32(x.d);
    }
}

constexpr int kOffset = 64;  // added to the signed weights: unsigned bytes for maddubs

// ---- The batch kernel at AVX2 and AVX-512 without VNNI (gemm_iq_grid_avx512.cpp has the VNNI one) ----
// One 32-bit lane per weight row, 8 rows per tile, super-block by super-block: each row's block is
// unpacked once for all the call's tokens, + kOffset (unsigned, 2 .. 126), and transposed so that
// column c of the tile holds elements 4c .. 4c + 3 of the 8 rows. Per token (kLaneTok at a time)
// and pair of columns: maddubs of each with the token's 4 bytes broadcast, the pair sums added in
// 16 bits, started at the pair's -kOffset * (pair sums of the activations) (chunk_starts, once per
// call); madd with the rows' scales (in both words) into the int32 sums. The 16-bit adds wrap, but
// the words they end at are sums of v * q over 2 columns (|v| <= 62, |q| <= 127: 2 * 2 * 62 * 127 <
// 2^15), so they are exact; maddubs' own pair sums never saturate (2 * 126 * 127 < 2^15). The
// sums are the reference's exact integers; the float steps are its own, per row and token:
// float(sum) * (d_w / kDiv), then fma with d_a into the output of the previous block (kept in a
// scratch buffer until the tile's last block), so every output gets the reference's bits.
constexpr int kLaneRows = 8;
constexpr int kLaneTok = 4;
constexpr int kChunk = 2;  // columns per 16-bit sum

struct alignas(32) LaneTile {
    __m256i w[64];   // column c: bytes 4c .. 4c + 3 of rows 0 .. 7, + kOffset
    __m256i ls[16];  // group of 16 elements g: each row's scale in both 16-bit words
    alignas(32) float dw[kLaneRows];
};

// Block i of rows 0 .. nr - 1 into the tile; the rows after them get zero scales (sums 0).
template <typename Block, void (*kUnpack)(const Block&, Unpacked&), int kDiv>
inline void fill_lanes(const uint8_t* w, size_t w_stride, int nr, int i, LaneTile& tile) {
    const __m256i offset = _mm256_set1_epi8(kOffset);
    __m256i rows[kLaneRows][8];
    alignas(32) int32_t ls[16][kLaneRows];
    for (int r = 0; r < kLaneRows; ++r) {
        if (r >= nr) {
            for (int ib = 0; ib < 8; ++ib) rows[r][ib] = _mm256_setzero_si256();
            for (int g = 0; g < 16; ++g) ls[g][r] = 0;
            tile.dw[r] = 0.0f;
            continue;
        }
        const Block& x = reinterpret_cast<const Block*>(w + static_cast<size_t>(r) * w_stride)[i];
        Unpacked u;
        kUnpack(x, u);
        for (int ib = 0; ib < 8; ++ib) {
            rows[r][ib] = _mm256_add_epi8(u.v[ib], offset);
            ls[2 * ib][r] = u.ls[2 * ib] * 0x10001;
            ls[2 * ib + 1][r] = u.ls[2 * ib + 1] * 0x10001;
        }
        tile.dw[r] = block_d(x) * (1.0f / kDiv);
    }
    for (int g = 0; g < 16; ++g) tile.ls[g] = _mm256_load_si256(reinterpret_cast<const __m256i*>(ls[g]));
    for (int ib = 0; ib < 8; ++ib) {
        __m256i c[8];
        for (int j = 0; j < 8; ++j) c[j] = rows[j][ib];
        transpose8(c);
        for (int j = 0; j < 8; ++j) tile.w[8 * ib + j] = c[j];
    }
}

// Per token and block, the start of column pair k: -kOffset * the pair sums of its activations,
// word-wise over its 2 columns (mod 2^16), as the 32-bit pattern to broadcast.
inline void chunk_starts(const BlockQ8_K& a, int32_t* out) {
    for (int ib = 0; ib < 8; ++ib) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs + 32 * ib));
        __m256i s = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_maddubs_epi16(_mm256_set1_epi8(kOffset), q));
        s = _mm256_add_epi16(s, _mm256_shuffle_epi32(s, 0xB1));  // lane 2j: columns 2j and 2j + 1
        alignas(32) int32_t lanes[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
        for (int k = 0; k < 4; ++k) out[4 * ib + k] = lanes[2 * k];
    }
}

// The tile's 8 rows times kT tokens (a[t]: their block, st[t]: its column pairs' starts), added
// into out[8 t .. 8 t + 7]. kGroup: elements per scale (16 or 32).
template <int kGroup, int kT>
inline void lanes_pass(const LaneTile& tile, const BlockQ8_K* const* a, const int32_t* const* st, float* out) {
    constexpr int kChunks = 64 / kChunk;  // column pairs per block
    __m256i total[kT];
#pragma GCC unroll 8
    for (int t = 0; t < kT; ++t) total[t] = _mm256_setzero_si256();
    for (int k = 0; k < kChunks; ++k) {
        __m256i s[kT];
#pragma GCC unroll 8
        for (int t = 0; t < kT; ++t) s[t] = _mm256_set1_epi32(st[t][k]);
#pragma GCC unroll 8
        for (int c = 0; c < kChunk; ++c) {
            const int col = kChunk * k + c;
            const __m256i w = tile.w[col];
#pragma GCC unroll 8
            for (int t = 0; t < kT; ++t) {
                int32_t q4;
                std::memcpy(&q4, a[t]->qs + 4 * col, 4);
                s[t] = _mm256_add_epi16(s[t], _mm256_maddubs_epi16(w, _mm256_set1_epi32(q4)));
            }
        }
        const __m256i ls = tile.ls[kGroup / 16 * (kChunk * k * 4 / kGroup)];
#pragma GCC unroll 8
        for (int t = 0; t < kT; ++t) total[t] = _mm256_add_epi32(total[t], _mm256_madd_epi16(s[t], ls));
    }
    const __m256 dw = _mm256_load_ps(tile.dw);
#pragma GCC unroll 8
    for (int t = 0; t < kT; ++t) {
        const __m256 block = _mm256_mul_ps(_mm256_cvtepi32_ps(total[t]), dw);
        float* o = out + kLaneRows * t;
        _mm256_storeu_ps(o, _mm256_fmadd_ps(block, _mm256_set1_ps(a[t]->d), _mm256_loadu_ps(o)));
    }
}

// The batch kernel: kGroup elements per scale.
template <typename Block, void (*kUnpack)(const Block&, Unpacked&), int kDiv, int kGroup>
void gemm_lanes(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride,
                float* y, size_t y_stride) {
    constexpr int kChunks = 64 / kChunk;  // column pairs per block
    const int nb = n / kQK;
    const size_t out_floats = static_cast<size_t>(n_tok) * kLaneRows;
    const size_t n_starts = static_cast<size_t>(n_tok) * static_cast<size_t>(nb) * kChunks;
    std::byte* buf = small_batch_scratch(sizeof(LaneTile) + out_floats * sizeof(float) + n_starts * sizeof(int32_t));
    auto& tile = *reinterpret_cast<LaneTile*>(buf);
    auto* out = reinterpret_cast<float*>(buf + sizeof(LaneTile));
    auto* starts = reinterpret_cast<int32_t*>(buf + sizeof(LaneTile) + out_floats * sizeof(float));
    const auto* wb = static_cast<const uint8_t*>(w);
    const auto* ab = static_cast<const uint8_t*>(act);
    auto tok = [&](int t) { return reinterpret_cast<const BlockQ8_K*>(ab + static_cast<size_t>(t) * act_stride); };
    // starts[(i * n_tok + t) * kChunks + k]: block i, token t, chunk k.
    for (int i = 0; i < nb; ++i) {
        for (int t = 0; t < n_tok; ++t) {
            chunk_starts(tok(t)[i], starts + (static_cast<size_t>(i) * n_tok + t) * kChunks);
        }
    }
    for (int r0 = 0; r0 < n_rows; r0 += kLaneRows) {
        const int nr = n_rows - r0 < kLaneRows ? n_rows - r0 : kLaneRows;
        std::memset(out, 0, out_floats * sizeof(float));
        for (int i = 0; i < nb; ++i) {
            fill_lanes<Block, kUnpack, kDiv>(wb + static_cast<size_t>(r0) * w_stride, w_stride, nr, i, tile);
            int t = 0;
            auto pass = [&](auto kind) {
                constexpr int kT = decltype(kind)::value;
                const BlockQ8_K* a[kT];
                const int32_t* st[kT];
                for (int j = 0; j < kT; ++j) {
                    a[j] = tok(t + j) + i;
                    st[j] = starts + (static_cast<size_t>(i) * n_tok + t + j) * kChunks;
                }
                lanes_pass<kGroup, kT>(tile, a, st, out + static_cast<size_t>(t) * kLaneRows);
                t += kT;
            };
            while (n_tok - t >= kLaneTok) pass(std::integral_constant<int, kLaneTok>{});
            if (n_tok - t >= 2) pass(std::integral_constant<int, 2>{});
            if (n_tok - t >= 1) pass(std::integral_constant<int, 1>{});
        }
        for (int t = 0; t < n_tok; ++t) {
            float* dst = y + static_cast<size_t>(t) * y_stride + static_cast<size_t>(r0);
            const float* src = out + static_cast<size_t>(t) * kLaneRows;
            if (nr == kLaneRows) {
                _mm256_storeu_ps(dst, _mm256_load_ps(src));
            } else {
                std::memcpy(dst, src, static_cast<size_t>(nr) * sizeof(float));
            }
        }
    }
}

// The tiled-order kernel of a grid i-quant; nullptr for other types (gemm_batch_avx2.cpp's and
// gemm_batch_avx512.cpp's tables; at AVX-512 VNNI gemm.cpp picks gemm_iq_grid_avx512.cpp's instead).
inline GemmFn tiled_gemm(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::IQ3_XXS:
            return gemm_lanes<BlockIQ3_XXS, unpack_iq3_xxs, 4, 32>;
        case GgmlType::IQ3_S:
            return gemm_lanes<BlockIQ3_S, unpack_iq3_s, 1, 32>;
        case GgmlType::IQ2_XXS:
            return gemm_lanes<BlockIQ2_XXS, unpack_iq2_xxs, 8, 32>;
        case GgmlType::IQ2_XS:
            return gemm_lanes<BlockIQ2_XS, unpack_iq2_xs, 8, 16>;
        case GgmlType::IQ2_S:
            return gemm_lanes<BlockIQ2_S, unpack_iq2_s, 8, 16>;
        case GgmlType::IQ1_S:
            return gemm_lanes<BlockIQ1_S, unpack_iq1_s, 8, 32>;
        case GgmlType::IQ1_M:
            return gemm_lanes<BlockIQ1_M, unpack_iq1_m, 8, 16>;
        default:
            return nullptr;
    }
}

// The dot of a grid i-quant; nullptr for other types.
inline DotFn dot(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::IQ3_XXS:
            return dot_iq3_xxs;
        case GgmlType::IQ3_S:
            return dot_iq3_s;
        case GgmlType::IQ2_XXS:
            return dot_iq2_xxs;
        case GgmlType::IQ2_XS:
            return dot_iq2_xs;
        case GgmlType::IQ2_S:
            return dot_iq2_s;
        case GgmlType::IQ1_S:
            return dot_iq1_s;
        case GgmlType::IQ1_M:
            return dot_iq1_m;
        default:
            return nullptr;
    }
}

}  // namespace iq
}  // namespace
}  // namespace fitllm::quant::detail
