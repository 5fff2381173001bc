#pragma once
// Pools charge a device (memory/device.h): reserve before allocating, release after freeing.
// Charge is the RAII form; PoolBuffer<T> an aligned, charged array for big buffers (instead of
// std::vector), so nothing large escapes the budget.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "memory/device.h"

namespace fitllm::memory {

class Charge;

// The pools the runtime charges (Device::pool(name)); the plan's rows use the same names.
namespace pool_names {
inline constexpr const char* kWeights = "weights";           // weight copies and pinned/resident mapped weights
inline constexpr const char* kKv = "kv";                     // the KV cache
inline constexpr const char* kScratch = "scratch";           // activations and op scratch of a forward pass
inline constexpr const char* kLogits = "logits";             // outputs
inline constexpr const char* kStaging = "staging";           // buffers of streamed layers
inline constexpr const char* kExperts = "experts";           // the expert cache's slots (model/expert_cache.h)
inline constexpr const char* kPromptCache = "prompt_cache";  // kept prompts' K/V rows copied out of the KV cache
// What the plan expects outside the pools (the executable, the C++ runtime, thread stacks, the
// GGUF metadata and the tokenizer built from it), charged once up front so the device's total
// is the process's.
inline constexpr const char* kOverhead = "overhead";
}  // namespace pool_names

class Pool {
public:
    Pool(Device& device, std::string name) : device_(device), name_(std::move(name)) {}
    Pool(const Pool&) = delete;
    Pool& operator=(const Pool&) = delete;

    const std::string& name() const { return name_; }
    Device& device() const { return device_; }

    // Charges bytes to the device, or throws BudgetError (and charges nothing) when the device
    // would go past its capacity. `what` says what the bytes are for, for the message.
    void reserve(uint64_t bytes, std::string_view what);
    // Gives back bytes reserved earlier; throws std::logic_error when more than live().
    void release(uint64_t bytes);
    // reserve() that gives the bytes back when the Charge goes.
    Charge charge(uint64_t bytes, std::string_view what);

    uint64_t live() const;
    uint64_t peak() const;

private:
    friend class Device;
    Device& device_;
    std::string name_;
    uint64_t live_ = 0, peak_ = 0;  // guarded by the device's mutex
};

// Bytes charged to a pool until destruction (or release()). Move-only.
class Charge {
public:
    Charge() = default;
    Charge(Pool& pool, uint64_t bytes, std::string_view what) : pool_(&pool), bytes_(bytes) {
        pool.reserve(bytes, what);
    }
    Charge(Charge&& o) noexcept : pool_(std::exchange(o.pool_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
    Charge& operator=(Charge&& o) noexcept {
        if (this != &o) {
            release();
            pool_ = std::exchange(o.pool_, nullptr);
            bytes_ = std::exchange(o.bytes_, 0);
        }
        return *this;
    }
    ~Charge() { release(); }

    uint64_t bytes() const { return bytes_; }
    Pool* pool() const { return pool_; }
    void release() noexcept {
        if (pool_ && bytes_ > 0) pool_->release(bytes_);
        pool_ = nullptr;
        bytes_ = 0;
    }

private:
    Pool* pool_ = nullptr;
    uint64_t bytes_ = 0;
};

inline Charge Pool::charge(uint64_t bytes, std::string_view what) {
    return Charge(*this, bytes, what);
}

// n values of T, kAlign-aligned, value-initialized (zeroed for numbers), charged to a pool for
// as long as they live. The charge is taken before the memory is allocated, so a buffer over
// budget throws BudgetError without touching the OS.
template <class T>
class PoolBuffer {
    static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                  "PoolBuffer holds plain values (numbers, bytes, PODs)");

public:
    static constexpr size_t kAlign = 64;

    PoolBuffer() = default;
    PoolBuffer(Pool& pool, size_t n, std::string_view what) : charge_(pool, bytes_for(n, what), what), size_(n) {
        if (n == 0) return;
        data_ = static_cast<T*>(::operator new (charge_.bytes(), std::align_val_t{kAlign}));
        std::memset(static_cast<void*>(data_), 0, n * sizeof(T));
    }
    PoolBuffer(PoolBuffer&& o) noexcept
        : charge_(std::move(o.charge_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
    PoolBuffer& operator=(PoolBuffer&& o) noexcept {
        if (this != &o) {
            free();
            charge_ = std::move(o.charge_);
            data_ = std::exchange(o.data_, nullptr);
            size_ = std::exchange(o.size_, 0);
        }
        return *this;
    }
    ~PoolBuffer() { free(); }

    T* data() { return data_; }
    const T* data() const { return data_; }
    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    T& operator[](size_t i) { return data_[i]; }
    const T& operator[](size_t i) const { return data_[i]; }
    T* begin() { return data_; }
    T* end() { return data_ + size_; }
    const T* begin() const { return data_; }
    const T* end() const { return data_ + size_; }
    std::span<T> span() { return {data_, size_}; }
    std::span<const T> span() const { return {data_, size_}; }
    uint64_t charged_bytes() const { return charge_.bytes(); }

    // The bytes a buffer of n values charges: n * sizeof(T) rounded up to kAlign.
    static uint64_t bytes_for(size_t n, std::string_view what = {}) {
        if (n > (SIZE_MAX - kAlign) / sizeof(T)) {
            throw std::length_error("PoolBuffer: " + std::to_string(n) + " values is too many for " +
                                    std::string(what));
        }
        return (n * sizeof(T) + kAlign - 1) / kAlign * kAlign;
    }

private:
    void free() noexcept {
        if (data_) ::operator delete (static_cast<void*>(data_), std::align_val_t{kAlign});
        data_ = nullptr;
        size_ = 0;
        charge_.release();
    }
    Charge charge_;
    T* data_ = nullptr;
    size_t size_ = 0;
};

}  // namespace fitllm::memory
