#pragma once
// The virtual device (docs/architecture.md, idea 6): a Backend executed on the CPU with the ops:: kernels, but
// with a capacity and pools of its own, buffers allocated apart from the host's and explicit copies
// in and out, so that every placement of layers and KV can be tested (and budgets enforced) on a
// machine without a GPU. Its results are bit-identical to the CPU path: the same kernels run on the
// same bytes.
//
//   auto dev = backend::open_device("virtual", 512ull << 20);   // or VirtualDevice("virtual", cap)
//   auto model = model::Model::load(file, {.offload = dev.get(), .n_offload_layers = 8});
#include <memory>
#include <set>
#include <string>

#include "backend/backend.h"
#include "ops/scratch.h"
#include "ops/thread_pool.h"

namespace fitllm::backend {

class VirtualDevice final : public Backend {
public:
    VirtualDevice(std::string name, uint64_t capacity);
    // Unified: shares the host's memory and budget (Backend::unified()); host must outlive it.
    VirtualDevice(std::string name, memory::Device& host);
    ~VirtualDevice() override;

    std::string name() const override { return memory_name_; }
    bool unified() const override { return unified_; }

    void copy_to_device(void* dst, const void* src, size_t bytes) override;
    void copy_to_host(void* dst, const void* src, size_t bytes) override;
    void copy_on_device(void* dst, const void* src, size_t bytes) override;
    void synchronize() override {}
    void use_threads(ops::ThreadPool& pool) override { threads_ = &pool; }

    void matmul(const ops::WeightView& w, const float* x, int n_tok, float* y) override;
    void matmul_in_runs(const ops::WeightView& w, const float* x, int n_tok, float* y,
                        std::span<const ops::TokenPlace> places) override;
    void rms_norm(const float* x, const float* weight, float eps, int64_t n_rows, int64_t n, float* y) override;
    void rope(float* x, const int32_t* positions, int64_t n_tok, int n_head, int head_dim,
              const ops::RopeParams& params) override;
    void add(const float* a, const float* b, int64_t n, float* y) override;
    void add_bias(float* x, const float* bias, int64_t n_tok, int64_t n) override;
    void scale(float* x, int64_t n, float s) override;
    void swiglu(const float* gate, const float* up, int64_t n, float* y) override;
    void swiglu_oai(const float* gate, const float* up, int64_t n, float alpha, float limit, float* y) override;
    void geglu(const float* gate, const float* up, int64_t n, float* y) override;
    void softcap(float* x, int64_t n, float cap) override;

    void attach_kv(kv::KvCache& cache, bool on_device) override;
    void detach_kv(const kv::KvCache& cache) override;
    int attached_kv_pools() const override { return static_cast<int>(attached_.size()); }
    bool holds_kv_storage() const override { return false; }
    void kv_store(kv::KvCache& cache, int layer, std::span<const int32_t> cells, const float* k,
                  const float* v) override;
    void attention(const float* q, const BatchRows& rows, const kv::KvCache& cache, int layer,
                   const ops::AttentionParams& params, float* out) override;
    void kv_shift(kv::KvCache& cache, int layer, const ops::RopeParams& rope) override;

    bool matmul_supports(quant::GgmlType type) const override {
        return matmul_types_.empty() || matmul_types_.count(type) > 0;
    }
    // For tests: matmul() then takes only these types (as a device without kernels for the others
    // would), so that refusals at load are tested without a GPU. Empty (the default): every type.
    void limit_matmul_types(std::set<quant::GgmlType> types) { matmul_types_ = std::move(types); }

    // Bytes allocated by this device now (its buffers), for tests: what its pools' charges cover.
    uint64_t allocated_bytes() const { return allocated_; }
    // Bytes of its ops' scratch (charged to its "scratch" pool besides the model's buffers).
    uint64_t op_scratch_bytes() const { return scratch_bytes_; }

protected:
    void* raw_alloc(size_t bytes) override;
    void raw_free(void* data) noexcept override;

private:
    ops::ThreadPool& threads();

    void charge_scratch_as_it_grows();

    std::string memory_name_;
    bool unified_ = false;
    std::set<quant::GgmlType> matmul_types_;  // limit_matmul_types; empty: all
    ops::ThreadPool* threads_ = nullptr;
    std::unique_ptr<ops::ThreadPool> own_threads_;  // one thread, until use_threads() is called
    ops::Scratch scratch_;
    uint64_t scratch_bytes_ = 0;  // what scratch_ holds, charged to the device's "scratch" pool
    uint64_t allocated_ = 0;
    std::set<const kv::KvCache*> attached_;  // nothing to free for them: their storage is the pool's
};

}  // namespace fitllm::backend
