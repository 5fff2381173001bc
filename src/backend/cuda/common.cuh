#pragma once
// Shared by the .cu files: the checked-call helper and the device-side decoding of ggml blocks.
// The layouts are quant/blocks.h's, mirrored element for element (quant_of); the products are
// grouped as quant/dequantize.cpp groups them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cuda/kernels.h"
#include "quant/ggml_type.h"

namespace fitllm::backend::cuda {

// Throws CudaError "<call>: <cudaGetErrorString>" unless err is cudaSuccess.
inline void check(cudaError_t err, const char* call) {
    if (err != cudaSuccess) {
        throw CudaError(std::string(call) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
    }
}
#define FITLLM_CUDA_CHECK(call) ::fitllm::backend::cuda::check((call), #call)
// After a launch: a bad configuration shows up here, a fault in the kernel at the next sync.
#define FITLLM_CUDA_LAUNCHED(name) ::fitllm::backend::cuda::check(cudaGetLastError(), name)

inline cudaStream_t as_stream(Stream s) {
    return static_cast<cudaStream_t>(s);
}

// Decoding runs on the device and, for tests without a GPU, on the host (decode_row_on_host).
#define FITLLM_HD __host__ __device__ __forceinline__

inline int blocks_for(int64_t n, int per_block) {
    return static_cast<int>((n + per_block - 1) / per_block);
}

FITLLM_HD float half_at(const uint8_t* p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return __half2float(__ushort_as_half(h));
}
FITLLM_HD float bf16_at(const uint8_t* p) {
    uint16_t h;
    memcpy(&h, p, 2);
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
    return v;
}

// ---- Blocks ------------------------------------------------------------------------------------
// Decoder<T>: kElems values in kBytes bytes per block; decode8(block, e, out) writes elements
// e .. e + 7 of the block (e a multiple of 8) as floats.
using quant::GgmlType;

template <GgmlType T>
struct Decoder;

template <>
struct Decoder<GgmlType::F32> {
    static constexpr int kElems = 8, kBytes = 32;  // "blocks" of 8 floats
    FITLLM_HD static void decode8(const uint8_t* b, int, float* out) {
#pragma unroll
        for (int i = 0; i < 8; ++i) memcpy(&out[i], b + 4 * i, 4);
    }
};
template <>
struct Decoder<GgmlType::F16> {
    static constexpr int kElems = 8, kBytes = 16;
    FITLLM_HD static void decode8(const uint8_t* b, int, float* out) {
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = half_at(b + 2 * i);
    }
};
template <>
struct Decoder<GgmlType::BF16> {
    static constexpr int kElems = 8, kBytes = 16;
    FITLLM_HD static void decode8(const uint8_t* b, int, float* out) {
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = bf16_at(b + 2 * i);
    }
};

// The 4-bit quant of element l of a legacy block: qs[l] low nibble for l < 16, else qs[l - 16] high.
FITLLM_HD int legacy_nibble(const uint8_t* qs, int l) {
    return l < 16 ? (qs[l] & 0x0F) : (qs[l - 16] >> 4);
}
FITLLM_HD uint32_t u32_at(const uint8_t* p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

template <>
struct Decoder<GgmlType::Q4_0> {  // d, qs[16]: x = d (q - 8)
    static constexpr int kElems = 32, kBytes = 18;
    FITLLM_HD static void decode8(const uint8_t* b, int e, float* out) {
        const float d = half_at(b);
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = d * static_cast<float>(legacy_nibble(b + 2, e + i) - 8);
    }
};
template <>
struct Decoder<GgmlType::Q4_1> {  // d, m, qs[16]: x = d q + m
    static constexpr int kElems = 32, kBytes = 20;
    FITLLM_HD static void decode8(const uint8_t* b, int e, float* out) {
        const float d = half_at(b), m = half_at(b + 2);
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = d * static_cast<float>(legacy_nibble(b + 4, e + i)) + m;
    }
};
template <>
struct Decoder<GgmlType::Q5_0> {  // d, qh[4], qs[16]: x = d (q - 16), bit 4 = bit l of qh
    static constexpr int kElems = 32, kBytes = 22;
    FITLLM_HD static void decode8(const uint8_t* b, int e, float* out) {
        const float d = half_at(b);
        const uint32_t qh = u32_at(b + 2);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int q = legacy_nibble(b + 6, e + i) | (((qh >> (e + i)) & 1) << 4);
            out[i] = d * static_cast<float>(q - 16);
        }
    }
};
template <>
struct Decoder<GgmlType::Q5_1> {  // d, m, qh[4], qs[16]: x = d q + m
    static constexpr int kElems = 32, kBytes = 24;
    FITLLM_HD static void decode8(const uint8_t* b, int e, float* out) {
        const float d = half_at(b), m = half_at(b + 2);
        const uint32_t qh = u32_at(b + 4);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int q = legacy_nibble(b + 8, e + i) | (((qh >> (e + i)) & 1) << 4);
            out[i] = d * static_cast<float>(q) + m;
        }
    }
};
template <>
struct Decoder<GgmlType::Q8_0> {  // d, qs[32]: x = d q
    static constexpr int kElems = 32, kBytes = 34;
    FITLLM_HD static void decode8(const uint8_t* b, int e, float* out) {
        const float d = half_at(b);
        const auto* qs = reinterpret_cast<const int8_t*>(b + 2);
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = d * static_cast<float>(qs[e + i]);
    }
};
template <>
struct Decoder<GgmlType::IQ4_NL> {  // d, qs[16]: x = d kValuesIQ4NL[q]
    static constexpr int kElems = 32, kBytes = 18;
    FITLLM_HD static void decode8(const uint8_t* b, int e, float* out) {
        constexpr int8_t kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
        const float d = half_at(b);
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = d * static_cast<float>(kValues[legacy_nibble(b + 2, e + i)]);
    }
};

// k-quants: element e = 128 h + 32 g + l; the 8 elements e .. e + 7 share h, g and the sub-block.
template <>
struct Decoder<GgmlType::Q2_K> {  // scales[16], qs[64], d, dmin
    static constexpr int kElems = 256, kBytes = 84;
    FITLLM_HD static void decode8(const uint8_t* b, int e, float* out) {
        const float d = half_at(b + 80), dmin = half_at(b + 82);
        const uint8_t sc = b[e / 16];
        const float dl = d * static_cast<float>(sc & 0x0F), ml = dmin * static_cast<float>(sc >> 4);
        const uint8_t* qs = b + 16 + 32 * (e / 128) + e % 32;
        const int shift = 2 * ((e / 32) % 4);
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = dl * static_cast<float>((qs[i] >> shift) & 3) - ml;
    }
};
template <>
struct Decoder<GgmlType::Q3_K> {  // hmask[32], qs[64], scales[12], d
    static constexpr int kElems = 256, kBytes = 110;
    FITLLM_HD static void decode8(const uint8_t* b, int e, float* out) {
        const uint8_t* scales = b + 96;
        const int j = e / 16;
        const int low = j < 8 ? (scales[j] & 0x0F) : (scales[j - 8] >> 4);
        const int high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
        const float dl = half_at(b + 108) * static_cast<float>((low | (high << 4)) - 32);
        const uint8_t* qs = b + 32 + 32 * (e / 128) + e % 32;
        const uint8_t* hm = b + e % 32;
        const int shift = 2 * ((e / 32) % 4), hbit = e / 32;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int q = ((qs[i] >> shift) & 3) | (((hm[i] >> hbit) & 1) << 2);
            out[i] = dl * static_cast<float>(q - 4);
        }
    }
};
// Q4_K / Q5_K: 6-bit scale and min of sub-block j < 8 from the 12 packed bytes.
FITLLM_HD void q4k_scale_min(const uint8_t* s, int j, int& sc, int& mn) {
    if (j < 4) {
        sc = s[j] & 63;
        mn = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}
template <>
struct Decoder<GgmlType::Q4_K> {  // d, dmin, scales[12], qs[128]
    static constexpr int kElems = 256, kBytes = 144;
    FITLLM_HD static void decode8(const uint8_t* b, int e, float* out) {
        int sc, mn;
        q4k_scale_min(b + 4, e / 32, sc, mn);
        const float dl = half_at(b) * static_cast<float>(sc), ml = half_at(b + 2) * static_cast<float>(mn);
        const uint8_t* qs = b + 16 + 32 * (e / 64) + e % 32;
        const int shift = (e / 32) % 2 == 0 ? 0 : 4;
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = dl * static_cast<float>((qs[i] >> shift) & 0x0F) - ml;
    }
};
template <>
struct Decoder<GgmlType::Q5_K> {  // d, dmin, scales[12], qh[32], qs[128]
    static constexpr int kElems = 256, kBytes = 176;
    FITLLM_HD static void decode8(const uint8_t* b, int e, float* out) {
        int sc, mn;
        q4k_scale_min(b + 4, e / 32, sc, mn);
        const float dl = half_at(b) * static_cast<float>(sc), ml = half_at(b + 2) * static_cast<float>(mn);
        const uint8_t* qh = b + 16 + e % 32;
        const uint8_t* qs = b + 48 + 32 * (e / 64) + e % 32;
        const int shift = (e / 32) % 2 == 0 ? 0 : 4, hbit = e / 32;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int q = ((qs[i] >> shift) & 0x0F) | (((qh[i] >> hbit) & 1) << 4);
            out[i] = dl * static_cast<float>(q) - ml;
        }
    }
};
template <>
struct Decoder<GgmlType::Q6_K> {  // ql[128], qh[64], scales[16] (int8), d
    static constexpr int kElems = 256, kBytes = 210;
    FITLLM_HD static void decode8(const uint8_t* b, int e, float* out) {
        const int h = e / 128, g = (e / 32) % 4, l = e % 32;
        const float dl = half_at(b + 208) * static_cast<float>(static_cast<int8_t>(b[192 + e / 16]));
        const uint8_t* ql = b + 64 * h + 32 * (g % 2) + l;
        const uint8_t* qh = b + 128 + 32 * h + l;
        const int shift = g < 2 ? 0 : 4;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int q = ((ql[i] >> shift) & 0x0F) | (((qh[i] >> (2 * g)) & 3) << 4);
            out[i] = dl * static_cast<float>(q - 32);
        }
    }
};

// Elements e .. e + 7 of a row of type T (e a multiple of 8).
template <GgmlType T>
FITLLM_HD void decode8_of_row(const uint8_t* row, int64_t e, float* out) {
    using D = Decoder<T>;
    D::decode8(row + (e / D::kElems) * D::kBytes, static_cast<int>(e % D::kElems), out);
}

// Element e of a K or V head of `type` (kv_read_supports' types; 0 for others).
FITLLM_HD float kv_elem(GgmlType type, const uint8_t* head, int e) {
    switch (type) {
        case GgmlType::F32: {
            float v;
            memcpy(&v, head + 4 * e, 4);
            return v;
        }
        case GgmlType::F16:
            return half_at(head + 2 * e);
        case GgmlType::BF16:
            return bf16_at(head + 2 * e);
        default:
            break;
    }
    float out[8];
    const int l = e % 32, base = l / 8 * 8;
    switch (type) {
        case GgmlType::Q8_0: {
            const uint8_t* b = head + (e / 32) * 34;
            return half_at(b) * static_cast<float>(static_cast<int8_t>(b[2 + l]));
        }
        case GgmlType::Q4_0:
            Decoder<GgmlType::Q4_0>::decode8(head + (e / 32) * 18, base, out);
            break;
        case GgmlType::Q4_1:
            Decoder<GgmlType::Q4_1>::decode8(head + (e / 32) * 20, base, out);
            break;
        case GgmlType::Q5_0:
            Decoder<GgmlType::Q5_0>::decode8(head + (e / 32) * 22, base, out);
            break;
        case GgmlType::Q5_1:
            Decoder<GgmlType::Q5_1>::decode8(head + (e / 32) * 24, base, out);
            break;
        case GgmlType::IQ4_NL:
            Decoder<GgmlType::IQ4_NL>::decode8(head + (e / 32) * 18, base, out);
            break;
        default:
            return 0.0f;
    }
    return out[l % 8];
}

// ---- Encoding (kv_store) ---------------------------------------------------------------------------
// The host's quantizers (quant/quantize.cpp) round every product and every sum (they are built
// without FMA): the device must not fuse them into multiply-adds where the two could differ.
FITLLM_HD float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
FITLLM_HD float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
// Round to nearest, ties to even (std::nearbyint in the default rounding mode).
FITLLM_HD int round_even(float v) {
#ifdef __CUDA_ARCH__
    return __float2int_rn(v);
#else
    return static_cast<int>(std::nearbyint(v));
#endif
}
FITLLM_HD int clamp_int(int v, int lo, int hi) {
    return v < lo ? lo : (v > hi ? hi : v);
}
FITLLM_HD float half_rounded(float f) {
    return __half2float(__float2half_rn(f));
}
FITLLM_HD void store_half(uint8_t* p, float f) {
    const uint16_t h = __half_as_ushort(__float2half_rn(f));
    memcpy(p, &h, 2);
}
FITLLM_HD int iq4nl_value(int i) {
    constexpr int8_t kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    return kValues[i];
}

// Each encoder writes one block of 32 values as quant::quantize_row writes it.
// Q8_0: d = max|x| / 127, q = x * (127 / max|x|) rounded to nearest even.
FITLLM_HD void encode_q8_0(const float* x, uint8_t* b) {
    float amax = 0.0f;
    for (int l = 0; l < 32; ++l) amax = fmaxf(amax, fabsf(x[l]));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int l = 0; l < 32; ++l) b[2 + l] = static_cast<uint8_t>(static_cast<int8_t>(round_even(x[l] * id)));
    store_half(b, d);
}
// The 4 low bits of q[l] and q[l + 16] share byte l; bit 4 of each q goes to qh (5-bit types).
FITLLM_HD void pack_nibbles(const int* q, uint8_t* qs) {
    for (int l = 0; l < 16; ++l) qs[l] = static_cast<uint8_t>((q[l] & 0x0F) | ((q[l + 16] & 0x0F) << 4));
}
FITLLM_HD void pack_high_bits(const int* q, uint8_t* qh) {
    uint32_t bits = 0;
    for (int l = 0; l < 32; ++l) bits |= static_cast<uint32_t>(q[l] >> 4) << l;
    memcpy(qh, &bits, 4);
}
// Q4_0 / Q5_0: the value of largest magnitude maps to -2^(bits-1); d rounded to f16 first.
template <int kBits>
FITLLM_HD void encode_symmetric(const float* x, uint8_t* b) {
    constexpr int kOffset = 1 << (kBits - 1), kMax = (1 << kBits) - 1;
    float max = 0.0f;
    for (int l = 0; l < 32; ++l) {
        if (fabsf(x[l]) > fabsf(max)) max = x[l];
    }
    const float d = half_rounded(max / -static_cast<float>(kOffset));
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[32];
    for (int l = 0; l < 32; ++l) q[l] = clamp_int(round_even(x[l] * id) + kOffset, 0, kMax);
    store_half(b, d);
    if constexpr (kBits == 5) pack_high_bits(q, b + 2);
    pack_nibbles(q, b + (kBits == 5 ? 6 : 2));
}
// Q4_1 / Q5_1: x = d q + m over [min, max], d and m rounded to f16 first.
template <int kBits>
FITLLM_HD void encode_affine(const float* x, uint8_t* b) {
    constexpr int kMax = (1 << kBits) - 1;
    float lo = x[0], hi = x[0];
    for (int l = 1; l < 32; ++l) {
        if (x[l] < lo) lo = x[l];
        if (x[l] > hi) hi = x[l];
    }
    const float d = half_rounded((hi - lo) / kMax), m = half_rounded(lo);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[32];
    for (int l = 0; l < 32; ++l) q[l] = clamp_int(round_even((x[l] - m) * id), 0, kMax);
    store_half(b, d);
    store_half(b + 2, m);
    if constexpr (kBits == 5) pack_high_bits(q, b + 4);
    pack_nibbles(q, b + (kBits == 5 ? 8 : 4));
}
// IQ4_NL as quant::quantize_row (llama.cpp's quantize_row_iq4_nl_ref): the indices of the scale
// mapping the largest |x| to -127, nearest table value with ties going up, then d the x^2-weighted
// least-squares fit of those values.
FITLLM_HD int nearest_iq4_nl(float x) {
    float x2 = x + x;
    x2 = x2 >= -256.0f ? fminf(x2, 255.0f) : -256.0f;  // NaN: the low end
    int floor = static_cast<int>(x2);
    floor -= static_cast<float>(floor) > x2 ? 1 : 0;
    int index = 0;
    for (int j = 1; j < 16; ++j) index += floor >= iq4nl_value(j - 1) + iq4nl_value(j) ? 1 : 0;
    return index;
}
FITLLM_HD void encode_iq4_nl(const float* x, uint8_t* b) {
    float amax = 0.0f, max = 0.0f;
    for (int l = 0; l < 32; ++l) {
        if (fabsf(x[l]) > amax) {
            amax = fabsf(x[l]);
            max = x[l];
        }
    }
    int index[32] = {};
    float d = 0.0f;
    if (amax >= 1e-15f) {
        const float id = 1.0f / (max / static_cast<float>(iq4nl_value(0)));
        float sumqx = 0.0f, sumq2 = 0.0f;
        for (int l = 0; l < 32; ++l) {
            index[l] = nearest_iq4_nl(mul_rn(id, x[l]));
            const float q = static_cast<float>(iq4nl_value(index[l]));
            const float wq = mul_rn(mul_rn(x[l], x[l]), q);
            sumqx = add_rn(sumqx, mul_rn(wq, x[l]));
            sumq2 = add_rn(sumq2, mul_rn(wq, q));
        }
        d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
    }
    store_half(b, d);
    pack_nibbles(index, b + 2);
}

// The bytes of a block of 32 of a quantized KV type (0 for others).
FITLLM_HD int block32_bytes(GgmlType type) {
    switch (type) {
        case GgmlType::Q8_0:
            return 34;
        case GgmlType::Q4_0:
        case GgmlType::IQ4_NL:
            return 18;
        case GgmlType::Q4_1:
            return 20;
        case GgmlType::Q5_0:
            return 22;
        case GgmlType::Q5_1:
            return 24;
        default:
            return 0;
    }
}
FITLLM_HD void encode_block32(GgmlType type, const float* x, uint8_t* b) {
    switch (type) {
        case GgmlType::Q8_0:
            return encode_q8_0(x, b);
        case GgmlType::Q4_0:
            return encode_symmetric<4>(x, b);
        case GgmlType::Q5_0:
            return encode_symmetric<5>(x, b);
        case GgmlType::Q4_1:
            return encode_affine<4>(x, b);
        case GgmlType::Q5_1:
            return encode_affine<5>(x, b);
        case GgmlType::IQ4_NL:
            return encode_iq4_nl(x, b);
        default:
            return;
    }
}

// Calls fn(std::integral_constant-like tag) for a runtime type among those with a Decoder.
template <GgmlType T>
struct TypeTag {
    static constexpr GgmlType value = T;
};
template <class Fn>
bool dispatch_type(GgmlType type, Fn&& fn) {
    switch (type) {
        case GgmlType::F32:
            return fn(TypeTag<GgmlType::F32>{}), true;
        case GgmlType::F16:
            return fn(TypeTag<GgmlType::F16>{}), true;
        case GgmlType::BF16:
            return fn(TypeTag<GgmlType::BF16>{}), true;
        case GgmlType::Q4_0:
            return fn(TypeTag<GgmlType::Q4_0>{}), true;
        case GgmlType::Q4_1:
            return fn(TypeTag<GgmlType::Q4_1>{}), true;
        case GgmlType::Q5_0:
            return fn(TypeTag<GgmlType::Q5_0>{}), true;
        case GgmlType::Q5_1:
            return fn(TypeTag<GgmlType::Q5_1>{}), true;
        case GgmlType::Q8_0:
            return fn(TypeTag<GgmlType::Q8_0>{}), true;
        case GgmlType::Q2_K:
            return fn(TypeTag<GgmlType::Q2_K>{}), true;
        case GgmlType::Q3_K:
            return fn(TypeTag<GgmlType::Q3_K>{}), true;
        case GgmlType::Q4_K:
            return fn(TypeTag<GgmlType::Q4_K>{}), true;
        case GgmlType::Q5_K:
            return fn(TypeTag<GgmlType::Q5_K>{}), true;
        case GgmlType::Q6_K:
            return fn(TypeTag<GgmlType::Q6_K>{}), true;
        default:
            return false;
    }
}

}  // namespace fitllm::backend::cuda
