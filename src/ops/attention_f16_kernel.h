#pragma once
// Internal to ops/: the arithmetic of llama.cpp's f16 flash attention (attention_f16.h) as steps of
// one key at a time, so that ops::attention_f16 (K/V as float arrays) and ops::attention_kv (K/V
// as f16 rows of the paged cache, kv/cache.h) run the same code and round the same way. Keys may
// be float rows holding f16 values or f16 rows (uint16_t bits); the conversion is exact, so both
// give the same bits.
//
// The q·k dot follows ggml_vec_dot_f16 of the llama.cpp build this CPU would run: its AVX-512
// build (4 accumulators of 16 lanes) where the CPU has AVX-512, its AVX2 build (4 x 8) otherwise
// (dot_lanes). The order changes the scores' last bits, and those move greedy picks.
//
// Two implementations that agree to the bit for a given order:
//  - step_one<kFma, kLanes>: one query against one key, scalar code that vectorizes when inlined
//    into an AVX2 or AVX-512 function (kFma) or runs on the baseline (multiply-adds in double).
//  - BlockKernel: attention_f16's blocked kernel (AVX-512 with the 16-lane order, AVX2 with the
//    8-lane one, attention_f16_block.inc), up to kMaxQueries queries per key, each with
//    step_one<true, its order>'s arithmetic.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ops/attention.h"
#include "quant/cpu_features.h"

namespace fitllm::ops::f16_attention {

inline constexpr int kMaxQueries = 32;

// x rounded to the nearest f16 value (ties to even) and back. Bit masks rather than branches or
// selects, so that loops over it vectorize.
[[gnu::always_inline]] inline float round_to_f16(float x) {
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

// f16 bits to float, exactly, branch-free (vectorizes): the 15 magnitude bits shifted into a
// float's exponent and mantissa and scaled by 2^112 re-bias the exponent, subnormal halves
// included; infinities and NaNs are patched in.
[[gnu::always_inline]] inline float half_to_float(uint16_t h) {
    const uint32_t magnitude = static_cast<uint32_t>(h & 0x7FFFu) << 13;
    const float scaled = __builtin_bit_cast(float, magnitude) * 0x1p112f;
    const uint32_t is_special = 0u - static_cast<uint32_t>((h & 0x7C00u) == 0x7C00u);
    const uint32_t special = magnitude | 0x7F800000u;
    const uint32_t r = (__builtin_bit_cast(uint32_t, scaled) & ~is_special) | (special & is_special);
    return __builtin_bit_cast(float, r | (static_cast<uint32_t>(h & 0x8000u) << 16));
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

// The lanes of ggml_vec_dot_f16's accumulators in the llama.cpp build for these CPU features: 16
// with AVX-512 (and the AVX2, FMA and F16C every such CPU has), else 8.
inline int dot_lanes(const quant::CpuFeatures& f) {
    return f.avx2 && f.fma && f.f16c && f.avx512f && f.avx512vl ? 16 : 8;
}

// q·k in float in the order of ggml_vec_dot_f16 with kLanes-lane vectors: 4 accumulators of
// kLanes lanes over steps of 4 * kLanes, fused multiply-adds; then acc0 + acc2, acc1 + acc3 and
// their sum; then the lanes reduced as the build's reduction does (AVX2: halves, then
// (l0 + l1) + (l2 + l3); AVX-512: halves twice, then (l0 + l2) + (l1 + l3)); the elements past
// the last whole step are added in double, each product rounded to float first.
template <bool kFma, int kLanes>
[[gnu::always_inline]] inline float dot_like_ggml(const float* a, const float* b, int n) {
    static_assert(kLanes == 8 || kLanes == 16);
    constexpr int kStep = 4 * kLanes;
    float acc[4][kLanes] = {};
    int i = 0;
    for (; i + kStep <= n; i += kStep) {
        for (int r = 0; r < 4; ++r) {
            for (int lane = 0; lane < kLanes; ++lane) {
                acc[r][lane] =
                    fused_multiply_add<kFma>(a[i + kLanes * r + lane], b[i + kLanes * r + lane], acc[r][lane]);
            }
        }
    }
    float s[kLanes];
    for (int lane = 0; lane < kLanes; ++lane) s[lane] = (acc[0][lane] + acc[2][lane]) + (acc[1][lane] + acc[3][lane]);
    float s4[4];
    float reduced;
    if constexpr (kLanes == 16) {
        float s8[8];
        for (int lane = 0; lane < 8; ++lane) s8[lane] = s[lane] + s[lane + 8];
        for (int lane = 0; lane < 4; ++lane) s4[lane] = s8[lane] + s8[lane + 4];
        reduced = (s4[0] + s4[2]) + (s4[1] + s4[3]);
    } else {
        for (int lane = 0; lane < 4; ++lane) s4[lane] = s[lane] + s[lane + 4];
        reduced = (s4[0] + s4[1]) + (s4[2] + s4[3]);
    }
    if (i == n) return reduced;
    double sum = reduced;
    for (; i < n; ++i) sum += static_cast<double>(a[i] * b[i]);
    return static_cast<float>(sum);
}

// The state of one query: q rounded to f16 (kept as float), the f16-rounded weighted sum of V
// (kept as float) under running_max, and the sum of the weights.
struct OneState {
    float* q16;  // [d]
    float* acc;  // [d]
    float running_max;
    float sum;
};

[[gnu::always_inline]] inline void begin_one(OneState& st, const float* q, int d) {
    for (int i = 0; i < d; ++i) st.q16[i] = round_to_f16(q[i]);
    for (int i = 0; i < d; ++i) st.acc[i] = 0.0f;
    st.running_max = -std::numeric_limits<float>::infinity();
    st.sum = 0.0f;
}

// One visible key (k, v: d floats holding f16 values) of llama.cpp's online softmax. With
// soft-capping the score is softcap * tanh(dot * (scale / softcap)), as ggml folds the cap into
// the scale.
template <bool kFma, int kLanes>
[[gnu::always_inline]] inline void step_one(OneState& st, const float* __restrict k, const float* __restrict v, int d,
                                            const AttentionParams& p) {
    const float dot = dot_like_ggml<kFma, kLanes>(st.q16, k, d);
    const float s = p.softcap > 0.0f ? p.softcap * std::tanh(dot * (p.scale / p.softcap)) : dot * p.scale;
    float rescale = 1.0f;
    float weight = 1.0f;
    float* __restrict acc = st.acc;
    if (s > st.running_max) {
        rescale = std::exp(st.running_max - s);
        st.running_max = s;
        for (int i = 0; i < d; ++i) acc[i] = round_to_f16(acc[i] * rescale);
    } else {
        weight = std::exp(s - st.running_max);
    }
    for (int i = 0; i < d; ++i) acc[i] = round_to_f16(fused_multiply_add<kFma>(v[i], weight, acc[i]));
    st.sum = fused_multiply_add<kFma>(st.sum, rescale, weight);
}

// The query's result; with a sink (nullptr: none), its term joins the sum first (apply_sink) and
// the f16 sum of V, converted to float, is rescaled in float, as ggml does after the keys.
[[gnu::always_inline]] inline void end_one(const OneState& st, float* out, int d, const float* sink = nullptr) {
    float sum = st.sum;
    const float ms = sink ? apply_sink(*sink, st.running_max, sum) : 1.0f;
    const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
    for (int i = 0; i < d; ++i) out[i] = st.acc[i] * ms * inv;
}

// ---- The blocked kernel (attention_f16.cpp, attention_f16_block.inc) ---------------------------

// Up to kMaxQueries queries (the heads of one kv group for one or more tokens), rows r.
struct BlockState {
    float* q16;     // [kMaxQueries][head_dim]: q rounded to f16
    uint16_t* acc;  // [kMaxQueries][head_dim]: the f16 weighted sums of V
    float running_max[kMaxQueries];
    float sum[kMaxQueries];
};

// Floats of working memory for q16 and acc (q16 first, acc right after kMaxQueries * head_dim).
inline int64_t block_state_floats(int64_t head_dim) {
    return (kMaxQueries * head_dim + kMaxQueries * head_dim / 2 + 15) / 16 * 16;
}

// attention_f16's blocked kernel for keys given as f16 rows (the KV cache's), a tile at a time.
struct BlockKernel {
    // Query r's head row is q_rows[r], r < n_queries.
    void (*begin)(BlockState& st, const float* const* q_rows, int n_queries, int head_dim);
    // n keys: K and V head rows; key j is seen by the tokens of token_masks[j] (bit t), whose
    // n_heads queries are rows t * n_heads + h.
    void (*keys)(BlockState& st, int n, const uint16_t* const* k_rows, const uint16_t* const* v_rows,
                 const uint32_t* token_masks, int n_tokens, int n_heads, const AttentionParams& p);
    // out_rows[r] receives query r's result; row_sinks[r] is its sink (end_one), row_sinks nullptr
    // for none.
    void (*end)(const BlockState& st, float* const* out_rows, int n_queries, int head_dim, const float* row_sinks);
};

// The AVX-512 or AVX2 + F16C kernel the features allow for this head size (a multiple of 32), or
// nullptr: then step_one<kFma, dot_lanes(features)>, one query at a time, which gives the same bits.
const BlockKernel* block_kernel(int head_dim, const quant::CpuFeatures& features);

}  // namespace fitllm::ops::f16_attention
