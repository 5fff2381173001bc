// The single-sequence float KV cache.
#include "kv/kv_cache.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace fitllm {
namespace {

TEST(KvCache, AppendStoresPositionsAndRowsRoundedToF16) {
    kv::KvCache cache(/*n_layer=*/2, /*n_ctx=*/4, /*n_head_kv=*/1, /*head_dim_k=*/2, /*head_dim_v=*/2);
    EXPECT_EQ(cache.capacity(), 4);
    EXPECT_EQ(cache.bytes(), 2u * 4 * (2 + 2) * sizeof(float) + 4 * sizeof(int32_t));
    const int32_t pos[2] = {10, 11};
    EXPECT_EQ(cache.append(pos, 2), 0);
    const float k[4] = {1.0f, 2.0f, 3.0f, 1.0001f};      // 1.0001 is not an f16 value: it rounds to 1
    const float v[4] = {-1.0f, -2.0f, -3.0f, 65536.0f};  // past the f16 range: infinity
    cache.store(1, 0, 2, k, v);
    EXPECT_EQ(cache.size(), 2);
    EXPECT_EQ(cache.positions()[1], 11);
    EXPECT_EQ(cache.k(1)[2], 3.0f);
    EXPECT_EQ(cache.k(1)[3], 1.0f);
    EXPECT_EQ(cache.v(1)[0], -1.0f);
    EXPECT_TRUE(std::isinf(cache.v(1)[3]));
    EXPECT_EQ(cache.append(pos, 1), 2);
}

TEST(KvCache, FullCacheSaysHowMuchIsFree) {
    kv::KvCache cache(1, 3, 1, 2, 2);
    const int32_t pos[4] = {0, 1, 2, 3};
    cache.append(pos, 2);
    try {
        cache.append(pos, 2);
        FAIL() << "expected KvCacheError";
    } catch (const kv::KvCacheError& e) {
        EXPECT_NE(std::string(e.what()).find("1 of 3 cells free"), std::string::npos) << e.what();
    }
    cache.clear();
    EXPECT_EQ(cache.size(), 0);
    EXPECT_EQ(cache.append(pos, 3), 0);
}

TEST(KvCache, StoreOutsideCellsInUseThrows) {
    kv::KvCache cache(1, 4, 1, 2, 2);
    const float row[2] = {0.0f, 0.0f};
    EXPECT_THROW(cache.store(0, 0, 1, row, row), std::out_of_range);
    EXPECT_THROW(kv::KvCache(0, 4, 1, 2, 2), std::invalid_argument);
}

}  // namespace
}  // namespace fitllm
