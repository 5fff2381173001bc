// Placeholder: no tiled kernels yet; matmul falls back to the dot kernels.
#include "quant/gemm_kernels.h"

namespace fitllm::quant::detail {

GemmKernel gemm_avx512(GgmlType /*weight_type*/, bool /*vnni*/) {
    return {};
}

}  // namespace fitllm::quant::detail
