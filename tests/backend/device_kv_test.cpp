// The device side of a model's KV cache and the device's host memory: every pool a model's cache
// attaches to its device is detached when the cache goes (Backend::detach_kv, ModelCache::on_close),
// so a server making and dropping caches keeps nothing; and a device's host-side buffers are
// charged to the host's "staging" pool (Backend::bind_host) as the plan counts them
// (backend::host_bytes_for, engine::Plan::device_host), fixed whatever the context.
// The same on a CUDA device is in CudaDeviceKv (skips without one, saying why).
#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/virtual_device.h"
#include "engine/plan.h"
#include "gguf/gguf_reader.h"
#include "kv/cache.h"
#include "memory/device.h"
#include "memory/pool.h"
#include "model/model.h"
#include "model/tiny_gemma3.h"
#include "ops/thread_pool.h"
#include "test_support.h"

#ifdef FITLLM_CUDA
#include "backend/cuda/kernels.h"
#endif

namespace fitllm {
namespace {

kv::CacheParams cache_params(int n_cells, quant::GgmlType type = quant::GgmlType::F16) {
    kv::CacheParams p;
    p.n_cells = n_cells;
    p.n_seq_max = 2;
    p.block_size = 16;
    p.type_k = p.type_v = type;
    return p;
}

void decode_a_little(model::Model& m, kv::ModelCache& cache, ops::ThreadPool& pool) {
    std::vector<int32_t> tokens = {1, 7, 3, 9, 12, 5, 2, 8, 4, 6, 11, 10, 2, 4, 6, 1, 3, 5, 7, 9};
    std::vector<int32_t> pos(tokens.size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
    std::vector<float> logits(static_cast<size_t>(m.n_vocab()));
    m.forward(tokens, pos, cache, logits.data(), false, pool);
    const int32_t t = 3, p = static_cast<int32_t>(tokens.size());
    m.forward(std::span(&t, 1), std::span(&p, 1), cache, logits.data(), false, pool);
}

// Caches made, moved, assigned over and dropped, as sessions of a server come and go: the device
// holds exactly the live caches' pools.
void check_attach_and_detach(backend::Backend& dev, const gguf::GgufFile& file, int n_offload) {
    ops::ThreadPool pool(2);
    auto m = model::Model::load(file, {.offload = &dev, .n_offload_layers = n_offload});
    int per_cache = 0;
    {
        // (Sizes at which the windowed layers get a pool of their own: the pools per cache stay the same.)
        kv::ModelCache a = m->make_cache(cache_params(256), 32);
        per_cache = dev.attached_kv_pools();
        EXPECT_GT(per_cache, 0);
        decode_a_little(*m, a, pool);
        kv::ModelCache b = m->make_cache(cache_params(512), 32);
        EXPECT_EQ(dev.attached_kv_pools(), 2 * per_cache);
        kv::ModelCache moved = std::move(b);
        EXPECT_EQ(dev.attached_kv_pools(), 2 * per_cache);
        decode_a_little(*m, moved, pool);
        a = m->make_cache(cache_params(1024), 32);  // the old a's pools go
        EXPECT_EQ(dev.attached_kv_pools(), 2 * per_cache);
        decode_a_little(*m, a, pool);
    }
    EXPECT_EQ(dev.attached_kv_pools(), 0);
    for (int i = 0; i < 5; ++i) {
        kv::ModelCache c = m->make_cache(cache_params(64), 32);
        decode_a_little(*m, c, pool);
    }
    EXPECT_EQ(dev.attached_kv_pools(), 0);
}

TEST(DeviceKv, EveryPoolAttachedIsDetachedWhenItsCacheGoes) {
    const auto bytes = test::tiny_gemma3_bytes({.n_layer = 6});  // windowed and full pools
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    backend::VirtualDevice dev("virtual", 1ull << 30);
    EXPECT_FALSE(dev.holds_kv_storage());  // it reads the pools' own storage
    for (const int ngl : {1, 6, 7}) {
        SCOPED_TRACE("ngl " + std::to_string(ngl));
        check_attach_and_detach(dev, file, ngl);
        // Nothing of the caches is left charged to the device either.
        EXPECT_EQ(dev.memory().pool(memory::pool_names::kKv).live(), 0u);
    }
}

// A device whose every op is refused: only what Backend itself does (alloc, bind_host) runs.
class HostBytesDevice final : public backend::Backend {
public:
    explicit HostBytesDevice(uint64_t host_bytes) : Backend("fake", 1 << 20), host_bytes_(host_bytes) {}
    std::string name() const override { return "fake"; }
    bool unified() const override { return false; }
    uint64_t host_bytes() const override { return host_bytes_; }
    void copy_to_device(void*, const void*, size_t) override { refuse(); }
    void copy_to_host(void*, const void*, size_t) override { refuse(); }
    void copy_on_device(void*, const void*, size_t) override { refuse(); }
    void synchronize() override {}
    void matmul(const ops::WeightView&, const float*, int, float*) override { refuse(); }
    void rms_norm(const float*, const float*, float, int64_t, int64_t, float*) override { refuse(); }
    void rope(float*, const int32_t*, int64_t, int, int, const ops::RopeParams&) override { refuse(); }
    void add(const float*, const float*, int64_t, float*) override { refuse(); }
    void add_bias(float*, const float*, int64_t, int64_t) override { refuse(); }
    void scale(float*, int64_t, float) override { refuse(); }
    void swiglu(const float*, const float*, int64_t, float*) override { refuse(); }
    void geglu(const float*, const float*, int64_t, float*) override { refuse(); }
    void softcap(float*, int64_t, float) override { refuse(); }
    void attach_kv(kv::KvCache&, bool) override { refuse(); }
    void detach_kv(const kv::KvCache&) override {}
    int attached_kv_pools() const override { return 0; }
    bool holds_kv_storage() const override { return false; }
    void kv_store(kv::KvCache&, int, std::span<const int32_t>, const float*, const float*) override { refuse(); }
    void attention(const float*, const backend::BatchRows&, const kv::KvCache&, int, const ops::AttentionParams&,
                   float*) override {
        refuse();
    }
    void kv_shift(kv::KvCache&, int, const ops::RopeParams&) override { refuse(); }

protected:
    void* raw_alloc(size_t) override { refuse(); }
    void raw_free(void*) noexcept override {}

private:
    [[noreturn]] static void refuse() { throw std::logic_error("not for this test"); }
    uint64_t host_bytes_;
};

TEST(DeviceHostBytes, BindHostChargesTheHostsStagingPoolWhileTheDeviceLives) {
    memory::Device host("host", 10000);
    memory::Pool& staging = host.pool(memory::pool_names::kStaging);
    {
        HostBytesDevice dev(3000);
        EXPECT_EQ(dev.host_charged_bytes(), 0u);
        dev.bind_host(host);
        EXPECT_EQ(staging.live(), 3000u);
        EXPECT_EQ(dev.host_charged_bytes(), 3000u);
        dev.bind_host(host);  // again: replaced, not added
        EXPECT_EQ(staging.live(), 3000u);
        HostBytesDevice big(9000);
        EXPECT_THROW(big.bind_host(host), memory::BudgetError);  // 3000 + 9000 > 10000
        EXPECT_EQ(staging.live(), 3000u);
    }
    EXPECT_EQ(staging.live(), 0u);
    // The virtual device keeps nothing on the host for its copies.
    backend::VirtualDevice dev("virtual", 1 << 20);
    EXPECT_EQ(dev.host_bytes(), 0u);
    dev.bind_host(host);
    EXPECT_EQ(staging.live(), 0u);
}

TEST(DeviceHostBytes, ThePlanCountsThemForACudaDeviceAndTheyStayFlat) {
    EXPECT_EQ(backend::host_bytes_for("cuda0"), backend::kCudaHostStagingBytes);
    EXPECT_EQ(backend::host_bytes_for("cuda"), backend::kCudaHostStagingBytes);
    EXPECT_EQ(backend::host_bytes_for("virtual"), 0u);
    const auto file = gguf::GgufFile::open((test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf").string());
    const engine::ModelShape shape = engine::model_shape(file);
    engine::PlanParams q{.n_ctx = 256, .n_batch = 64, .n_threads = 2, .budget = 1ull << 30};
    q.device = "virtual";
    q.n_gpu_layers = 3;
    const engine::Plan virt = engine::make_plan(shape, q);
    EXPECT_EQ(virt.device_host, 0u);
    q.device = "cuda0";  // planned, not opened
    const engine::Plan cuda = engine::make_plan(shape, q);
    EXPECT_EQ(cuda.device_host, backend::kCudaHostStagingBytes);
    EXPECT_EQ(cuda.total(), virt.total() + backend::kCudaHostStagingBytes);
    for (const int n_ctx : {4096, 65536}) {
        q.n_ctx = n_ctx;
        const engine::Plan longer = engine::make_plan(shape, q);
        EXPECT_EQ(longer.device_host, cuda.device_host);
        EXPECT_EQ(longer.total(), cuda.total()) << "-c " << n_ctx;  // everything else is on the device
        EXPECT_GT(longer.device.kv, cuda.device.kv);
    }
    q.n_gpu_layers = 0;  // nothing offloaded: nothing staged
    EXPECT_EQ(engine::make_plan(shape, q).device_host, 0u);
}

TEST(DeviceHostBytes, FitllmPlanShowsTheStagingOfACudaDevice) {
    const std::string exe = test::fitllm_exe();
    const std::string model = (test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf").string();
    const auto r = test::run_command(exe + " plan -m " + model + " -c 256 --device cuda0 -ngl 2 --vram 1G 2>&1");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("device staging"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("1.00 MiB"), std::string::npos) << r.output;
    const auto j = test::run_command(exe + " plan -m " + model + " -c 256 --device cuda0 -ngl 2 --vram 1G --json 2>&1");
    ASSERT_EQ(j.status, 0) << j.output;
    EXPECT_NE(j.output.find("\"device_staging\": " + std::to_string(backend::kCudaHostStagingBytes)), std::string::npos)
        << j.output;
}

#ifdef FITLLM_CUDA

// On a CUDA device: the pools' device memory comes back when their caches go, and the staging buffer
// is charged to the host.
TEST(CudaDeviceKv, PoolsAreFreedWhenTheirCachesGoAndTheStagingIsCharged) {
    const std::string why = backend::cuda::no_device_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    const auto bytes = test::tiny_gemma3_bytes({.n_layer = 6});
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    auto dev = backend::open_device("cuda0", 1ull << 30);
    EXPECT_TRUE(dev->holds_kv_storage());
    memory::Device host("host", 1ull << 30);
    dev->bind_host(host);
    EXPECT_EQ(host.pool(memory::pool_names::kStaging).live(), backend::kCudaHostStagingBytes);
    ops::ThreadPool pool(2);
    auto m = model::Model::load(file, {.offload = dev.get(), .n_offload_layers = 7});
    {  // warm-up: the device's own buffers (activations, staging, bookkeeping) exist afterwards
        kv::ModelCache c = m->make_cache(cache_params(64), 32);
        decode_a_little(*m, c, pool);
    }
    uint64_t free_before = 0, total = 0;
    backend::cuda::memory_info(free_before, total);
    for (int i = 0; i < 4; ++i) {
        kv::ModelCache c = m->make_cache(cache_params(65536), 32);  // MiBs of K/V each
        decode_a_little(*m, c, pool);
        uint64_t free_now = 0;
        backend::cuda::memory_info(free_now, total);
        EXPECT_LT(free_now, free_before);
    }
    EXPECT_EQ(dev->attached_kv_pools(), 0);
    uint64_t free_after = 0;
    backend::cuda::memory_info(free_after, total);
    // cudaFree returns the memory; allow the allocator 2 MiB of granularity.
    EXPECT_GE(free_after + (2u << 20), free_before);
    check_attach_and_detach(*dev, file, 7);
}

#else

TEST(CudaDeviceKv, BuiltWithoutCuda) {
    GTEST_SKIP() << "built without CUDA (configure with -DFITLLM_CUDA=ON where nvcc is installed)";
}

#endif

}  // namespace
}  // namespace fitllm
