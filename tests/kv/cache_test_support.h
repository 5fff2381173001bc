#pragma once
// Helpers for the KV cache tests: small pools, placing runs of tokens, and a consistency check of
// the bookkeeping (tables, reference counts, counters) against the cells.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "kv/cache.h"
#include "kv/spill_file.h"

namespace fitllm::kv::test {

inline std::vector<LayerShape> shapes(int n_layer, int n_head_kv = 2, int head_dim_k = 32, int head_dim_v = 32) {
    return std::vector<LayerShape>(static_cast<size_t>(n_layer), LayerShape{n_head_kv, head_dim_k, head_dim_v});
}

// An empty directory for spill files in the build tree (the system temp dir may be tmpfs, which
// spill refuses). Sets why_not when no spill file can be made there (a build tree on tmpfs, a
// full disk), for GTEST_SKIP() << why_not.
inline std::filesystem::path spill_test_dir(const std::string& name, std::string& why_not) {
    const std::filesystem::path dir = std::filesystem::path(FITLLM_BINARY_DIR) / "test-kv-spill" / name;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    try {
        SpillFile probe(dir.string(), 1 << 20);
    } catch (const SpillError& e) {
        why_not = std::string("no KV spill file can be made in the build tree: ") + e.what();
    }
    return dir;
}

inline CacheParams small_params(int n_cells, int n_seq_max = 1, int block_size = 4) {
    CacheParams p;
    p.n_cells = n_cells;
    p.n_seq_max = n_seq_max;
    p.block_size = block_size;
    return p;
}

inline std::vector<int32_t> place(KvCache& cache, const std::vector<SeqId>& seq, const std::vector<Pos>& pos) {
    std::vector<int32_t> cells(seq.size(), -7);
    cache.place(seq, pos, cells);
    return cells;
}

// n tokens of one sequence at positions first, first + 1, ...
inline std::vector<int32_t> place_run(KvCache& cache, SeqId seq, Pos first, int n) {
    std::vector<SeqId> seqs(static_cast<size_t>(n), seq);
    std::vector<Pos> pos(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = first + i;
    return place(cache, seqs, pos);
}

inline std::vector<int32_t> blocks(const KvCache& cache, SeqId seq) {
    auto b = cache.seq_blocks(seq);
    return {b.begin(), b.end()};
}

inline std::multiset<Pos> positions(const KvCache& cache, SeqId seq) {
    std::multiset<Pos> out;
    for (int32_t c = 0; c < cache.capacity(); ++c) {
        if (cache.cell_has_seq(c, seq)) out.insert(cache.cell_pos(c));
    }
    return out;
}

// Everything the cache reports, to compare before and after an operation that must change nothing.
struct Snapshot {
    std::vector<Pos> pos;
    std::vector<uint64_t> seqs;
    std::vector<std::vector<int32_t>> tables;
    int used, allocated, free;
    bool operator==(const Snapshot&) const = default;
};

inline Snapshot snapshot(const KvCache& cache) {
    Snapshot s;
    for (int32_t c = 0; c < cache.capacity(); ++c) {
        s.pos.push_back(cache.cell_pos(c));
        s.seqs.push_back(cache.cell_seqs(c));
    }
    for (SeqId q = 0; q < cache.params().n_seq_max; ++q) s.tables.push_back(blocks(cache, q));
    s.used = cache.used_cells();
    s.allocated = cache.allocated_cells();
    s.free = cache.free_cells();
    return s;
}

// The invariants: a block is in a sequence's table exactly when one of its cells holds the
// sequence (at most once); a cell is free exactly when no sequence holds it (position -1); the
// counters agree with the cells.
inline void expect_consistent(const KvCache& cache) {
    const int bs = cache.params().block_size;
    const int n_seq = cache.params().n_seq_max;
    int used = 0;
    for (int32_t c = 0; c < cache.capacity(); ++c) {
        const bool free = cache.cell_seqs(c) == 0;
        EXPECT_EQ(free, cache.cell_pos(c) == -1) << "cell " << c;
        used += free ? 0 : 1;
        EXPECT_EQ(cache.cell_positions()[static_cast<size_t>(c)], cache.cell_pos(c));
        EXPECT_EQ(cache.cell_seq_masks()[static_cast<size_t>(c)], cache.cell_seqs(c));
    }
    EXPECT_EQ(cache.used_cells(), used);
    EXPECT_EQ(cache.free_cells(), cache.capacity() - used);
    std::set<int32_t> held;
    for (SeqId s = 0; s < n_seq; ++s) {
        const auto table = blocks(cache, s);
        const std::set<int32_t> unique(table.begin(), table.end());
        EXPECT_EQ(unique.size(), table.size()) << "sequence " << s << " holds a block twice";
        int cells_of_seq = 0;
        for (int32_t b = 0; b < cache.n_blocks(); ++b) {
            int in_block = 0;
            for (int32_t c = b * bs; c < (b + 1) * bs; ++c) in_block += cache.cell_has_seq(c, s) ? 1 : 0;
            cells_of_seq += in_block;
            EXPECT_EQ(in_block > 0, unique.count(b) == 1) << "sequence " << s << ", block " << b;
        }
        EXPECT_EQ(cache.seq_n_cells(s), cells_of_seq) << "sequence " << s;
        held.insert(unique.begin(), unique.end());
    }
    EXPECT_EQ(cache.allocated_cells(), static_cast<int>(held.size()) * bs);
}

}  // namespace fitllm::kv::test
