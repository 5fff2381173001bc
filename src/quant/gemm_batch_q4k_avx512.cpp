// AVX-512 (F, BW, VL; VNNI where kVnni) kernels of Q4_K and Q2_K in llama.cpp's batch order
// (gemm_batch_q4k.h). Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -mf16c; the
// kVnni = false kernels use no VNNI instruction. See dot_kernels.h for the rules this file follows.
//
// Layout (as gemm_avx512.cpp): one 32-bit lane per weight row. A tile of 16 rows is repacked, a
// chunk of kChunkBlocks super-blocks at a time, into unsigned bytes where register g of a group
// holds elements 4g .. 4g + 3 of the 16 rows, plus the rows' scales. A token then costs, per
// group, one vpdpbusd with its own 4 bytes broadcast: the integer sums of each (row, token) land
// in their own lane with no horizontal reduction, which the batch order needs per chunk of 64 or
// 128 elements (a reduction per chunk in the one-lane-per-element layout of
// gemm_avx512_kquants.cpp would cost as much as the products).
//
// Q4_K: the quants stay 4-bit (scale * q does not fit a byte). The two sub-blocks of a chunk sum
// separately (X0, X1, exact int32); the chunk's integer is sc0 X0 + sc1 X1, computed in floats:
// |sc X| <= 63 * 32 * 15 * 127 and the sum stay below 2^24, so every step is exact and the float
// is that of the integer, as llama.cpp's cvtepi32_ps gives it. Q2_K: scale * q <= 45 fits a byte,
// so the repacked weights carry their scales and a chunk's integer is one chain of vpdpbusd.
// The mins: two 16-bit mins per lane (per row) times two 16-bit activation sums (broadcast), one
// madd per pair of sub-blocks, exact.
// Without VNNI the products run on maddubs as in gemm_avx512.cpp: groups add up in 16 bits (8 of
// Q4_K's, 2 of Q2_K's larger products) before one madd.

// GCC 12's AVX-512 headers trip its own uninitialized-variable warnings; see dot_avx512.cpp.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "quant/blocks.h"
#include "quant/gemm_batch_q4k.h"
#include "quant/transpose_avx2.h"

namespace fitllm::quant::detail {
namespace {

constexpr int kLanes = 16;       // weight rows per tile: one 32-bit lane each
constexpr int kChunkBlocks = 4;  // super-blocks per repacked chunk of the tile: about 20 KiB, L1
constexpr int kMaxTok = 4;       // tokens per micro-kernel call

float f16(uint16_t h) {
    return _cvtsh_ss(h);
}
__m256i load256(const void* p) {
    return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
int32_t load_i32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
// Two 16-bit values in one 32-bit lane, lo first (little endian), as madd pairs them.
int32_t word_pair(int lo, int hi) {
    return static_cast<int32_t>((static_cast<uint32_t>(lo) & 0xFFFFu) | (static_cast<uint32_t>(hi) << 16));
}

// 32 bytes of each of 16 rows (zero for rows >= nr) -> 8 registers, register g holding bytes
// 4g .. 4g + 3 of every row, row j in lane j.
template <typename Row>
void transpose16x8(int nr, Row row, __m512i out[8]) {
    __m256i lo[8], hi[8];
    for (int j = 0; j < 8; ++j) {
        lo[j] = j < nr ? row(j) : _mm256_setzero_si256();
        hi[j] = j + 8 < nr ? row(j + 8) : _mm256_setzero_si256();
    }
    transpose8(lo);
    transpose8(hi);
    for (int g = 0; g < 8; ++g) out[g] = _mm512_inserti64x4(_mm512_castsi256_si512(lo[g]), hi[g], 1);
}

// Q4_K's 6-bit scales and mins (unpack_q4k_scales in blocks.h, redone here: see dot_kernels.h).
void q4k_scales_mins(const uint8_t* packed, uint8_t scales[8], uint8_t mins[8]) {
    uint32_t w[3];
    std::memcpy(w, packed, 12);
    const uint32_t words[4] = {
        w[0] & 0x3F3F3F3Fu,
        (w[2] & 0x0F0F0F0Fu) | (((w[0] >> 6) & 0x03030303u) << 4),
        w[1] & 0x3F3F3F3Fu,
        ((w[2] >> 4) & 0x0F0F0F0Fu) | (((w[1] >> 6) & 0x03030303u) << 4),
    };
    std::memcpy(scales, words, 8);
    std::memcpy(mins, words + 2, 8);
}

// A token's accumulators (acc, then acc_mins) between chunks of a row. (A type of this file's own:
// std::vector<float> would instantiate shared code compiled for this file's ISA.)
struct State {
    float acc[32];
};

// Per token and super-block: the activation scale, and (Q4_K) the sums of its sub-blocks of 32
// in word pairs: pair c = (sub-block 2c, sub-block 2c + 1), the chunk c of 64.
struct TokBlock {
    float d;
    int32_t sums[4];
};

// ---- Q4_K ----
struct Q4K {
    using Block = BlockQ4_K;
    static constexpr int kChunks = 4;      // of 64 elements
    static constexpr int kGroupsIn16 = 8;  // maddubs sums of 4-bit quants: 8 groups fit 16 bits
    struct alignas(64) Tile {
        uint8_t q[kChunkBlocks][4][2][8][64];   // block, chunk c, half h (sub-block 2c + h), group g
        float sc[kChunkBlocks][8][kLanes];      // sub-block scales
        int32_t mins[kChunkBlocks][4][kLanes];  // chunk c: word pair (min 2c, min 2c + 1)
        float d[kChunkBlocks][kLanes];
        float dmin[kChunkBlocks][kLanes];
    };

    static void repack(Tile& tile, const uint8_t* w, size_t w_stride, int nr, int b0, int kb) {
        const Block* rows[kLanes];
        for (int j = 0; j < nr; ++j)
            rows[j] = reinterpret_cast<const Block*>(w + static_cast<size_t>(j) * w_stride) + b0;
        const __m512i nibble = _mm512_set1_epi8(0x0F);
        // Byte offsets of the 16 rows for the gathers of scales_of_lanes (int32: strides up to 128 MiB).
        const bool gather_ok = w_stride <= (size_t{1} << 27);
        const __m512i offsets =
            _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                               _mm512_set1_epi32(gather_ok ? static_cast<int32_t>(w_stride) : 0));
        const auto lanes = static_cast<__mmask16>(nr >= kLanes ? 0xFFFF : (1u << nr) - 1);
        for (int b = 0; b < kb; ++b) {
            for (int c = 0; c < 4; ++c) {
                __m512i raw[8];
                transpose16x8(
                    nr, [&](int j) { return load256(rows[j][b].qs + 32 * c); }, raw);
                for (int g = 0; g < 8; ++g) {
                    _mm512_store_si512(tile.q[b][c][0][g], _mm512_and_si512(raw[g], nibble));
                    _mm512_store_si512(tile.q[b][c][1][g], _mm512_and_si512(_mm512_srli_epi16(raw[g], 4), nibble));
                }
            }
            if (gather_ok) {
                scales_of_lanes(tile, b, w + static_cast<size_t>(b0 + b) * sizeof(Block), offsets, lanes);
                continue;
            }
            for (int j = 0; j < kLanes; ++j) {
                uint8_t sc[8] = {}, mn[8] = {};
                if (j < nr) q4k_scales_mins(rows[j][b].scales, sc, mn);
                for (int s = 0; s < 8; ++s) tile.sc[b][s][j] = sc[s];
                for (int c = 0; c < 4; ++c) tile.mins[b][c][j] = word_pair(mn[2 * c], mn[2 * c + 1]);
                tile.d[b][j] = j < nr ? f16(rows[j][b].d) : 0.0f;
                tile.dmin[b][j] = j < nr ? f16(rows[j][b].dmin) : 0.0f;
            }
        }
    }

    // The first 16 bytes of a block (d, dmin, the 12 bytes of packed scales and mins) of 16 rows,
    // gathered one dword per lane (rows outside `lanes` read as zero), unpacked as
    // q4k_scales_mins does, 16 rows at a time.
    static void scales_of_lanes(Tile& tile, int b, const uint8_t* block0, __m512i offsets, __mmask16 lanes) {
        __m512i dw[4];
        for (int k = 0; k < 4; ++k) {
            dw[k] = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), lanes, offsets, block0 + 4 * k, 1);
        }
        const __m512i low6 = _mm512_set1_epi32(0x3F3F3F3F), low4 = _mm512_set1_epi32(0x0F0F0F0F);
        const __m512i top2 = _mm512_set1_epi32(0x03030303);
        const __m512i words[4] = {
            _mm512_and_si512(dw[1], low6),
            _mm512_or_si512(_mm512_and_si512(dw[3], low4),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(dw[1], 6), top2), 4)),
            _mm512_and_si512(dw[2], low6),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(dw[3], 4), low4),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(dw[2], 6), top2), 4)),
        };
        const __m512i byte = _mm512_set1_epi32(0xFF);
        for (int s = 0; s < 8; ++s) {
            const __m512i v = _mm512_and_si512(_mm512_srlv_epi32(words[s / 4], _mm512_set1_epi32(8 * (s % 4))), byte);
            _mm512_store_ps(tile.sc[b][s], _mm512_cvtepi32_ps(v));
        }
        // Mins 2c, 2c + 1 (bytes 2(c % 2), 2(c % 2) + 1 of words[2 + c / 2]) as a word pair.
        for (int c = 0; c < 4; ++c) {
            const __m512i v = _mm512_srli_epi32(words[2 + c / 2], 16 * (c % 2));
            const __m512i pair = _mm512_or_si512(
                _mm512_and_si512(v, byte), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(v, 8), byte), 16));
            _mm512_store_si512(tile.mins[b][c], pair);
        }
        _mm512_store_ps(tile.d[b], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dw[0])));
        _mm512_store_ps(tile.dmin[b], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dw[0], 16))));
    }

    static void prepare(TokBlock& p, const BlockQ8_K& y) {
        p.d = y.d;
        for (int c = 0; c < 4; ++c) {
            p.sums[c] = word_pair(y.bsums[4 * c] + y.bsums[4 * c + 1], y.bsums[4 * c + 2] + y.bsums[4 * c + 3]);
        }
    }
};

// ---- Q2_K ----
struct Q2K {
    using Block = BlockQ2_K;
    static constexpr int kChunks = 2;      // of 128 elements
    static constexpr int kGroupsIn16 = 2;  // maddubs sums of scale * q <= 45: 2 groups fit 16 bits
    struct alignas(64) Tile {
        uint8_t q[kChunkBlocks][2][32][64];     // block, chunk c, group g: scale * q
        int32_t mins[kChunkBlocks][8][kLanes];  // pair k: word pair (min 2k, min 2k + 1)
        float d[kChunkBlocks][kLanes];
        float dmin[kChunkBlocks][kLanes];
    };

    // Elements 128h + 32g .. + 31 of a block (sub-blocks 8h + 2g and 8h + 2g + 1) times their scales.
    static __m256i scaled_quants(const BlockQ2_K& x, int h, int g) {
        const __m256i q = _mm256_and_si256(_mm256_srli_epi16(load256(x.qs + 32 * h), 2 * g), _mm256_set1_epi8(3));
        const int j = 8 * h + 2 * g;
        // Bytes q < 4 times words s < 16: each byte's product stays below 256, so the 16-bit products
        // of (q_odd q_even) and s are the byte products side by side.
        const __m256i s = _mm256_set_m128i(_mm_set1_epi16(static_cast<short>(x.scales[j + 1] & 0x0F)),
                                           _mm_set1_epi16(static_cast<short>(x.scales[j] & 0x0F)));
        return _mm256_mullo_epi16(q, s);
    }

    static void repack(Tile& tile, const uint8_t* w, size_t w_stride, int nr, int b0, int kb) {
        const Block* rows[kLanes];
        for (int j = 0; j < nr; ++j)
            rows[j] = reinterpret_cast<const Block*>(w + static_cast<size_t>(j) * w_stride) + b0;
        for (int b = 0; b < kb; ++b) {
            for (int h = 0; h < 2; ++h) {
                for (int g = 0; g < 4; ++g) {
                    __m512i out[8];
                    transpose16x8(
                        nr, [&](int j) { return scaled_quants(rows[j][b], h, g); }, out);
                    for (int k = 0; k < 8; ++k) _mm512_store_si512(tile.q[b][h][8 * g + k], out[k]);
                }
            }
            for (int j = 0; j < kLanes; ++j) {
                for (int k = 0; k < 8; ++k) {
                    tile.mins[b][k][j] =
                        j < nr ? word_pair(rows[j][b].scales[2 * k] >> 4, rows[j][b].scales[2 * k + 1] >> 4) : 0;
                }
                tile.d[b][j] = j < nr ? f16(rows[j][b].d) : 0.0f;
                tile.dmin[b][j] = j < nr ? f16(rows[j][b].dmin) : 0.0f;
            }
        }
    }

    static void prepare(TokBlock& p, const BlockQ8_K& y) { p.d = y.d; }
};

// x[t] += sum over groups g < kGroups of the 4 products of w[g] and bytes 4g .. 4g + 3 of ya[t]:
// exact int32 per lane.
template <bool kVnni, int kT, int kGroups, int kGroupsIn16>
void dot_groups(__m512i* x, const uint8_t (*w)[64], const int8_t* const* ya) {
    if constexpr (kVnni) {
#pragma GCC unroll 32
        for (int g = 0; g < kGroups; ++g) {
            const __m512i wg = _mm512_load_si512(w[g]);
#pragma GCC unroll 8
            for (int t = 0; t < kT; ++t)
                x[t] = _mm512_dpbusd_epi32(x[t], wg, _mm512_set1_epi32(load_i32(ya[t] + 4 * g)));
        }
    } else {
        const __m512i ones = _mm512_set1_epi16(1);
#pragma GCC unroll 16
        for (int g0 = 0; g0 < kGroups; g0 += kGroupsIn16) {
            __m512i pairs[kT];
#pragma GCC unroll 8
            for (int g = g0; g < g0 + kGroupsIn16; ++g) {
                const __m512i wg = _mm512_load_si512(w[g]);
#pragma GCC unroll 8
                for (int t = 0; t < kT; ++t) {
                    const __m512i p = _mm512_maddubs_epi16(wg, _mm512_set1_epi32(load_i32(ya[t] + 4 * g)));
                    pairs[t] = g == g0 ? p : _mm512_add_epi16(pairs[t], p);
                }
            }
#pragma GCC unroll 8
            for (int t = 0; t < kT; ++t) x[t] = _mm512_add_epi32(x[t], _mm512_madd_epi16(pairs[t], ones));
        }
    }
}

// x += word pairs of `mins` times word pair `sums` (broadcast): exact int32 per lane.
template <bool kVnni>
__m512i mins_times_sums(__m512i x, __m512i mins, int32_t sums) {
    if constexpr (kVnni)
        return _mm512_dpwssd_epi32(x, mins, _mm512_set1_epi32(sums));
    else
        return _mm512_add_epi32(x, _mm512_madd_epi16(mins, _mm512_set1_epi32(sums)));
}

// kT tokens times the tile's 16 rows over its kb super-blocks. acc / acc_mins carry over between
// chunks of the row in `state` ([token][2][16] floats); `first` / `last`: this call starts / ends
// the row, and `last` writes y (token 0, row 0) for rows < nr.
template <typename K, bool kVnni, int kT>
void micro(const typename K::Tile& tile, int kb, const TokBlock* prep, size_t prep_stride, const uint8_t* act,
           size_t act_stride, float* state, float* y, size_t y_stride, int nr, bool first, bool last) {
    const BlockQ8_K* a[kT];
    for (int t = 0; t < kT; ++t) a[t] = reinterpret_cast<const BlockQ8_K*>(act + static_cast<size_t>(t) * act_stride);
    __m512 acc[kT], acc_mins[kT];
    for (int t = 0; t < kT; ++t) {
        acc[t] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(state + 32 * t);
        acc_mins[t] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(state + 32 * t + 16);
    }
    for (int b = 0; b < kb; ++b) {
        const __m512 dw = _mm512_load_ps(tile.d[b]);
        const __m512 dminw = _mm512_load_ps(tile.dmin[b]);
#pragma GCC unroll 4
        for (int c = 0; c < K::kChunks; ++c) {
            __m512 sums[kT];  // float(the chunk's integer sum of scale q y), exact
            __m512i mins[kT];
            if constexpr (K::kChunks == 4) {  // Q4_K: two sub-blocks of 32, scaled in floats
                __m512i x[2 * kT];
                const int8_t* ya[2 * kT];
                for (int t = 0; t < kT; ++t) {
                    x[t] = x[kT + t] = _mm512_setzero_si512();
                    ya[t] = a[t][b].qs + 64 * c;
                    ya[kT + t] = ya[t] + 32;
                }
                if constexpr (kVnni) {
                    // Both halves' chains side by side: twice the independent vpdpbusd.
#pragma GCC unroll 8
                    for (int g = 0; g < 8; ++g) {
                        const __m512i w0 = _mm512_load_si512(tile.q[b][c][0][g]);
                        const __m512i w1 = _mm512_load_si512(tile.q[b][c][1][g]);
#pragma GCC unroll 8
                        for (int t = 0; t < kT; ++t) {
                            x[t] = _mm512_dpbusd_epi32(x[t], w0, _mm512_set1_epi32(load_i32(ya[t] + 4 * g)));
                            x[kT + t] =
                                _mm512_dpbusd_epi32(x[kT + t], w1, _mm512_set1_epi32(load_i32(ya[kT + t] + 4 * g)));
                        }
                    }
                } else {
                    dot_groups<false, kT, 8, K::kGroupsIn16>(x, tile.q[b][c][0], ya);
                    dot_groups<false, kT, 8, K::kGroupsIn16>(x + kT, tile.q[b][c][1], ya + kT);
                }
                const __m512 sc0 = _mm512_load_ps(tile.sc[b][2 * c]), sc1 = _mm512_load_ps(tile.sc[b][2 * c + 1]);
                const __m512i mn = _mm512_load_si512(tile.mins[b][c]);
                for (int t = 0; t < kT; ++t) {
                    sums[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(x[kT + t]), sc1,
                                              _mm512_mul_ps(_mm512_cvtepi32_ps(x[t]), sc0));
                    mins[t] = mins_times_sums<kVnni>(_mm512_setzero_si512(), mn, prep[t * prep_stride + b].sums[c]);
                }
            } else {  // Q2_K: 128 elements of scaled quants in one chain
                __m512i x[kT];
                const int8_t* ya[kT];
                for (int t = 0; t < kT; ++t) {
                    x[t] = _mm512_setzero_si512();
                    ya[t] = a[t][b].qs + 128 * c;
                }
                dot_groups<kVnni, kT, 32, K::kGroupsIn16>(x, tile.q[b][c], ya);
                for (int t = 0; t < kT; ++t) {
                    sums[t] = _mm512_cvtepi32_ps(x[t]);
                    mins[t] = _mm512_setzero_si512();
                }
#pragma GCC unroll 4
                for (int k = 0; k < 4; ++k) {
                    const __m512i mn = _mm512_load_si512(tile.mins[b][4 * c + k]);
                    for (int t = 0; t < kT; ++t) {
                        mins[t] = mins_times_sums<kVnni>(mins[t], mn, load_i32(a[t][b].bsums + 8 * c + 2 * k));
                    }
                }
            }
            for (int t = 0; t < kT; ++t) {
                const __m512 da = _mm512_set1_ps(prep[t * prep_stride + b].d);
                acc[t] = _mm512_fmadd_ps(sums[t], _mm512_mul_ps(dw, da), acc[t]);
                acc_mins[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins[t]), _mm512_mul_ps(dminw, da), acc_mins[t]);
            }
        }
    }
    if (!last) {
        for (int t = 0; t < kT; ++t) {
            _mm512_storeu_ps(state + 32 * t, acc[t]);
            _mm512_storeu_ps(state + 32 * t + 16, acc_mins[t]);
        }
        return;
    }
    const auto mask = static_cast<__mmask16>(nr >= kLanes ? 0xFFFF : (1u << nr) - 1);
    for (int t = 0; t < kT; ++t) {
        _mm512_mask_storeu_ps(y + static_cast<size_t>(t) * y_stride, mask, _mm512_sub_ps(acc[t], acc_mins[t]));
    }
}

// micro for nt = 1 .. kMaxTok tokens.
template <typename K, bool kVnni, int... kI>
void micro_n(int nt, std::integer_sequence<int, kI...>, const typename K::Tile& tile, int kb, const TokBlock* prep,
             size_t prep_stride, const uint8_t* act, size_t act_stride, float* state, float* y, size_t y_stride, int nr,
             bool first, bool last) {
    using Fn = void (*)(const typename K::Tile&, int, const TokBlock*, size_t, const uint8_t*, size_t, float*, float*,
                        size_t, int, bool, bool);
    constexpr Fn kMicro[] = {&micro<K, kVnni, kI + 1>...};
    kMicro[nt - 1](tile, kb, prep, prep_stride, act, act_stride, state, y, y_stride, nr, first, last);
}

template <typename K, bool kVnni>
void gemm(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride, float* y,
          size_t y_stride) {
    const auto* w_bytes = static_cast<const uint8_t*>(w);
    const auto* a_bytes = static_cast<const uint8_t*>(act);
    const int nb = n / kQK;
    // Grow to the largest call this thread has seen; allocate nothing after that.
    static thread_local std::vector<TokBlock> prep;
    static thread_local std::vector<State> state;
    const size_t n_prep = static_cast<size_t>(n_tok) * nb;
    if (prep.size() < n_prep) prep.resize(n_prep);
    if (state.size() < static_cast<size_t>(n_tok)) state.resize(n_tok);
    for (int t = 0; t < n_tok; ++t) {
        const auto* yb = reinterpret_cast<const BlockQ8_K*>(a_bytes + static_cast<size_t>(t) * act_stride);
        for (int i = 0; i < nb; ++i) K::prepare(prep[static_cast<size_t>(t) * nb + i], yb[i]);
    }
    typename K::Tile tile;
    for (int r0 = 0; r0 < n_rows; r0 += kLanes) {
        const int nr = n_rows - r0 < kLanes ? n_rows - r0 : kLanes;
        for (int b0 = 0; b0 < nb; b0 += kChunkBlocks) {
            const int kb = nb - b0 < kChunkBlocks ? nb - b0 : kChunkBlocks;
            K::repack(tile, w_bytes + static_cast<size_t>(r0) * w_stride, w_stride, nr, b0, kb);
            for (int t = 0; t < n_tok; t += kMaxTok) {
                const int nt = n_tok - t < kMaxTok ? n_tok - t : kMaxTok;
                micro_n<K, kVnni>(nt, std::make_integer_sequence<int, kMaxTok>{}, tile, kb,
                                  prep.data() + static_cast<size_t>(t) * nb + b0, nb,
                                  a_bytes + static_cast<size_t>(t) * act_stride + b0 * sizeof(BlockQ8_K), act_stride,
                                  state[t].acc, y + static_cast<size_t>(t) * y_stride + r0, y_stride, nr, b0 == 0,
                                  b0 + kb == nb);
            }
        }
    }
}

template <bool kVnni>
GemmKernel table(GgmlType weight_type) {
    GemmKernel k;
    switch (weight_type) {
        case GgmlType::Q4_K:
            k.fn = gemm<Q4K, kVnni>;
            break;
        case GgmlType::Q2_K:
            k.fn = gemm<Q2K, kVnni>;
            break;
        default:
            return k;
    }
    k.isa = kVnni ? Isa::Avx512Vnni : Isa::Avx512;
    k.act_type = GgmlType::Q8_K;
    k.row_tile = kLanes;
    k.tok_tile = kMaxTok;
    return k;
}

}  // namespace

GemmKernel gemm_batch_q4k_avx512(GgmlType weight_type, bool vnni) {
    return vnni ? table<true>(weight_type) : table<false>(weight_type);
}

}  // namespace fitllm::quant::detail
