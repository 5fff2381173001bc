// Llama: hyper-parameters, weight binding and the forward pass on a tiny random model, checked
// against a naive reference forward pass (tiny_llama.h).
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

std::vector<int32_t> iota_positions(size_t n) {
    std::vector<int32_t> positions(n);
    std::iota(positions.begin(), positions.end(), 0);
    return positions;
}

TEST(LlamaHparams, ReadsKeysAndDefaults) {
    const std::vector<std::byte> bytes = test::tiny_llama_bytes({.rope_scale = 4.0f});
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const model::Hparams hp = model::read_hparams(file);
    EXPECT_EQ(hp.arch, "llama");
    EXPECT_EQ(hp.n_layer, 2);
    EXPECT_EQ(hp.n_embd, 32);
    EXPECT_EQ(hp.n_head, 4);
    EXPECT_EQ(hp.n_head_kv, 2);
    EXPECT_EQ(hp.head_dim, 8);  // n_embd / n_head when key_length is absent
    EXPECT_EQ(hp.head_dim_v, 8);
    EXPECT_EQ(hp.n_ff, 48);
    EXPECT_EQ(hp.n_vocab, 40);
    EXPECT_EQ(hp.n_ctx_train, 128);
    EXPECT_EQ(hp.n_rot, 8);
    EXPECT_FLOAT_EQ(hp.norm_eps, 1e-5f);
    EXPECT_FLOAT_EQ(hp.rope_base, 1e4f);
    EXPECT_FLOAT_EQ(hp.rope_freq_scale, 0.25f);
    EXPECT_FLOAT_EQ(hp.attn_scale, 1.0f / std::sqrt(8.0f));
    EXPECT_EQ(hp.sliding_window, 0);
    EXPECT_EQ(hp.is_swa, (std::vector<bool>{false, false}));
}

TEST(LlamaHparams, ScalingTypeNoneIgnoresTheFactor) {
    const std::vector<std::byte> bytes = test::tiny_llama_bytes({.rope_scale = 4.0f, .scaling_type = "none"});
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    EXPECT_FLOAT_EQ(model::read_hparams(file).rope_freq_scale, 1.0f);
}

TEST(LlamaHparams, UnsupportedRopeScalingIsNamed) {
    const std::string error = test::tiny_load_error({.scaling_type = "longrope"});
    EXPECT_NE(error.find("llama.rope.scaling.type"), std::string::npos) << error;
    EXPECT_NE(error.find("'longrope'"), std::string::npos) << error;
}

TEST(LlamaHparams, YarnWithoutAFactorIsRefused) {
    const std::string error = test::tiny_load_error({.scaling_type = "yarn"});
    EXPECT_NE(error.find("llama.rope.scaling.factor"), std::string::npos) << error;
}

// YaRN's correction range for the tiny model (8 rotated dims, base 10000, 32 original positions):
// 8 ln(32 / (2 pi beta)) / (2 ln 10000), floored for beta 32 (-> 0), ceiled for beta 1 (-> 1).
TEST(LlamaHparams, ReadsYarn) {
    const std::vector<std::byte> bytes =
        test::tiny_llama_bytes({.rope_scale = 4.0f, .scaling_type = "yarn", .yarn_orig_ctx = 32});
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const model::Hparams hp = model::read_hparams(file);
    EXPECT_FLOAT_EQ(hp.rope_freq_scale, 0.25f);
    EXPECT_FLOAT_EQ(hp.rope_ext_factor, 1.0f);
    EXPECT_FLOAT_EQ(hp.rope_attn_factor, 1.0f);
    EXPECT_FLOAT_EQ(hp.rope_corr_low, 0.0f);
    EXPECT_FLOAT_EQ(hp.rope_corr_high, 1.0f);
}

TEST(LlamaHparams, BadRopeDimensionCountIsNamed) {
    const std::string error = test::tiny_load_error({.n_rot = 7});
    EXPECT_NE(error.find("tiny.gguf"), std::string::npos) << error;
    EXPECT_NE(error.find("llama.rope.dimension_count"), std::string::npos) << error;
}

// Mixtral ("llama" with experts, issue 21): the expert counts are read, feed_forward_length is each
// expert's width; what is missing or out of range is refused by its key.
TEST(MixtralHparams, ReadsTheExpertCounts) {
    const std::vector<std::byte> bytes = test::tiny_llama_bytes({.expert_count = 6, .expert_used = 2});
    const model::Hparams hp = model::read_hparams(gguf::GgufFile::parse(bytes, "tiny.gguf"));
    EXPECT_EQ(hp.arch, "llama");
    EXPECT_TRUE(hp.is_moe());
    EXPECT_EQ(hp.n_expert, 6);
    EXPECT_EQ(hp.n_expert_used, 2);
    EXPECT_EQ(hp.n_ff_exp, test::kTinyFfExp);
    EXPECT_EQ(hp.expert_weights_scale, 0.0f);
}

TEST(MixtralHparams, MissingExpertUsedCountIsNamed) {
    const std::string error = test::tiny_load_error({.expert_count = 8});
    EXPECT_NE(error.find("missing metadata key 'llama.expert_used_count'"), std::string::npos) << error;
}

TEST(MixtralHparams, MoreExpertsUsedThanThereAreIsRefused) {
    const std::string error = test::tiny_load_error({.expert_count = 2, .expert_used = 3});
    EXPECT_NE(error.find("'llama.expert_used_count' = 3"), std::string::npos) << error;
}

TEST(MixtralHparams, TooManyExpertsAreRefused) {
    const std::string error = test::tiny_load_error({.expert_count = 513, .expert_used = 2});
    EXPECT_NE(error.find("'llama.expert_count' = 513"), std::string::npos) << error;
}

TEST(MixtralWeights, DenseFeedForwardInsteadOfExpertsIsNamed) {
    const std::string error =
        test::tiny_load_error({.skip = "blk.0.ffn_gate_exps.weight", .expert_count = 6, .expert_used = 2});
    EXPECT_NE(error.find("missing tensor 'blk.0.ffn_gate_exps.weight'"), std::string::npos) << error;
}

TEST(MixtralWeights, SharedExpertIsRefusedByName) {
    const std::string error =
        test::tiny_load_error({.extra = "blk.1.ffn_gate_shexp.weight", .expert_count = 6, .expert_used = 2});
    EXPECT_NE(error.find("blk.1.ffn_gate_shexp.weight"), std::string::npos) << error;
    EXPECT_NE(error.find("shared expert"), std::string::npos) << error;
}

// Experts in Llama's relatives stay refused, by the key.
TEST(MixtralHparams, ExpertsInQwen3AreRefused) {
    const std::string error =
        test::tiny_load_error({.arch = "qwen3", .expert_count = 6, .expert_used = 2, .qk_norm = true, .head_dim = 16});
    EXPECT_NE(error.find("'qwen3.expert_count' = 6: mixture-of-experts models"), std::string::npos) << error;
}

TEST(MixtralForward, MatchesTheReference) {
    test::expect_matches_reference({.expert_count = 6, .expert_used = 2});
}

TEST(MixtralForward, MatchesTheReferenceWithOneExpertPerToken) {
    test::expect_matches_reference({.expert_count = 6, .expert_used = 1});
}

TEST(LlamaWeights, MissingTensorIsNamed) {
    const std::string error = test::tiny_load_error({.skip = "blk.1.ffn_up.weight"});
    EXPECT_NE(error.find("tiny.gguf"), std::string::npos) << error;
    EXPECT_NE(error.find("missing tensor 'blk.1.ffn_up.weight'"), std::string::npos) << error;
}

TEST(LlamaWeights, MisshapenBiasNamesItAndBothShapes) {
    const std::string error = test::tiny_load_error({.qkv_bias = true, .k_bias_size = 12});
    EXPECT_NE(error.find("blk.0.attn_k.bias"), std::string::npos) << error;
    EXPECT_NE(error.find("[12]"), std::string::npos) << error;
    EXPECT_NE(error.find("[16]"), std::string::npos) << error;
}

TEST(LlamaWeights, FeedForwardBiasIsRefusedByName) {
    const std::string error = test::tiny_load_error({.extra = "blk.0.ffn_up.bias"});
    EXPECT_NE(error.find("blk.0.ffn_up.bias"), std::string::npos) << error;
}

TEST(LlamaWeights, MisshapenRopeFreqsIsNamed) {
    const std::string error = test::tiny_load_error({.rope_freqs = true, .rope_freqs_size = 3});  // n_rot / 2 = 4
    EXPECT_NE(error.find("rope_freqs.weight"), std::string::npos) << error;
    EXPECT_NE(error.find("[3]"), std::string::npos) << error;
    EXPECT_NE(error.find("[4]"), std::string::npos) << error;
}

TEST(LlamaForward, MatchesTheReference) {
    test::expect_matches_reference({});
}
TEST(LlamaForward, MatchesTheReferenceTied) {
    test::expect_matches_reference({.tied = true});
}
TEST(LlamaForward, MatchesTheReferenceWithRopeFreqsAndLinearScaling) {
    test::expect_matches_reference({.rope_freqs = true, .rope_scale = 2.0f});
}
TEST(LlamaForward, MatchesTheReferenceWithYarn) {
    test::expect_matches_reference({.rope_scale = 4.0f, .scaling_type = "yarn", .yarn_orig_ctx = 32});
}
TEST(LlamaForward, MatchesTheReferenceWithBiasesAndPartialRope) {
    test::expect_matches_reference({.qkv_bias = true, .n_rot = 4});
}

// One batch over the prompt, token by token through the cache, and last-token-only output agree.
TEST(LlamaForward, BatchMatchesTokenByTokenThroughTheCache) {
    const std::vector<std::byte> bytes = test::tiny_llama_bytes({.rope_freqs = true});
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const auto model = model::Model::load(file);
    ops::ThreadPool pool(2);
    const std::vector<int32_t> tokens = {1, 7, 3, 39, 0, 12, 5, 5, 20};
    const std::vector<int32_t> positions = iota_positions(tokens.size());
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
