// The scalar reference of every dot, and the definition of its arithmetic.
//
// Quantized dots: the integer sums are exact; the float steps after them are llama.cpp's, step for
// step, as its CPU backend runs them on an x86-64 CPU with AVX2 or AVX-512 (ggml-cpu's
// arch/x86/quants.c vec_dot kernels, and arch/x86/repack.cpp gemv kernels for the weight types it
// repacks there): the same products, the same FMAs, the same accumulation order. With the same
// activation bytes (quantize.cpp matches llama.cpp's quantizers) a dot then gives llama.cpp's float
// bit for bit, which a greedy continuation needs to pick the same token at near-ties. Two orders:
//   lanes8:  8 float lanes, lane l holding the integer sum of elements with (e mod 32) in
//            [4l, 4l + 4) of each block (or 32-element group); per block
//            lane = fma(scale, float(lane sum), lane); at the end ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)).
//            Q8_0, Q5_0 (ggml_vec_dot_*_q8_0), Q5_K, Q6_K (ggml_vec_dot_*_q8_K).
//   serial:  one float per row, per block acc = fma(float(block's integer sum), scale, acc); mins
//            in a second chain, subtracted at the end. Q4_0, IQ4_NL, Q4_K, Q2_K: the weight types
//            llama.cpp repacks on AVX2 / AVX-512 CPUs (q4_0_8x8, iq4_nl_8x8, q4_K_8x8, q2_K_8x8).
// The SIMD variants must give these floats exactly (tests/quant/dot_test.cpp) and so llama.cpp's
// (tests/quant/ggml_oracle_test.cpp). F16 is ggml_vec_dot_f16's order (activations rounded to f16, as
// llama.cpp's vec_dot_type for F16 has them). Q4_1, Q5_1, F32 and BF16 keep a double-precision sum
// here; their variants are held to it within a tolerance.
// It also runs as the kernel on CPUs without AVX2.
#include <cmath>
#include <type_traits>

#include "quant/blocks.h"
#include "quant/dot_kernels.h"

namespace fitllm::quant::detail {
namespace {

template <typename T>
const T* as(const void* p) {
    return static_cast<const T*>(p);
}
double f16(uint16_t h) {
    return fp16_to_fp32(h);
}
float f16f(uint16_t h) {
    return fp16_to_fp32(h);
}

// llama.cpp's hsum_float_8.
float hsum8(const float l[8]) {
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// ---- BF16 and F32 weights, F32 activations ----

template <float (*kToFloat)(uint16_t)>
void dot_half(int n, float* out, const void* w, const void* a) {
    const auto* x = as<uint16_t>(w);
    const auto* y = as<float>(a);
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += static_cast<double>(kToFloat(x[i])) * y[i];
    *out = static_cast<float>(sum);
}

// ---- F16 weights, F16 activations: ggml_vec_dot_f16 as it runs with AVX-512 ----
// Four accumulators of 16 lanes over each 64 elements (lane l of accumulator j takes the elements
// 64i + 16j + l), combined (a0 + a2) + (a1 + a3) lane by lane, the 16 lanes reduced as
// _mm512_reduce_add_ps does; the last n mod 64 products are added to that in double.
void dot_f16(int n, float* out, const void* w, const void* a) {
    const auto* x = as<uint16_t>(w);
    const auto* y = as<uint16_t>(a);
    const int np = n & ~63;
    float acc[4][16] = {};
    for (int i = 0; i < np; i += 64) {
        for (int j = 0; j < 4; ++j) {
            for (int l = 0; l < 16; ++l) {
                const int e = i + 16 * j + l;
                acc[j][l] = std::fma(f16f(x[e]), f16f(y[e]), acc[j][l]);
            }
        }
    }
    float lanes[16];
    for (int l = 0; l < 16; ++l) lanes[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    double sum = reduce_add16(lanes);
    for (int i = np; i < n; ++i) sum += static_cast<double>(f16f(x[i]) * f16f(y[i]));
    *out = static_cast<float>(sum);
}

void dot_f32(int n, float* out, const void* w, const void* a) {
    const auto* x = as<float>(w);
    const auto* y = as<float>(a);
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * y[i];
    *out = static_cast<float>(sum);
}

// ---- Blocks of 32 ----

// Q4_0, Q5_0, Q8_0, IQ4_NL with Q8_0: d_w d_a sum value(q) y, value(q) = q - offset or a table.
// Q5_0 and Q8_0 in the lanes8 order, Q4_0 and IQ4_NL in the serial one (see the top).
template <typename Block, int kOffset>
int value_of(const Block& b, int l) {
    if constexpr (std::is_same_v<Block, BlockIQ4_NL>)
        return kValuesIQ4NL[quant_of(b, l)];
    else if constexpr (std::is_same_v<Block, BlockQ8_0>)
        return b.qs[l];
    else
        return quant_of(b, l) - kOffset;
}

template <typename Block, int kOffset, bool kLanes8>
void dot_blocks32(int n, float* out, const void* w, const void* a) {
    const auto* x = as<Block>(w);
    const auto* y = as<BlockQ8_0>(a);
    float lanes[8] = {};
    float acc = 0.0f;
    for (int i = 0; i < n / 32; ++i) {
        const float d = f16f(x[i].d) * f16f(y[i].d);
        int sums[8] = {};
        for (int l = 0; l < 32; ++l) sums[l / 4] += value_of<Block, kOffset>(x[i], l) * y[i].qs[l];
        if constexpr (kLanes8) {
            for (int l = 0; l < 8; ++l) lanes[l] = std::fma(d, static_cast<float>(sums[l]), lanes[l]);
        } else {
            int sumi = 0;
            for (int l = 0; l < 8; ++l) sumi += sums[l];
            acc = std::fma(static_cast<float>(sumi), d, acc);
        }
    }
    *out = kLanes8 ? hsum8(lanes) : acc;
}

// Q4_1, Q5_1 with Q8_1: d_w d_a sum q y + m_w s_a. s_a = d_a sum(y) rounded to fp16, as llama.cpp
// has it: this dot differs from the dot of the dequantized rows by m_w times that rounding.
template <typename Block>
void dot_affine32(int n, float* out, const void* w, const void* a) {
    const auto* x = as<Block>(w);
    const auto* y = as<BlockQ8_1>(a);
    double sum = 0;
    for (int i = 0; i < n / 32; ++i) {
        int sumi = 0;
        for (int l = 0; l < 32; ++l) sumi += quant_of(x[i], l) * y[i].qs[l];
        sum += f16(x[i].d) * f16(y[i].d) * sumi + f16(x[i].m) * f16(y[i].s);
    }
    *out = static_cast<float>(sum);
}

// ---- k-quants with Q8_K ----

// Sum of q * y and of y over elements [begin, begin + len) of a super-block; y's bsums are
// not trusted here (the SIMD kernels use them, so the tests check them this way).
struct SubSums {
    int qy = 0;
    int y = 0;
};
template <typename Block>
SubSums sub_sums(const Block& x, const BlockQ8_K& y, int begin, int len) {
    SubSums s;
    for (int e = begin; e < begin + len; ++e) {
        s.qy += quant_of(x, e) * y.qs[e];
        s.y += y.qs[e];
    }
    return s;
}

// Q2_K, Q4_K: the serial order, d_w d_a sum scale q y in one chain and dmin_w d_a sum min y in
// another (llama.cpp's q2_K_8x8 / q4_K_8x8 gemv); sub-blocks of 16 (Q2_K) or 32 (Q4_K).
struct ScaledAndMins {
    int scaled = 0;
    int mins = 0;
};
ScaledAndMins super_block_sums(const BlockQ2_K& x, const BlockQ8_K& y) {
    ScaledAndMins r;
    for (int j = 0; j < 16; ++j) {
        const SubSums s = sub_sums(x, y, 16 * j, 16);
        r.scaled += (x.scales[j] & 0x0F) * s.qy;
        r.mins += (x.scales[j] >> 4) * s.y;
    }
    return r;
}
ScaledAndMins super_block_sums(const BlockQ4_K& x, const BlockQ8_K& y) {
    const KScalesMins sm = unpack_q4k_scales(x.scales);
    ScaledAndMins r;
    for (int j = 0; j < 8; ++j) {
        const SubSums s = sub_sums(x, y, 32 * j, 32);
        r.scaled += sm.scales[j] * s.qy;
        r.mins += sm.mins[j] * s.y;
    }
    return r;
}

template <typename Block>
void dot_serial_k(int n, float* out, const void* w, const void* a) {
    const auto* x = as<Block>(w);
    const auto* y = as<BlockQ8_K>(a);
    float acc = 0.0f, acc_mins = 0.0f;
    for (int i = 0; i < n / kQK; ++i) {
        const ScaledAndMins s = super_block_sums(x[i], y[i]);
        acc = std::fma(static_cast<float>(s.scaled), f16f(x[i].d) * y[i].d, acc);
        acc_mins = std::fma(static_cast<float>(s.mins), f16f(x[i].dmin) * y[i].d, acc_mins);
    }
    *out = acc - acc_mins;
}

// Q3_K: the lanes8 order of llama.cpp's ggml_vec_dot_q3_K_q8_K: lane l sums scale * (q - 4) * y
// over the elements with (e mod 32) in [4l, 4l + 4), the offset inside the lane.
void dot_q3_K(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockQ3_K>(w);
    const auto* y = as<BlockQ8_K>(a);
    float lanes[8] = {};
    for (int i = 0; i < n / kQK; ++i) {
        const KScales16 sc = unpack_q3k_scales(x[i].scales);
        int sums[8] = {};
        for (int e = 0; e < kQK; ++e) sums[(e % 32) / 4] += sc.scales[e / 16] * (quant_of(x[i], e) - 4) * y[i].qs[e];
        const float d = y[i].d * f16f(x[i].d);
        for (int l = 0; l < 8; ++l) lanes[l] = std::fma(d, static_cast<float>(sums[l]), lanes[l]);
    }
    *out = hsum8(lanes);
}

// Q5_K: the lanes8 order over the 32-element sub-blocks, the mins summed as llama.cpp's
// ggml_vec_dot_q5_K_q8_K does: summs = fma(-d_a dmin_w, float(sum min y), summs), added at the end.
void dot_q5_K(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockQ5_K>(w);
    const auto* y = as<BlockQ8_K>(a);
    float lanes[8] = {};
    float summs = 0.0f;
    for (int i = 0; i < n / kQK; ++i) {
        const KScalesMins sm = unpack_q4k_scales(x[i].scales);
        int sums[8] = {}, mins = 0;
        for (int e = 0; e < kQK; ++e) sums[(e % 32) / 4] += sm.scales[e / 32] * quant_of(x[i], e) * y[i].qs[e];
        for (int j = 0; j < 8; ++j) mins += sm.mins[j] * sub_sums(x[i], y[i], 32 * j, 32).y;
        const float d = y[i].d * f16f(x[i].d);
        const float dmin = -y[i].d * f16f(x[i].dmin);
        for (int l = 0; l < 8; ++l) lanes[l] = std::fma(d, static_cast<float>(sums[l]), lanes[l]);
        summs = std::fma(dmin, static_cast<float>(mins), summs);
    }
    *out = hsum8(lanes) + summs;
}

// Q6_K: the lanes8 order as llama.cpp's ggml_vec_dot_q6_K_q8_K has it: lane l sums scale * q * y
// (q unsigned, 0..63) over the elements with (e mod 32) in [4l, 4l + 4), minus 32 times
// scale * sum(y) of the sub-blocks of 16 numbered 2l and 2l + 1.
void dot_q6_K(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockQ6_K>(w);
    const auto* y = as<BlockQ8_K>(a);
    float lanes[8] = {};
    for (int i = 0; i < n / kQK; ++i) {
        int sums[8] = {};
        for (int e = 0; e < kQK; ++e) sums[(e % 32) / 4] += x[i].scales[e / 16] * quant_of(x[i], e) * y[i].qs[e];
        for (int j = 0; j < 16; ++j) sums[j / 2] -= 32 * x[i].scales[j] * sub_sums(x[i], y[i], 16 * j, 16).y;
        const float d = y[i].d * f16f(x[i].d);
        for (int l = 0; l < 8; ++l) lanes[l] = std::fma(d, static_cast<float>(sums[l]), lanes[l]);
    }
    *out = hsum8(lanes);
}

// IQ4_XS: the lanes8 order: lane l sums (ls - 32) * value * y exactly in integers over the
// elements with (e mod 32) in [4l, 4l + 4) of each super-block (at most 8 x 4 x 127 x 127 x 32),
// then lane = fma(d_w d_a, float(lane sum), lane); at the end hsum8. The SIMD variants and the
// tiles give this float exactly.
void dot_iq4_xs(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockIQ4_XS>(w);
    const auto* y = as<BlockQ8_K>(a);
    float lanes[8] = {};
    for (int i = 0; i < n / kQK; ++i) {
        int32_t sums[8] = {};
        for (int e = 0; e < kQK; ++e)
            sums[(e % 32) / 4] += iq4_xs_scale(x[i], e / 32) * kValuesIQ4NL[quant_of(x[i], e)] * y[i].qs[e];
        const float d = f16f(x[i].d) * y[i].d;
        for (int l = 0; l < 8; ++l) lanes[l] = std::fma(d, static_cast<float>(sums[l]), lanes[l]);
    }
    *out = hsum8(lanes);
}

// TQ1_0, TQ2_0 with Q8_K: the lanes8 order of llama.cpp's ggml_vec_dot_tq*_0_q8_K (AVX2): lane l
// sums t * y (t = 0..2, or 0..3 for a TQ2_0 code 3) over the elements with (e mod 32) in [4l, 4l + 4)
// and subtracts the y of elements 32 l .. 32 l + 31 (the -1 of every value, through bsums), exactly
// in integers; then lane = fma(float(lane sum), d_a d_w, lane) (llama.cpp's source has a product and
// a sum; the compiler fuses them in the libggml-cpu that PyPI's llama-cpp-python ships), hsum8 at the end.
template <typename Block>
void dot_ternary(int n, float* out, const void* w, const void* a) {
    const auto* x = as<Block>(w);
    const auto* y = as<BlockQ8_K>(a);
    float lanes[8] = {};
    for (int i = 0; i < n / kQK; ++i) {
        int32_t sums[8] = {};
        for (int e = 0; e < kQK; ++e) sums[(e % 32) / 4] += quant_of(x[i], e) * y[i].qs[e];
        for (int e = 0; e < kQK; ++e) sums[e / 32] -= y[i].qs[e];
        const float d = y[i].d * f16f(x[i].d);
        for (int l = 0; l < 8; ++l) lanes[l] = std::fma(static_cast<float>(sums[l]), d, lanes[l]);
    }
    *out = hsum8(lanes);
}

// MXFP4 with Q8_0: the order of llama.cpp's ggml_vec_dot_mxfp4_q8_0 (AVX2): blocks taken in pairs,
// the even ones in one set of 8 lanes and the odd ones in another, lane l summing value * y over
// elements 4l .. 4l + 3 exactly, lane = fma(d_a 2^(e-128), float(lane sum), lane); the two sets added
// lane by lane and reduced by hsum8; a last unpaired block then added as sum += d * (its integer sum).
void dot_mxfp4(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockMXFP4>(w);
    const auto* y = as<BlockQ8_0>(a);
    const int nb = n / 32;
    float lanes[2][8] = {};
    int ib = 0;
    for (; ib + 1 < nb; ib += 2) {
        for (int k = 0; k < 2; ++k) {
            const BlockMXFP4& b = x[ib + k];
            int sums[8] = {};
            for (int l = 0; l < 32; ++l) sums[l / 4] += kValuesMXFP4[quant_of(b, l)] * y[ib + k].qs[l];
            const float d = f16f(y[ib + k].d) * mxfp4_scale_half(b.e);
            for (int l = 0; l < 8; ++l) lanes[k][l] = std::fma(d, static_cast<float>(sums[l]), lanes[k][l]);
        }
    }
    float both[8];
    for (int l = 0; l < 8; ++l) both[l] = lanes[0][l] + lanes[1][l];
    float sum = hsum8(both);
    for (; ib < nb; ++ib) {
        int sumi = 0;
        for (int l = 0; l < 32; ++l) sumi += kValuesMXFP4[quant_of(x[ib], l)] * y[ib].qs[l];
        const float d = f16f(y[ib].d) * mxfp4_scale_half(x[ib].e);
        sum = std::fma(d, static_cast<float>(sumi), sum);
    }
    *out = sum;
}

// IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S with Q8_K: the lanes8 order of llama.cpp's
// ggml_vec_dot_iq*_q8_K (AVX2): lane l sums ls * v * y over the elements with (e mod 32) in
// [4l, 4l + 4) of each sub-block exactly (ls the sub-block's odd scale integer); per super-block
// lane = fma(d_w d_a, float(lane sum), lane); the result is hsum8 times 1 / kDiv (IQ3_XXS 4, IQ3_S 1,
// IQ2 8).
template <typename Block, void (*kSub)(const Block&, int, int8_t*, int*), int kDiv>
void dot_iq_grid(int n, float* out, const void* w, const void* a) {
    const auto* x = as<Block>(w);
    const auto* y = as<BlockQ8_K>(a);
    float lanes[8] = {};
    for (int i = 0; i < n / kQK; ++i) {
        int32_t sums[8] = {};
        for (int ib = 0; ib < 8; ++ib) {
            int8_t v[32];
            int ls[2];
            kSub(x[i], ib, v, ls);
            for (int l = 0; l < 8; ++l) {
                int32_t s = 0;
                for (int j = 4 * l; j < 4 * l + 4; ++j) s += v[j] * y[i].qs[32 * ib + j];
                sums[l] += ls[l / 4] * s;
            }
        }
        const float d = f16f(x[i].d) * y[i].d;
        for (int l = 0; l < 8; ++l) lanes[l] = std::fma(d, static_cast<float>(sums[l]), lanes[l]);
    }
    *out = (1.0f / kDiv) * hsum8(lanes);
}

// IQ1_S, IQ1_M with Q8_K: llama.cpp's ggml_vec_dot_iq1_*_q8_K (AVX2). The grid part in lanes8 (lane l:
// ls * g * y over elements 4l .. 4l + 3 of each sub-block, one fma per lane and super-block); the
// delta part (sign * ls * y) as one integer per super-block (IQ1_S, from the bsums: acc1 =
// fma(d, float(sum), acc1)) or in a second set of lanes (IQ1_M). Result: hsum8(grid lanes) + 1/8 *
// (acc1 or hsum8(delta lanes)).
template <typename Block, void (*kSub)(const Block&, int, int8_t*, int*, int*)>
void dot_iq1(int n, float* out, const void* w, const void* a) {
    constexpr bool kM = std::is_same_v<Block, BlockIQ1_M>;
    const auto* x = as<Block>(w);
    const auto* y = as<BlockQ8_K>(a);
    float lanes[8] = {}, delta_lanes[8] = {}, acc1 = 0.0f;
    for (int i = 0; i < n / kQK; ++i) {
        int32_t sums[8] = {}, delta_sums[8] = {}, delta_sum = 0;
        for (int ib = 0; ib < 8; ++ib) {
            int8_t v[32];
            int delta[4], ls[2];
            kSub(x[i], ib, v, delta, ls);
            const int8_t* q = y[i].qs + 32 * ib;
            for (int l = 0; l < 8; ++l) {
                int32_t s = 0, t = 0;
                for (int j = 4 * l; j < 4 * l + 4; ++j) {
                    s += v[j] * q[j];
                    t += delta[j / 8] * q[j];
                }
                sums[l] += ls[l / 4] * s;
                delta_sums[l] += ls[l / 4] * t;
            }
            if constexpr (!kM) delta_sum += delta[0] * ls[0] * (y[i].bsums[2 * ib] + y[i].bsums[2 * ib + 1]);
        }
        float d;
        if constexpr (kM) {
            d = y[i].d * f16f(iq1m_scale(x[i]));
        } else {
            d = y[i].d * f16f(x[i].d);
        }
        for (int l = 0; l < 8; ++l) {
            lanes[l] = std::fma(d, static_cast<float>(sums[l]), lanes[l]);
            if constexpr (kM) delta_lanes[l] = std::fma(d, static_cast<float>(delta_sums[l]), delta_lanes[l]);
        }
        if constexpr (!kM) acc1 = std::fma(d, static_cast<float>(delta_sum), acc1);
    }
    *out = hsum8(lanes) + 0.125f * (kM ? hsum8(delta_lanes) : acc1);
}

}  // namespace

// _mm512_reduce_add_ps's order (GCC's): halves, then quarters, then (l0 + l2) + (l1 + l3).
float reduce_add16(const float v[16]) {
    float t[8], u[4];
    for (int l = 0; l < 8; ++l) t[l] = v[l + 8] + v[l];
    for (int l = 0; l < 4; ++l) u[l] = t[l + 4] + t[l];
    return (u[0] + u[2]) + (u[1] + u[3]);
}

DotFn dot_ref(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::F32:
            return dot_f32;
        case GgmlType::F16:
            return dot_f16;
        case GgmlType::BF16:
            return dot_half<bf16_to_fp32>;
        case GgmlType::Q4_0:
            return dot_blocks32<BlockQ4_0, 8, false>;
        case GgmlType::Q4_1:
            return dot_affine32<BlockQ4_1>;
        case GgmlType::Q5_0:
            return dot_blocks32<BlockQ5_0, 16, true>;
        case GgmlType::Q5_1:
            return dot_affine32<BlockQ5_1>;
        case GgmlType::Q8_0:
            return dot_blocks32<BlockQ8_0, 0, true>;
        case GgmlType::IQ4_NL:
            return dot_blocks32<BlockIQ4_NL, 0, false>;
        case GgmlType::IQ4_XS:
            return dot_iq4_xs;
        case GgmlType::TQ1_0:
            return dot_ternary<BlockTQ1_0>;
        case GgmlType::TQ2_0:
            return dot_ternary<BlockTQ2_0>;
        case GgmlType::MXFP4:
            return dot_mxfp4;
        case GgmlType::IQ3_XXS:
            return dot_iq_grid<BlockIQ3_XXS, iq3xxs_subblock, 4>;
        case GgmlType::IQ3_S:
            return dot_iq_grid<BlockIQ3_S, iq3s_subblock, 1>;
        case GgmlType::IQ2_XXS:
            return dot_iq_grid<BlockIQ2_XXS, iq2xxs_subblock, 8>;
        case GgmlType::IQ2_XS:
            return dot_iq_grid<BlockIQ2_XS, iq2xs_subblock, 8>;
        case GgmlType::IQ2_S:
            return dot_iq_grid<BlockIQ2_S, iq2s_subblock, 8>;
        case GgmlType::IQ1_S:
            return dot_iq1<BlockIQ1_S, iq1s_subblock>;
        case GgmlType::IQ1_M:
            return dot_iq1<BlockIQ1_M, iq1m_subblock>;
        case GgmlType::Q2_K:
            return dot_serial_k<BlockQ2_K>;
        case GgmlType::Q3_K:
            return dot_q3_K;
        case GgmlType::Q4_K:
            return dot_serial_k<BlockQ4_K>;
        case GgmlType::Q5_K:
            return dot_q5_K;
        case GgmlType::Q6_K:
            return dot_q6_K;
        default:
            return nullptr;
    }
}

}  // namespace fitllm::quant::detail
