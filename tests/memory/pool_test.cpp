// memory/device.h, pool.h: charging pools, the over-budget error, RAII and thread safety.
#include "memory/pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace fitllm::memory {
namespace {

TEST(Pool, ChargesAndReleasesTheDevice) {
    Device host("host", 1000);
    Pool& weights = host.pool("weights");
    Pool& kv = host.pool("kv");
    EXPECT_EQ(&host.pool("weights"), &weights);
    weights.reserve(600, "layers");
    kv.reserve(300, "cache");
    EXPECT_EQ(host.live(), 900u);
    EXPECT_EQ(host.available(), 100u);
    kv.release(200);
    EXPECT_EQ(kv.live(), 100u);
    EXPECT_EQ(kv.peak(), 300u);
    EXPECT_EQ(host.peak(), 900u);
    EXPECT_EQ(host.live(), 700u);
    const auto stats = host.pools();
    ASSERT_EQ(stats.size(), 2u);
    EXPECT_EQ(stats[0].name, "weights");
    EXPECT_EQ(stats[1].live, 100u);
    EXPECT_THROW(kv.release(101), std::logic_error);
}

TEST(Pool, OverBudgetNamesPoolBytesCapacityAndBreakdown) {
    Device host("host", 1 << 20);
    host.pool("weights").reserve(700 << 10, "mapped layers");
    host.pool("kv").reserve(200 << 10, "cache");
    try {
        host.pool("scratch").reserve(300 << 10, "activations");
        FAIL() << "over budget was accepted";
    } catch (const BudgetError& e) {
        const std::string msg = e.what();
        EXPECT_EQ(e.pool(), "scratch");
        EXPECT_EQ(e.requested(), 300u << 10);
        EXPECT_EQ(e.capacity(), 1u << 20);
        EXPECT_EQ(e.in_use(), 900u << 10);
        for (const char* part : {"'scratch'", "300 KiB", "307200 bytes", "activations", "'host'", "1.00 MiB",
                                 "1048576 bytes", "weights 700 KiB", "kv 200 KiB", "124 KiB free"}) {
            EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in: " << msg;
        }
    }
    EXPECT_EQ(host.live(), 900u << 10);  // nothing was charged
    EXPECT_EQ(host.pool("scratch").live(), 0u);
}

TEST(Pool, ExactlyFullFitsAndHugeRequestsDoNotOverflow) {
    Device host("host", 100);
    host.pool("a").reserve(100, "");
    EXPECT_THROW(host.pool("a").reserve(1, ""), BudgetError);
    EXPECT_THROW(host.pool("b").reserve(UINT64_MAX, ""), BudgetError);
}

TEST(Charge, ReleasesOnDestructionAndMoves) {
    Device host("host", 100);
    Pool& p = host.pool("logits");
    {
        Charge a = p.charge(40, "x");
        EXPECT_EQ(p.live(), 40u);
        Charge b = std::move(a);
        EXPECT_EQ(a.bytes(), 0u);
        EXPECT_EQ(b.bytes(), 40u);
        EXPECT_EQ(p.live(), 40u);
        Charge c = p.charge(50, "y");
        b = std::move(c);  // releases b's 40
        EXPECT_EQ(p.live(), 50u);
    }
    EXPECT_EQ(p.live(), 0u);
    EXPECT_EQ(p.peak(), 90u);
}

TEST(PoolBuffer, AlignedZeroedChargedAndReleased) {
    Device host("host", 1 << 20);
    Pool& p = host.pool("scratch");
    {
        PoolBuffer<float> buf(p, 1000, "activations");
        EXPECT_EQ(buf.size(), 1000u);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.data()) % 64, 0u);
        EXPECT_EQ(buf.charged_bytes(), 4032u);  // 4000 rounded up to 64
        EXPECT_EQ(p.live(), 4032u);
        for (float v : buf) EXPECT_EQ(v, 0.0f);
        buf[999] = 1.0f;
        PoolBuffer<float> moved = std::move(buf);
        EXPECT_EQ(moved[999], 1.0f);
        EXPECT_EQ(p.live(), 4032u);
    }
    EXPECT_EQ(p.live(), 0u);
}

TEST(PoolBuffer, OverBudgetThrowsBeforeAllocating) {
    Device host("host", 1 << 20);
    Pool& p = host.pool("kv");
    // 1 TiB would fail in the OS; the pool refuses it first.
    EXPECT_THROW(PoolBuffer<std::byte>(p, size_t{1} << 40, "KV cache"), BudgetError);
    EXPECT_EQ(p.live(), 0u);
}

TEST(Pool, ThreadSafeUnderContention) {
    constexpr int kThreads = 8, kRounds = 20000;
    Device host("host", 8 * 64);  // room for every thread's 64 bytes at once, never more
    std::vector<std::thread> threads;
    std::atomic<int> refused{0};
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            Pool& p = host.pool(t % 2 ? "kv" : "scratch");
            for (int i = 0; i < kRounds; ++i) {
                try {
                    Charge c = p.charge(64, "smoke");
                    if (host.live() > host.capacity()) ADD_FAILURE() << "over capacity";
                } catch (const BudgetError&) {
                    ++refused;
                }
            }
        });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(refused.load(), 0);
    EXPECT_EQ(host.live(), 0u);
    EXPECT_LE(host.peak(), host.capacity());
    EXPECT_EQ(host.pool("kv").live(), 0u);
}

}  // namespace
}  // namespace fitllm::memory
