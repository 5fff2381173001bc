#include "kv/cache.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "kv/hadamard.h"
#include "kv/key_transform.h"
#include "kv/spill_file.h"
#include "memory/pool.h"
#include "quant/dequantize.h"
#include "quant/quantize.h"
#include "util/text.h"

namespace fitllm::kv {

using quant::GgmlType;

namespace {

constexpr Pos kFreePos = -1;
constexpr int kShiftChunk = 32;  // rows handed to apply_k_shift's rerotate per call

constexpr GgmlType kKvTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,  GgmlType::Q4_0,
                                 GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::IQ4_NL};

uint64_t seq_bit(SeqId seq) {
    return uint64_t{1} << seq;
}

// "q8_0", as -ctk spells it.
std::string kv_type_name(GgmlType type) {
    std::string name(quant::type_name(static_cast<uint32_t>(type)));
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return name;
}

std::string kv_type_names() {
    std::string names;
    for (GgmlType type : kKvTypes) names += (names.empty() ? "" : ", ") + kv_type_name(type);
    return names;
}

bool is_quantized(GgmlType type) {
    return quant::traits(type).is_quantized;
}

// K types that get the query-aware transform: 4 and 5 bits. 8-bit keys are at the cache's noise
// floor with the diagonal kind (README "KV cache"), which needs no fit, no queries and no triangles.
bool keys_fit_queries(GgmlType type) {
    return is_quantized(type) && type != GgmlType::Q8_0;
}

int64_t round_up(int64_t n, int64_t multiple) {
    return (n + multiple - 1) / multiple * multiple;
}

// Zeroed memory from calloc: a large block comes straight from the kernel, so its pages cost
// nothing until a cell is written, and a never-written cell reads as zeros in every type.
struct FreeBytes {
    void operator()(std::byte* p) const { std::free(p); }
};
using Bytes = std::unique_ptr<std::byte, FreeBytes>;

Bytes zeroed_bytes(size_t n) {
    void* p = std::calloc(std::max<size_t>(n, 1), 1);
    if (p == nullptr) throw std::bad_alloc();
    return Bytes(static_cast<std::byte*>(p));
}

// [p0, p1) with llama.cpp's conventions: p0 < 0 is 0, p1 < 0 is no upper bound.
struct PosRange {
    Pos p0, p1;
    PosRange(Pos first, Pos end) : p0(first < 0 ? 0 : first), p1(end < 0 ? std::numeric_limits<Pos>::max() : end) {}
    bool empty() const { return p0 >= p1; }
    bool contains(Pos p) const { return p >= p0 && p < p1; }
};

// One head per row of `type`: shaped by `key` (K of a quantized cache, else nullptr) and rotated
// first when asked (into scratch, KeyTransform::kScratchRows * head_dim floats; the source stays as
// it is). The query-aware kind rotates and rounds by itself.
void write_heads(GgmlType type, const float* row, int n_head, int head_dim, size_t head_bytes, bool rotate,
                 const KeyTransform* key, float* scratch, std::byte* dst) {
    for (int h = 0; h < n_head; ++h) {
        const float* head = row + static_cast<int64_t>(h) * head_dim;
        if (key != nullptr && key->query_aware()) {
            key->encode(head, h, type, dst + static_cast<size_t>(h) * head_bytes, scratch);
            continue;
        }
        if (key != nullptr && key->active()) {
            key->apply(head, h, head_dim, scratch);
            head = scratch;
        }
        if (rotate) {
            if (head != scratch) std::copy(head, head + head_dim, scratch);
            hadamard_transform(scratch, head_dim);
            head = scratch;
        }
        quant::quantize_row(type, head, dst + static_cast<size_t>(h) * head_bytes, head_dim);
    }
}

void read_heads(GgmlType type, const std::byte* src, int n_head, int head_dim, size_t head_bytes, bool rotated,
                const KeyTransform* key, float* row) {
    for (int h = 0; h < n_head; ++h) {
        float* head = row + static_cast<int64_t>(h) * head_dim;
        if (key != nullptr && key->query_aware()) {
            key->decode(src + static_cast<size_t>(h) * head_bytes, h, type, head);
            continue;
        }
        quant::dequantize_row(type, src + static_cast<size_t>(h) * head_bytes, head, head_dim);
        if (rotated) hadamard_transform(head, head_dim);  // its own inverse
        if (key != nullptr) key->undo(head, h, head_dim);
    }
}

}  // namespace

bool is_kv_type(GgmlType type) {
    return std::find(std::begin(kKvTypes), std::end(kKvTypes), type) != std::end(kKvTypes);
}

GgmlType kv_type_from_name(const std::string& name) {
    const auto type = quant::type_from_name(name);
    if (!type || !is_kv_type(*type)) {
        throw std::invalid_argument("unknown KV cache type '" + name + "' (accepted: " + kv_type_names() + ")");
    }
    return *type;
}

// ---- Storage and bookkeeping ---------------------------------------------------------------------

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

size_t KvCache::key_transform_bytes(const std::vector<LayerShape>& shapes, const CacheParams& p) {
    if (!p.rotate || !is_quantized(p.type_k) || shapes.empty()) return 0;
    const bool query_aware = keys_fit_queries(p.type_k);
    size_t n = 0;
    int widest = 0;
    for (const LayerShape& shape : shapes) {
        const int n_head_q = query_aware ? (shape.n_head_q > 0 ? shape.n_head_q : shape.n_head_kv) : 0;
        const auto head = static_cast<size_t>(shape.n_head_kv) * static_cast<size_t>(shape.head_dim_k);
        const auto rows = static_cast<size_t>(kMinKeyRows - 1);  // K (and Q) kept until the fit
        n += (query_aware ? KeyTransform::bytes_for(shape.n_head_kv, shape.head_dim_k) : 3 * head * sizeof(float)) +
             rows * (static_cast<size_t>(shape.n_head_kv + n_head_q) * static_cast<size_t>(shape.head_dim_k) *
                         sizeof(float) +
                     2 * sizeof(int32_t));
        widest = std::max(widest, shape.head_dim_k);
    }
    return n + (query_aware && p.charge_key_fit ? query_aware_fit_bytes(widest) : 0);  // one fit at a time
}

// Where the bytes of a cache go, from its shapes and parameters alone (the constructor and
// bytes_for() agree by using this).
struct Layout {
    int capacity = 0, n_blocks = 0;
    std::vector<size_t> k_row_bytes, v_row_bytes;  // per layer
    size_t bookkeeping = 0;                        // cells, blocks, tables, the K transforms
    size_t kv_storage = 0;                         // K and V of every layer
    // Spill (kv/cache.h, "Spill"): layers [0, n_pinned) in memory, the rest in the file, at most
    // `window` of those in memory at once.
    bool spill = false;
    int n_pinned = 0, window = 0;
    size_t largest_layer = 0;
    uint64_t file_bytes = 0;

    size_t layer_bytes(size_t il) const { return (k_row_bytes[il] + v_row_bytes[il]) * static_cast<size_t>(capacity); }
    size_t memory_bytes() const {
        if (!spill) return bookkeeping + kv_storage;
        size_t pinned = 0;
        for (size_t il = 0; il < static_cast<size_t>(n_pinned); ++il) pinned += layer_bytes(il);
        return bookkeeping + pinned + static_cast<size_t>(window) * largest_layer;
    }
};

uint64_t round_up_u64(uint64_t n, uint64_t multiple) {
    return (n + multiple - 1) / multiple * multiple;
}

Layout make_layout(const std::vector<LayerShape>& shapes, const CacheParams& p) {
    Layout l;
    l.capacity = static_cast<int>(round_up(p.n_cells, p.block_size));
    l.n_blocks = l.capacity / p.block_size;
    const auto cells = static_cast<size_t>(l.capacity);
    const auto blocks = static_cast<size_t>(l.n_blocks);
    for (const LayerShape& shape : shapes) {
        l.k_row_bytes.push_back(*quant::row_bytes(p.type_k, static_cast<uint64_t>(shape.head_dim_k)) *
                                static_cast<size_t>(shape.n_head_kv));
        l.v_row_bytes.push_back(*quant::row_bytes(p.type_v, static_cast<uint64_t>(shape.head_dim_v)) *
                                static_cast<size_t>(shape.n_head_kv));
        l.kv_storage += l.layer_bytes(l.k_row_bytes.size() - 1);
        l.largest_layer = std::max(l.largest_layer, l.layer_bytes(l.k_row_bytes.size() - 1));
    }
    l.bookkeeping = cells * (sizeof(Pos) * 2 + sizeof(uint64_t)) + blocks * (sizeof(uint64_t) + sizeof(int32_t)) +
                    static_cast<size_t>(p.n_seq_max) * blocks * sizeof(int32_t);
    l.bookkeeping += KvCache::key_transform_bytes(shapes, p);

    l.n_pinned = static_cast<int>(shapes.size());
    if (p.spill_dir.empty() || p.resident_limit == 0 || p.resident_limit >= l.kv_storage || p.external_storage) {
        return l;
    }
    const uint64_t fit = p.resident_limit / l.largest_layer;  // whole layers the limit holds
    if (fit == 0) {
        throw std::invalid_argument("KvCache: the KV resident limit " + util::human_bytes(p.resident_limit) +
                                    " holds no whole layer of K/V (" + util::human_bytes(l.largest_layer) + " at " +
                                    std::to_string(l.capacity) +
                                    " cells), and attention reads a whole layer at once: raise the limit, lower "
                                    "the context or quantize K/V (-ctk / -ctv)");
    }
    l.spill = true;
    l.window = fit >= 2 ? 2 : 1;
    l.n_pinned = static_cast<int>(fit) - l.window;
    const uint64_t page = SpillFile::page_size();
    for (size_t il = static_cast<size_t>(l.n_pinned); il < shapes.size(); ++il) {
        l.file_bytes += round_up_u64(l.k_row_bytes[il] * cells, page) + round_up_u64(l.v_row_bytes[il] * cells, page);
    }
    return l;
}

struct KvCache::Impl {
    CacheParams params;
    int block_size = 0;
    int capacity = 0;
    int n_blocks = 0;
    bool rotated = false;
    bool shape_keys = false;  // K quantized and params.rotate: each layer's KeyTransform applies
    bool limit_keys = false;  // limit_key_transform(): the diagonal kind only
    int n_positions = 0;      // params.n_positions, or n_cells
    std::vector<LayerStorage> layers;

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
    std::array<int32_t, kShiftChunk> shift_cells{}, shift_deltas{};

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
    bool cell_has(int32_t cell, SeqId seq) const { return (seqs[static_cast<size_t>(cell)] & seq_bit(seq)) != 0; }
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

KvCache::Impl::Impl(std::vector<LayerShape> shapes, const CacheParams& p) : params(p) {
    validate(shapes, p);
    const Layout layout = make_layout(shapes, p);
    block_size = p.block_size;
    capacity = layout.capacity;
    n_blocks = layout.n_blocks;
    memory_bytes = layout.memory_bytes();
    if (p.pool != nullptr) {
        charge = memory::Charge(*p.pool, memory_bytes,
                                "KV cache (" + std::to_string(capacity) + " cells x " + std::to_string(shapes.size()) +
                                    " layers, K " + kv_type_name(p.type_k) + ", V " + kv_type_name(p.type_v) +
                                    (layout.spill ? ", spilling to " + p.spill_dir : std::string()) + ")");
    }
    n_pinned = layout.n_pinned;
    window = layout.window;
    if (layout.spill) spill = std::make_unique<SpillFile>(p.spill_dir, layout.file_bytes);

    const bool quantized = is_quantized(p.type_k) || is_quantized(p.type_v);
    const bool power_of_two_heads = std::all_of(shapes.begin(), shapes.end(), [](const LayerShape& s) {
        return is_power_of_two(s.head_dim_k) && is_power_of_two(s.head_dim_v);
    });
    rotated = p.rotate && quantized && power_of_two_heads;
    shape_keys = p.rotate && is_quantized(p.type_k);
    limit_keys = !keys_fit_queries(p.type_k);
    n_positions = p.n_positions > 0 ? p.n_positions : p.n_cells;

    size_t max_k_row = 0;
    uint64_t file_offset = 0;
    layers.reserve(shapes.size());
    for (const LayerShape& shape : shapes) {
        LayerStorage& layer = layers.emplace_back();
        layer.shape = shape;
        layer.k_head_bytes = *quant::row_bytes(p.type_k, static_cast<uint64_t>(shape.head_dim_k));
        layer.v_head_bytes = *quant::row_bytes(p.type_v, static_cast<uint64_t>(shape.head_dim_v));
        layer.k_row_bytes = layer.k_head_bytes * static_cast<size_t>(shape.n_head_kv);
        layer.v_row_bytes = layer.v_head_bytes * static_cast<size_t>(shape.n_head_kv);
        const size_t k_bytes = layer.k_row_bytes * static_cast<size_t>(capacity);
        const size_t v_bytes = layer.v_row_bytes * static_cast<size_t>(capacity);
        layer.streamed = spill != nullptr && static_cast<int>(layers.size()) > n_pinned;
        if (p.external_storage) {
            // The device holds the K/V (CacheParams::external_storage): nothing here.
        } else if (layer.streamed) {
            // Page-aligned regions, so releasing one never touches another's pages.
            layer.k_offset = file_offset;
            layer.v_offset = file_offset + round_up_u64(k_bytes, SpillFile::page_size());
            file_offset = layer.v_offset + round_up_u64(v_bytes, SpillFile::page_size());
            layer.k = spill->data() + layer.k_offset;
            layer.v = spill->data() + layer.v_offset;
        } else {
            layer.k_memory = zeroed_bytes(k_bytes);
            layer.v_memory = zeroed_bytes(v_bytes);
            layer.k = layer.k_memory.get();
            layer.v = layer.v_memory.get();
        }
        layer.scratch.assign(static_cast<size_t>(KeyTransform::kScratchRows) *
                                 static_cast<size_t>(std::max(shape.head_dim_k, shape.head_dim_v)),
                             0.0f);
        if (shape_keys && !p.external_storage) {
            const int n_head_q = shape.n_head_q > 0 ? shape.n_head_q : shape.n_head_kv;
            const auto rows = static_cast<size_t>(KvCache::kMinKeyRows - 1);
            layer.staged.k.reserve(rows * static_cast<size_t>(shape.n_head_kv) * static_cast<size_t>(shape.head_dim_k));
            layer.staged.q.reserve(rows * static_cast<size_t>(n_head_q) * static_cast<size_t>(shape.head_dim_k));
            layer.staged.pos.reserve(rows);
            layer.staged.cell.reserve(rows);
        }
        max_k_row = std::max(max_k_row, static_cast<size_t>(shape.n_head_kv) * static_cast<size_t>(shape.head_dim_k));
    }
    shift_rows.assign(max_k_row * kShiftChunk, 0.0f);
    in_memory.assign(layers.size(), 0);
    prefetched.assign(layers.size(), 0);
    wanted.assign(layers.size(), 0);

    pos.assign(static_cast<size_t>(capacity), kFreePos);
    seqs.assign(static_cast<size_t>(capacity), 0);
    shift.assign(static_cast<size_t>(capacity), 0);
    seq_cells.assign(static_cast<size_t>(p.n_seq_max), 0);
    holders.assign(static_cast<size_t>(n_blocks), 0);
    used_in_block.assign(static_cast<size_t>(n_blocks), 0);
    tables.resize(static_cast<size_t>(p.n_seq_max));
    for (auto& table : tables) table.reserve(static_cast<size_t>(n_blocks));
    n_free_blocks = n_blocks;
    cell_copies.reserve(static_cast<size_t>(p.n_seq_max) * static_cast<size_t>(block_size));
}

void KvCache::Impl::validate(const std::vector<LayerShape>& shapes, const CacheParams& p) {
    auto fail = [](const std::string& what) { throw std::invalid_argument("KvCache: " + what); };
    if (shapes.empty()) fail("no layers");
    if (p.n_cells < 1) fail("n_cells " + std::to_string(p.n_cells) + " (the context size) must be at least 1");
    if (p.n_seq_max < 1 || p.n_seq_max > kMaxSequences) {
        fail("n_seq_max " + std::to_string(p.n_seq_max) + " outside 1.." + std::to_string(kMaxSequences));
    }
    if (p.block_size < 1) fail("block_size " + std::to_string(p.block_size) + " must be at least 1");
    if (p.n_cells > INT_MAX - p.block_size) fail("n_cells " + std::to_string(p.n_cells) + " too large");
    if (p.window < 0) fail("window " + std::to_string(p.window) + " must not be negative");
    for (auto [type, which] : {std::pair{p.type_k, "type_k"}, std::pair{p.type_v, "type_v"}}) {
        if (!is_kv_type(type)) {
            fail(std::string(which) + " " + kv_type_name(type) +
                 " is not a KV cache type (accepted: " + kv_type_names() + ")");
        }
        if (!quant::can_quantize(type) || !quant::can_dequantize(type)) {
            fail(std::string(which) + " " + kv_type_name(type) + " is not supported by quant:: yet");
        }
    }
    for (size_t il = 0; il < shapes.size(); ++il) {
        const LayerShape& s = shapes[il];
        const std::string layer = "layer " + std::to_string(il) + ": ";
        if (s.n_head_kv < 1 || s.head_dim_k < 1 || s.head_dim_v < 1) {
            fail(layer + "n_head_kv " + std::to_string(s.n_head_kv) + ", head_dim_k " + std::to_string(s.head_dim_k) +
                 ", head_dim_v " + std::to_string(s.head_dim_v) + " must all be at least 1");
        }
        for (auto [dim, type, which] :
             {std::tuple{s.head_dim_k, p.type_k, "K"}, std::tuple{s.head_dim_v, p.type_v, "V"}}) {
            const uint32_t block = quant::traits(type).block_elements;
            if (dim % static_cast<int>(block) != 0) {
                fail(layer + "head size " + std::to_string(dim) + " (" + which + ") is not a whole number of " +
                     kv_type_name(type) + " blocks (" + std::to_string(block) + " values)");
            }
        }
    }
}

void KvCache::Impl::check_seq(SeqId seq, const char* what, bool allow_all) const {
    if (allow_all && seq == -1) return;
    if (seq < 0 || seq >= params.n_seq_max) {
        throw KvCacheError(std::string("KV cache ") + what + ": sequence " + std::to_string(seq) +
                           " out of range (0.." + std::to_string(params.n_seq_max - 1) +
                           (allow_all ? ", or -1 for all" : "") + ")");
    }
}

void KvCache::Impl::check_layer(int layer, const char* what) const {
    if (layer < 0 || layer >= static_cast<int>(layers.size())) {
        throw std::out_of_range(std::string("KvCache::") + what + ": layer " + std::to_string(layer) + " of " +
                                std::to_string(layers.size()));
    }
}

void KvCache::Impl::check_cell(int32_t cell, const char* what) const {
    if (cell < 0 || cell >= capacity) {
        throw std::out_of_range(std::string("KvCache::") + what + ": cell " + std::to_string(cell) + " of " +
                                std::to_string(capacity));
    }
}

void KvCache::Impl::check_storage(const char* what) const {
    if (params.external_storage) {
        throw std::logic_error(std::string("KvCache::") + what +
                               ": this pool's K/V live in a device's memory (CacheParams::external_storage)");
    }
}

// ---- Cells ----------------------------------------------------------------------------------------

void KvCache::Impl::occupy_cell(int32_t cell, SeqId seq, Pos p) {
    const auto c = static_cast<size_t>(cell);
    seqs[c] = seq_bit(seq);
    pos[c] = p;
    shift[c] = 0;
    high_cell = std::max(high_cell, cell + 1);
    ++used_in_block[static_cast<size_t>(block_of(cell))];
    ++n_used;
    ++seq_cells[static_cast<size_t>(seq)];
}

void KvCache::Impl::add_seq_to_cell(int32_t cell, SeqId seq) {
    if (cell_has(cell, seq)) return;
    seqs[static_cast<size_t>(cell)] |= seq_bit(seq);
    ++seq_cells[static_cast<size_t>(seq)];
}

// The cell is free once its last sequence leaves.
void KvCache::Impl::remove_seq_from_cell(int32_t cell, SeqId seq) {
    if (!cell_has(cell, seq)) return;
    seqs[static_cast<size_t>(cell)] &= ~seq_bit(seq);
    --seq_cells[static_cast<size_t>(seq)];
    if (cell_free(cell)) release_cell(cell);
}

// Every sequence leaves the cell.
void KvCache::Impl::free_cell(int32_t cell) {
    for (uint64_t m = seqs[static_cast<size_t>(cell)]; m != 0; m &= m - 1) {
        --seq_cells[static_cast<size_t>(std::countr_zero(m))];
    }
    seqs[static_cast<size_t>(cell)] = 0;
    release_cell(cell);
}

// Every sequence but seq (which the cell holds) leaves the cell.
void KvCache::Impl::keep_only(int32_t cell, SeqId seq) {
    for (uint64_t m = seqs[static_cast<size_t>(cell)] & ~seq_bit(seq); m != 0; m &= m - 1) {
        --seq_cells[static_cast<size_t>(std::countr_zero(m))];
    }
    seqs[static_cast<size_t>(cell)] = seq_bit(seq);
}

// The bookkeeping of a cell whose sequence set just became empty.
void KvCache::Impl::release_cell(int32_t cell) {
    pos[static_cast<size_t>(cell)] = kFreePos;
    shift[static_cast<size_t>(cell)] = 0;
    --used_in_block[static_cast<size_t>(block_of(cell))];
    --n_used;
}

void KvCache::Impl::copy_cell_data(int32_t from, int32_t to) {
    cell_copies.push_back({from, to});
    if (params.external_storage) return;  // the device copies its rows (cell_copies())
    for (LayerStorage& layer : layers) {
        layer.staged.forget_cell(to);
        std::memcpy(layer.k + static_cast<size_t>(to) * layer.k_row_bytes,
                    layer.k + static_cast<size_t>(from) * layer.k_row_bytes, layer.k_row_bytes);
        std::memcpy(layer.v + static_cast<size_t>(to) * layer.v_row_bytes,
                    layer.v + static_cast<size_t>(from) * layer.v_row_bytes, layer.v_row_bytes);
    }
    std::fill(in_memory.begin(), in_memory.end(), uint8_t{1});
}

// ---- Blocks and tables ----------------------------------------------------------------------------

bool KvCache::Impl::block_has_seq(int block, SeqId seq) const {
    for (int32_t c = first_cell(block); c < first_cell(block) + block_size; ++c) {
        if (cell_has(c, seq)) return true;
    }
    return false;
}

int KvCache::Impl::seq_cells_in_block(int block, SeqId seq) const {
    int n = 0;
    for (int32_t c = first_cell(block); c < first_cell(block) + block_size; ++c) n += cell_has(c, seq) ? 1 : 0;
    return n;
}

// Appends the block to the sequence's table (a free block stops being free).
void KvCache::Impl::hold_block(SeqId seq, int block) {
    uint64_t& h = holders[static_cast<size_t>(block)];
    if ((h & seq_bit(seq)) != 0) return;
    if (h == 0) --n_free_blocks;
    h |= seq_bit(seq);
    tables[static_cast<size_t>(seq)].push_back(block);
}

// Drops from the sequence's table the blocks where it has no cell left; a block no table holds
// any more returns to the free list.
void KvCache::Impl::release_blocks_without(SeqId seq) {
    auto& table = tables[static_cast<size_t>(seq)];
    auto kept = std::remove_if(table.begin(), table.end(), [&](int32_t block) {
        if (block_has_seq(block, seq)) return false;
        uint64_t& h = holders[static_cast<size_t>(block)];
        h &= ~seq_bit(seq);
        if (h == 0) ++n_free_blocks;
        return true;
    });
    table.erase(kept, table.end());
}

// release_blocks_without() for each sequence of the mask.
void KvCache::Impl::release_blocks_without_each(uint64_t seq_mask) {
    for (uint64_t m = seq_mask; m != 0; m &= m - 1) release_blocks_without(static_cast<SeqId>(std::countr_zero(m)));
}

// The first run of n free consecutive blocks in ring order from ring_next (a run does not wrap
// past the last block); -1 when there is none.
int KvCache::Impl::find_free_run(int n) const {
    int run_start = 0, run_length = 0;
    for (int i = 0; i < n_blocks; ++i) {
        const int block = (ring_next + i) % n_blocks;
        if (block == 0) run_length = 0;  // wrapped: a run restarts at block 0
        if (!block_free(block)) {
            run_length = 0;
            continue;
        }
        if (run_length == 0) run_start = block;
        if (++run_length == n) return run_start;
    }
    return -1;
}

// The first free block in ring order from ring_next; callers know there is one.
int KvCache::Impl::next_free_block() const {
    for (int i = 0; i < n_blocks; ++i) {
        const int block = (ring_next + i) % n_blocks;
        if (block_free(block)) return block;
    }
    return -1;
}

// Appends n free blocks to the sequence's table: a contiguous run when there is one, else the
// free blocks in ring order.
void KvCache::Impl::acquire_blocks(SeqId seq, int n) {
    if (n == 0) return;
    if (const int run = find_free_run(n); run >= 0) {
        for (int b = run; b < run + n; ++b) hold_block(seq, b);
        ring_next = (run + n) % n_blocks;
        return;
    }
    for (int i = 0; i < n; ++i) {
        const int block = next_free_block();
        hold_block(seq, block);
        ring_next = (block + 1) % n_blocks;
    }
}

// ---- Placing --------------------------------------------------------------------------------------

// What the sequence's tokens of this batch need: the room in its last block (whose cells it may
// fill only if no other table holds it; else it copies it first) and new blocks for the rest.
void KvCache::Impl::plan_sequence(SeqId seq, SeqPlan& plan) const {
    const auto& table = tables[static_cast<size_t>(seq)];
    plan.copy_last = false;
    plan.room = 0;
    if (!table.empty()) {
        const int last = table.back();
        const int free_in_last = block_size - used_in_block[static_cast<size_t>(last)];
        if (free_in_last > 0 && ref_count(last) > 1) {
            plan.copy_last = true;
            plan.room = block_size - seq_cells_in_block(last, seq);
        } else {
            plan.room = free_in_last;
        }
    }
    const int rest = std::max(0, plan.n_tokens - plan.room);
    plan.new_blocks = (rest + block_size - 1) / block_size + (plan.copy_last ? 1 : 0);
    plan.table_index = plan.room > 0 ? table.size() - 1 : table.size();
    plan.offset = 0;
}

// Counts each sequence's tokens and plans it; returns the free blocks the batch needs.
int KvCache::Impl::plan_batch(std::span<const SeqId> seq, BatchPlan& plan) const {
    for (SeqId s : seq) {
        check_seq(s, "place");
        ++plan[static_cast<size_t>(s)].n_tokens;
    }
    int blocks = 0;
    for (SeqId s = 0; s < params.n_seq_max; ++s) {
        SeqPlan& p = plan[static_cast<size_t>(s)];
        if (p.n_tokens == 0) continue;
        plan_sequence(s, p);
        blocks += p.new_blocks;
    }
    return blocks;
}

void KvCache::Impl::throw_full(size_t n_tokens, int blocks_needed) const {
    throw KvCacheError("KV cache full: " + std::to_string(n_tokens) + " tokens asked, " +
                       std::to_string(capacity - n_used) + " cells free (" +
                       std::to_string(n_free_blocks * block_size) + " in free blocks, " +
                       std::to_string(blocks_needed * block_size) + " needed) of " + std::to_string(capacity) +
                       " (raise the context size, -c)");
}

// Copy on write: the sequence's last block is shared, so the sequence gets a new block with a
// copy of its cells there (same offsets) and leaves the original to the other tables.
void KvCache::Impl::copy_last_block(SeqId seq) {
    auto& table = tables[static_cast<size_t>(seq)];
    const int old_block = table.back();
    const int new_block = next_free_block();
    ring_next = (new_block + 1) % n_blocks;
    --n_free_blocks;
    holders[static_cast<size_t>(new_block)] |= seq_bit(seq);
    holders[static_cast<size_t>(old_block)] &= ~seq_bit(seq);
    if (block_free(old_block)) ++n_free_blocks;  // not when called as prepare_sequence() does
    table.back() = new_block;
    for (int j = 0; j < block_size; ++j) {
        const int32_t from = first_cell(old_block) + j;
        if (!cell_has(from, seq)) continue;
        const int32_t to = first_cell(new_block) + j;
        copy_cell_data(from, to);
        occupy_cell(to, seq, pos[static_cast<size_t>(from)]);
        shift[static_cast<size_t>(to)] = shift[static_cast<size_t>(from)];
        remove_seq_from_cell(from, seq);
    }
}

// Copies the last block when the plan says so and it is still shared (another sequence of the
// batch may have copied it away already: then its room is the planned one without a copy), and
// takes the new blocks.
void KvCache::Impl::prepare_sequence(SeqId seq, SeqPlan& plan) {
    if (plan.copy_last && ref_count(tables[static_cast<size_t>(seq)].back()) > 1) copy_last_block(seq);
    acquire_blocks(seq, plan.new_blocks - (plan.copy_last ? 1 : 0));
}

// The next free cell of the sequence's fill (its last block's free cells, then its new blocks).
int32_t KvCache::Impl::fill_next_cell(SeqId seq, Pos p, SeqPlan& plan) {
    const auto& table = tables[static_cast<size_t>(seq)];
    for (; plan.table_index < table.size(); ++plan.table_index, plan.offset = 0) {
        const int block = table[plan.table_index];
        for (; plan.offset < block_size; ++plan.offset) {
            const int32_t cell = first_cell(block) + plan.offset;
            if (!cell_free(cell)) continue;
            occupy_cell(cell, seq, p);
            return cell;
        }
    }
    throw std::logic_error("KvCache::place: planned room is missing");  // unreachable
}

// ---- Sequences ------------------------------------------------------------------------------------

template <class Fn>
void KvCache::Impl::for_seq_cells(SeqId seq, Fn&& fn) {
    for (int32_t block : tables[static_cast<size_t>(seq)]) {
        for (int32_t c = first_cell(block); c < first_cell(block) + block_size; ++c) {
            if (cell_has(c, seq)) fn(c);
        }
    }
}

Pos KvCache::Impl::seq_pos_bound(SeqId seq, bool max) const {
    Pos bound = -1;
    for (int32_t block : tables[static_cast<size_t>(seq)]) {
        for (int32_t c = first_cell(block); c < first_cell(block) + block_size; ++c) {
            if (!cell_has(c, seq)) continue;
            const Pos p = pos[static_cast<size_t>(c)];
            if (bound < 0 || (max ? p > bound : p < bound)) bound = p;
        }
    }
    return bound;
}

// Moves the cell to new_pos and records the RoPE delta K still needs; a negative position
// removes the cell (from every sequence).
void KvCache::Impl::shift_cell(int32_t cell, Pos new_pos) {
    const auto c = static_cast<size_t>(cell);
    if (new_pos == pos[c]) return;
    shift[c] += new_pos - pos[c];
    pos[c] = new_pos;
    has_shift = true;
    if (new_pos < 0) free_cell(cell);
}

void KvCache::Impl::clear() {
    std::fill(pos.begin(), pos.end(), kFreePos);
    std::fill(seqs.begin(), seqs.end(), 0);
    std::fill(shift.begin(), shift.end(), 0);
    std::fill(seq_cells.begin(), seq_cells.end(), 0);
    std::fill(holders.begin(), holders.end(), 0);
    std::fill(used_in_block.begin(), used_in_block.end(), 0);
    for (auto& table : tables) table.clear();
    has_shift = false;
    n_used = 0;
    n_free_blocks = n_blocks;
    ring_next = 0;
}

size_t KvCache::Impl::bytes() const {
    return memory_bytes;
}

// ---- Spill ----------------------------------------------------------------------------------------

int KvCache::Impl::next_streamed(int layer) const {
    const int n = static_cast<int>(layers.size());
    const int next = std::max(layer + 1, n_pinned);
    return next < n ? next : n_pinned;
}

void KvCache::Impl::release_layer(int layer) {
    const auto il = static_cast<size_t>(layer);
    const LayerStorage& L = layers[il];
    const auto rows = static_cast<uint64_t>(high_cell);
    spill->release(L.k_offset, rows * L.k_row_bytes);
    spill->release(L.v_offset, rows * L.v_row_bytes);
    in_memory[il] = 0;
    prefetched[il] = 0;
}

void KvCache::Impl::prefetch_layer(int layer) {
    const auto il = static_cast<size_t>(layer);
    const LayerStorage& L = layers[il];
    const auto rows = static_cast<uint64_t>(high_cell);
    spill->prefetch(L.k_offset, rows * L.k_row_bytes);
    spill->prefetch(L.v_offset, rows * L.v_row_bytes);
    in_memory[il] = 1;
    prefetched[il] = 1;
}

void KvCache::Impl::will_attend(int layer) {
    if (!spill) return;
    // Wanted in memory: `layer` when streamed, then the streamed layers after it, `window` in all
    // (there are always more streamed layers than that, so none comes round twice).
    std::fill(wanted.begin(), wanted.end(), uint8_t{0});
    int l = layers[static_cast<size_t>(layer)].streamed ? layer : next_streamed(layer);
    for (int i = 0; i < window; ++i, l = next_streamed(l)) wanted[static_cast<size_t>(l)] = 1;
    // Out first, then in: memory goes down before it goes up.
    for (int i = n_pinned; i < static_cast<int>(layers.size()); ++i) {
        const auto il = static_cast<size_t>(i);
        if (!wanted[il] && in_memory[il]) release_layer(i);
    }
    for (int i = n_pinned; i < static_cast<int>(layers.size()); ++i) {
        const auto il = static_cast<size_t>(i);
        if (wanted[il] && !prefetched[il]) prefetch_layer(i);
    }
}

// ---- KvCache --------------------------------------------------------------------------------------

KvCache::KvCache(std::vector<LayerShape> layers, CacheParams params)
    : impl_(std::make_unique<Impl>(std::move(layers), params)) {}

KvCache::KvCache(KvCache&&) noexcept = default;
KvCache& KvCache::operator=(KvCache&&) noexcept = default;
KvCache::~KvCache() = default;

const CacheParams& KvCache::params() const {
    return impl_->params;
}
int KvCache::n_layer() const {
    return static_cast<int>(impl_->layers.size());
}
int KvCache::capacity() const {
    return impl_->capacity;
}
int KvCache::n_blocks() const {
    return impl_->n_blocks;
}
size_t KvCache::bytes() const {
    return impl_->bytes();
}
size_t KvCache::bytes_for(const std::vector<LayerShape>& layers, const CacheParams& params) {
    Impl::validate(layers, params);
    return make_layout(layers, params).memory_bytes();
}
bool KvCache::spilled() const {
    return impl_->spill != nullptr;
}
uint64_t KvCache::spill_file_bytes() const {
    return impl_->spill ? impl_->spill->size() : 0;
}
int KvCache::pinned_layers() const {
    return impl_->n_pinned;
}
void KvCache::will_attend(int layer) const {
    impl_->check_layer(layer, "will_attend");
    impl_->will_attend(layer);
}
bool KvCache::rotated() const {
    return impl_->rotated;
}
bool KvCache::shapes_keys() const {
    return impl_->shape_keys;
}
bool KvCache::holds_kv() const {
    return !impl_->params.external_storage;
}
uint64_t KvCache::generation() const {
    return impl_->generation;
}
std::span<const KvCache::CellCopy> KvCache::cell_copies() const {
    return impl_->cell_copies;
}
std::span<const Pos> KvCache::cell_shifts() const {
    return impl_->shift;
}

bool KvCache::needs_key_calibration(int layer) const {
    const Impl& m = *impl_;
    m.check_layer(layer, "needs_key_calibration");
    return m.shape_keys && !m.layers[static_cast<size_t>(layer)].key_fitted;
}

void KvCache::limit_key_transform() {
    impl_->limit_keys = true;
}

void KvCache::calibrate_keys(int layer, const KeySample& sample) {
    Impl& m = *impl_;
    m.check_layer(layer, "calibrate_keys");
    LayerStorage& L = m.layers[static_cast<size_t>(layer)];
    if (!m.shape_keys || L.key_fitted || sample.n_rows <= 0) return;
    const LayerShape& s = L.shape;
    if (m.params.external_storage) {
        // The device stores K itself, shaped from its first batch on: fit from that batch or never.
        L.key_fitted = true;
        if (sample.n_rows >= kMinKeyRows) L.key.calibrate_diagonal(sample.k, sample.n_rows, s.n_head_kv, s.head_dim_k);
        return;
    }
    const int n_head_q = sample.q != nullptr ? sample.n_head_q : 0;
    const int64_t k_row = int64_t{s.n_head_kv} * s.head_dim_k;
    const int64_t q_row = int64_t{n_head_q} * s.head_dim_k;
    LayerStorage::Staged& st = L.staged;
    const bool with_q = !m.limit_keys && st.all_q && sample.q != nullptr &&
                        (st.rows() == 0 || st.q.size() == static_cast<size_t>(st.rows() * q_row));
    const int64_t n = st.rows() + sample.n_rows;
    if (n < kMinKeyRows) {  // too few rows yet: keep them (store() records their cells)
        st.k.insert(st.k.end(), sample.k, sample.k + sample.n_rows * k_row);
        if (with_q) st.q.insert(st.q.end(), sample.q, sample.q + sample.n_rows * q_row);
        st.all_q = with_q;
        if (sample.pos != nullptr) {
            st.pos.insert(st.pos.end(), sample.pos, sample.pos + sample.n_rows);
        } else {
            st.pos.insert(st.pos.end(), static_cast<size_t>(sample.n_rows), Pos{0});  // only the Q fit reads them
        }
        st.cell.insert(st.cell.end(), static_cast<size_t>(sample.n_rows), int32_t{-1});
        st.pending = static_cast<int>(sample.n_rows);
        return;
    }
    KeySample all = sample;
    std::vector<float> k_all, q_all;
    std::vector<int32_t> pos_all;
    if (st.rows() > 0) {  // the kept rows first, then this batch's
        k_all = st.k;
        k_all.insert(k_all.end(), sample.k, sample.k + sample.n_rows * k_row);
        pos_all = st.pos;
        if (sample.pos != nullptr) pos_all.insert(pos_all.end(), sample.pos, sample.pos + sample.n_rows);
        pos_all.resize(static_cast<size_t>(n), Pos{0});
        if (with_q) {
            q_all = st.q;
            q_all.insert(q_all.end(), sample.q, sample.q + sample.n_rows * q_row);
        }
        all.k = k_all.data();
        all.q = with_q ? q_all.data() : nullptr;
        all.pos = pos_all.data();
        all.n_rows = n;
    }
    if (with_q) {  // (false after limit_key_transform() and for q8_0 K)
        L.key.calibrate(all, s.n_head_kv, s.head_dim_k, m.n_positions);
    } else {
        L.key.calibrate_diagonal(all.k, all.n_rows, s.n_head_kv, s.head_dim_k);
    }
    L.key_fitted = true;
    if (L.stored_unshaped) m.store_shaped_again(layer);
    st = LayerStorage::Staged{};  // gives its memory back
}

void KvCache::Impl::store_shaped_again(int layer) {
    LayerStorage& L = layers[static_cast<size_t>(layer)];
    const LayerShape& s = L.shape;
    const int64_t k_row = int64_t{s.n_head_kv} * s.head_dim_k;
    float* row = shift_rows.data();
    for (int32_t c = 0; c < capacity; ++c) {
        if (cell_free(c)) continue;
        std::byte* dst = L.k + static_cast<size_t>(c) * L.k_row_bytes;
        const auto kept = std::find(L.staged.cell.rbegin(), L.staged.cell.rend(), c);
        if (kept != L.staged.cell.rend()) {
            const auto r = static_cast<int64_t>(L.staged.cell.rend() - kept) - 1;
            std::copy(L.staged.k.begin() + r * k_row, L.staged.k.begin() + (r + 1) * k_row, row);
        } else {
            read_heads(params.type_k, dst, s.n_head_kv, s.head_dim_k, L.k_head_bytes, rotated, nullptr, row);
        }
        write_heads(params.type_k, row, s.n_head_kv, s.head_dim_k, L.k_head_bytes, rotated, &L.key, L.scratch.data(),
                    dst);
    }
    L.stored_unshaped = false;
    in_memory[static_cast<size_t>(layer)] = 1;
}

int KvCache::used_cells() const {
    return impl_->n_used;
}
int KvCache::allocated_cells() const {
    return (impl_->n_blocks - impl_->n_free_blocks) * impl_->block_size;
}
int KvCache::free_cells() const {
    return impl_->capacity - impl_->n_used;
}
Pos KvCache::seq_pos_min(SeqId seq) const {
    impl_->check_seq(seq, "seq_pos_min");
    return impl_->seq_pos_bound(seq, false);
}
Pos KvCache::seq_pos_max(SeqId seq) const {
    impl_->check_seq(seq, "seq_pos_max");
    return impl_->seq_pos_bound(seq, true);
}
int KvCache::seq_n_cells(SeqId seq) const {
    impl_->check_seq(seq, "seq_n_cells");
    return impl_->seq_cells[static_cast<size_t>(seq)];
}

void KvCache::check_room(std::span<const SeqId> seq) const {
    Impl::BatchPlan plan{};
    const int blocks = impl_->plan_batch(seq, plan);
    if (blocks > impl_->n_free_blocks) impl_->throw_full(seq.size(), blocks);
}

void KvCache::place(std::span<const SeqId> seq, std::span<const Pos> pos, std::span<int32_t> cells_out) {
    if (pos.size() != seq.size() || cells_out.size() != seq.size()) {
        throw std::invalid_argument("KvCache::place: " + std::to_string(seq.size()) + " sequence ids, " +
                                    std::to_string(pos.size()) + " positions, " + std::to_string(cells_out.size()) +
                                    " cells");
    }
    Impl& m = *impl_;
    Impl::BatchPlan plan{};
    const int blocks = m.plan_batch(seq, plan);
    if (blocks > m.n_free_blocks) m.throw_full(seq.size(), blocks);
    m.changed();
    for (SeqId s = 0; s < m.params.n_seq_max; ++s) {
        if (plan[static_cast<size_t>(s)].n_tokens > 0) m.prepare_sequence(s, plan[static_cast<size_t>(s)]);
    }
    for (size_t i = 0; i < seq.size(); ++i)
        cells_out[i] = m.fill_next_cell(seq[i], pos[i], plan[static_cast<size_t>(seq[i])]);
}

void KvCache::store(int layer, std::span<const int32_t> cells, const float* k, const float* v) {
    Impl& m = *impl_;
    m.check_layer(layer, "store");
    m.check_storage("store");
    LayerStorage& L = m.layers[static_cast<size_t>(layer)];
    const LayerShape& s = L.shape;
    const int64_t k_row = int64_t{s.n_head_kv} * s.head_dim_k;
    const int64_t v_row = int64_t{s.n_head_kv} * s.head_dim_v;
    const KeyTransform* key = m.shape_keys ? &L.key : nullptr;
    if (m.shape_keys && !L.key_fitted && !cells.empty()) {
        // Stored unshaped for now; calibrate_keys() stores these cells again once it has fitted.
        L.stored_unshaped = true;
        LayerStorage::Staged& st = L.staged;
        for (int32_t c : cells) st.forget_cell(c);
        if (static_cast<size_t>(st.pending) == cells.size()) {
            std::copy(cells.begin(), cells.end(), st.cell.end() - st.pending);
        }
        st.pending = 0;
    }
    for (int32_t cell : cells) m.check_cell(cell, "store");
    if (key != nullptr && key->query_aware()) {
        // K kv head by kv head, KeyTransform::kRows rows at a time (they share its reads of T and U).
        std::array<const float*, KeyTransform::kRows> heads{};
        std::array<std::byte*, KeyTransform::kRows> dst{};
        for (size_t i0 = 0; i0 < cells.size(); i0 += KeyTransform::kRows) {
            const int n = static_cast<int>(std::min<size_t>(KeyTransform::kRows, cells.size() - i0));
            for (int h = 0; h < s.n_head_kv; ++h) {
                for (int r = 0; r < n; ++r) {
                    const size_t i = i0 + static_cast<size_t>(r);
                    heads[static_cast<size_t>(r)] = k + static_cast<int64_t>(i) * k_row + int64_t{h} * s.head_dim_k;
                    dst[static_cast<size_t>(r)] =
                        L.k + static_cast<size_t>(cells[i]) * L.k_row_bytes + static_cast<size_t>(h) * L.k_head_bytes;
                }
                key->encode(heads.data(), n, h, m.params.type_k, dst.data(), L.scratch.data());
            }
        }
    }
    for (size_t i = 0; i < cells.size(); ++i) {
        const int32_t cell = cells[i];
        const auto row = static_cast<int64_t>(i);
        if (key == nullptr || !key->query_aware()) {
            write_heads(m.params.type_k, k + row * k_row, s.n_head_kv, s.head_dim_k, L.k_head_bytes, m.rotated, key,
                        L.scratch.data(), L.k + static_cast<size_t>(cell) * L.k_row_bytes);
        }
        write_heads(m.params.type_v, v + row * v_row, s.n_head_kv, s.head_dim_v, L.v_head_bytes, m.rotated, nullptr,
                    L.scratch.data(), L.v + static_cast<size_t>(cell) * L.v_row_bytes);
    }
    if (!cells.empty()) m.in_memory[static_cast<size_t>(layer)] = 1;
}

void KvCache::seq_rm(SeqId seq, Pos p0, Pos p1) {
    Impl& m = *impl_;
    m.changed();
    m.check_seq(seq, "seq_rm", true);
    const PosRange range(p0, p1);
    if (range.empty()) return;
    if (seq == -1) {
        uint64_t touched = 0;
        for (int32_t c = 0; c < m.capacity; ++c) {
            if (m.cell_free(c) || !range.contains(m.pos[static_cast<size_t>(c)])) continue;
            touched |= m.seqs[static_cast<size_t>(c)];
            m.free_cell(c);
        }
        m.release_blocks_without_each(touched);
        return;
    }
    m.for_seq_cells(seq, [&](int32_t c) {
        if (range.contains(m.pos[static_cast<size_t>(c)])) m.remove_seq_from_cell(c, seq);
    });
    m.release_blocks_without(seq);
}

void KvCache::seq_cp(SeqId src, SeqId dst, Pos p0, Pos p1) {
    Impl& m = *impl_;
    m.changed();
    m.check_seq(src, "seq_cp");
    m.check_seq(dst, "seq_cp");
    const PosRange range(p0, p1);
    if (src == dst || range.empty()) return;
    for (int32_t block : m.tables[static_cast<size_t>(src)]) {
        bool shared = false;
        for (int32_t c = m.first_cell(block); c < m.first_cell(block) + m.block_size; ++c) {
            if (!m.cell_has(c, src) || !range.contains(m.pos[static_cast<size_t>(c)])) continue;
            m.add_seq_to_cell(c, dst);
            shared = true;
        }
        if (shared) m.hold_block(dst, block);
    }
}

void KvCache::seq_keep(SeqId seq) {
    Impl& m = *impl_;
    m.changed();
    m.check_seq(seq, "seq_keep");
    for (int32_t c = 0; c < m.capacity; ++c) {
        if (m.cell_free(c)) continue;
        if (!m.cell_has(c, seq)) {
            m.free_cell(c);
            continue;
        }
        m.keep_only(c, seq);
    }
    const uint64_t all = m.params.n_seq_max == kMaxSequences ? ~uint64_t{0} : seq_bit(m.params.n_seq_max) - 1;
    m.release_blocks_without_each(all & ~seq_bit(seq));
}

void KvCache::seq_add(SeqId seq, Pos p0, Pos p1, Pos delta) {
    Impl& m = *impl_;
    m.changed();
    m.check_seq(seq, "seq_add");
    const PosRange range(p0, p1);
    if (delta == 0 || range.empty()) return;
    uint64_t touched = 0;  // sequences that lost cells moved below position 0
    m.for_seq_cells(seq, [&](int32_t c) {
        const Pos p = m.pos[static_cast<size_t>(c)];
        if (!range.contains(p)) return;
        if (p + delta < 0) touched |= m.seqs[static_cast<size_t>(c)];
        m.shift_cell(c, p + delta);
    });
    m.release_blocks_without_each(touched);
}

void KvCache::seq_div(SeqId seq, Pos p0, Pos p1, int d) {
    Impl& m = *impl_;
    m.changed();
    m.check_seq(seq, "seq_div");
    if (d < 1) throw std::invalid_argument("KvCache::seq_div: divisor " + std::to_string(d) + " must be at least 1");
    const PosRange range(p0, p1);
    if (d == 1 || range.empty()) return;
    m.for_seq_cells(seq, [&](int32_t c) {
        const Pos p = m.pos[static_cast<size_t>(c)];
        if (range.contains(p)) m.shift_cell(c, p / d);
    });
}

void KvCache::clear() {
    impl_->changed();
    impl_->clear();
}

bool KvCache::has_k_shift() const {
    return impl_->has_shift;
}

void KvCache::clear_k_shift() {
    std::fill(impl_->shift.begin(), impl_->shift.end(), 0);
    impl_->has_shift = false;
}

// Reads K of the shifted cells back to floats kShiftChunk at a time, lets fn re-rotate them and
// stores them again.
void KvCache::for_shifted_cells(int layer, void (*fn)(void*, float*, const int32_t*, int), void* ctx) {
    Impl& m = *impl_;
    m.check_layer(layer, "apply_k_shift");
    if (!m.has_shift) return;
    m.check_storage("apply_k_shift");
    LayerStorage& L = m.layers[static_cast<size_t>(layer)];
    const LayerShape& s = L.shape;
    const int64_t row = int64_t{s.n_head_kv} * s.head_dim_k;
    int n = 0;
    auto flush = [&] {
        fn(ctx, m.shift_rows.data(), m.shift_deltas.data(), n);
        for (int i = 0; i < n; ++i) {
            write_heads(m.params.type_k, m.shift_rows.data() + i * row, s.n_head_kv, s.head_dim_k, L.k_head_bytes,
                        m.rotated, m.shape_keys ? &L.key : nullptr, L.scratch.data(),
                        L.k + static_cast<size_t>(m.shift_cells[static_cast<size_t>(i)]) * L.k_row_bytes);
        }
        n = 0;
    };
    for (int32_t c = 0; c < m.capacity; ++c) {
        const Pos delta = m.shift[static_cast<size_t>(c)];
        if (m.cell_free(c) || delta == 0) continue;
        L.staged.forget_cell(c);  // its K changes
        read_heads(m.params.type_k, L.k + static_cast<size_t>(c) * L.k_row_bytes, s.n_head_kv, s.head_dim_k,
                   L.k_head_bytes, m.rotated, m.shape_keys ? &L.key : nullptr, m.shift_rows.data() + n * row);
        m.shift_cells[static_cast<size_t>(n)] = c;
        m.shift_deltas[static_cast<size_t>(n)] = delta;
        if (++n == kShiftChunk) flush();
    }
    if (n > 0) flush();
    // A shift may touch every row of the layer: a streamed one leaves memory right away.
    if (L.streamed) m.release_layer(layer);
}

void KvCache::trim_window() {
    Impl& m = *impl_;
    if (m.params.window <= 0) return;
    m.changed();
    for (SeqId seq = 0; seq < m.params.n_seq_max; ++seq) {
        if (m.seq_cells[static_cast<size_t>(seq)] == 0) continue;
        const Pos newest_unseen = m.seq_pos_bound(seq, true) - m.params.window;
        m.for_seq_cells(seq, [&](int32_t c) {
            if (m.pos[static_cast<size_t>(c)] <= newest_unseen) m.remove_seq_from_cell(c, seq);
        });
        m.release_blocks_without(seq);
    }
}

std::span<const int32_t> KvCache::seq_blocks(SeqId seq) const {
    impl_->check_seq(seq, "seq_blocks");
    return impl_->tables[static_cast<size_t>(seq)];
}
bool KvCache::cell_has_seq(int32_t cell, SeqId seq) const {
    return impl_->cell_has(cell, seq);
}
Pos KvCache::cell_pos(int32_t cell) const {
    return impl_->pos[static_cast<size_t>(cell)];
}
uint64_t KvCache::cell_seqs(int32_t cell) const {
    return impl_->seqs[static_cast<size_t>(cell)];
}
std::span<const Pos> KvCache::cell_positions() const {
    return impl_->pos;
}
std::span<const uint64_t> KvCache::cell_seq_masks() const {
    return impl_->seqs;
}

KvCache::LayerView KvCache::layer_view(int layer) const {
    const Impl& m = *impl_;
    m.check_layer(layer, "layer_view");
    const LayerStorage& L = m.layers[static_cast<size_t>(layer)];
    return LayerView{.type_k = m.params.type_k,
                     .type_v = m.params.type_v,
                     .n_head_kv = L.shape.n_head_kv,
                     .head_dim_k = L.shape.head_dim_k,
                     .head_dim_v = L.shape.head_dim_v,
                     .rotated = m.rotated,
                     .key = m.shape_keys && L.key.query_aware() ? &L.key : nullptr,
                     .q_scale = m.shape_keys ? L.key.q_scale() : nullptr,
                     .k_center = m.shape_keys ? L.key.center() : nullptr,
                     .k_scale = m.shape_keys ? L.key.scale() : nullptr,
                     .k = L.k,
                     .v = L.v,
                     .k_row_bytes = L.k_row_bytes,
                     .k_head_bytes = L.k_head_bytes,
                     .v_row_bytes = L.v_row_bytes,
                     .v_head_bytes = L.v_head_bytes};
}

void KvCache::read_k(int layer, int32_t cell, float* out) const {
    const Impl& m = *impl_;
    m.check_layer(layer, "read_k");
    m.check_cell(cell, "read_k");
    m.check_storage("read_k");
    const LayerStorage& L = m.layers[static_cast<size_t>(layer)];
    read_heads(m.params.type_k, L.k + static_cast<size_t>(cell) * L.k_row_bytes, L.shape.n_head_kv, L.shape.head_dim_k,
               L.k_head_bytes, m.rotated, m.shape_keys ? &L.key : nullptr, out);
}

void KvCache::read_v(int layer, int32_t cell, float* out) const {
    const Impl& m = *impl_;
    m.check_layer(layer, "read_v");
    m.check_cell(cell, "read_v");
    m.check_storage("read_v");
    const LayerStorage& L = m.layers[static_cast<size_t>(layer)];
    read_heads(m.params.type_v, L.v + static_cast<size_t>(cell) * L.v_row_bytes, L.shape.n_head_kv, L.shape.head_dim_v,
               L.v_head_bytes, m.rotated, nullptr, out);
}

}  // namespace fitllm::kv
