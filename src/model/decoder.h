#pragma once
// Pieces the decoder-only forward passes (gemma3.cpp, llama.cpp) share: their working memory
// (charged to a device), the streamed layers, the checks and cache bookkeeping around a batch (K shifts, placing,
// window trimming), attention over the KV cache, and the output rows. Internal to model/.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv/cache.h"
#include "memory/device.h"
#include "memory/pool.h"
#include "model/hparams.h"
#include "model/layer_stream.h"
#include "model/model.h"
#include "ops/attention.h"
#include "ops/attention_kv.h"
#include "ops/matmul.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/scratch.h"
#include "ops/thread_pool.h"

namespace fitllm::model {

// Bytes charged to a pool for working memory that only grows; released on destruction.
class GrowingCharge {
public:
    explicit GrowingCharge(memory::Pool& pool) : pool_(pool) {}
    ~GrowingCharge() {
        if (bytes_ > 0) pool_.release(bytes_);
    }
    GrowingCharge(const GrowingCharge&) = delete;
    GrowingCharge& operator=(const GrowingCharge&) = delete;

    // Charges the difference when `bytes` is more than charged so far (memory::BudgetError when it
    // does not fit: nothing changes).
    void grow_to(uint64_t bytes, std::string_view what) {
        if (bytes <= bytes_) return;
        pool_.reserve(bytes - bytes_, what);
        bytes_ = bytes;
    }
    uint64_t bytes() const { return bytes_; }

private:
    memory::Pool& pool_;
    uint64_t bytes_ = 0;
};

// Activations for a batch of tokens; vectors only grow, and their capacity is charged to a pool
// before they do.
struct Activations {
    explicit Activations(memory::Pool& pool) : charge(pool) {}

    std::vector<float> x, cur, q, k, v, attn, gate, up;
    std::vector<kv::SeqId> seq0;  // sequence ids for a batch that gives none: all 0
    GrowingCharge charge;

    void reserve(const Hparams& hp, int n_tok) {
        const auto n = static_cast<size_t>(n_tok);
        const std::pair<std::vector<float>*, int64_t> buffers[] = {
            {&x, hp.n_embd},
            {&cur, hp.n_embd},
            {&q, int64_t{hp.n_head} * hp.head_dim},
            {&k, int64_t{hp.n_head_kv} * hp.head_dim},
            {&v, int64_t{hp.n_head_kv} * hp.head_dim_v},
            {&attn, int64_t{hp.n_head} * hp.head_dim_v},
            {&gate, hp.n_ff},
            {&up, hp.n_ff},
        };
        uint64_t bytes = std::max(seq0.capacity(), n) * sizeof(kv::SeqId);
        for (const auto& [b, row] : buffers)
            bytes += std::max(b->capacity(), n * static_cast<size_t>(row)) * sizeof(float);
        if (bytes > charge.bytes()) charge.grow_to(bytes, "activations of a " + std::to_string(n_tok) + "-token batch");
        for (const auto& [b, row] : buffers) grow(*b, n * static_cast<size_t>(row));
        if (seq0.size() < n) {
            seq0.reserve(n);  // exactly n: what was charged
            seq0.assign(n, 0);
        }
    }

private:
    static void grow(std::vector<float>& b, size_t n) {
        if (b.size() >= n) return;
        std::vector<float>().swap(b);  // contents are per batch: free before allocating
        b.reserve(n);
        b.resize(n);
    }
};

// A layer's weights for one step of a forward pass: the mapped ones of a resident layer, or a copy
// of a streamed layer's views pointing into the stream buffer that holds it (leased until the
// LayerRef goes). Layer types list their pointers in for_each_weight() (weights.h).
template <class Layer>
class LayerRef {
public:
    explicit LayerRef(const Layer& resident) : resident_(&resident) {}
    LayerRef(const Layer& mapped, LayerStream::Lease lease) : lease_(std::move(lease)), copy_(mapped) {
        for_each_weight(copy_, [this](auto& pointer) { pointer = lease_.translate(pointer); });
    }
    const Layer& operator*() const { return resident_ ? *resident_ : copy_; }
    const Layer* operator->() const { return &**this; }

private:
    const Layer* resident_ = nullptr;
    LayerStream::Lease lease_;
    Layer copy_{};
};

// What a decoder-only model works in besides its weights: the device it charges (the caller's, or
// an unbounded one of its own), activations and op scratch charged to its "scratch" pool, and the
// stream of its last layers (stream buffers charged to "staging"). Not movable (the scratch's
// charge refers to it).
class DecoderMemory {
public:
    DecoderMemory(const gguf::GgufFile& file, const Hparams& hp, const LoadOptions& options)
        : own_device_(options.device ? nullptr : std::make_unique<memory::Device>("model", UINT64_MAX)),
          device_(options.device ? *options.device : *own_device_),
          a(device_.pool(memory::pool_names::kScratch)),
          scratch_charge_(device_.pool(memory::pool_names::kScratch)) {
        scratch.on_grow([this](size_t, size_t bytes) { scratch_charge_.grow_to(bytes, "op scratch"); });
        if (options.n_streamed_layers > 0) {
            stream_ =
                std::make_unique<LayerStream>(file, hp.n_layer - options.n_streamed_layers, hp.n_layer,
                                              device_.pool(memory::pool_names::kStaging), options.stream_direct_io);
        }
    }
    DecoderMemory(const DecoderMemory&) = delete;
    DecoderMemory& operator=(const DecoderMemory&) = delete;

    // Layer il of `layers` for this step of the pass: streamed layers wait for their buffer.
    template <class Layer>
    LayerRef<Layer> layer(const std::vector<Layer>& layers, int il) {
        const Layer& mapped = layers[static_cast<size_t>(il)];
        if (stream_ && il >= stream_->first_layer()) return LayerRef<Layer>(mapped, stream_->acquire(il));
        return LayerRef<Layer>(mapped);
    }
    int n_streamed_layers() const { return stream_ ? stream_->n_layer() - stream_->first_layer() : 0; }
    std::vector<FileRange> streamed_ranges() const { return stream_ ? stream_->ranges() : std::vector<FileRange>{}; }

private:
    std::unique_ptr<memory::Device> own_device_;
    memory::Device& device_;

public:
    Activations a;
    ops::Scratch scratch;

private:
    GrowingCharge scratch_charge_;
    std::unique_ptr<LayerStream> stream_;
};

// A checked batch: n tokens with a position and a sequence id each.
struct BatchRows {
    int n = 0;
    const int32_t* positions = nullptr;
    const kv::SeqId* seq_ids = nullptr;
};

// Throws std::invalid_argument unless the batch has tokens, one position per token, one sequence
// id per token (or none) and one output flag per token (or none).
inline void check_batch(const Hparams& hp, const Batch& b) {
    const size_t n = b.tokens.size();
    const auto bad = [&](const std::string& what) {
        throw std::invalid_argument(hp.arch + " forward: " + std::to_string(n) + " tokens but " + what);
    };
    if (n == 0) bad("a batch needs at least one");
    if (b.positions.size() != n) bad(std::to_string(b.positions.size()) + " positions");
    if (!b.seq_ids.empty() && b.seq_ids.size() != n) bad(std::to_string(b.seq_ids.size()) + " sequence ids");
    if (!b.all_logits && !b.output.empty() && b.output.size() != n) {
        bad(std::to_string(b.output.size()) + " output flags");
    }
}

// Before a batch: checks it, applies the cache's pending K shifts (rope_for(il) gives layer il's
// RoPE parameters; K is rotated by each cell's delta), and places the batch's tokens in the cache.
// Throws kv::KvCacheError (from place) when they do not fit.
template <class RopeFor>
BatchRows begin_batch(const Hparams& hp, const Batch& b, kv::ModelCache& cache, Activations& a, RopeFor&& rope_for) {
    check_batch(hp, b);
    const int n = static_cast<int>(b.tokens.size());
    a.reserve(hp, n);
    if (cache.has_k_shift()) {
        for (int il = 0; il < hp.n_layer; ++il) {
            const ops::RopeParams rope = rope_for(il);
            cache.pool(cache.pool_of(il))
                .apply_k_shift(cache.index_in_pool(il), [&](float* k_rows, const int32_t* deltas, int n_rows) {
                    ops::rope(k_rows, deltas, n_rows, hp.n_head_kv, hp.head_dim, rope);
                });
        }
        cache.clear_k_shift();
    }
    BatchRows rows{n, b.positions.data(), b.seq_ids.empty() ? a.seq0.data() : b.seq_ids.data()};
    cache.place(std::span<const kv::SeqId>(rows.seq_ids, static_cast<size_t>(n)), b.positions);
    return rows;
}

// Writes the batch's K ([n, n_head_kv * head_dim]) and V rows of model layer il into its pool.
inline void store_kv(kv::ModelCache& cache, int il, const float* k, const float* v) {
    const int p = cache.pool_of(il);
    cache.pool(p).store(cache.index_in_pool(il), cache.cells(p), k, v);
}

// Attention of the batch's queries q ([n, n_head, head_dim]) over layer il of the cache, which
// already holds the batch's K/V; each token sees the cells of its own sequence (ops::attention_kv;
// with an f16 cache, llama.cpp's flash-attention arithmetic). out: [n, n_head * head_dim_v].
// window > 0 limits each query to the last `window` positions.
inline void attend(const Hparams& hp, const kv::ModelCache& cache, int il, const float* q, const BatchRows& rows,
                   float scale, int window, float* out, ops::ThreadPool& pool, ops::Scratch& scratch) {
    ops::AttentionParams ap;
    ap.n_head = hp.n_head;
    ap.n_head_kv = hp.n_head_kv;
    ap.head_dim = hp.head_dim;
    ap.scale = scale;
    ap.sliding_window = window;
    cache.will_attend(il);  // a spilled cache brings this layer in and reads the next one ahead
    ops::attention_kv(q, rows.positions, rows.seq_ids, rows.n, cache.pool(cache.pool_of(il)), cache.index_in_pool(il),
                      ap, out, pool, scratch);
}

// The rows of x ([n, n_embd]) that want logits, normed into cur (compacted, batch order); returns
// how many.
inline int output_rows(const Hparams& hp, const Batch& b, const float* x, const float* output_norm, float* cur) {
    const int n = static_cast<int>(b.tokens.size());
    const int64_t E = hp.n_embd;
    if (b.all_logits) {
        ops::rms_norm(x, output_norm, hp.norm_eps, n, E, cur);
        return n;
    }
    if (b.output.empty()) {
        ops::rms_norm(x + (n - 1) * E, output_norm, hp.norm_eps, 1, E, cur);
        return 1;
    }
    int n_out = 0;
    for (int t = 0; t < n; ++t) {
        if (b.output[static_cast<size_t>(t)] == 0) continue;
        ops::rms_norm(x + t * E, output_norm, hp.norm_eps, 1, E, cur + n_out * E);
        ++n_out;
    }
    return n_out;
}

}  // namespace fitllm::model
