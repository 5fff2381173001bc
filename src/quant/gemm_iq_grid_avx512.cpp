// The AVX-512 VNNI batch kernel of the grid i-quants (IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S,
// IQ1_M) in llama.cpp's tiled order (gemm_batch_ref.cpp's gemm_iq_grid_ref / gemm_iq1_ref). Compiled
// with -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx2 -mfma -mf16c; see dot_kernels.h for the
// rules this file follows. Levels without VNNI run dot_iq_avx2.h's gemm_lanes (tiled_gemm).
//
// The layout of gemm_iq4_avx512.cpp: one 32-bit lane per weight row. A tile of 16 rows takes one
// super-block at a time: each row's block unpacked by dot_iq_avx2.h (the signed weights, IQ1: 8 g +
// delta, and the scales), + 64 to make the bytes unsigned (2 .. 126), and transposed so that register
// c of the block holds elements 4c .. 4c + 3 of the 16 rows. A token then costs, per group of 16 (or
// 32, where the two halves of a sub-block share their scale) elements, 4 (8) vpdpbusd of those
// registers with its own 4 bytes broadcast, started at -64 * the group's sum of activations (Q8_K's
// bsums) to take the + 64 back off, then one vpmulld by the 16 rows' scales into the block's sum. The
// sums are the reference's exact integers; the float steps are its own, per row and token: block =
// float(sum) * (d_w / kDiv), out = fma(block, d_a, out) over the blocks in order, the outputs kept in
// a scratch buffer (16 floats per token) until the tile's last block, so every output has the
// reference's bits.

// GCC 12's AVX-512 headers trip its own uninitialized-variable warnings; see dot_avx512.cpp.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "quant/blocks.h"
#include "quant/dot_iq_avx2.h"
#include "quant/gemm_kernels.h"
#include "quant/transpose_avx2.h"

namespace fitllm::quant::detail {
namespace {

constexpr int kLanes = 16;   // weight rows per tile: one 32-bit lane each
constexpr int kMaxTok = 8;   // tokens per micro-kernel
constexpr int kOffset = 64;  // added to the signed weights: unsigned bytes for vpdpbusd

struct alignas(64) Tile {
    uint8_t q[64][64];       // column c: bytes 4c .. 4c + 3 of rows 0 .. 15, + kOffset
    int32_t ls[16][kLanes];  // group of 16 elements g: the rows' scales
    float dw[kLanes];        // d_w / kDiv
};

// Block i of rows 0 .. nr - 1 into the tile; the rows after them get zero scales (sums 0).
template <typename Block, void (*kUnpack)(const Block&, iq::Unpacked&), int kDiv>
void fill(Tile& tile, const uint8_t* w, size_t w_stride, int nr, int i) {
    const __m256i offset = _mm256_set1_epi8(kOffset);
    __m256i rows[kLanes][8];
    for (int r = 0; r < kLanes; ++r) {
        if (r >= nr) {
            for (int ib = 0; ib < 8; ++ib) rows[r][ib] = _mm256_setzero_si256();
            for (int g = 0; g < 16; ++g) tile.ls[g][r] = 0;
            tile.dw[r] = 0.0f;
            continue;
        }
        const Block& x = reinterpret_cast<const Block*>(w + static_cast<size_t>(r) * w_stride)[i];
        iq::Unpacked u;
        kUnpack(x, u);
        for (int ib = 0; ib < 8; ++ib) {
            rows[r][ib] = _mm256_add_epi8(u.v[ib], offset);
            tile.ls[2 * ib][r] = u.ls[2 * ib];
            tile.ls[2 * ib + 1][r] = u.ls[2 * ib + 1];
        }
        tile.dw[r] = iq::block_d(x) * (1.0f / kDiv);
    }
    for (int ib = 0; ib < 8; ++ib) {
        __m256i lo[8], hi[8];
        for (int j = 0; j < 8; ++j) {
            lo[j] = rows[j][ib];
            hi[j] = rows[j + 8][ib];
        }
        transpose8(lo);
        transpose8(hi);
        for (int c = 0; c < 8; ++c) {
            _mm512_store_si512(tile.q[8 * ib + c], _mm512_inserti64x4(_mm512_castsi256_si512(lo[c]), hi[c], 1));
        }
    }
}

inline int32_t load_i32(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// kT tokens (a[t]: their block) times the tile's 16 rows, added into out[16 t .. 16 t + 15].
// kGroup: elements per scale (16, or 32 where a sub-block has one scale).
template <int kGroup, int kT>
void micro(const Tile& tile, const BlockQ8_K* const* a, float* out) {
    constexpr int kCols = kGroup / 4;
    __m512i total[kT];
    for (int g = 0; g < 256 / kGroup; ++g) {
        __m512i sum[kT];
#pragma GCC unroll 8
        for (int t = 0; t < kT; ++t) {
            int bsum = a[t]->bsums[kGroup / 16 * g];
            if constexpr (kGroup == 32) bsum += a[t]->bsums[2 * g + 1];
            sum[t] = _mm512_set1_epi32(-kOffset * bsum);
        }
#pragma GCC unroll 8
        for (int c = 0; c < kCols; ++c) {
            const __m512i w = _mm512_load_si512(tile.q[kCols * g + c]);
#pragma GCC unroll 8
            for (int t = 0; t < kT; ++t) {
                sum[t] = _mm512_dpbusd_epi32(sum[t], w, _mm512_set1_epi32(load_i32(a[t]->qs + 4 * (kCols * g + c))));
            }
        }
        const __m512i ls = _mm512_load_si512(tile.ls[kGroup / 16 * g]);
#pragma GCC unroll 8
        for (int t = 0; t < kT; ++t) {
            const __m512i p = _mm512_mullo_epi32(sum[t], ls);
            total[t] = g == 0 ? p : _mm512_add_epi32(total[t], p);
        }
    }
    const __m512 dw = _mm512_load_ps(tile.dw);
#pragma GCC unroll 8
    for (int t = 0; t < kT; ++t) {
        const __m512 block = _mm512_mul_ps(_mm512_cvtepi32_ps(total[t]), dw);
        float* o = out + kLanes * t;
        _mm512_storeu_ps(o, _mm512_fmadd_ps(block, _mm512_set1_ps(a[t]->d), _mm512_loadu_ps(o)));
    }
}

template <int kGroup>
void micro_n(int nt, const Tile& tile, const BlockQ8_K* const* a, float* out) {
    switch (nt) {
        case 1:
            return micro<kGroup, 1>(tile, a, out);
        case 2:
            return micro<kGroup, 2>(tile, a, out);
        case 3:
            return micro<kGroup, 3>(tile, a, out);
        case 4:
            return micro<kGroup, 4>(tile, a, out);
        case 5:
            return micro<kGroup, 5>(tile, a, out);
        case 6:
            return micro<kGroup, 6>(tile, a, out);
        case 7:
            return micro<kGroup, 7>(tile, a, out);
        default:
            return micro<kGroup, kMaxTok>(tile, a, out);
    }
}

template <typename Block, void (*kUnpack)(const Block&, iq::Unpacked&), int kDiv, int kGroup>
void gemm(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride, float* y,
          size_t y_stride) {
    const int nb = n / kQK;
    const size_t out_floats = static_cast<size_t>(n_tok) * kLanes;
    std::byte* buf = small_batch_scratch(sizeof(Tile) + out_floats * sizeof(float));
    auto& tile = *reinterpret_cast<Tile*>(buf);
    auto* out = reinterpret_cast<float*>(buf + sizeof(Tile));
    const auto* wb = static_cast<const uint8_t*>(w);
    const auto* ab = static_cast<const uint8_t*>(act);
    for (int r0 = 0; r0 < n_rows; r0 += kLanes) {
        const int nr = n_rows - r0 < kLanes ? n_rows - r0 : kLanes;
        std::memset(out, 0, out_floats * sizeof(float));
        for (int i = 0; i < nb; ++i) {
            fill<Block, kUnpack, kDiv>(tile, wb + static_cast<size_t>(r0) * w_stride, w_stride, nr, i);
            for (int t = 0; t < n_tok; t += kMaxTok) {
                const int nt = n_tok - t < kMaxTok ? n_tok - t : kMaxTok;
                const BlockQ8_K* a[kMaxTok];
                for (int j = 0; j < nt; ++j) {
                    a[j] = reinterpret_cast<const BlockQ8_K*>(ab + static_cast<size_t>(t + j) * act_stride) + i;
                }
                micro_n<kGroup>(nt, tile, a, out + static_cast<size_t>(t) * kLanes);
            }
        }
        const auto mask = static_cast<__mmask16>(nr >= kLanes ? 0xFFFF : (1u << nr) - 1);
        for (int t = 0; t < n_tok; ++t) {
            _mm512_mask_storeu_ps(y + static_cast<size_t>(t) * y_stride + static_cast<size_t>(r0), mask,
                                  _mm512_load_ps(out + static_cast<size_t>(t) * kLanes));
        }
    }
}

}  // namespace

GemmFn gemm_iq_grid_avx512_vnni(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::IQ3_XXS:
            return gemm<BlockIQ3_XXS, iq::unpack_iq3_xxs, 4, 32>;
        case GgmlType::IQ3_S:
            return gemm<BlockIQ3_S, iq::unpack_iq3_s, 1, 32>;
        case GgmlType::IQ2_XXS:
            return gemm<BlockIQ2_XXS, iq::unpack_iq2_xxs, 8, 32>;
        case GgmlType::IQ2_XS:
            return gemm<BlockIQ2_XS, iq::unpack_iq2_xs, 8, 16>;
        case GgmlType::IQ2_S:
            return gemm<BlockIQ2_S, iq::unpack_iq2_s, 8, 16>;
        case GgmlType::IQ1_S:
            return gemm<BlockIQ1_S, iq::unpack_iq1_s, 8, 32>;
        case GgmlType::IQ1_M:
            return gemm<BlockIQ1_M, iq::unpack_iq1_m, 8, 16>;
        default:
            return nullptr;
    }
}

}  // namespace fitllm::quant::detail
