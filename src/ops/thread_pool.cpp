#include "ops/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <utility>

namespace fitllm::ops {
namespace {

// How long a thread polls before it sleeps. A decode step issues its next job within a few
// microseconds; sleeping and waking through the kernel costs tens of microseconds per job.
constexpr int kSpinIterations = 1 << 12;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

bool read_int(const std::string& path, int& value) {
    std::ifstream in(path);
    return static_cast<bool>(in >> value);
}

}  // namespace

int physical_core_count() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) {
        const unsigned hw = std::thread::hardware_concurrency();
        return hw > 0 ? static_cast<int>(hw) : 1;
    }
    std::set<std::pair<int, int>> cores;  // (package, core)
    bool topology_known = true;
    for (int cpu = 0; cpu < CPU_SETSIZE && topology_known; ++cpu) {
        if (!CPU_ISSET(cpu, &set)) continue;
        const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
        int package = 0;
        int core = 0;
        topology_known = read_int(dir + "physical_package_id", package) && read_int(dir + "core_id", core);
        cores.emplace(package, core);
    }
    if (topology_known && !cores.empty()) return static_cast<int>(cores.size());
    const int affinity = CPU_COUNT(&set);
    return affinity > 0 ? affinity : 1;
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads > 0 ? n_threads : physical_core_count()) {
    workers_.reserve(static_cast<size_t>(n_threads_ - 1));
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard lock(mutex_);
        stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
}

namespace {

// A job is cut into up to this many chunks per thread: enough to even out threads that start
// late or run slower, few enough that each chunk streams a long run of rows.
constexpr int64_t kChunksPerThread = 4;
constexpr uint64_t kMaxChunks = 0xffff;

constexpr uint32_t generation_of(uint64_t state) {
    return static_cast<uint32_t>(state >> 32);
}
constexpr uint32_t next_chunk_of(uint64_t state) {
    return static_cast<uint32_t>(state >> 16) & 0xffff;
}
constexpr uint32_t n_chunks_of(uint64_t state) {
    return static_cast<uint32_t>(state) & 0xffff;
}

}  // namespace

void ThreadPool::run_chunks(uint32_t generation, int thread_idx) noexcept {
    uint64_t state = job_state_.load(std::memory_order_acquire);
    for (;;) {
        if (generation_of(state) != generation) return;
        const uint32_t chunk = next_chunk_of(state);
        const uint32_t n_chunks = n_chunks_of(state);
        if (chunk >= n_chunks) return;
        if (!job_state_.compare_exchange_weak(state, state + (uint64_t{1} << 16), std::memory_order_acq_rel,
                                              std::memory_order_acquire)) {
            continue;  // state now holds the current value
        }
        // The chunk is ours: the job cannot finish, nor job_ change, before we report it done.
        const int64_t begin = job_tasks_ * chunk / n_chunks;
        const int64_t end = job_tasks_ * (chunk + 1) / n_chunks;
        try {
            job_.call(job_.ctx, begin, end, thread_idx);
        } catch (...) {
            std::lock_guard lock(mutex_);
            if (!job_error_) job_error_ = std::current_exception();
        }
        if (chunks_done_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_chunks && thread_idx != 0) {
            // The last chunk: wake the caller; the lock orders this with its predicate check.
            std::lock_guard lock(mutex_);
            done_.notify_one();
        }
        state = job_state_.load(std::memory_order_acquire);
    }
}

void ThreadPool::run(int64_t n_tasks, RangeFn fn) {
    if (n_tasks <= 0) return;
    if (n_threads_ == 1 || n_tasks == 1) {
        fn.call(fn.ctx, 0, n_tasks, 0);
        return;
    }
    const auto n_chunks = static_cast<uint32_t>(std::min<uint64_t>(
        {static_cast<uint64_t>(n_tasks), static_cast<uint64_t>(n_threads_ * kChunksPerThread), kMaxChunks}));
    job_ = fn;
    job_tasks_ = n_tasks;
    job_error_ = nullptr;
    chunks_done_.store(0, std::memory_order_relaxed);
    ++generation_;
    {
        // Under the lock, so that a worker that has just checked the state and is about to sleep
        // cannot miss the notification.
        std::lock_guard lock(mutex_);
        job_state_.store(uint64_t{generation_} << 32 | n_chunks, std::memory_order_release);
    }
    wake_.notify_all();

    run_chunks(generation_, 0);

    for (int i = 0; i < kSpinIterations; ++i) {
        if (chunks_done_.load(std::memory_order_acquire) == n_chunks) break;
        cpu_relax();
    }
    if (chunks_done_.load(std::memory_order_acquire) != n_chunks) {
        std::unique_lock lock(mutex_);
        done_.wait(lock, [&] { return chunks_done_.load(std::memory_order_acquire) == n_chunks; });
    }
    if (job_error_) std::rethrow_exception(std::exchange(job_error_, nullptr));
}

void ThreadPool::worker_loop(int thread_idx) {
    uint32_t seen = 0;
    for (;;) {
        uint32_t generation = generation_of(job_state_.load(std::memory_order_acquire));
        for (int i = 0; i < kSpinIterations && generation == seen; ++i) {
            cpu_relax();
            generation = generation_of(job_state_.load(std::memory_order_acquire));
        }
        if (generation == seen) {
            std::unique_lock lock(mutex_);
            wake_.wait(lock,
                       [&] { return stopping_ || generation_of(job_state_.load(std::memory_order_acquire)) != seen; });
            if (stopping_) return;
            generation = generation_of(job_state_.load(std::memory_order_acquire));
        }
        seen = generation;
        run_chunks(generation, thread_idx);
    }
}

}  // namespace fitllm::ops
