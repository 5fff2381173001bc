// The virtual device (backend/virtual_device.h): opening devices by name, buffers charged to its
// pools before they exist, copies in and out, and ops that give the bytes the CPU's ops:: give.
#include "backend/virtual_device.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "memory/pool.h"
#include "ops/activation.h"
#include "ops/matmul.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/thread_pool.h"
#include "quant/quantize.h"

namespace fitllm {
namespace {

std::vector<float> random_floats(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}

TEST(BackendOpen, NamesTheDevicesItKnows) {
    auto dev = backend::open_device("virtual", 1 << 20);
    EXPECT_EQ(dev->name(), "virtual");
    EXPECT_EQ(dev->memory().capacity(), 1u << 20);
    EXPECT_FALSE(dev->unified());
    EXPECT_EQ(backend::open_device("virtual2", 1 << 20)->name(), "virtual2");
    EXPECT_THROW(backend::open_device("tpu", 1 << 20), std::invalid_argument);
    EXPECT_THROW(backend::open_device("virtualx", 1 << 20), std::invalid_argument);
    if (!backend::cuda_built()) {
        EXPECT_EQ(backend::cuda_device_count(), 0);
        try {
            backend::open_device("cuda0", 1 << 20);
            FAIL() << "a build without CUDA opened cuda0";
        } catch (const std::runtime_error& e) {
            EXPECT_NE(std::string(e.what()).find("-DFITLLM_CUDA=ON"), std::string::npos) << e.what();
        }
    }
}

TEST(BackendBuffer, IsChargedBeforeItIsAllocatedAndGivesItBack) {
    backend::VirtualDevice dev("virtual", 4096);
    memory::Pool& weights = dev.memory().pool(memory::pool_names::kWeights);
    {
        backend::Buffer b = dev.alloc(memory::pool_names::kWeights, 1000, "test");
        EXPECT_EQ(b.bytes(), 1000u);
        EXPECT_EQ(b.charged_bytes(), 1024u);  // rounded to kBufferAlign
        EXPECT_EQ(weights.live(), 1024u);
        EXPECT_EQ(dev.allocated_bytes(), 1024u);
        try {
            dev.alloc(memory::pool_names::kWeights, 4000, "too much");
            FAIL() << "4000 more bytes fit in 4096";
        } catch (const memory::BudgetError& e) {
            EXPECT_EQ(e.pool(), "weights");
            EXPECT_NE(std::string(e.what()).find("device 'virtual'"), std::string::npos) << e.what();
        }
        EXPECT_EQ(weights.live(), 1024u);  // the refused one charged nothing
        EXPECT_EQ(dev.allocated_bytes(), 1024u);
        backend::Buffer moved = std::move(b);
        EXPECT_TRUE(b.empty());
        EXPECT_EQ(weights.live(), 1024u);
    }
    EXPECT_EQ(weights.live(), 0u);
    EXPECT_EQ(dev.allocated_bytes(), 0u);
    EXPECT_TRUE(dev.alloc(memory::pool_names::kScratch, 0, "nothing").empty());
}

// Each op on device buffers (copied in, run, copied out) equals the ops:: call on host arrays.
TEST(BackendVirtual, OpsGiveTheBytesOfTheCpuOps) {
    backend::VirtualDevice dev("virtual", 64 << 20);
    ops::ThreadPool pool(2);
    ops::Scratch scratch;
    dev.use_threads(pool);
    const int n_tok = 3, rows = 64, cols = 128;
    const std::vector<float> x = random_floats(size_t{n_tok} * cols, 1);
    const std::vector<float> wf = random_floats(size_t{rows} * cols, 2);
    std::vector<std::byte> wq(size_t{rows} * 34 * (cols / 32));  // q8_0: 34 bytes per 32 values
    for (int r = 0; r < rows; ++r) {
        quant::quantize_row(quant::GgmlType::Q8_0, wf.data() + r * cols, wq.data() + size_t(r) * 34 * (cols / 32),
                            cols);
    }
    ops::WeightView w{quant::GgmlType::Q8_0, rows, cols, wq.data()};

    const auto to_dev = [&](const void* src, size_t bytes) {
        backend::Buffer b = dev.alloc(memory::pool_names::kScratch, bytes, "test");
        dev.copy_to_device(b.data(), src, bytes);
        return b;
    };
    backend::Buffer dw = to_dev(wq.data(), size_t{rows} * 34 * (cols / 32));
    backend::Buffer dx = to_dev(x.data(), x.size() * 4);
    backend::Buffer dy = dev.alloc(memory::pool_names::kScratch, size_t{n_tok} * rows * 4, "y");
    ops::WeightView w_dev = w;
    w_dev.data = dw.data();

    std::vector<float> want(size_t{n_tok} * rows), got(want.size());
    ops::matmul(w, x.data(), n_tok, want.data(), pool, scratch);
    dev.matmul(w_dev, dx.f32(), n_tok, dy.f32());
    dev.copy_to_host(got.data(), dy.data(), got.size() * 4);
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), got.size() * 4));

    // rms_norm, rope (NeoX), swiglu, add, scale, softcap on the matmul's output.
    const std::vector<float> norm_w = random_floats(rows, 3);
    backend::Buffer dn = to_dev(norm_w.data(), norm_w.size() * 4);
    ops::rms_norm(want.data(), norm_w.data(), 1e-5f, n_tok, rows, want.data());
    dev.rms_norm(dy.f32(), dn.f32(), 1e-5f, n_tok, rows, dy.f32());
    const int32_t pos[] = {0, 5, 11};
    ops::RopeParams rp;
    rp.mode = ops::RopeMode::Neox;
    rp.n_dims = 16;
    ops::rope(want.data(), pos, n_tok, 4, 16, rp);
    dev.rope(dy.f32(), pos, n_tok, 4, 16, rp);
    ops::swiglu(want.data(), x.data(), int64_t{n_tok} * rows, want.data());
    dev.swiglu(dy.f32(), dx.f32(), int64_t{n_tok} * rows, dy.f32());
    ops::add(want.data(), x.data(), int64_t{n_tok} * rows, want.data());
    dev.add(dy.f32(), dx.f32(), int64_t{n_tok} * rows, dy.f32());
    ops::scale(want.data(), int64_t{n_tok} * rows, 0.5f);
    dev.scale(dy.f32(), int64_t{n_tok} * rows, 0.5f);
    ops::softcap(want.data(), int64_t{n_tok} * rows, 3.0f);
    dev.softcap(dy.f32(), int64_t{n_tok} * rows, 3.0f);
    dev.copy_to_host(got.data(), dy.data(), got.size() * 4);
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), got.size() * 4));
}

}  // namespace
}  // namespace fitllm
