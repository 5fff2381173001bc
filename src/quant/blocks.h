#pragma once
// The block layouts of ggml's quantized types, byte for byte as GGUF files store them, and the
// scalar half-precision conversions used by the reference kernels.
//
// A block holds block_elements() weights (32 for the legacy types, 256 = kQK for the k-quants)
// as small integers plus one or more scales. Scales are IEEE half (fp16) unless noted. The
// comments give the value of element i of a block; dequantize.cpp is the executable version.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "quant/ggml_type.h"
#include "quant/iq_grids.h"

namespace fitllm::quant {

inline constexpr int kQK = 256;  // elements of a k-quant super-block (ggml's QK_K)

// Q4_0: x[i] = d * (q[i] - 8), q 4-bit. Element i < 16 is the low nibble of qs[i],
// element i >= 16 the high nibble of qs[i - 16].
struct BlockQ4_0 {
    uint16_t d;
    uint8_t qs[16];
};

// Q4_1: x[i] = d * q[i] + m, nibbles as in Q4_0.
struct BlockQ4_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qs[16];
};

// Q5_0: x[i] = d * (q[i] - 16), q 5-bit: the nibble as in Q4_0, bit 4 is bit i of qh (little endian).
struct BlockQ5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[16];
};

// Q5_1: x[i] = d * q[i] + m, q as in Q5_0.
struct BlockQ5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[16];
};

// Q8_0: x[i] = d * qs[i].
struct BlockQ8_0 {
    uint16_t d;
    int8_t qs[32];
};

// Q8_1: x[i] = d * qs[i]; s = d * sum(qs) (rounded to fp16), for the Q4_1 / Q5_1 dots.
struct BlockQ8_1 {
    uint16_t d;
    uint16_t s;
    int8_t qs[32];
};

// IQ4_NL: x[i] = d * kValuesIQ4NL[q[i]], q a 4-bit index placed as the nibbles of Q4_0. The 16
// values (ggml's kvalues_iq4nl) are denser near zero, fitted to the bell shape of weights and
// K / V vectors; the dots look them up with one pshufb.
constexpr int8_t kValuesIQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
struct BlockIQ4_NL {
    uint16_t d;
    uint8_t qs[16];
};

// IQ4_XS: 8 sub-blocks of 32, each an IQ4_NL block whose scale is d * (ls - 32), ls 6-bit: low 4
// bits in scales_l[ib / 2] (nibble ib % 2), high 2 bits at bits 2 ib of scales_h. Element
// 32 ib + l is the low (l < 16) or high nibble of qs[16 ib + l % 16], an index into kValuesIQ4NL.
struct BlockIQ4_XS {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[kQK / 64];
    uint8_t qs[kQK / 2];
};

// TQ1_0 (ternary, 1.69 bits): x = d * (t - 1), t a trit 0..2. A byte q holds 5 trits (4 in qh) as
// the base-3 fraction q / 256 (ceil(value * 256 / 243)); trit n of q is ((q * 3^n mod 256) * 3) >> 8.
// Element e < 160 is trit e / 32 of qs[e % 32]; 160 <= e < 240 trit (e - 160) / 16 of
// qs[32 + e % 16]; e >= 240 trit (e - 240) / 4 of qh[e % 4].
struct BlockTQ1_0 {
    uint8_t qs[(kQK - 4 * kQK / 64) / 5];
    uint8_t qh[kQK / 64];
    uint16_t d;
};

// TQ2_0 (ternary, 2.06 bits): x = d * (q - 1), q 2-bit (3 decodes to 2 * d). Element e is bits
// 2 ((e / 32) % 4) of qs[32 (e / 128) + e % 32].
struct BlockTQ2_0 {
    uint8_t qs[kQK / 4];
    uint16_t d;
};

// MXFP4 (OCP microscaling FP4): x = 2^(e - 127) * e2m1(q). ggml keeps the e2m1 values doubled as
// integers (kValuesMXFP4) and halves the scale instead (mxfp4_scale_half). Element l < 16 is the
// low nibble of qs[l], element l >= 16 the high nibble of qs[l - 16].
constexpr int8_t kValuesMXFP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
struct BlockMXFP4 {
    uint8_t e;
    uint8_t qs[16];
};

// ---- i-quants on lattice codebooks (grids in iq_grids.h) ----
// A super-block of 256 has 8 sub-blocks of 32, each made of groups of 8 (IQ2, IQ1) or 4 (IQ3)
// values read from a grid point, with per-value signs where the grid holds magnitudes.

// IQ1_S (1.56 bits): x = d (2 s + 1) (g + delta), g in {-1, 0, 1} from kIq1sGrid, delta = -1/8
// where bit 15 of qh[ib] is set, +1/8 otherwise; s = bits 12..14 of qh[ib]. Group l of sub-block
// ib is point qs[4 ib + l] | ((qh[ib] >> 3 l) & 7) << 8.
struct BlockIQ1_S {
    uint16_t d;
    uint8_t qs[kQK / 8];
    uint16_t qh[kQK / 32];
};

// IQ1_M (1.75 bits): no d field: the fp16 scale is the top nibbles of the four little-endian u16
// words w0..w3 of scales (w0's the lowest). x = d (2 s + 1) (g + delta): group l of sub-block ib is
// point qs[4 ib + l] | (n & 7) << 8, n the nibble l % 2 of qh[2 ib + l / 2], delta -1/8 where n & 8;
// s is 3 bits at 6 (ib % 2) (values 0..15) or 6 (ib % 2) + 3 (16..31) of w[ib / 2].
struct BlockIQ1_M {
    uint8_t qs[kQK / 8];
    uint8_t qh[kQK / 16];
    uint8_t scales[kQK / 32];
};

// IQ2_XXS (2.06 bits): x = d (0.5 + s) / 4 * sign * kIq2xxsGrid[q]. Sub-block ib: u32 w0, w1 =
// bytes 8 ib .. 8 ib + 7 of qs; the bytes of w0 are the 4 grid points (8 values each); group l
// takes its signs from kIqSigns[(w1 >> 7 l) & 127]; s = w1 >> 28.
struct BlockIQ2_XXS {
    uint16_t d;
    uint16_t qs[kQK / 8];
};

// IQ2_XS (2.31 bits): as IQ2_XXS but each group l of sub-block ib is q = qs[4 ib + l]: point q & 511,
// signs kIqSigns[q >> 9]; values 0..15 take s = low nibble of scales[ib], 16..31 the high one.
struct BlockIQ2_XS {
    uint16_t d;
    uint16_t qs[kQK / 8];
    uint8_t scales[kQK / 32];
};

// IQ2_S (2.56 bits): group l of sub-block ib: point qs[4 ib + l] | ((qh[ib] >> 2 l) & 3) << 8 of
// kIq2sGrid, negated where bits of qs[32 + 4 ib + l] are set; scales as IQ2_XS.
struct BlockIQ2_S {
    uint16_t d;
    uint8_t qs[kQK / 4];
    uint8_t qh[kQK / 32];
    uint8_t scales[kQK / 32];
};

// IQ3_XXS (3.06 bits): x = d (0.5 + s) / 2 * sign * kIq3xxsGrid[q]. Sub-block ib: grid points
// qs[8 ib .. 8 ib + 7] (4 values each); u32 w = bytes 64 + 4 ib of qs: s = w >> 28, group l of 8
// values takes its signs from kIqSigns[(w >> 7 l) & 127] (bit j negates value j).
struct BlockIQ3_XXS {
    uint16_t d;
    uint8_t qs[3 * kQK / 8];
};

// IQ3_S (3.44 bits): x = d (1 + 2 s) * sign * kIq3sGrid[q]. Sub-block ib: point k < 8 is
// qs[8 ib + k] | bit k of qh[ib] << 8; value 8 l + j is negated by bit j of signs[4 ib + l];
// s = nibble ib % 2 of scales[ib / 2].
struct BlockIQ3_S {
    uint16_t d;
    uint8_t qs[kQK / 4];
    uint8_t qh[kQK / 32];
    uint8_t signs[kQK / 8];
    uint8_t scales[kQK / 64];
};

// Q2_K: 16 sub-blocks of 16. x = d * (scales[j] & 15) * q - dmin * (scales[j] >> 4), q 2-bit.
// Element e = 128 * h + 32 * g + l (h < 2, g < 4, l < 32) is bits 2g..2g+1 of qs[32 * h + l],
// in sub-block j = 8 * h + 2 * g + l / 16.
struct BlockQ2_K {
    uint8_t scales[kQK / 16];
    uint8_t qs[kQK / 4];
    uint16_t d;
    uint16_t dmin;
};

// Q3_K: 16 sub-blocks of 16. x = d * (s[j] - 32) * (q - 4), s 6-bit, q 3-bit.
// The low 2 bits of q are placed as in Q2_K; bit 2 is bit 4h + g of hmask[l].
// s[j]: low 4 bits = j < 8 ? scales[j] & 15 : scales[j - 8] >> 4,
//       high 2 bits = bits 2 * (j / 4) of scales[8 + j % 4].
struct BlockQ3_K {
    uint8_t hmask[kQK / 8];
    uint8_t qs[kQK / 4];
    uint8_t scales[12];
    uint16_t d;
};

// Q4_K: 8 sub-blocks of 32. x = d * sc[j] * q - dmin * mn[j], sc and mn 6-bit, q 4-bit.
// Element e = 64 * c + 32 * half + l is the low (half 0) or high (half 1) nibble of
// qs[32 * c + l], in sub-block j = 2 * c + half. sc/mn are packed in scales, see unpack below.
struct BlockQ4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qs[kQK / 2];
};

// Q5_K: as Q4_K with a 5th bit: bit j of qh[l] for element 32 * j + l.
struct BlockQ5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[kQK / 8];
    uint8_t qs[kQK / 2];
};

// Q6_K: 16 sub-blocks of 16. x = d * scales[j] * (q - 32), q 6-bit, scales signed 8-bit.
// Element e = 128 * h + 32 * g + l (h < 2, g < 4, l < 32): low 4 bits are the low (g < 2) or
// high (g >= 2) nibble of ql[64 * h + 32 * (g % 2) + l], high 2 bits are bits 2g..2g+1 of
// qh[32 * h + l]; sub-block j = e / 16.
struct BlockQ6_K {
    uint8_t ql[kQK / 2];
    uint8_t qh[kQK / 4];
    int8_t scales[kQK / 16];
    uint16_t d;
};

// Q8_K: the activation format of the k-quant dots. x[i] = d * qs[i] with d a float;
// bsums[j] = sum of qs[16 j .. 16 j + 15].
struct BlockQ8_K {
    float d;
    int8_t qs[kQK];
    int16_t bsums[kQK / 16];
};

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockIQ4_NL) == 18 && sizeof(BlockIQ4_XS) == 136);
static_assert(sizeof(BlockTQ1_0) == 54 && sizeof(BlockTQ2_0) == 66 && sizeof(BlockMXFP4) == 17);
static_assert(sizeof(BlockIQ3_XXS) == 98 && sizeof(BlockIQ3_S) == 110);
static_assert(sizeof(BlockIQ1_S) == 50 && sizeof(BlockIQ1_M) == 56);
static_assert(sizeof(BlockIQ2_XXS) == 66 && sizeof(BlockIQ2_XS) == 74 && sizeof(BlockIQ2_S) == 82);

// The block struct of each type, and a compile-time check against the type table of ggml_type.cpp
// (which tests check against PyPI's gguf).
template <GgmlType T>
struct BlockOf;
template <>
struct BlockOf<GgmlType::Q4_0> {
    using type = BlockQ4_0;
    static constexpr int elements = 32;
};
template <>
struct BlockOf<GgmlType::Q4_1> {
    using type = BlockQ4_1;
    static constexpr int elements = 32;
};
template <>
struct BlockOf<GgmlType::Q5_0> {
    using type = BlockQ5_0;
    static constexpr int elements = 32;
};
template <>
struct BlockOf<GgmlType::Q5_1> {
    using type = BlockQ5_1;
    static constexpr int elements = 32;
};
template <>
struct BlockOf<GgmlType::Q8_0> {
    using type = BlockQ8_0;
    static constexpr int elements = 32;
};
template <>
struct BlockOf<GgmlType::Q8_1> {
    using type = BlockQ8_1;
    static constexpr int elements = 32;
};
template <>
struct BlockOf<GgmlType::IQ4_NL> {
    using type = BlockIQ4_NL;
    static constexpr int elements = 32;
};
template <>
struct BlockOf<GgmlType::IQ4_XS> {
    using type = BlockIQ4_XS;
    static constexpr int elements = kQK;
};
template <>
struct BlockOf<GgmlType::TQ1_0> {
    using type = BlockTQ1_0;
    static constexpr int elements = kQK;
};
template <>
struct BlockOf<GgmlType::TQ2_0> {
    using type = BlockTQ2_0;
    static constexpr int elements = kQK;
};
template <>
struct BlockOf<GgmlType::MXFP4> {
    using type = BlockMXFP4;
    static constexpr int elements = 32;
};
template <>
struct BlockOf<GgmlType::IQ1_S> {
    using type = BlockIQ1_S;
    static constexpr int elements = kQK;
};
template <>
struct BlockOf<GgmlType::IQ1_M> {
    using type = BlockIQ1_M;
    static constexpr int elements = kQK;
};
template <>
struct BlockOf<GgmlType::IQ2_XXS> {
    using type = BlockIQ2_XXS;
    static constexpr int elements = kQK;
};
template <>
struct BlockOf<GgmlType::IQ2_XS> {
    using type = BlockIQ2_XS;
    static constexpr int elements = kQK;
};
template <>
struct BlockOf<GgmlType::IQ2_S> {
    using type = BlockIQ2_S;
    static constexpr int elements = kQK;
};
template <>
struct BlockOf<GgmlType::IQ3_XXS> {
    using type = BlockIQ3_XXS;
    static constexpr int elements = kQK;
};
template <>
struct BlockOf<GgmlType::IQ3_S> {
    using type = BlockIQ3_S;
    static constexpr int elements = kQK;
};
template <>
struct BlockOf<GgmlType::Q2_K> {
    using type = BlockQ2_K;
    static constexpr int elements = kQK;
};
template <>
struct BlockOf<GgmlType::Q3_K> {
    using type = BlockQ3_K;
    static constexpr int elements = kQK;
};
template <>
struct BlockOf<GgmlType::Q4_K> {
    using type = BlockQ4_K;
    static constexpr int elements = kQK;
};
template <>
struct BlockOf<GgmlType::Q5_K> {
    using type = BlockQ5_K;
    static constexpr int elements = kQK;
};
template <>
struct BlockOf<GgmlType::Q6_K> {
    using type = BlockQ6_K;
    static constexpr int elements = kQK;
};
template <>
struct BlockOf<GgmlType::Q8_K> {
    using type = BlockQ8_K;
    static constexpr int elements = kQK;
};

// ---- Scalar conversions (the SIMD files use F16C instead) ----

inline float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1Fu;
    const uint32_t mantissa = h & 0x3FFu;
    if (exponent == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));  // inf, nan
    if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
    const float subnormal = static_cast<float>(mantissa) * 0x1p-24f;  // exact
    return sign ? -subnormal : subnormal;
}

// Round to nearest, ties to even; overflow gives infinity, NaN stays NaN.
inline uint16_t fp32_to_fp16(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return sign | 0x7E00u;   // NaN
    if (ax >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to infinity
    if (ax >= 0x38800000u) {                       // a normal half (>= 2^-14)
        const uint32_t rounded = ax + 0xFFFu + ((ax >> 13) & 1u);
        return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
    }
    // Subnormal half: a multiple of 2^-24; the product is exact and nearbyint rounds to even.
    return sign | static_cast<uint16_t>(std::nearbyint(std::bit_cast<float>(ax) * 0x1p24f));
}

inline float bf16_to_fp32(uint16_t h) {
    return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

inline uint16_t fp32_to_bf16(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
    return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

// ---- Packed sub-block scales of the k-quants ----

inline uint32_t load_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// Q4_K / Q5_K: twelve bytes hold eight 6-bit scales and eight 6-bit mins. Bytes 0..3 carry
// scales 0..3 in their low 6 bits, bytes 4..7 mins 0..3; scales and mins 4..7 keep their low
// nibbles in bytes 8..11 (scale low, min high) and their top 2 bits in the top of bytes 0..7.
struct KScalesMins {
    uint8_t scales[8];
    uint8_t mins[8];
};
inline KScalesMins unpack_q4k_scales(const uint8_t* packed) {
    const uint32_t w0 = load_u32(packed), w1 = load_u32(packed + 4), w2 = load_u32(packed + 8);
    const uint32_t words[4] = {
        w0 & 0x3F3F3F3Fu,
        (w2 & 0x0F0F0F0Fu) | (((w0 >> 6) & 0x03030303u) << 4),
        w1 & 0x3F3F3F3Fu,
        ((w2 >> 4) & 0x0F0F0F0Fu) | (((w1 >> 6) & 0x03030303u) << 4),
    };
    KScalesMins r;
    std::memcpy(&r, words, sizeof(r));
    return r;
}

// Q3_K: twelve bytes hold sixteen 6-bit scales (stored +32). Returns them with the 32 removed.
struct KScales16 {
    int8_t scales[16];
};
inline KScales16 unpack_q3k_scales(const uint8_t* packed) {
    const uint32_t w0 = load_u32(packed), w1 = load_u32(packed + 4), w2 = load_u32(packed + 8);
    const uint32_t words[4] = {
        (w0 & 0x0F0F0F0Fu) | ((w2 & 0x03030303u) << 4),
        (w1 & 0x0F0F0F0Fu) | (((w2 >> 2) & 0x03030303u) << 4),
        ((w0 >> 4) & 0x0F0F0F0Fu) | (((w2 >> 4) & 0x03030303u) << 4),
        ((w1 >> 4) & 0x0F0F0F0Fu) | (((w2 >> 6) & 0x03030303u) << 4),
    };
    KScales16 r;
    std::memcpy(&r, words, sizeof(r));
    for (auto& s : r.scales) s = static_cast<int8_t>(s - 32);
    return r;
}

// ---- The unsigned quant of element e of a block, before its offset, scale and min ----
// (The scalar reference kernels use these; they are the layouts above as code.)

// Legacy types: element l < 32 of a block of 32.
inline int nibble_of(const uint8_t* qs, int l) {
    return l < 16 ? (qs[l] & 0x0F) : (qs[l - 16] >> 4);
}
inline int bit_of(const uint8_t* bits, int l) {
    return (bits[l / 8] >> (l % 8)) & 1;
}
inline int quant_of(const BlockQ4_0& b, int l) {
    return nibble_of(b.qs, l);
}  // x = d (q - 8)
inline int quant_of(const BlockQ4_1& b, int l) {
    return nibble_of(b.qs, l);
}  // x = d q + m
inline int quant_of(const BlockQ5_0& b, int l) {
    return nibble_of(b.qs, l) | (bit_of(b.qh, l) << 4);
}  // d (q - 16)
inline int quant_of(const BlockQ5_1& b, int l) {
    return nibble_of(b.qs, l) | (bit_of(b.qh, l) << 4);
}  // d q + m
inline int quant_of(const BlockIQ4_NL& b, int l) {
    return nibble_of(b.qs, l);
}  // x = d kValuesIQ4NL[q]
inline int quant_of(const BlockIQ4_XS& b, int e) {
    return nibble_of(b.qs + 16 * (e / 32), e % 32);
}  // x = d (ls - 32) kValuesIQ4NL[q]
// The signed scale ls - 32 (-32 .. 31) of IQ4_XS sub-block ib.
inline int iq4_xs_scale(const BlockIQ4_XS& b, int ib) {
    const int low = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
    const int high = (b.scales_h >> (2 * ib)) & 3;
    return (low | (high << 4)) - 32;
}

// Trit n (0..4) of a TQ1_0 byte, 0..2, exactly as ggml computes it (any byte value decodes).
inline int tq1_trit(uint8_t q, int n) {
    static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
    const auto shifted = static_cast<uint8_t>(q * kPow3[n]);
    return (static_cast<int>(shifted) * 3) >> 8;
}
inline int quant_of(const BlockTQ1_0& b, int e) {  // x = d (t - 1)
    if (e < 160) return tq1_trit(b.qs[e % 32], e / 32);
    if (e < 240) return tq1_trit(b.qs[32 + e % 16], (e - 160) / 16);
    return tq1_trit(b.qh[e % 4], (e - 240) / 4);
}
inline int quant_of(const BlockTQ2_0& b, int e) {  // x = d (q - 1)
    return (b.qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
}
inline int quant_of(const BlockMXFP4& b, int l) {
    return nibble_of(b.qs, l);
}  // x = mxfp4_scale_half(e) kValuesMXFP4[q]
// 2^(e - 128): half the E8M0 scale, as ggml's GGML_E8M0_TO_FP32_HALF (subnormal for e < 2).
inline float mxfp4_scale_half(uint8_t e) {
    const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
    return std::bit_cast<float>(bits);
}

// i-quants: the 32 signed grid values v of sub-block ib (before the scale) and its odd scale
// integers ls = 2 s + 1 (ls[0] for values 0..15, ls[1] for 16..31): x = d * ls * v / 4 (IQ3_XXS),
// d * ls * v (IQ3_S), d * ls * v / 8 (IQ2).
template <typename Point>
inline void iq_group(Point point, int values, uint8_t signs, int8_t* v) {
    for (int j = 0; j < values; ++j) {
        const int mag = static_cast<int>((point >> (8 * j)) & 0xFF);
        v[j] = static_cast<int8_t>((signs >> j) & 1 ? -mag : mag);
    }
}
inline void iq3xxs_subblock(const BlockIQ3_XXS& b, int ib, int8_t v[32], int ls[2]) {
    const uint32_t w = load_u32(b.qs + kQK / 4 + 4 * ib);
    for (int k = 0; k < 8; ++k) {
        const uint8_t signs = kIqSigns[(w >> (7 * (k / 2))) & 127];
        iq_group(kIq3xxsGrid[b.qs[8 * ib + k]], 4, static_cast<uint8_t>(signs >> (4 * (k % 2))), v + 4 * k);
    }
    ls[0] = ls[1] = 2 * static_cast<int>(w >> 28) + 1;
}
inline void iq3s_subblock(const BlockIQ3_S& b, int ib, int8_t v[32], int ls[2]) {
    for (int k = 0; k < 8; ++k) {
        const uint32_t point = kIq3sGrid[b.qs[8 * ib + k] | (((b.qh[ib] >> k) & 1) << 8)];
        iq_group(point, 4, static_cast<uint8_t>(b.signs[4 * ib + k / 2] >> (4 * (k % 2))), v + 4 * k);
    }
    ls[0] = ls[1] = 2 * ((b.scales[ib / 2] >> (4 * (ib % 2))) & 15) + 1;
}
inline void iq2xxs_subblock(const BlockIQ2_XXS& b, int ib, int8_t v[32], int ls[2]) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(b.qs) + 8 * ib;
    const uint32_t w1 = load_u32(bytes + 4);
    for (int l = 0; l < 4; ++l) iq_group(kIq2xxsGrid[bytes[l]], 8, kIqSigns[(w1 >> (7 * l)) & 127], v + 8 * l);
    ls[0] = ls[1] = 2 * static_cast<int>(w1 >> 28) + 1;
}
inline void iq2xs_subblock(const BlockIQ2_XS& b, int ib, int8_t v[32], int ls[2]) {
    for (int l = 0; l < 4; ++l) {
        const uint16_t q = b.qs[4 * ib + l];
        iq_group(kIq2xsGrid[q & 511], 8, kIqSigns[q >> 9], v + 8 * l);
    }
    ls[0] = 2 * (b.scales[ib] & 15) + 1;
    ls[1] = 2 * (b.scales[ib] >> 4) + 1;
}
inline void iq2s_subblock(const BlockIQ2_S& b, int ib, int8_t v[32], int ls[2]) {
    for (int l = 0; l < 4; ++l) {
        const uint64_t point = kIq2sGrid[b.qs[4 * ib + l] | (((b.qh[ib] >> (2 * l)) & 3) << 8)];
        iq_group(point, 8, b.qs[kQK / 8 + 4 * ib + l], v + 8 * l);
    }
    ls[0] = 2 * (b.scales[ib] & 15) + 1;
    ls[1] = 2 * (b.scales[ib] >> 4) + 1;
}

// IQ1_S / IQ1_M: the 32 grid values g (-1, 0, 1) of sub-block ib, the sign of each group's delta
// (+1 / -1, delta = sign / 8) and the odd scale integers (ls[0]: values 0..15, ls[1]: 16..31):
// x = d * ls * (g + delta).
inline void iq1s_subblock(const BlockIQ1_S& b, int ib, int8_t v[32], int delta[4], int ls[2]) {
    const int qh = b.qh[ib];
    for (int l = 0; l < 4; ++l) {
        const uint64_t point = kIq1sGrid[b.qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)];
        for (int j = 0; j < 8; ++j) v[8 * l + j] = static_cast<int8_t>(static_cast<uint8_t>(point >> (8 * j)));
        delta[l] = qh & 0x8000 ? -1 : 1;
    }
    ls[0] = ls[1] = 2 * ((qh >> 12) & 7) + 1;
}
inline uint16_t iq1m_scale(const BlockIQ1_M& b) {
    uint16_t w[4];
    std::memcpy(w, b.scales, sizeof w);
    return static_cast<uint16_t>((w[0] >> 12) | ((w[1] >> 8) & 0xF0) | ((w[2] >> 4) & 0xF00) | (w[3] & 0xF000));
}
inline void iq1m_subblock(const BlockIQ1_M& b, int ib, int8_t v[32], int delta[4], int ls[2]) {
    for (int l = 0; l < 4; ++l) {
        const int nib = (b.qh[2 * ib + l / 2] >> (4 * (l % 2))) & 15;
        const uint64_t point = kIq1sGrid[b.qs[4 * ib + l] | ((nib & 7) << 8)];
        for (int j = 0; j < 8; ++j) v[8 * l + j] = static_cast<int8_t>(static_cast<uint8_t>(point >> (8 * j)));
        delta[l] = nib & 8 ? -1 : 1;
    }
    uint16_t w[4];
    std::memcpy(w, b.scales, sizeof w);
    const int sc = w[ib / 2] >> (6 * (ib % 2));
    ls[0] = 2 * (sc & 7) + 1;
    ls[1] = 2 * ((sc >> 3) & 7) + 1;
}

// k-quants: element e < 256 of a super-block, in sub-block e / 16 (Q2_K, Q3_K, Q6_K) or e / 32.
inline int quant_of(const BlockQ2_K& b, int e) {
    return (b.qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
}
inline int quant_of(const BlockQ3_K& b, int e) {  // x = d s (q - 4)
    const int low = (b.qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
    const int high = (b.hmask[e % 32] >> (e / 32)) & 1;  // bit 4h + g = e / 32
    return low | (high << 2);
}
inline int quant_of(const BlockQ4_K& b, int e) {
    const uint8_t byte = b.qs[32 * (e / 64) + e % 32];
    return (e / 32) % 2 == 0 ? (byte & 0x0F) : (byte >> 4);
}
inline int quant_of(const BlockQ5_K& b, int e) {
    const uint8_t byte = b.qs[32 * (e / 64) + e % 32];
    const int low = (e / 32) % 2 == 0 ? (byte & 0x0F) : (byte >> 4);
    return low | (((b.qh[e % 32] >> (e / 32)) & 1) << 4);
}
inline int quant_of(const BlockQ6_K& b, int e) {  // x = d scales[e / 16] (q - 32)
    const int h = e / 128, g = (e / 32) % 4, l = e % 32;
    const uint8_t byte = b.ql[64 * h + 32 * (g % 2) + l];
    const int low = g < 2 ? (byte & 0x0F) : (byte >> 4);
    return low | (((b.qh[32 * h + l] >> (2 * g)) & 3) << 4);
}

// Blocks in a row of n elements for a reference codec (quantize_row / dequantize_row);
// throws std::invalid_argument naming the function, type and n otherwise.
inline int64_t whole_blocks(const char* function, GgmlType type, int64_t n, bool supported) {
    const TypeTraits& t = traits(type);
    if (!supported || n < 0 || n % t.block_elements != 0) {
        throw std::invalid_argument(
            std::string(function) + ": " + std::string(t.name) + " row of " + std::to_string(n) +
            (supported ? " elements is not a whole number of blocks of " + std::to_string(t.block_elements)
                       : " elements: type not supported"));
    }
    return n / t.block_elements;
}

}  // namespace fitllm::quant
