#pragma once
// The KV cache (docs/architecture.md, idea 4): a preallocated pool of cells that several sequences share,
// grouped in fixed-size blocks that sequences own through block tables (PagedAttention), with
// K/V stored in f32, f16, bf16 or a quantized type, optionally after a Hadamard rotation of each
// head. The pool never grows: its size is fixed at construction from -c.
//
//   kv::CacheParams p{.n_cells = 4096, .n_seq_max = 4, .type_k = GgmlType::Q8_0, .type_v = GgmlType::Q8_0};
//   kv::KvCache cache(layers, p);
//   cache.place(seq_ids, positions, cells);           // room for a batch, or KvCacheError
//   cache.store(layer, cells, k_rows, v_rows);         // every layer, in the forward pass
//   ops::attention over cache.layer_view(layer)        // reads K/V straight from the blocks
//   cache.seq_rm(1, 100, -1); cache.seq_cp(0, 2, -1, -1); cache.seq_add(0, 4, -1, -4);
//
// Vocabulary (as llama.cpp's): a *cell* holds one token's K and V for every layer of the pool,
// its position, and the set of sequences that use it (a token of a shared prefix is one cell in
// several sequences). A *block* is block_size consecutive cells. Each sequence has a *block
// table*: the blocks it has cells in, in the order it got them. A block is shared when more than
// one table holds it (reference count); a sequence that writes into a shared block first copies
// it (copy on write). Positions inside a block need not be increasing (after shifts or
// removals); attention decides visibility per cell.
//
// Memory: with params.pool set, the cache charges that pool (memory/pool.h) for bytes() before it
// allocates anything, so a cache over budget throws memory::BudgetError naming the pool and the
// bytes, and gives the bytes back when it goes.
//
// Spill (docs/architecture.md, idea 5): with params.spill_dir set and params.resident_limit below the K/V
// storage (every layer's K and V rows for every cell), the layers that do not fit live in a file
// in spill_dir (kv/spill_file.h: anonymous, blocks reserved up front, mapped shared) and stream
// through memory one layer at a time, in the order the forward pass attends them:
//   - S = the largest layer's K+V bytes, R = floor(resident_limit / S) layers fit in the limit.
//   - The first R - 2 layers stay in memory ("pinned", ordinary zeroed memory). The others are
//     "streamed": they live in the file, and at most 2 of them are in memory at once: the layer
//     being attended and the next one, read ahead while this one computes. With R = 1, only the
//     layer being attended (no read-ahead). R = 0 is refused: attention needs a whole layer.
//   - will_attend(layer), called by the forward pass right before each layer's attention, takes
//     the streamed layers other than `layer` and the next streamed one (wrapping round to the
//     first streamed layer for the next batch) out of memory: their dirty pages are written to
//     the file and dropped from the page cache (SpillFile::release), so the page cache charged to
//     the process stays inside the limit; and it asks for the next streamed layer to be read
//     ahead (MADV_WILLNEED). Only the cells in use so far (up to the highest cell ever placed)
//     are read or written back, so a short context costs little I/O.
//   - store() of the next layer (before its will_attend) writes into pages already on their way in.
//   - A decode step reads every streamed layer's used K/V from disk once and writes back the few
//     pages its new token dirtied: spill trades decode speed for memory; pin more by raising the
//     limit.
// bytes() (and the pool charge) is then the bookkeeping, the pinned layers and 2 (or 1) streamed
// layers: at most the limit plus the bookkeeping. The results are bit-identical to an in-memory
// cache: only where the bytes live changes. Without will_attend() calls (a cache used outside a
// model) everything still reads and writes correctly; pages just leave memory only when the
// kernel reclaims them.
//
// Thread safety: none; one forward pass at a time. store() may be called from one thread per
// layer range; the views are read-only.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fitllm/error.h"
#include "kv/key_transform.h"
#include "quant/ggml_type.h"

namespace fitllm::memory {
class Pool;
}

namespace fitllm::kv {

// Not enough free cells for a batch, or a sequence id out of range: says what was asked for and
// what is free. Nothing in the cache changed.
class KvCacheError : public Error {
public:
    using Error::Error;
};

using SeqId = int32_t;  // 0 .. n_seq_max - 1; -1 in seq_* operations means "every sequence"
using Pos = int32_t;

inline constexpr int kMaxSequences = 64;  // a cell's sequence set is a 64-bit mask

// The K/V width of one layer of the pool, and its query heads (0: n_head_kv), whose rows
// calibrate the K transform (calibrate_keys()).
struct LayerShape {
    int n_head_kv = 0;
    int head_dim_k = 0;
    int head_dim_v = 0;
    int n_head_q = 0;
};

struct CacheParams {
    int n_cells = 0;      // tokens the pool holds, all sequences together
    int n_seq_max = 1;    // sequences (<= kMaxSequences)
    int block_size = 16;  // cells per block; n_cells is rounded up to whole blocks
    int window = 0;       // > 0: a sliding-window pool; see KvCache::trim_window()
    quant::GgmlType type_k = quant::GgmlType::F16;
    quant::GgmlType type_v = quant::GgmlType::F16;
    // Rotate each head by a normalized Walsh-Hadamard transform before quantizing (K and V), so
    // outliers spread over the head. Only for quantized types (q8_0, q4_0, ...); ignored for
    // f32 / f16 / bf16. Needs head sizes that are powers of two (others are stored unrotated).
    // With a quantized K it also shapes K heads (kv/key_transform.h): 4- and 5-bit K for the
    // queries, which is what makes 4-bit keys cheap, q8_0 K by the diagonal kind; false stores
    // both as llama.cpp does.
    bool rotate = true;
    // The positions a sequence's tokens take at most (0: n_cells), over which the K transform
    // averages RoPE's rotations (kv/key_transform.h). Only the transform's quality depends on it.
    int n_positions = 0;
    // Charge the working memory of a K transform's fit (kv::query_aware_fit_bytes) with this
    // cache's. Fits run one layer at a time, so a ModelCache charges it to one of its pools only.
    bool charge_key_fit = true;
    // The pool charged for bytes() (memory/pool.h, pool_names::kKv); nullptr charges nothing.
    memory::Pool* pool = nullptr;
    // Spill (see above): a directory on disk for the K/V that does not fit, and the bytes of K/V
    // storage that may stay in memory. The cache spills only when both are set and the limit is
    // below the K/V storage; otherwise everything stays in memory. In a ModelCache the limit is
    // for all its pools together: sliding-window pools stay in memory, the full pool spills.
    std::string spill_dir;
    uint64_t resident_limit = 0;  // 0: no limit
    // The K/V bytes live in a device's own memory (a CUDA device's pool, backend/backend.h): the
    // cache keeps the bookkeeping and charges bytes() as usual, but allocates no K/V storage on the
    // host. store(), read_k(), read_v() and apply_k_shift() then throw std::logic_error, and
    // layer_view()'s k and v are nullptr; the device writes K/V itself (calibrate_keys() for the
    // K transform) and follows cell_copies() and cell_shifts(). Never spills.
    bool external_storage = false;
};

// The types -ctk / -ctv accept: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl.
bool is_kv_type(quant::GgmlType type);
// Parses a -ctk / -ctv value; throws std::invalid_argument listing the accepted names.
quant::GgmlType kv_type_from_name(const std::string& name);

class KvCache {
public:
    // Allocates every byte up front (zeroed, so untouched pages cost no memory until used).
    // Throws std::invalid_argument for bad shapes or types (naming them): no layers, n_cells or a
    // width < 1, n_seq_max outside 1..64, a type is_kv_type() rejects, head sizes that are not
    // whole blocks of a quantized type (32 values), a spill resident limit below one layer's K/V.
    // Throws memory::BudgetError when params.pool has no room for bytes() (nothing allocated), and
    // SpillError (kv/spill_file.h) when the spill file cannot be made in params.spill_dir.
    KvCache(std::vector<LayerShape> layers, CacheParams params);

    KvCache(KvCache&&) noexcept;
    KvCache& operator=(KvCache&&) noexcept;
    ~KvCache();

    const CacheParams& params() const;
    int n_layer() const;   // layers in this pool
    int capacity() const;  // cells
    int n_blocks() const;
    // The bytes held in memory and charged to params.pool: the per-cell bookkeeping and K/V (all of
    // it, or with spill the pinned layers and the streamed layers that may be in memory at once).
    size_t bytes() const;
    // What bytes() of a cache made with these arguments will be (throws as the constructor would).
    static size_t bytes_for(const std::vector<LayerShape>& layers, const CacheParams& params);
    // The part of it the K transforms take (kv/key_transform.h; 0 when K is not shaped): per layer
    // the query-aware kind's c, T^T, T^-1 and U and the rows kept until its fit, and the fit's
    // working memory once.
    static size_t key_transform_bytes(const std::vector<LayerShape>& layers, const CacheParams& params);
    // Spill: whether K/V spills to a file, its size (0 without), and the layers kept in memory.
    bool spilled() const;
    uint64_t spill_file_bytes() const;
    int pinned_layers() const;  // n_layer() without spill
    // True when K and V heads are stored Hadamard-rotated (both or neither): params.rotate, K or V
    // quantized, and every head size of the pool a power of two.
    bool rotated() const;

    // False with params.external_storage: no K/V bytes on the host.
    bool holds_kv() const;

    // Occupancy.
    int used_cells() const;            // cells in use by at least one sequence
    int allocated_cells() const;       // cells of blocks in some block table; waste = allocated - used
    int free_cells() const;            // capacity - used_cells()
    Pos seq_pos_min(SeqId seq) const;  // -1 when the sequence is empty
    Pos seq_pos_max(SeqId seq) const;  // -1 when the sequence is empty
    int seq_n_cells(SeqId seq) const;

    // --- Placing a batch ----------------------------------------------------------------------
    // Finds a cell for each token i (of sequence seq[i] at position pos[i]) and marks it used:
    // first in the free cells of each sequence's last block (copying that block first when it
    // is shared), then in new blocks, preferring runs of contiguous free blocks, then any free
    // block; freed blocks are reused ring-fashion (the search starts after the last block
    // handed out). cells_out[i] receives the cell index. All or nothing: when the batch does not
    // fit, throws KvCacheError with the numbers and changes nothing.
    // A sequence whose last block is shared and has free cells gets a copy of the cells it uses
    // there in a new block (same offsets; the others keep the original) and fills that block.
    // Allocates nothing.
    void place(std::span<const SeqId> seq, std::span<const Pos> pos, std::span<int32_t> cells_out);
    // Throws what place() would throw for a batch of these sequences; changes nothing.
    void check_room(std::span<const SeqId> seq) const;

    // Writes n = cells.size() rows of layer `layer`: k is [n, n_head_kv * head_dim_k] floats,
    // v is [n, n_head_kv * head_dim_v]; rotated and quantized to the pool's types. F16 rounds to
    // nearest even, as the old float cache and llama.cpp's f16 cache do. Allocates nothing; calls
    // for different layers may run on different threads. K of a layer whose transform is not
    // calibrated yet is stored unshaped (calibrate_keys() stores it again once it is).
    void store(int layer, std::span<const int32_t> cells, const float* k, const float* v);

    // --- The K transform (kv/key_transform.h) ----------------------------------------------------
    // True when K heads are shaped before quantizing (params.rotate and a quantized K): then the
    // forward pass calls calibrate_keys() before each store() until needs_key_calibration() is false.
    bool shapes_keys() const;
    bool needs_key_calibration(int layer) const;
    // Fits the layer's K transform from the batch about to be stored (sample: its K and Q after
    // RoPE, and their positions) and the batches before it, once at least kMinKeyRows rows have
    // come: the query-aware kind on the host for 4- and 5-bit K, the diagonal one (from K alone)
    // for q8_0 K, with external storage, after limit_key_transform(), or when sample.q is nullptr.
    // Until then the rows are kept (kMinKeyRows - 1 at most); once fitted, every cell the layer
    // already holds is stored again shaped (from the kept rows where the cell still holds one). The
    // store() of the same rows follows. Nothing when the transform is fitted already or K is not
    // shaped.
    static constexpr int kMinKeyRows = 8;
    void calibrate_keys(int layer, const KeySample& sample);
    // From now on calibrate_keys() fits the diagonal kind: for a device that attends this pool with
    // kernels that take per-dimension factors (CUDA). Call before the first calibrate_keys().
    void limit_key_transform();
    bool key_transform_limited() const;  // limit_key_transform() was called
    // The K transforms across runs (engine/prompt_cache.h keeps them beside its files): the layer's
    // transform once fitted (nullptr before, or when K is not shaped).
    const KeyTransform* key_transform(int layer) const;
    // Whether `key` could be the layer's: its kv heads and head size, and a kind calibrate_keys()
    // may fit here (the query-aware one only for 4- and 5-bit K without limit_key_transform(); the
    // identity only for head sizes the diagonal kind cannot take).
    bool accepts_key_transform(int layer, const KeyTransform& key) const;
    // Gives the layer `key` as if calibrate_keys() had fitted it, so that K is stored as the run
    // that fitted it stored it. Only before the layer stored anything, with K shaped on the host;
    // throws std::logic_error otherwise, or when !accepts_key_transform(layer, key).
    void set_key_transform(int layer, KeyTransform key);
    // Forgets the K transforms calibrate_keys() fitted (not those set_key_transform() gave), so that
    // the next batches fit them anew: after a pass whose keys are no sample of real text (the
    // scheduler's warm-up, token 0 over and over). Only on an empty cache (after clear()); throws
    // std::logic_error otherwise. Nothing with external storage: a device keeps the transform it
    // stored its first keys with.
    void forget_fitted_key_transforms();

    // Changes with every call that may change the bookkeeping (place(), the sequence operations,
    // clear(), trim_window()), so a device copying it can tell when to copy it again.
    uint64_t generation() const;
    // The cells copied on write by the call that set generation() (only place() copies: each cell
    // from a shared block to the same offset of a new one; K/V rows of every layer), in order;
    // empty after any other call. At most n_seq_max * block_size entries. A device holding the K/V
    // makes the same copies, once per generation, before storing the batch.
    struct CellCopy {
        int32_t from, to;
    };
    std::span<const CellCopy> cell_copies() const;

    // --- Sequence operations (llama.cpp's llama_memory_seq_*) ---------------------------------
    // Ranges are [p0, p1); p0 < 0 means 0 and p1 < 0 means no upper bound. seq -1 = every
    // sequence in seq_rm only (as llama.cpp); elsewhere, and any id >= n_seq_max, throws
    // KvCacheError. Blocks left with no cell of a sequence leave its table; blocks left with no
    // used cell return to the free list.
    void seq_rm(SeqId seq, Pos p0, Pos p1);             // forget the sequence's tokens in range
    void seq_cp(SeqId src, SeqId dst, Pos p0, Pos p1);  // dst also uses src's cells in range (no copy)
    void seq_keep(SeqId seq);                           // forget every other sequence
    // Positions in range move by delta (tokens whose position becomes negative are removed).
    // K needs re-rotating (RoPE) by delta: the cache records it, and the model applies it with
    // apply_k_shift() before its next forward pass. As in llama.cpp a cell has one position, so a
    // cell that seq shares with other sequences moves for them too (and is removed for all).
    void seq_add(SeqId seq, Pos p0, Pos p1, Pos delta);
    void seq_div(SeqId seq, Pos p0, Pos p1, int d);  // positions in range become pos / d (RoPE as seq_add)
    void clear();                                    // every cell free, every table empty

    // --- Shifts ---------------------------------------------------------------------------------
    bool has_k_shift() const;
    // The pending shift of each cell ([capacity()]; 0: none), for a device that re-rotates K itself.
    std::span<const Pos> cell_shifts() const;
    // For each cell with a pending shift: K of `layer` is read back to floats (un-rotated), passed
    // to rerotate(k_rows [n, n_head_kv * head_dim_k], deltas [n], n) which applies RoPE by each
    // row's delta in place, and stored again (rerotate gets at most 32 rows per call). Call for
    // every layer, then clear_k_shift(). One layer at a time (shared scratch); allocates nothing.
    template <class Fn>
    void apply_k_shift(int layer, Fn&& rerotate);
    void clear_k_shift();

    // Sliding-window pools: frees the cells of each sequence whose position is at or below
    // seq_pos_max(seq) - window - slack, i.e. those no later token can see (slack 0), or that
    // one could see again once the sequence's last `slack` tokens are taken back (seq_rm), as
    // speculative decoding does with rejected drafts. The model calls it after each batch.
    void trim_window(int slack = 0);

    // --- Reading (attention) -------------------------------------------------------------------
    // A token of sequence `seq` sees the cells of the blocks in seq_blocks(seq) whose sequence set
    // contains seq (and whose position passes the causal / window test).
    std::span<const int32_t> seq_blocks(SeqId seq) const;  // block indices, table order
    bool cell_has_seq(int32_t cell, SeqId seq) const;
    Pos cell_pos(int32_t cell) const;  // -1 for a free cell
    uint64_t cell_seqs(int32_t cell) const;
    // The same for every cell at once ([capacity()]; free cells: -1 and 0), for attention tiles.
    std::span<const Pos> cell_positions() const;
    std::span<const uint64_t> cell_seq_masks() const;

    struct LayerView {
        quant::GgmlType type_k, type_v;
        int n_head_kv, head_dim_k, head_dim_v;
        bool rotated;  // heads stored Hadamard-rotated: rotate q, un-rotate the output
        // K heads stored shaped for the queries (kv/key_transform.h's query-aware kind): attention
        // dots them with key->shape_query(q, g) (rotation included) instead of q; nullptr: not.
        const KeyTransform* key = nullptr;
        // K heads stored centred and scaled (the diagonal kind): multiply q by q_scale (the kv
        // head's [head_dim_k] at g * head_dim_k) before rotating it; nullptr: K stored as is.
        const float* q_scale = nullptr;
        const float* k_center = nullptr;  // the same layout: the centre taken off K (both kinds)
        const float* k_scale = nullptr;   // diagonal: K is stored as (k - k_center) * k_scale
        const std::byte* k = nullptr;     // cell c's K row: k + c * k_row_bytes; head h at h * k_head_bytes
        const std::byte* v = nullptr;
        size_t k_row_bytes, k_head_bytes, v_row_bytes, v_head_bytes;
    };
    LayerView layer_view(int layer) const;

    // --- Rows out and back (the scheduler's prompt cache in host memory) -------------------------
    // The bytes of one cell's K and V rows over every layer, as stored (rotated, shaped, quantized).
    size_t cell_bytes() const;
    // True when rows copied out now may be copied back later: K/V are on the host and every layer's
    // K transform is fitted (or K is not shaped), so no later calibration stores them otherwise.
    bool rows_stable() const;
    // Copies the stored rows of these cells to out (cells.size() * cell_bytes() bytes), cell after
    // cell, each one layer after layer, K then V. copy_rows_in() writes such bytes into cells
    // (placed for them already): the cells then hold what the first ones held, bit for bit.
    // Throw std::logic_error without K/V on the host (external_storage).
    void copy_rows_out(std::span<const int32_t> cells, std::byte* out) const;
    void copy_rows_in(std::span<const int32_t> cells, const std::byte* in);

    // Spill: call right before attending `layer` (after storing it is fine too); moves streamed
    // layers in and out of memory as described above. Changes no content; a no-op without spill.
    // Throws SpillError (kv/spill_file.h) when writing the spill file back fails.
    void will_attend(int layer) const;

    // For tests and checks: K or V of one cell and layer back in floats (un-rotated).
    void read_k(int layer, int32_t cell, float* out) const;
    void read_v(int layer, int32_t cell, float* out) const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;  // the bookkeeping and the storage (cache.cpp)
    void for_shifted_cells(int layer, void (*fn)(void*, float*, const int32_t*, int), void* ctx);
};

template <class Fn>
void KvCache::apply_k_shift(int layer, Fn&& rerotate) {
    using F = std::remove_reference_t<Fn>;
    for_shifted_cells(
        layer,
        [](void* ctx, float* k_rows, const int32_t* deltas, int n) { (*static_cast<F*>(ctx))(k_rows, deltas, n); },
        const_cast<void*>(static_cast<const void*>(&rerotate)));
}

// The caches of one model: one pool for the layers with full attention and, when some layers
// attend through a sliding window (Gemma 3's local layers), a pool per window size for those,
// trimmed after every batch, so their memory and cost stop growing past the window. A window pool
// has room for n_seq_max * window + n_batch cells plus the partly used blocks at each end of every
// sequence's window: n_seq_max * (ceil(window / block_size) + 2) + ceil(n_batch / block_size)
// blocks (window_pool_cells()). When that is not smaller than the full pool, the windowed layers
// go into the full pool (their attention still masks by window). Pool 0 is the full-attention
// pool when there is one. Sequence operations and place() apply to every pool.
class ModelCache {
public:
    // layer_window[il] == 0: full attention; > 0: that layer's window. params.window is ignored.
    // Throws like KvCache, and std::invalid_argument when the lists differ in length or n_batch < 1,
    // or when params.resident_limit (with spill) does not exceed the window pools' bytes.
    //
    // Devices (docs/architecture.md, idea 6): layer_device[il] == 0 (or an empty list): the host, whose pools
    // charge params.pool; d > 0: device d, whose pools charge device_kv_pools[d - 1] (its "kv"
    // pool) and never spill. Pools are grouped by (window, device) and ordered by window, then
    // device: each pool is a whole KvCache (bookkeeping and K/V) charged to its device, and
    // place() and the sequence operations keep them all in step.
    // device_external[d - 1] true: device d keeps its pools' K/V in memory of its own
    // (CacheParams::external_storage).
    ModelCache(const std::vector<LayerShape>& layers, const std::vector<int>& layer_window, CacheParams params,
               int n_batch, const std::vector<int>& layer_device = {},
               const std::vector<memory::Pool*>& device_kv_pools = {}, const std::vector<bool>& device_external = {});
    ~ModelCache();
    ModelCache(ModelCache&&) noexcept = default;
    ModelCache& operator=(ModelCache&&) noexcept = default;

    // fn runs once when the cache goes (destroyed, or assigned over), before its pools do: a device
    // that mirrors pools (backend::Backend::attach_kv) lets them go. Latest first.
    void on_close(std::function<void()> fn);
    // What bytes() of a ModelCache made with these arguments will be (throws as the constructor
    // would): the plan's number for the KV cache, spill included.
    static size_t bytes_for(const std::vector<LayerShape>& layers, const std::vector<int>& layer_window,
                            const CacheParams& params, int n_batch);
    // The bytes each device's pools charge (index: device number, 0 the host), for the plan: the
    // sum of KvCache::bytes_for over the pools of each device, as the constructor groups them.
    static std::vector<size_t> bytes_per_device(const std::vector<LayerShape>& layers,
                                                const std::vector<int>& layer_window, const CacheParams& params,
                                                int n_batch, const std::vector<int>& layer_device);
    // The cells of a window pool (see above), before rounding to blocks.
    static int window_pool_cells(const CacheParams& params, int window, int n_batch);

    int n_pools() const;
    KvCache& pool(int i);
    const KvCache& pool(int i) const;
    int pool_device(int pool) const;     // the device a pool's K/V is on (0: the host)
    int pool_of(int layer) const;        // which pool holds the model layer
    int index_in_pool(int layer) const;  // the layer's index inside its pool

    // Places the batch in every pool (all or nothing across pools); cells(pool) then gives the
    // cells of the batch's tokens in that pool, valid until the next place().
    void place(std::span<const SeqId> seq, std::span<const Pos> pos);
    std::span<const int32_t> cells(int pool) const;
    // Whether place() would find room for a batch of these sequences in every pool.
    bool has_room(std::span<const SeqId> seq) const;
    // After the forward pass of a batch: trims the sliding-window pools, keeping window_slack()
    // positions more than the window.
    void end_batch();
    // Speculative decoding feeds drafts and takes back the rejected ones (seq_rm): the window
    // pools must then still hold what a token after the last accepted one sees. With a slack of
    // n, end_batch() keeps n positions more than the window (up to n cells more per sequence).
    // A window pool has room for them while 2 * n + 1 tokens fit in its n_batch (batches of at
    // most n + 1 tokens, as drafts of n and the token before them); set it back to 0 (and call
    // end_batch()) before feeding longer batches. Attention still masks by the window, so the
    // slack changes no result.
    void set_window_slack(int n) { window_slack_ = n; }
    int window_slack() const { return window_slack_; }

    void seq_rm(SeqId seq, Pos p0, Pos p1);
    void seq_cp(SeqId src, SeqId dst, Pos p0, Pos p1);
    void seq_keep(SeqId seq);
    void seq_add(SeqId seq, Pos p0, Pos p1, Pos delta);
    void seq_div(SeqId seq, Pos p0, Pos p1, int d);
    void clear();
    Pos seq_pos_min(SeqId seq) const;  // from the full-attention pool (the one that keeps everything;
    Pos seq_pos_max(SeqId seq) const;  // pool 0 when every layer is windowed)
    int capacity() const;              // of the full-attention pool: the context size
    // The positions a sequence's tokens take at most: CacheParams::n_positions, else n_cells
    // (what picks Phi-3's short or long RoPE factors, as llama.cpp's n_ctx_seq does).
    int n_positions() const { return n_positions_; }
    size_t bytes() const;               // every pool
    uint64_t spill_file_bytes() const;  // every pool
    // Before attending model layer il: KvCache::will_attend on its pool.
    void will_attend(int layer) const;
    bool has_k_shift() const;  // any pool
    void clear_k_shift();      // every pool

private:
    // First: moving a cache over this one runs this one's hooks while its pools still exist.
    class CloseHooks {
    public:
        CloseHooks() = default;
        CloseHooks(CloseHooks&& o) noexcept : fns_(std::exchange(o.fns_, {})) {}
        CloseHooks& operator=(CloseHooks&& o) noexcept {
            if (this != &o) {
                run();
                fns_ = std::exchange(o.fns_, {});
            }
            return *this;
        }
        ~CloseHooks() { run(); }
        void add(std::function<void()> fn) { fns_.push_back(std::move(fn)); }
        void run() noexcept;

    private:
        std::vector<std::function<void()>> fns_;
    };
    CloseHooks close_hooks_;
    std::vector<KvCache> pools_;
    std::vector<int> pool_of_, index_in_pool_, pool_device_;
    std::vector<std::vector<int32_t>> cells_;
    int capacity_ = 0;
    int n_positions_ = 0;
    int window_slack_ = 0;
};

}  // namespace fitllm::kv
