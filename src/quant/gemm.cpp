#include "quant/gemm.h"

#include <memory>
#include <new>

#include "quant/dot.h"
#include "quant/gemm_batch_f16.h"
#include "quant/gemm_batch_kernels.h"
#include "quant/gemm_batch_q4k.h"
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
        take(detail::gemm_iq4_avx2(weight_type), Isa::Avx2);
    }
    if (best >= Isa::Avx512) {
        const bool vnni = best >= Isa::Avx512Vnni;
        const Isa level = vnni ? Isa::Avx512Vnni : Isa::Avx512;
        take(detail::gemm_avx512(weight_type, vnni), level);
        take(detail::gemm_avx512_kquants(weight_type, vnni), level);
        take(detail::gemm_iq4_avx512(weight_type, vnni), level);
    }
    return k;
}

GemmKernel select_small_batch(GgmlType weight_type, const CpuFeatures& features) {
    // Only the kernel of the very level select_dot picks gives its results bit for bit.
    const DotKernel dot = select_dot(weight_type, features);
    GemmFn fn = nullptr;
    switch (dot.isa) {
        case Isa::Avx2:
            fn = detail::small_batch_avx2(weight_type);
            if (fn == nullptr) fn = detail::lanes8_small_batch_avx2(weight_type);
            break;
        case Isa::Avx512:
        case Isa::Avx512Vnni:
            fn = detail::small_batch_avx512(weight_type, dot.isa == Isa::Avx512Vnni);
            break;
        case Isa::Scalar:
            break;
    }
    if (fn == nullptr) return {};
    GemmKernel k;
    k.fn = fn;
    k.isa = dot.isa;
    k.act_type = dot.act_type;
    return k;
}

namespace {

// The weight types whose batches llama.cpp sums in another order than a lone token, one line each:
// the function that picks the type's batch-order kernel and its rule for this CPU.
struct BatchOrderEntry {
    GgmlType type;
    BatchOrderGemm (*select)(GgmlType weight_type, const CpuFeatures& features);
};

// The grid i-quants: tiled_batch_order's rule and kernels, except at AVX-512 VNNI their VNNI form
// (gemm_iq_grid_avx512.cpp); their kernels take weight rows kGridRowTile at a time.
BatchOrderGemm grid_batch_order(GgmlType weight_type, const CpuFeatures& features) {
    constexpr int kGridRowTile = 16;
    BatchOrderGemm b = detail::tiled_batch_order(weight_type, features);
    if (b.kernel.fn == nullptr) return b;
    if (b.kernel.isa == Isa::Avx512Vnni) {
        if (GemmFn fn = detail::gemm_iq_grid_avx512_vnni(weight_type); fn != nullptr) b.kernel.fn = fn;
    }
    b.kernel.row_tile = kGridRowTile;
    return b;
}

constexpr BatchOrderEntry kBatchOrders[] = {
    {GgmlType::Q6_K, detail::tiled_batch_order},
    {GgmlType::Q5_K, detail::tiled_batch_order},
    {GgmlType::Q3_K, detail::tiled_batch_order},
    {GgmlType::Q4_K, detail::repacked_batch_order},
    {GgmlType::Q2_K, detail::repacked_batch_order},
    {GgmlType::F16, detail::sgemm_batch_order},
    {GgmlType::IQ3_XXS, grid_batch_order},
    {GgmlType::IQ3_S, grid_batch_order},
    {GgmlType::IQ2_XXS, grid_batch_order},
    {GgmlType::IQ2_XS, grid_batch_order},
    {GgmlType::IQ2_S, grid_batch_order},
    {GgmlType::IQ1_S, grid_batch_order},
    {GgmlType::IQ1_M, grid_batch_order},
};

}  // namespace

BatchOrderGemm select_batch_order_gemm(GgmlType weight_type, const CpuFeatures& features) {
    for (const BatchOrderEntry& e : kBatchOrders) {
        if (e.type == weight_type) return e.select(weight_type, features);
    }
    return {};
}

namespace detail {

std::byte* small_batch_scratch(size_t bytes) {
    struct Buffer {
        std::unique_ptr<std::byte[], void (*)(std::byte*)> data{
            nullptr, [](std::byte* p) { ::operator delete[](p, std::align_val_t{64}); }};
        size_t size = 0;
    };
    thread_local Buffer buffer;
    if (buffer.size < bytes) {
        buffer.data.reset(static_cast<std::byte*>(::operator new[](bytes, std::align_val_t{64})));
        buffer.size = bytes;
    }
    return buffer.data.get();
}

}  // namespace detail
}  // namespace fitllm::quant
