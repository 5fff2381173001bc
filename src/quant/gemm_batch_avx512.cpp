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
// tokens run in slabs of blocks, each row's 8 outputs kept in memory in between. That is the kernel
// without VNNI; with VNNI, Q3_K, Q5_K and Q6_K take rows 16 at a time in the lanes of vpdpbusd
// (gemm_lanes below). On Zen 4, in calls of 64 rows x 256 tokens as ops::matmul makes them, that
// measured 145-166 GMAC/s against 19-29 (Q5_K, Q6_K) and 72 (Q3_K) for the VNNI kernel above.

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

// ---- VNNI: 16 weight rows side by side (Q3_K, Q5_K, Q6_K) ----
// The kernel above unpacks a super-block for 8 tokens and reduces each token's 16 lanes every
// block; with VNNI a tile of 16 weight rows is instead unpacked once per call into lanes: dword
// lane r of a register holds 4 consecutive quants of row r, so vpdpbusd with 4 of a token's bytes
// broadcast (an embedded-broadcast memory operand) adds 4 products to each of the 16 rows at once,
// no reduction left. A sub-block's sums are scaled per row with vpmullo (the scales as dwords) and
// summed over the super-block; the float steps per block are then those of the reference on 16
// rows x 1 token per register, so the results are its bits. Q6_K's offset (q - 32) starts each
// sub-block's sum at -32 bsum (Q3_K's at -4 bsum); Q5_K's mins take one vpdpwssd per two
// sub-blocks (mins as words against the token's sub-block sums as words).
constexpr int kLaneRows = 16;

struct alignas(64) Vec {
    __m512i v;
};

// acc + the 4-byte dot products of u's unsigned bytes with the 4 signed bytes at p, broadcast to
// every lane. GCC 12 does not fold the broadcast into vpdpbusd's memory operand (embedded
// broadcast) and issues a separate vpbroadcastd per use; this writes the folded form.
[[gnu::always_inline]] inline __m512i dpbusd_bcst(__m512i acc, __m512i u, const int8_t* p) {
    asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*reinterpret_cast<const int32_t*>(p)));
    return acc;
}

// A tile's super-block in Vecs: 64 of quants (group g: elements 4g .. 4g + 3 of each row), then 16
// of what meta() gives per row, one dword each, transposed to one Vec per dword (the scales of the
// sub-blocks; Q5_K: then its mins as word pairs, d and dmin), then Q6_K's d. kTokWords: dwords per
// token and block that token_words lays out once per call.
struct LanesQ5K {
    using Block = BlockQ5_K;
    using Unpack = Q5K;
    static constexpr int kScales = 8, kMins = 4;
    static constexpr int kD = 64 + kScales + kMins;  // d, then dmin
    static constexpr bool kOwnD = false;
    static constexpr int kVecs = 64 + 16;
    static constexpr int kTokWords = 4;  // the token's sub-block sums (bsums in pairs) as word pairs
    // Dwords 0..7 the scales, 8..11 the mins as word pairs (2m low, 2m + 1 high), 12 d, 13 dmin.
    static __m512i meta(const Block& b) {
        const __m128i packed = q4k_scales_mins(b.scales);
        const __m256i scales = _mm256_cvtepu8_epi32(packed);
        const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(packed, 8));
        const __m128i d = _mm_castps_si128(_mm_setr_ps(f16(b.d), f16(b.dmin), 0.0f, 0.0f));
        const __m256i high = _mm256_set_m128i(d, mins);
        return _mm512_inserti64x4(_mm512_castsi256_si512(scales), high, 1);
    }
    static void token_words(const BlockQ8_K& y, int32_t* out) {
        const __m256i sums = _mm256_madd_epi16(load256(y.bsums), _mm256_set1_epi16(1));  // |sum| <= 4096
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_cvtepi32_epi16(sums));
    }
};

// Q6_K and Q3_K: sub-blocks of 16 with signed 8-bit scales, q in 0..63 (0..7) standing for
// q - kOffset; each sub-block's sum starts at -kOffset times the token's bsum.
template <typename B, typename U, int kShift>
struct LanesOffset {
    using Block = B;
    using Unpack = U;
    static constexpr int kScales = 16, kMins = 0;
    static constexpr int kD = 64 + kScales;
    static constexpr bool kOwnD = true;
    static constexpr int kVecs = 64 + 16 + 1;
    static constexpr int kTokWords = 16;  // -kOffset = -(1 << kShift) times the token's 16 bsums
    static __m512i meta(const Block& b) {
        if constexpr (std::is_same_v<Block, BlockQ3_K>)
            return _mm512_cvtepi8_epi32(q3k_scales(b.scales));
        else
            return _mm512_cvtepi8_epi32(load128(b.scales));
    }
    static void token_words(const BlockQ8_K& y, int32_t* out) {
        const __m512i bsums = _mm512_cvtepi16_epi32(load256(y.bsums));
        _mm512_storeu_si512(out, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(bsums, kShift)));
    }
};
using LanesQ6K = LanesOffset<BlockQ6_K, Q6K, 5>;
using LanesQ3K = LanesOffset<BlockQ3_K, Q3K, 2>;

// lanes[g] = dword g of each of rows[0..15], row r in lane r: a 16 x 16 transpose of dwords (pairs of
// rows within 128-bit lanes, then quads, then the 4 x 4 transpose of 128-bit lanes).
[[gnu::always_inline]] inline void transpose16(const __m512i* rows, __m512i* lanes) {
    __m512i a[16], b[16];
    for (int i = 0; i < 8; ++i) {
        a[2 * i] = _mm512_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);
    }
    // b[4j + e], 128-bit lane l: dword 4l + e of rows 4j .. 4j + 3.
    for (int j = 0; j < 4; ++j) {
        b[4 * j] = _mm512_unpacklo_epi64(a[4 * j], a[4 * j + 2]);
        b[4 * j + 1] = _mm512_unpackhi_epi64(a[4 * j], a[4 * j + 2]);
        b[4 * j + 2] = _mm512_unpacklo_epi64(a[4 * j + 1], a[4 * j + 3]);
        b[4 * j + 3] = _mm512_unpackhi_epi64(a[4 * j + 1], a[4 * j + 3]);
    }
    for (int e = 0; e < 4; ++e) {
        const __m512i c0 = _mm512_shuffle_i32x4(b[e], b[4 + e], 0x44), c1 = _mm512_shuffle_i32x4(b[e], b[4 + e], 0xEE);
        const __m512i c2 = _mm512_shuffle_i32x4(b[8 + e], b[12 + e], 0x44);
        const __m512i c3 = _mm512_shuffle_i32x4(b[8 + e], b[12 + e], 0xEE);
        lanes[e] = _mm512_shuffle_i32x4(c0, c2, 0x88);
        lanes[4 + e] = _mm512_shuffle_i32x4(c0, c2, 0xDD);
        lanes[8 + e] = _mm512_shuffle_i32x4(c1, c3, 0x88);
        lanes[12 + e] = _mm512_shuffle_i32x4(c1, c3, 0xDD);
    }
}

// Unpacks rows 0 .. rows - 1 (rows <= 16) of every block into tile (n_blocks * kVecs Vecs); lanes
// of missing rows are zero.
template <typename L>
void unpack_tile(int n_blocks, int rows, const uint8_t* w, size_t w_stride, Vec* tile) {
    using Block = typename L::Block;
    const Block* x[kLaneRows];
    for (int r = 0; r < rows; ++r) x[r] = as<Block>(w + static_cast<size_t>(r) * w_stride);
    alignas(64) Vec unpacked[5][kLaneRows];  // [c][row]: quants 64c .. 64c + 63; [4][row]: meta
    alignas(64) float d[kLaneRows] = {};
    if (rows < kLaneRows) std::memset(static_cast<void*>(unpacked), 0, sizeof(unpacked));
    for (int i = 0; i < n_blocks; ++i) {
        Vec* b = tile + static_cast<size_t>(i) * L::kVecs;
        for (int r = 0; r < rows; ++r) {
            const Unpacked u = L::Unpack::unpack(x[r][i]);
            for (int c = 0; c < 4; ++c) unpacked[c][r].v = u.q[c];
            unpacked[4][r].v = L::meta(x[r][i]);
            if constexpr (L::kOwnD) d[r] = f16(x[r][i].d);
        }
        for (int c = 0; c < 5; ++c) {
            __m512i in[kLaneRows], out[kLaneRows];
            for (int r = 0; r < kLaneRows; ++r) in[r] = unpacked[c][r].v;
            transpose16(in, out);
            for (int g = 0; g < kLaneRows; ++g) b[16 * c + g].v = out[g];
        }
        if constexpr (L::kOwnD) b[L::kD].v = _mm512_castps_si512(_mm512_load_ps(d));
    }
}

// One tile of 16 rows times kT tokens: y[t * y_stride + r] for r < rows.
template <typename L, int kT>
void tile_times_tokens(int n_blocks, int rows, const Vec* tile, const uint8_t* act, size_t act_stride,
                       const int32_t* words, float* y, size_t y_stride) {
    const BlockQ8_K* a[kT];
    const int32_t* tw[kT];
    for (int t = 0; t < kT; ++t) {
        a[t] = as<BlockQ8_K>(act + static_cast<size_t>(t) * act_stride);
        tw[t] = words + static_cast<size_t>(t) * n_blocks * L::kTokWords;
    }
    __m512 out[kT];
    unroll<kT>([&](auto t_) { out[decltype(t_)::value] = _mm512_setzero_ps(); });
    for (int i = 0; i < n_blocks; ++i) {
        const Vec* b = tile + static_cast<size_t>(i) * L::kVecs;
        const Vec* sc = b + 64;
        __m512i tot[kT];
        unroll<kT>([&](auto t_) { tot[decltype(t_)::value] = _mm512_setzero_si512(); });
        // 32 elements (8 groups of 4) a step: one sub-block of Q5_K, two of Q6_K.
        for (int s = 0; s < 8; ++s) {
            __m512i wq[8];
            unroll<8>([&](auto k_) {
                constexpr int k = decltype(k_)::value;
                wq[k] = b[8 * s + k].v;
            });
            unroll<kT>([&](auto t_) {
                constexpr int t = decltype(t_)::value;
                const int8_t* qs = a[t][i].qs + 32 * s;
                if constexpr (std::is_same_v<L, LanesQ5K>) {
                    __m512i acc0 = _mm512_setzero_si512(), acc1 = _mm512_setzero_si512();
                    unroll<4>([&](auto k_) {
                        constexpr int k = decltype(k_)::value;
                        acc0 = dpbusd_bcst(acc0, wq[k], qs + 4 * k);
                        acc1 = dpbusd_bcst(acc1, wq[4 + k], qs + 16 + 4 * k);
                    });
                    tot[t] = _mm512_add_epi32(tot[t], _mm512_mullo_epi32(_mm512_add_epi32(acc0, acc1), sc[s].v));
                } else {
                    const int32_t* off = tw[t] + static_cast<size_t>(i) * L::kTokWords + 2 * s;
                    __m512i acc0 = _mm512_set1_epi32(off[0]), acc1 = _mm512_set1_epi32(off[1]);
                    unroll<4>([&](auto k_) {
                        constexpr int k = decltype(k_)::value;
                        acc0 = dpbusd_bcst(acc0, wq[k], qs + 4 * k);
                        acc1 = dpbusd_bcst(acc1, wq[4 + k], qs + 16 + 4 * k);
                    });
                    tot[t] = _mm512_add_epi32(tot[t], _mm512_add_epi32(_mm512_mullo_epi32(acc0, sc[2 * s].v),
                                                                       _mm512_mullo_epi32(acc1, sc[2 * s + 1].v)));
                }
            });
        }
        const __m512 d = _mm512_castsi512_ps(b[L::kD].v);
        unroll<kT>([&](auto t_) {
            constexpr int t = decltype(t_)::value;
            __m512 block = _mm512_mul_ps(_mm512_cvtepi32_ps(tot[t]), d);
            if constexpr (L::kMins > 0) {
                const int32_t* yw = tw[t] + static_cast<size_t>(i) * L::kTokWords;
                __m512i mins = _mm512_setzero_si512();
                unroll<4>([&](auto m_) {
                    constexpr int m = decltype(m_)::value;
                    mins = _mm512_dpwssd_epi32(mins, b[64 + L::kScales + m].v, _mm512_set1_epi32(yw[m]));
                });
                const __m512 dmin = _mm512_castsi512_ps(b[L::kD + 1].v);
                block = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(mins), block);
            }
            out[t] = _mm512_fmadd_ps(block, _mm512_set1_ps(a[t][i].d), out[t]);
        });
    }
    const __mmask16 keep = static_cast<__mmask16>((1u << rows) - 1);
    unroll<kT>([&](auto t_) {
        constexpr int t = decltype(t_)::value;
        _mm512_mask_storeu_ps(y + t * y_stride, keep, out[t]);
    });
}

// A token's dwords (token_words) in a type of this file's own: std::vector<int32_t>'s out-of-line
// code, compiled here with AVX-512, could be the copy the linker keeps for every other file
// (DotIsolation.IsaFilesDefineNoSharedInlineFunctions).
struct TokenWord {
    int32_t v;
};
static_assert(sizeof(TokenWord) == sizeof(int32_t));

template <typename L>
void gemm_lanes(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride,
                float* y, size_t y_stride) {
    const int n_blocks = n / kQK;
    const auto* wb = as<uint8_t>(w);
    const auto* ab = as<uint8_t>(act);
    // Grow to the largest call this thread has seen; allocate nothing after that.
    static thread_local std::vector<Vec> tile;
    static thread_local std::vector<TokenWord> token_words;
    const size_t tile_size = static_cast<size_t>(n_blocks) * L::kVecs;
    if (tile.size() < tile_size) tile.resize(tile_size);
    const size_t n_words = static_cast<size_t>(n_tok) * n_blocks * L::kTokWords;
    if (token_words.size() < n_words) token_words.resize(n_words);
    int32_t* const words = &token_words.data()->v;
    for (int t = 0; t < n_tok; ++t) {
        const auto* yb = as<BlockQ8_K>(ab + static_cast<size_t>(t) * act_stride);
        for (int i = 0; i < n_blocks; ++i)
            L::token_words(yb[i], words + (static_cast<size_t>(t) * n_blocks + i) * L::kTokWords);
    }
    for (int r0 = 0; r0 < n_rows; r0 += kLaneRows) {
        const int rows = n_rows - r0 < kLaneRows ? n_rows - r0 : kLaneRows;
        unpack_tile<L>(n_blocks, rows, wb + static_cast<size_t>(r0) * w_stride, w_stride, tile.data());
        int t = 0;
        auto pass = [&](auto kind) {
            constexpr int kT = decltype(kind)::value;
            tile_times_tokens<L, kT>(n_blocks, rows, tile.data(), ab + static_cast<size_t>(t) * act_stride, act_stride,
                                     words + static_cast<size_t>(t) * n_blocks * L::kTokWords,
                                     y + static_cast<size_t>(t) * y_stride + r0, y_stride);
            t += kT;
        };
        while (n_tok - t >= kTok) pass(std::integral_constant<int, kTok>{});
        if (n_tok - t >= 4) pass(std::integral_constant<int, 4>{});
        if (n_tok - t >= 2) pass(std::integral_constant<int, 2>{});
        if (n_tok - t >= 1) pass(std::integral_constant<int, 1>{});
    }
}

template <bool kVnni>
GemmFn table(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::Q3_K:
            return kVnni ? gemm_lanes<LanesQ3K> : gemm<Q3K, kVnni>;
        case GgmlType::Q5_K:
            return kVnni ? gemm_lanes<LanesQ5K> : gemm<Q5K, kVnni>;
        case GgmlType::Q6_K:
            return kVnni ? gemm_lanes<LanesQ6K> : gemm<Q6K, kVnni>;
        default:
            return iq::tiled_gemm(weight_type);  // the AVX2 kernels of dot_iq_avx2.h, compiled here
    }
}

}  // namespace

GemmFn tiled_order_avx512(GgmlType weight_type, bool vnni) {
    return vnni ? table<true>(weight_type) : table<false>(weight_type);
}

}  // namespace fitllm::quant::detail
