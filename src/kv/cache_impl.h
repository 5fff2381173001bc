#pragma once
// kv::KvCache's insides (kv/cache.h), shared by its two source files: kv/cache.cpp (cells, blocks,
// sequences, spill: the bookkeeping) and kv/cache_rows.cpp (K/V rows in and out: the coding of
// each head, the K transform's calibration, the RoPE shift). Nothing else includes this.
#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "kv/cache.h"
#include "kv/key_transform.h"
#include "kv/spill_file.h"
#include "memory/pool.h"
#include "quant/ggml_type.h"

namespace fitllm::kv::cache_detail {

using quant::GgmlType;

constexpr Pos kFreePos = -1;
constexpr int kShiftChunk = 32;  // rows handed to apply_k_shift's rerotate per call

inline uint64_t seq_bit(SeqId seq) {
    return uint64_t{1} << seq;
}

inline bool is_quantized(GgmlType type) {
    return quant::traits(type).is_quantized;
}

// K types that get the query-aware transform: 4 and 5 bits. 8-bit keys are at the cache's noise
// floor with the diagonal kind (README "KV cache"), which needs no fit, no queries and no triangles.
inline bool keys_fit_queries(GgmlType type) {
    return is_quantized(type) && type != GgmlType::Q8_0;
}

// Zeroed memory from calloc: a large block comes straight from the kernel, so its pages cost
// nothing until a cell is written, and a never-written cell reads as zeros in every type.
struct FreeBytes {
    void operator()(std::byte* p) const { std::free(p); }
};
using Bytes = std::unique_ptr<std::byte, FreeBytes>;

struct LayerStorage {
    LayerShape shape;
    size_t k_head_bytes = 0, v_head_bytes = 0, k_row_bytes = 0, v_row_bytes = 0;
    // [capacity][n_head_kv][head], cell c at c * row_bytes: in k_memory / v_memory, or for a
    // streamed layer in the spill file at k_offset / v_offset.
    std::byte* k = nullptr;
    std::byte* v = nullptr;
    Bytes k_memory, v_memory;
    bool streamed = false;
    uint64_t k_offset = 0, v_offset = 0;
    std::vector<float> scratch;    // KeyTransform::kScratchRows heads for store() (layers may store in parallel)
    KeyTransform key;              // how K is shaped (kv/key_transform.h), when shape_keys
    bool key_fitted = false;       // calibrate_keys() has fitted `key` (or, with external storage, given up)
    bool stored_unshaped = false;  // K was stored before `key` was fitted
    bool key_given = false;        // `key` came from set_key_transform(), not from a fit
    // calibrate_keys()'s rows until the fit (at most KvCache::kMinKeyRows - 1): K and Q after RoPE,
    // their positions, and the cell store() put each K in (-1: not yet, or written over since).
    struct Staged {
        std::vector<float> k, q;
        std::vector<int32_t> pos, cell;
        bool all_q = true;  // every row came with its Q
        int pending = 0;    // rows of the last calibrate_keys() whose cells the next store() records
        int64_t rows() const { return static_cast<int64_t>(pos.size()); }
        void forget_cell(int32_t c) { std::replace(cell.begin(), cell.end(), c, int32_t{-1}); }
    } staged;
};

}  // namespace fitllm::kv::cache_detail

namespace fitllm::kv {

struct KvCache::Impl {
    CacheParams params;
    int block_size = 0;
    int capacity = 0;
    int n_blocks = 0;
    bool rotated = false;
    bool shape_keys = false;  // K quantized and params.rotate: each layer's KeyTransform applies
    bool limit_keys = false;  // limit_key_transform(): the diagonal kind only
    int n_positions = 0;      // params.n_positions, or n_cells
    std::vector<cache_detail::LayerStorage> layers;

    // Memory and spill (kv/cache.h, "Memory" and "Spill").
    memory::Charge charge;
    size_t memory_bytes = 0;  // what charge holds (also without a pool)
    std::unique_ptr<SpillFile> spill;
    int n_pinned = 0;       // layers [0, n_pinned) in memory; the others streamed
    int window = 0;         // streamed layers in memory at once
    int32_t high_cell = 0;  // 1 + the highest cell ever placed: the rows worth reading or writing back
    // Per layer, for streamed ones: its pages may be in memory (written, read ahead), read-ahead
    // asked for since its last release, and will_attend's wanted set (kept here, so it allocates nothing).
    std::vector<uint8_t> in_memory, prefetched, wanted;

    // Cells: position (-1 when free), the sequences using it, the RoPE shift K still needs.
    std::vector<Pos> pos;
    std::vector<uint64_t> seqs;
    std::vector<Pos> shift;
    bool has_shift = false;
    int n_used = 0;
    std::vector<int> seq_cells;  // [n_seq_max]: cells holding each sequence

    // Blocks: the tables holding each block (one bit per sequence; the reference count is the
    // number of bits), the used cells in it, and the tables themselves. A block no table holds is
    // free, and then all its cells are. Invariant: a block is in a sequence's table exactly when
    // one of its cells holds the sequence (between the steps of one operation).
    std::vector<uint64_t> holders;
    std::vector<int32_t> used_in_block;
    std::vector<std::vector<int32_t>> tables;  // capacity n_blocks each: never reallocates
    int n_free_blocks = 0;
    int ring_next = 0;  // where the search for a free block starts: after the last one handed out

    // Bumped by every public change of the bookkeeping (KvCache::generation()), and the copies on
    // write of the last place() (reserved: at most one block per sequence).
    uint64_t generation = 0;
    std::vector<CellCopy> cell_copies;
    void changed() {
        ++generation;
        cell_copies.clear();
    }

    // apply_k_shift's rows, read back to floats, kShiftChunk at a time.
    std::vector<float> shift_rows;
    std::array<int32_t, cache_detail::kShiftChunk> shift_cells{}, shift_deltas{};

    Impl(std::vector<LayerShape> shapes, const CacheParams& p);

    // --- Checks ---
    static void validate(const std::vector<LayerShape>& shapes, const CacheParams& p);
    void check_seq(SeqId seq, const char* what, bool allow_all = false) const;
    void check_layer(int layer, const char* what) const;
    void check_cell(int32_t cell, const char* what) const;
    void check_storage(const char* what) const;

    // --- Cells ---
    int block_of(int32_t cell) const { return cell / block_size; }
    int32_t first_cell(int block) const { return block * block_size; }
    bool cell_free(int32_t cell) const { return seqs[static_cast<size_t>(cell)] == 0; }
    bool cell_has(int32_t cell, SeqId seq) const {
        return (seqs[static_cast<size_t>(cell)] & cache_detail::seq_bit(seq)) != 0;
    }
    void occupy_cell(int32_t cell, SeqId seq, Pos p);
    void add_seq_to_cell(int32_t cell, SeqId seq);
    void remove_seq_from_cell(int32_t cell, SeqId seq);
    void free_cell(int32_t cell);
    void keep_only(int32_t cell, SeqId seq);
    void release_cell(int32_t cell);
    void copy_cell_data(int32_t from, int32_t to);

    // --- Blocks and tables ---
    int ref_count(int block) const { return std::popcount(holders[static_cast<size_t>(block)]); }
    bool block_free(int block) const { return holders[static_cast<size_t>(block)] == 0; }
    bool block_has_seq(int block, SeqId seq) const;
    int seq_cells_in_block(int block, SeqId seq) const;
    void hold_block(SeqId seq, int block);
    void release_blocks_without(SeqId seq);
    void release_blocks_without_each(uint64_t seq_mask);
    int find_free_run(int n) const;
    int next_free_block() const;
    void acquire_blocks(SeqId seq, int n);

    // --- Placing ---
    struct SeqPlan {
        int n_tokens = 0;
        bool copy_last = false;  // the last block is shared: copy it first
        int room = 0;            // free cells this sequence may fill in its last block (after the copy)
        int new_blocks = 0;
        size_t table_index = 0;  // where the fill starts, then the fill's cursor
        int offset = 0;
    };
    using BatchPlan = std::array<SeqPlan, kMaxSequences>;
    int plan_batch(std::span<const SeqId> seq, BatchPlan& plan) const;
    void plan_sequence(SeqId seq, SeqPlan& plan) const;
    [[noreturn]] void throw_full(size_t n_tokens, int blocks_needed) const;
    void copy_last_block(SeqId seq);
    void prepare_sequence(SeqId seq, SeqPlan& plan);
    int32_t fill_next_cell(SeqId seq, Pos p, SeqPlan& plan);

    // --- Sequences ---
    template <class Fn>
    void for_seq_cells(SeqId seq, Fn&& fn);  // fn(cell) for each cell holding seq, table order
    Pos seq_pos_bound(SeqId seq, bool max) const;
    void shift_cell(int32_t cell, Pos new_pos);
    void clear();

    size_t bytes() const;
    // After a layer's K transform is fitted: every cell in use stores its K again, shaped (from the
    // row calibrate_keys() kept for it when the cell still holds that row, else read back unshaped).
    void store_shaped_again(int layer);

    // --- Spill ---
    int next_streamed(int layer) const;  // the first streamed layer after `layer`, cyclic
    void release_layer(int layer);
    void prefetch_layer(int layer);
    void will_attend(int layer);
};

}  // namespace fitllm::kv
