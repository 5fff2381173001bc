// The scalar reference of every dot: the formulas of blocks.h written out element by element.
// Integer sums are exact; everything after them is summed in double, so the reference is as close
// to the exact dot of the stored values as the formats allow, and the SIMD variants are judged by
// their distance to it. It also runs as the kernel on CPUs without AVX2.
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

// ---- Float weights, F32 activations ----

template <float (*kToFloat)(uint16_t)>
void dot_half(int n, float* out, const void* w, const void* a) {
    const auto* x = as<uint16_t>(w);
    const auto* y = as<float>(a);
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += static_cast<double>(kToFloat(x[i])) * y[i];
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

// Q4_0, Q5_0 with Q8_0: d_w d_a sum (q - offset) y.
template <typename Block, int kOffset>
void dot_symmetric32(int n, float* out, const void* w, const void* a) {
    const auto* x = as<Block>(w);
    const auto* y = as<BlockQ8_0>(a);
    double sum = 0;
    for (int i = 0; i < n / 32; ++i) {
        int sumi = 0;
        for (int l = 0; l < 32; ++l) sumi += (quant_of(x[i], l) - kOffset) * y[i].qs[l];
        sum += f16(x[i].d) * f16(y[i].d) * sumi;
    }
    *out = static_cast<float>(sum);
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

void dot_q8_0(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockQ8_0>(w);
    const auto* y = as<BlockQ8_0>(a);
    double sum = 0;
    for (int i = 0; i < n / 32; ++i) {
        int sumi = 0;
        for (int l = 0; l < 32; ++l) sumi += x[i].qs[l] * y[i].qs[l];
        sum += f16(x[i].d) * f16(y[i].d) * sumi;
    }
    *out = static_cast<float>(sum);
}

// IQ4_NL with Q8_0: d_w d_a sum kValuesIQ4NL[q] y.
void dot_iq4_nl(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockIQ4_NL>(w);
    const auto* y = as<BlockQ8_0>(a);
    double sum = 0;
    for (int i = 0; i < n / 32; ++i) {
        int sumi = 0;
        for (int l = 0; l < 32; ++l) sumi += kValuesIQ4NL[quant_of(x[i], l)] * y[i].qs[l];
        sum += f16(x[i].d) * f16(y[i].d) * sumi;
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

void dot_q2_K(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockQ2_K>(w);
    const auto* y = as<BlockQ8_K>(a);
    double sum = 0;
    for (int i = 0; i < n / kQK; ++i) {
        int scaled = 0, mins = 0;
        for (int j = 0; j < 16; ++j) {
            const SubSums s = sub_sums(x[i], y[i], 16 * j, 16);
            scaled += (x[i].scales[j] & 0x0F) * s.qy;
            mins += (x[i].scales[j] >> 4) * s.y;
        }
        sum += y[i].d * (f16(x[i].d) * scaled - f16(x[i].dmin) * mins);
    }
    *out = static_cast<float>(sum);
}

void dot_q3_K(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockQ3_K>(w);
    const auto* y = as<BlockQ8_K>(a);
    double sum = 0;
    for (int i = 0; i < n / kQK; ++i) {
        const KScales16 sc = unpack_q3k_scales(x[i].scales);
        int scaled = 0;
        for (int j = 0; j < 16; ++j) {
            const SubSums s = sub_sums(x[i], y[i], 16 * j, 16);
            scaled += sc.scales[j] * (s.qy - 4 * s.y);
        }
        sum += y[i].d * f16(x[i].d) * scaled;
    }
    *out = static_cast<float>(sum);
}

template <typename Block>
void dot_q4_5_K(int n, float* out, const void* w, const void* a) {
    const auto* x = as<Block>(w);
    const auto* y = as<BlockQ8_K>(a);
    double sum = 0;
    for (int i = 0; i < n / kQK; ++i) {
        const KScalesMins sm = unpack_q4k_scales(x[i].scales);
        int scaled = 0, mins = 0;
        for (int j = 0; j < 8; ++j) {
            const SubSums s = sub_sums(x[i], y[i], 32 * j, 32);
            scaled += sm.scales[j] * s.qy;
            mins += sm.mins[j] * s.y;
        }
        sum += y[i].d * (f16(x[i].d) * scaled - f16(x[i].dmin) * mins);
    }
    *out = static_cast<float>(sum);
}

void dot_q6_K(int n, float* out, const void* w, const void* a) {
    const auto* x = as<BlockQ6_K>(w);
    const auto* y = as<BlockQ8_K>(a);
    double sum = 0;
    for (int i = 0; i < n / kQK; ++i) {
        int scaled = 0;
        for (int j = 0; j < 16; ++j) {
            const SubSums s = sub_sums(x[i], y[i], 16 * j, 16);
            scaled += x[i].scales[j] * (s.qy - 32 * s.y);
        }
        sum += y[i].d * f16(x[i].d) * scaled;
    }
    *out = static_cast<float>(sum);
}

}  // namespace

DotFn dot_ref(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::F32:
            return dot_f32;
        case GgmlType::F16:
            return dot_half<fp16_to_fp32>;
        case GgmlType::BF16:
            return dot_half<bf16_to_fp32>;
        case GgmlType::Q4_0:
            return dot_symmetric32<BlockQ4_0, 8>;
        case GgmlType::Q4_1:
            return dot_affine32<BlockQ4_1>;
        case GgmlType::Q5_0:
            return dot_symmetric32<BlockQ5_0, 16>;
        case GgmlType::Q5_1:
            return dot_affine32<BlockQ5_1>;
        case GgmlType::Q8_0:
            return dot_q8_0;
        case GgmlType::IQ4_NL:
            return dot_iq4_nl;
        case GgmlType::Q2_K:
            return dot_q2_K;
        case GgmlType::Q3_K:
            return dot_q3_K;
        case GgmlType::Q4_K:
            return dot_q4_5_K<BlockQ4_K>;
        case GgmlType::Q5_K:
            return dot_q4_5_K<BlockQ5_K>;
        case GgmlType::Q6_K:
            return dot_q6_K;
        default:
            return nullptr;
    }
}

}  // namespace fitllm::quant::detail
