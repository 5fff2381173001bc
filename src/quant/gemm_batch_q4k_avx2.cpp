// AVX2 kernel of Q4_K in llama.cpp's batch order (gemm_batch_q4k.h): gemm_batch_q4k_avx512.cpp's
// layout at half the width, one 32-bit lane per weight row and a tile of 8 rows, the products on
// maddubs (8 groups of 4-bit quants add up in 16 bits before one madd). llama.cpp repacks Q2_K
// only on AVX-512 CPUs, so Q2_K has no batch order here.
// Compiled with -mavx2 -mfma -mf16c. See dot_kernels.h for the rules this file follows.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "quant/blocks.h"
#include "quant/gemm_batch_q4k.h"
#include "quant/transpose_avx2.h"

namespace fitllm::quant::detail {
namespace {

constexpr int kLanes = 8;        // weight rows per tile: one 32-bit lane each
constexpr int kChunkBlocks = 4;  // super-blocks per repacked chunk of the tile: about 10 KiB
constexpr int kMaxTok = 2;       // tokens per micro-kernel call (16 registers)

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
int32_t word_pair(int lo, int hi) {
    return static_cast<int32_t>((static_cast<uint32_t>(lo) & 0xFFFFu) | (static_cast<uint32_t>(hi) << 16));
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
    float acc[16];
};

// Per token and super-block: the activation scale and the sums of its sub-blocks of 32 in word
// pairs: pair c = (sub-block 2c, sub-block 2c + 1), the chunk c of 64.
struct TokBlock {
    float d;
    int32_t sums[4];
};

struct alignas(32) Tile {
    uint8_t q[kChunkBlocks][4][2][8][32];   // block, chunk c, half h (sub-block 2c + h), group g
    float sc[kChunkBlocks][8][kLanes];      // sub-block scales
    int32_t mins[kChunkBlocks][4][kLanes];  // chunk c: word pair (min 2c, min 2c + 1)
    float d[kChunkBlocks][kLanes];
    float dmin[kChunkBlocks][kLanes];
};

void repack(Tile& tile, const uint8_t* w, size_t w_stride, int nr, int b0, int kb) {
    const BlockQ4_K* rows[kLanes];
    for (int j = 0; j < nr; ++j)
        rows[j] = reinterpret_cast<const BlockQ4_K*>(w + static_cast<size_t>(j) * w_stride) + b0;
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    for (int b = 0; b < kb; ++b) {
        for (int c = 0; c < 4; ++c) {
            __m256i raw[8];
            for (int j = 0; j < kLanes; ++j) raw[j] = j < nr ? load256(rows[j][b].qs + 32 * c) : _mm256_setzero_si256();
            transpose8(raw);
            for (int g = 0; g < 8; ++g) {
                _mm256_store_si256(reinterpret_cast<__m256i*>(tile.q[b][c][0][g]), _mm256_and_si256(raw[g], nibble));
                _mm256_store_si256(reinterpret_cast<__m256i*>(tile.q[b][c][1][g]),
                                   _mm256_and_si256(_mm256_srli_epi16(raw[g], 4), nibble));
            }
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

__m256i load_tile(const uint8_t* p) {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
}

// kT tokens times the tile's 8 rows over its kb super-blocks; see gemm_batch_q4k_avx512.cpp's micro.
template <int kT>
void micro(const Tile& tile, int kb, const TokBlock* prep, size_t prep_stride, const uint8_t* act, size_t act_stride,
           float* state, float* y, size_t y_stride, int nr, bool first, bool last) {
    const BlockQ8_K* a[kT];
    for (int t = 0; t < kT; ++t) a[t] = reinterpret_cast<const BlockQ8_K*>(act + static_cast<size_t>(t) * act_stride);
    __m256 acc[kT], acc_mins[kT];
    for (int t = 0; t < kT; ++t) {
        acc[t] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(state + 16 * t);
        acc_mins[t] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(state + 16 * t + 8);
    }
    const __m256i ones = _mm256_set1_epi16(1);
    for (int b = 0; b < kb; ++b) {
        const __m256 dw = _mm256_load_ps(tile.d[b]);
        const __m256 dminw = _mm256_load_ps(tile.dmin[b]);
        for (int c = 0; c < 4; ++c) {
            __m256 sums[kT];
            for (int h = 0; h < 2; ++h) {
                // 8 groups of maddubs pair sums of 4-bit quants stay below 2^15.
                __m256i pairs[kT];
#pragma GCC unroll 8
                for (int g = 0; g < 8; ++g) {
                    const __m256i wg = load_tile(tile.q[b][c][h][g]);
#pragma GCC unroll 4
                    for (int t = 0; t < kT; ++t) {
                        const __m256i p =
                            _mm256_maddubs_epi16(wg, _mm256_set1_epi32(load_i32(a[t][b].qs + 64 * c + 32 * h + 4 * g)));
                        pairs[t] = g == 0 ? p : _mm256_add_epi16(pairs[t], p);
                    }
                }
                const __m256 sc = _mm256_load_ps(tile.sc[b][2 * c + h]);
                for (int t = 0; t < kT; ++t) {
                    const __m256 x = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs[t], ones));
                    // sc0 X0 + sc1 X1 in floats: exact (gemm_batch_q4k_avx512.cpp).
                    sums[t] = h == 0 ? _mm256_mul_ps(x, sc) : _mm256_fmadd_ps(x, sc, sums[t]);
                }
            }
            const __m256i mn = load_tile(reinterpret_cast<const uint8_t*>(tile.mins[b][c]));
            for (int t = 0; t < kT; ++t) {
                const __m256 da = _mm256_set1_ps(prep[t * prep_stride + b].d);
                const __m256i mins = _mm256_madd_epi16(mn, _mm256_set1_epi32(prep[t * prep_stride + b].sums[c]));
                acc[t] = _mm256_fmadd_ps(sums[t], _mm256_mul_ps(dw, da), acc[t]);
                acc_mins[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(dminw, da), acc_mins[t]);
            }
        }
    }
    if (!last) {
        for (int t = 0; t < kT; ++t) {
            _mm256_storeu_ps(state + 16 * t, acc[t]);
            _mm256_storeu_ps(state + 16 * t + 8, acc_mins[t]);
        }
        return;
    }
    for (int t = 0; t < kT; ++t) {
        alignas(32) float out[kLanes];
        _mm256_store_ps(out, _mm256_sub_ps(acc[t], acc_mins[t]));
        std::memcpy(y + static_cast<size_t>(t) * y_stride, out, static_cast<size_t>(nr) * sizeof(float));
    }
}

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
        for (int i = 0; i < nb; ++i) {
            TokBlock& p = prep[static_cast<size_t>(t) * nb + i];
            p.d = yb[i].d;
            for (int c = 0; c < 4; ++c) {
                p.sums[c] = word_pair(yb[i].bsums[4 * c] + yb[i].bsums[4 * c + 1],
                                      yb[i].bsums[4 * c + 2] + yb[i].bsums[4 * c + 3]);
            }
        }
    }
    Tile tile;
    for (int r0 = 0; r0 < n_rows; r0 += kLanes) {
        const int nr = n_rows - r0 < kLanes ? n_rows - r0 : kLanes;
        for (int b0 = 0; b0 < nb; b0 += kChunkBlocks) {
            const int kb = nb - b0 < kChunkBlocks ? nb - b0 : kChunkBlocks;
            repack(tile, w_bytes + static_cast<size_t>(r0) * w_stride, w_stride, nr, b0, kb);
            for (int t = 0; t < n_tok; t += kMaxTok) {
                const TokBlock* p = prep.data() + static_cast<size_t>(t) * nb + b0;
                const uint8_t* a = a_bytes + static_cast<size_t>(t) * act_stride + b0 * sizeof(BlockQ8_K);
                float* s = state[t].acc;
                float* out = y + static_cast<size_t>(t) * y_stride + r0;
                if (n_tok - t >= 2)
                    micro<2>(tile, kb, p, nb, a, act_stride, s, out, y_stride, nr, b0 == 0, b0 + kb == nb);
                else
                    micro<1>(tile, kb, p, nb, a, act_stride, s, out, y_stride, nr, b0 == 0, b0 + kb == nb);
            }
        }
    }
}

}  // namespace

GemmKernel gemm_batch_q4k_avx2(GgmlType weight_type) {
    GemmKernel k;
    if (weight_type != GgmlType::Q4_K) return k;
    k.fn = gemm;
    k.isa = Isa::Avx2;
    k.act_type = GgmlType::Q8_K;
    k.row_tile = kLanes;
    k.tok_tile = kMaxTok;
    return k;
}

}  // namespace fitllm::quant::detail
