#pragma once
// Pieces the decoder-only forward passes (gemma.cpp, llama.cpp, phi3.cpp) share: their base class, working memory
// (charged to a device), the streamed layers, the layers on an offload device (Exec: the ops of a
// layer wherever it runs; activations cross at the first device layer and before the output), the
// checks and cache bookkeeping around a batch (K shifts, placing, window trimming), attention over
// the KV cache, and the output rows. Internal to model/.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "kv/cache.h"
#include "memory/device.h"
#include "memory/pool.h"
#include "model/activations.h"
#include "model/expert_cache.h"
#include "model/hparams.h"
#include "model/layer_stream.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/offload.h"
#include "ops/activation.h"
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

// Activations for a batch of tokens, laid out as model/activations.h says; vectors only grow, and
// their capacity is charged to a pool before they do.
struct Activations {
    explicit Activations(memory::Pool& pool) : charge(pool) {}

    std::vector<float> x, cur, work;
    std::vector<kv::SeqId> seq0;  // sequence ids for a batch that gives none: all 0
    // Where each token sits in its sequence's run (token_places): of the batch's tokens, of the
    // rows that want logits (whose sequence ids out_seq holds). Not charged: 20 bytes a token, which
    // the planner's fixed overhead covers (memory/plan.cpp plans the charged activations exactly).
    std::vector<ops::TokenPlace> places, out_places;
    std::vector<kv::SeqId> out_seq;
    GrowingCharge charge;

    void reserve(const Hparams& hp, int n_tok) {
        const auto n = static_cast<size_t>(n_tok);
        const ActivationLayout l = activation_layout(hp, n_tok);
        const std::pair<std::vector<float>*, uint64_t> buffers[] = {{&x, l.x}, {&cur, l.cur}, {&work, l.work}};
        uint64_t bytes = std::max(seq0.capacity(), n) * sizeof(kv::SeqId);
        for (const auto& [b, floats] : buffers) bytes += std::max<uint64_t>(b->capacity(), floats) * sizeof(float);
        if (bytes > charge.bytes()) charge.grow_to(bytes, "activations of a " + std::to_string(n_tok) + "-token batch");
        for (const auto& [b, floats] : buffers) grow(*b, static_cast<size_t>(floats));
        if (seq0.size() < n) {
            seq0.reserve(n);  // exactly n: what was charged
            seq0.assign(n, 0);
        }
        if (places.size() < n) places.resize(n), out_places.resize(n), out_seq.resize(n);
    }

private:
    static void grow(std::vector<float>& b, size_t n) {
        if (b.size() >= n) return;
        std::vector<float>().swap(b);  // contents are per batch: free before allocating
        b.reserve(n);
        b.resize(n);
    }
};

// A checked batch: n tokens with a position and a sequence id each (host memory).
using BatchRows = backend::BatchRows;

// Activations on the offload device, a Buffer per activation of the whole batch (none shared as
// the host's are; charged to its "scratch" pool; freed, then allocated, when a bigger batch
// comes), and the logits rows when the output
// layer is there (grown the same way to the most rows that wanted logits). model::
// device_scratch_bytes() is what they hold. With routed experts on the device (experts), their
// buffers for one FFN slice too (model/moe.h DeviceMoeBuffers).
struct DeviceActivations {
    backend::Buffer x, cur, q, k, v, attn, gate, up, logits;
    backend::Buffer moe_in, moe_gate, moe_up, moe_outs;
    int n_tok = 0, n_logits = 0;

    void reserve(backend::Backend& dev, const Hparams& hp, int n, bool experts = false) {
        if (n <= n_tok) return;
        const int64_t slice = experts && hp.is_moe() ? std::min(ffn_slice_tokens(n), n) : 0;
        const std::pair<backend::Buffer*, int64_t> buffers[] = {
            {&x, int64_t{n} * hp.n_embd},
            {&cur, int64_t{n} * hp.n_embd},
            {&q, int64_t{n} * hp.n_head * hp.head_dim},
            {&k, int64_t{n} * hp.n_head_kv * hp.head_dim},
            {&v, int64_t{n} * hp.n_head_kv * hp.head_dim_v},
            {&attn, int64_t{n} * hp.n_head * hp.head_dim_v},
            {&gate, int64_t{n} * hp.n_ff},
            {&up, int64_t{n} * hp.n_ff},
            {&moe_in, slice * hp.n_embd},
            {&moe_gate, slice * hp.n_ff_exp},
            {&moe_up, slice * hp.n_ff_exp},
            {&moe_outs, slice * hp.n_expert_used * hp.n_embd},
        };
        for (const auto& [b, floats] : buffers) b->reset();
        n_tok = 0;
        const std::string what = "activations of a " + std::to_string(n) + "-token batch";
        for (const auto& [b, floats] : buffers)
            *b = dev.alloc(memory::pool_names::kScratch, static_cast<size_t>(floats) * sizeof(float), what);
        n_tok = n;
    }
    DeviceMoeBuffers moe() const { return {moe_in.f32(), moe_gate.f32(), moe_up.f32(), moe_outs.f32()}; }
    float* logits_rows(backend::Backend& dev, const Hparams& hp, int n_rows) {
        if (n_rows > n_logits) {
            logits.reset();
            n_logits = 0;
            logits = dev.alloc(memory::pool_names::kScratch,
                               static_cast<size_t>(n_rows) * static_cast<size_t>(hp.n_vocab) * sizeof(float),
                               "logits of " + std::to_string(n_rows) + " rows");
            n_logits = n_rows;
        }
        return logits.f32();
    }
};

// Host rows for an offloaded layer's matmul whose weight stays on the host (Placement::host_matrices):
// the input rows copied from the device, and the product before it goes back. They are the host's
// activations x and work (idle while the device runs the layer, already planned and charged; cur
// is left alone: a mixture-of-experts block's rows cross there), the smaller of the two that fits
// each; rows that fit neither take `extra`, charged to the host's "scratch" pool as it grows (none
// of the architectures' matmuls needs it: x holds n_embd floats a token, work the widest product).
class HostStaging {
public:
    explicit HostStaging(memory::Pool& pool) : charge_(pool) {}
    // In and out rows of n_in and n_out floats, distinct.
    std::pair<float*, float*> rows(Activations& a, size_t n_in, size_t n_out) {
        std::vector<float>* bufs[] = {&a.x, &a.work};
        std::sort(std::begin(bufs), std::end(bufs),
                  [](const std::vector<float>* l, const std::vector<float>* r) { return l->size() < r->size(); });
        std::vector<float>* in = nullptr;
        for (std::vector<float>* b : bufs) {
            if (in == nullptr && b->size() >= n_in) in = b;
        }
        std::vector<float>* out = nullptr;
        for (std::vector<float>* b : bufs) {
            if (out == nullptr && b != in && b->size() >= n_out) out = b;
        }
        float* in_rows = in ? in->data() : grow(n_in + (out ? 0 : n_out));
        float* out_rows = out ? out->data() : in ? grow(n_out) : in_rows + n_in;
        return {in_rows, out_rows};
    }
    uint64_t extra_bytes() const { return charge_.bytes(); }

private:
    float* grow(size_t floats) {
        if (extra_.size() < floats) {
            charge_.grow_to(floats * sizeof(float), "host rows of a device layer's host matmul");
            std::vector<float>().swap(extra_);
            extra_.resize(floats);
        }
        return extra_.data();
    }
    std::vector<float> extra_;
    GrowingCharge charge_;
};

// The ops of one layer on the device that runs it: the host (ops::, with the forward pass's
// threads and scratch) or the offload device (backend::Backend). x .. up are that device's
// activations; on the host several share memory (model/activations.h), so a pass uses them in
// this order: cur = norm(x); q, k, v from cur; attn from q (attn may be cur); attn_out from attn
// (attn_out may be q); x += attn_out; cur = norm(x); then per FFN slice of ffn_slice tokens, gate
// and up (one slice's rows) from cur's rows, and the slice's output written over those rows.
// One branch per op call; the host path calls the same ops:: as before.
class Exec {
public:
    float *x = nullptr, *cur = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *attn = nullptr, *attn_out = nullptr,
          *gate = nullptr, *up = nullptr;
    int ffn_slice = 1;  // tokens per FFN slice (model::ffn_slice_tokens)

    bool on_device() const { return dev_ != nullptr; }

    // places: the n tokens' places in their runs (ops::matmul; the virtual device follows them,
    // devices with kernels of their own ignore them).
    // On the device, a weight the placement keeps on the host (DeviceWeights::on_host) is multiplied
    // there: the n input rows go to the host, the host's kernels (its threads and scratch) run, and
    // the product comes back.
    void matmul(const ops::WeightView& w, const float* in, int n, float* out, std::span<const ops::TokenPlace> places) {
        if (dev_) {
            if (!weights_->on_host(w.data)) return dev_->matmul_in_runs(w, in, n, out, places);
            const size_t n_in = static_cast<size_t>(n) * static_cast<size_t>(w.cols);
            const size_t n_out = static_cast<size_t>(n) * static_cast<size_t>(w.rows);
            const auto [host_in, host_out] = staging_->rows(*host_a_, n_in, n_out);
            dev_->copy_to_host(host_in, in, n_in * sizeof(float));
            ops::matmul(w, host_in, n, host_out, *pool_, *scratch_, places);
            return dev_->copy_to_device(out, host_out, n_out * sizeof(float));
        }
        ops::matmul(w, in, n, out, *pool_, *scratch_, places);
    }
    void rms_norm(const float* in, const float* weight, float eps, int64_t n_rows, int64_t n, float* out) {
        if (dev_) return dev_->rms_norm(in, weight, eps, n_rows, n, out);
        ops::rms_norm(in, weight, eps, n_rows, n, out);
    }
    // RopeParams with n_dims 0 (a layer without rotary embeddings): nothing to do.
    void rope(float* rows, const int32_t* pos, int64_t n, int n_head, int head_dim, const ops::RopeParams& p) {
        if (p.n_dims == 0) return;
        if (dev_) return dev_->rope(rows, pos, n, n_head, head_dim, on_device(p));
        ops::rope(rows, pos, n, n_head, head_dim, p);
    }
    void add(const float* a, const float* b, int64_t n, float* y) {
        if (dev_) return dev_->add(a, b, n, y);
        ops::add(a, b, n, y);
    }
    void add_bias(float* rows, const float* bias, int64_t n_tok, int64_t n) {
        if (dev_) return dev_->add_bias(rows, bias, n_tok, n);
        ops::add_bias(rows, bias, n_tok, n);
    }
    void scale(float* rows, int64_t n, float s) {
        if (dev_) return dev_->scale(rows, n, s);
        ops::scale(rows, n, s);
    }
    void swiglu(const float* g, const float* u, int64_t n, float* y) {
        if (dev_) return dev_->swiglu(g, u, n, y);
        ops::swiglu(g, u, n, y);
    }
    void geglu(const float* g, const float* u, int64_t n, float* y) {
        if (dev_) return dev_->geglu(g, u, n, y);
        ops::geglu(g, u, n, y);
    }
    void softcap(float* rows, int64_t n, float cap) {
        if (dev_) return dev_->softcap(rows, n, cap);
        ops::softcap(rows, n, cap);
    }
    void copy(const float* in, int64_t n, float* out) {
        if (dev_) return dev_->copy_on_device(out, in, static_cast<size_t>(n) * sizeof(float));
        std::memcpy(out, in, static_cast<size_t>(n) * sizeof(float));
    }

    // Writes the batch's K ([n, n_head_kv * head_dim]) and V rows of model layer il into its pool.
    // Until the pool's K transform is fitted (kv::KvCache::calibrate_keys), the batch's K and Q
    // after RoPE (q_rows: [n, n_head * head_dim]) calibrate it first, where they are in host memory
    // (a device that holds K/V itself calibrates from its own copies).
    void store_kv(kv::ModelCache& cache, int il, const float* k_rows, const float* v_rows, const float* q_rows,
                  const BatchRows& rows, const Hparams& hp, const ops::RopeParams& rope) {
        const int p = cache.pool_of(il);
        kv::KvCache& pool = cache.pool(p);
        const int layer = cache.index_in_pool(il);
        if (pool.needs_key_calibration(layer) && (dev_ == nullptr || !dev_->holds_kv_storage())) {
            pool.calibrate_keys(layer, kv::KeySample{.k = k_rows,
                                                     .q = q_rows,
                                                     .pos = rows.positions,
                                                     .n_rows = rows.n,
                                                     .n_head_q = hp.n_head,
                                                     .rope = ops::rope_frame(rope, hp.head_dim)});
        }
        if (dev_) return dev_->kv_store(pool, layer, cache.cells(p), k_rows, v_rows);
        pool.store(layer, cache.cells(p), k_rows, v_rows);
    }

    // Re-rotates K of layer il by its pending shift (kv::KvCache::apply_k_shift): a rotation only,
    // K carries the YaRN / LongRoPE magnitude of its first rotation already.
    void k_shift(kv::ModelCache& cache, const Hparams& hp, int il, const ops::RopeParams& layer_rope) {
        if (layer_rope.n_dims == 0) return;  // K of a layer without rotary embeddings does not move
        const ops::RopeParams rope = ops::rotation_only(layer_rope);
        kv::KvCache& pool = cache.pool(cache.pool_of(il));
        if (dev_) return dev_->kv_shift(pool, cache.index_in_pool(il), on_device(rope));
        pool.apply_k_shift(cache.index_in_pool(il), [&](float* k_rows, const int32_t* deltas, int n_rows) {
            ops::rope(k_rows, deltas, n_rows, hp.n_head_kv, hp.head_dim, rope);
        });
    }

    void attention(const float* q_rows, const BatchRows& rows, const kv::KvCache& pool, int layer,
                   const ops::AttentionParams& ap, float* out) {
        if (dev_) return dev_->attention(q_rows, rows, pool, layer, ap, out);
        ops::attention_kv(q_rows, rows.positions, rows.seq_ids, rows.n, pool, layer, ap, out, *pool_, *scratch_);
    }

private:
    friend class DecoderMemory;
    // Shared tensors the device copied (rope_freqs) are looked up by their mapped address.
    ops::RopeParams on_device(ops::RopeParams p) const {
        p.freq_factors = weights_->on_device(p.freq_factors);
        return p;
    }
    backend::Backend* dev_ = nullptr;
    const DeviceWeights* weights_ = nullptr;
    ops::ThreadPool* pool_ = nullptr;  // the host's, for its ops (and a device layer's host matmuls)
    ops::Scratch* scratch_ = nullptr;
    Activations* host_a_ = nullptr;  // a device layer's host matmuls: their rows (HostStaging)
    HostStaging* staging_ = nullptr;
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
// an unbounded one of its own), activations and op scratch charged to its "scratch" pool, the
// stream of its last host layers (stream buffers charged to "staging"), and the layers on the
// offload device (their weights, activations, and the crossings). Not movable (the scratch's
// charge refers to it).
class DecoderMemory {
public:
    // Throws std::invalid_argument for a placement place_layers() refuses, memory::BudgetError when
    // the stream buffers or the device's weights do not fit.
    DecoderMemory(const gguf::GgufFile& file, const Hparams& hp, const LoadOptions& options)
        : own_device_(options.device ? nullptr : std::make_unique<memory::Device>("model", UINT64_MAX)),
          device_(options.device ? *options.device : *own_device_),
          placement_(place_layers(file, hp, options)),
          a(device_.pool(memory::pool_names::kScratch)),
          scratch_charge_(device_.pool(memory::pool_names::kScratch)),
          staging_(device_.pool(memory::pool_names::kScratch)) {
        scratch.on_grow([this](size_t, size_t bytes) { scratch_charge_.grow_to(bytes, "op scratch"); });
        if (options.n_streamed_layers > 0) {
            const int end = placement_.first_device_layer;
            stream_ =
                std::make_unique<LayerStream>(file, end - options.n_streamed_layers, end,
                                              device_.pool(memory::pool_names::kStaging), options.stream_direct_io);
        }
        if (placement_.device) device_weights_ = DeviceWeights(file, hp, placement_);
        for (int il = placement_.first_device_layer; placement_.device && hp.is_moe() && il < hp.n_layer; ++il)
            device_experts_ = device_experts_ || !placement_.host_experts(il);
        if (options.expert_slots > 0) {
            // The cache's slots are host memory read by the host's expert FFN: neither a streamed
            // layer's buffer nor an offloaded layer (its experts copied to the device, or kept mapped
            // on the host by --cpu-moe) reads its experts through it.
            if (options.n_streamed_layers > 0 || placement_.device) {
                throw std::invalid_argument(
                    file.source() + ": an expert cache (--expert-cache) does not go with " +
                    (options.n_streamed_layers > 0
                         ? std::string("streamed layers")
                         : "layers offloaded to " + placement_.device->name() +
                               (device_experts_ ? " with their routed experts" : " (their experts kept on the host)")));
            }
            experts_ = std::make_unique<ExpertCache>(
                file, hp, options.expert_slots, device_.pool(memory::pool_names::kExperts), options.stream_direct_io,
                options.expert_prefetch, options.expert_evict);
        }
    }
    DecoderMemory(const DecoderMemory&) = delete;
    DecoderMemory& operator=(const DecoderMemory&) = delete;

    // Points the weights of the device's layers (and of the output layer when it is there) at the
    // device's copies. Call once, after binding.
    template <class Weights>
    void place_weights(Weights& w) {
        if (!placement_.device) return;
        for (size_t il = static_cast<size_t>(placement_.first_device_layer); il < w.layers.size(); ++il) {
            for_each_weight(w.layers[il], [this](auto& pointer) { pointer = device_weights_.on_device(pointer); });
        }
        if (placement_.output_on_device) {
            w.output_norm = device_weights_.on_device(w.output_norm);
            w.output.data = device_weights_.on_device(w.output.data);
        }
    }

    // Layer il of `layers` for this step of the pass: streamed layers wait for their buffer.
    template <class Layer>
    LayerRef<Layer> layer(const std::vector<Layer>& layers, int il) {
        const Layer& mapped = layers[static_cast<size_t>(il)];
        if (stream_ && il >= stream_->first_layer() && il < stream_->n_layer())
            return LayerRef<Layer>(mapped, stream_->acquire(il));
        return LayerRef<Layer>(mapped);
    }
    int n_streamed_layers() const { return stream_ ? stream_->n_layer() - stream_->first_layer() : 0; }
    // The streamed layers' ranges, and the experts' when an expert cache reads them.
    std::vector<FileRange> streamed_ranges() const {
        std::vector<FileRange> r = stream_ ? stream_->ranges() : std::vector<FileRange>{};
        if (experts_) {
            for (const FileRange& e : experts_->ranges()) r.push_back(e);
        }
        return r;
    }
    // The expert cache (LoadOptions::expert_slots), or nullptr.
    ExpertCache* experts() { return experts_.get(); }
    ExpertCacheStats expert_stats() const { return experts_ ? experts_->stats() : ExpertCacheStats{}; }
    std::vector<FileRange> offloaded_ranges() const { return device_weights_.ranges(); }
    const Placement& placement() const { return placement_; }
    Model::CachePlacement cache_placement(const Hparams& hp) const {
        Model::CachePlacement c;
        if (!placement_.device) return c;
        c.device = placement_.device;
        c.layer_device = cache_layer_devices(hp, hp.n_layer - placement_.first_device_layer, placement_.kv_on_device);
        for (int il = placement_.first_device_layer; il < hp.n_layer; ++il) c.device_layers.push_back(il);
        return c;
    }

    // Before a batch of n tokens: sizes the activations (host, and the device's) and binds the
    // ops to this pass's threads. x starts on the host.
    void begin(const Hparams& hp, int n, ops::ThreadPool& pool) {
        a.reserve(hp, n);
        host_.pool_ = &pool;
        host_.scratch_ = &scratch;
        const ActivationLayout l = activation_layout(hp, n);
        float* work = a.work.data();
        host_.x = a.x.data(), host_.cur = a.cur.data(), host_.q = work, host_.k = work + l.k_offset;
        host_.v = work + l.v_offset, host_.attn = a.cur.data(), host_.attn_out = work;
        host_.gate = work, host_.up = work + l.up_offset;
        host_.ffn_slice = dev_ops_.ffn_slice = l.ffn_slice;
        n_tok_ = n;
        x_on_device_ = false;
        if (!placement_.device) return;
        backend::Backend& dev = *placement_.device;
        dev.use_threads(pool);
        da_.reserve(dev, hp, n, device_experts_);
        dev_ops_.dev_ = &dev;
        dev_ops_.weights_ = &device_weights_;
        dev_ops_.pool_ = &pool, dev_ops_.scratch_ = &scratch, dev_ops_.host_a_ = &a, dev_ops_.staging_ = &staging_;
        dev_ops_.x = da_.x.f32(), dev_ops_.cur = da_.cur.f32(), dev_ops_.q = da_.q.f32(), dev_ops_.k = da_.k.f32();
        dev_ops_.v = da_.v.f32(), dev_ops_.attn = da_.attn.f32(), dev_ops_.attn_out = da_.cur.f32();
        dev_ops_.gate = da_.gate.f32(), dev_ops_.up = da_.up.f32();
        row_floats_ = hp.n_embd;
    }
    // The ops for layer il, with x moved to the device at its first layer.
    Exec& enter(int il) {
        if (!placement_.on_device(il)) return host_;
        if (!x_on_device_) cross(/*to_device=*/true);
        return dev_ops_;
    }
    // The device's buffers for an offloaded layer's routed experts (device_experts()).
    DeviceMoeBuffers device_moe() const { return da_.moe(); }
    // Whether some offloaded layer runs its routed experts on the device.
    bool device_experts() const { return device_experts_; }
    // Rows of n floats between the device's activations and the host's (an offloaded layer whose
    // routed experts stay on the host: its FFN input goes there and the block's output comes back).
    void to_host(float* host, const float* dev, int64_t n) {
        placement_.device->copy_to_host(host, dev, static_cast<size_t>(n) * sizeof(float));
    }
    void to_device(float* dev, const float* host, int64_t n) {
        placement_.device->copy_to_device(dev, host, static_cast<size_t>(n) * sizeof(float));
    }
    // The ops of layer il, where x is not needed (K shifts).
    Exec& ops_of(int il) { return placement_.on_device(il) ? dev_ops_ : host_; }
    // The ops for the output layer, with x moved back to the host unless the output is on the device.
    Exec& enter_output() {
        if (placement_.output_on_device) {
            if (!x_on_device_) cross(true);
            return dev_ops_;
        }
        if (x_on_device_) cross(false);
        return host_;
    }
    // Where the output matmul writes n_out rows: logits_out, or the device's buffer (then
    // finish_logits()).
    float* logits_target(const Hparams& hp, float* logits_out, int n_out) {
        return placement_.output_on_device ? da_.logits_rows(*placement_.device, hp, n_out) : logits_out;
    }
    void finish_logits(float* logits_out, int64_t n_floats) {
        if (!placement_.device) return;
        if (placement_.output_on_device) {
            placement_.device->copy_to_host(logits_out, da_.logits.data(),
                                            static_cast<size_t>(n_floats) * sizeof(float));
        } else {
            placement_.device->synchronize();
        }
    }

private:
    void cross(bool to_device) {
        const size_t bytes = static_cast<size_t>(n_tok_) * static_cast<size_t>(row_floats_) * sizeof(float);
        if (to_device) {
            placement_.device->copy_to_device(dev_ops_.x, host_.x, bytes);
        } else {
            placement_.device->copy_to_host(host_.x, dev_ops_.x, bytes);
        }
        x_on_device_ = to_device;
    }

    std::unique_ptr<memory::Device> own_device_;
    memory::Device& device_;
    Placement placement_;

public:
    Activations a;
    ops::Scratch scratch;

private:
    GrowingCharge scratch_charge_;
    HostStaging staging_;
    std::unique_ptr<LayerStream> stream_;
    std::unique_ptr<ExpertCache> experts_;
    DeviceWeights device_weights_;
    DeviceActivations da_;
    Exec host_, dev_ops_;
    int n_tok_ = 0;
    int64_t row_floats_ = 0;
    bool x_on_device_ = false;
    bool device_experts_ = false;
};

// What every decoder-only model is besides its weights and its forward pass: its hyper-parameters
// and the memory of its passes (streamed and offloaded layers). An architecture binds its weights
// in its constructor, points the offloaded layers' at the device (mem_.place_weights) and writes
// forward().
class DecoderModel : public Model {
public:
    const Hparams& hparams() const final { return hp_; }
    int n_streamed_layers() const final { return mem_.n_streamed_layers(); }
    std::vector<FileRange> streamed_ranges() const final { return mem_.streamed_ranges(); }
    std::vector<FileRange> offloaded_ranges() const final { return mem_.offloaded_ranges(); }
    ExpertCacheStats expert_cache_stats() const final { return mem_.expert_stats(); }
    CachePlacement cache_placement() const final { return mem_.cache_placement(hp_); }

protected:
    DecoderModel(const gguf::GgufFile& file, Hparams hp, const LoadOptions& options)
        : hp_(std::move(hp)), mem_(file, hp_, options) {}

    // After the layers: the rows of the batch that want logits (x in the output layer's Exec),
    // normed by output_norm and multiplied by the output matrix into logits_out, soft-capped
    // where hp.final_logit_softcap > 0 (Gemma 2), on the device that runs the output layer.
    void output_logits(const Batch& batch, const BatchRows& rows, const float* output_norm,
                       const ops::WeightView& output, float* logits_out);

    Hparams hp_;
    DecoderMemory mem_;
};

// RoPE as the hyper-parameters set it (n_rot, base, linear scaling, YaRN's extrapolation and
// attention factors), in this mode, with these per-pair frequency factors (nullptr: none).
inline ops::RopeParams hparams_rope(const Hparams& hp, ops::RopeMode mode, const float* freq_factors) {
    ops::RopeParams rope;
    rope.mode = mode;
    rope.n_dims = hp.n_rot;
    rope.freq_base = hp.rope_base;
    rope.freq_scale = hp.rope_freq_scale;
    rope.freq_factors = freq_factors;
    rope.ext_factor = hp.rope_ext_factor;
    rope.attn_factor = hp.rope_attn_factor;
    rope.corr_low = hp.rope_corr_low;
    rope.corr_high = hp.rope_corr_high;
    return rope;
}

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
    if (!b.token_order_rows.empty() && b.token_order_rows.size() != n) {
        bad(std::to_string(b.token_order_rows.size()) + " token order flags");
    }
}

// Before a batch: checks it, sizes the working memory (DecoderMemory::begin), applies the cache's
// pending K shifts (rope_for(il) gives layer il's RoPE parameters; K is rotated by each cell's
// delta, on the device that runs the layer), and places the batch's tokens in the cache. Throws
// kv::KvCacheError (from place) when they do not fit.
template <class RopeFor>
BatchRows begin_batch(const Hparams& hp, const Batch& b, kv::ModelCache& cache, DecoderMemory& mem,
                      ops::ThreadPool& pool, RopeFor&& rope_for) {
    check_batch(hp, b);
    const int n = static_cast<int>(b.tokens.size());
    mem.begin(hp, n, pool);
    if (cache.has_k_shift()) {
        for (int il = 0; il < hp.n_layer; ++il) mem.ops_of(il).k_shift(cache, hp, il, rope_for(il));
        cache.clear_k_shift();
    }
    BatchRows rows{n, b.positions.data(), b.seq_ids.empty() ? mem.a.seq0.data() : b.seq_ids.data()};
    cache.place(std::span<const kv::SeqId>(rows.seq_ids, static_cast<size_t>(n)), b.positions);
    return rows;
}

// Where each of n tokens sits in its sequence's run (ops::TokenPlace): a run is a sequence's tokens
// among these n, in order, whether they are contiguous or not. O(n) for contiguous runs, O(n x runs)
// otherwise; allocates nothing.
inline void token_places(const kv::SeqId* seq, int n, ops::TokenPlace* out) {
    for (int t = 0; t < n; ++t) {
        int32_t before = 0;
        if (t > 0 && seq[t] == seq[t - 1]) {
            before = out[t - 1].run_pos + 1;
        } else {
            for (int s = 0; s < t; ++s) before += seq[s] == seq[t] ? 1 : 0;
        }
        out[t].run_pos = before;
    }
    for (int t = n - 1; t >= 0; --t) {
        if (t + 1 < n && seq[t + 1] == seq[t]) {
            out[t].run_len = out[t + 1].run_len;
            continue;
        }
        int last = t;  // the sequence's last token
        for (int s = t + 1; s < n; ++s) last = seq[s] == seq[t] ? s : last;
        out[t].run_len = out[last].run_pos + 1;
    }
}

// The places of the batch's tokens, for the batch begin_batch() began; none (every row in the
// one-token order) for a token_order batch.
inline std::span<const ops::TokenPlace> batch_places(const Batch& b, DecoderMemory& mem, const BatchRows& rows) {
    if (b.token_order) return {};
    token_places(rows.seq_ids, rows.n, mem.a.places.data());
    for (size_t t = 0; t < b.token_order_rows.size(); ++t) {
        if (b.token_order_rows[t] != 0) mem.a.places[t] = ops::TokenPlace{};  // a run of 1: the one-token path
    }
    return {mem.a.places.data(), static_cast<size_t>(rows.n)};
}

// Rows t0 .. t0 + m of a batch's places (none stay none).
inline std::span<const ops::TokenPlace> places_of(std::span<const ops::TokenPlace> places, int t0, int m) {
    return places.empty() ? places : places.subspan(static_cast<size_t>(t0), static_cast<size_t>(m));
}

// The places of the rows output_rows() picks, among themselves: llama.cpp multiplies only those
// rows by the output matrix, so a run there is a sequence's rows that want logits.
inline std::span<const ops::TokenPlace> output_places(const Batch& b, const BatchRows& rows, DecoderMemory& mem) {
    if (b.token_order) return {};
    const int n = rows.n;
    kv::SeqId* seq = mem.a.out_seq.data();
    int n_out = 0;
    for (int t = 0; t < n; ++t) {
        const bool wanted = b.all_logits || (b.output.empty() ? t == n - 1 : b.output[static_cast<size_t>(t)] != 0);
        if (wanted) seq[n_out++] = rows.seq_ids[t];
    }
    token_places(seq, n_out, mem.a.out_places.data());
    if (!b.token_order_rows.empty()) {
        for (int t = 0, i = 0; t < n; ++t) {
            const bool wanted = b.all_logits || (b.output.empty() ? t == n - 1 : b.output[static_cast<size_t>(t)] != 0);
            if (!wanted) continue;
            if (b.token_order_rows[static_cast<size_t>(t)] != 0) mem.a.out_places[static_cast<size_t>(i)] = {};
            ++i;
        }
    }
    return {mem.a.out_places.data(), static_cast<size_t>(n_out)};
}

// Attention of the batch's queries q ([n, n_head, head_dim]) over layer il of the cache, which
// already holds the batch's K/V; each token sees the cells of its own sequence (ops::attention_kv;
// with an f16 cache, llama.cpp's flash-attention arithmetic), on the device that runs the layer.
// out: [n, n_head * head_dim_v]. window > 0 limits each query to the last `window` positions;
// hp.attn_softcap > 0 soft-caps the scores (Gemma 2) before the mask and softmax. sinks: the
// layer's attention sinks, [n_head] (gpt-oss; ops::AttentionParams::sinks), or nullptr.
inline void attend(Exec& o, const Hparams& hp, const kv::ModelCache& cache, int il, const float* q,
                   const BatchRows& rows, float scale, int window, float* out, const float* sinks = nullptr) {
    ops::AttentionParams ap;
    ap.n_head = hp.n_head;
    ap.n_head_kv = hp.n_head_kv;
    ap.head_dim = hp.head_dim;
    ap.scale = scale;
    ap.sliding_window = window;
    ap.softcap = hp.attn_softcap;
    ap.sinks = sinks;
    cache.will_attend(il);  // a spilled cache brings this layer in and reads the next one ahead
    o.attention(q, rows, cache.pool(cache.pool_of(il)), cache.index_in_pool(il), ap, out);
}

// The rows of x ([n, n_embd]) that want logits, normed into cur (compacted, batch order), on the
// device that runs the output layer; returns how many.
inline int output_rows(Exec& o, const Hparams& hp, const Batch& b, const float* x, const float* output_norm,
                       float* cur) {
    const int n = static_cast<int>(b.tokens.size());
    const int64_t E = hp.n_embd;
    if (b.all_logits) {
        o.rms_norm(x, output_norm, hp.norm_eps, n, E, cur);
        return n;
    }
    if (b.output.empty()) {
        o.rms_norm(x + (n - 1) * E, output_norm, hp.norm_eps, 1, E, cur);
        return 1;
    }
    int n_out = 0;
    for (int t = 0; t < n; ++t) {
        if (b.output[static_cast<size_t>(t)] == 0) continue;
        o.rms_norm(x + t * E, output_norm, hp.norm_eps, 1, E, cur + n_out * E);
        ++n_out;
    }
    return n_out;
}

inline void DecoderModel::output_logits(const Batch& batch, const BatchRows& rows, const float* output_norm,
                                        const ops::WeightView& output, float* logits_out) {
    Exec& o = mem_.enter_output();
    const int n_out = output_rows(o, hp_, batch, o.x, output_norm, o.cur);
    if (n_out == 0) return;
    float* logits = mem_.logits_target(hp_, logits_out, n_out);
    const int64_t V = hp_.n_vocab;
    // The first n_vocab_out tokens only (host logits): [n_out, n] packed, then spread out to rows
    // of V, the rest -infinity (from the last row back, so that no row is overwritten unread).
    const int64_t n = logits == logits_out && batch.n_vocab_out > 0 && batch.n_vocab_out < V ? batch.n_vocab_out : V;
    ops::WeightView head = output;
    head.rows = n;
    o.matmul(head, o.cur, n_out, logits, output_places(batch, rows, mem_));  // logits: [n_out, n]
    if (hp_.logit_scale != 0.0f) o.scale(logits, int64_t{n_out} * n, 1.0f / hp_.logit_scale);
    if (hp_.final_logit_softcap > 0.0f) o.softcap(logits, int64_t{n_out} * n, hp_.final_logit_softcap);
    if (n < V) {
        for (int64_t r = n_out - 1; r >= 0; --r) {
            std::copy_backward(logits + r * n, logits + (r + 1) * n, logits + r * V + n);
            std::fill(logits + r * V + n, logits + (r + 1) * V, -std::numeric_limits<float>::infinity());
        }
    }
    mem_.finish_logits(logits_out, int64_t{n_out} * V);
}

}  // namespace fitllm::model
