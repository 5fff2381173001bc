// Qwen2: hyper-parameters, weight binding (the Q/K/V biases it needs) and the forward pass on a
// tiny random model, checked against a naive reference forward pass (tiny_llama.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "model/hparams.h"
#include "model/model.h"
#include "model/tiny_llama.h"
#include "model/tiny_llama_checks.h"
#include "ops/thread_pool.h"

namespace fitllm {
namespace {

test::TinyLlamaOptions qwen2(test::TinyLlamaOptions o = {}) {
    o.arch = "qwen2";
    o.qkv_bias = true;
    return o;
}

TEST(Qwen2Hparams, ReadsKeys) {
    const std::vector<std::byte> bytes = test::tiny_llama_bytes(qwen2());
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const model::Hparams hp = model::read_hparams(file);
    EXPECT_EQ(hp.arch, "qwen2");
    EXPECT_EQ(hp.n_layer, 2);
    EXPECT_EQ(hp.n_head, 4);
    EXPECT_EQ(hp.n_head_kv, 2);
    EXPECT_EQ(hp.head_dim, 8);
    EXPECT_EQ(hp.n_rot, 8);
    EXPECT_EQ(hp.n_vocab, 40);
    EXPECT_FLOAT_EQ(hp.rope_base, 1e4f);
    EXPECT_FLOAT_EQ(hp.rope_freq_scale, 1.0f);
    EXPECT_FLOAT_EQ(hp.attn_scale, 1.0f / std::sqrt(8.0f));
}

TEST(Qwen2Weights, MissingBiasIsNamed) {
    const std::string error = test::tiny_load_error(qwen2({.skip = "blk.1.attn_v.bias"}));
    EXPECT_NE(error.find("tiny.gguf"), std::string::npos) << error;
    EXPECT_NE(error.find("missing tensor 'blk.1.attn_v.bias'"), std::string::npos) << error;
    const std::string no_biases = test::tiny_load_error({.arch = "qwen2"});
    EXPECT_NE(no_biases.find("missing tensor 'blk.0.attn_q.bias'"), std::string::npos) << no_biases;
}

TEST(Qwen2Weights, MisshapenBiasNamesItAndBothShapes) {
    const std::string error = test::tiny_load_error(qwen2({.k_bias_size = 32}));
    EXPECT_NE(error.find("blk.0.attn_k.bias"), std::string::npos) << error;
    EXPECT_NE(error.find("[32]"), std::string::npos) << error;
    EXPECT_NE(error.find("[16]"), std::string::npos) << error;
}

TEST(Qwen2Forward, MatchesTheReferenceTied) {
    test::expect_matches_reference(qwen2({.tied = true}));
}
TEST(Qwen2Forward, MatchesTheReferenceUntied) {
    test::expect_matches_reference(qwen2());
}
TEST(Qwen2Forward, MatchesTheReferenceWithLinearScaling) {
    test::expect_matches_reference(qwen2({.rope_scale = 2.0f}));
}

// The NeoX pairing matters: the same weights read as a Llama (adjacent pairs) give other logits,
// so the reference check above cannot pass by accident of the rotation mode.
TEST(Qwen2Forward, DiffersFromTheSameWeightsAsLlama) {
    const test::TinyLlamaOptions options = qwen2();
    const std::vector<std::byte> bytes = test::tiny_llama_bytes(options);
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const auto model = model::Model::load(file);
    ops::ThreadPool pool(1);
    const std::vector<int32_t> tokens = {1, 7, 3, 39, 0, 12};
    const std::vector<float> got = test::tiny_batch_logits(*model, tokens, pool);
    test::TinyLlamaOptions as_llama = options;
    as_llama.arch = "llama";
    const std::vector<float> llama = test::reference_logits(file, as_llama, tokens);
    float max_diff = 0.0f;
    for (size_t i = 0; i < got.size(); ++i) max_diff = std::max(max_diff, std::fabs(got[i] - llama[i]));
    EXPECT_GT(max_diff, 0.1f);
}

TEST(Qwen2Forward, BatchMatchesTokenByTokenThroughTheCache) {
    const std::vector<std::byte> bytes = test::tiny_llama_bytes(qwen2({.tied = true}));
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const auto model = model::Model::load(file);
    ops::ThreadPool pool(2);
    const std::vector<int32_t> tokens = {1, 7, 3, 39, 0, 12, 5, 5, 20};
    std::vector<int32_t> positions(tokens.size());
    std::iota(positions.begin(), positions.end(), 0);
    const size_t n_vocab = static_cast<size_t>(model->n_vocab());
    const std::vector<float> all = test::tiny_batch_logits(*model, tokens, pool);

    kv::ModelCache step_cache = model->make_cache({.n_cells = 16}, 64);
    std::vector<float> one(n_vocab);
    for (size_t t = 0; t < tokens.size(); ++t) {
        model->forward(std::span(&tokens[t], 1), std::span(&positions[t], 1), step_cache, one.data(), false, pool);
        for (size_t i = 0; i < n_vocab; ++i) {
            ASSERT_NEAR(one[i], all[t * n_vocab + i], 1e-4f) << "token " << t << ", logit " << i;
        }
    }
    kv::ModelCache last_cache = model->make_cache({.n_cells = 16}, 64);
    model->forward(tokens, positions, last_cache, one.data(), /*all_logits=*/false, pool);
    for (size_t i = 0; i < n_vocab; ++i) EXPECT_EQ(one[i], all[(tokens.size() - 1) * n_vocab + i]);
}

}  // namespace
}  // namespace fitllm
