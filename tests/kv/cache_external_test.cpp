// KV pools whose K/V live in a device's own memory (kv::CacheParams::external_storage, what a CUDA
// device's pools are made with): no K/V bytes on the host, the same bookkeeping and charge, and
// what the device needs to follow the host: generation(), cell_copies(), cell_shifts(),
// calibrate_keys() and the K transform's scales. Also ModelCache::on_close.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include "kv/cache.h"
#include "memory/device.h"
#include "memory/pool.h"

namespace fitllm {
namespace {

using quant::GgmlType;

std::vector<float> gaussian(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.5f, 2.0f);
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng);
    return x;
}

kv::CacheParams params(GgmlType type, bool external) {
    kv::CacheParams p;
    p.n_cells = 64;
    p.n_seq_max = 3;
    p.block_size = 8;
    p.type_k = p.type_v = type;
    p.external_storage = external;
    return p;
}

TEST(KvExternalStorage, HoldsNoKvButTheSameBookkeepingAndCharge) {
    const std::vector<kv::LayerShape> layers(2, kv::LayerShape{2, 32, 32});
    memory::Device dev("gpu", 1ull << 30);
    kv::CacheParams p = params(GgmlType::Q4_0, true);
    p.pool = &dev.pool(memory::pool_names::kKv);
    kv::KvCache ext(layers, p);
    kv::KvCache host(layers, params(GgmlType::Q4_0, false));
    EXPECT_FALSE(ext.holds_kv());
    EXPECT_TRUE(host.holds_kv());
    // The device holds the K/V: the charge (to the device's pool) is the same.
    EXPECT_EQ(ext.bytes(), host.bytes());
    EXPECT_EQ(dev.pool(memory::pool_names::kKv).live(), ext.bytes());
    const kv::KvCache::LayerView view = ext.layer_view(1);
    EXPECT_EQ(view.k, nullptr);
    EXPECT_EQ(view.v, nullptr);
    EXPECT_EQ(view.k_row_bytes, host.layer_view(1).k_row_bytes);

    const std::vector<kv::SeqId> seq(20, 0);
    std::vector<kv::Pos> pos(20);
    for (int i = 0; i < 20; ++i) pos[i] = i;
    std::vector<int32_t> a(20), b(20);
    ext.place(seq, pos, a);
    host.place(seq, pos, b);
    EXPECT_EQ(a, b);
    const std::vector<float> k = gaussian(20 * 64, 1), v = gaussian(20 * 64, 2);
    EXPECT_THROW(ext.store(0, a, k.data(), v.data()), std::logic_error);
    std::vector<float> row(64);
    EXPECT_THROW(ext.read_k(0, a[0], row.data()), std::logic_error);
    EXPECT_THROW(ext.read_v(0, a[0], row.data()), std::logic_error);
    ext.seq_add(0, 5, -1, -2);
    EXPECT_THROW(ext.apply_k_shift(0, [](float*, const int32_t*, int) {}), std::logic_error);
}

// A pool of 2 x 256 GiB of K/V is made without allocating them (calloc would have to reserve them).
TEST(KvExternalStorage, AHugePoolAllocatesNothingForItsKv) {
    kv::CacheParams p = params(GgmlType::F32, true);
    p.n_cells = 16384;
    p.n_seq_max = 1;
    const std::vector<kv::LayerShape> layers(2, kv::LayerShape{64, 1024, 1024});  // 256 KiB rows (K)
    const size_t kv_bytes = 2ull * 2 * 16384 * 64 * 1024 * sizeof(float);
    kv::KvCache cache(layers, p);
    EXPECT_GE(cache.bytes(), kv_bytes);  // charged as if held, since the device holds it
    EXPECT_FALSE(cache.holds_kv());
}

TEST(KvExternalStorage, GenerationAndCopiesOnWriteForADeviceToFollow) {
    kv::KvCache cache({kv::LayerShape{1, 32, 32}}, params(GgmlType::F16, true));
    const uint64_t g0 = cache.generation();
    std::vector<kv::SeqId> seq(5, 0);
    std::vector<kv::Pos> pos = {0, 1, 2, 3, 4};
    std::vector<int32_t> cells(5);
    cache.place(seq, pos, cells);
    const uint64_t g1 = cache.generation();
    EXPECT_NE(g1, g0);
    EXPECT_TRUE(cache.cell_copies().empty());
    // Sequence 1 shares the partly filled block; both go on: each copies on write or takes it.
    cache.seq_cp(0, 1, -1, -1);
    EXPECT_NE(cache.generation(), g1);
    std::vector<kv::SeqId> both = {0, 1};
    std::vector<kv::Pos> next = {5, 5};
    std::vector<int32_t> two(2);
    cache.place(both, next, two);
    const std::span<const kv::KvCache::CellCopy> copies = cache.cell_copies();
    ASSERT_EQ(copies.size(), 5u);  // the five cells of the shared block, to the same offsets
    for (size_t i = 0; i < copies.size(); ++i) {
        EXPECT_EQ(copies[i].from, cells[i]);
        EXPECT_EQ(copies[i].to % 8, cells[i] % 8);
        EXPECT_NE(copies[i].to / 8, cells[i] / 8);
    }
    // Any other change: the copies were that place()'s only.
    const uint64_t g2 = cache.generation();
    cache.seq_add(0, 2, -1, 3);
    EXPECT_NE(cache.generation(), g2);
    EXPECT_TRUE(cache.cell_copies().empty());
    // The pending shifts, per cell.
    const std::span<const kv::Pos> shifts = cache.cell_shifts();
    ASSERT_EQ(shifts.size(), static_cast<size_t>(cache.capacity()));
    int shifted = 0;
    for (int32_t c = 0; c < cache.capacity(); ++c) {
        if (shifts[static_cast<size_t>(c)] != 0) {
            EXPECT_EQ(shifts[static_cast<size_t>(c)], 3);
            ++shifted;
        }
    }
    EXPECT_EQ(shifted, 4);  // sequence 0's positions 2, 3, 4, 5 (cells shared with 1 move for it too)
    for (auto op : {+[](kv::KvCache& c) { c.seq_rm(0, 0, 1); }, +[](kv::KvCache& c) { c.seq_keep(1); },
                    +[](kv::KvCache& c) { c.seq_div(1, -1, -1, 2); }, +[](kv::KvCache& c) { c.clear(); }}) {
        const uint64_t before = cache.generation();
        op(cache);
        EXPECT_NE(cache.generation(), before);
    }
}

// The K transform a device applies is the host's: calibrate_keys() sets what store() would, and the
// view gives the scale (k_scale) beside its inverse (q_scale) and the centre.
// Without queries, a host cache fits the diagonal kind from K alone, as a device does.
TEST(KvExternalStorage, CalibrateKeysGivesTheHostsDiagonalKeyTransform) {
    const std::vector<kv::LayerShape> layers(1, kv::LayerShape{2, 32, 32});
    kv::KvCache host(layers, params(GgmlType::Q4_0, false));
    kv::KvCache ext(layers, params(GgmlType::Q4_0, true));
    EXPECT_TRUE(ext.shapes_keys());
    EXPECT_FALSE(kv::KvCache(layers, params(GgmlType::F16, true)).shapes_keys());
    const int n = 24;
    std::vector<kv::SeqId> seq(n, 0);
    std::vector<kv::Pos> pos(n);
    for (int i = 0; i < n; ++i) pos[i] = i;
    std::vector<int32_t> cells(n);
    host.place(seq, pos, cells);
    const std::vector<float> k = gaussian(n * 64, 3), v = gaussian(n * 64, 4);
    host.calibrate_keys(0, kv::KeySample{.k = k.data(), .pos = pos.data(), .n_rows = n});
    host.store(0, cells, k.data(), v.data());
    EXPECT_EQ(ext.layer_view(0).k_scale, nullptr);
    EXPECT_TRUE(ext.needs_key_calibration(0));
    ext.calibrate_keys(0, kv::KeySample{.k = k.data(), .n_rows = n});
    EXPECT_FALSE(ext.needs_key_calibration(0));
    EXPECT_EQ(host.layer_view(0).key, nullptr);
    const kv::KvCache::LayerView a = host.layer_view(0), b = ext.layer_view(0);
    ASSERT_NE(a.k_scale, nullptr);
    ASSERT_NE(b.k_scale, nullptr);
    for (int i = 0; i < 64; ++i) {
        EXPECT_EQ(a.k_scale[i], b.k_scale[i]);
        EXPECT_EQ(a.k_center[i], b.k_center[i]);
        EXPECT_EQ(a.q_scale[i], b.q_scale[i]);
        EXPECT_NEAR(a.k_scale[i] * a.q_scale[i], 1.0f, 1e-6f);
    }
    // Once: a later batch changes nothing.
    const std::vector<float> other = gaussian(n * 64, 5);
    ext.calibrate_keys(0, kv::KeySample{.k = other.data(), .n_rows = n});
    EXPECT_EQ(ext.layer_view(0).k_center[0], a.k_center[0]);
}

TEST(KvModelCacheClose, ExternalDevicePoolsAndHooksThatRunOnceBeforeThePoolsGo) {
    const std::vector<kv::LayerShape> layers(4, kv::LayerShape{2, 32, 32});
    const std::vector<int> windows(4, 0), devices = {0, 0, 1, 1};
    memory::Device gpu("gpu", 1ull << 30);
    int closed = 0;
    {
        kv::ModelCache cache(layers, windows, params(GgmlType::F16, false), 8, devices,
                             {&gpu.pool(memory::pool_names::kKv)}, {true});
        ASSERT_EQ(cache.n_pools(), 2);
        EXPECT_TRUE(cache.pool(0).holds_kv());
        EXPECT_FALSE(cache.pool(1).holds_kv());
        // The hook reads its pool: under AddressSanitizer a pool already gone would show.
        const kv::KvCache* pool = &cache.pool(1);
        cache.on_close([&closed, pool] { closed += pool->capacity() > 0 ? 1 : 100; });
        kv::ModelCache moved = std::move(cache);  // the hook goes with the pools
        EXPECT_EQ(closed, 0);
        moved = kv::ModelCache(layers, windows, params(GgmlType::F16, false), 8);  // assigned over: runs
        EXPECT_EQ(closed, 1);
    }
    EXPECT_EQ(closed, 1);  // neither the moved-from nor the new cache had it
    {
        kv::ModelCache cache(layers, windows, params(GgmlType::F16, false), 8);
        cache.on_close([&closed] { closed += 10; });
        cache.on_close([&closed] { closed *= 2; });  // latest first
    }
    EXPECT_EQ(closed, 12);
}

}  // namespace
}  // namespace fitllm
