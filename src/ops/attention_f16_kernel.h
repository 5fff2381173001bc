#pragma once
// Internal to ops/: the arithmetic of llama.cpp's f16 flash attention (attention_f16.h) as steps of
// one key at a time, so that ops::attention_f16 (K/V as float arrays) and ops::attention_kv (K/V
// as f16 rows of the paged cache, kv/cache.h) run the same code and round the same way. Keys may
// be float rows holding f16 values or f16 rows (uint16_t bits); the conversion is exact, so both
// give the same bits.
//
// Two implementations that agree to the bit:
//  - step_one<kFma>: one query against one key, scalar code that vectorizes 8 wide when inlined
//    into an AVX2 function (kFma) or runs on the baseline (multiply-adds done in double).
//  - Block*: the AVX-512 kernel, up to kMaxQueries queries (the heads of one kv group for one or
//    more tokens) per key, so each K and V row is read once for all of them while it is in L1.
//    Each query's arithmetic is exactly step_one<true>'s: the dot keeps the 4 x 8 accumulators
//    (as two 16-lane registers: lanes 0-7 of the first hold accumulator 0, lanes 8-15 accumulator
//    1, the second 2 and 3), the softmax bookkeeping is the same scalar code, and the f16 rounding
//    of q and of the V accumulator is the F16C conversion (round to nearest even, overflow to
//    infinity), the accumulator stored as f16. Needs head_dim % 32 == 0.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ops/attention.h"

namespace fitllm::ops::f16_attention {

inline constexpr int kMaxQueries = 8;

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

// One visible key (k, v: d floats holding f16 values) of llama.cpp's online softmax.
template <bool kFma>
[[gnu::always_inline]] inline void step_one(OneState& st, const float* __restrict k, const float* __restrict v, int d,
                                            const AttentionParams& p) {
    float s = dot_like_ggml<kFma>(st.q16, k, d) * p.scale;
    if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
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

[[gnu::always_inline]] inline void end_one(const OneState& st, float* out, int d) {
    const float inv = st.sum == 0.0f ? 0.0f : 1.0f / st.sum;
    for (int i = 0; i < d; ++i) out[i] = st.acc[i] * inv;
}

// ---- AVX-512 ----------------------------------------------------------------------------------
#define FITLLM_F16_ATTENTION_AVX512 __attribute__((target("avx512f,avx512vl,fma,f16c")))

// Whether the CPU runs the Block* kernel (the caller still checks head_dim % 32 == 0).
inline bool cpu_has_avx512_kernel() {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
}

// Sum of the accumulators in the order of dot_like_ggml.
FITLLM_F16_ATTENTION_AVX512 inline float reduce_like_ggml(__m512 acc01, __m512 acc23) {
    const __m512 s = _mm512_add_ps(acc01, acc23);  // lanes 0-7: acc0 + acc2, lanes 8-15: acc1 + acc3
    const __m256 s8 =
        _mm256_add_ps(_mm512_castps512_ps256(s), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, s4);
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

FITLLM_F16_ATTENTION_AVX512 inline __m512 load_half16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

FITLLM_F16_ATTENTION_AVX512 inline void store_half16(uint16_t* p, __m512 x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// 16 K or V values as floats, from float rows or from f16 rows.
FITLLM_F16_ATTENTION_AVX512 inline __m512 load16(const float* p) {
    return _mm512_loadu_ps(p);
}
FITLLM_F16_ATTENTION_AVX512 inline __m512 load16(const uint16_t* p) {
    return load_half16(p);
}

// Scores of n (1 to 4) queries against one key row; kD is head_dim, 0 where it is only known at
// run time.
template <int n, int kD, class Elem>
FITLLM_F16_ATTENTION_AVX512 inline void dots(const float* q16, const int* rows, int head_dim, const Elem* kj,
                                             float* scores) {
    const int d = kD > 0 ? kD : head_dim;
    __m512 lo[n], hi[n];
    const float* qr[n];
    for (int r = 0; r < n; ++r) {
        lo[r] = _mm512_setzero_ps();
        hi[r] = _mm512_setzero_ps();
        qr[r] = q16 + static_cast<int64_t>(rows[r]) * d;
    }
#pragma GCC unroll 8
    for (int i = 0; i < d; i += 32) {
        const __m512 k0 = load16(kj + i);
        const __m512 k1 = load16(kj + i + 16);
        for (int r = 0; r < n; ++r) {
            lo[r] = _mm512_fmadd_ps(_mm512_loadu_ps(qr[r] + i), k0, lo[r]);
            hi[r] = _mm512_fmadd_ps(_mm512_loadu_ps(qr[r] + i + 16), k1, hi[r]);
        }
    }
    for (int r = 0; r < n; ++r) scores[r] = reduce_like_ggml(lo[r], hi[r]);
}

// Up to kMaxQueries queries; rows index them (0 .. n_queries - 1).
struct BlockState {
    float* q16;     // [n_queries][d]: q rounded to f16
    uint16_t* acc;  // [n_queries][d]: the f16 weighted sums of V
    float running_max[kMaxQueries];
    float sum[kMaxQueries];
};

// Floats of working memory Block* needs for kMaxQueries queries of head size d (q16 and acc).
inline int64_t block_state_floats(int64_t d) {
    return (kMaxQueries * d + kMaxQueries * d / 2 + 15) / 16 * 16;
}

// st.q16 and st.acc point at block_state_floats(d) floats; q_rows[r] is query r's head row.
template <int kD>
FITLLM_F16_ATTENTION_AVX512 inline void block_begin(BlockState& st, const float* const* q_rows, int n_queries,
                                                    int head_dim) {
    const int d = kD > 0 ? kD : head_dim;
    for (int r = 0; r < n_queries; ++r) {
        const float* src = q_rows[r];
        float* dst = st.q16 + static_cast<int64_t>(r) * d;
        for (int i = 0; i < d; i += 16) {
            _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(src + i),
                                                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
        }
        st.running_max[r] = -std::numeric_limits<float>::infinity();
        st.sum[r] = 0.0f;
    }
    std::fill(st.acc, st.acc + static_cast<int64_t>(n_queries) * d, uint16_t{0});
}

// One key, seen by the n_active queries rows[0 .. n_active - 1].
template <int kD, class Elem>
FITLLM_F16_ATTENTION_AVX512 inline void block_key(BlockState& st, const int* rows, int n_active, const Elem* kj,
                                                  const Elem* vj, const AttentionParams& p) {
    const int d = kD > 0 ? kD : p.head_dim;
    float scores[kMaxQueries];
    int a = 0;
    for (; a + 4 <= n_active; a += 4) dots<4, kD>(st.q16, rows + a, d, kj, scores + a);
    for (; a < n_active; ++a) dots<1, kD>(st.q16, rows + a, d, kj, scores + a);

    __m512 weights[kMaxQueries];
    for (a = 0; a < n_active; ++a) {
        const int r = rows[a];
        float s = scores[a] * p.scale;
        if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
        float rescale = 1.0f;
        float weight = 1.0f;
        if (s > st.running_max[r]) {
            rescale = std::exp(st.running_max[r] - s);
            st.running_max[r] = s;
            uint16_t* acc_r = st.acc + static_cast<int64_t>(r) * d;
            const __m512 factor = _mm512_set1_ps(rescale);
            for (int i = 0; i < d; i += 16) store_half16(acc_r + i, _mm512_mul_ps(load_half16(acc_r + i), factor));
        } else {
            weight = std::exp(s - st.running_max[r]);
        }
        st.sum[r] = __builtin_fmaf(st.sum[r], rescale, weight);
        weights[a] = _mm512_set1_ps(weight);
    }
    // Query by query, so that each accumulator row streams through once; the V row stays in L1.
    for (a = 0; a < n_active; ++a) {
        uint16_t* acc_r = st.acc + static_cast<int64_t>(rows[a]) * d;
        const __m512 w = weights[a];
#pragma GCC unroll 16
        for (int i = 0; i < d; i += 16) {
            store_half16(acc_r + i, _mm512_fmadd_ps(load16(vj + i), w, load_half16(acc_r + i)));
        }
    }
}

// out_rows[r] receives query r's result.
template <int kD>
FITLLM_F16_ATTENTION_AVX512 inline void block_end(const BlockState& st, float* const* out_rows, int n_queries,
                                                  int head_dim) {
    const int d = kD > 0 ? kD : head_dim;
    for (int r = 0; r < n_queries; ++r) {
        const float inv = st.sum[r] == 0.0f ? 0.0f : 1.0f / st.sum[r];
        const __m512 factor = _mm512_set1_ps(inv);
        const uint16_t* acc_r = st.acc + static_cast<int64_t>(r) * d;
        float* dst = out_rows[r];
        for (int i = 0; i < d; i += 16) _mm512_storeu_ps(dst + i, _mm512_mul_ps(load_half16(acc_r + i), factor));
    }
}

}  // namespace fitllm::ops::f16_attention
