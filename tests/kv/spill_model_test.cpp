// KV spill under a whole model (issue 6): prompts in several batches and decode steps give the
// same logits, bit for bit, with the cache spilled to a file as with it in memory. Tiny models:
// the Llama and Qwen2 of tests/model/data (2 layers, both streamed, one in memory at a time) with
// f16 and q8_0 K/V, and a generated Gemma 3 of 18 layers (15 sliding-window layers in a window
// pool that stays in memory; 3 global layers streamed, 2 in memory at a time).
#include <gtest/gtest.h>

#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "kv/cache.h"
#include "kv/cache_test_support.h"
#include "model/model.h"
#include "model/tiny_gemma3.h"
#include "ops/thread_pool.h"
#include "test_support.h"

namespace fitllm {
namespace {

namespace fs = std::filesystem;
using quant::GgmlType;

constexpr int kCells = 256, kBatch = 16, kPrompt = 45, kSteps = 8;

kv::CacheParams params(GgmlType type) {
    kv::CacheParams p;
    p.n_cells = kCells;
    p.type_k = type;
    p.type_v = type;
    return p;
}

// Logits after each batch of the prompt and each decode step, one row each.
std::vector<float> run(model::Model& model, kv::ModelCache& cache, ops::ThreadPool& pool) {
    const auto n_vocab = static_cast<size_t>(model.n_vocab());
    std::vector<float> out;
    std::vector<float> logits(n_vocab);
    std::vector<int32_t> tokens, pos;
    const auto token_at = [&](int p) { return static_cast<int32_t>((p * 7 + 3) % model.n_vocab()); };
    for (int begin = 0; begin < kPrompt; begin += kBatch) {
        tokens.clear();
        pos.clear();
        for (int p = begin; p < std::min(kPrompt, begin + kBatch); ++p) {
            tokens.push_back(token_at(p));
            pos.push_back(p);
        }
        model.forward(tokens, pos, cache, logits.data(), false, pool);
        out.insert(out.end(), logits.begin(), logits.end());
    }
    for (int p = kPrompt; p < kPrompt + kSteps; ++p) {
        const int32_t token = token_at(p);
        model.forward(std::span(&token, 1), std::span(&p, 1), cache, logits.data(), false, pool);
        out.insert(out.end(), logits.begin(), logits.end());
    }
    return out;
}

void expect_spill_changes_nothing(model::Model& model, GgmlType type, int layers_resident, const fs::path& dir,
                                  ops::ThreadPool& pool) {
    kv::ModelCache in_memory = model.make_cache(params(type), kBatch);
    // The limit: the window pools (kept in memory) and `layers_resident` layers of the full pool.
    const kv::KvCache& full = in_memory.pool(0);
    ASSERT_EQ(full.params().window, 0);
    const uint64_t layer = (full.layer_view(0).k_row_bytes + full.layer_view(0).v_row_bytes) * kCells;
    uint64_t limit = layers_resident * layer;
    for (int p = 1; p < in_memory.n_pools(); ++p) limit += in_memory.pool(p).bytes();

    kv::CacheParams spill = params(type);
    spill.spill_dir = dir.string();
    spill.resident_limit = limit;
    kv::ModelCache spilled = model.make_cache(spill, kBatch);
    ASSERT_TRUE(spilled.pool(0).spilled());
    EXPECT_EQ(spilled.pool(0).pinned_layers(), 0);
    EXPECT_GT(spilled.spill_file_bytes(), 0u);
    EXPECT_LT(spilled.bytes(), in_memory.bytes());

    const std::vector<float> want = run(model, in_memory, pool);
    const std::vector<float> got = run(model, spilled, pool);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[i], want[i]) << "row " << i / static_cast<size_t>(model.n_vocab()) << ", logit "
                                   << i % static_cast<size_t>(model.n_vocab());
    }
}

TEST(KvSpillModel, TinyLlamaAndQwen2GiveTheInMemoryLogits) {
    std::string why_not;
    const fs::path dir = kv::test::spill_test_dir("model", why_not);
    if (!why_not.empty()) GTEST_SKIP() << why_not;
    ops::ThreadPool pool(2);
    for (const std::string name : {"tiny-llama-f16.gguf", "tiny-qwen2-q8_0.gguf"}) {
        const auto file = gguf::GgufFile::open((test::source_dir() / "tests/model/data" / name).string());
        const auto model = model::Model::load(file);
        ASSERT_EQ(model->hparams().n_layer, 2);
        for (const GgmlType type : {GgmlType::F16, GgmlType::Q8_0}) {
            SCOPED_TRACE(name + (type == GgmlType::F16 ? ", f16 KV" : ", q8_0 KV"));
            expect_spill_changes_nothing(*model, type, 1, dir, pool);
        }
    }
}

TEST(KvSpillModel, Gemma3WithAWindowPoolGivesTheInMemoryLogits) {
    std::string why_not;
    const fs::path dir = kv::test::spill_test_dir("model-gemma3", why_not);
    if (!why_not.empty()) GTEST_SKIP() << why_not;
    ops::ThreadPool pool(2);
    const std::vector<std::byte> bytes = test::tiny_gemma3_bytes({.n_layer = 18});
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny-gemma3.gguf");
    const auto model = model::Model::load(file);
    const kv::ModelCache probe = model->make_cache(params(GgmlType::F16), kBatch);
    ASSERT_EQ(probe.n_pools(), 2);
    ASSERT_EQ(probe.pool(0).n_layer(), 3);
    expect_spill_changes_nothing(*model, GgmlType::F16, 2, dir, pool);
}

}  // namespace
}  // namespace fitllm
