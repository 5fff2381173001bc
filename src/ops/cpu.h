#pragma once
// The CPU features the ops' kernels are chosen by: quant::host_cpu_features() read once, so that
// FITLLM_CPU_ISA lowers the activations', RoPE's and attention's kernels as it lowers the weight
// kernels' (a forced AVX2 run computes what an AVX2 machine computes).
#include "quant/cpu_features.h"

namespace fitllm::ops {

const quant::CpuFeatures& cpu();

}  // namespace fitllm::ops
