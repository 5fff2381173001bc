// The KV cache charges its memory pool (issue 6): the pool's live bytes are the cache's bytes(),
// a cache over budget throws memory::BudgetError before allocating, and the bytes come back.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "kv/cache.h"
#include "kv/cache_test_support.h"
#include "kv/key_transform.h"
#include "memory/device.h"
#include "memory/pool.h"

namespace fitllm::kv {
namespace {

namespace fs = std::filesystem;
using test::shapes;
using test::small_params;

CacheParams charged(memory::Pool& pool, int n_cells, quant::GgmlType type = quant::GgmlType::F16) {
    CacheParams p = small_params(n_cells, 2, 16);
    p.type_k = type;
    p.type_v = type;
    p.pool = &pool;
    return p;
}

TEST(KvCacheBudget, ChargesItsPoolForItsBytes) {
    memory::Device host("host", uint64_t{1} << 30);
    memory::Pool& kv = host.pool(memory::pool_names::kKv);
    for (const auto type : {quant::GgmlType::F16, quant::GgmlType::Q8_0, quant::GgmlType::Q4_0}) {
        {
            KvCache cache(shapes(3), charged(kv, 1000, type));
            EXPECT_EQ(kv.live(), cache.bytes());
            EXPECT_EQ(cache.bytes(), KvCache::bytes_for(shapes(3), charged(kv, 1000, type)));
            // K and V of 3 layers, 1008 cells (whole blocks), plus the bookkeeping.
            const size_t row =
                type == quant::GgmlType::F16 ? 2 * 32 * 2 : (type == quant::GgmlType::Q8_0 ? 2 * 34 : 2 * 18);
            EXPECT_GE(cache.bytes(), 3 * 1008 * 2 * row);
            // The K transforms' (kv/key_transform.h) for quantized K.
            EXPECT_LT(cache.bytes(), 3 * 1008 * 2 * row + 1008 * 64 +
                                         KvCache::key_transform_bytes(shapes(3), charged(kv, 1000, type)));
            EXPECT_EQ(KvCache::key_transform_bytes(shapes(3), charged(kv, 1000, type)) > 0,
                      type != quant::GgmlType::F16);
        }
        EXPECT_EQ(kv.live(), 0u);
    }
}

TEST(KvCacheBudget, WithoutAPoolNothingIsCharged) {
    KvCache cache(shapes(2), small_params(64));
    EXPECT_GT(cache.bytes(), 0u);
    EXPECT_EQ(cache.bytes(), KvCache::bytes_for(shapes(2), small_params(64)));
}

TEST(KvCacheBudget, OverBudgetThrowsBeforeAllocating) {
    memory::Device host("host", 1 << 20);
    memory::Pool& weights = host.pool(memory::pool_names::kWeights);
    memory::Charge held = weights.charge(512 << 10, "weights");
    memory::Pool& kv = host.pool(memory::pool_names::kKv);
    const CacheParams p = charged(kv, 4096);  // 4 layers x 4096 cells x 256 bytes = 4 MiB
    const size_t need = KvCache::bytes_for(shapes(4), p);
    try {
        KvCache cache(shapes(4), p);
        FAIL() << "a 4 MiB cache fit in 1 MiB";
    } catch (const memory::BudgetError& e) {
        const std::string what = e.what();
        EXPECT_EQ(e.pool(), "kv");
        EXPECT_EQ(e.requested(), need);
        EXPECT_NE(what.find("kv"), std::string::npos) << what;
        EXPECT_NE(what.find("KV cache (4096 cells x 4 layers"), std::string::npos) << what;
    }
    EXPECT_EQ(kv.live(), 0u);
    EXPECT_EQ(host.live(), uint64_t{512} << 10);
    // The process lives on: a cache that fits is made afterwards.
    KvCache small(shapes(1), charged(kv, 256));
    EXPECT_EQ(kv.live(), small.bytes());
}

TEST(KvCacheBudget, ModelCacheChargesEveryPool) {
    memory::Device host("host", uint64_t{1} << 30);
    memory::Pool& kv = host.pool(memory::pool_names::kKv);
    CacheParams p = charged(kv, 1024);
    {
        // Gemma 3's pattern: a full pool and a window pool, both charged.
        ModelCache cache(shapes(6), {8, 8, 0, 8, 8, 0}, p, 16);
        ASSERT_EQ(cache.n_pools(), 2);
        EXPECT_EQ(kv.live(), cache.bytes());
        EXPECT_EQ(cache.bytes(), cache.pool(0).bytes() + cache.pool(1).bytes());
        EXPECT_GT(cache.pool(1).bytes(), 0u);
    }
    EXPECT_EQ(kv.live(), 0u);
}

TEST(KvCacheBudget, ModelCacheChargesTheKeyFitOnce) {
    // Fits run one layer at a time: of a model's pools only the first layer's holds their working
    // memory, the other ones their transforms alone.
    memory::Device host("host", uint64_t{1} << 30);
    memory::Pool& kv = host.pool(memory::pool_names::kKv);
    const CacheParams p = charged(kv, 1024, quant::GgmlType::Q4_0);
    const ModelCache cache(shapes(6), {8, 8, 0, 8, 8, 0}, p, 16);
    ASSERT_EQ(cache.n_pools(), 2);
    const int first = cache.pool_of(0), other = 1 - first;  // the window pool (4 layers), the full one (2)
    EXPECT_TRUE(cache.pool(first).params().charge_key_fit);
    EXPECT_FALSE(cache.pool(other).params().charge_key_fit);
    CacheParams full = cache.pool(other).params();
    full.charge_key_fit = true;
    EXPECT_EQ(KvCache::bytes_for(shapes(2), full) - cache.pool(other).bytes(),
              query_aware_fit_bytes(shapes(1)[0].head_dim_k));
    EXPECT_EQ(kv.live(), cache.bytes());
    EXPECT_EQ(ModelCache::bytes_for(shapes(6), {8, 8, 0, 8, 8, 0}, p, 16), cache.bytes());
}

TEST(KvCacheBudget, ModelCacheBytesForIsWhatItCharges) {
    const std::vector<int> windows{8, 8, 0, 8, 8, 0};
    std::string why_not;
    const fs::path dir = test::spill_test_dir("bytes-for", why_not);
    if (!why_not.empty()) GTEST_SKIP() << why_not;
    memory::Device host("host", uint64_t{1} << 30);
    memory::Pool& kv = host.pool("kv");
    CacheParams p = charged(kv, 4096);
    for (const uint64_t limit : {uint64_t{0}, uint64_t{3} << 19}) {  // in memory; spilled (1 of 2 layers resident)
        p.spill_dir = limit > 0 ? dir.string() : "";
        p.resident_limit = limit;
        const ModelCache cache(shapes(6), windows, p, 16);
        EXPECT_EQ(cache.pool(0).spilled(), limit > 0);
        EXPECT_EQ(ModelCache::bytes_for(shapes(6), windows, p, 16), cache.bytes());
        EXPECT_EQ(kv.live(), cache.bytes());
    }
}

TEST(KvCacheBudget, ModelCacheIsAllOrNothing) {
    // Room for the full pool but not the window pool as well: nothing stays charged.
    const std::vector<int> windows{8, 8, 0, 8, 8, 0};
    memory::Device probe("probe", uint64_t{1} << 30);
    const CacheParams probe_params = charged(probe.pool("kv"), 1024);
    const ModelCache sizes(shapes(6), windows, probe_params, 16);
    memory::Device host("host", sizes.pool(0).bytes() + sizes.pool(1).bytes() / 2);
    memory::Pool& kv = host.pool("kv");
    EXPECT_THROW(ModelCache(shapes(6), windows, charged(kv, 1024), 16), memory::BudgetError);
    EXPECT_EQ(kv.live(), 0u);
}

}  // namespace
}  // namespace fitllm::kv
