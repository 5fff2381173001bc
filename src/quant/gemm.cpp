#include "quant/gemm.h"

#include "quant/dot.h"
#include "quant/gemm_kernels.h"

namespace fitllm::quant {

GemmKernel select_gemm(GgmlType weight_type, const CpuFeatures& features) {
    GemmKernel k;
    const Isa best = features.best_isa();
    auto take = [&](GemmKernel candidate, Isa isa) {
        if (candidate.fn == nullptr) return;
        k = candidate;
        k.isa = isa;
        k.act_type = dot_activation_type(weight_type);
    };
    // As select_dot: each table is only asked where its instructions can run.
    if (best >= Isa::Avx2) {
        take(detail::gemm_avx2(weight_type), Isa::Avx2);
        take(detail::gemm_avx2_kquants(weight_type), Isa::Avx2);
    }
    if (best >= Isa::Avx512) {
        const bool vnni = best >= Isa::Avx512Vnni;
        const Isa level = vnni ? Isa::Avx512Vnni : Isa::Avx512;
        take(detail::gemm_avx512(weight_type, vnni), level);
        take(detail::gemm_avx512_kquants(weight_type, vnni), level);
    }
    return k;
}

}  // namespace fitllm::quant
