#pragma once
// Working memory the ops reuse from call to call, so that the decode loop allocates nothing once
// the first token has sized it, plus the CPU features that pick the kernels (detected once).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "quant/cpu_features.h"

namespace fitllm::ops {

// Not shared between threads that call ops concurrently: each caller of ops owns one.
class Scratch {
public:
    explicit Scratch(quant::CpuFeatures features = quant::host_cpu_features()) : features_(features) {}

    const quant::CpuFeatures& features() const { return features_; }

    // At least n bytes, 64-byte aligned. The buffer only grows, so steady-state calls return the
    // same memory; its contents are not kept when it grows. One region per op call.
    std::byte* bytes(size_t n) {
        constexpr size_t kAlign = 64;
        if (buffer_.size() < n + kAlign) buffer_.resize(n + kAlign);
        const auto address = reinterpret_cast<uintptr_t>(buffer_.data());
        return buffer_.data() + (kAlign - address % kAlign) % kAlign;
    }

private:
    quant::CpuFeatures features_;
    std::vector<std::byte> buffer_;
};

}  // namespace fitllm::ops
