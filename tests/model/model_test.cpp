// Hyper-parameters, weight binding and the Gemma 3 forward pass on a tiny random model.
#include "model/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "model/architecture.h"
#include "model/hparams.h"
#include "model/tiny_gemma3.h"
#include "ops/thread_pool.h"

namespace fitllm {
namespace {

std::string load_error(const test::TinyGemma3Options& options) {
    const std::vector<std::byte> bytes = test::tiny_gemma3_bytes(options);
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    try {
        model::Model::load(file);
    } catch (const model::ModelError& e) {
        return e.what();
    }
    return "";
}

TEST(Hparams, ReadsGemma3WithItsLayerPattern) {
    const std::vector<std::byte> bytes = test::tiny_gemma3_bytes();
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const model::Hparams hp = model::read_hparams(file);
    EXPECT_EQ(hp.arch, "gemma3");
    EXPECT_EQ(hp.n_layer, 2);
    EXPECT_EQ(hp.n_embd, 32);
    EXPECT_EQ(hp.n_head, 2);
    EXPECT_EQ(hp.n_head_kv, 1);
    EXPECT_EQ(hp.head_dim, 16);
    EXPECT_EQ(hp.n_vocab, 40);
    EXPECT_EQ(hp.sliding_window, 4);
    EXPECT_EQ(hp.is_swa, (std::vector<bool>{true, true}));  // layers 0..4 of every 6 are local
    EXPECT_FLOAT_EQ(hp.rope_base, 1e6f);
    EXPECT_FLOAT_EQ(hp.rope_base_swa, 1e4f);
    EXPECT_FLOAT_EQ(hp.attn_scale, 0.25f);
    EXPECT_EQ(hp.final_logit_softcap, 0.0f);
}

// Gemma 3 4B and larger scale positions linearly (factor 8) in their global layers; the
// sliding-window layers are not scaled (hparams.h), which gemma.cpp applies per layer.
TEST(Hparams, ReadsGemma3LinearRopeScaling) {
    const std::vector<std::byte> tiny = test::tiny_gemma3_bytes();
    const gguf::GgufFile source = gguf::GgufFile::parse(tiny, "tiny.gguf");
    gguf::GgufWriter w;
    for (const gguf::Value& v : source.metadata()) w.add_value(v);
    w.add_string("gemma3.rope.scaling.type", "linear");
    w.add<float>("gemma3.rope.scaling.factor", 8.0f);
    for (const gguf::TensorInfo& t : source.tensors()) {
        w.add_tensor(t.name, t.type, std::span<const int64_t>(t.ne.data(), t.n_dims), t.data);
    }
    const std::vector<std::byte> bytes = w.to_bytes();
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "scaled.gguf");
    EXPECT_FLOAT_EQ(model::read_hparams(file).rope_freq_scale, 0.125f);
    EXPECT_FLOAT_EQ(model::read_hparams(source).rope_freq_scale, 1.0f);
}

TEST(Hparams, MissingKeyIsNamed) {
    const std::string error = load_error({.with_head_count = false});
    EXPECT_NE(error.find("tiny.gguf"), std::string::npos) << error;
    EXPECT_NE(error.find("gemma3.attention.head_count"), std::string::npos) << error;
}

TEST(Hparams, UnknownArchitectureIsRefusedByName) {
    const std::string error = load_error({.arch = "mamba"});
    EXPECT_NE(error.find("'mamba'"), std::string::npos) << error;
    EXPECT_NE(error.find("not supported"), std::string::npos) << error;
    EXPECT_NE(error.find("fitllm runs: " + model::architecture_names()), std::string::npos) << error;
    for (const char* name : {"gemma3", "llama", "qwen2"}) EXPECT_NE(error.find(name), std::string::npos) << error;
}

TEST(ModelWeights, MisshapenTensorNamesItAndBothShapes) {
    const std::string error = load_error({.q_norm_size = 8});
    EXPECT_NE(error.find("blk.0.attn_q_norm.weight"), std::string::npos) << error;
    EXPECT_NE(error.find("[8]"), std::string::npos) << error;
    EXPECT_NE(error.find("[16]"), std::string::npos) << error;
}

// Feeding tokens one at a time through the KV cache gives the logits of one batch over all of
// them: the cache, positions, causal mask and sliding window agree between the two paths.
TEST(ModelForward, BatchMatchesTokenByTokenThroughTheCache) {
    const std::vector<std::byte> bytes = test::tiny_gemma3_bytes();
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const auto model = model::Model::load(file);
    ops::ThreadPool pool(2);
    const std::vector<int32_t> tokens = {1, 7, 3, 39, 0, 12, 5, 5, 20};  // longer than the window of 4
    std::vector<int32_t> positions(tokens.size());
    std::iota(positions.begin(), positions.end(), 0);
    const size_t n_vocab = static_cast<size_t>(model->n_vocab());

    kv::ModelCache batch_cache = model->make_cache({.n_cells = 16}, 64);
    std::vector<float> all(tokens.size() * n_vocab);
    model->forward(tokens, positions, batch_cache, all.data(), /*all_logits=*/true, pool);
    EXPECT_EQ(batch_cache.seq_pos_max(0) + 1, static_cast<int>(tokens.size()));

    kv::ModelCache step_cache = model->make_cache({.n_cells = 16}, 64);
    std::vector<float> one(n_vocab);
    for (size_t t = 0; t < tokens.size(); ++t) {
        model->forward(std::span(&tokens[t], 1), std::span(&positions[t], 1), step_cache, one.data(), false, pool);
        for (size_t i = 0; i < n_vocab; ++i) {
            ASSERT_NEAR(one[i], all[t * n_vocab + i], 1e-3f) << "token " << t << ", logit " << i;
            ASSERT_TRUE(std::isfinite(one[i]));
        }
    }
    // Last-token-only output is the last row of all logits.
    kv::ModelCache last_cache = model->make_cache({.n_cells = 16}, 64);
    model->forward(tokens, positions, last_cache, one.data(), /*all_logits=*/false, pool);
    for (size_t i = 0; i < n_vocab; ++i) EXPECT_EQ(one[i], all[(tokens.size() - 1) * n_vocab + i]);
}

TEST(ModelForward, TokenOutsideVocabularyIsAnError) {
    const std::vector<std::byte> bytes = test::tiny_gemma3_bytes();
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const auto model = model::Model::load(file);
    ops::ThreadPool pool(1);
    kv::ModelCache cache = model->make_cache({.n_cells = 4}, 64);
    std::vector<float> logits(static_cast<size_t>(model->n_vocab()));
    const int32_t token = 40, pos = 0;
    EXPECT_THROW(model->forward(std::span(&token, 1), std::span(&pos, 1), cache, logits.data(), false, pool),
                 std::out_of_range);
}

}  // namespace
}  // namespace fitllm
