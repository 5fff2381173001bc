// AVX2 tiled kernels for IQ4_NL (with Q8_0) and IQ4_XS (with Q8_K), for prompts. Compiled with
// -mavx2 -mfma -mf16c; see dot_kernels.h for the rules this file follows.
//
// The layout of gemm_iq4_avx512.cpp at half the width: one 32-bit lane per weight row, a tile of 8
// rows repacked (a chunk of kChunk sub-blocks of 32 at a time: an IQ4_NL block, an eighth of an
// IQ4_XS super-block) into the codebook's values + 128 (one byte shuffle for 32 indices), split
// into two 4-bit planes lo + 16 hi; register g of a sub-block and plane holds elements 4g..4g+3 of
// each of the 8 rows. A token then costs, per sub-block and 8 rows, 16 maddubs with its own 4
// bytes broadcast (shared by both planes), 16 16-bit adds and two madd.
//
// The 16-bit sums are exact: maddubs never saturates (2 * 15 * 127 < 2^15) and vpaddw wraps, so
// only the final word must fit. The lo word of a 32-bit lane sums at most 16 products 15 * 127.
// The + 128 is taken off in the hi plane: its sums start at -8 times the token's sum over the
// word's 16 elements (prepared once per token), which leaves sum (hi - 8) y, within 16 * 8 * 127.
// The two words are then summed by one madd each, with 1 and 16 (IQ4_NL) or with the sub-block's
// scale ls and 16 ls (IQ4_XS; |16 ls| <= 512): the sub-block scales cost nothing extra. Then one
// conversion and fma (d_w d_y) per block (IQ4_NL: the serial order of the dot kernels) or
// super-block (IQ4_XS). The integer parts are exact.
//
// GCC reassociates the 16-bit adds of a sub-block into one tree over all its products, which
// spills them to the stack; an empty asm after each group keeps the running sums in registers.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant/blocks.h"
#include "quant/gemm_kernels.h"
#include "quant/iq4_tile_avx2.h"
#include "quant/transpose_avx2.h"

namespace fitllm::quant::detail {
namespace {

constexpr int kLanes = 8;       // weight rows per tile: one 32-bit lane each
constexpr int kChunk = 32;      // sub-blocks per chunk of the row: the repacked tile is 17 KiB (L1)
constexpr int kTokChunk = 256;  // tokens whose per-sub-block sums are prepared at once (stack)

template <GgmlType kType>
struct Kind;
template <>
struct Kind<GgmlType::IQ4_NL> {
    using W = BlockIQ4_NL;
    using A = BlockQ8_0;
    static constexpr int kSubs = 1;    // sub-blocks of 32 per block
    static constexpr int kMaxTok = 4;  // tokens per micro-kernel
};
template <>
struct Kind<GgmlType::IQ4_XS> {
    using W = BlockIQ4_XS;
    using A = BlockQ8_K;
    static constexpr int kSubs = 8;
    static constexpr int kMaxTok = 3;  // one more 32-bit sum per token than IQ4_NL: 16 registers
};

struct alignas(32) Tile {
    uint8_t q[kChunk][16][32];     // sub-block, group g (+ 8: high plane): bytes 4g..4g+3 of rows 0..7
    float d[kChunk][kLanes];       // the block's (IQ4_NL) or super-block's (IQ4_XS) d
    int32_t ls[kChunk][kLanes];    // IQ4_XS: ls - 32 in both 16-bit words
    int32_t ls16[kChunk][kLanes];  // IQ4_XS: 16 (ls - 32) in both 16-bit words
};

// Per token and sub-block of the chunk: the activation scale (per block or super-block) and the hi
// plane's start, -8 times the sums of elements 4g, 4g + 1 (low word) and 4g + 2, 4g + 3 (high word).
struct TokSub {
    float d;
    int32_t start;
};

int32_t both_words(int v) {
    const auto w = static_cast<uint32_t>(static_cast<uint16_t>(v));
    return static_cast<int32_t>(w | (w << 16));
}

float sub_d(const BlockQ8_0* a, int s) {
    return f16(a[s].d);
}
float sub_d(const BlockQ8_K* a, int s) {
    return a[s / 8].d;
}

// Sub-blocks s0 .. s0 + ks - 1 of rows 0 .. nr - 1 (nr <= 8) into the tile; missing rows are zero.
template <typename K>
void repack(Tile& tile, const uint8_t* w, size_t w_stride, int nr, int s0, int ks) {
    using W = typename K::W;
    const __m256i table = codebook();
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const W* rows[kLanes];
    for (int j = 0; j < kLanes; ++j) rows[j] = j < nr ? reinterpret_cast<const W*>(w + j * w_stride) : nullptr;
    for (int s = 0; s < ks; ++s) {
        __m256i lo[8], hi[8];
        for (int j = 0; j < kLanes; ++j) {
            const __m256i u = j < nr ? unpack(sub_qs<K>(rows[j], s0 + s), table) : _mm256_setzero_si256();
            lo[j] = _mm256_and_si256(u, low4);
            hi[j] = _mm256_and_si256(_mm256_srli_epi16(u, 4), low4);
        }
        transpose8(lo);
        transpose8(hi);
        for (int g = 0; g < 8; ++g) {
            _mm256_store_si256(reinterpret_cast<__m256i*>(tile.q[s][g]), lo[g]);
            _mm256_store_si256(reinterpret_cast<__m256i*>(tile.q[s][8 + g]), hi[g]);
        }
        for (int j = 0; j < kLanes; ++j) {
            if (j >= nr) {
                tile.d[s][j] = 0.0f;
                tile.ls[s][j] = tile.ls16[s][j] = 0;
                continue;
            }
            const W& b = rows[j][(s0 + s) / K::kSubs];
            tile.d[s][j] = f16(b.d);
            if constexpr (K::kSubs == 8) {
                const int ls = iq4_xs_ls(b, (s0 + s) % 8);
                tile.ls[s][j] = both_words(ls);
                tile.ls16[s][j] = both_words(16 * ls);
            }
        }
    }
}

int32_t hsum_i32(__m256i v) {
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_unpackhi_epi64(x, x));
    return _mm_cvtsi128_si32(_mm_add_epi32(x, _mm_shuffle_epi32(x, 1)));
}

// The hi plane's start for the 32 activation bytes at p (see TokSub).
int32_t hi_start(const int8_t* p) {
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), y);  // y[2i] + y[2i + 1]
    const int low = hsum_i32(_mm256_madd_epi16(pairs, _mm256_set1_epi32(1)));
    const int high = hsum_i32(_mm256_madd_epi16(pairs, _mm256_set1_epi32(0x10000)));
    const auto w0 = static_cast<uint32_t>(static_cast<uint16_t>(-8 * low));
    const auto w1 = static_cast<uint32_t>(static_cast<uint16_t>(-8 * high));
    return static_cast<int32_t>(w0 | (w1 << 16));
}

template <typename A>
void prepare_tok(TokSub* out, const A* y, int s0, int ks) {
    for (int s = 0; s < ks; ++s) {
        out[s].d = sub_d(y, s0 + s);
        out[s].start = hi_start(sub_y(y, s0 + s));
    }
}

// The 16-bit plane sums of sub-block s for kT tokens: lo, and hi from its start.
template <int kT, typename A>
void plane_sums(__m256i lo[kT], __m256i hi[kT], const Tile& tile, int s, const TokSub* prep, const A* const a[kT],
                int sa) {
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
        const __m256i wl = _mm256_load_si256(reinterpret_cast<const __m256i*>(tile.q[s][g]));
        const __m256i wh = _mm256_load_si256(reinterpret_cast<const __m256i*>(tile.q[s][8 + g]));
#pragma GCC unroll 8
        for (int t = 0; t < kT; ++t) {
            const __m256i yb = _mm256_set1_epi32(load_i32(sub_y(a[t], sa) + 4 * g));
            const __m256i pl = _mm256_maddubs_epi16(wl, yb);
            const __m256i ph = _mm256_maddubs_epi16(wh, yb);
            lo[t] = g == 0 ? pl : _mm256_add_epi16(lo[t], pl);
            hi[t] = _mm256_add_epi16(g == 0 ? _mm256_set1_epi32(prep[t * kChunk + s].start) : hi[t], ph);
            asm("" : "+x"(lo[t]), "+x"(hi[t]));  // no add tree over the groups (see the top)
        }
    }
}

// kT tokens times the tile's 8 rows over ks sub-blocks (from sub-block s0 of the rows); y (token 0,
// row 0) gets or adds the sums of rows < nr.
template <typename K, int kT>
void micro(const Tile& tile, int s0, int ks, const TokSub* prep, const uint8_t* act, size_t act_stride, float* y,
           size_t y_stride, int nr, bool add) {
    using A = typename K::A;
    const A* a[kT];
    for (int t = 0; t < kT; ++t) a[t] = reinterpret_cast<const A*>(act + static_cast<size_t>(t) * act_stride);
    __m256 acc[kT];
    for (int t = 0; t < kT; ++t) {
        if (!add) {
            acc[t] = _mm256_setzero_ps();
        } else if (nr == kLanes) {
            acc[t] = _mm256_loadu_ps(y + static_cast<size_t>(t) * y_stride);
        } else {
            alignas(32) float part[kLanes] = {};
            std::memcpy(part, y + static_cast<size_t>(t) * y_stride, sizeof(float) * nr);
            acc[t] = _mm256_load_ps(part);
        }
    }
    __m256i lo[kT], hi[kT];
    if constexpr (K::kSubs == 1) {
        const __m256i one = _mm256_set1_epi16(1), sixteen = _mm256_set1_epi16(16);
        for (int s = 0; s < ks; ++s) {
            plane_sums<kT>(lo, hi, tile, s, prep, a, s0 + s);
            const __m256 dw = _mm256_load_ps(tile.d[s]);
#pragma GCC unroll 8
            for (int t = 0; t < kT; ++t) {
                const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(lo[t], one), _mm256_madd_epi16(hi[t], sixteen));
                const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(prep[t * kChunk + s].d));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, acc[t]);
            }
        }
    } else {
        for (int sb = 0; sb < ks; sb += K::kSubs) {
            __m256i isum[kT];
            for (int sub = 0; sub < K::kSubs; ++sub) {
                const int s = sb + sub;
                plane_sums<kT>(lo, hi, tile, s, prep, a, s0 + s);
                const __m256i ls = _mm256_load_si256(reinterpret_cast<const __m256i*>(tile.ls[s]));
                const __m256i ls16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(tile.ls16[s]));
#pragma GCC unroll 8
                for (int t = 0; t < kT; ++t) {
                    const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(lo[t], ls), _mm256_madd_epi16(hi[t], ls16));
                    isum[t] = sub == 0 ? p : _mm256_add_epi32(isum[t], p);
                }
            }
            const __m256 dw = _mm256_load_ps(tile.d[sb]);
#pragma GCC unroll 8
            for (int t = 0; t < kT; ++t) {
                const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(prep[t * kChunk + sb].d));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), scale, acc[t]);
            }
        }
    }
    for (int t = 0; t < kT; ++t) {
        float* out = y + static_cast<size_t>(t) * y_stride;
        if (nr == kLanes) {
            _mm256_storeu_ps(out, acc[t]);
        } else {
            alignas(32) float part[kLanes];
            _mm256_store_ps(part, acc[t]);
            std::memcpy(out, part, sizeof(float) * nr);
        }
    }
}

template <typename K>
void micro_n(int nt, const Tile& tile, int s0, int ks, const TokSub* prep, const uint8_t* act, size_t act_stride,
             float* y, size_t y_stride, int nr, bool add) {
    switch (nt) {
        case 1:
            return micro<K, 1>(tile, s0, ks, prep, act, act_stride, y, y_stride, nr, add);
        case 2:
            return micro<K, 2>(tile, s0, ks, prep, act, act_stride, y, y_stride, nr, add);
        case 3:
            if constexpr (K::kMaxTok > 3) return micro<K, 3>(tile, s0, ks, prep, act, act_stride, y, y_stride, nr, add);
            [[fallthrough]];
        default:
            return micro<K, K::kMaxTok>(tile, s0, ks, prep, act, act_stride, y, y_stride, nr, add);
    }
}

template <GgmlType kType>
void gemm(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride, float* y,
          size_t y_stride) {
    using K = Kind<kType>;
    using A = typename K::A;
    const auto* w_bytes = static_cast<const uint8_t*>(w);
    const auto* a_bytes = static_cast<const uint8_t*>(act);
    const int n_sub = n / 32;
    Tile tile;
    TokSub prep[kTokChunk * kChunk];
    for (int t0 = 0; t0 < n_tok; t0 += kTokChunk) {
        const int tc = n_tok - t0 < kTokChunk ? n_tok - t0 : kTokChunk;
        const uint8_t* a0 = a_bytes + static_cast<size_t>(t0) * act_stride;
        for (int s0 = 0; s0 < n_sub; s0 += kChunk) {
            const int ks = n_sub - s0 < kChunk ? n_sub - s0 : kChunk;
            for (int t = 0; t < tc; ++t) {
                prepare_tok(prep + t * kChunk, reinterpret_cast<const A*>(a0 + static_cast<size_t>(t) * act_stride), s0,
                            ks);
            }
            for (int r0 = 0; r0 < n_rows; r0 += kLanes) {
                const int nr = n_rows - r0 < kLanes ? n_rows - r0 : kLanes;
                repack<K>(tile, w_bytes + static_cast<size_t>(r0) * w_stride, w_stride, nr, s0, ks);
                for (int t = 0; t < tc; t += K::kMaxTok) {
                    const int nt = tc - t < K::kMaxTok ? tc - t : K::kMaxTok;
                    micro_n<K>(nt, tile, s0, ks, prep + t * kChunk, a0 + static_cast<size_t>(t) * act_stride,
                               act_stride, y + static_cast<size_t>(t0 + t) * y_stride + r0, y_stride, nr, s0 > 0);
                }
            }
        }
    }
}

template <GgmlType kType>
GemmKernel kernel() {
    GemmKernel k;
    k.fn = gemm<kType>;
    k.dot_order = kType == GgmlType::IQ4_NL;  // IQ4_XS: one fma a super-block; its dot is lanes8
    k.row_tile = kLanes;
    k.tok_tile = Kind<kType>::kMaxTok;
    return k;
}

}  // namespace

GemmKernel gemm_iq4_avx2(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::IQ4_NL:
            return kernel<GgmlType::IQ4_NL>();
        case GgmlType::IQ4_XS:
            return kernel<GgmlType::IQ4_XS>();
        default:
            return {};
    }
}

}  // namespace fitllm::quant::detail
