// The CUDA device (backend/cuda_backend.h): backend::Backend over the kernels of kernels.h, one
// stream per device. Compiled by the host compiler; every CUDA call is behind kernels.h.
//
// Memory: buffers are cudaMalloc'ed after Backend::alloc charged the device's pool. The batch's
// small host arrays (positions, cells, the cache's bookkeeping) go to the device through buffers
// charged to "scratch", copied only when they change: the layers of a batch pass the same ones,
// and a copy from pageable host memory waits for the stream, which would leave the GPU idle
// between layers while the host queues the next kernels.
//
// The KV cache: a pool made for this device (on_device) keeps its K/V here, one buffer per layer
// ([capacity] rows laid out as the host pool's LayerView), written by kv_store's kernel; the host
// KvCache keeps the bookkeeping (its own K/V storage, charged to this device's "kv" pool by
// kv::ModelCache, stays untouched, so zero pages). Those device buffers are not charged again.
// A host pool (offload_kv off) is written on the host (kv::KvCache::store, the CPU's exact
// conversion) and its used rows are copied to a device buffer for each attention call.
// kv::KvCache::place() copies a shared, partly filled last block of a sequence (after seq_cp) in its
// host storage; for a pool held here follow_copy_on_write() makes the same copy on the device.
//
// Unified mode (make_cuda_unified_backend, integrated GPUs): the pools are the host's, every
// buffer above (and the K/V layers) is mapped pinned host memory instead of cudaMalloc, and the
// weights are the mapped file's pages, registered by map_host() and read in place.
#include "backend/cuda_backend.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "ops/rope.h"

namespace fitllm::backend {
namespace {

namespace pools = memory::pool_names;

// Room left on the GPU for the CUDA context's own allocations (kernels, cuBLAS-free, but the
// runtime still takes some) when the caller asks for more than is free.
constexpr uint64_t kFreeMargin = 512ull << 20;

uint64_t usable_capacity(int ordinal, uint64_t requested) {
    cuda::set_device(ordinal);
    uint64_t free_bytes = 0, total_bytes = 0;
    cuda::memory_info(free_bytes, total_bytes);
    const uint64_t usable = free_bytes > kFreeMargin ? free_bytes - kFreeMargin : 0;
    return requested == 0 ? usable : std::min(requested, usable);
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
        cuda::destroy_stream(stream_);
        for (const void* p : registered_) cuda::host_unregister(p);
    }

    std::string name() const override { return name_; }
    bool unified() const override { return unified_; }
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
    void geglu(const float* gate, const float* up, int64_t n, float* y) override {
        cuda::geglu(gate, up, n, y, stream_);
    }
    void softcap(float* x, int64_t n, float cap) override { cuda::softcap(x, n, cap, stream_); }

    void attach_kv(kv::KvCache& cache, bool on_device) override;
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
    // Host bytes last copied to buf (see upload()).
    struct Upload {
        std::vector<uint8_t> last;
        Buffer buf;
    };

    // The device side of one attached kv::KvCache.
    struct KvMirror {
        bool on_device = false;
        std::vector<void*> k, v;                   // on_device: per layer, [capacity] rows (uncharged, see top)
        Upload meta;                               // cell positions, sequence masks, block tables
        Upload cells;                              // the cells kv_store writes
        Upload batch;                              // attention's positions, sequences (and K transform)
        std::vector<std::vector<int32_t>> tables;  // each sequence's block table at the last kv_store
        const int32_t* cell_pos = nullptr;         // inside meta
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
                              .freq_factors = p.freq_factors};
    }

    KvMirror& mirror_of(const kv::KvCache& cache) {
        const auto it = kv_.find(&cache);
        if (it == kv_.end()) {
            throw std::invalid_argument(name_ + ": a KV cache pool that was not attached (attach_kv) is used");
        }
        return it->second;
    }

    // Copies `bytes` of host data to up.buf unless it holds them already; returns up.buf.
    const void* upload(Upload& up, const void* host, size_t bytes, const char* what) {
        if (bytes == 0) return nullptr;
        const auto* h = static_cast<const uint8_t*>(host);
        if (up.last.size() == bytes && std::memcmp(up.last.data(), h, bytes) == 0) return up.buf.data();
        grow(up.buf, bytes, pools::kScratch, what);
        cuda::copy_to_device(up.buf.data(), host, bytes, stream_);
        up.last.assign(h, h + bytes);
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
    void upload_meta(KvMirror& m, const kv::KvCache& cache, int layer, const BatchRows& rows, const int32_t*& q_pos,
                     const int32_t*& q_seq, const float*& q_scale, const float*& k_center);

    std::string name_;
    int ordinal_;
    bool unified_ = false;
    cuda::Stream stream_;
    std::vector<const void*> registered_;  // map_host's ranges
    Upload positions_;                     // rope's
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
    if (on_device) {
        for (int il = 0; il < cache.n_layer(); ++il) {
            const kv::KvCache::LayerView view = cache.layer_view(il);
            for (const bool is_k : {true, false}) {
                if (!cuda::kv_store_supports(is_k ? view.type_k : view.type_v)) {
                    throw std::invalid_argument(
                        name_ + ": K/V type " + std::string(quant::traits(is_k ? view.type_k : view.type_v).name) +
                        " cannot be stored on a CUDA device yet (f32, f16, bf16, q8_0 can; or keep the KV on the "
                        "host with --no-kv-offload)");
                }
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

// Before a batch's rows are stored: a sequence whose table kept its entries but the last one, which
// is now another block, had that block copied on write by place() (or lost it and got a fresh one:
// then the copy fills only cells that are free, which no token sees). The old block's rows go to
// the new one for every layer, before this batch writes any. Tables that lost or changed earlier
// entries (seq_rm, a sliding window's trim) copy nothing.
void CudaBackend::follow_copy_on_write(KvMirror& m, const kv::KvCache& cache) {
    const int bs = cache.params().block_size;
    m.tables.resize(static_cast<size_t>(cache.params().n_seq_max));
    for (kv::SeqId s = 0; s < cache.params().n_seq_max; ++s) {
        const std::span<const int32_t> table = cache.seq_blocks(s);
        std::vector<int32_t>& old = m.tables[static_cast<size_t>(s)];
        if (!old.empty()) {
            const size_t last = old.size() - 1;
            if (table.size() > last && table[last] != old[last] &&
                std::equal(old.begin(), old.begin() + static_cast<std::ptrdiff_t>(last), table.begin())) {
                const int64_t from = int64_t{old[last]} * bs, to = int64_t{table[last]} * bs;
                const int64_t n_cells = std::min<int64_t>({bs, cache.capacity() - from, cache.capacity() - to});
                for (int il = 0; il < cache.n_layer(); ++il) {
                    const kv::KvCache::LayerView view = cache.layer_view(il);
                    auto* k = static_cast<std::byte*>(m.k[static_cast<size_t>(il)]);
                    auto* v = static_cast<std::byte*>(m.v[static_cast<size_t>(il)]);
                    copy_on_device(k + to * view.k_row_bytes, k + from * view.k_row_bytes, n_cells * view.k_row_bytes);
                    copy_on_device(v + to * view.v_row_bytes, v + from * view.v_row_bytes, n_cells * view.v_row_bytes);
                }
            }
        }
        old.assign(table.begin(), table.end());
    }
}

void CudaBackend::kv_store(kv::KvCache& cache, int layer, std::span<const int32_t> cells, const float* k,
                           const float* v) {
    KvMirror& m = mirror_of(cache);
    const kv::KvCache::LayerView view = cache.layer_view(layer);
    const int64_t n = static_cast<int64_t>(cells.size());
    if (n == 0) return;
    if (m.on_device) {
        follow_copy_on_write(m, cache);
        const auto* d_cells =
            static_cast<const int32_t*>(upload(m.cells, cells.data(), cells.size_bytes(), "KV cells"));
        cuda::kv_store(layout_of(view, true, m.k[static_cast<size_t>(layer)]), k, d_cells, n, stream_);
        cuda::kv_store(layout_of(view, false, m.v[static_cast<size_t>(layer)]), v, d_cells, n, stream_);
        return;
    }
    // A host pool: the rows come back and the host converts them, exactly as on the CPU path.
    const size_t k_floats = static_cast<size_t>(n) * view.n_head_kv * view.head_dim_k;
    const size_t v_floats = static_cast<size_t>(n) * view.n_head_kv * view.head_dim_v;
    std::vector<float> k_host(k_floats), v_host(v_floats);
    copy_to_host(k_host.data(), k, k_floats * sizeof(float));
    copy_to_host(v_host.data(), v, v_floats * sizeof(float));
    cache.store(layer, cells, k_host.data(), v_host.data());
}

void CudaBackend::upload_meta(KvMirror& m, const kv::KvCache& cache, int layer, const BatchRows& rows,
                              const int32_t*& q_pos, const int32_t*& q_seq, const float*& q_scale,
                              const float*& k_center) {
    // The bookkeeping changes only when the batch is placed; the layers of one batch share it.
    const std::span<const kv::Pos> positions = cache.cell_positions();
    const std::span<const uint64_t> masks = cache.cell_seq_masks();
    std::vector<int32_t> blocks, seq_blocks = {0};
    for (kv::SeqId s = 0; s < cache.params().n_seq_max; ++s) {
        const std::span<const int32_t> table = cache.seq_blocks(s);
        blocks.insert(blocks.end(), table.begin(), table.end());
        seq_blocks.push_back(static_cast<int32_t>(blocks.size()));
    }
    const size_t masks_at = 0, pos_at = masks.size_bytes(), blocks_at = pos_at + positions.size_bytes();
    const size_t seq_at = blocks_at + blocks.size() * sizeof(int32_t);
    const size_t bytes = seq_at + seq_blocks.size() * sizeof(int32_t);
    std::vector<uint8_t> meta(bytes);
    std::memcpy(meta.data() + masks_at, masks.data(), masks.size_bytes());
    std::memcpy(meta.data() + pos_at, positions.data(), positions.size_bytes());
    std::memcpy(meta.data() + blocks_at, blocks.data(), blocks.size() * sizeof(int32_t));
    std::memcpy(meta.data() + seq_at, seq_blocks.data(), seq_blocks.size() * sizeof(int32_t));
    const auto* base = static_cast<const uint8_t*>(upload(m.meta, meta.data(), bytes, "KV cache bookkeeping"));
    m.cell_seqs = reinterpret_cast<const uint64_t*>(base + masks_at);
    m.cell_pos = reinterpret_cast<const int32_t*>(base + pos_at);
    m.blocks = reinterpret_cast<const int32_t*>(base + blocks_at);
    m.seq_blocks = reinterpret_cast<const int32_t*>(base + seq_at);

    // Then the batch's positions and sequences, and the K transform of a host pool's layer
    // (kv/key_transform.h; none for a pool held here, whose K the kernels store as is).
    const kv::KvCache::LayerView view = cache.layer_view(layer);
    const size_t n = static_cast<size_t>(rows.n);
    const size_t transform =
        !m.on_device && view.q_scale != nullptr ? static_cast<size_t>(view.n_head_kv) * view.head_dim_k : 0;
    std::vector<int32_t> batch(2 * n + 2 * transform);
    std::copy(rows.positions, rows.positions + rows.n, batch.begin());
    std::copy(rows.seq_ids, rows.seq_ids + rows.n, batch.begin() + rows.n);
    if (transform > 0) {
        std::memcpy(batch.data() + 2 * n, view.q_scale, transform * sizeof(float));
        std::memcpy(batch.data() + 2 * n + transform, view.k_center, transform * sizeof(float));
    }
    q_pos = static_cast<const int32_t*>(
        upload(m.batch, batch.data(), batch.size() * sizeof(int32_t), "attention batch arrays"));
    q_seq = q_pos + rows.n;
    q_scale = transform > 0 ? reinterpret_cast<const float*>(q_pos + 2 * n) : nullptr;
    k_center = transform > 0 ? q_scale + transform : nullptr;
}

void CudaBackend::attention(const float* q, const BatchRows& rows, const kv::KvCache& cache, int layer,
                            const ops::AttentionParams& params, float* out) {
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
    upload_meta(m, cache, layer, rows, q_pos, q_seq, q_scale, k_center);

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
    const kv::KvCache::LayerView view = cache.layer_view(layer);
    // The CPU's rope on the host, as the CPU path shifts (freq_factors are on the device: copied).
    std::vector<float> factors;
    ops::RopeParams host_rope = rope;
    if (rope.freq_factors != nullptr) {
        factors.resize(static_cast<size_t>(rope.n_dims / 2));
        copy_to_host(factors.data(), rope.freq_factors, factors.size() * sizeof(float));
        host_rope.freq_factors = factors.data();
    }
    const auto shift = [&] {
        cache.apply_k_shift(layer, [&](float* k_rows, const int32_t* deltas, int n_rows) {
            ops::rope(k_rows, deltas, n_rows, view.n_head_kv, view.head_dim_k, host_rope);
        });
    };
    if (!m.on_device) return shift();
    // K held here: kv::KvCache re-rotates the shifted cells in its own (otherwise unused) host
    // storage, so the layer's used rows go there, are shifted by the host's exact code, and come
    // back. A context shift is rare; it makes those host pages resident.
    const std::span<const uint64_t> masks = cache.cell_seq_masks();
    size_t used = masks.size();
    while (used > 0 && masks[used - 1] == 0) --used;
    const size_t bytes = used * view.k_row_bytes;
    auto* host_k = const_cast<std::byte*>(view.k);  // the cache's own storage, read-only in the view
    copy_to_host(host_k, m.k[static_cast<size_t>(layer)], bytes);
    shift();
    cuda::copy_to_device(m.k[static_cast<size_t>(layer)], host_k, bytes, stream_);
    cuda::synchronize(stream_);  // host_k may change under the copy otherwise (the next shift, a store)
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
