// The tiny models with layers on "cuda0" (model::LoadOptions::offload) against the CPU: the same
// token stream (teacher forcing with the CPU's greedy tokens), two sequences in one batch, a context
// shift (K re-rotated on the device) and a forked sequence (seq_cp, then copy on write), with f16,
// q8_0 and q4_0 K/V (the quantized K shaped on the device as the host shapes it). Skips, saying
// why, without a CUDA device.
//
// Tolerances: the CUDA matmuls multiply dequantized weights with float activations, where the CPU
// rounds activations to 8-bit blocks for quantized weights (as llama.cpp does), and the CPU's f16
// attention rounds q and the V sums to f16: the logits differ by what CPU and llama.cpp differ by
// on these models (0.1-0.3, README), so each logit within kTolerance, and the top token the same
// wherever the CPU's best two are further apart than twice that.
#include <gtest/gtest.h>

#include <string>

#ifndef FITLLM_CUDA

TEST(CudaModel, BuiltWithoutCuda) {
    GTEST_SKIP() << "built without CUDA (configure with -DFITLLM_CUDA=ON where nvcc is installed)";
}

#else

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"
#include "gguf/gguf_reader.h"
#include "kv/cache.h"
#include "model/model.h"
#include "model/tensor_override.h"
#include "model/tiny_gemma3.h"
#include "ops/thread_pool.h"
#include "test_support.h"

namespace fitllm {
namespace {

constexpr float kTolerance = 0.5f;

struct ScriptRun {
    std::vector<int32_t> tokens;  // what was fed after the prompt
    std::vector<std::vector<float> > rows;
};

int32_t argmax(const std::vector<float>& row) {
    return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// Prompt, then `steps` tokens: the forced ones, or (none) each step's greedy choice; then two
// sequences in one batch and a shift of sequence 0 with a step after it. Every logits row.
ScriptRun run_script(model::Model& m, quant::GgmlType kv_type, const std::vector<int32_t>& forced, int steps,
                     ops::ThreadPool& pool) {
    const int V = m.n_vocab();
    kv::CacheParams params;
    params.n_cells = 128;
    params.n_seq_max = 3;
    params.block_size = 16;
    params.type_k = params.type_v = kv_type;
    kv::ModelCache cache = m.make_cache(params, 16);
    ScriptRun r;
    std::vector<float> row(static_cast<size_t>(V) * 2);
    // 20 tokens: enough for a quantized K's transform to be calibrated (kv::KeyTransform::kMinRows).
    std::vector<int32_t> prompt = {1, 7, 3, 9, 12, 5, 2, 8, 4, 6, 11, 10, 2, 4, 6, 1, 3, 5, 7, 9};
    std::vector<int32_t> pos(prompt.size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
    m.forward(prompt, pos, cache, row.data(), false, pool);
    int32_t p = static_cast<int32_t>(prompt.size());
    for (int s = 0; s < steps; ++s) {
        r.rows.emplace_back(row.begin(), row.begin() + V);
        const int32_t t = forced.empty() ? argmax(r.rows.back()) : forced[static_cast<size_t>(s)];
        r.tokens.push_back(t);
        m.forward(std::span(&t, 1), std::span(&p, 1), cache, row.data(), false, pool);
        ++p;
    }
    r.rows.emplace_back(row.begin(), row.begin() + V);
    // Sequence 1 starts while sequence 0 goes on, in one batch.
    const std::vector<int32_t> both = {4, 2};
    const std::vector<int32_t> both_pos = {p, 0};
    const std::vector<kv::SeqId> seqs = {0, 1};
    m.forward({.tokens = both, .positions = both_pos, .seq_ids = seqs, .all_logits = true}, cache, row.data(), pool);
    r.rows.emplace_back(row.begin(), row.begin() + V);
    r.rows.emplace_back(row.begin() + V, row.end());
    // Context shift: sequence 0 drops two tokens and the rest move back (K re-rotated).
    cache.seq_rm(0, 1, 3);
    cache.seq_add(0, 3, -1, -2);
    const int32_t t = 8, shifted = p + 1 - 2;
    m.forward(std::span(&t, 1), std::span(&shifted, 1), cache, row.data(), false, pool);
    r.rows.emplace_back(row.begin(), row.begin() + V);
    // Sequence 2 shares sequence 0's cells, and both go on in one batch: their partly filled last
    // block is copied on write.
    cache.seq_cp(0, 2, -1, -1);
    const std::vector<int32_t> forked = {10, 11};
    const std::vector<int32_t> forked_pos = {shifted + 1, shifted + 1};
    const std::vector<kv::SeqId> forked_seqs = {0, 2};
    m.forward({.tokens = forked, .positions = forked_pos, .seq_ids = forked_seqs, .all_logits = true}, cache,
              row.data(), pool);
    r.rows.emplace_back(row.begin(), row.begin() + V);
    r.rows.emplace_back(row.begin() + V, row.end());
    return r;
}

void expect_close(const ScriptRun& want, const ScriptRun& got) {
    ASSERT_EQ(want.rows.size(), got.rows.size());
    for (size_t i = 0; i < want.rows.size(); ++i) {
        float worst = 0.0f;
        for (size_t j = 0; j < want.rows[i].size(); ++j) {
            worst = std::max(worst, std::fabs(want.rows[i][j] - got.rows[i][j]));
        }
        EXPECT_LE(worst, kTolerance) << "row " << i << ": largest logit difference";
        std::vector<float> sorted = want.rows[i];
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
        if (sorted[0] - sorted[1] > 2 * kTolerance) {
            EXPECT_EQ(argmax(want.rows[i]), argmax(got.rows[i])) << "row " << i << ": top token";
        }
    }
}

TEST(CudaModel, TinyModelsOnCuda0GiveTheLogitsOfTheCpu) {
    const std::string why = backend::cuda::no_device_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    ops::ThreadPool pool(2);
    const std::vector<std::byte> gemma = test::tiny_gemma3_bytes({.n_layer = 6});
    std::vector<std::pair<std::string, gguf::GgufFile> > files;
    files.emplace_back("generated gemma3, 6 layers", gguf::GgufFile::parse(gemma, "tiny gemma3"));
    for (const char* f : {"tiny-llama-f16.gguf", "tiny-llama-q4_k_m.gguf", "tiny-llama-q8_0.gguf",
                          "tiny-llama-q2_k.gguf", "tiny-qwen2-q4_0.gguf", "tiny-qwen2-q6_k.gguf",
                          "tiny-gemma2-q8_0.gguf", "tiny-phi3-q4_k_m.gguf", "tiny-phi3-longrope-q8_0.gguf"}) {
        files.emplace_back(f, gguf::GgufFile::open((test::source_dir() / "tests/model/data" / f).string()));
    }
    for (const auto& [name, file] : files) {
        SCOPED_TRACE(name);
        const auto cpu = model::Model::load(file);
        const int n_layer = cpu->hparams().n_layer;
        // Quantized K/V needs heads of whole 32-value blocks; the tiny Gemma's are 16 wide.
        std::vector<quant::GgmlType> kv_types = {quant::GgmlType::F16, quant::GgmlType::F32};
        if (cpu->hparams().head_dim % 32 == 0)
            kv_types = {quant::GgmlType::F16, quant::GgmlType::Q8_0, quant::GgmlType::Q4_0};
        for (const auto kv_type : kv_types) {
            const ScriptRun want = run_script(*cpu, kv_type, {}, 8, pool);
            for (const int ngl : {1, n_layer, n_layer + 1}) {
                for (const bool offload_kv : {true, false}) {
                    SCOPED_TRACE("ngl " + std::to_string(ngl) + (offload_kv ? ", kv on cuda0" : ", kv on host") + ", " +
                                 std::string(quant::type_name(static_cast<uint32_t>(kv_type))));
                    auto dev = backend::open_device("cuda0", 1ull << 30);
                    auto m = model::Model::load(
                        file, {.offload = dev.get(), .n_offload_layers = ngl, .offload_kv = offload_kv});
                    expect_close(want, run_script(*m, kv_type, want.tokens, 8, pool));
                    if (HasFatalFailure()) return;
                }
            }
        }
    }
}

// Mixture-of-experts files with every offloaded layer's routed experts on cuda0 (model/moe.h
// moe_experts_on_device), and with them on the host (--cpu-moe), against the CPU. The host routes
// from cuda0's hidden state, so a router score within rounding of another can pick another expert
// than the CPU did; the same tolerance holds on these files where that does not happen.
TEST(CudaModel, TinyMoeModelsWithExpertsOnCuda0GiveTheLogitsOfTheCpu) {
    const std::string why = backend::cuda::no_device_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    ops::ThreadPool pool(2);
    for (const char* f :
         {"tiny-qwen3moe-f16.gguf", "tiny-qwen3moe-q8_0.gguf", "tiny-mixtral-q8_0.gguf", "tiny-qwen2moe-q8_0.gguf"}) {
        SCOPED_TRACE(f);
        const gguf::GgufFile file = gguf::GgufFile::open((test::source_dir() / "tests/model/data" / f).string());
        const auto cpu = model::Model::load(file);
        const int n_layer = cpu->hparams().n_layer;
        const ScriptRun want = run_script(*cpu, quant::GgmlType::F16, {}, 8, pool);
        for (const int ngl : {1, n_layer + 1}) {
            for (const bool host_experts : {false, true}) {
                SCOPED_TRACE("ngl " + std::to_string(ngl) + (host_experts ? ", --cpu-moe" : ", experts on cuda0"));
                auto dev = backend::open_device("cuda0", 1ull << 30);
                auto m =
                    model::Model::load(file, {.offload = dev.get(),
                                              .n_offload_layers = ngl,
                                              .tensor_overrides = host_experts ? model::cpu_moe_overrides(-1)
                                                                               : std::vector<model::TensorOverride>{}});
                expect_close(want, run_script(*m, quant::GgmlType::F16, want.tokens, 8, pool));
                if (HasFatalFailure()) return;
            }
        }
    }
}

TEST(CudaModel, OpeningWithoutADeviceSaysWhy) {
    if (backend::cuda::no_device_reason().empty()) GTEST_SKIP() << "a CUDA device is present";
    try {
        backend::open_device("cuda0", 1ull << 30);
        FAIL() << "opened cuda0 without a device";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("no CUDA device: cudaGetDeviceCount"), std::string::npos) << e.what();
    }
    EXPECT_EQ(backend::cuda_device_count(), 0);
    EXPECT_TRUE(backend::cuda_built());
}

}  // namespace
}  // namespace fitllm

#endif  // FITLLM_CUDA
