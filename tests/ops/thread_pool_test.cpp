#include "ops/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace fitllm::ops {
namespace {

TEST(ThreadPool, PhysicalCoreCountIsPositive) {
    EXPECT_GE(physical_core_count(), 1);
    ThreadPool pool;  // the default: one thread per physical core
    EXPECT_EQ(pool.size(), physical_core_count());
}

TEST(ThreadPool, CoversEveryTaskOnceWithValidThreadIndices) {
    for (int n_threads = 1; n_threads <= 4; ++n_threads) {
        ThreadPool pool(n_threads);
        for (int64_t n_tasks : {0, 1, 2, 3, 5, 17, 1000}) {
            std::vector<std::atomic<int>> hits(static_cast<size_t>(n_tasks));
            std::atomic<int> bad_index{0};
            pool.parallel_for(n_tasks, [&](int64_t begin, int64_t end, int thread_idx) {
                if (thread_idx < 0 || thread_idx >= n_threads || begin >= end) ++bad_index;
                for (int64_t i = begin; i < end; ++i) ++hits[static_cast<size_t>(i)];
            });
            EXPECT_EQ(bad_index.load(), 0);
            for (int64_t i = 0; i < n_tasks; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1) << i;
        }
    }
}

TEST(ThreadPool, ManySmallJobsInARow) {
    // The decode pattern: thousands of tiny jobs back to back; every one must see all its tasks.
    ThreadPool pool(3);
    std::atomic<int64_t> total{0};
    constexpr int kJobs = 5000;
    for (int job = 0; job < kJobs; ++job) {
        pool.parallel_for(3, [&](int64_t begin, int64_t end, int) { total += end - begin; });
    }
    EXPECT_EQ(total.load(), 3 * kJobs);
}

TEST(ThreadPool, JobsAfterAnIdlePauseStillRun) {
    // Workers that went to sleep on the condition variable must wake for the next job.
    ThreadPool pool(2);
    std::atomic<int> sum{0};
    for (int round = 0; round < 3; ++round) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        pool.parallel_for(2, [&](int64_t begin, int64_t end, int) { sum += static_cast<int>(end - begin); });
    }
    EXPECT_EQ(sum.load(), 6);
}

TEST(ThreadPool, RethrowsAnExceptionFromAnyTask) {
    ThreadPool pool(3);
    for (int64_t failing = 0; failing < 12; ++failing) {
        std::atomic<int64_t> ran{0};
        EXPECT_THROW(pool.parallel_for(12,
                                       [&](int64_t begin, int64_t end, int) {
                                           std::this_thread::sleep_for(std::chrono::microseconds(50));
                                           ran += end - begin;
                                           if (begin <= failing && failing < end) throw std::runtime_error("failed");
                                       }),
                     std::runtime_error);
        EXPECT_EQ(ran.load(), 12);  // the other tasks still ran to the end
    }
    // And the pool keeps working afterwards.
    std::atomic<int> count{0};
    pool.parallel_for(6, [&](int64_t begin, int64_t end, int) { count += static_cast<int>(end - begin); });
    EXPECT_EQ(count.load(), 6);
}

}  // namespace
}  // namespace fitllm::ops
