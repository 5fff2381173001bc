#include "memory/pool.h"

namespace fitllm::memory {

void Pool::reserve(uint64_t bytes, std::string_view what) {
    device_.reserve(*this, bytes, what);
}

void Pool::release(uint64_t bytes) {
    device_.release(*this, bytes);
}

uint64_t Pool::live() const {
    std::lock_guard lock(device_.mutex_);
    return live_;
}

uint64_t Pool::peak() const {
    std::lock_guard lock(device_.mutex_);
    return peak_;
}

}  // namespace fitllm::memory
