#include "quant/dot.h"

#include "quant/dot_kernels.h"

namespace fitllm::quant {

bool has_dot(GgmlType weight_type) {
    return detail::dot_ref(weight_type) != nullptr;
}

GgmlType dot_activation_type(GgmlType weight_type) {
    switch (weight_type) {
        case GgmlType::Q4_0:
        case GgmlType::Q5_0:
        case GgmlType::Q8_0:
        case GgmlType::IQ4_NL:
        case GgmlType::MXFP4:
            return GgmlType::Q8_0;
        case GgmlType::Q4_1:
        case GgmlType::Q5_1:
            return GgmlType::Q8_1;
        case GgmlType::IQ4_XS:
        case GgmlType::TQ1_0:
        case GgmlType::TQ2_0:
        case GgmlType::IQ3_XXS:
        case GgmlType::IQ3_S:
        case GgmlType::IQ2_XXS:
        case GgmlType::IQ2_XS:
        case GgmlType::IQ2_S:
        case GgmlType::IQ1_S:
        case GgmlType::IQ1_M:
        case GgmlType::Q2_K:
        case GgmlType::Q3_K:
        case GgmlType::Q4_K:
        case GgmlType::Q5_K:
        case GgmlType::Q6_K:
            return GgmlType::Q8_K;
        case GgmlType::F16:  // llama.cpp rounds the activations of F16 weights to f16 too
            return GgmlType::F16;
        default:
            return GgmlType::F32;
    }
}

DotKernel select_dot(GgmlType weight_type, const CpuFeatures& features) {
    DotKernel k{detail::dot_ref(weight_type), Isa::Scalar, dot_activation_type(weight_type)};
    if (k.fn == nullptr) return k;
    const Isa best = features.best_isa();
    auto take = [&](DotFn fn, Isa isa) {
        if (fn == nullptr) return;
        k.fn = fn;
        k.isa = isa;
    };
    // The lookups themselves live in the ISA-specific files: call them only where they can run.
    // Each table answers for the types it holds, nullptr for the others.
    if (best >= Isa::Avx2) {
        take(detail::dot_avx2(weight_type), Isa::Avx2);
        take(detail::dot_avx2_kquants(weight_type), Isa::Avx2);
    }
    if (best >= Isa::Avx512) {
        const bool vnni = best >= Isa::Avx512Vnni;
        const Isa level = vnni ? Isa::Avx512Vnni : Isa::Avx512;
        take(detail::dot_avx512(weight_type, vnni), level);
        take(detail::dot_avx512_kquants(weight_type, vnni), level);
    }
    if (best >= Isa::Avx2) k.rows = detail::dot_rows_avx2(weight_type);
    if (best >= Isa::Avx512) {
        if (DotRowsFn rows = detail::dot_rows_avx512(weight_type, best >= Isa::Avx512Vnni)) k.rows = rows;
        if (DotRowsFn rows = detail::dot_rows_avx512_kquants(weight_type, best >= Isa::Avx512Vnni)) k.rows = rows;
    }
    return k;
}

}  // namespace fitllm::quant
