#include "ops/cpu.h"

namespace fitllm::ops {

const quant::CpuFeatures& cpu() {
    static const quant::CpuFeatures features = quant::host_cpu_features();
    return features;
}

}  // namespace fitllm::ops
