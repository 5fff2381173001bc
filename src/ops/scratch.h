#pragma once
// Working memory the ops reuse from call to call, so that the decode loop allocates nothing once
// the first token has sized it, plus the CPU features that pick the kernels (detected once).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "quant/cpu_features.h"

namespace fitllm::ops {

// Not shared between threads that call ops concurrently: each caller of ops owns one.
class Scratch {
public:
    // Called with the buffer's size before and after, before it grows; may throw to refuse (the
    // buffer then stays as it was). model/ charges a memory pool through it; ops/ knows no pools.
    using GrowFn = std::function<void(size_t old_bytes, size_t new_bytes)>;

    explicit Scratch(quant::CpuFeatures features = quant::host_cpu_features()) : features_(features) {}

    const quant::CpuFeatures& features() const { return features_; }
    void on_grow(GrowFn fn) { on_grow_ = std::move(fn); }
    size_t capacity_bytes() const { return buffer_.capacity(); }

    // At least n bytes, 64-byte aligned. The buffer only grows, so steady-state calls return the
    // same memory; its contents are not kept when it grows. One region per op call.
    std::byte* bytes(size_t n) {
        constexpr size_t kAlign = 64;
        if (buffer_.size() < n + kAlign) {
            if (on_grow_) on_grow_(buffer_.capacity(), n + kAlign);
            std::vector<std::byte>().swap(buffer_);  // free first: old and new are never both held
            buffer_.reserve(n + kAlign);             // exactly n + kAlign, the bytes on_grow was told
            buffer_.resize(n + kAlign);
        }
        const auto address = reinterpret_cast<uintptr_t>(buffer_.data());
        return buffer_.data() + (kAlign - address % kAlign) % kAlign;
    }

private:
    quant::CpuFeatures features_;
    std::vector<std::byte> buffer_;
    GrowFn on_grow_;
};

}  // namespace fitllm::ops
