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

void Backend::bind_host(memory::Device& host) {
    host_charge_ = memory::Charge();
    host_charge_ = memory::Charge(host.pool(memory::pool_names::kStaging), host_bytes(),
                                  "host staging of " + name() + " (its copies to and from the host)");
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

const void* Backend::map_host(const void* host, size_t /*bytes*/) {
    if (!unified()) throw std::logic_error(name() + " has memory of its own: host memory is copied to it, not mapped");
    return host;
}

void Backend::swiglu_oai(const float* /*gate*/, const float* /*up*/, int64_t /*n*/, float /*alpha*/, float /*limit*/,
                         float* /*y*/) {
    throw std::invalid_argument("swiglu_oai (gpt-oss's experts) is not implemented on " + name());
}

std::pair<std::string_view, bool> strip_unified_suffix(std::string_view name) {
    constexpr std::string_view suffix = "-unified";
    if (name.size() > suffix.size() && name.ends_with(suffix))
        return {name.substr(0, name.size() - suffix.size()), true};
    return {name, false};
}

std::unique_ptr<Backend> open_device(std::string_view name, uint64_t capacity) {
    if (strip_unified_suffix(name).second) {
        throw std::invalid_argument("device '" + std::string(name) +
                                    "' shares the host's memory: it has no capacity of its own (open_unified_device)");
    }
    if (device_number(name, "virtual") >= 0) return std::make_unique<VirtualDevice>(std::string(name), capacity);
    if (const int ordinal = device_number(name, "cuda"); ordinal >= 0) return make_cuda_backend(ordinal, capacity);
    throw std::invalid_argument("unknown device '" + std::string(name) +
                                "' (accepted: virtual, virtualN, virtual-unified, cuda, cudaN)");
}

std::unique_ptr<Backend> open_unified_device(std::string_view name, memory::Device& host) {
    const std::string_view base = strip_unified_suffix(name).first;
    if (device_number(base, "virtual") >= 0)
        return std::make_unique<VirtualDevice>(std::string(base) + "-unified", host);
    if (const int ordinal = device_number(base, "cuda"); ordinal >= 0) return make_cuda_unified_backend(ordinal, host);
    throw std::invalid_argument("unknown device '" + std::string(name) +
                                "' (accepted: virtual, virtualN, virtual-unified, cuda, cudaN)");
}

bool is_device_name(std::string_view name) {
    const std::string_view base = strip_unified_suffix(name).first;
    return device_number(base, "virtual") >= 0 || device_number(base, "cuda") >= 0;
}

bool device_is_integrated(std::string_view name) {
    const int ordinal = device_number(name, "cuda");
    return ordinal >= 0 && cuda_device_integrated(ordinal);
}

uint64_t host_bytes_for(std::string_view device_name) {
    return device_number(device_name, "cuda") >= 0 ? kCudaHostStagingBytes : 0;
}

bool cuda_built() {
#ifdef FITLLM_CUDA
    return true;
#else
    return false;
#endif
}

}  // namespace fitllm::backend
