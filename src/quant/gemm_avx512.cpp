// AVX-512 tiled kernels for the blocks of 32 (Q4_0, Q5_0, Q8_0 with Q8_0; Q4_1, Q5_1 with Q8_1).
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx2 -mfma -mf16c; the kVnni = false
// kernels use no VNNI instruction. See dot_kernels.h for the rules this file follows.
//
// Layout: one 32-bit lane per weight row. A tile of 16 weight rows is repacked, one chunk of
// kChunk blocks at a time, into unsigned bytes where register g of block b holds elements
// 4g..4g+3 of each of the 16 rows (a 16 x 8 transpose of 4-byte groups), plus the rows' scales as
// floats. A token then costs, per block, 8 vpdpbusd of those registers with its own 4 bytes
// broadcast (straight from the Q8 row), one conversion and two float operations for 16 rows. The
// unpacking and transposing is paid once per tile and chunk and shared by every token of the call.
//
// The weights stay unsigned (q or q + 128 for Q8_0), so the integer dot of a block is
// sum(q y) - offset * sum(y); the int accumulator starts at -offset * sum(y), computed once per
// token and block. Without VNNI the products run on maddubs (two u8 x s8 products summed in 16
// bits) as in gemm_avx2.cpp: several groups add up in 16 bits before one madd (8 groups of 4-bit
// quants, 4 of 5-bit ones), and Q8_0's q + 128 is split into two 4-bit planes, lo + 16 hi.

// GCC 12's AVX-512 headers trip its own uninitialized-variable warnings; see dot_avx512.cpp.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "quant/blocks.h"
#include "quant/gemm_kernels.h"
#include "quant/transpose_avx2.h"

namespace fitllm::quant::detail {
namespace {

constexpr int kLanes = 16;      // weight rows per tile: one 32-bit lane each
constexpr int kChunk = 32;      // blocks per chunk of the row: the repacked tile is 20 (36) KiB: L1
constexpr int kTokChunk = 256;  // tokens whose per-block sums are prepared at once (stack)
constexpr int kMaxTok = 6;      // tokens per micro-kernel (2 * kMaxTok accumulators); 4..6 beat 8 by ~20%

struct alignas(64) Tile {
    uint8_t q[kChunk][16][64];  // block, group g (+ 8: Q8_0's high plane): bytes 4g..4g+3 of rows 0..15
    float d[kChunk][kLanes];
    float m[kChunk][kLanes];  // Q4_1 / Q5_1
};

// Per token and block of the chunk: the activation scale, and -offset * sum(q) (symmetric types)
// or the activation's s = d * sum(q) (affine types).
struct TokBlock {
    float d;
    int32_t off;
    float s;
    int32_t off8[8];  // lanes8 types: -offset * sum(q) of each group of 4 elements
};

template <GgmlType kType>
struct Kind;
template <>
struct Kind<GgmlType::Q4_0> {
    static constexpr bool kLanes8 = false;  // dot_ref.cpp's order: lanes8 (else serial)
    using W = BlockQ4_0;
    using A = BlockQ8_0;
    static constexpr int kOffset = 8;
    static constexpr bool kAffine = false;
    static constexpr int kPlanesWithoutVnni = 1;  // Q8_0: lo and hi nibble of q + 128
    static constexpr int kGroupsIn16 = 8;         // groups whose maddubs sums add in 16 bits
};
template <>
struct Kind<GgmlType::Q5_0> {
    static constexpr bool kLanes8 = true;  // dot_ref.cpp's order: lanes8 (else serial)
    using W = BlockQ5_0;
    using A = BlockQ8_0;
    static constexpr int kOffset = 16;
    static constexpr bool kAffine = false;
    static constexpr int kPlanesWithoutVnni = 1;
    static constexpr int kGroupsIn16 = 4;
};
template <>
struct Kind<GgmlType::Q8_0> {
    static constexpr bool kLanes8 = true;  // dot_ref.cpp's order: lanes8 (else serial)
    using W = BlockQ8_0;
    using A = BlockQ8_0;
    static constexpr int kOffset = 128;
    static constexpr bool kAffine = false;
    static constexpr int kPlanesWithoutVnni = 2;
    static constexpr int kGroupsIn16 = 8;
};
template <>
struct Kind<GgmlType::Q4_1> {
    static constexpr bool kLanes8 = false;  // dot_ref.cpp's order: lanes8 (else serial)
    using W = BlockQ4_1;
    using A = BlockQ8_1;
    static constexpr int kOffset = 0;
    static constexpr bool kAffine = true;
    static constexpr int kPlanesWithoutVnni = 1;
    static constexpr int kGroupsIn16 = 8;
};
template <>
struct Kind<GgmlType::Q5_1> {
    static constexpr bool kLanes8 = false;  // dot_ref.cpp's order: lanes8 (else serial)
    using W = BlockQ5_1;
    using A = BlockQ8_1;
    static constexpr int kOffset = 0;
    static constexpr bool kAffine = true;
    static constexpr int kPlanesWithoutVnni = 1;
    static constexpr int kGroupsIn16 = 4;
};

float f16(uint16_t h) {
    return _cvtsh_ss(h);
}
__m128i load128(const void* p) {
    return _mm_loadu_si128(static_cast<const __m128i*>(p));
}
__m256i load256(const void* p) {
    return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
int32_t load_i32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// The 32 quants of a weight block as unsigned bytes, in element order. Q8_0: q + 128, or one of
// its nibbles (plane 0: low, 1: high) when `planes` is 2.
template <typename Block>
__m256i unpack(const Block& b, int planes, int plane) {
    if constexpr (std::is_same_v<Block, BlockQ8_0>) {
        const __m256i u = _mm256_xor_si256(load256(b.qs), _mm256_set1_epi8(static_cast<char>(0x80)));  // q + 128
        if (planes == 1) return u;
        return _mm256_and_si256(plane == 0 ? u : _mm256_srli_epi16(u, 4), _mm256_set1_epi8(0x0F));
    } else {
        const __m128i p = load128(b.qs);
        __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), _mm256_set1_epi8(0x0F));
        if constexpr (std::is_same_v<Block, BlockQ5_0> || std::is_same_v<Block, BlockQ5_1>) {
            uint32_t h;
            std::memcpy(&h, b.qh, 4);
            q = _mm256_mask_add_epi8(q, static_cast<__mmask32>(h), q, _mm256_set1_epi8(16));
        }
        return q;
    }
}

// Blocks b0 .. b0 + kb - 1 of rows 0 .. nr - 1 (nr <= 16) into the tile; missing rows are zero.
template <typename K, int kPlanes>
void repack(Tile& tile, const uint8_t* w, size_t w_stride, int nr, int b0, int kb) {
    using W = typename K::W;
    const W* rows[kLanes];
    for (int j = 0; j < kLanes; ++j) {
        rows[j] = j < nr ? reinterpret_cast<const W*>(w + static_cast<size_t>(j) * w_stride) + b0 : nullptr;
    }
    for (int b = 0; b < kb; ++b) {
        for (int plane = 0; plane < kPlanes; ++plane) {
            __m256i lo[8], hi[8];
            for (int j = 0; j < 8; ++j) {
                lo[j] = j < nr ? unpack(rows[j][b], kPlanes, plane) : _mm256_setzero_si256();
                hi[j] = j + 8 < nr ? unpack(rows[j + 8][b], kPlanes, plane) : _mm256_setzero_si256();
            }
            transpose8(lo);
            transpose8(hi);
            for (int g = 0; g < 8; ++g) {
                _mm512_store_si512(tile.q[b][8 * plane + g],
                                   _mm512_inserti64x4(_mm512_castsi256_si512(lo[g]), hi[g], 1));
            }
        }
        for (int j = 0; j < kLanes; ++j) {
            tile.d[b][j] = j < nr ? f16(rows[j][b].d) : 0.0f;
            if constexpr (K::kAffine) tile.m[b][j] = j < nr ? f16(rows[j][b].m) : 0.0f;
        }
    }
}

// sum of the 32 signed bytes at p.
int32_t sum_i8(const int8_t* p) {
    const __m256i u = _mm256_xor_si256(load256(p), _mm256_set1_epi8(static_cast<char>(0x80)));  // q + 128
    const __m256i s = _mm256_sad_epu8(u, _mm256_setzero_si256());
    __m128i x = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    x = _mm_add_epi64(x, _mm_unpackhi_epi64(x, x));
    return _mm_cvtsi128_si32(x) - 32 * 128;
}

template <typename K>
void prepare(TokBlock* p, const uint8_t* act, size_t act_stride, int n_tok, int b0, int kb) {
    using A = typename K::A;
    for (int t = 0; t < n_tok; ++t) {
        const A* y = reinterpret_cast<const A*>(act + static_cast<size_t>(t) * act_stride) + b0;
        TokBlock* out = p + t * kChunk;
        for (int b = 0; b < kb; ++b) {
            out[b].d = f16(y[b].d);
            if constexpr (K::kAffine)
                out[b].s = f16(y[b].s);
            else
                out[b].off = -K::kOffset * sum_i8(y[b].qs);
            if constexpr (K::kLanes8) {
                for (int g = 0; g < 8; ++g) {
                    int sum = 0;
                    for (int e = 0; e < 4; ++e) sum += y[b].qs[4 * g + e];
                    out[b].off8[g] = -K::kOffset * sum;
                }
            }
        }
    }
}

// kT tokens times the tile's 16 rows over kb blocks; y (token 0, row 0) gets or adds the sums of
// rows < nr.
template <typename K, bool kVnni, int kT>
void micro(const Tile& tile, int kb, const TokBlock* prep, const uint8_t* act, size_t act_stride, float* y,
           size_t y_stride, int nr, bool add) {
    using A = typename K::A;
    const A* a[kT];
    for (int t = 0; t < kT; ++t) a[t] = reinterpret_cast<const A*>(act + static_cast<size_t>(t) * act_stride);
    // Rows wider than a chunk go on from the sums of the chunks before (in y): one fma a block
    // after another, the serial order of dot_ref.cpp (Q4_0).
    const auto mask = static_cast<__mmask16>(nr >= kLanes ? 0xFFFF : (1u << nr) - 1);
    __m512 acc[kT];
    for (int t = 0; t < kT; ++t) {
        acc[t] = add ? _mm512_maskz_loadu_ps(mask, y + static_cast<size_t>(t) * y_stride) : _mm512_setzero_ps();
    }
    for (int b = 0; b < kb; ++b) {
        __m512i sum[kT];
#pragma GCC unroll 8
        for (int t = 0; t < kT; ++t) {
            sum[t] = K::kAffine ? _mm512_setzero_si512() : _mm512_set1_epi32(prep[t * kChunk + b].off);
        }
        if constexpr (kVnni) {
#pragma GCC unroll 8
            for (int g = 0; g < 8; ++g) {
                const __m512i w = _mm512_load_si512(tile.q[b][g]);
#pragma GCC unroll 8
                for (int t = 0; t < kT; ++t) {
                    sum[t] = _mm512_dpbusd_epi32(sum[t], w, _mm512_set1_epi32(load_i32(a[t][b].qs + 4 * g)));
                }
            }
        } else {
#pragma GCC unroll 2
            for (int plane = 0; plane < K::kPlanesWithoutVnni; ++plane) {
#pragma GCC unroll 2
                for (int g0 = 0; g0 < 8; g0 += K::kGroupsIn16) {
                    __m512i pairs[kT];
#pragma GCC unroll 8
                    for (int g = g0; g < g0 + K::kGroupsIn16; ++g) {
                        const __m512i w = _mm512_load_si512(tile.q[b][8 * plane + g]);
#pragma GCC unroll 8
                        for (int t = 0; t < kT; ++t) {
                            const __m512i p = _mm512_maddubs_epi16(w, _mm512_set1_epi32(load_i32(a[t][b].qs + 4 * g)));
                            pairs[t] = g == g0 ? p : _mm512_add_epi16(pairs[t], p);
                        }
                    }
                    const __m512i weight = _mm512_set1_epi16(plane == 0 ? 1 : 16);
#pragma GCC unroll 8
                    for (int t = 0; t < kT; ++t) sum[t] = _mm512_add_epi32(sum[t], _mm512_madd_epi16(pairs[t], weight));
                }
            }
        }
        const __m512 dw = _mm512_load_ps(tile.d[b]);
#pragma GCC unroll 8
        for (int t = 0; t < kT; ++t) {
            const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(prep[t * kChunk + b].d));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[t]), scale, acc[t]);
        }
        if constexpr (K::kAffine) {
            const __m512 mw = _mm512_load_ps(tile.m[b]);
#pragma GCC unroll 8
            for (int t = 0; t < kT; ++t) acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(prep[t * kChunk + b].s), acc[t]);
        }
    }
    for (int t = 0; t < kT; ++t) _mm512_mask_storeu_ps(y + static_cast<size_t>(t) * y_stride, mask, acc[t]);
}

// The lanes8 order (Q5_0, Q8_0, as llama.cpp's sgemm and vec_dot): for each of the tile's rows and
// kT tokens, 8 float accumulators, accumulator g taking the exact integer sum of elements
// 4g .. 4g + 3 of each block (register g of the tile) times d_w d_a in one fma a block; at the
// end hsum_float_8's tree over g. Rows wider than a chunk carry the accumulators over in `state`
// ([token][g][row] floats): first / last say whether this call starts or ends the row.
template <typename K, bool kVnni, int kT>
void micro_lanes8(const Tile& tile, int kb, const TokBlock* prep, const uint8_t* act, size_t act_stride, float* y,
                  size_t y_stride, int nr, float* state, bool first, bool last) {
    using A = typename K::A;
    const A* a[kT];
    for (int t = 0; t < kT; ++t) a[t] = reinterpret_cast<const A*>(act + static_cast<size_t>(t) * act_stride);
    __m512 acc[kT][8];
    for (int t = 0; t < kT; ++t) {
        for (int g = 0; g < 8; ++g) acc[t][g] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(state + (8 * t + g) * 16);
    }
    for (int b = 0; b < kb; ++b) {
        const __m512 dw = _mm512_load_ps(tile.d[b]);
        __m512 scale[kT];
#pragma GCC unroll 8
        for (int t = 0; t < kT; ++t) scale[t] = _mm512_mul_ps(dw, _mm512_set1_ps(prep[t * kChunk + b].d));
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) {
            if constexpr (kVnni) {
                const __m512i w = _mm512_load_si512(tile.q[b][g]);
#pragma GCC unroll 8
                for (int t = 0; t < kT; ++t) {
                    const __m512i sum = _mm512_dpbusd_epi32(_mm512_set1_epi32(prep[t * kChunk + b].off8[g]), w,
                                                            _mm512_set1_epi32(load_i32(a[t][b].qs + 4 * g)));
                    acc[t][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale[t], acc[t][g]);
                }
            } else {
                const __m512i ones = _mm512_set1_epi16(1);
#pragma GCC unroll 8
                for (int t = 0; t < kT; ++t) {
                    const __m512i yg = _mm512_set1_epi32(load_i32(a[t][b].qs + 4 * g));
                    __m512i sum = _mm512_add_epi32(
                        _mm512_set1_epi32(prep[t * kChunk + b].off8[g]),
                        _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_load_si512(tile.q[b][g]), yg), ones));
                    if constexpr (K::kPlanesWithoutVnni == 2) {
                        sum = _mm512_add_epi32(
                            sum, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_load_si512(tile.q[b][8 + g]), yg),
                                                   _mm512_set1_epi16(16)));
                    }
                    acc[t][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale[t], acc[t][g]);
                }
            }
        }
    }
    const auto mask = static_cast<__mmask16>(nr >= kLanes ? 0xFFFF : (1u << nr) - 1);
    for (int t = 0; t < kT; ++t) {
        if (!last) {
            for (int g = 0; g < 8; ++g) _mm512_storeu_ps(state + (8 * t + g) * 16, acc[t][g]);
            continue;
        }
        const __m512 v =
            _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][4]), _mm512_add_ps(acc[t][2], acc[t][6])),
                          _mm512_add_ps(_mm512_add_ps(acc[t][1], acc[t][5]), _mm512_add_ps(acc[t][3], acc[t][7])));
        _mm512_mask_storeu_ps(y + static_cast<size_t>(t) * y_stride, mask, v);
    }
}

// Tokens per micro_lanes8 call: 8 accumulators each.
constexpr int kMaxTokLanes8 = 3;

template <typename K, bool kVnni>
void micro_lanes8_n(int nt, const Tile& tile, int kb, const TokBlock* prep, const uint8_t* act, size_t act_stride,
                    float* y, size_t y_stride, int nr, float* state, bool first, bool last) {
    switch (nt) {
        case 1:
            return micro_lanes8<K, kVnni, 1>(tile, kb, prep, act, act_stride, y, y_stride, nr, state, first, last);
        case 2:
            return micro_lanes8<K, kVnni, 2>(tile, kb, prep, act, act_stride, y, y_stride, nr, state, first, last);
        default:
            return micro_lanes8<K, kVnni, kMaxTokLanes8>(tile, kb, prep, act, act_stride, y, y_stride, nr, state, first,
                                                         last);
    }
}

template <typename K, bool kVnni>
void micro_n(int nt, const Tile& tile, int kb, const TokBlock* prep, const uint8_t* act, size_t act_stride, float* y,
             size_t y_stride, int nr, bool add) {
    switch (nt) {
        case 1:
            return micro<K, kVnni, 1>(tile, kb, prep, act, act_stride, y, y_stride, nr, add);
        case 2:
            return micro<K, kVnni, 2>(tile, kb, prep, act, act_stride, y, y_stride, nr, add);
        case 3:
            return micro<K, kVnni, 3>(tile, kb, prep, act, act_stride, y, y_stride, nr, add);
        case 4:
            return micro<K, kVnni, 4>(tile, kb, prep, act, act_stride, y, y_stride, nr, add);
        case 5:
            return micro<K, kVnni, 5>(tile, kb, prep, act, act_stride, y, y_stride, nr, add);
        default:
            return micro<K, kVnni, kMaxTok>(tile, kb, prep, act, act_stride, y, y_stride, nr, add);
    }
}

template <GgmlType kType, bool kVnni>
void gemm(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride, float* y,
          size_t y_stride) {
    using K = Kind<kType>;
    const auto* w_bytes = static_cast<const uint8_t*>(w);
    const auto* a_bytes = static_cast<const uint8_t*>(act);
    const int nb = n / 32;
    Tile tile;
    TokBlock prep[kTokChunk * kChunk];
    // The lanes8 accumulators of rows wider than a chunk, between chunks: 8 x 16 floats per row
    // tile and token of a token chunk. Grows to the largest call this thread has seen (sized by the
    // call's tokens: the model's FFN slices keep it at 128 tokens' worth, not kTokChunk's).
    const int tok_chunk = n_tok < kTokChunk ? n_tok : kTokChunk;
    float* state = nullptr;
    if constexpr (K::kLanes8) {
        static thread_local std::vector<float> buffer;
        const size_t size =
            nb > kChunk ? static_cast<size_t>((n_rows + kLanes - 1) / kLanes) * tok_chunk * 8 * kLanes : 0;
        if (buffer.size() < size) buffer.resize(size);
        state = buffer.data();
    }
    for (int t0 = 0; t0 < n_tok; t0 += kTokChunk) {
        const int tc = n_tok - t0 < kTokChunk ? n_tok - t0 : kTokChunk;
        const uint8_t* a0 = a_bytes + static_cast<size_t>(t0) * act_stride;
        for (int b0 = 0; b0 < nb; b0 += kChunk) {
            const int kb = nb - b0 < kChunk ? nb - b0 : kChunk;
            prepare<K>(prep, a0, act_stride, tc, b0, kb);
            for (int r0 = 0; r0 < n_rows; r0 += kLanes) {
                const int nr = n_rows - r0 < kLanes ? n_rows - r0 : kLanes;
                repack<K, kVnni ? 1 : K::kPlanesWithoutVnni>(tile, w_bytes + static_cast<size_t>(r0) * w_stride,
                                                             w_stride, nr, b0, kb);
                if constexpr (K::kLanes8) {
                    float* tile_state = state + static_cast<size_t>(r0 / kLanes) * tok_chunk * 8 * kLanes;
                    for (int t = 0; t < tc; t += kMaxTokLanes8) {
                        const int nt = tc - t < kMaxTokLanes8 ? tc - t : kMaxTokLanes8;
                        micro_lanes8_n<K, kVnni>(nt, tile, kb, prep + t * kChunk,
                                                 a0 + static_cast<size_t>(t) * act_stride + b0 * sizeof(typename K::A),
                                                 act_stride, y + static_cast<size_t>(t0 + t) * y_stride + r0, y_stride,
                                                 nr, tile_state + static_cast<size_t>(t) * 8 * kLanes, b0 == 0,
                                                 b0 + kb == nb);
                    }
                } else {
                    for (int t = 0; t < tc; t += kMaxTok) {
                        const int nt = tc - t < kMaxTok ? tc - t : kMaxTok;
                        micro_n<K, kVnni>(nt, tile, kb, prep + t * kChunk,
                                          a0 + static_cast<size_t>(t) * act_stride + b0 * sizeof(typename K::A),
                                          act_stride, y + static_cast<size_t>(t0 + t) * y_stride + r0, y_stride, nr,
                                          b0 > 0);
                    }
                }
            }
        }
    }
}

// ---- IQ4_XS with Q8_K ----
// A tile of kIq4Rows rows has each super-block unpacked once (its 256 table values' absolute
// values and sign masks, its scales as 32-bit lanes, two sub-blocks a register) for a chunk of
// kIq4Toks tokens; per token the sums are dot_iq4_xs's (|v| times y with v's sign, each half
// scaled by its sub-block's ls - 32, the halves folded into eight lanes) with one FMA per lane and
// super-block, reduced at the end: the dot kernel's float, bit for bit.
constexpr int kIq4Rows = 4;
constexpr int kIq4Toks = 32;

struct alignas(64) Iq4Tile {
    uint8_t abs[kIq4Rows][kQK];  // |v|
    __mmask64 neg[kIq4Rows][4];  // v < 0, per 64 values
    int32_t scale[kIq4Rows][4][16];
    float d[kIq4Rows];
    __m256 lanes[kIq4Toks][kIq4Rows];
};

template <bool kVnni>
__m512i dot_u8s8_iq4(__m512i u, __m512i s) {
    if constexpr (kVnni)
        return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
    else
        return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
}

template <bool kVnni>
void gemm_iq4_xs(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride,
                 float* y, size_t y_stride) {
    const __m512i values = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kValuesIQ4NL)));
    const __m512i spread = _mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0);
    const __m512i shifts = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    Iq4Tile tile;
    const int nb = n / kQK;
    for (int r0 = 0; r0 < n_rows; r0 += kIq4Rows) {
        const int nr = n_rows - r0 < kIq4Rows ? n_rows - r0 : kIq4Rows;
        for (int t0 = 0; t0 < n_tok; t0 += kIq4Toks) {
            const int nt = n_tok - t0 < kIq4Toks ? n_tok - t0 : kIq4Toks;
            for (int t = 0; t < nt; ++t) {
                for (int r = 0; r < nr; ++r) tile.lanes[t][r] = _mm256_setzero_ps();
            }
            for (int i = 0; i < nb; ++i) {
                for (int r = 0; r < nr; ++r) {
                    const auto* b = reinterpret_cast<const BlockIQ4_XS*>(static_cast<const uint8_t*>(w) +
                                                                         static_cast<size_t>(r0 + r) * w_stride) +
                                    i;
                    tile.d[r] = f16(b->d);
                    for (int k = 0; k < 4; ++k) {
                        const __m512i wide = _mm512_permutexvar_epi64(
                            spread, _mm512_castsi256_si512(
                                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs + 32 * k))));
                        const __m512i q = _mm512_and_si512(_mm512_srlv_epi64(wide, shifts), _mm512_set1_epi8(0x0F));
                        const __m512i v = _mm512_shuffle_epi8(values, q);
                        _mm512_store_si512(tile.abs[r] + 64 * k, _mm512_abs_epi8(v));
                        tile.neg[r][k] = _mm512_movepi8_mask(v);
                        const int ls = b->scales_l[k];
                        const int s0 = ((ls & 0xF) | (((b->scales_h >> (4 * k)) & 3) << 4)) - 32;
                        const int s1 = ((ls >> 4) | (((b->scales_h >> (4 * k + 2)) & 3) << 4)) - 32;
                        _mm512_store_si512(tile.scale[r][k], _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(s0),
                                                                                     _mm512_set1_epi32(s1)));
                    }
                }
                for (int t = 0; t < nt; ++t) {
                    const auto* a = reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(act) +
                                                                       static_cast<size_t>(t0 + t) * act_stride) +
                                    i;
                    __m512i q8[4];
                    for (int k = 0; k < 4; ++k) q8[k] = _mm512_loadu_si512(a->qs + 64 * k);
                    for (int r = 0; r < nr; ++r) {
                        __m512i sums = _mm512_setzero_si512();
                        for (int k = 0; k < 4; ++k) {
                            const __m512i s =
                                _mm512_mask_sub_epi8(q8[k], tile.neg[r][k], _mm512_setzero_si512(), q8[k]);
                            const __m512i dots = dot_u8s8_iq4<kVnni>(_mm512_load_si512(tile.abs[r] + 64 * k), s);
                            sums =
                                _mm512_add_epi32(sums, _mm512_mullo_epi32(dots, _mm512_load_si512(tile.scale[r][k])));
                        }
                        const __m256i folded =
                            _mm256_add_epi32(_mm512_castsi512_si256(sums), _mm512_extracti64x4_epi64(sums, 1));
                        tile.lanes[t][r] = _mm256_fmadd_ps(_mm256_set1_ps(tile.d[r] * a->d), _mm256_cvtepi32_ps(folded),
                                                           tile.lanes[t][r]);
                    }
                }
            }
            for (int t = 0; t < nt; ++t) {
                float* out = y + static_cast<size_t>(t0 + t) * y_stride + r0;
                for (int r = 0; r < nr; ++r) {
                    const __m256 l = tile.lanes[t][r];
                    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(l), _mm256_extractf128_ps(l, 1));
                    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
                    out[r] = _mm_cvtss_f32(_mm_add_ss(s4, _mm_movehdup_ps(s4)));
                }
            }
        }
    }
}

template <GgmlType kType, bool kVnni>
GemmKernel kernel() {
    GemmKernel k;
    k.fn = gemm<kType, kVnni>;
    k.dot_order = !Kind<kType>::kAffine;  // Q4_1, Q5_1: the serial order; their dots sum in another
    k.row_tile = kLanes;
    k.tok_tile = kMaxTok;
    return k;
}

template <bool kVnni>
GemmKernel table(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::Q4_0:
            return kernel<GgmlType::Q4_0, kVnni>();
        case GgmlType::Q5_0:
            return kernel<GgmlType::Q5_0, kVnni>();
        case GgmlType::Q4_1:
            return kernel<GgmlType::Q4_1, kVnni>();
        case GgmlType::Q5_1:
            return kernel<GgmlType::Q5_1, kVnni>();
        case GgmlType::Q8_0:
            return kernel<GgmlType::Q8_0, kVnni>();
        case GgmlType::IQ4_XS: {
            // With VNNI gemm_iq4_avx512.cpp's kernel (16 rows a tile, vpdpbusd) is faster.
            if constexpr (kVnni) return {};
            GemmKernel k;
            k.fn = gemm_iq4_xs<kVnni>;
            k.dot_order = true;
            k.row_tile = kIq4Rows;
            k.tok_tile = 1;
            return k;
        }
        default:
            return {};
    }
}

}  // namespace

GemmKernel gemm_avx512(GgmlType weight_type, bool vnni) {
    return vnni ? table<true>(weight_type) : table<false>(weight_type);
}

}  // namespace fitllm::quant::detail
