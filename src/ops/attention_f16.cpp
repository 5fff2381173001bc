#include "ops/attention_f16.h"

#include <immintrin.h>

#include "ops/attention_f16_kernel.h"
#include "ops/cpu.h"
#include "quant/cpu_features.h"

// GCC 12 warns about the deliberately undefined pass-through operands inside its own AVX-512
// intrinsics (_mm512_undefined_*) once they are inlined here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace fitllm::ops {
namespace {

using f16_attention::kMaxQueries;
using f16_attention::visible;

// One query head against every visible key: the online softmax of llama.cpp's f16 path
// (f16_attention::step_one), q·k in the order of ggml's f16 dot with kLanes-lane vectors.
template <bool kFma, int kLanes>
[[gnu::always_inline]] inline void attend_one_impl(const float* q, int32_t q_pos, const float* k, const float* v,
                                                   const int32_t* kv_pos, int64_t n_kv, int64_t kv_row_stride,
                                                   const AttentionParams& p, float* __restrict q16,
                                                   float* __restrict acc, float* __restrict out) {
    const int d = p.head_dim;
    f16_attention::OneState st{q16, acc, 0.0f, 0.0f};
    f16_attention::begin_one(st, q, d);
    for (int64_t j = 0; j < n_kv; ++j) {
        if (!visible(kv_pos[j], q_pos, p.sliding_window)) continue;
        f16_attention::step_one<kFma, kLanes>(st, k + j * kv_row_stride, v + j * kv_row_stride, d, p);
    }
    f16_attention::end_one(st, out, d, p.sinks);  // p.sinks: this head's (attention_f16)
}

// Compiled for AVX-512 (the dot in ggml's AVX-512 order), for AVX2 with FMA, where the loops above
// vectorize 8 wide and the multiply-adds are single instructions, and for the baseline (the AVX2
// order, the same results as the AVX2 version).
using AttendFn = void (*)(const float*, int32_t, const float*, const float*, const int32_t*, int64_t, int64_t,
                          const AttentionParams&, float*, float*, float*);

__attribute__((target("avx2,fma"))) void attend_one_avx2(const float* q, int32_t q_pos, const float* k, const float* v,
                                                         const int32_t* kv_pos, int64_t n_kv, int64_t kv_row_stride,
                                                         const AttentionParams& p, float* q16, float* acc, float* out) {
    attend_one_impl<true, 8>(q, q_pos, k, v, kv_pos, n_kv, kv_row_stride, p, q16, acc, out);
}

__attribute__((target("avx512f,avx512vl,avx2,fma,f16c"))) void attend_one_avx512(
    const float* q, int32_t q_pos, const float* k, const float* v, const int32_t* kv_pos, int64_t n_kv,
    int64_t kv_row_stride, const AttentionParams& p, float* q16, float* acc, float* out) {
    attend_one_impl<true, 16>(q, q_pos, k, v, kv_pos, n_kv, kv_row_stride, p, q16, acc, out);
}

void attend_one_baseline(const float* q, int32_t q_pos, const float* k, const float* v, const int32_t* kv_pos,
                         int64_t n_kv, int64_t kv_row_stride, const AttentionParams& p, float* q16, float* acc,
                         float* out) {
    attend_one_impl<false, 8>(q, q_pos, k, v, kv_pos, n_kv, kv_row_stride, p, q16, acc, out);
}

// The dot's order is AVX-512's where the CPU has it, unless the AVX2 kernel was asked for.
AttendFn select_attend(AttentionF16Kernel kernel) {
    const quant::CpuFeatures& f = cpu();
    if (kernel != AttentionF16Kernel::Avx2 && f16_attention::dot_lanes(f) == 16) return attend_one_avx512;
    return f.avx2 && f.fma ? attend_one_avx2 : attend_one_baseline;
}

// The blocked kernels: up to kMaxQueries queries (the heads of one kv group for one or more
// tokens) against each key in turn, so each K and V row is read once for all of them while it is
// in L1. Each query's arithmetic is exactly attend_one_impl<true, kLanes>'s: the dot keeps the
// 4 x kLanes accumulators of dot_like_ggml (AVX-512: 16 lanes, as ggml's AVX-512 build; AVX2: 8),
// the softmax bookkeeping is the same (its exponentials taken for all queries of a key at once, bit for bit std::exp),
// and the f16 rounding of q and of the V accumulator is the F16C conversion (round to nearest even, overflow to
// infinity), the accumulator stored as f16 between chunks of 16 keys and rounded the same way in registers within one.
// The body is attention_f16_block.inc, compiled once for AVX-512 and once for AVX2, and shared with attention_kv
// through f16_attention::BlockKernel (attention_f16_kernel.h). Needs head_dim % 32 == 0.
using BlockFn = void (*)(const float* q, const int32_t* pos, int n_tokens, int n_heads, int64_t token_stride,
                         const float* k, const float* v, const int32_t* kv_pos, int64_t n_kv, int64_t kv_row_stride,
                         const AttentionParams& p, float* q16, uint16_t* acc, float* out);

// std::exp of floats, vectorized: glibc's expf (the algorithm of its FMA variant, which is what
// std::exp and llama.cpp's expf call on a CPU with FMA): in double, x / ln2 * 32 rounded to an
// integer k by adding 1.5 * 2^52, r the fused remainder, 2^(k/32) from a 32-entry table of
// 2^(i/32) with the exponent of k / 32 added to its bits, and a cubic in r. Arguments of magnitude
// 88 or more (and NaN) take std::exp itself. exp_libm_vec_matches() checks the result against
// std::exp once, and the kernels use std::exp throughout where it differs (another libm).
namespace libm_expf {
constexpr double kInvLn2N = 0x1.71547652b82fep+5;  // 32 / ln 2
constexpr double kShift = 0x1.8p+52;
constexpr double kC0 = 0x1.c6af84b912394p-20;
constexpr double kC1 = 0x1.ebfce50fac4f3p-13;
constexpr double kC2 = 0x1.62e42ff0c52d6p-6;

// 2^(i/32) as double bits less i << 47, so adding k << 47 gives 2^(k/32).
const int64_t* table() {
    static const auto t = [] {
        std::array<int64_t, 32> bits{};
        for (int i = 0; i < 32; ++i) {
            bits[static_cast<size_t>(i)] =
                std::bit_cast<int64_t>(std::exp2(i / 32.0)) - (static_cast<int64_t>(i) << 47);
        }
        return bits;
    }();
    return t.data();
}

// Lanes whose argument is outside the range the vector code reproduces get std::exp.
inline bool needs_libm(float x) {
    return (std::bit_cast<uint32_t>(x) & 0x7FFFFFFFu) >= 0x42B00000u;  // |x| >= 88, infinities, NaN
}
}  // namespace libm_expf

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,fma,f16c")
namespace avx512 {

using Vec = __m512;
constexpr int kLanes = 16;
inline Vec load(const float* p) {
    return _mm512_loadu_ps(p);
}
inline void store(float* p, Vec x) {
    _mm512_storeu_ps(p, x);
}
inline Vec broadcast(float x) {
    return _mm512_set1_ps(x);
}
inline Vec fma(Vec a, Vec b, Vec c) {
    return _mm512_fmadd_ps(a, b, c);
}
inline Vec mul(Vec a, Vec b) {
    return _mm512_mul_ps(a, b);
}
inline Vec load_half(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void store_half(uint16_t* p, Vec x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline Vec load_kv(const float* p) {
    return load(p);
}
inline Vec load_kv(const uint16_t* p) {
    return load_half(p);
}
// x rounded to f16 and back (what storing and loading an f16 accumulator does).
inline Vec round_half(Vec x) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
constexpr int kVGroup = 4;  // queries whose V sums are kept in registers together
constexpr int kVWide = 4;   // vectors of the head per query in registers, where the head size allows

// Scores of n (1 or 4) queries against one key row, in dot_like_ggml<true, 16>'s order (ggml's
// AVX-512 f16 dot); kD is head_dim, 0 where it is only known at run time.
constexpr int kDotQueries = 4;
template <int n, int kD, class Elem>
inline void dots(const float* q16, const int* rows, int head_dim, const Elem* kj, float* scores) {
    const int d = kD > 0 ? kD : head_dim;
    const int whole = d / 64 * 64;  // the rest (d % 64 is 0 or 32 here) is added in double
    __m512 acc[n][4];
    const float* qr[n];
    for (int r = 0; r < n; ++r) qr[r] = q16 + static_cast<int64_t>(rows[r]) * d;
    // The first step's products start the sums (ggml adds them to +0, which differs only in the
    // sign of a zero product, and a zero score's sign changes nothing downstream).
    if (whole > 0) {
        __m512 kc[4];
        for (int c = 0; c < 4; ++c) kc[c] = load_kv(kj + 16 * c);
        for (int r = 0; r < n; ++r) {
            for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(qr[r] + 16 * c), kc[c]);
        }
    } else {
        for (int r = 0; r < n; ++r) {
            for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
        }
    }
#pragma GCC unroll 4
    for (int i = 64; i < whole; i += 64) {
        __m512 kc[4];
        for (int c = 0; c < 4; ++c) kc[c] = load_kv(kj + i + 16 * c);
        for (int r = 0; r < n; ++r) {
            for (int c = 0; c < 4; ++c)
                acc[r][c] = _mm512_fmadd_ps(_mm512_loadu_ps(qr[r] + i + 16 * c), kc[c], acc[r][c]);
        }
    }
    // (acc0 + acc2) + (acc1 + acc3), then GCC's _mm512_reduce_add_ps: the 256-bit halves added,
    // then the 128-bit halves, then (l0 + l2) + (l1 + l3).
    __m512 sr[n];
    for (int r = 0; r < n; ++r) {
        sr[r] = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][2]), _mm512_add_ps(acc[r][1], acc[r][3]));
    }
    if constexpr (n == 4) {
        // The four queries' reductions side by side. [s8 of query 0 | s8 of query 1], and 2, 3:
        const __m512 s8_01 =
            _mm512_add_ps(_mm512_shuffle_f32x4(sr[0], sr[1], 0x44), _mm512_shuffle_f32x4(sr[0], sr[1], 0xEE));
        const __m512 s8_23 =
            _mm512_add_ps(_mm512_shuffle_f32x4(sr[2], sr[3], 0x44), _mm512_shuffle_f32x4(sr[2], sr[3], 0xEE));
        // [s4 of query 0 | 1 | 2 | 3]: lanes l and l + 4 of each s8.
        const __m512 s4 =
            _mm512_add_ps(_mm512_shuffle_f32x4(s8_01, s8_23, 0x88), _mm512_shuffle_f32x4(s8_01, s8_23, 0xDD));
        // (s4[0] + s4[2]) + (s4[1] + s4[3]) in lane 0 of each group of 4.
        const __m512 pairs = _mm512_add_ps(s4, _mm512_permute_ps(s4, 0x4E));
        const __m512 total = _mm512_add_ps(pairs, _mm512_permute_ps(pairs, 0xB1));
        const __m512i first = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
        _mm_storeu_ps(scores, _mm512_castps512_ps128(_mm512_permutexvar_ps(first, total)));
    } else {
        for (int r = 0; r < n; ++r) {
            const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(sr[r]),
                                            _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sr[r]), 1)));
            alignas(16) float s4[4];
            _mm_store_ps(s4, _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1)));
            scores[r] = (s4[0] + s4[2]) + (s4[1] + s4[3]);
        }
    }
    if (whole < d) {
        for (int r = 0; r < n; ++r) {
            alignas(64) float k_tail[32];
            _mm512_store_ps(k_tail, load_kv(kj + whole));
            _mm512_store_ps(k_tail + 16, load_kv(kj + whole + 16));
            double sum = scores[r];
            for (int i = 0; i < d - whole; ++i) sum += static_cast<double>(qr[r][whole + i] * k_tail[i]);
            scores[r] = static_cast<float>(sum);
        }
    }
}

// std::exp of n <= 8 floats (libm_expf).
inline void exp_libm_vec(const float* x, int n, float* y) {
    using namespace libm_expf;
    const __mmask8 lanes = static_cast<__mmask8>((1u << n) - 1u);
    const __m256 xs = _mm256_maskz_loadu_ps(lanes, x);
    const __m512d xd = _mm512_cvtps_pd(xs);
    const __m512d z = _mm512_fmadd_pd(_mm512_set1_pd(kInvLn2N), xd, _mm512_set1_pd(kShift));
    const __m512i ki = _mm512_castpd_si512(z);
    const __m512d kd = _mm512_sub_pd(z, _mm512_set1_pd(kShift));
    const __m512d r = _mm512_fmsub_pd(_mm512_set1_pd(kInvLn2N), xd, kd);
    const __m512i t = _mm512_add_epi64(_mm512_i64gather_epi64(_mm512_and_si512(ki, _mm512_set1_epi64(31)), table(), 8),
                                       _mm512_slli_epi64(ki, 47));
    const __m512d cubic =
        _mm512_fmadd_pd(_mm512_fmadd_pd(r, _mm512_set1_pd(kC0), _mm512_set1_pd(kC1)), _mm512_mul_pd(r, r),
                        _mm512_fmadd_pd(r, _mm512_set1_pd(kC2), _mm512_set1_pd(1.0)));
    _mm256_mask_storeu_ps(y, lanes, _mm512_cvtpd_ps(_mm512_mul_pd(cubic, _mm512_castsi512_pd(t))));
    const __m256i magnitude = _mm256_and_si256(_mm256_castps_si256(xs), _mm256_set1_epi32(0x7FFFFFFF));
    __mmask8 fix = _mm256_mask_cmpge_epu32_mask(lanes, magnitude, _mm256_set1_epi32(0x42B00000));
    while (fix != 0) {  // |x| >= 88, infinities and NaN (needs_libm): rare
        const int i = __builtin_ctz(fix);
        y[i] = std::exp(x[i]);
        fix = static_cast<__mmask8>(fix & (fix - 1));
    }
}

// Whether exp_libm_vec is this libm's expf: checked once on arguments across its range.
inline bool exp_libm_vec_matches() {
    static const bool matches = [] {
        for (uint32_t i = 0; i < 8192; i += 8) {
            float x[8], got[8];
            for (uint32_t l = 0; l < 8; ++l) {
                const uint32_t n = i + l;
                // Evenly over [-88, 0], and bit patterns of every exponent below 88 in magnitude.
                x[l] = n % 2 ? -88.0f * static_cast<float>(n) / 8192.0f
                             : std::bit_cast<float>(0x80000000u | ((n * 2654435761u) % 0x42B00000u));
            }
            exp_libm_vec(x, 8, got);
            for (int l = 0; l < 8; ++l) {
                if (std::bit_cast<uint32_t>(got[l]) != std::bit_cast<uint32_t>(std::exp(x[l]))) return false;
            }
        }
        return true;
    }();
    return matches;
}

inline void exp_like_libm(const float* x, int n, float* y) {
    if (exp_libm_vec_matches()) {
        for (int i = 0; i < n; i += 8) exp_libm_vec(x + i, std::min(8, n - i), y + i);  // 8 lanes at a time
        return;
    }
    for (int i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

// The online softmax step of one key seen by rows 0 .. n - 1 (no soft-capping), 16 rows a vector:
// f16_attention::step_one's bookkeeping, lane by lane. weight and rescale get each row's values;
// returns the rows whose maximum the key raises.
inline uint32_t softmax_key_all_rows(const float* scores, int n, float scale, float* running_max, float* sum,
                                     float* weight, float* rescale) {
    float arg[kMaxQueries], e[kMaxQueries];
    uint32_t raises = 0;
    for (int r = 0; r < n; r += 16) {
        const __mmask16 lanes = static_cast<__mmask16>(n - r >= 16 ? 0xFFFFu : (1u << (n - r)) - 1u);
        const __m512 s = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, scores + r), _mm512_set1_ps(scale));
        const __m512 m = _mm512_maskz_loadu_ps(lanes, running_max + r);
        const __mmask16 up = _mm512_mask_cmp_ps_mask(lanes, s, m, _CMP_GT_OQ);
        const __m512 a = _mm512_mask_blend_ps(up, _mm512_sub_ps(s, m), _mm512_sub_ps(m, s));
        _mm512_mask_storeu_ps(arg + r, lanes, a);
        _mm512_mask_storeu_ps(running_max + r, up, s);
        raises |= static_cast<uint32_t>(up) << r;
    }
    exp_like_libm(arg, n, e);
    for (int r = 0; r < n; r += 16) {
        const __mmask16 lanes = static_cast<__mmask16>(n - r >= 16 ? 0xFFFFu : (1u << (n - r)) - 1u);
        const __mmask16 up = static_cast<__mmask16>(raises >> r);
        const __m512 ev = _mm512_maskz_loadu_ps(lanes, e + r);
        const __m512 one = _mm512_set1_ps(1.0f);
        const __m512 rs = _mm512_mask_blend_ps(up, one, ev);
        const __m512 w = _mm512_mask_blend_ps(up, ev, one);
        _mm512_mask_storeu_ps(sum + r, lanes, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(lanes, sum + r), rs, w));
        _mm512_mask_storeu_ps(weight + r, lanes, w);
        _mm512_mask_storeu_ps(rescale + r, lanes, rs);
    }
    return raises;
}

#include "ops/attention_f16_block.inc"

}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {

using Vec = __m256;
constexpr int kLanes = 8;
inline Vec load(const float* p) {
    return _mm256_loadu_ps(p);
}
inline void store(float* p, Vec x) {
    _mm256_storeu_ps(p, x);
}
inline Vec broadcast(float x) {
    return _mm256_set1_ps(x);
}
inline Vec fma(Vec a, Vec b, Vec c) {
    return _mm256_fmadd_ps(a, b, c);
}
inline Vec mul(Vec a, Vec b) {
    return _mm256_mul_ps(a, b);
}
inline Vec load_half(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void store_half(uint16_t* p, Vec x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline Vec load_kv(const float* p) {
    return load(p);
}
inline Vec load_kv(const uint16_t* p) {
    return load_half(p);
}
inline Vec round_half(Vec x) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
constexpr int kVGroup = 2;  // 16 registers: 2 queries x 4 + the V row's 4
constexpr int kVWide = 4;

// Scores of n (1 or 2: 4 accumulators each, 16 registers in all) queries against one key row, in
// dot_like_ggml<true, 8>'s order (ggml's AVX2 f16 dot).
constexpr int kDotQueries = 2;
template <int n, int kD, class Elem>
inline void dots(const float* q16, const int* rows, int head_dim, const Elem* kj, float* scores) {
    const int d = kD > 0 ? kD : head_dim;
    __m256 acc[n][4];
    const float* qr[n];
    for (int r = 0; r < n; ++r) {
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_setzero_ps();
        qr[r] = q16 + static_cast<int64_t>(rows[r]) * d;
    }
#pragma GCC unroll 8
    for (int i = 0; i < d; i += 32) {
        for (int c = 0; c < 4; ++c) {
            const __m256 kc = load_kv(kj + i + 8 * c);
            for (int r = 0; r < n; ++r) acc[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(qr[r] + i + 8 * c), kc, acc[r][c]);
        }
    }
    for (int r = 0; r < n; ++r) {
        const __m256 s8 = _mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][2]), _mm256_add_ps(acc[r][1], acc[r][3]));
        alignas(16) float s4[4];
        _mm_store_ps(s4, _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1)));
        scores[r] = (s4[0] + s4[1]) + (s4[2] + s4[3]);
    }
}

// std::exp of n <= 8 floats (libm_expf), four at a time.
inline void exp_libm_vec(const float* x, int n, float* y) {
    using namespace libm_expf;
    alignas(16) float in[8] = {};
    for (int i = 0; i < n; ++i) in[i] = x[i];
    alignas(16) float out[8];
    for (int h = 0; h < n; h += 4) {
        const __m256d xd = _mm256_cvtps_pd(_mm_load_ps(in + h));
        const __m256d z = _mm256_fmadd_pd(_mm256_set1_pd(kInvLn2N), xd, _mm256_set1_pd(kShift));
        const __m256i ki = _mm256_castpd_si256(z);
        const __m256d kd = _mm256_sub_pd(z, _mm256_set1_pd(kShift));
        const __m256d r = _mm256_fmsub_pd(_mm256_set1_pd(kInvLn2N), xd, kd);
        const __m256i t = _mm256_add_epi64(_mm256_i64gather_epi64(reinterpret_cast<const long long*>(table()),
                                                                  _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8),
                                           _mm256_slli_epi64(ki, 47));
        const __m256d cubic =
            _mm256_fmadd_pd(_mm256_fmadd_pd(r, _mm256_set1_pd(kC0), _mm256_set1_pd(kC1)), _mm256_mul_pd(r, r),
                            _mm256_fmadd_pd(r, _mm256_set1_pd(kC2), _mm256_set1_pd(1.0)));
        _mm_store_ps(out + h, _mm256_cvtpd_ps(_mm256_mul_pd(cubic, _mm256_castsi256_pd(t))));
    }
    for (int i = 0; i < n; ++i) y[i] = needs_libm(x[i]) ? std::exp(x[i]) : out[i];
}

// Whether exp_libm_vec is this libm's expf: checked once on arguments across its range.
inline bool exp_libm_vec_matches() {
    static const bool matches = [] {
        for (uint32_t i = 0; i < 8192; i += 8) {
            float x[8], got[8];
            for (uint32_t l = 0; l < 8; ++l) {
                const uint32_t n = i + l;
                // Evenly over [-88, 0], and bit patterns of every exponent below 88 in magnitude.
                x[l] = n % 2 ? -88.0f * static_cast<float>(n) / 8192.0f
                             : std::bit_cast<float>(0x80000000u | ((n * 2654435761u) % 0x42B00000u));
            }
            exp_libm_vec(x, 8, got);
            for (int l = 0; l < 8; ++l) {
                if (std::bit_cast<uint32_t>(got[l]) != std::bit_cast<uint32_t>(std::exp(x[l]))) return false;
            }
        }
        return true;
    }();
    return matches;
}

inline void exp_like_libm(const float* x, int n, float* y) {
    if (exp_libm_vec_matches()) {
        for (int i = 0; i < n; i += 8) exp_libm_vec(x + i, std::min(8, n - i), y + i);  // 8 lanes at a time
        return;
    }
    for (int i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

// As avx512::softmax_key_all_rows, in scalar code.
inline uint32_t softmax_key_all_rows(const float* scores, int n, float scale, float* running_max, float* sum,
                                     float* weight, float* rescale) {
    float arg[kMaxQueries], e[kMaxQueries];
    uint32_t raises = 0;
    for (int r = 0; r < n; ++r) {
        const float s = scores[r] * scale;
        const bool up = s > running_max[r];
        arg[r] = up ? running_max[r] - s : s - running_max[r];
        if (up) {
            running_max[r] = s;
            raises |= 1u << r;
        }
    }
    exp_like_libm(arg, n, e);
    for (int r = 0; r < n; ++r) {
        const bool up = raises >> r & 1u;
        rescale[r] = up ? e[r] : 1.0f;
        weight[r] = up ? 1.0f : e[r];
        sum[r] = __builtin_fmaf(sum[r], rescale[r], weight[r]);
    }
    return raises;
}

#include "ops/attention_f16_block.inc"

}  // namespace avx2
#pragma GCC pop_options

// The blocked kernel for this CPU and head size, or null (then the one-query kernels run).
BlockFn select_block_kernel(const AttentionParams& p, AttentionF16Kernel kernel) {
    if (p.head_dim % 32 != 0 || kernel == AttentionF16Kernel::OneQuery) return nullptr;
    const quant::CpuFeatures& f = cpu();
    const bool avx2 = f.avx2 && f.fma && f.f16c;
    const bool avx512 = avx2 && f.avx512f && f.avx512vl;
    if (kernel == AttentionF16Kernel::Best && avx512) return avx512::block_kernel(p.head_dim);
    return avx2 ? avx2::block_kernel(p.head_dim) : nullptr;
}

// Heads per block: the largest divisor of the group up to kMaxQueries that still leaves every
// thread a task (decode has one token, and its tasks all cost the same), or 1.
int heads_per_block(int64_t n_tok, int n_head_kv, int group, int n_threads) {
    for (int m = std::min(group, kMaxQueries); m > 1; --m) {
        if (group % m == 0 && n_tok * n_head_kv * (group / m) >= n_threads) return m;
    }
    return 1;
}

void attention_f16_blocked(const float* q, const int32_t* q_pos, int64_t n_tok, const float* k, const float* v,
                           const int32_t* kv_pos, int64_t n_kv, const AttentionParams& p, float* out, ThreadPool& pool,
                           Scratch& scratch, BlockFn attend_block) {
    const int group = p.n_head / p.n_head_kv;
    const int64_t d = p.head_dim;
    const int64_t kv_row_stride = p.n_head_kv * d;
    const int64_t token_stride = p.n_head * d;
    const int heads = heads_per_block(n_tok, p.n_head_kv, group, pool.size());
    // Tokens per block: fill kMaxQueries, but keep enough blocks for every thread.
    int64_t tokens = std::max(1, kMaxQueries / heads);
    while (tokens > 1 && (n_tok + tokens - 1) / tokens * (p.n_head / heads) < 4 * static_cast<int64_t>(pool.size())) {
        --tokens;
    }
    const int64_t n_token_blocks = (n_tok + tokens - 1) / tokens;
    const int64_t head_blocks = p.n_head / heads;
    const int64_t per_thread = f16_attention::block_state_floats(d);
    auto* thread_scratch =
        reinterpret_cast<float*>(scratch.bytes(static_cast<size_t>(per_thread * pool.size()) * sizeof(float)));
    // Under a causal mask a token's cost grows with its position. Tasks go out in the order first
    // block, last block, second block, second to last, ..., so that any run of consecutive tasks
    // (what the pool hands a thread at a time) carries about the same work.
    pool.parallel_for(n_token_blocks * head_blocks, [&](int64_t begin, int64_t end, int thread_idx) {
        float* q16 = thread_scratch + thread_idx * per_thread;
        auto* acc = reinterpret_cast<uint16_t*>(q16 + kMaxQueries * d);
        for (int64_t task = begin; task < end; ++task) {
            const int64_t order = task / head_blocks;
            const int64_t b = order % 2 == 0 ? order / 2 : n_token_blocks - 1 - order / 2;
            const int64_t h0 = task % head_blocks * heads;
            const int64_t t0 = b * tokens;
            const int n_tokens = static_cast<int>(std::min(tokens, n_tok - t0));
            const int64_t g = h0 / group;
            AttentionParams block_params = p;
            if (block_params.sinks) block_params.sinks += h0;  // attend_block's head h is h0 + h
            attend_block(q + t0 * token_stride + h0 * d, q_pos + t0, n_tokens, heads, token_stride, k + g * d,
                         v + g * d, kv_pos, n_kv, kv_row_stride, block_params, q16, acc,
                         out + t0 * token_stride + h0 * d);
        }
    });
}

}  // namespace

namespace f16_attention {
const BlockKernel* block_kernel(int head_dim, const quant::CpuFeatures& f) {
    if (head_dim % 32 != 0) return nullptr;
    const bool avx2 = f.avx2 && f.fma && f.f16c;
    if (avx2 && f.avx512f && f.avx512vl) return avx512::block_kernel_parts(head_dim);
    return avx2 ? avx2::block_kernel_parts(head_dim) : nullptr;
}
}  // namespace f16_attention

float round_to_f16(float x) {
    return f16_attention::round_to_f16(x);
}

void attention_f16_exp(const float* x, int n, float* y, AttentionF16Kernel kernel) {
    const AttentionParams p{.n_head = 1, .n_head_kv = 1, .head_dim = 32};
    const BlockFn block = select_block_kernel(p, kernel);
    if (block != nullptr && block == avx512::block_kernel(32)) return avx512::exp_like_libm(x, n, y);
    if (block != nullptr) return avx2::exp_like_libm(x, n, y);
    for (int i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

void attention_f16(const float* q, const int32_t* q_pos, int64_t n_tok, const float* k, const float* v,
                   const int32_t* kv_pos, int64_t n_kv, const AttentionParams& params, float* out, ThreadPool& pool,
                   Scratch& scratch) {
    attention_f16(q, q_pos, n_tok, k, v, kv_pos, n_kv, params, out, pool, scratch, AttentionF16Kernel::Best);
}

void attention_f16(const float* q, const int32_t* q_pos, int64_t n_tok, const float* k, const float* v,
                   const int32_t* kv_pos, int64_t n_kv, const AttentionParams& params, float* out, ThreadPool& pool,
                   Scratch& scratch, AttentionF16Kernel kernel) {
    check_attention_params("attention_f16", params);
    if (n_tok <= 0) return;
    if (const BlockFn block = select_block_kernel(params, kernel)) {
        attention_f16_blocked(q, q_pos, n_tok, k, v, kv_pos, n_kv, params, out, pool, scratch, block);
        return;
    }
    const int group = params.n_head / params.n_head_kv;
    const int64_t d = params.head_dim;
    const int64_t kv_row_stride = params.n_head_kv * d;
    const int64_t per_thread = (2 * d + 15) / 16 * 16;  // q16 and acc, whole cache lines
    auto* thread_scratch =
        reinterpret_cast<float*>(scratch.bytes(static_cast<size_t>(per_thread * pool.size()) * sizeof(float)));
    const AttendFn attend_one = select_attend(kernel);
    pool.parallel_for(n_tok * params.n_head, [&](int64_t begin, int64_t end, int thread_idx) {
        float* q16 = thread_scratch + thread_idx * per_thread;
        float* acc = q16 + d;
        for (int64_t task = begin; task < end; ++task) {
            const int64_t t = task / params.n_head;
            const int64_t h = task % params.n_head;
            const int64_t g = h / group;
            const int64_t row = t * params.n_head + h;
            AttentionParams head_params = params;
            if (head_params.sinks) head_params.sinks += h;
            attend_one(q + row * d, q_pos[t], k + g * d, v + g * d, kv_pos, n_kv, kv_row_stride, head_params, q16, acc,
                       out + row * d);
        }
    });
}

}  // namespace fitllm::ops
