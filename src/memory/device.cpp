#include "memory/device.h"

#include <algorithm>
#include <stdexcept>

#include "memory/pool.h"
#include "util/text.h"

namespace fitllm::memory {

Device::Device(std::string name, uint64_t capacity) : name_(std::move(name)), capacity_(capacity) {}
Device::~Device() = default;

uint64_t Device::live() const {
    std::lock_guard lock(mutex_);
    return live_;
}
uint64_t Device::peak() const {
    std::lock_guard lock(mutex_);
    return peak_;
}
uint64_t Device::available() const {
    std::lock_guard lock(mutex_);
    return capacity_ - std::min(live_, capacity_);
}

Pool& Device::pool(std::string_view name) {
    std::lock_guard lock(mutex_);
    for (const auto& p : pools_) {
        if (p->name() == name) return *p;
    }
    pools_.push_back(std::make_unique<Pool>(*this, std::string(name)));
    return *pools_.back();
}

std::vector<PoolStats> Device::pools() const {
    std::lock_guard lock(mutex_);
    std::vector<PoolStats> out;
    for (const auto& p : pools_) out.push_back({p->name_, p->live_, p->peak_});
    return out;
}

std::string Device::breakdown() const {
    std::lock_guard lock(mutex_);
    return breakdown_locked();
}

std::string Device::breakdown_locked() const {
    std::string s;
    for (const auto& p : pools_) {
        if (p->peak_ == 0) continue;  // made, never charged
        if (!s.empty()) s += ", ";
        s += p->name_ + " " + util::human_bytes(p->live_);
        if (p->peak_ != p->live_) s += " (peak " + util::human_bytes(p->peak_) + ")";
    }
    return s.empty() ? "nothing" : s;
}

void Device::reserve(Pool& pool, uint64_t bytes, std::string_view what) {
    std::lock_guard lock(mutex_);
    if (bytes > capacity_ || live_ > capacity_ - bytes) {
        std::string msg = "out of memory budget: pool '" + pool.name_ + "' asked for " + util::human_bytes(bytes) +
                          " (" + std::to_string(bytes) + " bytes)";
        if (!what.empty()) msg += " for " + std::string(what);
        msg += ", but device '" + name_ + "' has " + util::human_bytes(capacity_ - std::min(live_, capacity_)) +
               " free of its " + util::human_bytes(capacity_) + " (" + std::to_string(capacity_) +
               " bytes); in use: " + breakdown_locked();
        throw BudgetError(msg, pool.name_, bytes, capacity_, live_);
    }
    live_ += bytes;
    peak_ = std::max(peak_, live_);
    pool.live_ += bytes;
    pool.peak_ = std::max(pool.peak_, pool.live_);
}

void Device::release(Pool& pool, uint64_t bytes) {
    std::lock_guard lock(mutex_);
    if (bytes > pool.live_) {
        throw std::logic_error("pool '" + pool.name_ + "' on '" + name_ + "' releases " + std::to_string(bytes) +
                               " bytes but holds " + std::to_string(pool.live_));
    }
    pool.live_ -= bytes;
    live_ -= bytes;
}

}  // namespace fitllm::memory
