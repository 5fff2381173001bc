// Qwen3 (dense): hyper-parameters, weight binding (the per-head Q/K norms it needs, the Q/K/V
// biases it must not have) and the forward pass on a tiny random model with a head size of its
// own (n_head * head_dim = 2 n_embd, as Qwen3's), checked against a naive reference forward pass
// (tiny_llama.h). And the load-time refusal of weight types fitllm cannot compute with.
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

test::TinyLlamaOptions qwen3(test::TinyLlamaOptions o = {}) {
    o.arch = "qwen3";
    o.qk_norm = true;
    o.tied = true;
    o.head_dim = 16;
    return o;
}

TEST(Qwen3Hparams, ReadsItsOwnHeadSize) {
    const std::vector<std::byte> bytes = test::tiny_llama_bytes(qwen3());
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const model::Hparams hp = model::read_hparams(file);
    EXPECT_EQ(hp.arch, "qwen3");
    EXPECT_EQ(hp.head_dim, 16);  // not n_embd / n_head = 8
    EXPECT_EQ(hp.n_rot, 16);
    EXPECT_FLOAT_EQ(hp.attn_scale, 1.0f / 4.0f);
}

TEST(Qwen3Weights, MissingHeadNormIsNamed) {
    test::TinyLlamaOptions o = qwen3();
    o.skip = "blk.1.attn_k_norm.weight";
    const std::string error = test::tiny_load_error(o);
    EXPECT_NE(error.find("missing tensor 'blk.1.attn_k_norm.weight'"), std::string::npos) << error;
}

TEST(Qwen3Weights, QkvBiasIsRefusedByName) {
    test::TinyLlamaOptions o = qwen3();
    o.qkv_bias = true;
    o.k_bias_size = 32;
    const std::string error = test::tiny_load_error(o);
    EXPECT_NE(error.find("blk.0.attn_q.bias"), std::string::npos) << error;
    EXPECT_NE(error.find("qwen3"), std::string::npos) << error;
}

TEST(Qwen3Forward, MatchesTheReference) {
    test::expect_matches_reference(qwen3());
}

TEST(Qwen3Forward, MatchesTheReferenceUntiedWithPartialRope) {
    test::TinyLlamaOptions o = qwen3();
    o.tied = false;
    o.n_rot = 8;
    test::expect_matches_reference(o);
}

// The norms matter: the same weights without them (read as qwen2's rotation, no norms) differ.
TEST(Qwen3Forward, TheHeadNormsChangeTheLogits) {
    test::TinyLlamaOptions with = qwen3();
    test::TinyLlamaOptions without = with;
    without.qk_norm = false;
    const std::vector<std::byte> bytes = test::tiny_llama_bytes(with);
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const std::vector<int32_t> tokens = {1, 7, 3, 39};
    const std::vector<float> a = test::reference_logits(file, with, tokens);
    const std::vector<float> b = test::reference_logits(file, without, tokens);
    float max_diff = 0.0f;
    for (size_t i = 0; i < a.size(); ++i) max_diff = std::max(max_diff, std::fabs(a[i] - b[i]));
    EXPECT_GT(max_diff, 0.05f);
    test::expect_matches_reference(with);
}

// A weight type with no kernel is refused when the model loads, naming the tensor and the type,
// not by the first matmul of the run.
TEST(WeightTypes, UncomputableTypeIsRefusedAtLoad) {
    test::TinyLlamaOptions o;
    o.ffn_up_type = quant::GgmlType::Q8_1;  // an activation format: no weight kernels
    const std::string error = test::tiny_load_error(o);
    EXPECT_NE(error.find("blk.0.ffn_up.weight"), std::string::npos) << error;
    EXPECT_NE(error.find("Q8_1"), std::string::npos) << error;
    EXPECT_NE(error.find("IQ4_XS"), std::string::npos) << error;  // the list of types it runs
}

}  // namespace
}  // namespace fitllm
