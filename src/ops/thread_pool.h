#pragma once
// The CPU thread pool every op splits its work over: the one piece of shared state fitllm allows
// besides logging. It is created once (from `-t N`) and passed explicitly to the ops that use it.
//
// Built for decode, where one token runs a few hundred small parallel_for calls: workers spin on
// the job word for a short while after each job, so the next job starts without a system call,
// and only then sleep on a condition variable. A call allocates nothing.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace fitllm::ops {

// The number of physical cores this process may run on: the CPUs of sched_getaffinity, counted
// once per (package, core) from /sys/devices/system/cpu/cpuN/topology. SMT siblings share one
// core's execution units and, for these memory-bound kernels, add little but contention. Falls
// back to the affinity count, then std::thread::hardware_concurrency(), then 1.
int physical_core_count();

class ThreadPool {
public:
    // n_threads counts the calling thread, which takes part in every job: n_threads - 1 workers
    // are started. n_threads <= 0 means physical_core_count().
    explicit ThreadPool(int n_threads = 0);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }

    // Calls fn(begin, end, thread_idx) on disjoint ranges that together cover [0, n_tasks), and
    // returns when all are done. thread_idx < size() names the thread running the range (0: the
    // caller), so fn can use per-thread scratch; one thread may get several ranges, and a range
    // is never split between threads. The first exception thrown by fn is
    // rethrown here after all ranges finished. Not reentrant: fn must not call parallel_for on
    // the same pool.
    template <class Fn>
    void parallel_for(int64_t n_tasks, Fn&& fn) {
        using F = std::remove_reference_t<Fn>;
        run(n_tasks, RangeFn{&fn, [](void* ctx, int64_t begin, int64_t end, int thread_idx) {
                                 (*static_cast<F*>(ctx))(begin, end, thread_idx);
                             }});
    }

private:
    // A non-owning reference to the caller's callable: no std::function, so no allocation.
    struct RangeFn {
        void* ctx = nullptr;
        void (*call)(void* ctx, int64_t begin, int64_t end, int thread_idx) = nullptr;
    };

    void run(int64_t n_tasks, RangeFn fn);
    void worker_loop(int thread_idx);
    // Claims and runs chunks of job `generation` until none is left or a newer job replaced it.
    void run_chunks(uint32_t generation, int thread_idx) noexcept;

    int n_threads_ = 1;
    std::vector<std::thread> workers_;

    // Threads take chunks of a job one at a time from a shared counter, so a worker that the OS
    // has not scheduled yet delays nothing: the others, the caller included, take its share.
    // job_state_ packs (generation << 32 | next_chunk << 16 | n_chunks): a claim is one CAS that
    // fails for a stale generation, so a late worker can never touch a finished job.
    std::atomic<uint64_t> job_state_{0};
    std::atomic<uint32_t> chunks_done_{0};
    RangeFn job_;  // written before job_state_ publishes it, stable until all chunks are done
    int64_t job_tasks_ = 0;
    uint32_t generation_ = 0;  // the caller's copy

    std::mutex mutex_;
    std::condition_variable wake_;  // workers sleep here between jobs
    std::condition_variable done_;  // the caller sleeps here until the last chunk is done
    bool stopping_ = false;         // guarded by mutex_
    std::exception_ptr job_error_;  // guarded by mutex_
};

}  // namespace fitllm::ops
