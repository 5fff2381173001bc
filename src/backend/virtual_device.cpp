#include "backend/virtual_device.h"

#include <cstring>
#include <new>

#include "ops/activation.h"
#include "ops/attention_kv.h"
#include "ops/matmul.h"
#include "ops/norm.h"

namespace fitllm::backend {

VirtualDevice::VirtualDevice(std::string name, uint64_t capacity)
    : Backend(name, capacity), memory_name_(std::move(name)) {
    charge_scratch_as_it_grows();
}

VirtualDevice::VirtualDevice(std::string name, memory::Device& host)
    : Backend(host), memory_name_(std::move(name)), unified_(true) {
    charge_scratch_as_it_grows();
}

// The ops' working memory is the device's too: charged to its "scratch" pool as it grows.
void VirtualDevice::charge_scratch_as_it_grows() {
    scratch_.on_grow([this](size_t, size_t bytes) {
        if (bytes <= scratch_bytes_) return;
        memory().pool(memory::pool_names::kScratch).reserve(bytes - scratch_bytes_, "op scratch of " + memory_name_);
        scratch_bytes_ = bytes;
    });
}

VirtualDevice::~VirtualDevice() {
    if (scratch_bytes_ > 0) memory().pool(memory::pool_names::kScratch).release(scratch_bytes_);
}

ops::ThreadPool& VirtualDevice::threads() {
    if (threads_ != nullptr) return *threads_;
    if (!own_threads_) own_threads_ = std::make_unique<ops::ThreadPool>(1);
    return *own_threads_;
}

// Each buffer is its own allocation (never the host's memory), kBufferAlign-aligned, its size
// kept in front of it.
void* VirtualDevice::raw_alloc(size_t bytes) {
    auto* base = static_cast<std::byte*>(::operator new (bytes + kBufferAlign, std::align_val_t{kBufferAlign}));
    std::memcpy(base, &bytes, sizeof bytes);
    allocated_ += bytes;
    return base + kBufferAlign;
}

void VirtualDevice::raw_free(void* data) noexcept {
    std::byte* base = static_cast<std::byte*>(data) - kBufferAlign;
    size_t bytes = 0;
    std::memcpy(&bytes, base, sizeof bytes);
    allocated_ -= bytes;
    ::operator delete (base, std::align_val_t{kBufferAlign});
}

void VirtualDevice::copy_to_device(void* dst, const void* src, size_t bytes) {
    std::memcpy(dst, src, bytes);
}
void VirtualDevice::copy_to_host(void* dst, const void* src, size_t bytes) {
    std::memcpy(dst, src, bytes);
}
void VirtualDevice::copy_on_device(void* dst, const void* src, size_t bytes) {
    std::memmove(dst, src, bytes);
}

void VirtualDevice::matmul(const ops::WeightView& w, const float* x, int n_tok, float* y) {
    ops::matmul(w, x, n_tok, y, threads(), scratch_);
}
void VirtualDevice::matmul_in_runs(const ops::WeightView& w, const float* x, int n_tok, float* y,
                                   std::span<const ops::TokenPlace> places) {
    ops::matmul(w, x, n_tok, y, threads(), scratch_, places);
}
void VirtualDevice::rms_norm(const float* x, const float* weight, float eps, int64_t n_rows, int64_t n, float* y) {
    ops::rms_norm(x, weight, eps, n_rows, n, y);
}
void VirtualDevice::rope(float* x, const int32_t* positions, int64_t n_tok, int n_head, int head_dim,
                         const ops::RopeParams& params) {
    ops::rope(x, positions, n_tok, n_head, head_dim, params);
}
void VirtualDevice::add(const float* a, const float* b, int64_t n, float* y) {
    ops::add(a, b, n, y);
}
void VirtualDevice::add_bias(float* x, const float* bias, int64_t n_tok, int64_t n) {
    ops::add_bias(x, bias, n_tok, n);
}
void VirtualDevice::scale(float* x, int64_t n, float s) {
    ops::scale(x, n, s);
}
void VirtualDevice::swiglu(const float* gate, const float* up, int64_t n, float* y) {
    ops::swiglu(gate, up, n, y);
}
void VirtualDevice::swiglu_oai(const float* gate, const float* up, int64_t n, float alpha, float limit, float* y) {
    ops::swiglu_oai(gate, up, n, alpha, limit, y);
}
void VirtualDevice::geglu(const float* gate, const float* up, int64_t n, float* y) {
    ops::geglu(gate, up, n, y);
}
void VirtualDevice::softcap(float* x, int64_t n, float cap) {
    ops::softcap(x, n, cap);
}

// The device's K/V pools are kv::KvCaches charged to its "kv" pool (kv::ModelCache made them
// so); host pools are read in place: both are memory this CPU-executed device reads directly.
void VirtualDevice::attach_kv(kv::KvCache& cache, bool /*on_device*/) {
    attached_.insert(&cache);
}

void VirtualDevice::detach_kv(const kv::KvCache& cache) {
    attached_.erase(&cache);
}

void VirtualDevice::kv_store(kv::KvCache& cache, int layer, std::span<const int32_t> cells, const float* k,
                             const float* v) {
    cache.store(layer, cells, k, v);
}

void VirtualDevice::attention(const float* q, const BatchRows& rows, const kv::KvCache& cache, int layer,
                              const ops::AttentionParams& params, float* out) {
    ops::attention_kv(q, rows.positions, rows.seq_ids, rows.n, cache, layer, params, out, threads(), scratch_);
}

void VirtualDevice::kv_shift(kv::KvCache& cache, int layer, const ops::RopeParams& rope) {
    const kv::KvCache::LayerView view = cache.layer_view(layer);
    cache.apply_k_shift(layer, [&](float* k_rows, const int32_t* deltas, int n_rows) {
        ops::rope(k_rows, deltas, n_rows, view.n_head_kv, view.head_dim_k, rope);
    });
}

}  // namespace fitllm::backend
