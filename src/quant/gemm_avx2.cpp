// Placeholder: no tiled kernels yet; matmul falls back to the dot kernels.
#include "quant/gemm_kernels.h"

namespace fitllm::quant::detail {

GemmKernel gemm_avx2(GgmlType /*weight_type*/) {
    return {};
}

}  // namespace fitllm::quant::detail
