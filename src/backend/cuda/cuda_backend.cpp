// The CUDA device (backend/cuda_backend.h): backend::Backend over the kernels of kernels.h, one
// stream per device. Compiled by the host compiler; every CUDA call is behind kernels.h.
//
// Memory: buffers are cudaMalloc'ed after Backend::alloc charged the device's pool. On the host
// the device keeps one pinned staging buffer of kCudaHostStagingBytes (charged to the host by
// Backend::bind_host), and nothing that grows with the context: the batch's small host arrays
// (positions, cells) are written into it and copied from there asynchronously, only when they
// change (the layers of a batch pass the same ones; the staged copy is what they are compared
// with); the cache's bookkeeping goes through it in chunks when KvCache::generation() says it
// changed; the K/V rows of a host-held pool come back through it in chunks.
//
// The KV cache: a pool made for this device (on_device, kv::CacheParams::external_storage: the
// host allocates no K/V for it) keeps its K/V here, one buffer per layer ([capacity] rows laid out
// as the host pool's LayerView), written by kv_store's kernel, shaped as the host would shape it
// (the host calibrates the K transform from the first rows the layer stores, kv/key_transform.h,
// and the device applies it); the host KvCache keeps the bookkeeping and charged this device's
// "kv" pool for the K/V, so those buffers are not charged again. The copies on write of place()
// (KvCache::cell_copies) and the K shifts (KvCache::cell_shifts: read back, re-rotated, stored
// again) happen on the device. detach_kv frees it all.
// A host pool (offload_kv off) is written on the host (kv::KvCache::store, the CPU's exact
// conversion) and its used rows are copied to a device buffer for each attention call.
//
// Unified mode (make_cuda_unified_backend, integrated GPUs): the pools are the host's, every
// buffer above (and the K/V layers) is mapped pinned host memory instead of cudaMalloc, and the
// weights are the mapped file's pages, registered by map_host() and read in place.
#include "backend/cuda_backend.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "ops/rope.h"
#include "quant/ggml_type.h"

namespace fitllm::backend {
namespace {

namespace pools = memory::pool_names;

// Room left on the GPU for the CUDA context's own allocations (kernels, cuBLAS-free, but the
// runtime still takes some) when the caller asks for more than is free.
constexpr uint64_t kFreeMargin = 512ull << 20;
// Rows a K shift re-rotates per launch (a device float buffer of that many rows).
constexpr int64_t kShiftRows = 256;
// freq_factors a host pool's K shift copies back (head_dim / 2 at most).
constexpr int kMaxRopePairs = 512;

uint64_t usable_capacity(int ordinal, uint64_t requested) {
    cuda::set_device(ordinal);
    uint64_t free_bytes = 0, total_bytes = 0;
    cuda::memory_info(free_bytes, total_bytes);
    const uint64_t usable = free_bytes > kFreeMargin ? free_bytes - kFreeMargin : 0;
    return requested == 0 ? usable : std::min(requested, usable);
}

size_t round16(size_t n) {
    return (n + 15) / 16 * 16;
}

class CudaBackend final : public Backend {
public:
    CudaBackend(int ordinal, uint64_t capacity)
        : Backend("cuda" + std::to_string(ordinal), usable_capacity(ordinal, capacity)),
          name_("cuda" + std::to_string(ordinal)),
          ordinal_(ordinal),
          stream_(cuda::create_stream()) {}
    // Unified mode (an integrated GPU): the host's pools, buffers in mapped pinned host memory.
    CudaBackend(int ordinal, memory::Device& host)
        : Backend(host),
          name_(open_unified(ordinal)),
          ordinal_(ordinal),
          unified_(true),
          stream_(cuda::create_stream()) {}

    ~CudaBackend() override {
        try {
            cuda::synchronize(stream_);
        } catch (...) {  // an earlier kernel's fault; nothing left to report it to
        }
        kv_.clear();
        positions_ = Upload();
        shift_rows_ = Buffer();
        shift_cells_ = Buffer();
        cuda::host_free_pinned(staging_);
        cuda::destroy_stream(stream_);
        for (const void* p : registered_) cuda::host_unregister(p);
    }

    std::string name() const override { return name_; }
    bool unified() const override { return unified_; }
    bool attention_sinks() const override { return false; }  // attention() refuses them
    bool matmul_supports(quant::GgmlType type) const override { return cuda::matmul_supports(type); }
    const void* map_host(const void* host, size_t bytes) override {
        if (!unified_) return Backend::map_host(host, bytes);  // (throws)
        const void* on_device = cuda::host_register_mapped(host, bytes);
        registered_.push_back(host);
        return on_device;
    }
    void unmap_host(const void* host) noexcept override {
        const auto it = std::find(registered_.begin(), registered_.end(), host);
        if (it == registered_.end()) return;
        cuda::host_unregister(host);
        registered_.erase(it);
    }
    uint64_t host_bytes() const override { return kCudaHostStagingBytes; }

    void copy_to_device(void* dst, const void* src, size_t bytes) override {
        cuda::copy_to_device(dst, src, bytes, stream_);
    }
    void copy_to_host(void* dst, const void* src, size_t bytes) override {
        cuda::copy_to_host(dst, src, bytes, stream_);
        cuda::synchronize(stream_);
    }
    void copy_on_device(void* dst, const void* src, size_t bytes) override {
        cuda::copy_on_device(dst, src, bytes, stream_);
    }
    void synchronize() override { cuda::synchronize(stream_); }

    void matmul(const ops::WeightView& w, const float* x, int n_tok, float* y) override {
        cuda::matmul(w.type, w.data, w.rows, w.cols, w.row_stride, x, n_tok, y, stream_);
    }
    void rms_norm(const float* x, const float* weight, float eps, int64_t n_rows, int64_t n, float* y) override {
        cuda::rms_norm(x, weight, eps, n_rows, n, y, stream_);
    }
    void rope(float* x, const int32_t* positions, int64_t n_tok, int n_head, int head_dim,
              const ops::RopeParams& params) override {
        const auto* pos = static_cast<const int32_t*>(
            upload(positions_, positions, static_cast<size_t>(n_tok) * sizeof(int32_t), "rope positions"));
        cuda::rope(x, pos, n_tok, n_head, head_dim, rope_args(params), stream_);
    }
    void add(const float* a, const float* b, int64_t n, float* y) override { cuda::add(a, b, n, y, stream_); }
    void add_bias(float* x, const float* bias, int64_t n_tok, int64_t n) override {
        cuda::add_bias(x, bias, n_tok, n, stream_);
    }
    void scale(float* x, int64_t n, float s) override { cuda::scale(x, n, s, stream_); }
    void swiglu(const float* gate, const float* up, int64_t n, float* y) override {
        cuda::swiglu(gate, up, n, y, stream_);
    }
    void swiglu_oai(const float* gate, const float* up, int64_t n, float alpha, float limit, float* y) override {
        cuda::swiglu_oai(gate, up, n, alpha, limit, y, stream_);
    }
    void geglu(const float* gate, const float* up, int64_t n, float* y) override {
        cuda::geglu(gate, up, n, y, stream_);
    }
    void softcap(float* x, int64_t n, float cap) override { cuda::softcap(x, n, cap, stream_); }

    void attach_kv(kv::KvCache& cache, bool on_device) override;
    void detach_kv(const kv::KvCache& cache) override;
    int attached_kv_pools() const override { return static_cast<int>(kv_.size()); }
    bool holds_kv_storage() const override { return true; }
    void kv_store(kv::KvCache& cache, int layer, std::span<const int32_t> cells, const float* k,
                  const float* v) override;
    void attention(const float* q, const BatchRows& rows, const kv::KvCache& cache, int layer,
                   const ops::AttentionParams& params, float* out) override;
    void kv_shift(kv::KvCache& cache, int layer, const ops::RopeParams& rope) override;

protected:
    void* raw_alloc(size_t bytes) override {
        try {
            return memory_for(bytes, name_.c_str());
        } catch (const cuda::CudaError& e) {
            // The device has less than its capacity says (another process took memory since).
            throw memory::BudgetError(
                name_ + ": " + e.what() + " (the " + (unified_ ? "host's" : "device's") + " pools hold " +
                    std::to_string(memory().live()) + " of " + std::to_string(memory().capacity()) + " bytes)",
                unified_ ? "cudaHostAlloc" : "cudaMalloc", bytes, memory().capacity(), memory().live());
        }
    }
    void raw_free(void* data) noexcept override { cuda::device_free(data); }

private:
    // Host bytes last copied to buf, by where they were staged (see upload()).
    struct Upload {
        uint64_t round = UINT64_MAX;  // staging_round_ they were staged in
        size_t offset = 0, bytes = 0;
        Buffer buf;
    };

    // The device side of one attached kv::KvCache.
    struct KvMirror {
        bool on_device = false;
        std::vector<void*> k, v;  // on_device: per layer, [capacity] rows (uncharged, see top)
        // on_device, per layer: the K transform on the device ([center | scale | inv_scale], each
        // n_head_kv * head_dim_k floats) once the host calibrated it; `calibrated`: asked already.
        std::vector<Buffer> shape;
        std::vector<uint8_t> calibrated;
        uint64_t copies_generation = UINT64_MAX;  // the cache's generation whose copies were made
        uint64_t meta_generation = UINT64_MAX;    // the cache's generation meta holds
        Buffer meta;                              // cell sequences, positions, block tables
        Upload cells;                             // the cells kv_store writes
        Upload batch;                             // attention's positions, sequences (and K transform)
        const int32_t* cell_pos = nullptr;        // inside meta
        const uint64_t* cell_seqs = nullptr;
        const int32_t* blocks = nullptr;
        const int32_t* seq_blocks = nullptr;
        Buffer host_rows_k, host_rows_v;  // !on_device: the used rows of the layer being attended
        KvMirror() = default;
        KvMirror(KvMirror&&) = default;
        KvMirror& operator=(KvMirror&&) = delete;
        ~KvMirror() {
            for (void* p : k) cuda::device_free(p);
            for (void* p : v) cuda::device_free(p);
        }
    };

    // Memory the kernels use: the device's own, or (unified) mapped pinned host memory.
    void* memory_for(size_t bytes, const char* what) const {
        return unified_ ? cuda::host_malloc_mapped(bytes, what) : cuda::device_malloc(bytes, what);
    }

    static std::string open_unified(int ordinal) {
        cuda::set_device(ordinal);
        if (!cuda::can_map_host_memory(ordinal)) {
            throw cuda::CudaError("cuda" + std::to_string(ordinal) +
                                  " cannot map host memory (cudaDevAttrCanMapHostMemory 0): no unified mode");
        }
        return "cuda" + std::to_string(ordinal);
    }

    cuda::RopeArgs rope_args(const ops::RopeParams& p) const {
        return cuda::RopeArgs{.neox = p.mode == ops::RopeMode::Neox,
                              .n_dims = p.n_dims,
                              .freq_base = p.freq_base,
                              .freq_scale = p.freq_scale,
                              .freq_factors = p.freq_factors,
                              .ext_factor = p.ext_factor,
                              .attn_factor = p.attn_factor,
                              .corr_low = p.corr_low,
                              .corr_high = p.corr_high};
    }

    KvMirror& mirror_of(const kv::KvCache& cache) {
        const auto it = kv_.find(&cache);
        if (it == kv_.end()) {
            throw std::invalid_argument(name_ + ": a KV cache pool that was not attached (attach_kv) is used");
        }
        return it->second;
    }

    // `bytes` (at most kCudaHostStagingBytes) of the pinned staging buffer, valid until it starts
    // over: when the rest is too small, after waiting for every copy out of it.
    uint8_t* stage(size_t bytes) {
        if (bytes > kCudaHostStagingBytes) {
            throw std::logic_error(name_ + ": " + std::to_string(bytes) + " bytes do not fit the staging buffer");
        }
        if (staging_ == nullptr) {
            staging_ = static_cast<uint8_t*>(cuda::host_malloc_pinned(kCudaHostStagingBytes, "host staging"));
        }
        if (staging_used_ + bytes > kCudaHostStagingBytes) restart_staging();
        uint8_t* p = staging_ + staging_used_;
        staging_used_ += round16(bytes);
        return p;
    }
    // The whole staging buffer, for copies back to the host; uploads stage afresh afterwards.
    uint8_t* stage_all() {
        stage(0);
        restart_staging();
        staging_used_ = kCudaHostStagingBytes;
        return staging_;
    }
    void restart_staging() {
        cuda::synchronize(stream_);
        staging_used_ = 0;
        ++staging_round_;
    }
    // dst (device) <- host, through the staging buffer in chunks.
    void upload_through_staging(void* dst, const void* host, size_t bytes) {
        constexpr size_t kChunk = kCudaHostStagingBytes / 2;
        for (size_t at = 0; at < bytes; at += kChunk) {
            const size_t n = std::min(kChunk, bytes - at);
            uint8_t* st = stage(n);
            std::memcpy(st, static_cast<const uint8_t*>(host) + at, n);
            cuda::copy_to_device(static_cast<uint8_t*>(dst) + at, st, n, stream_);
        }
    }

    // Copies `bytes` of host data to up.buf unless the copy staged last time holds them already;
    // returns up.buf.
    const void* upload(Upload& up, const void* host, size_t bytes, const char* what) {
        if (bytes == 0) return nullptr;
        uint8_t* st = stage(bytes);
        std::memcpy(st, host, bytes);
        return upload_staged(up, st, bytes, what);
    }
    // The same for bytes composed at st, the last region stage() gave.
    const void* upload_staged(Upload& up, uint8_t* st, size_t bytes, const char* what) {
        if (up.round == staging_round_ && up.bytes == bytes && std::memcmp(staging_ + up.offset, st, bytes) == 0) {
            staging_used_ = static_cast<size_t>(st - staging_);  // not needed: give the room back
            return up.buf.data();
        }
        if (up.buf.bytes() < bytes) {
            // grow() waits for the stream, which leaves the staged bytes as they are.
            grow(up.buf, bytes, pools::kScratch, what);
        }
        cuda::copy_to_device(up.buf.data(), st, bytes, stream_);
        up.round = staging_round_;
        up.offset = static_cast<size_t>(st - staging_);
        up.bytes = bytes;
        return up.buf.data();
    }

    // Makes buf at least `bytes` (doubling), synchronizing first: kernels may still read the old one.
    void grow(Buffer& buf, size_t bytes, const char* pool, const char* what) {
        if (buf.bytes() >= bytes) return;
        cuda::synchronize(stream_);
        const size_t want = std::max(bytes, buf.bytes() * 2);
        buf = Buffer();
        buf = alloc(pool, want, what);
    }

    void follow_copy_on_write(KvMirror& m, const kv::KvCache& cache);
    void shape_keys(KvMirror& m, kv::KvCache& cache, int layer, const float* k, int64_t n_rows);
    cuda::KvLayout device_layout(const KvMirror& m, const kv::KvCache& cache, int layer, bool is_k) const;
    void upload_meta(KvMirror& m, const kv::KvCache& cache);
    void upload_batch(KvMirror& m, const kv::KvCache& cache, int layer, const BatchRows& rows, const int32_t*& q_pos,
                      const int32_t*& q_seq, const float*& q_scale, const float*& k_center);
    void shift_on_device(KvMirror& m, const kv::KvCache& cache, int layer, const ops::RopeParams& rope);

    std::string name_;
    int ordinal_;
    bool unified_ = false;
    cuda::Stream stream_;
    std::vector<const void*> registered_;  // map_host's ranges
    uint8_t* staging_ = nullptr;           // pinned, kCudaHostStagingBytes (allocated at first use)
    size_t staging_used_ = 0;
    uint64_t staging_round_ = 0;                  // bumped whenever the staging buffer starts over
    Upload positions_;                            // rope's
    Buffer shift_rows_, shift_cells_;             // kv shifts on the device: kShiftRows rows, cells and deltas
    std::array<float, kMaxRopePairs> factors_{};  // a host pool's K shift: freq_factors back
    std::map<const kv::KvCache*, KvMirror> kv_;
};

cuda::KvLayout layout_of(const kv::KvCache::LayerView& view, bool is_k, void* data) {
    return cuda::KvLayout{.type = is_k ? view.type_k : view.type_v,
                          .data = data,
                          .row_bytes = is_k ? view.k_row_bytes : view.v_row_bytes,
                          .head_bytes = is_k ? view.k_head_bytes : view.v_head_bytes,
                          .n_head_kv = view.n_head_kv,
                          .head_dim = is_k ? view.head_dim_k : view.head_dim_v,
                          .rotated = view.rotated};
}

void CudaBackend::attach_kv(kv::KvCache& cache, bool on_device) {
    KvMirror m;
    m.on_device = on_device;
    // The attention kernels here take per-dimension query factors: the diagonal K transform.
    cache.limit_key_transform();
    if (on_device) {
        if (cache.holds_kv()) {
            throw std::invalid_argument(name_ +
                                        ": a KV pool for this device must be made with external storage "
                                        "(kv::CacheParams::external_storage, Backend::holds_kv_storage)");
        }
        m.shape.resize(static_cast<size_t>(cache.n_layer()));
        m.calibrated.assign(static_cast<size_t>(cache.n_layer()), 0);
        for (int il = 0; il < cache.n_layer(); ++il) {
            const kv::KvCache::LayerView view = cache.layer_view(il);
            for (const bool is_k : {true, false}) {
                const size_t bytes =
                    (is_k ? view.k_row_bytes : view.v_row_bytes) * static_cast<size_t>(cache.capacity());
                void* p = memory_for(bytes, "KV cache layer");
                (is_k ? m.k : m.v).push_back(p);
                cuda::fill_zero(p, bytes, stream_);
            }
        }
    }
    kv_.erase(&cache);
    kv_.emplace(&cache, std::move(m));
}

void CudaBackend::detach_kv(const kv::KvCache& cache) {
    const auto it = kv_.find(&cache);
    if (it == kv_.end()) return;
    try {
        cuda::synchronize(stream_);     // kernels issued before may still read its buffers
    } catch (const cuda::CudaError&) {  // an earlier kernel's fault: reported by the next call
    }
    kv_.erase(it);
}

// Before a batch's rows are stored: the cells place() copied on write (a shared, partly filled last
// block after seq_cp) get their rows on the device too, every layer, once per place().
void CudaBackend::follow_copy_on_write(KvMirror& m, const kv::KvCache& cache) {
    if (m.copies_generation == cache.generation()) return;
    m.copies_generation = cache.generation();
    const std::span<const kv::KvCache::CellCopy> copies = cache.cell_copies();
    for (size_t i = 0; i < copies.size();) {
        // A run of consecutive cells to consecutive cells is one copy.
        size_t n = 1;
        while (i + n < copies.size() && copies[i + n].from == copies[i].from + static_cast<int32_t>(n) &&
               copies[i + n].to == copies[i].to + static_cast<int32_t>(n)) {
            ++n;
        }
        for (int il = 0; il < cache.n_layer(); ++il) {
            const kv::KvCache::LayerView view = cache.layer_view(il);
            auto* k = static_cast<std::byte*>(m.k[static_cast<size_t>(il)]);
            auto* v = static_cast<std::byte*>(m.v[static_cast<size_t>(il)]);
            copy_on_device(k + copies[i].to * view.k_row_bytes, k + copies[i].from * view.k_row_bytes,
                           n * view.k_row_bytes);
            copy_on_device(v + copies[i].to * view.v_row_bytes, v + copies[i].from * view.v_row_bytes,
                           n * view.v_row_bytes);
        }
        i += n;
    }
}

// The first time a layer of a pool held here stores K: the host calibrates the K transform from the
// batch's first rows (as many as the staging buffer holds; kv::KvCache::store takes the whole
// batch on the CPU), and the device gets it.
void CudaBackend::shape_keys(KvMirror& m, kv::KvCache& cache, int layer, const float* k, int64_t n_rows) {
    const auto il = static_cast<size_t>(layer);
    if (m.calibrated[il] != 0 || !cache.shapes_keys()) return;
    m.calibrated[il] = 1;
    const kv::KvCache::LayerView before = cache.layer_view(layer);
    const size_t width = static_cast<size_t>(before.n_head_kv) * static_cast<size_t>(before.head_dim_k);
    const int64_t rows = std::min<int64_t>(n_rows, static_cast<int64_t>(kCudaHostStagingBytes / (width * 4)));
    auto* host = reinterpret_cast<float*>(stage_all());
    copy_to_host(host, k, static_cast<size_t>(rows) * width * sizeof(float));
    cache.calibrate_keys(layer, kv::KeySample{.k = host, .n_rows = rows});
    restart_staging();
    const kv::KvCache::LayerView view = cache.layer_view(layer);
    if (view.k_center == nullptr) return;  // too few rows: K stays as it is, as on the host
    m.shape[il] = alloc(pools::kScratch, 3 * width * sizeof(float), "K transform");
    auto* d = static_cast<float*>(m.shape[il].data());
    upload_through_staging(d, view.k_center, width * sizeof(float));
    upload_through_staging(d + width, view.k_scale, width * sizeof(float));
    upload_through_staging(d + 2 * width, view.q_scale, width * sizeof(float));
}

cuda::KvLayout CudaBackend::device_layout(const KvMirror& m, const kv::KvCache& cache, int layer, bool is_k) const {
    const auto il = static_cast<size_t>(layer);
    const kv::KvCache::LayerView view = cache.layer_view(layer);
    cuda::KvLayout layout = layout_of(view, is_k, is_k ? m.k[il] : m.v[il]);
    if (is_k && !m.shape[il].empty()) {
        const auto* d = static_cast<const float*>(m.shape[il].data());
        const size_t width = static_cast<size_t>(view.n_head_kv) * static_cast<size_t>(view.head_dim_k);
        layout.center = d;
        layout.scale = d + width;
        layout.inv_scale = d + 2 * width;
    }
    return layout;
}

void CudaBackend::kv_store(kv::KvCache& cache, int layer, std::span<const int32_t> cells, const float* k,
                           const float* v) {
    KvMirror& m = mirror_of(cache);
    const kv::KvCache::LayerView view = cache.layer_view(layer);
    const int64_t n = static_cast<int64_t>(cells.size());
    if (n == 0) return;
    if (m.on_device) {
        follow_copy_on_write(m, cache);
        shape_keys(m, cache, layer, k, n);
        const auto* d_cells =
            static_cast<const int32_t*>(upload(m.cells, cells.data(), cells.size_bytes(), "KV cells"));
        cuda::kv_store(device_layout(m, cache, layer, true), k, d_cells, n, stream_);
        cuda::kv_store(device_layout(m, cache, layer, false), v, d_cells, n, stream_);
        return;
    }
    // A host pool: the rows come back through the staging buffer, as many as it holds at a time,
    // and the host converts them, exactly as on the CPU path (the K transform, when there is one,
    // is calibrated from the first of those chunks).
    const size_t k_width = static_cast<size_t>(view.n_head_kv) * static_cast<size_t>(view.head_dim_k);
    const size_t v_width = static_cast<size_t>(view.n_head_kv) * static_cast<size_t>(view.head_dim_v);
    const int64_t chunk =
        std::max<int64_t>(1, static_cast<int64_t>(kCudaHostStagingBytes / ((k_width + v_width) * sizeof(float))));
    auto* host = reinterpret_cast<float*>(stage_all());
    for (int64_t at = 0; at < n; at += chunk) {
        const int64_t rows = std::min(chunk, n - at);
        float* k_host = host;
        float* v_host = host + static_cast<size_t>(rows) * k_width;
        cuda::copy_to_host(k_host, k + static_cast<size_t>(at) * k_width, static_cast<size_t>(rows) * k_width * 4,
                           stream_);
        copy_to_host(v_host, v + static_cast<size_t>(at) * v_width, static_cast<size_t>(rows) * v_width * 4);
        if (cache.needs_key_calibration(layer)) cache.calibrate_keys(layer, kv::KeySample{.k = k_host, .n_rows = rows});
        cache.store(layer, cells.subspan(static_cast<size_t>(at), static_cast<size_t>(rows)), k_host, v_host);
    }
    restart_staging();
}

// The cache's bookkeeping on the device, when it changed: cell sequence sets, positions, the offsets
// of each sequence's block table, the tables.
void CudaBackend::upload_meta(KvMirror& m, const kv::KvCache& cache) {
    if (m.meta_generation == cache.generation()) return;
    const std::span<const kv::Pos> positions = cache.cell_positions();
    const std::span<const uint64_t> masks = cache.cell_seq_masks();
    const int n_seq = cache.params().n_seq_max;
    size_t n_blocks = 0;
    for (kv::SeqId s = 0; s < n_seq; ++s) n_blocks += cache.seq_blocks(s).size();
    const size_t masks_at = 0, pos_at = masks.size_bytes(), seq_at = pos_at + round16(positions.size_bytes());
    const size_t blocks_at = seq_at + round16((static_cast<size_t>(n_seq) + 1) * sizeof(int32_t));
    grow(m.meta, blocks_at + std::max<size_t>(n_blocks, 1) * sizeof(int32_t), pools::kScratch, "KV cache bookkeeping");
    auto* base = static_cast<uint8_t*>(m.meta.data());
    upload_through_staging(base + masks_at, masks.data(), masks.size_bytes());
    upload_through_staging(base + pos_at, positions.data(), positions.size_bytes());
    // The offsets, whole, before the tables (whose staging may start the buffer over).
    auto* offsets = reinterpret_cast<int32_t*>(stage((static_cast<size_t>(n_seq) + 1) * sizeof(int32_t)));
    offsets[0] = 0;
    for (kv::SeqId s = 0; s < n_seq; ++s) {
        offsets[s + 1] = offsets[s] + static_cast<int32_t>(cache.seq_blocks(s).size());
    }
    cuda::copy_to_device(base + seq_at, offsets, (static_cast<size_t>(n_seq) + 1) * sizeof(int32_t), stream_);
    size_t at = 0;  // (not offsets[s]: that staging may be reused by now)
    for (kv::SeqId s = 0; s < n_seq; ++s) {
        const std::span<const int32_t> table = cache.seq_blocks(s);
        upload_through_staging(base + blocks_at + at * sizeof(int32_t), table.data(), table.size_bytes());
        at += table.size();
    }
    m.cell_seqs = reinterpret_cast<const uint64_t*>(base + masks_at);
    m.cell_pos = reinterpret_cast<const int32_t*>(base + pos_at);
    m.blocks = reinterpret_cast<const int32_t*>(base + blocks_at);
    m.seq_blocks = reinterpret_cast<const int32_t*>(base + seq_at);
    m.meta_generation = cache.generation();
}

// The batch's positions and sequences, and for a host pool's layer its K transform
// (kv/key_transform.h; a pool held here has its own on the device).
void CudaBackend::upload_batch(KvMirror& m, const kv::KvCache& cache, int layer, const BatchRows& rows,
                               const int32_t*& q_pos, const int32_t*& q_seq, const float*& q_scale,
                               const float*& k_center) {
    const kv::KvCache::LayerView view = cache.layer_view(layer);
    const size_t n = static_cast<size_t>(rows.n);
    const size_t transform =
        !m.on_device && view.q_scale != nullptr ? static_cast<size_t>(view.n_head_kv) * view.head_dim_k : 0;
    const size_t bytes = (2 * n + 2 * transform) * sizeof(int32_t);
    auto* st = reinterpret_cast<int32_t*>(stage(bytes));  // composed in place
    std::copy(rows.positions, rows.positions + rows.n, st);
    std::copy(rows.seq_ids, rows.seq_ids + rows.n, st + n);
    if (transform > 0) {
        std::memcpy(st + 2 * n, view.q_scale, transform * sizeof(float));
        std::memcpy(st + 2 * n + transform, view.k_center, transform * sizeof(float));
    }
    q_pos = static_cast<const int32_t*>(
        upload_staged(m.batch, reinterpret_cast<uint8_t*>(st), bytes, "attention batch arrays"));
    q_seq = q_pos + rows.n;
    q_scale = transform > 0 ? reinterpret_cast<const float*>(q_pos + 2 * n) : nullptr;
    k_center = transform > 0 ? q_scale + transform : nullptr;
    if (m.on_device && !m.shape[static_cast<size_t>(layer)].empty()) {
        const cuda::KvLayout k = device_layout(m, cache, layer, true);
        q_scale = k.inv_scale;
        k_center = k.center;
    }
}

void CudaBackend::attention(const float* q, const BatchRows& rows, const kv::KvCache& cache, int layer,
                            const ops::AttentionParams& params, float* out) {
    if (params.sinks != nullptr) {
        throw std::invalid_argument(name_ +
                                    ": attention sinks (gpt-oss) are not implemented in the CUDA kernel; run the "
                                    "model on the CPU (-ngl 0) or on the virtual device");
    }
    if (rows.n <= 0) return;
    KvMirror& m = mirror_of(cache);
    const kv::KvCache::LayerView view = cache.layer_view(layer);
    if (view.head_dim_k != params.head_dim || view.head_dim_v != params.head_dim) {
        throw std::invalid_argument(name_ + ": attention with K heads of " + std::to_string(view.head_dim_k) +
                                    " and V heads of " + std::to_string(view.head_dim_v) + " for head_dim " +
                                    std::to_string(params.head_dim) + " (the CUDA kernel needs them equal)");
    }
    for (kv::SeqId s : std::span<const kv::SeqId>(rows.seq_ids, static_cast<size_t>(rows.n))) {
        if (s < 0 || s >= cache.params().n_seq_max) {
            throw std::invalid_argument(name_ + ": attention for sequence " + std::to_string(s) + " of a cache of " +
                                        std::to_string(cache.params().n_seq_max));
        }
    }
    const int32_t* q_pos = nullptr;
    const int32_t* q_seq = nullptr;
    const float* q_scale = nullptr;
    const float* k_center = nullptr;
    upload_meta(m, cache);
    upload_batch(m, cache, layer, rows, q_pos, q_seq, q_scale, k_center);

    void* k = nullptr;
    void* v = nullptr;
    if (m.on_device) {
        k = m.k[static_cast<size_t>(layer)];
        v = m.v[static_cast<size_t>(layer)];
    } else {
        // Host K/V: the rows up to the last cell in use come over for this call.
        const std::span<const uint64_t> masks = cache.cell_seq_masks();
        size_t used = masks.size();
        while (used > 0 && masks[used - 1] == 0) --used;
        if (used == 0) used = 1;
        grow(m.host_rows_k, used * view.k_row_bytes, pools::kScratch, "host KV rows (K)");
        grow(m.host_rows_v, used * view.v_row_bytes, pools::kScratch, "host KV rows (V)");
        cuda::copy_to_device(m.host_rows_k.data(), view.k, used * view.k_row_bytes, stream_);
        cuda::copy_to_device(m.host_rows_v.data(), view.v, used * view.v_row_bytes, stream_);
        k = m.host_rows_k.data();
        v = m.host_rows_v.data();
    }
    const cuda::KvAttentionArgs args{.n_head = params.n_head,
                                     .n_head_kv = params.n_head_kv,
                                     .head_dim = params.head_dim,
                                     .scale = params.scale,
                                     .softcap = params.softcap,
                                     .sliding_window = params.sliding_window,
                                     .q_pos = q_pos,
                                     .q_seq = q_seq,
                                     .cell_pos = m.cell_pos,
                                     .cell_seqs = m.cell_seqs,
                                     .capacity = cache.capacity(),
                                     .blocks = m.blocks,
                                     .seq_blocks = m.seq_blocks,
                                     .block_size = cache.params().block_size,
                                     .q_scale = q_scale,
                                     .k_center = k_center};
    cuda::attention_kv(q, rows.n, layout_of(view, true, k), layout_of(view, false, v), args, out, stream_);
}

void CudaBackend::kv_shift(kv::KvCache& cache, int layer, const ops::RopeParams& rope) {
    KvMirror& m = mirror_of(cache);
    if (!cache.has_k_shift()) return;
    if (m.on_device) return shift_on_device(m, cache, layer, rope);
    // A host pool: the CPU's rope on the host, as the CPU path shifts (freq_factors are on the
    // device: copied back).
    const kv::KvCache::LayerView view = cache.layer_view(layer);
    ops::RopeParams host_rope = rope;
    if (rope.freq_factors != nullptr) {
        const int pairs = rope.n_dims / 2;
        if (pairs > kMaxRopePairs) {
            throw std::invalid_argument(name_ + ": a K shift with " + std::to_string(rope.n_dims) +
                                        " rotated dimensions (at most " + std::to_string(2 * kMaxRopePairs) + ")");
        }
        copy_to_host(factors_.data(), rope.freq_factors, static_cast<size_t>(pairs) * sizeof(float));
        host_rope.freq_factors = factors_.data();
    }
    cache.apply_k_shift(layer, [&](float* k_rows, const int32_t* deltas, int n_rows) {
        ops::rope(k_rows, deltas, n_rows, view.n_head_kv, view.head_dim_k, host_rope);
    });
}

// K held here: the shifted cells' K read back to floats (un-rotated, un-shaped), RoPE by each cell's
// delta, stored again, kShiftRows cells at a time, all on the device (as the host's apply_k_shift
// does on its storage).
void CudaBackend::shift_on_device(KvMirror& m, const kv::KvCache& cache, int layer, const ops::RopeParams& rope) {
    const kv::KvCache::LayerView view = cache.layer_view(layer);
    const size_t width = static_cast<size_t>(view.n_head_kv) * static_cast<size_t>(view.head_dim_k);
    grow(shift_rows_, kShiftRows * width * sizeof(float), pools::kScratch, "K shift rows");
    grow(shift_cells_, 2 * kShiftRows * sizeof(int32_t), pools::kScratch, "K shift cells");
    const cuda::KvLayout k = device_layout(m, cache, layer, true);
    const std::span<const kv::Pos> shifts = cache.cell_shifts();
    const std::span<const uint64_t> masks = cache.cell_seq_masks();
    auto* d_cells = static_cast<int32_t*>(shift_cells_.data());
    int32_t* staged = nullptr;
    int64_t n = 0;
    const auto flush = [&] {
        cuda::copy_to_device(d_cells, staged, 2 * kShiftRows * sizeof(int32_t), stream_);
        cuda::kv_load(k, d_cells, n, shift_rows_.f32(), stream_);
        cuda::rope(shift_rows_.f32(), d_cells + kShiftRows, n, view.n_head_kv, view.head_dim_k, rope_args(rope),
                   stream_);
        cuda::kv_store(k, shift_rows_.f32(), d_cells, n, stream_);
        n = 0;
    };
    for (size_t c = 0; c < shifts.size(); ++c) {
        if (shifts[c] == 0 || masks[c] == 0) continue;
        if (n == 0) staged = reinterpret_cast<int32_t*>(stage(2 * kShiftRows * sizeof(int32_t)));
        staged[n] = static_cast<int32_t>(c);
        staged[kShiftRows + n] = shifts[c];
        if (++n == kShiftRows) flush();
    }
    if (n > 0) flush();
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int ordinal, uint64_t capacity) {
    return std::make_unique<CudaBackend>(ordinal, capacity);
}

std::unique_ptr<Backend> make_cuda_unified_backend(int ordinal, memory::Device& host) {
    return std::make_unique<CudaBackend>(ordinal, host);
}

int cuda_device_count() {
    try {
        return cuda::device_count();
    } catch (const cuda::CudaError&) {
        return 0;
    }
}

bool cuda_device_integrated(int ordinal) {
    try {
        return cuda::device_integrated(ordinal);
    } catch (const cuda::CudaError&) {
        return false;
    }
}

}  // namespace fitllm::backend
