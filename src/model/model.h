#pragma once
// A loaded model: hyper-parameters, weights bound to the mapped file, and a forward pass over a
// batch of tokens that may belong to several sequences, reading and writing a kv::ModelCache.
//
//   const auto file = gguf::GgufFile::open(path);
//   auto model = model::Model::load(file);  // file must outlive model
//   kv::ModelCache cache = model->make_cache({.n_cells = 2048, .n_seq_max = 2}, /*n_batch=*/512);
//   model->forward({.tokens = ids, .positions = pos, .seq_ids = seqs}, cache, logits.data(), pool);
//
// Under a memory budget, charge its working memory to a device and stream the last layers:
//
//   memory::Device host("host", budget_bytes);
//   auto model = model::Model::load(file, {.device = &host, .n_streamed_layers = 6});
//   engine::prefault(file, *model);  // the resident part only; streamed layers stay on disk
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "fitllm/config.h"
#include "gguf/gguf_reader.h"
#include "kv/cache.h"
#include "model/hparams.h"
#include "model/tensor_override.h"
#include "ops/thread_pool.h"

namespace fitllm::memory {
class Device;
class Pool;
}  // namespace fitllm::memory

namespace fitllm::backend {
class Backend;
}

namespace fitllm::model {

struct LoadOptions {
    // The device whose pools the model charges its working memory to: "scratch" for activations
    // and op scratch (as they grow, at the first forward pass of a bigger batch), "staging" for
    // the stream buffers (at load). A charge that does not fit throws memory::BudgetError before
    // anything is allocated. nullptr: a device of the model's own, without a limit. The device
    // must outlive the model. Mapped weights are not charged here.
    memory::Device* device = nullptr;
    // The last n layers (0..n_layer) are read from the file at every forward pass into
    // kStreamBuffers staging buffers (model/layer_stream.h) instead of staying mapped; the first
    // n_layer - n stay resident. Same logits either way.
    int n_streamed_layers = 0;
    // Stream with O_DIRECT where the filesystem allows; false: buffered reads, whose page cache
    // is dropped after each read (POSIX_FADV_DONTNEED).
    bool stream_direct_io = true;
    // Layers on a device (docs/architecture.md, idea 6; llama.cpp's -ngl): the last n_offload_layers layers
    // run on `offload` (backend/backend.h; open_device("virtual" | "cuda0", capacity)); more than
    // n_layer also puts the output layer (output norm and matrix) there; the token embedding stays
    // on the host. Their weights are copied to the device at load (its "weights" pool) and their
    // mapped pages given back; activations cross once into the device and once out per pass.
    // offload_kv: their K/V live in the device's memory (its "kv" pool; make_cache groups the
    // pools by device); false: in the host's pools, attended by the device. Streamed layers must
    // be among those left on the host. What each device is charged: backend/backend.h, end.
    // The device must outlive the model (and the caches it makes).
    backend::Backend* offload = nullptr;
    int n_offload_layers = 0;
    bool offload_kv = true;
    // Tensors of offloaded layers kept in host memory (model/tensor_override.h; llama.cpp's -ot,
    // --cpu-moe): an offloaded layer splits at its routed experts, which then run on the host
    // (model/offload.h, experts_on_host). Empty: whole layers on the device.
    std::vector<TensorOverride> tensor_overrides;
    // A mixture-of-experts model's routed experts in an expert cache of this many slots
    // (model/expert_cache.h; at least min_expert_slots()), charged to the device's "experts" pool
    // and filled from the file on demand (with O_DIRECT where stream_direct_io and the filesystem
    // allow); the dense weights stay mapped. 0: every expert mapped and resident. Same logits
    // either way. Not with streamed or offloaded layers.
    int expert_slots = 0;
    // With an expert cache, one token at a time: read ahead the experts the next layer's router
    // would choose from the current hidden state (model/expert_cache.h).
    bool expert_prefetch = true;
    // Which slot a full expert cache gives up (fitllm/config.h).
    ExpertEvict expert_evict = ExpertEvict::lfu;
};

// What an expert cache did so far (Model::expert_cache_stats); n_slots 0: the model has none.
struct ExpertCacheStats {
    int n_slots = 0;
    uint64_t slot_bytes = 0;
    uint64_t hits = 0, misses = 0;  // expert lookups: found in a slot, read from the file
    uint64_t bytes_read = 0;        // from the file, O_DIRECT block rounding included
    uint64_t tokens = 0;            // tokens that went through the experts (all layers count once)
    uint64_t prefetched = 0;        // experts read ahead (prefetch), in bytes_read
    uint64_t prefetch_used = 0;     // of them, got before they were evicted (hits)
    bool direct_io = false;         // reads bypass the page cache (false: buffered, cache dropped after)
    ExpertEvict evict = ExpertEvict::lru;
    // The routing as the lookups saw it: of all lookups, the share that went to each layer's most
    // looked-up fifth of its experts (0.2 for uniform routing over many tokens).
    double top_fifth_share = 0.0;
    double hit_rate() const { return hits + misses == 0 ? 0.0 : double(hits) / double(hits + misses); }
    double bytes_per_token() const { return tokens == 0 ? 0.0 : double(bytes_read) / double(tokens); }
};

// Bytes [offset, offset + length) of a file.
struct FileRange {
    uint64_t offset = 0;
    uint64_t length = 0;
};

// Tokens for one forward pass. Token i belongs to sequence seq_ids[i] at position positions[i];
// a batch may mix sequences (their tokens only see their own sequence's cells).
struct Batch {
    std::span<const int32_t> tokens;
    std::span<const int32_t> positions;  // one per token
    std::span<const kv::SeqId> seq_ids;  // one per token; empty: every token is in sequence 0
    // Which rows want logits: one flag per token (nonzero: yes); empty: only the last token.
    // Ignored when all_logits.
    std::span<const uint8_t> output;
    bool all_logits = false;  // every token's logits
    // Every row in the arithmetic of a one-token batch: each row's logits are those feeding the
    // tokens one at a time gives, bit for bit (speculative decoding verifies drafts with this, so
    // that greedy output does not depend on how many drafts a pass carries). Off: a prompt's
    // rows take llama.cpp's batch kernels where they are faster (ops::matmul's token places).
    bool token_order = false;
    // One flag per token (nonzero: that row in the one-token arithmetic, as token_order puts every
    // row), or empty: none. The scheduler's drafts (engine/scheduler.h) in a batch whose prompt
    // chunks keep the batch kernels.
    std::span<const uint8_t> token_order_rows;
    // > 0 (and below n_vocab): only tokens 0 .. n_vocab_out - 1 are scored, the rest of each row of
    // logits is -infinity: a draft model's cheaper output layer (engine::DraftParams::n_vocab).
    // Ignored when the output layer runs on an offload device.
    int n_vocab_out = 0;
};

class Model {
public:
    virtual ~Model() = default;

    // Reads the hyper-parameters and binds the weights of a supported architecture. The model
    // keeps views into `file`, which must outlive it. Throws ModelError naming the key or tensor,
    // std::invalid_argument for n_streamed_layers outside 0..n_layer, memory::BudgetError when the
    // stream buffers do not fit the device, io::IoError when the file cannot be opened to stream.
    static std::unique_ptr<Model> load(const gguf::GgufFile& file, const LoadOptions& options = {});

    virtual const Hparams& hparams() const = 0;
    int n_vocab() const { return hparams().n_vocab; }

    // The number of streamed layers (the last ones), and their tensors' bytes in the file: never
    // touched through the mapping (engine::prefault skips them). Empty when none stream.
    virtual int n_streamed_layers() const = 0;
    virtual std::vector<FileRange> streamed_ranges() const = 0;
    // The tensors copied to the offload device, whose mapped pages were given back: prefault
    // leaves them alone too (the token embedding, which the host still reads, is not among them).
    virtual std::vector<FileRange> offloaded_ranges() const { return {}; }
    // The expert cache's counters (LoadOptions::expert_slots); all 0 without one.
    virtual ExpertCacheStats expert_cache_stats() const { return {}; }

    // Where each layer's K/V lives, for make_cache(): layer_device[il] 1 for the layers whose K/V
    // is on the offload device (with offload_kv), else 0; `device` is that device (nullptr: none).
    struct CachePlacement {
        std::vector<int> layer_device;
        backend::Backend* device = nullptr;
        std::vector<int> device_layers;  // layers the device runs (its K/V on the host or not)
    };
    virtual CachePlacement cache_placement() const { return {}; }

    // A cache shaped for this model: params.n_cells tokens (all sequences together) in the pool
    // of the full-attention layers; the sliding-window layers (Gemma 3's local ones) in a pool
    // of their own that holds only their window (kv::ModelCache), for batches of at most n_batch
    // tokens. params.window is ignored. Throws std::invalid_argument for bad parameters.
    // With layers offloaded and offload_kv, their K/V goes in pools of their own charged to the
    // device's "kv" pool (kv::ModelCache, layer_device), and memory::BudgetError when it has no
    // room; params.pool is the host's. The device mirrors those pools until the cache goes
    // (Backend::attach_kv / detach_kv): it must outlive the cache.
    kv::ModelCache make_cache(const kv::CacheParams& params, int n_batch) const;
    // The per-layer shapes and windows make_cache() uses.
    std::vector<kv::LayerShape> cache_layers() const;
    std::vector<int> cache_windows() const;

    // Runs a batch through the model. First applies the K shifts the cache has pending (from
    // seq_add / seq_div: K re-rotated with each layer's RoPE), then places the batch's tokens in
    // the cache (kv::KvCacheError when they do not fit: nothing changes), and after the pass
    // trims the sliding-window pools (cache.end_batch()).
    // logits_out receives n_vocab floats per row that wants logits, in batch order (token-major):
    // the last token's only by default, every token's with all_logits, or the flagged ones.
    // Working memory is kept between calls and only grows, so repeated calls with at most as many
    // tokens allocate nothing. Not thread-safe. Throws std::invalid_argument for a malformed
    // batch (sizes differ, no tokens, a sequence id outside the cache's range).
    virtual void forward(const Batch& batch, kv::ModelCache& cache, float* logits_out, ops::ThreadPool& pool) = 0;

    // One sequence (0): `tokens` at `positions`, the last token's logits or all of them.
    void forward(std::span<const int32_t> tokens, std::span<const int32_t> positions, kv::ModelCache& cache,
                 float* logits_out, bool all_logits, ops::ThreadPool& pool) {
        forward(Batch{.tokens = tokens, .positions = positions, .all_logits = all_logits}, cache, logits_out, pool);
    }
};

}  // namespace fitllm::model
