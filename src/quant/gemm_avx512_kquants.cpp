// AVX-512 (F, BW, VL; VNNI where kVnni) tiled kernels of the k-quants with Q8_K activations.
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -mf16c; the kVnni = false
// kernels use no VNNI instruction. See dot_kernels.h for the rules this file follows.
//
// The arithmetic is that of dot_avx512_kquants.cpp: 64 elements per register, maddubs(unsigned
// quants, y) gives 16-bit pair sums that are scaled by the 16-bit sub-block scales and summed to
// 32 bits (vpdpwssd with VNNI, madd + add without); offsets and mins go through Q8_K's bsums.
// What the tiling adds: a weight super-block is unpacked once (quants into four registers, the
// scales permuted into four more, mins or offsets ready for the bsums) and then multiplied with the
// same super-block of up to kTok tokens, whose float accumulators stay in registers. Work that does
// not depend on the pass is hoisted out of it: the 6-bit scales and mins of Q4_K / Q5_K are decoded
// once per call (Decoded), the tokens' bsums and scales laid out for the mins once per pass
// (TokenPair). On Zen 5 each took about 5% off a 2048-wide Q4_K tile (bench/matmul_bench). Rows
// wider than L1 holds for a pass's tokens run in slabs of blocks (kSlabBytes): about 10% off a
// 5632-wide tile.

// GCC 12's AVX-512 headers trip its own uninitialized-variable warnings (the _mm512_undefined_*
// helpers initialize a variable with itself); the warnings point into the header, so silence them there.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "quant/blocks.h"
#include "quant/gemm_kernels.h"
#include "quant/kquant_avx512.h"
#include "quant/kquant_serial.h"
#include "quant/unroll.h"

namespace fitllm::quant::detail {
namespace {

// Tokens per pass over the weight rows: 8 float accumulators (plus 8 for the mins) next to the
// eight registers of an unpacked super-block. Remainders run as passes of 4, 2 and 1.
constexpr int kTok = 8;

// ---- One weight super-block, unpacked ----
// q[c] holds elements 64c .. 64c + 63 as unsigned bytes, sc[c] their sub-block scales as words
// lined up with maddubs' pair sums. Types with mins (Q2_K, Q4_K, Q5_K) keep them as 16 words to
// madd with the 16 bsums; types with an offset (Q3_K, Q6_K) fold it into the integer sum as
// -offset * scale_j * bsum_j (corr: 16 words, zero in the high 256 bits).
struct Unpacked {
    __m512i q[4];
    __m512i sc[4];
    __m512i corr;  // mins (in both halves of 256 bits), or -offset * scales (low 256 bits)
    float d, dmin;
};

// Q4_K / Q5_K pack their scales and mins in 6 bits, which takes more instructions to take apart
// than the quants. A kernel call decodes them once per row and super-block into Decoded (gemm
// below) rather than once per pass of tokens: 128 bytes each, so a tile of 64 rows of 2048 keeps
// them in 64 KiB.
struct alignas(64) Decoded {
    __m512i mins;    // each min twice, in both halves
    __m256i scales;  // words 0..7: the scales of the sub-blocks of 32
    float d, dmin;
};

template <typename B>
struct Q45K {
    using Block = B;
    static constexpr bool kMins = true;
    static constexpr int kPairOffset = 0;
    static constexpr bool kDecoded = true;
    static constexpr bool kFive = std::is_same_v<Block, BlockQ5_K>;
    static Decoded decode(const Block& b) {
        Decoded s;
        const __m128i packed = q4k_scales_mins(b.scales);
        // Each min twice: sub-block j of 32 covers bsums 2j and 2j + 1.
        const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(packed, 8));
        const __m256i mins_twice = _mm256_set_m128i(_mm_unpackhi_epi16(mins, mins), _mm_unpacklo_epi16(mins, mins));
        s.mins = _mm512_inserti64x4(_mm512_castsi256_si512(mins_twice), mins_twice, 1);
        s.scales = _mm256_castsi128_si256(_mm_cvtepu8_epi16(packed));
        s.d = f16(b.d);
        s.dmin = f16(b.dmin);
        return s;
    }
    static Unpacked unpack(const Block& b, const Decoded& s) {
        Unpacked u;
        u.corr = s.mins;
        const __m512i scales = _mm512_castsi256_si512(s.scales);
        const __m512i nibble = _mm512_set1_epi8(0x0F), nibble_shift = halves64(0, 4);
        __m512i high_bits;
        if constexpr (kFive) high_bits = twice(b.qh);
        unroll<4>([&](auto c_) {
            constexpr int c = decltype(c_)::value;
            __m512i q = _mm512_and_si512(_mm512_srlv_epi64(twice(b.qs + 32 * c), nibble_shift), nibble);
            if constexpr (kFive) {
                const __mmask64 fifth = _mm512_test_epi8_mask(high_bits, halves8(1 << (2 * c), 1 << (2 * c + 1)));
                q = _mm512_mask_add_epi8(q, fifth, q, _mm512_set1_epi8(16));
            }
            u.q[c] = q;
            u.sc[c] = two_scales<2 * c, 2 * c + 1>(scales);
        });
        u.d = s.d;
        u.dmin = s.dmin;
        return u;
    }
};

struct Q2K {
    static constexpr bool kMins = true;
    static constexpr int kPairOffset = 0;
    static constexpr bool kDecoded = false;
    using Block = BlockQ2_K;
    static Unpacked unpack(const BlockQ2_K& b) {
        Unpacked u;
        const __m128i packed = load128(b.scales);
        const __m128i nibble = _mm_set1_epi8(0x0F);
        const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(packed, nibble)));
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), nibble));
        u.corr = _mm512_inserti64x4(_mm512_castsi256_si512(mins), mins, 1);
        const __m512i two_bits = _mm512_set1_epi8(3);
        unroll<2>([&](auto h_) {
            constexpr int h = decltype(h_)::value;
            const __m512i q = twice(b.qs + 32 * h);
            u.q[2 * h] = _mm512_and_si512(_mm512_srlv_epi64(q, halves64(0, 2)), two_bits);      // groups 0, 1
            u.q[2 * h + 1] = _mm512_and_si512(_mm512_srlv_epi64(q, halves64(4, 6)), two_bits);  // groups 2, 3
            u.sc[2 * h] = four_scales<8 * h>(sc);
            u.sc[2 * h + 1] = four_scales<8 * h + 4>(sc);
        });
        u.d = f16(b.d);
        u.dmin = f16(b.dmin);
        return u;
    }
};

// The offset correction of Q3_K / Q6_K: -offset * scales as words in the low 256 bits.
template <int kShift>
__m512i offset_words(__m256i scales) {
    return _mm512_zextsi256_si512(_mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(scales, kShift)));
}

struct Q3K {
    static constexpr bool kMins = false;
    // q in 0..7 stands for q - 4, taken off each pair sum (4 y) so that it lands in llama.cpp's lanes.
    static constexpr int kPairOffset = 4;
    static constexpr bool kDecoded = false;
    using Block = BlockQ3_K;
    static Unpacked unpack(const BlockQ3_K& b) {
        Unpacked u;
        const __m256i scales = _mm256_cvtepi8_epi16(q3k_scales(b.scales));
        u.corr = _mm512_setzero_si512();  // the offset goes inside the pairs (kPairOffset)
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
    static constexpr bool kMins = false;
    static constexpr int kPairOffset = 0;
    static constexpr bool kDecoded = false;
    using Block = BlockQ6_K;
    static Unpacked unpack(const BlockQ6_K& b) {
        Unpacked u;
        const __m256i scales = _mm256_cvtepi8_epi16(load128(b.scales));
        u.corr = offset_words<5>(scales);  // q in 0..63 stands for q - 32
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

// ---- The tile: every row of w times kT tokens ----
// The most bytes of activations (and token pairs) one slab of a pass reads: most of a 48 KiB L1.
constexpr size_t kSlabBytes = 40 * 1024;

// The bsums of two tokens' Q8_K blocks side by side, as the mins of K::kMins types take them
// (token 2p in the low 256 bits, 2p + 1 in the high ones): the same for every weight row, so a
// pass lays them out once.
struct alignas(64) TokenPair {
    __m512i bsums;
};

// The float steps are those of the dot kernel (dot_avx512_kquants.cpp, in the order dot_ref.cpp
// defines for the type), so the results are bit for bit the same:
//   kLanes8 (Q3_K, Q5_K, Q6_K): the 16 lanes of sumi folded to llama.cpp's 8 (lanes l and l + 8 hold
//     parts of lane l), one 8-lane fma a block; Q5_K's mins in a scalar chain (summs) added at the end.
//   kSerial (Q2_K, Q4_K): the block's integer sum and mins sum, one fma each a block (lanes 0 and 1
//     of a 128-bit chain), their difference at the end.
enum class Order { kLanes8, kSerial };
template <typename K>
constexpr Order order_of() {
    if constexpr (std::is_same_v<K, Q3K> || std::is_same_v<K, Q6K> || std::is_same_v<K, Q45K<BlockQ5_K>>)
        return Order::kLanes8;
    else
        return Order::kSerial;
}

// The 8 int32 lanes of v summed (exact, so any order gives the dot's integer).
int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

// The Q8_K scales of 8 tokens' blocks, token t in lane t.
struct alignas(32) TokenScales {
    __m256 d;
};

// tree8(v)[t] = the sum of the 8 lanes of v[t] (exact): the integer totals of 8 tokens, one per lane.
__m256i tree8(const __m256i* v) {
    const __m256i q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    const __m128i t03 = _mm_add_epi32(_mm256_castsi256_si128(q0), _mm256_extracti128_si256(q0, 1));
    const __m128i t47 = _mm_add_epi32(_mm256_castsi256_si128(q1), _mm256_extracti128_si256(q1, 1));
    return _mm256_set_m128i(t47, t03);
}

__m256i low256(__m512i v) {
    return _mm512_castsi512_si256(v);
}
__m256i high256(__m512i v) {
    return _mm512_extracti64x4_epi64(v, 1);
}

template <typename K, bool kVnni, int kT>
void rows_times_tokens(int n, int n_rows, const uint8_t* w, size_t w_stride, const Decoded* decoded, const uint8_t* act,
                       size_t act_stride, float* y, size_t y_stride) {
    static_assert(kT == 1 || kT % 2 == 0);
    constexpr Order kOrder = order_of<K>();
    constexpr int kPairs = (kT + 1) / 2;
    using Block = typename K::Block;
    const BlockQ8_K* a[kT];
    for (int t = 0; t < kT; ++t) a[t] = as<BlockQ8_K>(act + static_cast<size_t>(t) * act_stride);
    // kSerial passes of 8 tokens run the serial steps of the 8 tokens side by side, token t in lane
    // t (the same float operations per token): the block's 8 integer totals come out of one
    // reduction tree, and the tokens' d are laid out once per pass.
    constexpr bool kBatched = kOrder == Order::kSerial && kT == 8;
    const TokenScales* token_d = nullptr;
    if constexpr (kBatched) {
        static thread_local std::vector<TokenScales> table;
        if (table.size() < static_cast<size_t>(n / kQK)) table.resize(n / kQK);
        for (int i = 0; i < n / kQK; ++i) {
            table[i].d =
                _mm256_setr_ps(a[0][i].d, a[1][i].d, a[2][i].d, a[3][i].d, a[4][i].d, a[5][i].d, a[6][i].d, a[7][i].d);
        }
        token_d = table.data();
    }
    const TokenPair* pairs = nullptr;
    if constexpr (K::kMins) {
        // Grows to the largest pass this thread has seen; allocates nothing after that.
        static thread_local std::vector<TokenPair> table;
        const size_t n_pairs = static_cast<size_t>(n / kQK) * kPairs;
        if (table.size() < n_pairs) table.resize(n_pairs);
        for (int i = 0; i < n / kQK; ++i) {
            for (int p = 0; p < kPairs; ++p) {
                const BlockQ8_K& y0 = a[2 * p][i];
                const BlockQ8_K& y1 = a[kT == 1 ? 0 : 2 * p + 1][i];
                table[i * kPairs + p].bsums =
                    _mm512_inserti64x4(_mm512_castsi256_si512(load256(y0.bsums)), load256(y1.bsums), 1);
            }
        }
        pairs = table.data();
    }
    // Slabs of blocks whose activations (and token pairs) fit in L1 together: all rows run over
    // one slab before the next, the accumulators kept in `state` in between. The float steps per
    // lane stay the same and in the same order.
    const int n_blocks = n / kQK;
    constexpr size_t kBlockBytes = kT * sizeof(BlockQ8_K) + (K::kMins ? kPairs * sizeof(TokenPair) : 0);
    const int n_slabs = static_cast<int>((n_blocks * kBlockBytes + kSlabBytes - 1) / kSlabBytes);
    const int slab = (n_blocks + n_slabs - 1) / n_slabs;
    constexpr bool kSumms = kOrder == Order::kLanes8 && K::kMins;  // Q5_K's second chain
    constexpr int kState = kSumms ? 2 * kT : kT;
    float* state = nullptr;  // kState registers of 16 floats per row
    if (n_slabs > 1) {
        static thread_local std::vector<float> buffer;
        const size_t size = static_cast<size_t>(n_rows) * kState * 16;
        if (buffer.size() < size) buffer.resize(size);
        state = buffer.data();
    }
    for (int i0 = 0; i0 < n_blocks; i0 += slab) {
        const int i1 = std::min(n_blocks, i0 + slab);
        for (int r = 0; r < n_rows; ++r) {
            const Block* x = as<Block>(w + static_cast<size_t>(r) * w_stride);
            // acc[t]: kLanes8 the low 8 lanes; kSerial lanes 0 (sum) and 1 (mins).
            // summs[t]: lane 0, Q5_K's mins.
            __m512 acc[kT];
            __m512 summs[kSumms ? kT : 1];
            float* row_state = state != nullptr ? state + static_cast<size_t>(r) * kState * 16 : nullptr;
            if (i0 == 0) {
                unroll<kT>([&](auto t_) { acc[decltype(t_)::value] = _mm512_setzero_ps(); });
                if constexpr (kSumms) unroll<kT>([&](auto t_) { summs[decltype(t_)::value] = _mm512_setzero_ps(); });
            } else {
                unroll<kT>([&](auto t_) {
                    constexpr int t = decltype(t_)::value;
                    acc[t] = _mm512_loadu_ps(row_state + 16 * t);
                });
                if constexpr (kSumms) {
                    unroll<kT>([&](auto t_) {
                        constexpr int t = decltype(t_)::value;
                        summs[t] = _mm512_loadu_ps(row_state + 16 * (kT + t));
                    });
                }
            }
            for (int i = i0; i < i1; ++i) {
                Unpacked u;
                if constexpr (K::kDecoded)
                    u = K::unpack(x[i], decoded[static_cast<size_t>(r) * (n / kQK) + i]);
                else
                    u = K::unpack(x[i]);
                // The mins sums of token pairs: token 2p in the low 256 bits, 2p + 1 in the high ones.
                __m512i min_sums[kPairs];
                if constexpr (K::kMins) {
                    unroll<kPairs>([&](auto p_) {
                        constexpr int p = decltype(p_)::value;
                        min_sums[p] = _mm512_madd_epi16(pairs[i * kPairs + p].bsums, u.corr);
                    });
                }
                __m256i batch_sums[kBatched ? kT : 1], batch_mins[kBatched ? kT : 1];
                unroll<kT>([&](auto t_) {
                    constexpr int t = decltype(t_)::value;
                    const BlockQ8_K& yb = a[t][i];
                    __m512i sumi = _mm512_setzero_si512();
                    unroll<4>([&](auto c_) {
                        constexpr int c = decltype(c_)::value;
                        const __m512i yq = load512(yb.qs + 64 * c);
                        __m512i prods = _mm512_maddubs_epi16(u.q[c], yq);
                        if constexpr (K::kPairOffset != 0) {
                            prods = _mm512_sub_epi16(prods, _mm512_maddubs_epi16(_mm512_set1_epi8(K::kPairOffset), yq));
                        }
                        sumi = scaled_sum<kVnni>(sumi, prods, u.sc[c]);
                    });
                    if constexpr (!K::kMins && K::kPairOffset == 0)
                        sumi = scaled_sum<kVnni>(sumi, _mm512_zextsi256_si512(load256(yb.bsums)), u.corr);
                    {
                        const __m256i sums8 = _mm256_add_epi32(low256(sumi), high256(sumi));
                        if constexpr (kOrder == Order::kLanes8) {
                            const __m256 lanes = _mm256_fmadd_ps(_mm256_set1_ps(yb.d * u.d), _mm256_cvtepi32_ps(sums8),
                                                                 _mm512_castps512_ps256(acc[t]));
                            acc[t] = _mm512_castps256_ps512(lanes);
                            if constexpr (kSumms) {
                                const __m256i mins8 = t % 2 == 0 ? low256(min_sums[t / 2]) : high256(min_sums[t / 2]);
                                const __m128 mins_f = _mm_cvtepi32_ps(_mm_set1_epi32(hsum_epi32(mins8)));
                                summs[t] = _mm512_castps128_ps512(
                                    _mm_fmadd_ss(_mm_set_ss(-yb.d * u.dmin), mins_f, _mm512_castps512_ps128(summs[t])));
                            }
                        } else {
                            const __m256i mins8 = t % 2 == 0 ? low256(min_sums[t / 2]) : high256(min_sums[t / 2]);
                            if constexpr (kBatched) {
                                batch_sums[t] = sums8;
                                batch_mins[t] = mins8;
                            } else {
                                acc[t] = _mm512_castps128_ps512(
                                    serial_step(_mm512_castps512_ps128(acc[t]), sums8, mins8, u.d, u.dmin, yb.d));
                            }
                        }
                    }
                });
                if constexpr (kBatched) {  // acc[0]: the 8 tokens' sums, acc[1]: their mins
                    const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(u.d), token_d[i].d);
                    const __m256 scale_min = _mm256_mul_ps(_mm256_set1_ps(u.dmin), token_d[i].d);
                    acc[0] = _mm512_castps256_ps512(
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(tree8(batch_sums)), scale, _mm512_castps512_ps256(acc[0])));
                    acc[1] = _mm512_castps256_ps512(_mm256_fmadd_ps(_mm256_cvtepi32_ps(tree8(batch_mins)), scale_min,
                                                                    _mm512_castps512_ps256(acc[1])));
                }
            }
            if (i1 < n_blocks) {
                unroll<kT>([&](auto t_) {
                    constexpr int t = decltype(t_)::value;
                    _mm512_storeu_ps(row_state + 16 * t, acc[t]);
                });
                if constexpr (kSumms) {
                    unroll<kT>([&](auto t_) {
                        constexpr int t = decltype(t_)::value;
                        _mm512_storeu_ps(row_state + 16 * (kT + t), summs[t]);
                    });
                }
                continue;
            }
            if constexpr (kBatched) {
                alignas(32) float sums[8];
                _mm256_store_ps(sums, _mm256_sub_ps(_mm512_castps512_ps256(acc[0]), _mm512_castps512_ps256(acc[1])));
                for (int t = 0; t < kT; ++t) y[t * y_stride + static_cast<size_t>(r)] = sums[t];
                continue;
            }
            unroll<kT>([&](auto t_) {
                constexpr int t = decltype(t_)::value;
                float sum;
                if constexpr (kOrder == Order::kLanes8) {
                    sum = hsum(_mm512_castps512_ps256(acc[t]));
                    if constexpr (kSumms) sum += _mm_cvtss_f32(_mm512_castps512_ps128(summs[t]));
                } else {
                    const __m128 s = _mm512_castps512_ps128(acc[t]);
                    sum = _mm_cvtss_f32(_mm_sub_ss(s, _mm_movehdup_ps(s)));
                }
                y[t * y_stride + static_cast<size_t>(r)] = sum;
            });
        }
    }
}

template <typename K, bool kVnni>
void gemm(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride, float* y,
          size_t y_stride) {
    const auto* wb = as<uint8_t>(w);
    const auto* ab = as<uint8_t>(act);
    const Decoded* decoded = nullptr;
    if constexpr (K::kDecoded) {
        // Grows to the largest tile this thread has seen; allocates nothing after that.
        static thread_local std::vector<Decoded> buffer;
        const size_t n_blocks = static_cast<size_t>(n / kQK);
        if (buffer.size() < n_blocks * static_cast<size_t>(n_rows)) buffer.resize(n_blocks * n_rows);
        for (int r = 0; r < n_rows; ++r) {
            const auto* x = as<typename K::Block>(wb + static_cast<size_t>(r) * w_stride);
            for (size_t i = 0; i < n_blocks; ++i) buffer[r * n_blocks + i] = K::decode(x[i]);
        }
        decoded = buffer.data();
    }
    int t = 0;
    auto pass = [&](auto kind) {
        constexpr int kT = decltype(kind)::value;
        const uint8_t* a = ab + static_cast<size_t>(t) * act_stride;
        float* out = y + static_cast<size_t>(t) * y_stride;
        rows_times_tokens<K, kVnni, kT>(n, n_rows, wb, w_stride, decoded, a, act_stride, out, y_stride);
        t += kT;
    };
    for (; n_tok - t >= kTok;) pass(std::integral_constant<int, kTok>{});
    if (n_tok - t >= 4) pass(std::integral_constant<int, 4>{});
    if (n_tok - t >= 2) pass(std::integral_constant<int, 2>{});
    if (n_tok - t >= 1) pass(std::integral_constant<int, 1>{});
}

template <bool kVnni>
GemmKernel table(GgmlType weight_type) {
    GemmKernel k;
    switch (weight_type) {
        case GgmlType::Q2_K:
            k.fn = gemm<Q2K, kVnni>;
            break;
        case GgmlType::Q3_K:
            k.fn = gemm<Q3K, kVnni>;
            break;
        case GgmlType::Q4_K:
            k.fn = gemm<Q45K<BlockQ4_K>, kVnni>;
            break;
        case GgmlType::Q5_K:
            k.fn = gemm<Q45K<BlockQ5_K>, kVnni>;
            break;
        case GgmlType::Q6_K:
            k.fn = gemm<Q6K, kVnni>;
            break;
        default:
            return k;
    }
    k.dot_order = true;
    k.row_tile = 1;
    k.tok_tile = kTok;
    return k;
}

}  // namespace

GemmKernel gemm_avx512_kquants(GgmlType weight_type, bool vnni) {
    return vnni ? table<true>(weight_type) : table<false>(weight_type);
}

}  // namespace fitllm::quant::detail
