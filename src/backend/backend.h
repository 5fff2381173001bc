#pragma once
// Devices that run ops (docs/architecture.md, idea 6): a memory::Device (capacity and pools) plus buffers in
// the device's own memory, copies between it and the host, and the ops the forward passes of
// llama / qwen2 / gemma3 need. The model places its last layers on a device (model::LoadOptions::
// offload, -ngl); activations cross only at layer boundaries.
//
//   std::unique_ptr<backend::Backend> gpu = backend::open_device("cuda0", 8ull << 30);  // or "virtual"
//   backend::Buffer x = gpu->alloc(memory::pool_names::kScratch, bytes, "activations");  // BudgetError
//   gpu->copy_to_device(x.data(), host_rows, bytes);
//   gpu->rms_norm(x.f32(), norm_weight_on_device, eps, n_tok, n_embd, x.f32());
//   gpu->copy_to_host(host_rows, x.data(), bytes);  // waits for the ops before it
//
// Conventions for every op:
//  - float and weight pointers point into this device's memory (Buffers of this backend, or
//    offsets inside them); small int arrays that describe a batch (positions, sequence ids, cells)
//    are host memory, read during the call (a device with memory of its own copies them itself).
//  - Ops are issued in order on one stream; they may run asynchronously. copy_to_host() and
//    synchronize() wait for every op issued before them. Inputs are not modified unless the op
//    says so; outputs may alias inputs where the ops:: function of the same name allows it.
//  - Results must agree with the ops:: kernels (CPU reference) within the tolerance of the weight
//    and KV types; the virtual device runs those very kernels (bit-identical to the CPU path).
//  - Errors: std::invalid_argument for shapes or types an op does not support (naming them);
//    memory::BudgetError from alloc() when the pool's device has no room.
//
// Not thread-safe: one forward pass at a time uses a backend.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "kv/cache.h"
#include "memory/device.h"
#include "memory/pool.h"
#include "ops/attention.h"
#include "ops/matmul.h"
#include "ops/rope.h"
#include "ops/weight_view.h"

namespace fitllm::ops {
class ThreadPool;
}

namespace fitllm::backend {

class Backend;

// Bytes in a device's memory, charged to one of its pools for as long as they live (the charge is
// taken before the device allocates, so a buffer over budget throws without touching the device).
// Move-only; made by Backend::alloc.
class Buffer {
public:
    Buffer() = default;
    Buffer(Buffer&& o) noexcept
        : owner_(std::exchange(o.owner_, nullptr)),
          data_(std::exchange(o.data_, nullptr)),
          bytes_(std::exchange(o.bytes_, 0)),
          charge_(std::move(o.charge_)) {}
    Buffer& operator=(Buffer&& o) noexcept {
        if (this != &o) {
            reset();
            owner_ = std::exchange(o.owner_, nullptr);
            data_ = std::exchange(o.data_, nullptr);
            bytes_ = std::exchange(o.bytes_, 0);
            charge_ = std::move(o.charge_);
        }
        return *this;
    }
    ~Buffer() { reset(); }

    void* data() const { return data_; }
    float* f32() const { return static_cast<float*>(data_); }
    size_t bytes() const { return bytes_; }
    uint64_t charged_bytes() const { return charge_.bytes(); }
    bool empty() const { return data_ == nullptr; }
    void reset() noexcept;  // frees the memory and gives the charge back

private:
    friend class Backend;
    Buffer(Backend* owner, void* data, size_t bytes, memory::Charge charge)
        : owner_(owner), data_(data), bytes_(bytes), charge_(std::move(charge)) {}
    Backend* owner_ = nullptr;
    void* data_ = nullptr;
    size_t bytes_ = 0;
    memory::Charge charge_;
};

// What attention needs to know about a batch: token t is in sequence seq_ids[t] at positions[t].
// Host memory.
struct BatchRows {
    int n = 0;
    const int32_t* positions = nullptr;
    const kv::SeqId* seq_ids = nullptr;
};

class Backend {
public:
    virtual ~Backend() = default;
    Backend(const Backend&) = delete;
    Backend& operator=(const Backend&) = delete;

    // "virtual", "cuda0", ...: for messages.
    virtual std::string name() const = 0;
    // Its capacity and pools: memory::pool_names::kWeights (copies of the weights of the layers it
    // holds), kKv (the K/V of those layers, with offload_kv), kScratch (its activations, op
    // scratch and logits). Every Buffer charges one of them.
    memory::Device& memory() { return *memory_; }
    // True when the device shares memory with the host (integrated GPUs, Apple): its memory() is
    // the host's memory::Device (one budget), and the model reads the mapped weights in place
    // instead of copying them (no "weights" charge, no pages given back). Activations still cross
    // through copy_to_device / copy_to_host (memcpy in one address space).
    virtual bool unified() const = 0;
    // Whether attention() takes ops::AttentionParams::sinks (gpt-oss); a model with sinks refuses
    // at load to offload layers to a device without them.
    virtual bool attention_sinks() const { return true; }
    // Whether matmul() takes weights of this type; a model refuses at load to place a matrix of
    // another type on the device (model::DeviceWeights), instead of failing at its first use.
    virtual bool matmul_supports(quant::GgmlType /*type*/) const { return true; }
    // A unified device: the address its ops read the host bytes [host, host + bytes) at, valid for
    // as long as the device lives (DeviceWeights maps the offloaded tensors' file ranges once, in
    // whole pages that do not overlap one another). The virtual device reads them where they are
    // (host itself); CUDA registers the pages (cudaHostRegister, mapped and read-only) and returns
    // their device address. Throws std::logic_error on a device with memory of its own, and
    // std::runtime_error when the device cannot map them (why).
    virtual const void* map_host(const void* host, size_t bytes);
    // Undoes map_host(host, ...) (host as given to it): the device reads it no more (CUDA
    // unregisters the pages, so a model unloaded by fitllm serve leaves nothing pinned).
    virtual void unmap_host(const void* /*host*/) noexcept {}

    // Bytes on this device charged to memory().pool(pool) (memory::BudgetError naming the device,
    // the pool, `what` and the bytes when it has no room: nothing allocated). Zero bytes gives an
    // empty Buffer. Contents are undefined.
    Buffer alloc(std::string_view pool, size_t bytes, std::string_view what);

    // dst (device) <- src (host), and dst (host) <- src (device, waits for the ops before it).
    virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;
    virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
    // dst <- src, both on this device.
    virtual void copy_on_device(void* dst, const void* src, size_t bytes) = 0;
    // Waits until every op issued so far has finished.
    virtual void synchronize() = 0;

    // The host threads a CPU-executed device (virtual) may use for the ops issued until the next
    // call; the model passes its forward pass's pool. Others ignore it.
    virtual void use_threads(ops::ThreadPool& /*pool*/) {}

    // ---- Ops (ops:: has the reference of each, same name and meaning) ----------------------------
    // y[t][r] = sum_c w[r][c] * x[t][c]: x [n_tok, w.cols], y [n_tok, w.rows]; w.data on this device,
    // laid out as in the GGUF file (row r at w.row(r)). Types: at least F32, F16, Q8_0, Q4_0, Q4_K,
    // Q5_K, Q6_K (the virtual device: every type ops::matmul reads).
    virtual void matmul(const ops::WeightView& w, const float* x, int n_tok, float* y) = 0;
    // The same with the tokens' places in their sequences' runs (ops::matmul), which pick
    // llama.cpp's batch order for a prompt's tokens on the host: a device that runs the host's
    // kernels (virtual) passes them on, so that it gives the host's bits; the others ignore them.
    virtual void matmul_in_runs(const ops::WeightView& w, const float* x, int n_tok, float* y,
                                std::span<const ops::TokenPlace> /*places*/) {
        matmul(w, x, n_tok, y);
    }
    // Row-wise RMS norm of [n_rows, n] with weight [n] (nullptr: none); per-head norms pass
    // n_rows = n_tok * n_head and n = head_dim. y may alias x.
    virtual void rms_norm(const float* x, const float* weight, float eps, int64_t n_rows, int64_t n, float* y) = 0;
    // In place on x [n_tok, n_head, head_dim]; positions: host, n_tok values. params.freq_factors,
    // when set, points to this device's memory (n_dims / 2 floats).
    virtual void rope(float* x, const int32_t* positions, int64_t n_tok, int n_head, int head_dim,
                      const ops::RopeParams& params) = 0;
    virtual void add(const float* a, const float* b, int64_t n, float* y) = 0;         // y = a + b
    virtual void add_bias(float* x, const float* bias, int64_t n_tok, int64_t n) = 0;  // x[t] += bias
    virtual void scale(float* x, int64_t n, float s) = 0;                              // x *= s
    virtual void swiglu(const float* gate, const float* up, int64_t n, float* y) = 0;  // silu(gate) * up
    virtual void geglu(const float* gate, const float* up, int64_t n, float* y) = 0;   // gelu(gate) * up
    virtual void softcap(float* x, int64_t n, float cap) = 0;                          // cap * tanh(x / cap)
    // gpt-oss's clamped SwiGLU (ops::swiglu_oai): its routed experts on the device. A device without
    // it throws std::invalid_argument naming itself.
    virtual void swiglu_oai(const float* gate, const float* up, int64_t n, float alpha, float limit, float* y);

    // ---- The KV cache of the layers this device runs ---------------------------------------------
    // `cache` is one pool of the model's kv::ModelCache (host object): its bookkeeping (block
    // tables, cell positions, sequence masks) lives on the host and is read during the call; `layer`
    // is the index inside that pool. Where the K/V bytes live:
    //  - the pool was made for this device (offload_kv, kv::ModelCache groups layers by device):
    //    the device's own memory, charged to its kKv pool. A CPU-executed device (virtual, unified)
    //    uses the pool's own storage, which kv::KvCache charged to memory().pool(kKv). A device with
    //    memory of its own (CUDA) must hold the rows [capacity][n_head_kv * head_bytes] of each
    //    layer in its memory (cache.layer_view(layer) gives types and row sizes), mirror the cells
    //    of store(), and read the bookkeeping for attention (copy cell_positions(),
    //    cell_seq_masks() and the block tables of the batch's sequences per call).
    //  - a host pool (offload_kv false): the host's memory; the virtual device reads it directly,
    //    a CUDA device must copy K/V rows it needs (or map them as host memory) per call.
    // attach_kv(cache, on_device) is called once per pool the device's layers use, after the cache
    // is made; a device with memory of its own allocates its K/V storage there (charged to kKv).
    virtual void attach_kv(kv::KvCache& cache, bool on_device) = 0;
    // The end of an attached pool: the device frees what it holds for it (a CUDA device: the
    // pool's K/V and bookkeeping buffers). Model::make_cache arranges the call for when its
    // kv::ModelCache goes (ModelCache::on_close), so a server that makes and drops caches holds
    // device memory only for the live ones. Nothing for a pool that is not attached. The cache may
    // be mid-destruction: only its address is used.
    virtual void detach_kv(const kv::KvCache& cache) = 0;
    // Pools attached and not yet detached (for tests and checks).
    virtual int attached_kv_pools() const = 0;
    // True when the K/V of a pool made for this device (on_device) lives in the device's own
    // memory, so the host pool allocates none (kv::CacheParams::external_storage): CUDA. A
    // CPU-executed device (virtual, unified) reads the pool's own storage: false.
    virtual bool holds_kv_storage() const = 0;

    // Writes n = cells.size() rows of K ([n, n_head_kv * head_dim_k], device) and V into `layer`
    // at those cells (host indices), converted to the pool's K/V types as kv::KvCache::store does.
    virtual void kv_store(kv::KvCache& cache, int layer, std::span<const int32_t> cells, const float* k,
                          const float* v) = 0;
    // ops::attention_kv on the device: q [rows.n, n_head, head_dim] and out [rows.n, n_head *
    // head_dim_v] on the device, the layer's K/V as above.
    virtual void attention(const float* q, const BatchRows& rows, const kv::KvCache& cache, int layer,
                           const ops::AttentionParams& params, float* out) = 0;
    // Applies the cache's pending K shift (kv::KvCache::apply_k_shift) to `layer`: K of every
    // shifted cell re-rotated by its delta with `rope` (freq_factors on this device). The caller
    // clears the shift after every layer of every pool had it.
    virtual void kv_shift(kv::KvCache& cache, int layer, const ops::RopeParams& rope) = 0;

    // ---- Host memory the device's path needs ------------------------------------------------------
    // Bytes of host memory this device keeps for its copies whatever the context or batch (a CUDA
    // device: its pinned staging buffer, kCudaHostStagingBytes; the virtual device: 0), the same
    // as host_bytes_for(name()).
    virtual uint64_t host_bytes() const { return 0; }
    // Charges host_bytes() to host.pool(memory::pool_names::kStaging) for as long as the device
    // lives (or until the next bind_host), before the device allocates them; memory::BudgetError
    // when the host has no room. The runtime calls it once its host budget exists; host must
    // outlive the device.
    void bind_host(memory::Device& host);
    void unbind_host() { host_charge_ = memory::Charge(); }  // gives the charge back
    uint64_t host_charged_bytes() const { return host_charge_.bytes(); }
    bool host_bound() const { return host_charge_.pool() != nullptr; }

protected:
    Backend(std::string device_name, uint64_t capacity)
        : own_memory_(std::make_unique<memory::Device>(std::move(device_name), capacity)), memory_(own_memory_.get()) {}
    // A unified device: its pools are those of `host` (which must outlive it).
    explicit Backend(memory::Device& host) : memory_(&host) {}

    // The device's own allocation (no charging: alloc() charged already) and release. raw_alloc
    // throws memory::BudgetError (pool and bytes) when the device itself refuses.
    virtual void* raw_alloc(size_t bytes) = 0;
    virtual void raw_free(void* data) noexcept = 0;

private:
    friend class Buffer;
    std::unique_ptr<memory::Device> own_memory_;
    memory::Device* memory_;
    memory::Charge host_charge_;
};

// "virtual" (or "virtualN"): the CPU-executed device of virtual_device.h, available everywhere.
// "cuda" / "cudaN": CUDA device N (0 by default); throws std::runtime_error saying the build has
// no CUDA (-DFITLLM_CUDA=ON) or no such device. capacity: the bytes the device's pools may hold
// (a CUDA device's capacity is capped at its free memory). Throws std::invalid_argument for an
// unknown name (listing the accepted ones).
std::unique_ptr<Backend> open_device(std::string_view name, uint64_t capacity);

// A device in unified mode (Backend::unified()): it shares `host`'s memory and budget (its pools
// are host's, which must outlive it) and reads the mapped weights in place. name: "virtual",
// "virtualN" or "virtual-unified" (the virtual device, named "<name>-unified"), or "cuda" /
// "cudaN" (the CUDA device reading host memory through mapped pinned pages, for integrated GPUs;
// std::runtime_error as open_device, or when the device cannot map host memory). Throws
// std::invalid_argument for an unknown name.
std::unique_ptr<Backend> open_unified_device(std::string_view name, memory::Device& host);

// Whether `name` is a device that shares memory with the host by nature: a CUDA device that
// reports itself integrated (cudaDevAttrIntegrated). False when it cannot tell (no such device, a
// build without CUDA) and for the virtual device (whose unified mode is asked for by name).
bool device_is_integrated(std::string_view name);

// Whether open_device / open_unified_device know `name` (virtual, virtualN, cuda, cudaN, each
// with or without "-unified"), without opening anything.
bool is_device_name(std::string_view name);

// "virtual-unified" -> {"virtual", true}; any other name -> {name, false}.
std::pair<std::string_view, bool> strip_unified_suffix(std::string_view name);

// The host memory a CUDA device keeps for its copies (Backend::host_bytes): one pinned staging
// buffer through which every small upload (positions, cells, the KV bookkeeping, in chunks) and
// the K/V rows of a host-held pool pass. Fixed: it does not grow with the context or the batch.
inline constexpr uint64_t kCudaHostStagingBytes = 1ull << 20;
// Backend::host_bytes() of the device open_device(name) gives, without opening it (for plans):
// kCudaHostStagingBytes for "cuda..." names, 0 otherwise.
uint64_t host_bytes_for(std::string_view device_name);

// Whether this build has the CUDA backend, and how many CUDA devices it sees (0 without).
bool cuda_built();
int cuda_device_count();

// ---- What a model charges (for memory::plan to mirror byte for byte) --------------------------------
// With n_offload_layers = N > 0 on device D (model::LoadOptions), for a model of L layers
// (model/offload.h computes each number):
//  D "weights" (model::device_weight_bytes): one Buffer per tensor of each offloaded layer il in
//    [L - min(N, L), L) (tensors named "blk.<il>.*"), each n_bytes + 64 (model::kWeightSkew)
//    rounded up to kBufferAlign;
//    when N > L also output_norm.weight and the output matrix (output.weight, or a copy of
//    token_embd.weight when tied); for a llama file with rope_freqs.weight, that too. Less what
//    tensor overrides keep on the host (model::host_kept_tensors: routed-expert blocks, other
//    weight matrices, the output layer), which the model's ops read from the mapped file there.
//  D "scratch" (model::device_scratch_bytes(hp, N, n, n_out)): the activations of the largest
//    batch n seen (x, cur, q, k, v, attn, gate, up: n rows each, one Buffer each, each rounded to
//    kBufferAlign), plus, when the output layer is there, the logits of the most rows n_out that
//    one batch wanted (n_out * n_vocab floats); the virtual device also charges the ops scratch
//    it grows to, as the host does for its own.
//  D "kv": with offload_kv, the pools kv::ModelCache makes for the offloaded layers (grouped by
//    (window, device), see kv/cache.h ModelCache); without, nothing (the host "kv" pool holds all).
//  A unified device (unified()): its pools are the host's, and "weights" gets nothing (the mapped
//    tensors are read in place, so they stay in the host's resident weights and none of their
//    pages is given back); "scratch" and "kv" as above, charged to the host's pools.
//  host "staging": host_bytes() (bind_host; a CUDA device's pinned staging buffer, none for the
//    virtual device), fixed; otherwise nothing more than the CPU path: the crossings copy from and
//    to the host's activations (already charged to its "scratch") and the caller's logits; nothing
//    grows with the context. A CUDA device's pools (holds_kv_storage) allocate no K/V on the host.
inline constexpr size_t kBufferAlign = 256;

}  // namespace fitllm::backend
