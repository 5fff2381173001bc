// AVX-512 tiled kernels for IQ4_NL (with Q8_0) and IQ4_XS (with Q8_K), for prompts. Compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx2 -mfma -mf16c; the kVnni = false kernels use no
// VNNI instruction. See dot_kernels.h for the rules this file follows.
//
// The layout of gemm_avx512.cpp's Q8_0 kernel: one 32-bit lane per weight row. A tile of 16 rows
// is repacked, one chunk of kChunk sub-blocks of 32 at a time (an IQ4_NL block, an eighth of an
// IQ4_XS super-block), into unsigned bytes: each 4-bit index looked up in the 16-entry codebook
// (kValuesIQ4NL + 128) with one byte shuffle for 32 of them, and register g of a sub-block
// holding elements 4g..4g+3 of each of the 16 rows. A token then costs, per sub-block, 8 vpdpbusd
// of those registers with its own 4 bytes broadcast; the + 128 comes back as -128 * sum(y) (from
// the block or Q8_K's bsums), the int accumulator's start. IQ4_NL: one conversion and fma per block
// (d_w d_y); IQ4_XS: the eight sub-block sums times their scales ls - 32 in int32, then one
// conversion and fma per super-block (d_w d_y). The integer parts are exact; the float order differs
// from the dot kernels' (their results agree to float rounding).
//
// Without VNNI the codebook bytes (up to 241) are split into two 4-bit planes, lo + 16 hi, so that
// maddubs' pair sums of 8 groups add up in 16 bits (8 * 2 * 15 * 127 < 2^15). For IQ4_XS that
// measured slower than gemm_avx512.cpp's kernel (one row and token at a time, |v| and the sign
// moved to y), which it keeps without VNNI.

// GCC 12's AVX-512 headers trip its own uninitialized-variable warnings; see dot_avx512.cpp.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstring>

#include "quant/blocks.h"
#include "quant/gemm_kernels.h"
#include "quant/iq4_tile_avx2.h"
#include "quant/transpose_avx2.h"

namespace fitllm::quant::detail {
namespace {

constexpr int kLanes = 16;      // weight rows per tile: one 32-bit lane each
constexpr int kChunk = 32;      // sub-blocks of 32 per chunk of the row (4 IQ4_XS super-blocks)
constexpr int kTokChunk = 256;  // tokens whose per-sub-block sums are prepared at once (stack)
constexpr int kMaxTok = 6;      // tokens per micro-kernel

template <int kPlanes>
struct alignas(64) Tile {
    uint8_t q[kChunk][8 * kPlanes][64];  // sub-block, group g (+ 8: high plane): bytes 4g..4g+3 of rows 0..15
    float d[kChunk][kLanes];             // the block's (IQ4_NL) or super-block's (IQ4_XS) d
    int32_t ls[kChunk][kLanes];          // IQ4_XS: ls - 32
};

// Per token and sub-block of the chunk: the activation scale and -128 * sum(y).
struct TokSub {
    float d;
    int32_t off;
};

template <GgmlType kType>
struct Kind;
template <>
struct Kind<GgmlType::IQ4_NL> {
    using W = BlockIQ4_NL;
    using A = BlockQ8_0;
    static constexpr int kSubs = 1;  // sub-blocks of 32 per block
};
template <>
struct Kind<GgmlType::IQ4_XS> {
    using W = BlockIQ4_XS;
    using A = BlockQ8_K;
    static constexpr int kSubs = 8;
};

// Sub-blocks s0 .. s0 + ks - 1 of rows 0 .. nr - 1 (nr <= 16) into the tile; missing rows are zero.
template <typename K, int kPlanes>
void repack(Tile<kPlanes>& tile, const uint8_t* w, size_t w_stride, int nr, int s0, int ks) {
    using W = typename K::W;
    const __m256i table = codebook();
    const W* rows[kLanes];
    for (int j = 0; j < kLanes; ++j) rows[j] = j < nr ? reinterpret_cast<const W*>(w + j * w_stride) : nullptr;
    for (int s = 0; s < ks; ++s) {
        __m256i u[kLanes];
        for (int j = 0; j < kLanes; ++j)
            u[j] = j < nr ? unpack(sub_qs<K>(rows[j], s0 + s), table) : _mm256_setzero_si256();
        for (int plane = 0; plane < kPlanes; ++plane) {
            __m256i lo[8], hi[8];
            for (int j = 0; j < 8; ++j) {
                lo[j] = u[j];
                hi[j] = u[j + 8];
                if constexpr (kPlanes == 2) {
                    const __m256i mask = _mm256_set1_epi8(0x0F);
                    lo[j] = _mm256_and_si256(plane == 0 ? lo[j] : _mm256_srli_epi16(lo[j], 4), mask);
                    hi[j] = _mm256_and_si256(plane == 0 ? hi[j] : _mm256_srli_epi16(hi[j], 4), mask);
                }
            }
            transpose8(lo);
            transpose8(hi);
            for (int g = 0; g < 8; ++g) {
                _mm512_store_si512(tile.q[s][8 * plane + g],
                                   _mm512_inserti64x4(_mm512_castsi256_si512(lo[g]), hi[g], 1));
            }
        }
        for (int j = 0; j < kLanes; ++j) {
            if (j >= nr) {
                tile.d[s][j] = 0.0f;
                tile.ls[s][j] = 0;
                continue;
            }
            const W& b = rows[j][(s0 + s) / K::kSubs];
            tile.d[s][j] = f16(b.d);
            if constexpr (K::kSubs == 8) tile.ls[s][j] = iq4_xs_ls(b, (s0 + s) % 8);
        }
    }
}

// sum of the 32 signed bytes at p.
int32_t sum_i8(const int8_t* p) {
    const __m256i u = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
                                       _mm256_set1_epi8(static_cast<char>(0x80)));  // q + 128
    const __m256i s = _mm256_sad_epu8(u, _mm256_setzero_si256());
    __m128i x = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    x = _mm_add_epi64(x, _mm_unpackhi_epi64(x, x));
    return _mm_cvtsi128_si32(x) - 32 * 128;
}

void prepare_tok(TokSub* out, const BlockQ8_0* y, int s0, int ks) {
    for (int s = 0; s < ks; ++s) {
        out[s].d = f16(y[s0 + s].d);
        out[s].off = -128 * sum_i8(y[s0 + s].qs);
    }
}
void prepare_tok(TokSub* out, const BlockQ8_K* y, int s0, int ks) {
    for (int s = 0; s < ks; ++s) {
        const BlockQ8_K& b = y[(s0 + s) / 8];
        const int sub = (s0 + s) % 8;
        out[s].d = b.d;
        out[s].off = -128 * (b.bsums[2 * sub] + b.bsums[2 * sub + 1]);
    }
}

// The integer sum of sub-block s for kT tokens, started at their offsets.
template <bool kVnni, int kPlanes, int kT, typename A>
void sub_sums(__m512i sum[kT], const Tile<kPlanes>& tile, int s, const TokSub* prep, const A* const a[kT], int sa) {
#pragma GCC unroll 8
    for (int t = 0; t < kT; ++t) sum[t] = _mm512_set1_epi32(prep[t * kChunk + s].off);
    if constexpr (kVnni) {
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) {
            const __m512i w = _mm512_load_si512(tile.q[s][g]);
#pragma GCC unroll 8
            for (int t = 0; t < kT; ++t) {
                sum[t] = _mm512_dpbusd_epi32(sum[t], w, _mm512_set1_epi32(load_i32(sub_y(a[t], sa) + 4 * g)));
            }
        }
    } else {
#pragma GCC unroll 2
        for (int plane = 0; plane < 2; ++plane) {
            __m512i pairs[kT];
#pragma GCC unroll 8
            for (int g = 0; g < 8; ++g) {
                const __m512i w = _mm512_load_si512(tile.q[s][8 * plane + g]);
#pragma GCC unroll 8
                for (int t = 0; t < kT; ++t) {
                    const __m512i p = _mm512_maddubs_epi16(w, _mm512_set1_epi32(load_i32(sub_y(a[t], sa) + 4 * g)));
                    pairs[t] = g == 0 ? p : _mm512_add_epi16(pairs[t], p);
                }
            }
            const __m512i weight = _mm512_set1_epi16(plane == 0 ? 1 : 16);
#pragma GCC unroll 8
            for (int t = 0; t < kT; ++t) sum[t] = _mm512_add_epi32(sum[t], _mm512_madd_epi16(pairs[t], weight));
        }
    }
}

// kT tokens times the tile's 16 rows over ks sub-blocks (from sub-block s0 of the rows); y (token 0,
// row 0) gets or adds the sums of rows < nr.
template <typename K, bool kVnni, int kT>
void micro(const Tile<kVnni ? 1 : 2>& tile, int s0, int ks, const TokSub* prep, const uint8_t* act, size_t act_stride,
           float* y, size_t y_stride, int nr, bool add) {
    using A = typename K::A;
    const A* a[kT];
    for (int t = 0; t < kT; ++t) a[t] = reinterpret_cast<const A*>(act + static_cast<size_t>(t) * act_stride);
    const auto mask = static_cast<__mmask16>(nr >= kLanes ? 0xFFFF : (1u << nr) - 1);
    __m512 acc[kT];
    for (int t = 0; t < kT; ++t) {
        acc[t] = add ? _mm512_maskz_loadu_ps(mask, y + static_cast<size_t>(t) * y_stride) : _mm512_setzero_ps();
    }
    __m512i sum[kT];
    if constexpr (K::kSubs == 1) {
        for (int s = 0; s < ks; ++s) {
            sub_sums<kVnni, kVnni ? 1 : 2, kT>(sum, tile, s, prep, a, s0 + s);
            const __m512 dw = _mm512_load_ps(tile.d[s]);
#pragma GCC unroll 8
            for (int t = 0; t < kT; ++t) {
                const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(prep[t * kChunk + s].d));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[t]), scale, acc[t]);
            }
        }
    } else {
        for (int sb = 0; sb < ks; sb += K::kSubs) {
            __m512i isum[kT];
#pragma GCC unroll 8
            for (int sub = 0; sub < K::kSubs; ++sub) {
                const int s = sb + sub;
                sub_sums<kVnni, kVnni ? 1 : 2, kT>(sum, tile, s, prep, a, s0 + s);
                const __m512i ls = _mm512_load_si512(tile.ls[s]);
#pragma GCC unroll 8
                for (int t = 0; t < kT; ++t) {
                    const __m512i p = _mm512_mullo_epi32(sum[t], ls);
                    isum[t] = sub == 0 ? p : _mm512_add_epi32(isum[t], p);
                }
            }
            const __m512 dw = _mm512_load_ps(tile.d[sb]);
#pragma GCC unroll 8
            for (int t = 0; t < kT; ++t) {
                const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(prep[t * kChunk + sb].d));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), scale, acc[t]);
            }
        }
    }
    for (int t = 0; t < kT; ++t) _mm512_mask_storeu_ps(y + static_cast<size_t>(t) * y_stride, mask, acc[t]);
}

template <typename K, bool kVnni>
void micro_n(int nt, const Tile<kVnni ? 1 : 2>& tile, int s0, int ks, const TokSub* prep, const uint8_t* act,
             size_t act_stride, float* y, size_t y_stride, int nr, bool add) {
    switch (nt) {
        case 1:
            return micro<K, kVnni, 1>(tile, s0, ks, prep, act, act_stride, y, y_stride, nr, add);
        case 2:
            return micro<K, kVnni, 2>(tile, s0, ks, prep, act, act_stride, y, y_stride, nr, add);
        case 3:
            return micro<K, kVnni, 3>(tile, s0, ks, prep, act, act_stride, y, y_stride, nr, add);
        case 4:
            return micro<K, kVnni, 4>(tile, s0, ks, prep, act, act_stride, y, y_stride, nr, add);
        case 5:
            return micro<K, kVnni, 5>(tile, s0, ks, prep, act, act_stride, y, y_stride, nr, add);
        default:
            return micro<K, kVnni, kMaxTok>(tile, s0, ks, prep, act, act_stride, y, y_stride, nr, add);
    }
}

template <GgmlType kType, bool kVnni>
void gemm(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride, float* y,
          size_t y_stride) {
    using K = Kind<kType>;
    using A = typename K::A;
    const auto* w_bytes = static_cast<const uint8_t*>(w);
    const auto* a_bytes = static_cast<const uint8_t*>(act);
    const int n_sub = n / 32;
    Tile<kVnni ? 1 : 2> tile;
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
                for (int t = 0; t < tc; t += kMaxTok) {
                    const int nt = tc - t < kMaxTok ? tc - t : kMaxTok;
                    micro_n<K, kVnni>(nt, tile, s0, ks, prep + t * kChunk, a0 + static_cast<size_t>(t) * act_stride,
                                      act_stride, y + static_cast<size_t>(t0 + t) * y_stride + r0, y_stride, nr,
                                      s0 > 0);
                }
            }
        }
    }
}

template <bool kVnni>
GemmKernel table(GgmlType weight_type) {
    GemmKernel k;
    switch (weight_type) {
        case GgmlType::IQ4_NL:
            k.fn = gemm<GgmlType::IQ4_NL, kVnni>;
            break;
        case GgmlType::IQ4_XS:
            // Without VNNI gemm_avx512.cpp's kernel (one row and token at a time) is faster.
            if (!kVnni) return {};
            k.fn = gemm<GgmlType::IQ4_XS, kVnni>;
            break;
        default:
            return {};
    }
    k.dot_order = weight_type == GgmlType::IQ4_NL;  // IQ4_XS: one fma a super-block; its dot is lanes8
    k.row_tile = kLanes;
    k.tok_tile = kMaxTok;
    return k;
}

}  // namespace

GemmKernel gemm_iq4_avx512(GgmlType weight_type, bool vnni) {
    return vnni ? table<true>(weight_type) : table<false>(weight_type);
}

}  // namespace fitllm::quant::detail
