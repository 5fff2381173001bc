// Qwen2-MoE (issue 21): its hyper-parameters (the experts' and the shared expert's widths with
// llama.cpp's fallbacks, weights not normalized), what loading refuses, and that the shared expert
// and expert_weights_norm reach the logits. Its forward pass against llama.cpp:
// generated_golden_test.cpp; the expert cache: expert_cache_test.cpp; --cpu-moe on the virtual
// device: offload_moe_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "engine/session.h"
#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "model/gguf_rewrite.h"
#include "model/hparams.h"
#include "model/model.h"
#include "ops/thread_pool.h"
#include "test_support.h"

namespace fitllm {
namespace {

using test::load_error;
using test::open_tiny;
using test::rewrite;

bool has(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

// Drops key `key` from the copy.
test::Rewrite without_key(const std::string& key) {
    return {.keep_key = [key](const std::string& k) { return k != key; }};
}

// Drops tensor `name` from the copy.
test::Rewrite without_tensor(const std::string& name) {
    return {.tensor = [name](const std::string& t, std::vector<std::byte>&) { return t != name; }};
}

std::vector<float> logits_after_prompt(const gguf::GgufFile& file) {
    const auto m = model::Model::load(file);
    ops::ThreadPool pool(2);
    engine::Session session(*m, {.n_ctx = 64, .n_batch = 64}, pool);
    const std::vector<int32_t> prompt = {40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51};
    const std::span<const float> logits = session.feed(prompt);
    return {logits.begin(), logits.end()};
}

TEST(Qwen2MoeHparams, ReadsTheExpertsAndTheSharedExpert) {
    const gguf::GgufFile file = open_tiny("tiny-qwen2moe-f16");
    const model::Hparams hp = model::read_hparams(file);
    EXPECT_EQ(hp.arch, "qwen2moe");
    EXPECT_EQ(hp.n_expert, 8);
    EXPECT_EQ(hp.n_expert_used, 2);
    EXPECT_EQ(hp.n_ff_exp, 32);
    EXPECT_EQ(hp.n_ff_shexp, 256);
    EXPECT_EQ(hp.n_ff, 256);  // feed_forward_length (128) gives way to the shared expert's width
    EXPECT_FALSE(hp.expert_weights_norm);
    EXPECT_EQ(hp.expert_weights_scale, 0.0f);
}

// llama.cpp's fallbacks: the experts feed_forward_length / expert_used_count wide (128 / 2 = 64),
// the shared expert feed_forward_length (128); neither fits this file's tensors, named.
TEST(Qwen2MoeHparams, WidthsFallBackAsLlamaCppsAndMisfitsAreNamed) {
    const gguf::GgufFile file = open_tiny("tiny-qwen2moe-f16");
    std::string e = load_error(rewrite(file, without_key("qwen2moe.expert_shared_feed_forward_length")));
    EXPECT_TRUE(has(e, "'blk.0.ffn_gate_shexp.weight' has shape") && has(e, "expected [256, 128]")) << e;
    e = load_error(rewrite(file, without_key("qwen2moe.expert_feed_forward_length")));
    EXPECT_TRUE(has(e, "blk.0.ffn_gate_exps.weight")) << e;
    e = load_error(rewrite(file, without_key("qwen2moe.expert_used_count")));
    EXPECT_TRUE(has(e, "qwen2moe.expert_used_count")) << e;
}

TEST(Qwen2MoeWeights, MissingTensorsAreNamed) {
    const gguf::GgufFile file = open_tiny("tiny-qwen2moe-f16");
    EXPECT_EQ(load_error(rewrite(file, {})), "");
    for (const char* name : {"blk.1.ffn_down_shexp.weight", "blk.0.ffn_gate_inp_shexp.weight",
                             "blk.1.ffn_up_exps.weight", "blk.0.attn_k.bias"}) {
        const std::string e = load_error(rewrite(file, without_tensor(name)));
        EXPECT_TRUE(has(e, std::string("'") + name + "'")) << name << ": " << e;
    }
}

// The shared expert's output reaches the logits through its gate: a copy whose gate input is
// zeroed scales it by sigmoid(0) = 1/2, not by the original's per-token values.
TEST(Qwen2MoeForward, TheSharedExpertsGateCounts) {
    const gguf::GgufFile file = open_tiny("tiny-qwen2moe-f16");
    const std::vector<float> want = logits_after_prompt(file);
    const std::vector<std::byte> zeroed = rewrite(file, {.tensor = [](const std::string& t, std::vector<std::byte>& b) {
                                                      if (t == "blk.1.ffn_gate_inp_shexp.weight")
                                                          std::memset(b.data(), 0, b.size());
                                                      return true;
                                                  }});
    const std::vector<float> got = logits_after_prompt(gguf::GgufFile::parse(zeroed, "zeroed.gguf"));
    ASSERT_EQ(got.size(), want.size());
    float diff = 0.0f;
    for (size_t i = 0; i < got.size(); ++i) diff = std::max(diff, std::fabs(got[i] - want[i]));
    EXPECT_GT(diff, 1e-3f);
}

// expert_weights_norm true (HF's norm_topk_prob) normalizes the routed weights: other logits.
TEST(Qwen2MoeForward, ExpertWeightsNormIsRead) {
    const gguf::GgufFile file = open_tiny("tiny-qwen2moe-f16");
    const std::vector<std::byte> normed =
        rewrite(file, {.add = [](gguf::GgufWriter& w) { w.add<bool>("qwen2moe.expert_weights_norm", true); }});
    const gguf::GgufFile normed_file = gguf::GgufFile::parse(normed, "normed.gguf");
    EXPECT_TRUE(model::read_hparams(normed_file).expert_weights_norm);
    const std::vector<float> a = logits_after_prompt(file);
    const std::vector<float> b = logits_after_prompt(normed_file);
    float diff = 0.0f;
    for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::fabs(a[i] - b[i]));
    EXPECT_GT(diff, 1e-3f);
}

}  // namespace
}  // namespace fitllm
