// AVX2 tiled kernels for the blocks of 32 (Q4_0, Q5_0, Q8_0 with Q8_0; Q4_1, Q5_1 with Q8_1).
// Compiled with -mavx2 -mfma -mf16c; see dot_kernels.h for the rules this file follows.
//
// The layout of gemm_avx512.cpp at half the width: one 32-bit lane per weight row, a tile of 8
// rows repacked (a chunk of kChunk blocks at a time) so that register g of block b holds elements
// 4g..4g+3 of each of the 8 rows as unsigned bytes. A token then costs, per block and 8 rows, 8
// maddubs with its own 4 bytes broadcast, a few 16-bit adds and one or two madd, and one
// conversion and two float operations.
//
// maddubs sums two u8 x s8 products into 16 bits; the weights stay small enough that the products
// of several groups add up in 16 bits without saturating: 8 groups of 4-bit quants
// (8 * 2 * 15 * 128 < 2^15), 4 groups of 5-bit ones. The offset (8, 16) comes back as
// -offset * sum(y), the int accumulator's start, computed once per token and block.
//
// Q4_0 and Q8_0 give the dot kernel's (dot_avx2.cpp) float bit for bit, in dot_ref.cpp's order
// (GemmKernel::dot_order), so a token gets the same floats in a batch as alone: Q4_0 (serial) in
// one fma a block per row, carried over from chunk to chunk in y; Q8_0 (lanes8) in eight
// accumulators per row, accumulator g taking group g's integer sum (register g of the tile) a
// block, carried between chunks in a state buffer, summed in hsum's tree at the end. Q8_0's tile
// holds the signed quants (plane 0) and their absolute values (plane 1): a group's sum is
// maddubs(|x|, sign(y, x)), the dot's; that measured faster than the serial sum of two 4-bit
// planes it replaced. Q5_0 (its dot is lanes8), Q4_1 and Q5_1 sum in the serial order, which
// agrees with their dots to float rounding: lanes8 measured twice the time for Q5_0's prompts.
// Q5_0's lanes8 tile (q - 16 and |q - 16|, summed as Q8_0's) is its small-batch kernel
// (quant::select_small_batch): a few tokens that need their one-token floats.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "quant/blocks.h"
#include "quant/gemm_kernels.h"
#include "quant/transpose_avx2.h"

namespace fitllm::quant::detail {
namespace {

constexpr int kLanes = 8;       // weight rows per tile: one 32-bit lane each
constexpr int kChunk = 32;      // blocks per chunk of the row: the repacked tile is <= 18 KiB (L1)
constexpr int kTokChunk = 256;  // tokens whose per-block sums are prepared at once (stack)
constexpr int kMaxTok = 4;      // tokens per micro-kernel: 2 * kMaxTok accumulators of 16 registers

struct alignas(32) Tile {
    uint8_t q[kChunk][16][32];  // block, group g (+ 8: Q8_0's |q|): bytes 4g..4g+3 of rows 0..7
    float d[kChunk][kLanes];
    float m[kChunk][kLanes];  // Q4_1 / Q5_1
};

// Per token and block of the chunk: the activation scale, and -offset * sum(q) (symmetric types)
// or the activation's s = d * sum(q) (affine types).
struct TokBlock {
    float d;
    int32_t off;
    float s;
};

template <GgmlType kType>
struct Kind;
template <>
struct Kind<GgmlType::Q4_0> {
    static constexpr bool kLanes8 = false;   // lanes8 (Q8_0 only) or serial
    static constexpr bool kDotOrder = true;  // the dot's order (GemmKernel::dot_order)
    using W = BlockQ4_0;
    using A = BlockQ8_0;
    static constexpr int kOffset = 8;
    static constexpr bool kAffine = false;
    static constexpr int kPlanes = 1;
    static constexpr int kGroupsIn16 = 8;  // groups whose maddubs sums add in 16 bits
};
template <>
struct Kind<GgmlType::Q5_0> {
    static constexpr bool kLanes8 = false;
    static constexpr bool kDotOrder = false;
    using W = BlockQ5_0;
    using A = BlockQ8_0;
    static constexpr int kOffset = 16;
    static constexpr bool kAffine = false;
    static constexpr int kPlanes = 1;
    static constexpr int kGroupsIn16 = 4;
};
// Q5_0 in the lanes8 order: its tile holds q - 16 and |q - 16|.
struct Q5_0Lanes8 : Kind<GgmlType::Q5_0> {
    static constexpr bool kLanes8 = true;
    static constexpr bool kDotOrder = true;
    static constexpr int kPlanes = 2;
};
template <>
struct Kind<GgmlType::Q8_0> {
    static constexpr bool kLanes8 = true;
    static constexpr bool kDotOrder = true;
    using W = BlockQ8_0;
    using A = BlockQ8_0;
    static constexpr int kOffset = 0;  // signed x signed: maddubs(|x|, sign(y, x))
    static constexpr bool kAffine = false;
    static constexpr int kPlanes = 2;  // q, |q|
    static constexpr int kGroupsIn16 = 8;
};
template <>
struct Kind<GgmlType::Q4_1> {
    static constexpr bool kLanes8 = false;
    static constexpr bool kDotOrder = false;
    using W = BlockQ4_1;
    using A = BlockQ8_1;
    static constexpr int kOffset = 0;
    static constexpr bool kAffine = true;
    static constexpr int kPlanes = 1;
    static constexpr int kGroupsIn16 = 8;
};
template <>
struct Kind<GgmlType::Q5_1> {
    static constexpr bool kLanes8 = false;
    static constexpr bool kDotOrder = false;
    using W = BlockQ5_1;
    using A = BlockQ8_1;
    static constexpr int kOffset = 0;
    static constexpr bool kAffine = true;
    static constexpr int kPlanes = 1;
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

// Byte l is 0x10 where bit l of the 32 bits at qh is set (the 5th bit of Q5_0 / Q5_1).
__m256i fifth_bits(const uint8_t* qh) {
    const __m256i spread = _mm256_shuffle_epi8(  // byte l gets byte l / 8 of the bits
        _mm256_set1_epi32(load_i32(qh)),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    const __m256i select = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select), _mm256_set1_epi8(0x10));
}

// The 32 quants of a weight block as unsigned bytes in element order; for the lanes8 kinds, plane
// 0 is the signed values (Q8_0's q, Q5_0's q - 16) and plane 1 their absolute values (-128 as 128).
template <typename K>
__m256i unpack(const typename K::W& b, int plane) {
    using Block = typename K::W;
    if constexpr (K::kLanes8) {
        __m256i q;
        if constexpr (std::is_same_v<Block, BlockQ8_0>) {
            q = load256(b.qs);
        } else {
            const __m128i p = load128(b.qs);
            q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), _mm256_set1_epi8(0x0F));
            q = _mm256_sub_epi8(_mm256_or_si256(q, fifth_bits(b.qh)), _mm256_set1_epi8(K::kOffset));
        }
        return plane == 0 ? q : _mm256_sign_epi8(q, q);
    } else {
        const __m128i p = load128(b.qs);
        const __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), _mm256_set1_epi8(0x0F));
        if constexpr (std::is_same_v<Block, BlockQ5_0> || std::is_same_v<Block, BlockQ5_1>)
            return _mm256_or_si256(q, fifth_bits(b.qh));
        else
            return q;
    }
}

// Blocks b0 .. b0 + kb - 1 of rows 0 .. nr - 1 (nr <= 8) into the tile; missing rows are zero.
template <typename K>
void repack(Tile& tile, const uint8_t* w, size_t w_stride, int nr, int b0, int kb) {
    using W = typename K::W;
    const W* rows[kLanes];
    for (int j = 0; j < kLanes; ++j) {
        rows[j] = j < nr ? reinterpret_cast<const W*>(w + static_cast<size_t>(j) * w_stride) + b0 : nullptr;
    }
    for (int b = 0; b < kb; ++b) {
        for (int plane = 0; plane < K::kPlanes; ++plane) {
            __m256i r[8];
            for (int j = 0; j < 8; ++j) r[j] = j < nr ? unpack<K>(rows[j][b], plane) : _mm256_setzero_si256();
            transpose8(r);
            for (int g = 0; g < 8; ++g) _mm256_store_si256(reinterpret_cast<__m256i*>(tile.q[b][8 * plane + g]), r[g]);
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
            if constexpr (K::kAffine) {
                out[b].s = f16(y[b].s);
            } else if constexpr (!K::kLanes8) {
                out[b].off = -K::kOffset * sum_i8(y[b].qs);
            }
        }
    }
}

// Lanes 0 .. nr - 1 of v to out.
void store_rows(float* out, __m256 v, int nr) {
    if (nr >= kLanes) {
        _mm256_storeu_ps(out, v);
        return;
    }
    alignas(32) float lanes[kLanes];
    _mm256_store_ps(lanes, v);
    for (int j = 0; j < nr; ++j) out[j] = lanes[j];
}

// kT tokens times the tile's 8 rows over kb blocks; y (token 0, row 0) gets or adds the sums of
// rows < nr.
template <typename K, int kT>
void micro(const Tile& tile, int kb, const TokBlock* prep, const uint8_t* act, size_t act_stride, float* y,
           size_t y_stride, int nr, bool add) {
    using A = typename K::A;
    const A* a[kT];
    for (int t = 0; t < kT; ++t) a[t] = reinterpret_cast<const A*>(act + static_cast<size_t>(t) * act_stride);
    const __m256i ones = _mm256_set1_epi16(1), sixteens = _mm256_set1_epi16(16);
    // Rows wider than a chunk go on from the sums of the chunks before (in y): one fma a block
    // after another, the serial order of dot_ref.cpp.
    __m256 acc[kT];
    for (int t = 0; t < kT; ++t) {
        const float* out = y + static_cast<size_t>(t) * y_stride;
        if (!add) {
            acc[t] = _mm256_setzero_ps();
        } else if (nr >= kLanes) {
            acc[t] = _mm256_loadu_ps(out);
        } else {
            alignas(32) float lanes[kLanes] = {};
            for (int j = 0; j < nr; ++j) lanes[j] = out[j];
            acc[t] = _mm256_load_ps(lanes);
        }
    }
    for (int b = 0; b < kb; ++b) {
        __m256i sum[kT];
#pragma GCC unroll 8
        for (int t = 0; t < kT; ++t) {
            sum[t] = K::kAffine ? _mm256_setzero_si256() : _mm256_set1_epi32(prep[t * kChunk + b].off);
        }
#pragma GCC unroll 2
        for (int plane = 0; plane < K::kPlanes; ++plane) {
#pragma GCC unroll 2
            for (int g0 = 0; g0 < 8; g0 += K::kGroupsIn16) {
                __m256i pairs[kT];
#pragma GCC unroll 8
                for (int g = g0; g < g0 + K::kGroupsIn16; ++g) {
                    const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(tile.q[b][8 * plane + g]));
#pragma GCC unroll 8
                    for (int t = 0; t < kT; ++t) {
                        const __m256i p = _mm256_maddubs_epi16(w, _mm256_set1_epi32(load_i32(a[t][b].qs + 4 * g)));
                        pairs[t] = g == g0 ? p : _mm256_add_epi16(pairs[t], p);
                    }
                }
#pragma GCC unroll 8
                for (int t = 0; t < kT; ++t) {
                    sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(pairs[t], plane == 0 ? ones : sixteens));
                }
            }
        }
        const __m256 dw = _mm256_load_ps(tile.d[b]);
#pragma GCC unroll 8
        for (int t = 0; t < kT; ++t) {
            const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(prep[t * kChunk + b].d));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[t]), scale, acc[t]);
        }
        if constexpr (K::kAffine) {
            const __m256 mw = _mm256_load_ps(tile.m[b]);
#pragma GCC unroll 8
            for (int t = 0; t < kT; ++t) acc[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(prep[t * kChunk + b].s), acc[t]);
        }
    }
    for (int t = 0; t < kT; ++t) store_rows(y + static_cast<size_t>(t) * y_stride, acc[t], nr);
}

// The lanes8 order (Q8_0, Q5_0, as dot_avx2.cpp's sum_blocks<true>): for one token and each of the
// tile's rows, 8 float accumulators, accumulator g taking the exact integer sum of elements
// 4g .. 4g + 3 of each block (register g of the tile) times d_w d_a in one fma a block; at the end
// hsum's tree over g. Rows wider than a chunk carry the accumulators over in `state` ([g][row]
// floats): first / last say whether this call starts or ends the row. One token a call: its 8
// accumulators and the operands take the 16 registers.
template <typename K>
void micro_lanes8(const Tile& tile, int kb, const TokBlock* prep, const uint8_t* act, float* y, int nr, float* state,
                  bool first, bool last) {
    using A = typename K::A;
    const A* a = reinterpret_cast<const A*>(act);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[8];
    for (int g = 0; g < 8; ++g) acc[g] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(state + g * kLanes);
    for (int b = 0; b < kb; ++b) {
        const __m256 scale = _mm256_mul_ps(_mm256_load_ps(tile.d[b]), _mm256_set1_ps(prep[b].d));
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) {
            const __m256i yg = _mm256_set1_epi32(load_i32(a[b].qs + 4 * g));
            const __m256i q = _mm256_load_si256(reinterpret_cast<const __m256i*>(tile.q[b][g]));
            const __m256i abs = _mm256_load_si256(reinterpret_cast<const __m256i*>(tile.q[b][8 + g]));
            const __m256i sum = _mm256_madd_epi16(_mm256_maddubs_epi16(abs, _mm256_sign_epi8(yg, q)), ones);
            acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, acc[g]);
        }
    }
    if (!last) {
        for (int g = 0; g < 8; ++g) _mm256_storeu_ps(state + g * kLanes, acc[g]);
        return;
    }
    const __m256 v = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6])),
                                   _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7])));
    store_rows(y, v, nr);
}

template <typename K>
void micro_n(int nt, const Tile& tile, int kb, const TokBlock* prep, const uint8_t* act, size_t act_stride, float* y,
             size_t y_stride, int nr, bool add) {
    switch (nt) {
        case 1:
            return micro<K, 1>(tile, kb, prep, act, act_stride, y, y_stride, nr, add);
        case 2:
            return micro<K, 2>(tile, kb, prep, act, act_stride, y, y_stride, nr, add);
        case 3:
            return micro<K, 3>(tile, kb, prep, act, act_stride, y, y_stride, nr, add);
        default:
            return micro<K, 4>(tile, kb, prep, act, act_stride, y, y_stride, nr, add);
    }
}

template <typename K>
void gemm(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride, float* y,
          size_t y_stride) {
    const auto* w_bytes = static_cast<const uint8_t*>(w);
    const auto* a_bytes = static_cast<const uint8_t*>(act);
    const int nb = n / 32;
    Tile tile;
    TokBlock prep[kTokChunk * kChunk];
    // The lanes8 accumulators of rows wider than a chunk, between chunks: 8 x 8 floats per row
    // tile and token of a token chunk, grown to the largest call this thread has seen.
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
                repack<K>(tile, w_bytes + static_cast<size_t>(r0) * w_stride, w_stride, nr, b0, kb);
                if constexpr (K::kLanes8) {
                    float* tile_state = state + static_cast<size_t>(r0 / kLanes) * tok_chunk * 8 * kLanes;
                    for (int t = 0; t < tc; ++t) {
                        micro_lanes8<K>(tile, kb, prep + t * kChunk,
                                        a0 + static_cast<size_t>(t) * act_stride + b0 * sizeof(typename K::A),
                                        y + static_cast<size_t>(t0 + t) * y_stride + r0, nr,
                                        tile_state + static_cast<size_t>(t) * 8 * kLanes, b0 == 0, b0 + kb == nb);
                    }
                } else {
                    for (int t = 0; t < tc; t += kMaxTok) {
                        const int nt = tc - t < kMaxTok ? tc - t : kMaxTok;
                        micro_n<K>(nt, tile, kb, prep + t * kChunk,
                                   a0 + static_cast<size_t>(t) * act_stride + b0 * sizeof(typename K::A), act_stride,
                                   y + static_cast<size_t>(t0 + t) * y_stride + r0, y_stride, nr, b0 > 0);
                    }
                }
            }
        }
    }
}

template <GgmlType kType>
GemmKernel kernel() {
    GemmKernel k;
    k.fn = gemm<Kind<kType>>;
    k.dot_order = Kind<kType>::kDotOrder;
    k.row_tile = kLanes;
    k.tok_tile = kMaxTok;
    return k;
}

}  // namespace

GemmFn lanes8_small_batch_avx2(GgmlType weight_type) {
    return weight_type == GgmlType::Q5_0 ? gemm<Q5_0Lanes8> : nullptr;
}

GemmKernel gemm_avx2(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::Q4_0:
            return kernel<GgmlType::Q4_0>();
        case GgmlType::Q5_0:
            return kernel<GgmlType::Q5_0>();
        case GgmlType::Q8_0:
            return kernel<GgmlType::Q8_0>();
        case GgmlType::Q4_1:
            return kernel<GgmlType::Q4_1>();
        case GgmlType::Q5_1:
            return kernel<GgmlType::Q5_1>();
        default:
            return {};
    }
}

}  // namespace fitllm::quant::detail
