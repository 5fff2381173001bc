// kv::ModelCache with layers on devices: pools grouped by (window, device), each charging its
// device's pool, kept in step by place() and the sequence operations; bytes_per_device() is what
// they charge.
#include <gtest/gtest.h>

#include <vector>

#include "kv/cache.h"
#include "memory/device.h"
#include "memory/pool.h"

namespace fitllm {
namespace {

TEST(KvModelCacheDevices, GroupsPoolsByWindowAndDeviceAndChargesEach) {
    const std::vector<kv::LayerShape> layers(6, kv::LayerShape{2, 32, 32});
    const std::vector<int> windows = {16, 16, 0, 16, 16, 0};
    const std::vector<int> devices = {0, 0, 0, 1, 1, 1};
    memory::Device host("host", 1ull << 30), gpu("gpu", 1ull << 30);
    kv::CacheParams p;
    p.n_cells = 512;
    p.n_seq_max = 2;
    p.pool = &host.pool(memory::pool_names::kKv);
    kv::ModelCache cache(layers, windows, p, 8, devices, {&gpu.pool(memory::pool_names::kKv)});
    ASSERT_EQ(cache.n_pools(), 4);  // (0, host), (0, gpu), (16, host), (16, gpu)
    EXPECT_EQ(cache.pool_device(0), 0);
    EXPECT_EQ(cache.pool_device(1), 1);
    EXPECT_EQ(cache.pool_device(2), 0);
    EXPECT_EQ(cache.pool_device(3), 1);
    EXPECT_EQ(cache.pool_of(2), 0);
    EXPECT_EQ(cache.pool_of(5), 1);
    EXPECT_EQ(cache.pool_of(0), 2);
    EXPECT_EQ(cache.pool_of(4), 3);
    EXPECT_EQ(cache.index_in_pool(5), 0);
    EXPECT_EQ(cache.index_in_pool(4), 1);

    const std::vector<size_t> per_device = kv::ModelCache::bytes_per_device(layers, windows, p, 8, devices);
    ASSERT_EQ(per_device.size(), 2u);
    EXPECT_EQ(host.pool(memory::pool_names::kKv).live(), per_device[0]);
    EXPECT_EQ(gpu.pool(memory::pool_names::kKv).live(), per_device[1]);
    EXPECT_EQ(per_device[0] + per_device[1], cache.bytes());
    // Split over two devices, each pool keeps its own bookkeeping: more than all on one.
    EXPECT_GT(cache.bytes(), kv::ModelCache::bytes_for(layers, windows, p, 8));
    // Every pool places the same cells.
    const std::vector<kv::SeqId> seq = {0, 1, 0};
    const std::vector<kv::Pos> pos = {0, 0, 1};
    cache.place(seq, pos);
    for (int i = 1; i < cache.n_pools(); ++i) EXPECT_EQ(cache.pool(i).used_cells(), 3);
    cache.seq_rm(1, -1, -1);
    for (int i = 0; i < cache.n_pools(); ++i) EXPECT_EQ(cache.pool(i).used_cells(), 2);

    // A device without a pool is refused.
    EXPECT_THROW(kv::ModelCache(layers, windows, p, 8, devices, {}), std::invalid_argument);
    EXPECT_THROW(kv::ModelCache(layers, windows, p, 8, {0, 1}, {&gpu.pool("kv")}), std::invalid_argument);
}

}  // namespace
}  // namespace fitllm
