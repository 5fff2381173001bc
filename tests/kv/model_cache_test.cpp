// ModelCache: the full-attention pool and the sliding-window pools of one model.
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv/cache.h"
#include "kv/cache_test_support.h"

namespace fitllm::kv {
namespace {

using test::expect_consistent;
using test::positions;
using test::small_params;

const LayerShape kShape{2, 32, 32};

std::vector<LayerShape> model_shapes(size_t n) {
    return std::vector<LayerShape>(n, kShape);
}

void place(ModelCache& cache, const std::vector<SeqId>& seq, const std::vector<Pos>& pos) {
    cache.place(seq, pos);
}

TEST(ModelCache, OnePoolWithoutWindows) {
    ModelCache cache(model_shapes(3), {0, 0, 0}, small_params(64, 2, 4), 8);
    EXPECT_EQ(cache.n_pools(), 1);
    EXPECT_EQ(cache.capacity(), 64);
    EXPECT_EQ(cache.pool(0).n_layer(), 3);
    for (int il = 0; il < 3; ++il) {
        EXPECT_EQ(cache.pool_of(il), 0);
        EXPECT_EQ(cache.index_in_pool(il), il);
    }
    EXPECT_EQ(cache.bytes(), cache.pool(0).bytes());
}

TEST(ModelCache, WindowedLayersGetASmallPool) {
    // Gemma 3's pattern: five local layers, then a global one.
    const std::vector<int> windows{8, 8, 0, 8, 8, 0};
    const CacheParams p = small_params(256, 2, 4);
    ModelCache cache(model_shapes(6), windows, p, 4);
    ASSERT_EQ(cache.n_pools(), 2);
    EXPECT_EQ(cache.pool(0).params().window, 0);
    EXPECT_EQ(cache.pool(0).capacity(), 256);
    EXPECT_EQ(cache.pool(0).n_layer(), 2);
    EXPECT_EQ(cache.pool(1).params().window, 8);
    EXPECT_EQ(cache.pool(1).n_layer(), 4);
    // 2 sequences * (8 / 4 + 2 blocks) + 4 / 4 blocks.
    EXPECT_EQ(ModelCache::window_pool_cells(p, 8, 4), (2 * (2 + 2) + 1) * 4);
    EXPECT_EQ(cache.pool(1).capacity(), 36);
    EXPECT_EQ(cache.capacity(), 256);
    const std::vector<int> pool_of{1, 1, 0, 1, 1, 0}, index{0, 1, 0, 2, 3, 1};
    for (int il = 0; il < 6; ++il) {
        EXPECT_EQ(cache.pool_of(il), pool_of[static_cast<size_t>(il)]) << il;
        EXPECT_EQ(cache.index_in_pool(il), index[static_cast<size_t>(il)]) << il;
    }
    EXPECT_EQ(cache.bytes(), cache.pool(0).bytes() + cache.pool(1).bytes());
    EXPECT_LT(cache.pool(1).bytes(), cache.pool(0).bytes());
}

TEST(ModelCache, AWindowNoSmallerThanTheContextUsesTheFullPool) {
    ModelCache cache(model_shapes(2), {0, 512}, small_params(64, 1, 4), 8);
    EXPECT_EQ(cache.n_pools(), 1);
    EXPECT_EQ(cache.pool_of(1), 0);
    // Every layer windowed, context smaller than the window: one pool, full size.
    ModelCache all(model_shapes(2), {512, 512}, small_params(64, 1, 4), 8);
    EXPECT_EQ(all.n_pools(), 1);
    EXPECT_EQ(all.capacity(), 64);
}

TEST(ModelCache, EveryLayerWindowed) {
    ModelCache cache(model_shapes(2), {16, 16}, small_params(4096, 1, 16), 16);
    ASSERT_EQ(cache.n_pools(), 1);
    EXPECT_EQ(cache.pool(0).params().window, 16);
    EXPECT_EQ(cache.capacity(), 4096);  // the context, not the pool
    for (Pos p = 0; p < 1000; p += 16) {
        std::vector<SeqId> seq(16, 0);
        std::vector<Pos> pos;
        for (int i = 0; i < 16; ++i) pos.push_back(p + i);
        cache.place(seq, pos);
        cache.end_batch();
    }
    EXPECT_EQ(cache.seq_pos_max(0), 1007);
    EXPECT_EQ(cache.seq_pos_min(0), 1007 - 15);  // the window
}

TEST(ModelCache, PlacesInEveryPoolAndTrimsWindowPools) {
    ModelCache cache(model_shapes(4), {0, 4, 0, 4}, small_params(512, 2, 4), 2);
    ASSERT_EQ(cache.n_pools(), 2);
    // Two sequences decoding side by side for a long time: the window pool never fills.
    for (Pos p = 0; p < 200; ++p) {
        place(cache, {0, 1}, {p, p});
        ASSERT_EQ(cache.cells(0).size(), 2u);
        ASSERT_EQ(cache.cells(1).size(), 2u);
        EXPECT_EQ(cache.pool(0).cell_pos(cache.cells(0)[1]), p);
        EXPECT_EQ(cache.pool(1).cell_pos(cache.cells(1)[0]), p);
        EXPECT_TRUE(cache.pool(1).cell_has_seq(cache.cells(1)[1], 1));
        cache.end_batch();
    }
    EXPECT_EQ(cache.pool(0).used_cells(), 400);
    EXPECT_EQ(positions(cache.pool(1), 0), (std::multiset<Pos>{196, 197, 198, 199}));
    EXPECT_LE(cache.pool(1).allocated_cells(), cache.pool(1).capacity());
    EXPECT_EQ(cache.seq_pos_max(1), 199);
    EXPECT_EQ(cache.seq_pos_min(1), 0);
    expect_consistent(cache.pool(0));
    expect_consistent(cache.pool(1));
}

TEST(ModelCache, WindowPoolHoldsAFullBatchPerStep) {
    const int n_batch = 7, window = 5;
    ModelCache cache(model_shapes(2), {0, window}, small_params(4096, 3, 4), n_batch);
    Pos next[3] = {0, 0, 0};
    for (int step = 0; step < 300; ++step) {
        std::vector<SeqId> seq;
        std::vector<Pos> pos;
        for (int i = 0; i < n_batch; ++i) {
            const SeqId s = (step + i * i) % 3;
            seq.push_back(s);
            pos.push_back(next[s]++);
        }
        ASSERT_NO_THROW(cache.place(seq, pos)) << "step " << step;
        cache.end_batch();
        if (step % 50 == 49) cache.seq_rm(step % 3, -1, -1), next[step % 3] = 0;
        if (step == 120) {  // seq 2 restarts from a copy of seq 0
            cache.seq_rm(2, -1, -1);
            cache.seq_cp(0, 2, -1, -1);
            next[2] = next[0];
        }
    }
    expect_consistent(cache.pool(1));
}

// Speculative decoding feeds drafts and takes back the rejected ones: with a slack of n, the
// window pool keeps n positions more, so that after seq_rm of the last n tokens the next token
// still finds its whole window; drafts of n tokens and the token before them keep fitting.
TEST(ModelCache, WindowSlackKeepsWhatTakingBackDraftsUncovers) {
    const int window = 4, n_batch = 16, slack = 7;
    ModelCache cache(model_shapes(2), {0, window}, small_params(1024, 1, 4), n_batch);
    ASSERT_EQ(cache.n_pools(), 2);
    std::vector<Pos> pos;
    for (Pos p = 0; p < 20; ++p) pos.push_back(p);
    place(cache, std::vector<SeqId>(16, 0), std::vector<Pos>(pos.begin(), pos.begin() + 16));
    cache.end_batch();
    place(cache, std::vector<SeqId>(4, 0), std::vector<Pos>(pos.begin() + 16, pos.end()));
    cache.end_batch();
    EXPECT_EQ(positions(cache.pool(1), 0), (std::multiset<Pos>{16, 17, 18, 19}));

    cache.set_window_slack(slack);
    Pos next = 20;
    for (int step = 0; step < 100; ++step) {
        // The last token and up to `slack` drafts, then all but `keep` of them taken back.
        const int n = 1 + (step * 5) % (slack + 1);
        const int keep = 1 + (step * 3) % n;
        std::vector<Pos> batch;
        for (int i = 0; i < n; ++i) batch.push_back(next + i);
        ASSERT_NO_THROW(place(cache, std::vector<SeqId>(static_cast<size_t>(n), 0), batch)) << "step " << step;
        cache.end_batch();
        cache.seq_rm(0, next + keep, -1);
        next += keep;
        // The next token (at `next`) sees positions next - window + 1 .. next - 1.
        const std::multiset<Pos> held = positions(cache.pool(1), 0);
        for (Pos p = next - window + 1; p < next; ++p) EXPECT_EQ(held.count(p), 1u) << "step " << step << " pos " << p;
        EXPECT_LE(cache.pool(1).allocated_cells(), cache.pool(1).capacity());
        expect_consistent(cache.pool(1));
    }
    // Without the slack the same take-back loses them: after 8 tokens to 27, positions up to 23 go.
    cache.set_window_slack(0);
    cache.end_batch();
    std::vector<Pos> batch;
    for (int i = 0; i < 8; ++i) batch.push_back(next + i);
    place(cache, std::vector<SeqId>(8, 0), batch);
    cache.end_batch();
    cache.seq_rm(0, next + 1, -1);
    EXPECT_EQ(positions(cache.pool(1), 0), (std::multiset<Pos>{}));
}

TEST(ModelCache, PlaceIsAllOrNothingAcrossPools) {
    // The window pool holds 4 blocks of 4 here, the full pool 16: a batch of 20 fits only the latter.
    ModelCache cache(model_shapes(2), {0, 4}, small_params(64, 1, 4), 1);
    ASSERT_EQ(cache.n_pools(), 2);
    ASSERT_EQ(cache.pool(1).capacity(), 16);
    std::vector<SeqId> seq(20, 0);
    std::vector<Pos> pos;
    for (int i = 0; i < 20; ++i) pos.push_back(i);
    EXPECT_THROW(cache.place(seq, pos), KvCacheError);
    EXPECT_EQ(cache.pool(0).used_cells(), 0);
    EXPECT_EQ(cache.pool(1).used_cells(), 0);
}

TEST(ModelCache, SequenceOperationsApplyToEveryPool) {
    ModelCache cache(model_shapes(2), {0, 8}, small_params(256, 3, 4), 8);
    std::vector<SeqId> seq(6, 0);
    place(cache, seq, {0, 1, 2, 3, 4, 5});
    cache.seq_cp(0, 1, -1, -1);
    cache.seq_cp(0, 2, -1, -1);
    for (int p = 0; p < 2; ++p) EXPECT_EQ(positions(cache.pool(p), 1), (std::multiset<Pos>{0, 1, 2, 3, 4, 5}));
    cache.seq_rm(1, 4, -1);
    cache.seq_add(2, 2, -1, 10);
    EXPECT_TRUE(cache.has_k_shift());
    for (int p = 0; p < 2; ++p) {
        const KvCache& pool = cache.pool(p);
        EXPECT_EQ(positions(pool, 1), (std::multiset<Pos>{0, 1, 12, 13})) << p;  // seq 2's add moved shared cells
        expect_consistent(pool);
    }
    cache.seq_div(0, -1, -1, 2);
    for (int p = 0; p < 2; ++p) EXPECT_EQ(positions(cache.pool(p), 0), (std::multiset<Pos>{0, 0, 6, 6, 7, 7})) << p;
    cache.clear_k_shift();
    EXPECT_FALSE(cache.has_k_shift());
    cache.seq_keep(2);
    for (int p = 0; p < 2; ++p) EXPECT_EQ(cache.pool(p).seq_n_cells(0), 0);
    cache.clear();
    for (int p = 0; p < 2; ++p) EXPECT_EQ(cache.pool(p).used_cells(), 0);
    EXPECT_EQ(cache.seq_pos_max(2), -1);
}

TEST(ModelCache, RejectsBadArguments) {
    auto message = [](const std::vector<int>& windows, CacheParams p, int n_batch) {
        try {
            ModelCache cache(model_shapes(2), windows, p, n_batch);
        } catch (const std::invalid_argument& e) {
            return std::string(e.what());
        }
        return std::string("(no exception)");
    };
    EXPECT_NE(message({0}, small_params(64), 8).find("2 layer shapes but 1 layer windows"), std::string::npos);
    EXPECT_NE(message({0, 0}, small_params(64), 0).find("n_batch 0"), std::string::npos);
    EXPECT_NE(message({0, -3}, small_params(64), 8).find("window -3"), std::string::npos);
    EXPECT_NE(message({0, 4}, small_params(0), 8).find("n_cells 0"), std::string::npos);
    EXPECT_NE(message({0, 4}, small_params(64, 65), 8).find("n_seq_max 65"), std::string::npos);
    EXPECT_THROW(ModelCache({}, {}, small_params(64), 8), std::invalid_argument);
}

}  // namespace
}  // namespace fitllm::kv
