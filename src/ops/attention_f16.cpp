#include "ops/attention_f16.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace fitllm::ops {
namespace {

// Written with bit masks rather than branches or selects so that loops over it vectorize.
[[gnu::always_inline]] inline float round_to_f16_inline(float x) {
    const uint32_t bits = __builtin_bit_cast(uint32_t, x);
    const uint32_t abs_bits = bits & 0x7FFFFFFFu;
    // Normal halves: keep 10 mantissa bits, rounding to nearest even.
    const uint32_t normal = (bits + 0xFFFu + ((bits >> 13) & 1u)) & 0xFFFFE000u;
    // Subnormal halves (below 2^-14) are multiples of 2^-24: adding 0.75, whose ulp is 2^-24,
    // rounds to one.
    const uint32_t subnormal = __builtin_bit_cast(uint32_t, (x + 0.75f) - 0.75f);
    const uint32_t infinity = (bits & 0x80000000u) | 0x7F800000u;
    const uint32_t is_subnormal = 0u - static_cast<uint32_t>(abs_bits < 0x38800000u);
    const uint32_t is_overflow = 0u - static_cast<uint32_t>(abs_bits >= 0x477FF000u);  // 65520 and up
    const uint32_t is_nan = 0u - static_cast<uint32_t>(abs_bits > 0x7F800000u);
    uint32_t r = (subnormal & is_subnormal) | (normal & ~is_subnormal);
    r = (infinity & is_overflow) | (r & ~is_overflow);
    r = (bits & is_nan) | (r & ~is_nan);
    return __builtin_bit_cast(float, r);
}

[[gnu::always_inline]] inline bool visible(int32_t key_pos, int32_t query_pos, int sliding_window) {
    if (key_pos > query_pos) return false;
    return sliding_window <= 0 || static_cast<int64_t>(key_pos) > static_cast<int64_t>(query_pos) - sliding_window;
}

// a * b + c rounded once, as the FMA instructions ggml's kernels use compute it. With kFma the
// instruction itself; otherwise in double, where the product of two floats is exact, so only
// the sum rounds (and then the conversion, which agrees but in rare double-rounding cases).
template <bool kFma>
[[gnu::always_inline]] inline float fused_multiply_add(float a, float b, float c) {
    if constexpr (kFma) return __builtin_fmaf(a, b, c);
    return static_cast<float>(static_cast<double>(a) * static_cast<double>(b) + static_cast<double>(c));
}

// q·k in float with the summation shape of ggml's AVX2 f16 dot (4 accumulators of 8 lanes, then
// pairwise reduction), so the scores agree to the last bit in the common case.
template <bool kFma>
[[gnu::always_inline]] inline float dot_like_ggml(const float* a, const float* b, int n) {
    float acc[4][8] = {};
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        for (int r = 0; r < 4; ++r) {
            for (int lane = 0; lane < 8; ++lane) {
                acc[r][lane] = fused_multiply_add<kFma>(a[i + 8 * r + lane], b[i + 8 * r + lane], acc[r][lane]);
            }
        }
    }
    float s8[8];
    for (int lane = 0; lane < 8; ++lane) s8[lane] = (acc[0][lane] + acc[2][lane]) + (acc[1][lane] + acc[3][lane]);
    float s4[4];
    for (int lane = 0; lane < 4; ++lane) s4[lane] = s8[lane] + s8[lane + 4];
    float sum = (s4[0] + s4[1]) + (s4[2] + s4[3]);
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

// One query head against every visible key: the online softmax of llama.cpp's f16 path.
template <bool kFma>
[[gnu::always_inline]] inline void attend_one_impl(const float* q, int32_t q_pos, const float* k, const float* v,
                                                   const int32_t* kv_pos, int64_t n_kv, int64_t kv_row_stride,
                                                   const AttentionParams& p, float* __restrict q16,
                                                   float* __restrict acc, float* __restrict out) {
    const int d = p.head_dim;
    for (int i = 0; i < d; ++i) q16[i] = round_to_f16_inline(q[i]);
    for (int i = 0; i < d; ++i) acc[i] = 0.0f;
    float running_max = -std::numeric_limits<float>::infinity();
    float sum = 0.0f;
    for (int64_t j = 0; j < n_kv; ++j) {
        if (!visible(kv_pos[j], q_pos, p.sliding_window)) continue;
        float s = dot_like_ggml<kFma>(q16, k + j * kv_row_stride, d) * p.scale;
        if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
        float rescale = 1.0f;
        float weight = 1.0f;
        if (s > running_max) {
            rescale = std::exp(running_max - s);
            running_max = s;
            for (int i = 0; i < d; ++i) acc[i] = round_to_f16_inline(acc[i] * rescale);
        } else {
            weight = std::exp(s - running_max);
        }
        const float* __restrict vj = v + j * kv_row_stride;
        for (int i = 0; i < d; ++i) acc[i] = round_to_f16_inline(fused_multiply_add<kFma>(vj[i], weight, acc[i]));
        sum = fused_multiply_add<kFma>(sum, rescale, weight);
    }
    const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
    for (int i = 0; i < d; ++i) out[i] = acc[i] * inv;
}

// Compiled twice: for AVX2 with FMA, where the loops above vectorize 8 wide and the multiply-adds
// are single instructions, and for the baseline. Both give the same results.
using AttendFn = void (*)(const float*, int32_t, const float*, const float*, const int32_t*, int64_t, int64_t,
                          const AttentionParams&, float*, float*, float*);

__attribute__((target("avx2,fma"))) void attend_one_avx2(const float* q, int32_t q_pos, const float* k, const float* v,
                                                         const int32_t* kv_pos, int64_t n_kv, int64_t kv_row_stride,
                                                         const AttentionParams& p, float* q16, float* acc, float* out) {
    attend_one_impl<true>(q, q_pos, k, v, kv_pos, n_kv, kv_row_stride, p, q16, acc, out);
}

void attend_one_baseline(const float* q, int32_t q_pos, const float* k, const float* v, const int32_t* kv_pos,
                         int64_t n_kv, int64_t kv_row_stride, const AttentionParams& p, float* q16, float* acc,
                         float* out) {
    attend_one_impl<false>(q, q_pos, k, v, kv_pos, n_kv, kv_row_stride, p, q16, acc, out);
}

AttendFn select_attend() {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? attend_one_avx2 : attend_one_baseline;
}

}  // namespace

float round_to_f16(float x) {
    return round_to_f16_inline(x);
}

void attention_f16(const float* q, const int32_t* q_pos, int64_t n_tok, const float* k, const float* v,
                   const int32_t* kv_pos, int64_t n_kv, const AttentionParams& params, float* out, ThreadPool& pool,
                   Scratch& scratch) {
    check_attention_params("attention_f16", params);
    if (n_tok <= 0) return;
    const int group = params.n_head / params.n_head_kv;
    const int64_t d = params.head_dim;
    const int64_t kv_row_stride = params.n_head_kv * d;
    const int64_t per_thread = (2 * d + 15) / 16 * 16;  // q16 and acc, whole cache lines
    auto* thread_scratch =
        reinterpret_cast<float*>(scratch.bytes(static_cast<size_t>(per_thread * pool.size()) * sizeof(float)));
    const AttendFn attend_one = select_attend();
    pool.parallel_for(n_tok * params.n_head, [&](int64_t begin, int64_t end, int thread_idx) {
        float* q16 = thread_scratch + thread_idx * per_thread;
        float* acc = q16 + d;
        for (int64_t task = begin; task < end; ++task) {
            const int64_t t = task / params.n_head;
            const int64_t h = task % params.n_head;
            const int64_t g = h / group;
            const int64_t row = t * params.n_head + h;
            attend_one(q + row * d, q_pos[t], k + g * d, v + g * d, kv_pos, n_kv, kv_row_stride, params, q16, acc,
                       out + row * d);
        }
    });
}

}  // namespace fitllm::ops
