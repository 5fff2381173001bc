// "cuda0" in unified mode (backend::open_unified_device; integrated GPUs): the tiny models with
// layers on it read their weights in place from the host (registered, mapped pages) and keep their
// K/V and activations in mapped pinned host memory charged to the host's pools, and give the CPU's
// tokens. Needs a CUDA device (any: a discrete one maps host memory too, over its bus); skips,
// saying why, without one.
//
// Tolerance as tests/backend/cuda_model_test.cpp: the CUDA matmuls multiply dequantized weights
// with float activations, the CPU rounds activations to 8-bit blocks, so each logit within 0.5 and
// the top token the same where the CPU's best two are further apart than twice that.
#include <gtest/gtest.h>

#include <string>

#ifndef FITLLM_CUDA

TEST(CudaUnified, BuiltWithoutCuda) {
    GTEST_SKIP() << "built without CUDA (configure with -DFITLLM_CUDA=ON where nvcc is installed)";
}

#else

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda_backend.h"
#include "gguf/gguf_reader.h"
#include "kv/cache.h"
#include "memory/device.h"
#include "memory/pool.h"
#include "model/model.h"
#include "ops/thread_pool.h"
#include "test_support.h"

namespace fitllm {
namespace {

constexpr float kTolerance = 0.5f;

// The logits of a prompt and of `steps` tokens after it: the forced ones, or (none) the greedy ones.
std::vector<std::vector<float> > logits_of(model::Model& m, const std::vector<int32_t>& forced, int steps,
                                           std::vector<int32_t>& fed, ops::ThreadPool& pool) {
    kv::CacheParams cp;
    cp.n_cells = 64;
    cp.n_seq_max = 1;
    kv::ModelCache cache = m.make_cache(cp, 16);
    std::vector<int32_t> tokens = {1, 7, 3, 9, 12, 5};
    std::vector<int32_t> pos(tokens.size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
    std::vector<float> row(static_cast<size_t>(m.n_vocab()));
    std::vector<std::vector<float> > rows;
    m.forward(tokens, pos, cache, row.data(), false, pool);
    rows.push_back(row);
    fed.clear();
    for (int s = 0; s < steps; ++s) {
        const int32_t t = forced.empty() ? static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin())
                                         : forced[static_cast<size_t>(s)];
        const int32_t p = static_cast<int32_t>(tokens.size()) + s;
        fed.push_back(t);
        m.forward(std::span(&t, 1), std::span(&p, 1), cache, row.data(), false, pool);
        rows.push_back(row);
    }
    return rows;
}

TEST(CudaUnified, TinyModelsReadHostMemoryInPlace) {
    const std::string why = backend::cuda::no_device_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    if (!backend::cuda::can_map_host_memory(0)) GTEST_SKIP() << "cuda0 cannot map host memory";
    ops::ThreadPool pool(2);
    for (const char* f : {"tiny-llama-q4_k_m.gguf", "tiny-llama-q8_0.gguf", "tiny-qwen2-q4_0.gguf"}) {
        SCOPED_TRACE(f);
        const gguf::GgufFile file = gguf::GgufFile::open((test::source_dir() / "tests/model/data" / f).string());
        const auto cpu = model::Model::load(file);
        const int n_layer = cpu->hparams().n_layer;
        std::vector<int32_t> greedy;
        const auto want = logits_of(*cpu, {}, 6, greedy, pool);
        for (const int ngl : {1, n_layer + 1}) {
            for (const bool offload_kv : {true, false}) {
                SCOPED_TRACE("ngl " + std::to_string(ngl) + (offload_kv ? ", kv on cuda0" : ", kv on host"));
                memory::Device host("host", 1ull << 30);
                const auto dev = backend::open_unified_device("cuda0", host);
                ASSERT_TRUE(dev->unified());
                EXPECT_EQ(&dev->memory(), &host);
                const model::LoadOptions options{
                    .device = &host, .offload = dev.get(), .n_offload_layers = ngl, .offload_kv = offload_kv};
                // A model that goes unregisters its pages: the same pages map again (fitllm serve
                // unloads and reloads models).
                model::Model::load(file, options).reset();
                auto m = model::Model::load(file, options);
                EXPECT_EQ(host.pool(memory::pool_names::kWeights).live(), 0u);  // read in place
                EXPECT_TRUE(m->offloaded_ranges().empty());
                std::vector<int32_t> fed;
                const auto got = logits_of(*m, greedy, 6, fed, pool);
                ASSERT_EQ(got.size(), want.size());
                for (size_t r = 0; r < want.size(); ++r) {
                    float worst = 0;
                    for (size_t i = 0; i < want[r].size(); ++i)
                        worst = std::max(worst, std::fabs(want[r][i] - got[r][i]));
                    EXPECT_LE(worst, kTolerance) << "row " << r;
                    std::vector<float> sorted = want[r];
                    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
                    if (sorted[0] - sorted[1] > 2 * kTolerance) {
                        EXPECT_EQ(std::max_element(want[r].begin(), want[r].end()) - want[r].begin(),
                                  std::max_element(got[r].begin(), got[r].end()) - got[r].begin())
                            << "row " << r << ": top token";
                    }
                }
                EXPECT_GT(host.pool(memory::pool_names::kScratch).peak(), 0u);  // its activations
                if (HasFatalFailure()) return;
            }
        }
    }
}

TEST(CudaUnified, WithoutADeviceSaysWhy) {
    if (backend::cuda::no_device_reason().empty()) GTEST_SKIP() << "a CUDA device is present";
    memory::Device host("host", 1ull << 30);
    try {
        backend::open_unified_device("cuda0", host);
        FAIL() << "opened cuda0 without a device";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(backend::device_is_integrated("cuda0"));
    EXPECT_FALSE(backend::cuda_device_integrated(0));
}

}  // namespace
}  // namespace fitllm

#endif  // FITLLM_CUDA
