#include "backend/backend.h"

#include <charconv>
#include <stdexcept>
#include <string>

#include "backend/cuda_backend.h"
#include "backend/virtual_device.h"

namespace fitllm::backend {

void Buffer::reset() noexcept {
    if (data_ != nullptr) owner_->raw_free(data_);
    owner_ = nullptr;
    data_ = nullptr;
    bytes_ = 0;
    charge_.release();
}

Buffer Backend::alloc(std::string_view pool, size_t bytes, std::string_view what) {
    if (bytes == 0) return {};
    const size_t rounded = (bytes + kBufferAlign - 1) / kBufferAlign * kBufferAlign;
    memory::Charge charge(memory().pool(pool), rounded, what);  // BudgetError before allocating
    void* data = raw_alloc(rounded);
    return Buffer(this, data, bytes, std::move(charge));
}

namespace {

// The device number after `prefix` in `name` ("cuda1" -> 1, "cuda" -> 0), or -1 when `name` is
// not prefix followed by digits.
int device_number(std::string_view name, std::string_view prefix) {
    if (name.substr(0, prefix.size()) != prefix) return -1;
    const std::string_view digits = name.substr(prefix.size());
    if (digits.empty()) return 0;
    int n = -1;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (ec != std::errc() || end != digits.data() + digits.size() || n < 0) return -1;
    return n;
}

}  // namespace

std::unique_ptr<Backend> open_device(std::string_view name, uint64_t capacity) {
    if (device_number(name, "virtual") >= 0) return std::make_unique<VirtualDevice>(std::string(name), capacity);
    if (const int ordinal = device_number(name, "cuda"); ordinal >= 0) return make_cuda_backend(ordinal, capacity);
    throw std::invalid_argument("unknown device '" + std::string(name) +
                                "' (accepted: virtual, virtualN, cuda, cudaN)");
}

std::unique_ptr<Backend> open_unified_virtual_device(memory::Device& host) {
    return std::make_unique<VirtualDevice>("virtual-unified", host);
}

bool cuda_built() {
#ifdef FITLLM_CUDA
    return true;
#else
    return false;
#endif
}

}  // namespace fitllm::backend
