// AVX2 tiled kernel for IQ4_NL (with Q8_0), for prompts. Compiled with -mavx2 -mfma -mf16c; see
// dot_kernels.h for the rules this file follows.
//
// The layout of gemm_iq4_avx512.cpp at half the width: one 32-bit lane per weight row, a tile of 8
// rows repacked (a chunk of kChunk blocks at a time) into the codebook's values + 128 (one byte
// shuffle for 32 indices), split into two 4-bit planes lo + 16 hi so that maddubs' pair sums of 8
// groups add up in 16 bits (8 * 2 * 15 * 127 < 2^15); register g of a block and plane holds
// elements 4g..4g+3 of each of the 8 rows. A token then costs, per block and 8 rows, 16 maddubs
// with its own 4 bytes broadcast, 14 16-bit adds and two madd; the + 128 comes back as
// -128 * sum(y), the int accumulator's start; then one conversion and fma (d_w d_y). The integer
// part is exact, the float order the serial one of the dot kernels.
//
// IQ4_XS has no kernel here: this layout with its sub-block scales measured slower at AVX2 than
// gemm_avx2.cpp's kernel (one row and token at a time, the sign trick), which it keeps.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant/blocks.h"
#include "quant/gemm_kernels.h"
#include "quant/transpose_avx2.h"

namespace fitllm::quant::detail {
namespace {

constexpr int kLanes = 8;       // weight rows per tile: one 32-bit lane each
constexpr int kChunk = 32;      // blocks per chunk of the row: the repacked tile is 17 KiB (L1)
constexpr int kTokChunk = 256;  // tokens whose per-block sums are prepared at once (stack)
constexpr int kMaxTok = 4;      // tokens per micro-kernel

struct alignas(32) Tile {
    uint8_t q[kChunk][16][32];  // block, group g (+ 8: high plane): bytes 4g..4g+3 of rows 0..7
    float d[kChunk][kLanes];
};

// Per token and block of the chunk: the activation scale and -128 * sum(y).
struct TokBlock {
    float d;
    int32_t off;
};

float f16(uint16_t h) {
    return _cvtsh_ss(h);
}
int32_t load_i32(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// The 16 codebook values + 128 as unsigned bytes, in both 128-bit lanes.
__m256i codebook() {
    alignas(16) uint8_t t[16];
    for (int i = 0; i < 16; ++i) t[i] = static_cast<uint8_t>(kValuesIQ4NL[i] + 128);
    return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
}

// The 32 elements of a block (16 bytes of nibbles: low ones first) as codebook value + 128.
__m256i unpack(const uint8_t* qs, __m256i table) {
    const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m256i idx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), _mm256_set1_epi8(0x0F));
    return _mm256_shuffle_epi8(table, idx);
}

// Blocks b0 .. b0 + kb - 1 of rows 0 .. nr - 1 (nr <= 8) into the tile; missing rows are zero.
void repack(Tile& tile, const uint8_t* w, size_t w_stride, int nr, int b0, int kb) {
    const __m256i table = codebook();
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const BlockIQ4_NL* rows[kLanes];
    for (int j = 0; j < kLanes; ++j) {
        rows[j] = j < nr ? reinterpret_cast<const BlockIQ4_NL*>(w + j * w_stride) + b0 : nullptr;
    }
    for (int b = 0; b < kb; ++b) {
        __m256i lo[8], hi[8];
        for (int j = 0; j < kLanes; ++j) {
            const __m256i u = j < nr ? unpack(rows[j][b].qs, table) : _mm256_setzero_si256();
            lo[j] = _mm256_and_si256(u, low4);
            hi[j] = _mm256_and_si256(_mm256_srli_epi16(u, 4), low4);
        }
        transpose8(lo);
        transpose8(hi);
        for (int g = 0; g < 8; ++g) {
            _mm256_store_si256(reinterpret_cast<__m256i*>(tile.q[b][g]), lo[g]);
            _mm256_store_si256(reinterpret_cast<__m256i*>(tile.q[b][8 + g]), hi[g]);
        }
        for (int j = 0; j < kLanes; ++j) tile.d[b][j] = j < nr ? f16(rows[j][b].d) : 0.0f;
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

// kT tokens times the tile's 8 rows over kb blocks (activation rows from the chunk's first block);
// y (token 0, row 0) gets or adds the sums of rows < nr.
template <int kT>
void micro(const Tile& tile, int kb, const TokBlock* prep, const uint8_t* act, size_t act_stride, float* y,
           size_t y_stride, int nr, bool add) {
    const BlockQ8_0* a[kT];
    for (int t = 0; t < kT; ++t) a[t] = reinterpret_cast<const BlockQ8_0*>(act + static_cast<size_t>(t) * act_stride);
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
    const __m256i one = _mm256_set1_epi16(1), sixteen = _mm256_set1_epi16(16);
    for (int b = 0; b < kb; ++b) {
        // Group by group, both planes of each token share its broadcast: 2 kT 16-bit sums live.
        __m256i lo[kT], hi[kT];
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) {
            const __m256i wl = _mm256_load_si256(reinterpret_cast<const __m256i*>(tile.q[b][g]));
            const __m256i wh = _mm256_load_si256(reinterpret_cast<const __m256i*>(tile.q[b][8 + g]));
#pragma GCC unroll 8
            for (int t = 0; t < kT; ++t) {
                const __m256i yb = _mm256_set1_epi32(load_i32(a[t][b].qs + 4 * g));
                const __m256i pl = _mm256_maddubs_epi16(wl, yb);
                const __m256i ph = _mm256_maddubs_epi16(wh, yb);
                lo[t] = g == 0 ? pl : _mm256_add_epi16(lo[t], pl);
                hi[t] = g == 0 ? ph : _mm256_add_epi16(hi[t], ph);
                // Keeps GCC from reassociating the sums into a tree over all 8 groups (spills).
                asm("" : "+x"(lo[t]), "+x"(hi[t]));
            }
        }
        const __m256 dw = _mm256_load_ps(tile.d[b]);
#pragma GCC unroll 8
        for (int t = 0; t < kT; ++t) {
            const __m256i sum = _mm256_add_epi32(
                _mm256_add_epi32(_mm256_set1_epi32(prep[t * kChunk + b].off), _mm256_madd_epi16(lo[t], one)),
                _mm256_madd_epi16(hi[t], sixteen));
            const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(prep[t * kChunk + b].d));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, acc[t]);
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

void micro_n(int nt, const Tile& tile, int kb, const TokBlock* prep, const uint8_t* act, size_t act_stride, float* y,
             size_t y_stride, int nr, bool add) {
    switch (nt) {
        case 1:
            return micro<1>(tile, kb, prep, act, act_stride, y, y_stride, nr, add);
        case 2:
            return micro<2>(tile, kb, prep, act, act_stride, y, y_stride, nr, add);
        case 3:
            return micro<3>(tile, kb, prep, act, act_stride, y, y_stride, nr, add);
        default:
            return micro<kMaxTok>(tile, kb, prep, act, act_stride, y, y_stride, nr, add);
    }
}

void gemm_iq4_nl(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride,
                 float* y, size_t y_stride) {
    const auto* w_bytes = static_cast<const uint8_t*>(w);
    const auto* a_bytes = static_cast<const uint8_t*>(act);
    const int nb = n / 32;
    Tile tile;
    TokBlock prep[kTokChunk * kChunk];
    for (int t0 = 0; t0 < n_tok; t0 += kTokChunk) {
        const int tc = n_tok - t0 < kTokChunk ? n_tok - t0 : kTokChunk;
        const uint8_t* a0 = a_bytes + static_cast<size_t>(t0) * act_stride;
        for (int b0 = 0; b0 < nb; b0 += kChunk) {
            const int kb = nb - b0 < kChunk ? nb - b0 : kChunk;
            for (int t = 0; t < tc; ++t) {
                const auto* yb = reinterpret_cast<const BlockQ8_0*>(a0 + static_cast<size_t>(t) * act_stride) + b0;
                for (int b = 0; b < kb; ++b) {
                    prep[t * kChunk + b].d = f16(yb[b].d);
                    prep[t * kChunk + b].off = -128 * sum_i8(yb[b].qs);
                }
            }
            for (int r0 = 0; r0 < n_rows; r0 += kLanes) {
                const int nr = n_rows - r0 < kLanes ? n_rows - r0 : kLanes;
                repack(tile, w_bytes + static_cast<size_t>(r0) * w_stride, w_stride, nr, b0, kb);
                for (int t = 0; t < tc; t += kMaxTok) {
                    const int nt = tc - t < kMaxTok ? tc - t : kMaxTok;
                    micro_n(nt, tile, kb, prep + t * kChunk,
                            a0 + static_cast<size_t>(t) * act_stride + b0 * sizeof(BlockQ8_0), act_stride,
                            y + static_cast<size_t>(t0 + t) * y_stride + r0, y_stride, nr, b0 > 0);
                }
            }
        }
    }
}

}  // namespace

GemmKernel gemm_iq4_avx2(GgmlType weight_type) {
    if (weight_type != GgmlType::IQ4_NL) return {};
    GemmKernel k;
    k.fn = gemm_iq4_nl;
    k.row_tile = kLanes;
    k.tok_tile = kMaxTok;
    return k;
}

}  // namespace fitllm::quant::detail
