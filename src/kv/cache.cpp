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

#include "kv/cache_impl.h"
#include "kv/hadamard.h"
#include "kv/key_transform.h"
#include "kv/spill_file.h"
#include "memory/pool.h"
#include "quant/dequantize.h"
#include "quant/quantize.h"
#include "util/round.h"
#include "util/text.h"

namespace fitllm::kv {

using namespace cache_detail;

namespace {

constexpr GgmlType kKvTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,  GgmlType::Q4_0,
                                 GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::IQ4_NL};

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

// ---- Layout and construction -------------------------------------------------------------------

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

Layout make_layout(const std::vector<LayerShape>& shapes, const CacheParams& p) {
    Layout l;
    l.capacity = static_cast<int>(util::round_up<int64_t>(p.n_cells, p.block_size));
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
        l.file_bytes += util::round_up<uint64_t>(l.k_row_bytes[il] * cells, page) +
                        util::round_up<uint64_t>(l.v_row_bytes[il] * cells, page);
    }
    return l;
}

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
            layer.v_offset = file_offset + util::round_up<uint64_t>(k_bytes, SpillFile::page_size());
            file_offset = layer.v_offset + util::round_up<uint64_t>(v_bytes, SpillFile::page_size());
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

void KvCache::trim_window(int slack) {
    Impl& m = *impl_;
    if (m.params.window <= 0) return;
    if (slack < 0) throw std::invalid_argument("trim_window: slack " + std::to_string(slack) + " is negative");
    m.changed();
    for (SeqId seq = 0; seq < m.params.n_seq_max; ++seq) {
        if (m.seq_cells[static_cast<size_t>(seq)] == 0) continue;
        const Pos newest_unseen = m.seq_pos_bound(seq, true) - m.params.window - slack;
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

}  // namespace fitllm::kv
