#include "ops/activation.h"

#include <immintrin.h>

// GCC 12 warns about the deliberately undefined pass-through operands inside its own AVX-512
// intrinsics (_mm512_undefined_*) once they are inlined here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "ops/cpu.h"
#include "quant/blocks.h"
#include "quant/cpu_features.h"

namespace fitllm::ops {
namespace {

// gelu between -10 and 10, for x already an f16 value: the formula (gelu_tanh_exact), its result
// rounded to f16.
float gelu_of_half(float x_half) {
    return quant::fp16_to_fp32(quant::fp32_to_fp16(gelu_tanh_exact(x_half)));
}

// gelu of every f16 value, indexed by its bits, as float (so the AVX2 path can gather it). Built
// on first use; C++ makes the initialization of a function-local static thread-safe.
const float* gelu_table() {
    static const std::unique_ptr<float[]> table = [] {
        auto t = std::make_unique<float[]>(1u << 16);
        for (uint32_t h = 0; h < (1u << 16); ++h) {
            t[h] = gelu_of_half(quant::fp16_to_fp32(static_cast<uint16_t>(h)));
        }
        return t;
    }();
    return table.get();
}

[[gnu::always_inline]] inline float gelu_lookup(const float* table, float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return table[quant::fp32_to_fp16(x)];
}

bool has_avx2_f16c() {
    const quant::CpuFeatures& f = cpu();
    return f.avx2 && f.fma && f.f16c;
}

// gelu of 8 floats: F16C rounds them to the table index (round to nearest even, as
// fp32_to_fp16), a gather reads the table, and the two clamps are blends.
__attribute__((target("avx2,fma,f16c"))) inline __m256 gelu8(const float* table, __m256 x) {
    const __m256i index = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    __m256 g = _mm256_i32gather_ps(table, index, 4);
    g = _mm256_blendv_ps(g, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-10.0f), _CMP_LE_OQ));
    return _mm256_blendv_ps(g, x, _mm256_cmp_ps(x, _mm256_set1_ps(10.0f), _CMP_GE_OQ));
}

__attribute__((target("avx2,fma,f16c"))) void gelu_avx2(const float* table, const float* x, int64_t n, float* y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, gelu8(table, _mm256_loadu_ps(x + i)));
    for (; i < n; ++i) y[i] = gelu_lookup(table, x[i]);
}

// gelu(gate) * up, but +0 (not gelu's 0 times up, which may be -0) where gate <= -10, as
// ggml_vec_geglu_f32 stores.
[[gnu::always_inline]] inline float geglu_one(const float* table, float gate, float up) {
    return gate <= -10.0f ? 0.0f : gelu_lookup(table, gate) * up;
}

__attribute__((target("avx2,fma,f16c"))) void geglu_avx2(const float* table, const float* gate, const float* up,
                                                         int64_t n, float* y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(gate + i);
        const __m256 product = _mm256_mul_ps(gelu8(table, x), _mm256_loadu_ps(up + i));
        const __m256 low = _mm256_cmp_ps(x, _mm256_set1_ps(-10.0f), _CMP_LE_OQ);
        _mm256_storeu_ps(y + i, _mm256_andnot_ps(low, product));
    }
    for (; i < n; ++i) y[i] = geglu_one(table, gate[i], up[i]);
}

// exp as ggml's AVX-512 kernels compute it (ggml_v_expf of ggml-cpu's vec.h, the AVX512F variant):
// x = n ln2 + b with n = round(x / ln2) found by adding and subtracting 1.5 * 2^23, b reduced with
// ln2 split in two, 2^b from a degree-5 polynomial in b evaluated as (c5 b + c4) u^2 ... with
// u = b^2, then scaled by 2^n (vscalefps); where |n| > 192 the result is 0 (n <= 0) or infinity.
// Every multiply-add below is one fused operation there.
constexpr float kExpShift = 0x1.8p23f;
constexpr float kLog2e = 0x1.715476p+0f;
constexpr float kLn2Hi = 0x1.62e4p-1f;
constexpr float kLn2Lo = 0x1.7f7d1cp-20f;
constexpr float kC1 = 0x1.ffffecp-1f;
constexpr float kC2 = 0x1.fffdb6p-2f;
constexpr float kC3 = 0x1.555e66p-3f;
constexpr float kC4 = 0x1.573e2ep-5f;
constexpr float kC5 = 0x1.0e4020p-7f;

__attribute__((target("avx512f,fma"))) inline __m512 ggml_like_exp16(__m512 x) {
    const __m512 shift = _mm512_set1_ps(kExpShift);
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(kLog2e), shift), shift);
    const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x));
    const __m512 abs_n = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(n), _mm512_set1_epi32(0x7FFFFFFF)));
    const __mmask16 huge = _mm512_cmp_ps_mask(abs_n, _mm512_set1_ps(192.0f), _CMP_GT_OQ);
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 high = _mm512_fmadd_ps(_mm512_set1_ps(kC5), b, _mm512_set1_ps(kC4));
    const __m512 mid = _mm512_fmadd_ps(_mm512_set1_ps(kC3), b, _mm512_set1_ps(kC2));
    const __m512 low = _mm512_fmadd_ps(_mm512_set1_ps(kC1), b, _mm512_set1_ps(1.0f));
    const __m512 poly = _mm512_fmadd_ps(_mm512_fmadd_ps(high, u, mid), u, low);
    const __m512 result = _mm512_scalef_ps(poly, n);
    if (huge == 0) return result;
    const __mmask16 non_positive = _mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ);
    const __m512 saturated = _mm512_mask_blend_ps(non_positive, _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
    return _mm512_mask_blend_ps(huge, result, saturated);
}

// silu as ggml_v_silu: x / (1 + exp(-x)), with -x computed as 0 - x.
__attribute__((target("avx512f,fma"))) inline __m512 ggml_like_silu16(__m512 x) {
    const __m512 e = ggml_like_exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

__attribute__((target("avx512f,fma"))) void silu_avx512(const float* x, int64_t n, float* y) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, ggml_like_silu16(_mm512_loadu_ps(x + i)));
    for (; i < n; ++i) y[i] = silu(x[i]);
}

__attribute__((target("avx512f,fma"))) void swiglu_avx512(const float* gate, const float* up, int64_t n, float* y) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(y + i, _mm512_mul_ps(ggml_like_silu16(_mm512_loadu_ps(gate + i)), _mm512_loadu_ps(up + i)));
    }
    for (; i < n; ++i) y[i] = silu(gate[i]) * up[i];
}

bool has_avx512() {
    return cpu().avx512f && cpu().fma;
}

// ggml_like_exp16 in 8 lanes for AVX2: the same fused steps; AVX2 has no vscalefps, so poly * 2^n
// is two products by 2^(n/2) and 2^(n - n/2) (|n| <= 192: both powers normal, the first product
// exact), the second rounding once as ldexp does where the result is subnormal.
__attribute__((target("avx2,fma"))) inline __m256 ggml_like_exp8(__m256 x) {
    const __m256 shift = _mm256_set1_ps(kExpShift);
    const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), shift), shift);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 high = _mm256_fmadd_ps(_mm256_set1_ps(kC5), b, _mm256_set1_ps(kC4));
    const __m256 mid = _mm256_fmadd_ps(_mm256_set1_ps(kC3), b, _mm256_set1_ps(kC2));
    const __m256 low = _mm256_fmadd_ps(_mm256_set1_ps(kC1), b, _mm256_set1_ps(1.0f));
    const __m256 poly = _mm256_fmadd_ps(_mm256_fmadd_ps(high, u, mid), u, low);
    const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 huge = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    const __m256i ni = _mm256_cvtps_epi32(_mm256_andnot_ps(huge, n));  // n integral here
    const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    __m256 result = _mm256_mul_ps(_mm256_mul_ps(poly, p1), p2);
    const __m256 nan = _mm256_cmp_ps(n, n, _CMP_UNORD_Q);
    if (_mm256_movemask_ps(_mm256_or_ps(huge, nan)) == 0) return result;
    const __m256 saturated = _mm256_blendv_ps(_mm256_set1_ps(INFINITY), _mm256_setzero_ps(),
                                              _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ));
    result = _mm256_blendv_ps(result, saturated, huge);
    return _mm256_blendv_ps(result, n, nan);
}

__attribute__((target("avx2,fma"))) inline __m256 ggml_like_silu8(__m256 x) {
    const __m256 e = ggml_like_exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

// As silu_avx512 / swiglu_avx512: whole groups of 16 by the formula, the rest by std::exp.
__attribute__((target("avx2,fma"))) void silu_avx2(const float* x, int64_t n, float* y) {
    int64_t i = 0;
    const int64_t whole = n / 16 * 16;
    for (; i < whole; i += 8) _mm256_storeu_ps(y + i, ggml_like_silu8(_mm256_loadu_ps(x + i)));
    for (; i < n; ++i) y[i] = silu(x[i]);
}

__attribute__((target("avx2,fma"))) void swiglu_avx2(const float* gate, const float* up, int64_t n, float* y) {
    int64_t i = 0;
    const int64_t whole = n / 16 * 16;
    for (; i < whole; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_mul_ps(ggml_like_silu8(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
    }
    for (; i < n; ++i) y[i] = silu(gate[i]) * up[i];
}

bool has_avx2_fma() {
    return cpu().avx2 && cpu().fma;
}

}  // namespace

void softmax(float* x, int64_t n) {
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) max = std::fmax(max, x[i]);
    if (max == -std::numeric_limits<float>::infinity()) {
        for (int64_t i = 0; i < n; ++i) x[i] = 0.0f;
        return;
    }
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - max);
        sum += x[i];
    }
    const auto inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float silu(float x) {
    return x / (1.0f + std::exp(-x));
}

float exp_ggml_simd(float x) {
    const float n = std::fma(x, kLog2e, kExpShift) - kExpShift;
    const float b = std::fma(-n, kLn2Lo, std::fma(-n, kLn2Hi, x));
    const float u = b * b;
    const float poly = std::fma(std::fma(std::fma(kC5, b, kC4), u, std::fma(kC3, b, kC2)), u, std::fma(kC1, b, 1.0f));
    if (std::isnan(n)) return n;
    if (std::fabs(n) > 192.0f) return n <= 0.0f ? 0.0f : std::numeric_limits<float>::infinity();
    return std::ldexp(poly, static_cast<int>(n));  // vscalefps: poly * 2^n, n integral here
}

float silu_ggml_simd(float x) {
    return x / (1.0f + exp_ggml_simd(0.0f - x));
}

float gelu_tanh_exact(float x) {
    constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
    constexpr float kCubic = 0.044715f;
    // 1 + (0.044715 x) x as one fused multiply-add, as llama.cpp's build contracts it when it fills
    // its gelu table (ggml_gelu_f32); std::fma is that rounding on any CPU.
    const float inner = std::fma(kCubic * x, x, 1.0f);
    return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * inner));
}

float gelu(float x) {
    return gelu_lookup(gelu_table(), x);
}

void silu(const float* x, int64_t n, float* y) {
    if (has_avx512()) return silu_avx512(x, n, y);
    if (has_avx2_fma()) return silu_avx2(x, n, y);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        for (int lane = 0; lane < 16; ++lane) y[i + lane] = silu_ggml_simd(x[i + lane]);
    }
    for (; i < n; ++i) y[i] = silu(x[i]);
}

void gelu(const float* x, int64_t n, float* y) {
    const float* table = gelu_table();
    if (has_avx2_f16c()) return gelu_avx2(table, x, n, y);
    for (int64_t i = 0; i < n; ++i) y[i] = gelu_lookup(table, x[i]);
}

void swiglu(const float* gate, const float* up, int64_t n, float* y) {
    if (has_avx512()) return swiglu_avx512(gate, up, n, y);
    if (has_avx2_fma()) return swiglu_avx2(gate, up, n, y);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        for (int lane = 0; lane < 16; ++lane) y[i + lane] = silu_ggml_simd(gate[i + lane]) * up[i + lane];
    }
    for (; i < n; ++i) y[i] = silu(gate[i]) * up[i];
}

void swiglu_oai(const float* gate, const float* up, int64_t n, float alpha, float limit, float* y) {
    for (int64_t i = 0; i < n; ++i) {
        const float x = std::min(gate[i], limit);
        const float u = std::clamp(up[i], -limit, limit);
        const float glu = x / (1.0f + std::exp(alpha * (-x)));
        y[i] = glu * (u + 1.0f);
    }
}

void geglu(const float* gate, const float* up, int64_t n, float* y) {
    const float* table = gelu_table();
    if (has_avx2_f16c()) return geglu_avx2(table, gate, up, n, y);
    for (int64_t i = 0; i < n; ++i) y[i] = geglu_one(table, gate[i], up[i]);
}
void softcap(float* x, int64_t n, float cap) {
    const float inv_cap = 1.0f / cap;
    for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] * inv_cap);
}

void add(const float* a, const float* b, int64_t n, float* y) {
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void add_bias(float* x, const float* bias, int64_t n_tok, int64_t n) {
    for (int64_t t = 0; t < n_tok; ++t) add(x + t * n, bias, n, x + t * n);
}

void scale(float* x, int64_t n, float s) {
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace fitllm::ops
