// The scalar reference of F16's batch order (see gemm_batch_f16.h) and its kernel selection.
#include <cmath>
#include <cstdint>

#include "quant/blocks.h"
#include "quant/dot_kernels.h"
#include "quant/gemm_batch_f16.h"

namespace fitllm::quant::detail {
namespace {

// llamafile's sgemm takes a batch of 2 or more tokens where the tiles fit: rows a multiple of 4,
// columns of whole vectors.
bool sgemm_applies(int64_t weight_rows, int64_t weight_cols, int32_t run_len, int32_t /*run_pos*/) {
    return run_len >= 2 && weight_rows % 4 == 0 && weight_cols % 16 == 0;
}

}  // namespace

void gemm_batch_f16_ref(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act,
                        size_t act_stride, float* y, size_t y_stride) {
    const auto* wb = static_cast<const std::byte*>(w);
    const auto* ab = static_cast<const std::byte*>(act);
    for (int t = 0; t < n_tok; ++t) {
        const auto* a = reinterpret_cast<const uint16_t*>(ab + t * act_stride);
        for (int r = 0; r < n_rows; ++r) {
            const auto* x = reinterpret_cast<const uint16_t*>(wb + r * w_stride);
            float lanes[16] = {};
            for (int i = 0; i < n; i += 16) {
                for (int l = 0; l < 16; ++l)
                    lanes[l] = std::fma(fp16_to_fp32(x[i + l]), fp16_to_fp32(a[i + l]), lanes[l]);
            }
            y[t * y_stride + r] = reduce_add16(lanes);
        }
    }
}

BatchOrderGemm sgemm_batch_order(GgmlType weight_type, const CpuFeatures& features) {
    if (weight_type != GgmlType::F16) return {};
    // llama.cpp's sgemm needs AVX (F16C); fitllm's CPUs without AVX2 keep the dot order.
    const Isa best = features.best_isa();
    BatchOrderGemm b;
    if (best >= Isa::Avx512) {
        b.kernel.fn = gemm_batch_f16_avx512;
        b.kernel.isa = Isa::Avx512;
    } else if (best >= Isa::Avx2) {
        b.kernel.fn = gemm_batch_f16_avx2;
        b.kernel.isa = Isa::Avx2;
    } else {
        return {};
    }
    b.kernel.act_type = GgmlType::F16;
    b.kernel.row_tile = 4;
    b.kernel.tok_tile = 4;
    b.applies = sgemm_applies;
    return b;
}

}  // namespace fitllm::quant::detail
