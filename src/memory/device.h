#pragma once
// A device's memory (docs/architecture.md, idea 2): a capacity, and the named pools that charge it. Every
// large allocation asks its pool first; a request that would take the device past its capacity
// is refused with a BudgetError before the OS is asked, so the process lives on.
//
//   memory::Device host("host", memory::host_budget().budget);
//   memory::Pool& kv = host.pool("kv");
//   memory::Charge c = kv.charge(cache_bytes, "KV cache, 2048 cells");  // or BudgetError
//   memory::PoolBuffer<float> logits(host.pool("logits"), n_vocab, "logits");
//
// Thread safety: every member may be called from any thread; one mutex per device keeps the
// pools' sums and the device's sum consistent.
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "fitllm/error.h"

namespace fitllm::memory {

class Pool;

// A request the device has no room for (fitllm/error.h): what() names the pool, what it was for,
// the bytes asked for, the device and its capacity, and what each pool holds.
using BudgetError = fitllm::BudgetError;

struct PoolStats {
    std::string name;
    uint64_t live = 0;  // bytes charged now
    uint64_t peak = 0;  // the most ever charged at once
};

class Device {
public:
    Device(std::string name, uint64_t capacity);
    ~Device();
    Device(const Device&) = delete;  // pools point at their device
    Device& operator=(const Device&) = delete;

    const std::string& name() const { return name_; }
    uint64_t capacity() const { return capacity_; }
    uint64_t live() const;
    uint64_t peak() const;
    uint64_t available() const;  // capacity - live

    // The pool of that name, made on first use; the reference stays valid as long as the device.
    Pool& pool(std::string_view name);
    std::vector<PoolStats> pools() const;  // in the order they were made
    // "weights 800 MiB, kv 0 B (peak 64.0 MiB), ..." for messages: the pools ever charged, with
    // their peak where it is above what they hold now; "nothing" when none was.
    std::string breakdown() const;

private:
    friend class Pool;
    void reserve(Pool& pool, uint64_t bytes, std::string_view what);
    void release(Pool& pool, uint64_t bytes);
    std::string breakdown_locked() const;

    std::string name_;
    uint64_t capacity_;
    mutable std::mutex mutex_;
    uint64_t live_ = 0, peak_ = 0;
    std::vector<std::unique_ptr<Pool>> pools_;
};

}  // namespace fitllm::memory
