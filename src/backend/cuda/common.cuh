#pragma once
// Shared by the .cu files: the checked-call helper and the device-side decoding of ggml blocks.
// The layouts are quant/blocks.h's, mirrored element for element (quant_of); the products are
// grouped as quant/dequantize.cpp groups them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

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
