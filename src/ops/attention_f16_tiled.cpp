#include "ops/attention_f16_tiled.h"

#include <immintrin.h>

// GCC 12 warns about the deliberately undefined pass-through operands inside its own AVX-512
// intrinsics (_mm512_undefined_*) once they are inlined here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "ops/attention_f16_kernel.h"
#include "ops/attention_f16_tiled_kernel.h"
#include "ops/cpu.h"
#include "ops/scratch.h"
#include "ops/thread_pool.h"

namespace fitllm::ops {
namespace fa_tiled {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The constants of ggml_v_expf (n = round(x / ln 2), ln 2 in two parts, the polynomial in b).
constexpr float kRoundShift = 0x1.8p23f;
constexpr float kInvLn2 = 0x1.715476p+0f;
constexpr float kLn2Hi = 0x1.62e4p-1f;
constexpr float kLn2Lo = 0x1.7f7d1cp-20f;
constexpr float kC1 = 0x1.ffffecp-1f;
constexpr float kC2 = 0x1.fffdb6p-2f;
constexpr float kC3 = 0x1.555e66p-3f;
constexpr float kC4 = 0x1.573e2ep-5f;
constexpr float kC5 = 0x1.0e4020p-7f;

// j * 2^n rounded once, as vscalefps does for integral n (|n| <= 192: exact in double).
inline float scale_by_power_of_two(float j, float n) {
    return static_cast<float>(std::ldexp(static_cast<double>(j), static_cast<int>(n)));
}

// ---- The scalar reference ----------------------------------------------------------------------

void tile_reference(State& st, const TileKeys& keys, const AttentionParams& p) {
    const int d = st.d;
    const int n = keys.n;
    float* w = st.w;
    for (int j = 0; j < n; ++j) {
        const float* k = keys.k + static_cast<int64_t>(j) * d;
        for (int r = 0; r < st.n_rows; ++r) {
            float s = 0.0f;
            for (int i = 0; i < d; ++i) s = std::fma(st.qt[i * kRows + r], k[i], s);
            if (p.softcap > 0.0f) {
                s = std::tanh(s * (p.scale / p.softcap)) * p.softcap;
            } else {
                s = s * p.scale;
            }
            w[j * kRows + r] = (keys.rows[j] >> r & 1u) ? s : -kInf;
        }
    }
    int key_of_slot[kKeys];
    std::fill(key_of_slot, key_of_slot + kKeys, -1);
    for (int j = 0; j < n; ++j) key_of_slot[keys.slot[j]] = j;
    for (int r = 0; r < st.n_rows; ++r) {
        float tile_max = -kInf;
        for (int j = 0; j < n; ++j) tile_max = std::max(tile_max, w[j * kRows + r]);
        if (tile_max == -kInf) {
            for (int j = 0; j < n; ++j) w[j * kRows + r] = 0.0f;
            continue;
        }
        float* acc = st.acc + r * d;
        const float new_max = std::fmax(st.max[r], tile_max);
        if (new_max > st.max[r]) {
            const float ms = std::exp(st.max[r] - new_max);
            for (int i = 0; i < d; ++i) acc[i] *= ms;
            st.sum[r] *= ms;
        }
        st.max[r] = new_max;
        for (int j = 0; j < n; ++j) w[j * kRows + r] = ggml_expf(w[j * kRows + r] - new_max);
        double sum = 0.0;
        for (int g = 0; g < kKeys / 16; ++g) {
            float e[16];
            for (int l = 0; l < 16; ++l) {
                const int j = key_of_slot[16 * g + l];
                e[l] = j >= 0 ? w[j * kRows + r] : 0.0f;
            }
            float half[8], quarter[4];
            for (int l = 0; l < 8; ++l) half[l] = e[l] + e[l + 8];
            for (int l = 0; l < 4; ++l) quarter[l] = half[l] + half[l + 4];
            sum += static_cast<double>((quarter[0] + quarter[2]) + (quarter[1] + quarter[3]));
        }
        st.sum[r] = static_cast<float>(static_cast<double>(st.sum[r]) + sum);
    }
    for (int r = 0; r < st.n_rows; ++r) {
        float* acc = st.acc + r * d;
        for (int j = 0; j < n; ++j) {
            const float e = w[j * kRows + r];
            const float* v = keys.v + static_cast<int64_t>(j) * d;
            for (int i = 0; i < d; ++i) acc[i] = std::fma(e, v[i], acc[i]);
        }
    }
}

}  // namespace

float ggml_expf(float x) {
    const float z = std::fma(x, kInvLn2, kRoundShift);
    const float n = z - kRoundShift;
    const float b = std::fma(-n, kLn2Lo, std::fma(-n, kLn2Hi, x));
    const float u = b * b;
    const float j = std::fma(std::fma(std::fma(kC5, b, kC4), u, std::fma(kC3, b, kC2)), u, std::fma(kC1, b, 1.0f));
    if (std::isnan(n)) return n;
    if (std::fabs(n) > 192.0f) return n <= 0.0f ? 0.0f : kInf;
    return scale_by_power_of_two(j, n);
}

void begin(State& st, float* qt, float* acc, float* w, const float* const* q_rows, int n_rows, int d) {
    st.qt = qt;
    st.acc = acc;
    st.w = w;
    st.n_rows = n_rows;
    st.d = d;
    std::fill(st.qt, st.qt + kRows * d, 0.0f);
    for (int r = 0; r < n_rows; ++r) {
        for (int i = 0; i < d; ++i) st.qt[i * kRows + r] = q_rows[r][i];
    }
    std::fill(st.acc, st.acc + n_rows * d, 0.0f);
    std::fill(st.max, st.max + kRows, -kInf);
    std::fill(st.sum, st.sum + kRows, 0.0f);
}

void end(const State& st, float* const* out_rows, const float* row_sinks) {
    for (int r = 0; r < st.n_rows; ++r) {
        float sum = st.sum[r];
        const float ms = row_sinks ? apply_sink(row_sinks[r], st.max[r], sum) : 1.0f;
        const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
        const float* acc = st.acc + r * st.d;
        for (int i = 0; i < st.d; ++i) out_rows[r][i] = acc[i] * ms * inv;
    }
}

}  // namespace fa_tiled

// ---- AVX-512 -----------------------------------------------------------------------------------

namespace {
using namespace fa_tiled;

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx2,fma,f16c")
namespace avx512 {
#include "ops/lanes_avx512.inc"
// ggml_v_expf's AVX-512 form: the polynomial's value scaled by 2^n in one rounding (vscalefps);
// |n| > 192 gives 0 or infinity.
inline Vec ggml_expf_vec(Vec x) {
    const Vec z = _mm512_fmadd_ps(x, set1(kInvLn2), set1(kRoundShift));
    const Vec n = _mm512_sub_ps(z, set1(kRoundShift));
    const Vec b = _mm512_fnmadd_ps(n, set1(kLn2Lo), _mm512_fnmadd_ps(n, set1(kLn2Hi), x));
    const Vec u = _mm512_mul_ps(b, b);
    const Vec j =
        fma(fma(fma(set1(kC5), b, set1(kC4)), u, fma(set1(kC3), b, set1(kC2))), u, fma(set1(kC1), b, set1(1.0f)));
    const Vec scaled = _mm512_scalef_ps(j, n);
    const __mmask16 out_of_range = _mm512_cmp_ps_mask(_mm512_abs_ps(n), set1(192.0f), _CMP_GT_OQ);
    if (out_of_range == 0) return scaled;
    const Vec limit = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, zero(), _CMP_LE_OQ), set1(kInf), zero());
    return _mm512_mask_blend_ps(out_of_range, scaled, limit);
}
#include "ops/attention_f16_tiled.inc"
}  // namespace avx512
#pragma GCC pop_options

// ---- AVX2: the AVX-512 build's arithmetic in 8 lanes -------------------------------------------

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
#include "ops/lanes_avx2.inc"
// As avx512::ggml_expf_vec. vscalefps is emulated: for -125 <= n <= 127 the product with 2^n is
// exact and normal; n < -192 (-inf included) gives 0; the few lanes between (a subnormal result
// or an overflow) are scaled in double and rounded once, as vscalefps rounds.
inline Vec ggml_expf_vec(Vec x) {
    const Vec z = _mm256_fmadd_ps(x, set1(kInvLn2), set1(kRoundShift));
    const Vec n = _mm256_sub_ps(z, set1(kRoundShift));
    const Vec b = _mm256_fnmadd_ps(n, set1(kLn2Lo), _mm256_fnmadd_ps(n, set1(kLn2Hi), x));
    const Vec u = _mm256_mul_ps(b, b);
    const Vec j =
        fma(fma(fma(set1(kC5), b, set1(kC4)), u, fma(set1(kC3), b, set1(kC2))), u, fma(set1(kC1), b, set1(1.0f)));
    const Vec normal =
        _mm256_and_ps(_mm256_cmp_ps(n, set1(-125.0f), _CMP_GE_OQ), _mm256_cmp_ps(n, set1(127.0f), _CMP_LE_OQ));
    const Vec clamped = _mm256_min_ps(_mm256_max_ps(n, set1(-125.0f)), set1(127.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(clamped), _mm256_set1_epi32(127)), 23);
    const Vec scaled = _mm256_mul_ps(j, _mm256_castsi256_ps(bits));
    const int normal_lanes = _mm256_movemask_ps(normal);
    if (normal_lanes == 0xFF) return scaled;
    const Vec far_below = _mm256_cmp_ps(n, set1(-192.0f), _CMP_LT_OQ);
    Vec r = _mm256_blendv_ps(_mm256_andnot_ps(far_below, scaled), scaled, normal);
    if ((normal_lanes | _mm256_movemask_ps(far_below)) == 0xFF) return r;
    alignas(32) float rs[8], js[8], ns[8];
    _mm256_store_ps(rs, r);
    _mm256_store_ps(js, j);
    _mm256_store_ps(ns, n);
    for (int l = 0; l < 8; ++l) {
        if (normal_lanes >> l & 1) continue;
        if (std::isnan(ns[l])) {
            rs[l] = ns[l];
        } else if (std::fabs(ns[l]) > 192.0f) {
            rs[l] = ns[l] <= 0.0f ? 0.0f : kInf;
        } else {
            rs[l] = scale_by_power_of_two(js[l], ns[l]);
        }
    }
    return _mm256_load_ps(rs);
}
#include "ops/attention_f16_tiled.inc"
}  // namespace avx2
#pragma GCC pop_options

}  // namespace

namespace fa_tiled {

TileFn tile_fn(Isa isa) {
    switch (isa) {
        case Isa::Avx512:
            return avx512::tile;
        case Isa::Avx2:
            return avx2::tile;
        default:
            return tile_reference;
    }
}

Isa best_isa(const quant::CpuFeatures& f) {
    const bool avx2 = f.avx2 && f.fma;
    if (avx2 && f.avx512f && f.avx512vl && f.avx512bw) return Isa::Avx512;
    return avx2 ? Isa::Avx2 : Isa::Reference;
}

}  // namespace fa_tiled

namespace {

// The kernel for a choice, the CPU and the head size (the vector kernels sum V in whole vectors
// of 16 floats).
fa_tiled::TileFn select_tile(AttentionTiledKernel kernel, int head_dim) {
    const fa_tiled::Isa best = fa_tiled::best_isa(cpu());
    if (head_dim % 16 != 0 || best == fa_tiled::Isa::Reference) return fa_tiled::tile_fn(fa_tiled::Isa::Reference);
    switch (kernel) {
        case AttentionTiledKernel::Best:
            return fa_tiled::tile_fn(best);
        case AttentionTiledKernel::Avx512:
            return fa_tiled::tile_fn(best == fa_tiled::Isa::Avx512 ? best : fa_tiled::Isa::Reference);
        case AttentionTiledKernel::Avx2:
            return fa_tiled::tile_fn(fa_tiled::Isa::Avx2);
        default:
            return fa_tiled::tile_fn(fa_tiled::Isa::Reference);
    }
}

}  // namespace

void attention_f16_tiled(const float* q, const int32_t* q_pos, int64_t n_tok, const float* k, const float* v,
                         const int32_t* kv_pos, int64_t n_kv, const AttentionParams& params, float* out,
                         ThreadPool& pool, Scratch& scratch, AttentionTiledKernel kernel) {
    check_attention_params("attention_f16_tiled", params);
    if (n_tok <= 0) return;
    using fa_tiled::kKeys;
    using fa_tiled::kRows;
    const fa_tiled::TileFn tile = select_tile(kernel, params.head_dim);
    const int d = params.head_dim;
    const int group = params.n_head / params.n_head_kv;
    int heads = 1;  // query heads per item: the largest divisor of the group up to kRows
    for (int m = std::min(group, kRows); m > 1; --m) {
        if (group % m == 0) {
            heads = m;
            break;
        }
    }
    const int tokens = kRows / heads;
    const int64_t n_blocks = (n_tok + tokens - 1) / tokens;
    const int64_t head_blocks = params.n_head / heads;
    const int64_t kv_stride = static_cast<int64_t>(params.n_head_kv) * d;
    const int64_t token_stride = static_cast<int64_t>(params.n_head) * d;
    // Per thread: the state's buffers (qt, acc, w), then a tile's K and V rows.
    const int64_t per_thread = (2 * kRows * d + kKeys * kRows + 2 * kKeys * d + 15) / 16 * 16;
    auto* thread_scratch =
        reinterpret_cast<float*>(scratch.bytes(static_cast<size_t>(per_thread * pool.size()) * sizeof(float)));
    pool.parallel_for(n_blocks * head_blocks, [&](int64_t begin, int64_t end, int thread_idx) {
        float* base = thread_scratch + thread_idx * per_thread;
        float* k_tile = base + 2 * kRows * d + kKeys * kRows;
        float* v_tile = k_tile + kKeys * d;
        for (int64_t task = begin; task < end; ++task) {
            const int64_t t0 = task / head_blocks * tokens;
            const int64_t h0 = task % head_blocks * heads;
            const int64_t g = h0 / group;
            const int n_tokens = static_cast<int>(std::min<int64_t>(tokens, n_tok - t0));
            const float* q_rows[kRows];
            float* out_rows[kRows];
            for (int t = 0; t < n_tokens; ++t) {
                for (int h = 0; h < heads; ++h) {
                    q_rows[t * heads + h] = q + (t0 + t) * token_stride + (h0 + h) * d;
                    out_rows[t * heads + h] = out + (t0 + t) * token_stride + (h0 + h) * d;
                }
            }
            fa_tiled::State st;
            fa_tiled::begin(st, base, base + kRows * d, base + 2 * kRows * d, q_rows, n_tokens * heads, d);
            const uint32_t head_bits = heads >= 32 ? ~0u : (1u << heads) - 1u;
            for (int64_t c0 = 0; c0 < n_kv; c0 += kKeys) {
                uint8_t slot[kKeys];
                uint32_t rows[kKeys];
                int n = 0;
                for (int64_t c = c0; c < std::min(n_kv, c0 + kKeys); ++c) {
                    uint32_t mask = 0;
                    for (int t = 0; t < n_tokens; ++t) {
                        if (f16_attention::visible(kv_pos[c], q_pos[t0 + t], params.sliding_window)) {
                            mask |= head_bits << (t * heads);
                        }
                    }
                    if (mask == 0) continue;
                    std::memcpy(k_tile + n * d, k + c * kv_stride + g * d, d * sizeof(float));
                    std::memcpy(v_tile + n * d, v + c * kv_stride + g * d, d * sizeof(float));
                    slot[n] = static_cast<uint8_t>(c - c0);
                    rows[n++] = mask;
                }
                if (n > 0) tile(st, fa_tiled::TileKeys{n, slot, k_tile, v_tile, rows}, params);
            }
            float row_sinks[kRows];
            if (params.sinks) {
                for (int r = 0; r < n_tokens * heads; ++r) row_sinks[r] = params.sinks[h0 + r % heads];
            }
            fa_tiled::end(st, out_rows, params.sinks ? row_sinks : nullptr);
        }
    });
}

}  // namespace fitllm::ops
