// llama.cpp's batch order for Q3_K, Q5_K, Q6_K and the grid i-quants (IQ1_*, IQ2_*, IQ3_*): the scalar reference, which
// defines the arithmetic, and the rule for when it applies.
//
// ggml-cpu multiplies a batch of 8 or more activation rows with these types in its tiled matmul
// (tiled/tiled.cpp: ggml_tiled_min_batch, rows >= 8; weights not repacked, which these types are
// not on x86) instead of ggml_vec_dot. Its integer sums per super-block are exact (the same integers
// as the dot's); the floats differ. Per output, over the super-blocks i in order:
//   r   = float(sum of scale * q * y)  * d_w            (Q6_K, Q3_K: q with its offset taken off)
//   r   = fma(-dmin_w, float(sum of min * y), r)          (Q5_K)
//   out = fma(r, d_a, out)
// starting from out = 0. That is its microkernels' epilogue per 256-element slab (tiled-kernel.cpp):
// the AVX2 one writes the last fma itself; the AVX-512 VNNI one (tiled_run_micro_vnni_8x16) writes
// a product and a sum, which GCC contracts into that fma (the bits of the oracle build on this
// machine, tests/quant/ggml_oracle_test.cpp).
#include <cmath>
#include <cstddef>
#include <type_traits>

#include "quant/blocks.h"
#include "quant/gemm_batch_kernels.h"

namespace fitllm::quant::detail {
namespace {

template <typename T>
const T* as(const void* p) {
    return static_cast<const T*>(p);
}

// A super-block's integer sums: sum over sub-blocks of scale * sum(q y), and of min * sum(y).
struct Sums {
    int scaled = 0;
    int mins = 0;
};

Sums super_block(const BlockQ6_K& x, const BlockQ8_K& y) {
    Sums s;
    for (int e = 0; e < kQK; ++e) s.scaled += x.scales[e / 16] * (quant_of(x, e) - 32) * y.qs[e];
    return s;
}
Sums super_block(const BlockQ3_K& x, const BlockQ8_K& y) {
    const KScales16 sc = unpack_q3k_scales(x.scales);
    Sums s;
    for (int e = 0; e < kQK; ++e) s.scaled += sc.scales[e / 16] * (quant_of(x, e) - 4) * y.qs[e];
    return s;
}
Sums super_block(const BlockQ5_K& x, const BlockQ8_K& y) {
    const KScalesMins sm = unpack_q4k_scales(x.scales);
    Sums s;
    for (int e = 0; e < kQK; ++e) {
        s.scaled += sm.scales[e / 32] * quant_of(x, e) * y.qs[e];
        s.mins += sm.mins[e / 32] * y.qs[e];
    }
    return s;
}

template <typename Block>
float dmin_of(const Block& x) {
    if constexpr (requires { x.dmin; })
        return fp16_to_fp32(x.dmin);
    else
        return 0.0f;
}

template <typename Block>
void gemm_ref(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride,
              float* y, size_t y_stride) {
    constexpr bool kMins = requires(const Block& b) {
        b.dmin;
    };
    for (int t = 0; t < n_tok; ++t) {
        const auto* a = as<BlockQ8_K>(as<std::byte>(act) + static_cast<size_t>(t) * act_stride);
        for (int r = 0; r < n_rows; ++r) {
            const auto* x = as<Block>(as<std::byte>(w) + static_cast<size_t>(r) * w_stride);
            float out = 0.0f;
            for (int i = 0; i < n / kQK; ++i) {
                const Sums s = super_block(x[i], a[i]);
                float block = static_cast<float>(s.scaled) * fp16_to_fp32(x[i].d);
                if constexpr (kMins) block = std::fma(-dmin_of(x[i]), static_cast<float>(s.mins), block);
                out = std::fma(block, a[i].d, out);
            }
            y[static_cast<size_t>(t) * y_stride + static_cast<size_t>(r)] = out;
        }
    }
}

// The grid i-quants in the same order (tiled.cpp's unpackers): per super-block the integer sum of
// ls * w * y, w the signed grid value (IQ1: 8 g + delta), then block = float(sum) * (d_w / kDiv)
// (kDiv: IQ2 and IQ1 8, IQ3_XXS 4, IQ3_S 1), out = fma(block, d_a, out).
template <typename Block, void (*kSub)(const Block&, int, int8_t*, int*), int kDiv>
void gemm_iq_grid_ref(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride,
                      float* y, size_t y_stride) {
    for (int t = 0; t < n_tok; ++t) {
        const auto* a = as<BlockQ8_K>(as<std::byte>(act) + static_cast<size_t>(t) * act_stride);
        for (int r = 0; r < n_rows; ++r) {
            const auto* x = as<Block>(as<std::byte>(w) + static_cast<size_t>(r) * w_stride);
            float out = 0.0f;
            for (int i = 0; i < n / kQK; ++i) {
                int32_t sum = 0;
                for (int ib = 0; ib < 8; ++ib) {
                    int8_t v[32];
                    int ls[2];
                    kSub(x[i], ib, v, ls);
                    for (int e = 0; e < 32; ++e) sum += ls[e / 16] * v[e] * a[i].qs[32 * ib + e];
                }
                const float block = static_cast<float>(sum) * (fp16_to_fp32(x[i].d) * (1.0f / kDiv));
                out = std::fma(block, a[i].d, out);
            }
            y[static_cast<size_t>(t) * y_stride + static_cast<size_t>(r)] = out;
        }
    }
}

template <typename Block, void (*kSub)(const Block&, int, int8_t*, int*, int*)>
void gemm_iq1_ref(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act, size_t act_stride,
                  float* y, size_t y_stride) {
    for (int t = 0; t < n_tok; ++t) {
        const auto* a = as<BlockQ8_K>(as<std::byte>(act) + static_cast<size_t>(t) * act_stride);
        for (int r = 0; r < n_rows; ++r) {
            const auto* x = as<Block>(as<std::byte>(w) + static_cast<size_t>(r) * w_stride);
            float out = 0.0f;
            for (int i = 0; i < n / kQK; ++i) {
                int32_t sum = 0;
                for (int ib = 0; ib < 8; ++ib) {
                    int8_t v[32];
                    int delta[4], ls[2];
                    kSub(x[i], ib, v, delta, ls);
                    for (int e = 0; e < 32; ++e) sum += ls[e / 16] * (8 * v[e] + delta[e / 8]) * a[i].qs[32 * ib + e];
                }
                float d;
                if constexpr (std::is_same_v<Block, BlockIQ1_M>) {
                    d = fp16_to_fp32(iq1m_scale(x[i]));
                } else {
                    d = fp16_to_fp32(x[i].d);
                }
                const float block = static_cast<float>(sum) * (d * 0.125f);
                out = std::fma(block, a[i].d, out);
            }
            y[static_cast<size_t>(t) * y_stride + static_cast<size_t>(r)] = out;
        }
    }
}

// llama.cpp's rule: the whole matmul has 8 or more activation rows. fitllm asks it of the token's
// run (its sequence's tokens in the batch), so that a sequence's results do not depend on what is
// batched with it; for a batch of one sequence (a prompt) the two are the same.
bool tiled_applies(int64_t /*weight_rows*/, int64_t /*weight_cols*/, int32_t run_len, int32_t /*run_pos*/) {
    return run_len >= 8;
}

}  // namespace

GemmFn tiled_order_ref(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::Q3_K:
            return gemm_ref<BlockQ3_K>;
        case GgmlType::Q5_K:
            return gemm_ref<BlockQ5_K>;
        case GgmlType::Q6_K:
            return gemm_ref<BlockQ6_K>;
        case GgmlType::IQ3_XXS:
            return gemm_iq_grid_ref<BlockIQ3_XXS, iq3xxs_subblock, 4>;
        case GgmlType::IQ3_S:
            return gemm_iq_grid_ref<BlockIQ3_S, iq3s_subblock, 1>;
        case GgmlType::IQ2_XXS:
            return gemm_iq_grid_ref<BlockIQ2_XXS, iq2xxs_subblock, 8>;
        case GgmlType::IQ2_XS:
            return gemm_iq_grid_ref<BlockIQ2_XS, iq2xs_subblock, 8>;
        case GgmlType::IQ2_S:
            return gemm_iq_grid_ref<BlockIQ2_S, iq2s_subblock, 8>;
        case GgmlType::IQ1_S:
            return gemm_iq1_ref<BlockIQ1_S, iq1s_subblock>;
        case GgmlType::IQ1_M:
            return gemm_iq1_ref<BlockIQ1_M, iq1m_subblock>;
        default:
            return nullptr;
    }
}

BatchOrderGemm tiled_batch_order(GgmlType weight_type, const CpuFeatures& features) {
    // llama.cpp has no tiled kernels below AVX; fitllm's CPUs without AVX2 keep the dot order.
    const Isa best = features.best_isa();
    GemmFn fn = nullptr;
    Isa isa = Isa::Scalar;
    if (best >= Isa::Avx512) {
        const bool vnni = best >= Isa::Avx512Vnni;
        fn = tiled_order_avx512(weight_type, vnni);
        isa = vnni ? Isa::Avx512Vnni : Isa::Avx512;
    }
    if (fn == nullptr && best >= Isa::Avx2) {
        fn = tiled_order_avx2(weight_type);
        isa = Isa::Avx2;
    }
    if (fn == nullptr) return {};
    BatchOrderGemm b;
    b.kernel.fn = fn;
    b.kernel.isa = isa;
    b.kernel.act_type = GgmlType::Q8_K;
    b.kernel.tok_tile = 8;
    b.applies = tiled_applies;
    return b;
}

}  // namespace fitllm::quant::detail
