// AVX-512 (F, BW, VL; VNNI where kVnni) kernels of llama.cpp's batch order for Q3_K, Q5_K, Q6_K
// (gemm_batch_ref.cpp defines the arithmetic; these give its bits). Compiled with -mavx512f
// -mavx512bw -mavx512vl -mavx512vnni -mfma -mf16c; the kVnni = false kernels use no VNNI
// instruction. See dot_kernels.h for the rules this file follows.
//
// A weight super-block is unpacked once (quants in four registers of 64, the sub-block scales as
// words beside them) and multiplied with the same super-block of up to 8 tokens: each token's
// integer sums (exact, in any order) are reduced to one lane per token, so the float steps of the
// 8 tokens run side by side in one register, per super-block: r = float(sum) * d_w (Q5_K: minus
// dmin_w * float(mins sum), fused), out = fma(r, d_a, out). Rows wider than L1 holds for a pass's
// tokens run in slabs of blocks, each row's 8 outputs kept in memory in between.

// GCC 12's AVX-512 headers trip its own uninitialized-variable warnings (the _mm512_undefined_*
// helpers initialize a variable with itself); the warnings point into the header, so silence them there.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstring>
#include <type_traits>
#include <vector>

#include "quant/blocks.h"
#include "quant/dot_iq_avx2.h"
#include "quant/gemm_batch_kernels.h"
#include "quant/kquant_avx512.h"
#include "quant/unroll.h"

namespace fitllm::quant::detail {
namespace {

// ---- One weight super-block, unpacked ----
// q[c] holds elements 64c .. 64c + 63 as unsigned bytes, sc[c] their sub-block scales as words
// lined up with maddubs' pair sums. corr: 16 words to madd with a token's 16 bsums: Q5_K's mins
// (each twice: a sub-block of 32 covers two bsums), or -offset * scale of Q3_K / Q6_K's sub-blocks
// of 16 (q in 0..7 stands for q - 4, q in 0..63 for q - 32).
struct Unpacked {
    __m512i q[4];
    __m512i sc[4];
    __m512i corr;  // in the low 256 bits
    float d, dmin;
};

struct Q5K {
    using Block = BlockQ5_K;
    static constexpr bool kMins = true;
    static Unpacked unpack(const Block& b) {
        Unpacked u;
        const __m128i packed = q4k_scales_mins(b.scales);
        const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(packed, 8));
        u.corr =
            _mm512_zextsi256_si512(_mm256_set_m128i(_mm_unpackhi_epi16(mins, mins), _mm_unpacklo_epi16(mins, mins)));
        const __m512i scales = _mm512_castsi128_si512(_mm_cvtepu8_epi16(packed));
        const __m512i nibble = _mm512_set1_epi8(0x0F), nibble_shift = halves64(0, 4);
        const __m512i high_bits = twice(b.qh);
        unroll<4>([&](auto c_) {
            constexpr int c = decltype(c_)::value;
            __m512i q = _mm512_and_si512(_mm512_srlv_epi64(twice(b.qs + 32 * c), nibble_shift), nibble);
            const __mmask64 fifth = _mm512_test_epi8_mask(high_bits, halves8(1 << (2 * c), 1 << (2 * c + 1)));
            u.q[c] = _mm512_mask_add_epi8(q, fifth, q, _mm512_set1_epi8(16));
            u.sc[c] = two_scales<2 * c, 2 * c + 1>(scales);
        });
        u.d = f16(b.d);
        u.dmin = f16(b.dmin);
        return u;
    }
};

// -offset * scales, as the words corr holds.
template <int kShift>
__m512i offset_words(__m256i scales) {
    return _mm512_zextsi256_si512(_mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(scales, kShift)));
}

struct Q3K {
    using Block = BlockQ3_K;
    static constexpr bool kMins = false;
    static Unpacked unpack(const Block& b) {
        Unpacked u;
        const __m256i scales = _mm256_cvtepi8_epi16(q3k_scales(b.scales));
        u.corr = offset_words<2>(scales);
        const __m512i sc = _mm512_castsi256_si512(scales);
        const __m512i hmask = twice(b.hmask);
        const __m512i two_bits = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
        unroll<2>([&](auto h_) {
            constexpr int h = decltype(h_)::value;
            const __m512i q = twice(b.qs + 32 * h);
            __m512i q01 = _mm512_and_si512(_mm512_srlv_epi64(q, halves64(0, 2)), two_bits);
            __m512i q23 = _mm512_and_si512(_mm512_srlv_epi64(q, halves64(4, 6)), two_bits);
            // The third bit of group g is bit 4h + g of hmask.
            q01 =
                _mm512_mask_add_epi8(q01, _mm512_test_epi8_mask(hmask, halves8(1 << (4 * h), 2 << (4 * h))), q01, four);
            q23 =
                _mm512_mask_add_epi8(q23, _mm512_test_epi8_mask(hmask, halves8(4 << (4 * h), 8 << (4 * h))), q23, four);
            u.q[2 * h] = q01;
            u.q[2 * h + 1] = q23;
            u.sc[2 * h] = four_scales<8 * h>(sc);
            u.sc[2 * h + 1] = four_scales<8 * h + 4>(sc);
        });
        u.d = f16(b.d);
        u.dmin = 0;
        return u;
    }
};

struct Q6K {
    using Block = BlockQ6_K;
    static constexpr bool kMins = false;
    static Unpacked unpack(const Block& b) {
        Unpacked u;
        const __m256i scales = _mm256_cvtepi8_epi16(load128(b.scales));
        u.corr = offset_words<5>(scales);
        const __m512i sc = _mm512_castsi256_si512(scales);
        const __m512i nibble = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
        unroll<2>([&](auto h_) {
            constexpr int h = decltype(h_)::value;
            const __m512i ql = load512(b.ql + 64 * h);  // low nibbles: groups 0, 1; high nibbles: 2, 3
            const __m512i qh = twice(b.qh + 32 * h);    // bits 2g, 2g + 1 of group g
            u.q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, nibble),
                                         _mm512_and_si512(_mm512_sllv_epi64(qh, halves64(4, 2)), top));
            u.q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), nibble),
                                             _mm512_and_si512(_mm512_srlv_epi64(qh, halves64(0, 2)), top));
            u.sc[2 * h] = four_scales<8 * h>(sc);
            u.sc[2 * h + 1] = four_scales<8 * h + 4>(sc);
        });
        u.d = f16(b.d);
        u.dmin = 0;
        return u;
    }
};

// totals8(v)[t] = the sum of the 16 lanes of v[t] (exact): the integer totals of 8 tokens, one per
// lane. Pairs of registers are folded into one by 256, then 128-bit halves, then within 128 bits.
[[gnu::always_inline]] inline __m256i totals8(const __m512i* v) {
    __m512i pairs[4];  // token 2p in 128-bit lanes 0, 1; 2p + 1 in lanes 2, 3
    for (int p = 0; p < 4; ++p) {
        pairs[p] = _mm512_add_epi32(_mm512_shuffle_i64x2(v[2 * p], v[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_i64x2(v[2 * p], v[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    }
    __m512i quads[2];  // token 4q + k in 128-bit lane k
    for (int q = 0; q < 2; ++q) {
        quads[q] = _mm512_add_epi32(_mm512_shuffle_i64x2(pairs[2 * q], pairs[2 * q + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_i64x2(pairs[2 * q], pairs[2 * q + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    }
    // Lane k: dwords 0, 1 for token k, dwords 2, 3 for token 4 + k; then dword 0 and dword 2.
    const __m512i e =
        _mm512_add_epi32(_mm512_unpacklo_epi64(quads[0], quads[1]), _mm512_unpackhi_epi64(quads[0], quads[1]));
    const __m512i f = _mm512_add_epi32(e, _mm512_shuffle_epi32(e, _MM_PERM_CDAB));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, f));
}

// tree8(v)[t] = the sum of the 8 lanes of v[t] (exact): the integer totals of 8 tokens, one per lane.
[[gnu::always_inline]] inline __m256i tree8(const __m256i* v) {
    const __m256i q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    const __m128i t03 = _mm_add_epi32(_mm256_castsi256_si128(q0), _mm256_extracti128_si256(q0, 1));
    const __m128i t47 = _mm_add_epi32(_mm256_castsi256_si128(q1), _mm256_extracti128_si256(q1, 1));
    return _mm256_set_m128i(t47, t03);
}

// 8 float lanes in memory (std::vector of __m256 would drop its alignment attribute).
struct alignas(32) Lanes {
    __m256 v;
};

// The most bytes of activations one slab of a pass reads: most of a 48 KiB L1.
constexpr size_t kSlabBytes = 40 * 1024;
constexpr int kTok = 8;

// Every row of w times kT <= 8 tokens (lanes kT.. of the float steps see zeros and are dropped).
template <typename K, bool kVnni, int kT>
void rows_times_tokens(int n, int n_rows, const uint8_t* w, size_t w_stride, const uint8_t* act, size_t act_stride,
                       float* y, size_t y_stride) {
    using Block = typename K::Block;
    const int n_blocks = n / kQK;
    const BlockQ8_K* a[kT];
    for (int t = 0; t < kT; ++t) a[t] = as<BlockQ8_K>(act + static_cast<size_t>(t) * act_stride);
    // The tokens' d per block, token t in lane t; grows to the widest pass this thread has seen.
    static thread_local std::vector<Lanes> token_d;
    if (token_d.size() < static_cast<size_t>(n_blocks)) token_d.resize(n_blocks);
    for (int i = 0; i < n_blocks; ++i) {
        alignas(32) float d[kTok] = {};
        for (int t = 0; t < kT; ++t) d[t] = a[t][i].d;
        token_d[i].v = _mm256_load_ps(d);
    }
    const int n_slabs = static_cast<int>((n_blocks * kT * sizeof(BlockQ8_K) + kSlabBytes - 1) / kSlabBytes);
    const int slab = (n_blocks + n_slabs - 1) / n_slabs;
    static thread_local std::vector<Lanes> state;  // each row's outputs between slabs
    if (n_slabs > 1 && state.size() < static_cast<size_t>(n_rows)) state.resize(n_rows);
    for (int i0 = 0; i0 < n_blocks; i0 += slab) {
        const int i1 = i0 + slab < n_blocks ? i0 + slab : n_blocks;
        for (int r = 0; r < n_rows; ++r) {
            const Block* x = as<Block>(w + static_cast<size_t>(r) * w_stride);
            __m256 out = i0 == 0 ? _mm256_setzero_ps() : state[r].v;
            for (int i = i0; i < i1; ++i) {
                const Unpacked u = K::unpack(x[i]);
                __m512i sums[kTok];
                __m256i mins[kTok];
                unroll<kTok>([&](auto t_) {
                    constexpr int t = decltype(t_)::value;
                    if constexpr (t >= kT) {
                        sums[t] = _mm512_setzero_si512();
                        mins[t] = _mm256_setzero_si256();
                    } else {
                        const BlockQ8_K& yb = a[t][i];
                        __m512i sumi = _mm512_setzero_si512();
                        unroll<4>([&](auto c_) {
                            constexpr int c = decltype(c_)::value;
                            const __m512i prods = _mm512_maddubs_epi16(u.q[c], load512(yb.qs + 64 * c));
                            sumi = scaled_sum<kVnni>(sumi, prods, u.sc[c]);
                        });
                        if constexpr (K::kMins) {
                            mins[t] = _mm256_madd_epi16(load256(yb.bsums), _mm512_castsi512_si256(u.corr));
                        } else {
                            sumi = scaled_sum<kVnni>(sumi, _mm512_zextsi256_si512(load256(yb.bsums)), u.corr);
                        }
                        sums[t] = sumi;
                    }
                });
                __m256 block = _mm256_mul_ps(_mm256_cvtepi32_ps(totals8(sums)), _mm256_set1_ps(u.d));
                if constexpr (K::kMins)
                    block = _mm256_fnmadd_ps(_mm256_set1_ps(u.dmin), _mm256_cvtepi32_ps(tree8(mins)), block);
                out = _mm256_fmadd_ps(block, token_d[i].v, out);
            }
            if (i1 < n_blocks) {
                state[r].v = out;
                continue;
            }
            alignas(32) float lanes[kTok];
            _mm256_store_ps(lanes, out);
            for (int t = 0; t < kT; ++t) y[t * y_stride + static_cast<size_t>(r)] = lanes[t];
        }
    }
}

template <typename K, bool kVnni>
void gemm(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride, float* y,
          size_t y_stride) {
    const auto* wb = as<uint8_t>(w);
    const auto* ab = as<uint8_t>(act);
    int t = 0;
    auto pass = [&](auto kind) {
        constexpr int kT = decltype(kind)::value;
        rows_times_tokens<K, kVnni, kT>(n, n_rows, wb, w_stride, ab + static_cast<size_t>(t) * act_stride, act_stride,
                                        y + static_cast<size_t>(t) * y_stride, y_stride);
        t += kT;
    };
    while (n_tok - t >= kTok) pass(std::integral_constant<int, kTok>{});
    if (n_tok - t >= 4) pass(std::integral_constant<int, 4>{});
    if (n_tok - t >= 2) pass(std::integral_constant<int, 2>{});
    if (n_tok - t >= 1) pass(std::integral_constant<int, 1>{});
}

template <bool kVnni>
GemmFn table(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::Q3_K:
            return gemm<Q3K, kVnni>;
        case GgmlType::Q5_K:
            return gemm<Q5K, kVnni>;
        case GgmlType::Q6_K:
            return gemm<Q6K, kVnni>;
        default:
            return iq::tiled_gemm(weight_type);  // the AVX2 kernels of dot_iq_avx2.h, compiled here
    }
}

}  // namespace

GemmFn tiled_order_avx512(GgmlType weight_type, bool vnni) {
    return vnni ? table<true>(weight_type) : table<false>(weight_type);
}

}  // namespace fitllm::quant::detail
