// The KV cache's bookkeeping: placing batches, blocks and tables, sharing and copy on write, the
// sequence operations, occupancy and errors.
#include "kv/cache.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv/cache_test_support.h"

namespace fitllm::kv {
namespace {

using test::blocks;
using test::expect_consistent;
using test::place;
using test::place_run;
using test::positions;
using test::shapes;
using test::small_params;
using test::snapshot;

TEST(KvCache, StartsEmptyWithCapacityRoundedToBlocks) {
    KvCache cache(shapes(2), small_params(10, 2, 4));
    EXPECT_EQ(cache.capacity(), 12);
    EXPECT_EQ(cache.n_blocks(), 3);
    EXPECT_EQ(cache.n_layer(), 2);
    EXPECT_EQ(cache.used_cells(), 0);
    EXPECT_EQ(cache.allocated_cells(), 0);
    EXPECT_EQ(cache.free_cells(), 12);
    EXPECT_EQ(cache.seq_pos_min(0), -1);
    EXPECT_EQ(cache.seq_pos_max(1), -1);
    EXPECT_TRUE(cache.seq_blocks(0).empty());
    for (int32_t c = 0; c < 12; ++c) {
        EXPECT_EQ(cache.cell_pos(c), -1);
        EXPECT_EQ(cache.cell_seqs(c), 0u);
    }
    EXPECT_FALSE(cache.rotated());  // f16
    EXPECT_GE(cache.bytes(), size_t{2} * 12 * 2 * (2 * 32 * 2));
}

TEST(KvCache, PlaceFillsBlocksInOrder) {
    KvCache cache(shapes(1), small_params(16, 1, 4));
    const auto cells = place_run(cache, 0, 0, 10);
    EXPECT_EQ(cells, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
    EXPECT_EQ(blocks(cache, 0), (std::vector<int32_t>{0, 1, 2}));
    for (int32_t c = 0; c < 10; ++c) {
        EXPECT_EQ(cache.cell_pos(c), c);
        EXPECT_TRUE(cache.cell_has_seq(c, 0));
        EXPECT_EQ(cache.cell_seqs(c), 1u);
    }
    EXPECT_EQ(cache.cell_pos(10), -1);
    EXPECT_EQ(cache.used_cells(), 10);
    EXPECT_EQ(cache.allocated_cells(), 12);  // 2 cells of waste in the last block
    EXPECT_EQ(cache.free_cells(), 6);
    EXPECT_EQ(cache.seq_pos_min(0), 0);
    EXPECT_EQ(cache.seq_pos_max(0), 9);
    EXPECT_EQ(cache.seq_n_cells(0), 10);
    expect_consistent(cache);
}

TEST(KvCache, NextBatchFillsTheLastBlockFirst) {
    KvCache cache(shapes(1), small_params(16, 1, 4));
    place_run(cache, 0, 0, 2);
    EXPECT_EQ(place_run(cache, 0, 2, 3), (std::vector<int32_t>{2, 3, 4}));
    EXPECT_EQ(place_run(cache, 0, 5, 1), (std::vector<int32_t>{5}));
    EXPECT_EQ(blocks(cache, 0), (std::vector<int32_t>{0, 1}));
    expect_consistent(cache);
}

TEST(KvCache, SequencesGetBlocksOfTheirOwn) {
    KvCache cache(shapes(1), small_params(32, 3, 4));
    const auto cells = place(cache, {0, 1, 0, 1, 2}, {0, 0, 1, 1, 0});
    EXPECT_EQ(blocks(cache, 0), (std::vector<int32_t>{0}));
    EXPECT_EQ(blocks(cache, 1), (std::vector<int32_t>{1}));
    EXPECT_EQ(blocks(cache, 2), (std::vector<int32_t>{2}));
    EXPECT_EQ(cells, (std::vector<int32_t>{0, 4, 1, 5, 8}));
    // Waste: 5 cells used in 3 blocks of 4.
    EXPECT_EQ(cache.used_cells(), 5);
    EXPECT_EQ(cache.allocated_cells(), 12);
    EXPECT_EQ(cache.seq_n_cells(1), 2);
    EXPECT_FALSE(cache.cell_has_seq(4, 0));
    EXPECT_TRUE(cache.cell_has_seq(4, 1));
    expect_consistent(cache);
}

TEST(KvCache, PrefersARunOfContiguousFreeBlocks) {
    KvCache cache(shapes(1), small_params(32, 8, 4));  // 8 blocks
    for (SeqId s = 0; s < 8; ++s) place_run(cache, s, 0, 4);
    for (SeqId s = 0; s < 8; ++s) EXPECT_EQ(blocks(cache, s), (std::vector<int32_t>{s}));
    cache.seq_rm(1, -1, -1);
    cache.seq_rm(4, -1, -1);
    cache.seq_rm(5, -1, -1);
    EXPECT_EQ(cache.allocated_cells(), 20);
    // Two blocks: the ring search from block 0 meets block 1 first, but 4-5 is a run.
    place_run(cache, 1, 0, 8);
    EXPECT_EQ(blocks(cache, 1), (std::vector<int32_t>{4, 5}));
    // One block: the only free one.
    place_run(cache, 4, 0, 1);
    EXPECT_EQ(blocks(cache, 4), (std::vector<int32_t>{1}));
    expect_consistent(cache);
}

TEST(KvCache, FallsBackToScatteredBlocks) {
    KvCache cache(shapes(1), small_params(16, 4, 4));  // 4 blocks
    for (SeqId s = 0; s < 4; ++s) place_run(cache, s, 0, 4);
    cache.seq_rm(1, -1, -1);
    cache.seq_rm(3, -1, -1);
    place_run(cache, 1, 0, 8);  // no two free blocks in a row
    EXPECT_EQ(blocks(cache, 1), (std::vector<int32_t>{1, 3}));
    EXPECT_EQ(cache.free_cells(), 0);
    expect_consistent(cache);
}

TEST(KvCache, ReusesFreedBlocksRingFashion) {
    KvCache cache(shapes(1), small_params(16, 2, 4));  // 4 blocks
    place_run(cache, 0, 0, 4);
    EXPECT_EQ(blocks(cache, 0), (std::vector<int32_t>{0}));
    cache.seq_rm(0, -1, -1);
    EXPECT_EQ(cache.allocated_cells(), 0);
    // Block 0 is free again, but the search starts after the last block handed out.
    place_run(cache, 1, 0, 4);
    EXPECT_EQ(blocks(cache, 1), (std::vector<int32_t>{1}));
    place_run(cache, 1, 4, 8);
    EXPECT_EQ(blocks(cache, 1), (std::vector<int32_t>{1, 2, 3}));
    place_run(cache, 1, 12, 1);  // wraps around to block 0
    EXPECT_EQ(blocks(cache, 1), (std::vector<int32_t>{1, 2, 3, 0}));
    EXPECT_EQ(cache.cell_pos(0), 12);
    expect_consistent(cache);
}

TEST(KvCache, FullCacheThrowsAndChangesNothing) {
    KvCache cache(shapes(1), small_params(16, 2, 4));
    place_run(cache, 0, 0, 6);
    place_run(cache, 1, 0, 3);
    const auto before = snapshot(cache);
    // 7 cells are free, but seq 1 fits 1 in its block and needs 2 new blocks for 7 more: 1 is free.
    const std::string message = fitllm::test::thrown_message([&] { place_run(cache, 1, 3, 8); });
    EXPECT_NE(message.find("8 tokens asked"), std::string::npos) << message;
    EXPECT_NE(message.find("7 cells free"), std::string::npos) << message;
    EXPECT_NE(message.find("of 16"), std::string::npos) << message;
    EXPECT_THROW(place_run(cache, 1, 3, 8), KvCacheError);
    EXPECT_TRUE(snapshot(cache) == before);
    // All or nothing across sequences: seq 0's tokens would fit alone, seq 1's do not.
    EXPECT_THROW(place(cache, {0, 1, 1, 1, 1, 1, 1}, {6, 3, 4, 5, 6, 7, 8}), KvCacheError);
    EXPECT_TRUE(snapshot(cache) == before);
    // What fits still fits.
    place_run(cache, 1, 3, 5);
    EXPECT_EQ(cache.used_cells(), 14);
    expect_consistent(cache);
}

TEST(KvCache, CheckRoomThrowsWhatPlaceWould) {
    KvCache cache(shapes(1), small_params(8, 1, 4));
    const std::vector<SeqId> nine(9, 0), eight(8, 0);
    EXPECT_THROW(cache.check_room(nine), KvCacheError);
    EXPECT_NO_THROW(cache.check_room(eight));
    EXPECT_EQ(cache.used_cells(), 0);
}

TEST(KvCache, PlaceRejectsBadSequencesAndSizes) {
    KvCache cache(shapes(1), small_params(16, 2, 4));
    const std::string message = fitllm::test::thrown_message([&] { place(cache, {0, 2}, {0, 0}); });
    EXPECT_NE(message.find("sequence 2 out of range"), std::string::npos) << message;
    EXPECT_THROW(place(cache, {-1}, {0}), KvCacheError);
    EXPECT_EQ(cache.used_cells(), 0);
    std::vector<SeqId> seq{0, 0};
    std::vector<Pos> pos{0};
    std::vector<int32_t> cells(2);
    EXPECT_THROW(cache.place(seq, pos, cells), std::invalid_argument);
}

TEST(KvCache, SeqRmRemovesARangeAndFreesEmptyBlocks) {
    KvCache cache(shapes(1), small_params(16, 2, 4));
    place_run(cache, 0, 0, 10);
    cache.seq_rm(0, 2, 6);  // cells 2..5: block 0 keeps 0-1, block 1 keeps 6-7
    EXPECT_EQ(positions(cache, 0), (std::multiset<Pos>{0, 1, 6, 7, 8, 9}));
    EXPECT_EQ(blocks(cache, 0), (std::vector<int32_t>{0, 1, 2}));
    EXPECT_EQ(cache.used_cells(), 6);
    EXPECT_EQ(cache.allocated_cells(), 12);
    cache.seq_rm(0, 6, 8);  // block 1 is empty: leaves the table, back to the free list
    EXPECT_EQ(blocks(cache, 0), (std::vector<int32_t>{0, 2}));
    EXPECT_EQ(cache.allocated_cells(), 8);
    cache.seq_rm(0, 8, -1);  // p1 < 0: to the end
    EXPECT_EQ(positions(cache, 0), (std::multiset<Pos>{0, 1}));
    EXPECT_EQ(cache.seq_pos_max(0), 1);
    cache.seq_rm(0, -1, -1);
    EXPECT_EQ(cache.used_cells(), 0);
    EXPECT_EQ(cache.allocated_cells(), 0);
    EXPECT_TRUE(cache.seq_blocks(0).empty());
    expect_consistent(cache);
}

TEST(KvCache, SeqRmOfEverySequence) {
    KvCache cache(shapes(1), small_params(32, 3, 4));
    place_run(cache, 0, 0, 6);
    place_run(cache, 1, 0, 6);
    cache.seq_cp(0, 2, 0, 3);
    cache.seq_rm(-1, 2, 5);
    EXPECT_EQ(positions(cache, 0), (std::multiset<Pos>{0, 1, 5}));
    EXPECT_EQ(positions(cache, 1), (std::multiset<Pos>{0, 1, 5}));
    EXPECT_EQ(positions(cache, 2), (std::multiset<Pos>{0, 1}));
    cache.seq_rm(-1, -1, -1);
    EXPECT_EQ(cache.used_cells(), 0);
    EXPECT_EQ(cache.allocated_cells(), 0);
    expect_consistent(cache);
}

TEST(KvCache, SeqCpSharesCellsWithoutCopying) {
    KvCache cache(shapes(1), small_params(32, 3, 4));
    place_run(cache, 0, 0, 6);
    const int allocated = cache.allocated_cells();
    cache.seq_cp(0, 1, -1, -1);
    EXPECT_EQ(cache.used_cells(), 6);
    EXPECT_EQ(cache.allocated_cells(), allocated);
    EXPECT_EQ(blocks(cache, 1), blocks(cache, 0));
    for (int32_t c = 0; c < 6; ++c) EXPECT_EQ(cache.cell_seqs(c), 0b11u);
    EXPECT_EQ(cache.seq_pos_max(1), 5);
    EXPECT_EQ(cache.seq_n_cells(1), 6);
    // A range shares only the blocks with cells in it.
    cache.seq_cp(0, 2, 4, 6);
    EXPECT_EQ(blocks(cache, 2), (std::vector<int32_t>{1}));
    EXPECT_EQ(positions(cache, 2), (std::multiset<Pos>{4, 5}));
    cache.seq_cp(0, 0, -1, -1);  // to itself: nothing
    EXPECT_EQ(cache.seq_n_cells(0), 6);
    // Removing the source keeps the copy.
    cache.seq_rm(0, -1, -1);
    EXPECT_EQ(positions(cache, 1), (std::multiset<Pos>{0, 1, 2, 3, 4, 5}));
    EXPECT_EQ(cache.used_cells(), 6);
    expect_consistent(cache);
}

TEST(KvCache, PlacingIntoASharedBlockCopiesIt) {
    KvCache cache(shapes(2), small_params(32, 2, 4));
    const auto src_cells = place_run(cache, 0, 0, 6);  // blocks 0 (full) and 1 (cells 4, 5 used)
    cache.seq_cp(0, 1, -1, -1);
    const auto before = snapshot(cache);

    const auto dst_cells = place_run(cache, 1, 6, 1);
    // Block 0 is full and stays shared; block 1 has free cells, so seq 1 copies it to block 2.
    EXPECT_EQ(blocks(cache, 0), (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(blocks(cache, 1), (std::vector<int32_t>{0, 2}));
    // The copy: same offsets, seq 1 only; the new token in the first free cell after them.
    EXPECT_EQ(cache.cell_pos(8), 4);
    EXPECT_EQ(cache.cell_pos(9), 5);
    EXPECT_EQ(cache.cell_seqs(8), 0b10u);
    EXPECT_EQ(cache.cell_seqs(9), 0b10u);
    EXPECT_EQ(dst_cells, (std::vector<int32_t>{10}));
    EXPECT_EQ(cache.cell_pos(10), 6);
    // The source's cells are untouched, except that seq 1 left them.
    for (int32_t c : src_cells) EXPECT_EQ(cache.cell_pos(c), before.pos[static_cast<size_t>(c)]);
    EXPECT_EQ(cache.cell_seqs(4), 0b01u);
    EXPECT_EQ(cache.cell_seqs(5), 0b01u);
    EXPECT_EQ(cache.cell_seqs(0), 0b11u);
    EXPECT_EQ(cache.used_cells(), 9);
    EXPECT_EQ(cache.allocated_cells(), 12);
    EXPECT_EQ(positions(cache, 1), (std::multiset<Pos>{0, 1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(positions(cache, 0), (std::multiset<Pos>{0, 1, 2, 3, 4, 5}));

    // Block 1 is seq 0's alone now: it places there without a copy.
    EXPECT_EQ(place_run(cache, 0, 6, 2), (std::vector<int32_t>{6, 7}));
    EXPECT_EQ(blocks(cache, 0), (std::vector<int32_t>{0, 1}));
    expect_consistent(cache);
}

TEST(KvCache, PlacingIntoTheSourceCopiesForTheSource) {
    KvCache cache(shapes(1), small_params(32, 2, 4));
    place_run(cache, 0, 0, 5);
    cache.seq_cp(0, 1, -1, -1);
    place_run(cache, 0, 5, 1);
    EXPECT_EQ(blocks(cache, 0), (std::vector<int32_t>{0, 2}));
    EXPECT_EQ(blocks(cache, 1), (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(cache.cell_seqs(4), 0b10u);  // the original stays with seq 1
    EXPECT_EQ(cache.cell_seqs(8), 0b01u);
    EXPECT_EQ(cache.cell_pos(9), 5);
    expect_consistent(cache);
}

TEST(KvCache, OneBatchOfTwoSequencesSharingALastBlockCopiesOnce) {
    KvCache cache(shapes(1), small_params(32, 2, 4));
    place_run(cache, 0, 0, 5);
    cache.seq_cp(0, 1, -1, -1);
    const auto cells = place(cache, {0, 1}, {5, 5});
    // Seq 0 copies block 1 to block 2; seq 1 then has block 1 alone and fills it.
    EXPECT_EQ(blocks(cache, 0), (std::vector<int32_t>{0, 2}));
    EXPECT_EQ(blocks(cache, 1), (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(cells, (std::vector<int32_t>{9, 5}));
    EXPECT_EQ(cache.allocated_cells(), 12);
    expect_consistent(cache);
}

TEST(KvCache, SharingAFullBlockNeedsNoCopy) {
    KvCache cache(shapes(1), small_params(32, 2, 4));
    place_run(cache, 0, 0, 8);
    cache.seq_cp(0, 1, -1, -1);
    place(cache, {0, 1}, {8, 8});
    EXPECT_EQ(blocks(cache, 0), (std::vector<int32_t>{0, 1, 2}));
    EXPECT_EQ(blocks(cache, 1), (std::vector<int32_t>{0, 1, 3}));
    EXPECT_EQ(cache.used_cells(), 10);
    expect_consistent(cache);
}

TEST(KvCache, SeqKeepForgetsEveryOtherSequence) {
    KvCache cache(shapes(1), small_params(32, 3, 4));
    place_run(cache, 0, 0, 5);
    cache.seq_cp(0, 1, -1, -1);
    place_run(cache, 1, 5, 4);
    place_run(cache, 2, 0, 3);
    cache.seq_keep(1);
    EXPECT_TRUE(cache.seq_blocks(0).empty());
    EXPECT_TRUE(cache.seq_blocks(2).empty());
    EXPECT_EQ(cache.seq_n_cells(0), 0);
    EXPECT_EQ(positions(cache, 1), (std::multiset<Pos>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
    EXPECT_EQ(cache.used_cells(), 9);
    for (int32_t c = 0; c < cache.capacity(); ++c) EXPECT_TRUE(cache.cell_seqs(c) == 0 || cache.cell_seqs(c) == 0b10u);
    expect_consistent(cache);
}

TEST(KvCache, SeqAddMovesPositionsAndRecordsTheShift) {
    KvCache cache(shapes(1), small_params(32, 2, 4));
    place_run(cache, 0, 0, 10);
    place_run(cache, 1, 0, 3);
    EXPECT_FALSE(cache.has_k_shift());
    // Context shift: drop [1, 4), move [4, 10) back by 3.
    cache.seq_rm(0, 1, 4);
    cache.seq_add(0, 4, -1, -3);
    EXPECT_TRUE(cache.has_k_shift());
    EXPECT_EQ(positions(cache, 0), (std::multiset<Pos>{0, 1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(cache.cell_pos(0), 0);
    EXPECT_EQ(cache.cell_pos(4), 1);
    EXPECT_EQ(cache.cell_pos(9), 6);
    EXPECT_EQ(cache.seq_pos_max(0), 6);
    EXPECT_EQ(positions(cache, 1), (std::multiset<Pos>{0, 1, 2}));  // untouched
    // Tokens moved below 0 are removed.
    cache.seq_add(0, -1, 3, -2);  // positions 0, 1, 2 -> -2, -1, 0
    EXPECT_EQ(positions(cache, 0), (std::multiset<Pos>{0, 3, 4, 5, 6}));
    EXPECT_EQ(cache.seq_pos_min(0), 0);
    EXPECT_EQ(cache.cell_pos(0), -1);
    cache.seq_add(0, 0, 0, 5);    // empty range: nothing
    cache.seq_add(0, -1, -1, 0);  // no delta: nothing
    EXPECT_EQ(positions(cache, 0), (std::multiset<Pos>{0, 3, 4, 5, 6}));
    cache.clear_k_shift();
    EXPECT_FALSE(cache.has_k_shift());
    expect_consistent(cache);
}

TEST(KvCache, SeqAddMovesASharedCellForEverySequence) {
    // As llama.cpp: a cell has one position.
    KvCache cache(shapes(1), small_params(16, 2, 4));
    place_run(cache, 0, 0, 2);
    cache.seq_cp(0, 1, -1, -1);
    cache.seq_add(0, -1, -1, 10);
    EXPECT_EQ(positions(cache, 1), (std::multiset<Pos>{10, 11}));
    cache.seq_add(0, -1, -1, -11);  // 10 -> -1 is removed for both
    EXPECT_EQ(positions(cache, 1), (std::multiset<Pos>{0}));
    EXPECT_EQ(positions(cache, 0), (std::multiset<Pos>{0}));
    expect_consistent(cache);
}

TEST(KvCache, SeqDivDividesPositions) {
    KvCache cache(shapes(1), small_params(16, 1, 4));
    place_run(cache, 0, 0, 8);
    cache.seq_div(0, 4, -1, 2);  // 4..7 -> 2, 2, 3, 3
    EXPECT_EQ(positions(cache, 0), (std::multiset<Pos>{0, 1, 2, 2, 2, 3, 3, 3}));
    EXPECT_TRUE(cache.has_k_shift());
    EXPECT_THROW(cache.seq_div(0, -1, -1, 0), std::invalid_argument);
    expect_consistent(cache);
}

TEST(KvCache, ClearFreesEverything) {
    KvCache cache(shapes(1), small_params(16, 2, 4));
    place_run(cache, 0, 0, 6);
    cache.seq_cp(0, 1, -1, -1);
    cache.seq_add(1, -1, -1, 2);
    cache.clear();
    EXPECT_EQ(cache.used_cells(), 0);
    EXPECT_EQ(cache.allocated_cells(), 0);
    EXPECT_FALSE(cache.has_k_shift());
    EXPECT_TRUE(cache.seq_blocks(1).empty());
    EXPECT_EQ(place_run(cache, 0, 0, 1), (std::vector<int32_t>{0}));
    expect_consistent(cache);
}

TEST(KvCache, SequenceOperationsCheckSequenceIds) {
    KvCache cache(shapes(1), small_params(16, 2, 4));
    place_run(cache, 0, 0, 3);
    EXPECT_THROW(cache.seq_rm(2, -1, -1), KvCacheError);
    EXPECT_THROW(cache.seq_rm(-2, -1, -1), KvCacheError);
    EXPECT_NO_THROW(cache.seq_rm(-1, 5, 6));
    EXPECT_THROW(cache.seq_cp(-1, 1, -1, -1), KvCacheError);
    EXPECT_THROW(cache.seq_cp(0, 2, -1, -1), KvCacheError);
    EXPECT_THROW(cache.seq_keep(-1), KvCacheError);
    EXPECT_THROW(cache.seq_add(-1, -1, -1, 1), KvCacheError);
    EXPECT_THROW(cache.seq_div(5, -1, -1, 2), KvCacheError);
    EXPECT_THROW(cache.seq_pos_max(2), KvCacheError);
    EXPECT_THROW(cache.seq_blocks(2), KvCacheError);
    EXPECT_EQ(cache.seq_n_cells(0), 3);
}

TEST(KvCache, RejectsBadParametersNamingThem) {
    auto message = [](std::vector<LayerShape> layers, CacheParams p) {
        try {
            KvCache cache(std::move(layers), p);
        } catch (const std::invalid_argument& e) {
            return std::string(e.what());
        }
        return std::string("(no exception)");
    };
    EXPECT_NE(message(shapes(1), small_params(0)).find("n_cells 0"), std::string::npos);
    EXPECT_NE(message(shapes(1), small_params(16, 65)).find("n_seq_max 65"), std::string::npos);
    EXPECT_NE(message(shapes(1), small_params(16, 0)).find("n_seq_max 0"), std::string::npos);
    EXPECT_NE(message(shapes(1), small_params(16, 1, 0)).find("block_size 0"), std::string::npos);
    EXPECT_NE(message({}, small_params(16)).find("no layers"), std::string::npos);
    EXPECT_NE(message(shapes(1, 0), small_params(16)).find("n_head_kv 0"), std::string::npos);
    CacheParams q8 = small_params(16);
    q8.type_k = quant::GgmlType::Q8_0;
    const std::string head = message(shapes(2, 2, 48, 32), q8);
    EXPECT_NE(head.find("head size 48"), std::string::npos) << head;
    EXPECT_NE(head.find("q8_0"), std::string::npos) << head;
    EXPECT_NE(head.find("32 values"), std::string::npos) << head;
    q8.type_k = quant::GgmlType::F16;
    q8.type_v = quant::GgmlType::Q8_0;
    EXPECT_NE(message(shapes(1, 2, 32, 16), q8).find("head size 16 (V)"), std::string::npos);
    CacheParams k_quant = small_params(16);
    k_quant.type_k = quant::GgmlType::Q4_K;
    const std::string type = message(shapes(1), k_quant);
    EXPECT_NE(type.find("type_k q4_k"), std::string::npos) << type;
    EXPECT_NE(type.find("iq4_nl"), std::string::npos) << type;  // lists the accepted ones
    // 64 sequences is the most.
    EXPECT_NO_THROW(KvCache(shapes(1), small_params(16, 64)));
}

TEST(KvCache, KvTypeNames) {
    EXPECT_EQ(kv_type_from_name("q8_0"), quant::GgmlType::Q8_0);
    EXPECT_EQ(kv_type_from_name("f16"), quant::GgmlType::F16);
    EXPECT_EQ(kv_type_from_name("BF16"), quant::GgmlType::BF16);
    EXPECT_EQ(kv_type_from_name("iq4_nl"), quant::GgmlType::IQ4_NL);
    for (auto t : {quant::GgmlType::F32, quant::GgmlType::F16, quant::GgmlType::BF16, quant::GgmlType::Q8_0,
                   quant::GgmlType::Q4_0, quant::GgmlType::Q4_1, quant::GgmlType::Q5_0, quant::GgmlType::Q5_1,
                   quant::GgmlType::IQ4_NL}) {
        EXPECT_TRUE(is_kv_type(t));
    }
    EXPECT_FALSE(is_kv_type(quant::GgmlType::Q4_K));
    const std::string message = fitllm::test::thrown_message([] { kv_type_from_name("q4_k"); });
    EXPECT_NE(message.find("q4_k"), std::string::npos);
    EXPECT_NE(message.find("f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl"), std::string::npos) << message;
    EXPECT_THROW(kv_type_from_name("nonsense"), std::invalid_argument);
}

TEST(KvCache, TablesDoNotReallocate) {
    KvCache cache(shapes(1), small_params(64, 2, 4));
    place_run(cache, 0, 0, 1);
    const int32_t* table = cache.seq_blocks(0).data();
    for (Pos p = 1; p < 64; ++p) place_run(cache, 0, p, 1);
    EXPECT_EQ(cache.seq_blocks(0).data(), table);
    EXPECT_EQ(cache.seq_blocks(0).size(), 16u);
}

TEST(KvCache, WindowTrimKeepsTheLastWindowOfEachSequence) {
    CacheParams p = small_params(64, 2, 4);
    p.window = 4;
    KvCache cache(shapes(1), p);
    for (Pos pos = 0; pos < 10; ++pos) {
        place(cache, {0, 1}, {pos, pos + 100});
        cache.trim_window();
        expect_consistent(cache);
    }
    // Positions at or below max - window are gone: 6..9 stay.
    EXPECT_EQ(positions(cache, 0), (std::multiset<Pos>{6, 7, 8, 9}));
    EXPECT_EQ(positions(cache, 1), (std::multiset<Pos>{106, 107, 108, 109}));
    // Fully trimmed blocks went back to the free list: each sequence holds at most 2 blocks.
    EXPECT_LE(cache.seq_blocks(0).size(), 2u);
    EXPECT_LE(cache.allocated_cells(), 16);
    // A pool without a window keeps everything.
    KvCache full(shapes(1), small_params(64, 1, 4));
    place_run(full, 0, 0, 10);
    full.trim_window();
    EXPECT_EQ(full.used_cells(), 10);
}

TEST(KvCache, WindowTrimOfASharedPrefix) {
    CacheParams p = small_params(64, 2, 4);
    p.window = 3;
    KvCache cache(shapes(1), p);
    place_run(cache, 0, 0, 4);
    cache.seq_cp(0, 1, -1, -1);
    place_run(cache, 0, 4, 4);  // seq 0 at 7, seq 1 at 3
    cache.trim_window();
    EXPECT_EQ(positions(cache, 0), (std::multiset<Pos>{5, 6, 7}));
    EXPECT_EQ(positions(cache, 1), (std::multiset<Pos>{1, 2, 3}));
    expect_consistent(cache);
}

// Random operations against a model of each sequence's positions, checking the invariants after
// each step. Every token gets a position of its own, so a position names a cell.
TEST(KvCache, RandomOperationsKeepTheBookkeepingConsistent) {
    const int n_seq = 4;
    KvCache cache(shapes(1, 1, 32, 32), small_params(96, n_seq, 4));
    std::vector<std::set<Pos>> model(n_seq);
    Pos next = 0;
    std::mt19937 rng(7);
    auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
    for (int step = 0; step < 600; ++step) {
        const int op = pick(10);
        const SeqId s = pick(n_seq), t = pick(n_seq);
        const Pos p0 = pick(next + 1), p1 = p0 + pick(30);
        if (op < 5) {
            const int n = 1 + pick(9);
            std::vector<SeqId> seq;
            std::vector<Pos> pos;
            for (int i = 0; i < n; ++i) {
                seq.push_back(pick(2) == 0 ? s : t);
                pos.push_back(next++);
            }
            try {
                place(cache, seq, pos);
                for (size_t i = 0; i < seq.size(); ++i) model[static_cast<size_t>(seq[i])].insert(pos[i]);
            } catch (const KvCacheError&) {
                cache.seq_rm(s, -1, -1);
                model[static_cast<size_t>(s)].clear();
            }
        } else if (op < 7) {
            cache.seq_rm(s, p0, p1);
            std::erase_if(model[static_cast<size_t>(s)], [&](Pos p) { return p >= p0 && p < p1; });
        } else if (op < 9) {
            cache.seq_cp(s, t, p0, p1);
            if (s != t) {
                for (Pos p : model[static_cast<size_t>(s)]) {
                    if (p >= p0 && p < p1) model[static_cast<size_t>(t)].insert(p);
                }
            }
        } else {
            cache.seq_keep(s);
            for (SeqId q = 0; q < n_seq; ++q) {
                if (q != s) model[static_cast<size_t>(q)].clear();
            }
        }
        for (SeqId q = 0; q < n_seq; ++q) {
            const auto& expected = model[static_cast<size_t>(q)];
            ASSERT_EQ(positions(cache, q), std::multiset<Pos>(expected.begin(), expected.end())) << "step " << step;
        }
        expect_consistent(cache);
        if (::testing::Test::HasFailure()) FAIL() << "step " << step;
    }
}

}  // namespace
}  // namespace fitllm::kv
