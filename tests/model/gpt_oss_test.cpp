// gpt-oss (issue 21): its hyper-parameters (the alternating sliding window, YaRN, the experts),
// what loading refuses, and that the parts llama.cpp's other families lack reach the logits: the
// attention sinks, the sliding window, the router's and the experts' biases, the clamped SwiGLU.
// Its forward pass against llama.cpp: generated_golden_test.cpp; the expert cache:
// expert_cache_test.cpp; --cpu-moe on the virtual device: offload_moe_test.cpp.
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

test::Rewrite without_tensor(const std::string& name) {
    return {.tensor = [name](const std::string& t, std::vector<std::byte>&) { return t != name; }};
}

// Every F32 tensor whose name ends with `suffix` filled with `value`.
test::Rewrite fill(const std::string& suffix, float value) {
    return {.tensor = [suffix, value](const std::string& t, std::vector<std::byte>& b) {
        if (t.ends_with(suffix)) {
            for (size_t i = 0; i + sizeof(float) <= b.size(); i += sizeof(float))
                std::memcpy(b.data() + i, &value, sizeof(float));
        }
        return true;
    }};
}

// The logits after a 40-token prompt (longer than the window of 16).
std::vector<float> logits_after_prompt(const gguf::GgufFile& file) {
    const auto m = model::Model::load(file);
    ops::ThreadPool pool(2);
    engine::Session session(*m, {.n_ctx = 64, .n_batch = 64}, pool);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 40; ++i) prompt.push_back(40 + (i * 7) % 60);
    const std::span<const float> logits = session.feed(prompt);
    return {logits.begin(), logits.end()};
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    float d = 0.0f;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
    return d;
}

TEST(GptOssHparams, ReadsTheWindowTheExpertsAndYarn) {
    const gguf::GgufFile file = open_tiny("tiny-gpt-oss-f16");
    const model::Hparams hp = model::read_hparams(file);
    EXPECT_EQ(hp.arch, "gpt-oss");
    EXPECT_EQ(hp.n_layer, 2);
    EXPECT_EQ(hp.n_head, 8);
    EXPECT_EQ(hp.head_dim, 64);  // attention.key_length: n_head * head_dim is not n_embd
    EXPECT_EQ(hp.n_expert, 8);
    EXPECT_EQ(hp.n_expert_used, 2);
    EXPECT_EQ(hp.n_ff_exp, 32);
    EXPECT_TRUE(hp.gpt_oss_experts);
    EXPECT_FALSE(hp.expert_weights_norm);
    EXPECT_EQ(hp.sliding_window, 16);
    EXPECT_EQ(hp.is_swa, (std::vector<bool>{true, false}));  // llama.cpp's set_swa_pattern(2)
    EXPECT_EQ(hp.rope_base_swa, hp.rope_base);
    EXPECT_GT(hp.rope_ext_factor, 0.0f);  // YaRN
    EXPECT_FLOAT_EQ(hp.rope_freq_scale, 0.25f);
    EXPECT_FLOAT_EQ(hp.attn_scale, 0.125f);  // 1 / sqrt(head_dim)
}

TEST(GptOssHparams, TheWindowPatternKeyIsRead) {
    const gguf::GgufFile file = open_tiny("tiny-gpt-oss-f16");
    const std::vector<std::byte> every = rewrite(
        file, {.add = [](gguf::GgufWriter& w) { w.add<uint32_t>("gpt-oss.attention.sliding_window_pattern", 0); }});
    EXPECT_EQ(model::read_hparams(gguf::GgufFile::parse(every, "every.gguf")).is_swa,
              (std::vector<bool>{true, true}));  // a period of 0: every layer local
    const std::vector<std::byte> bad = rewrite(
        file, {.add = [](gguf::GgufWriter& w) { w.add<uint32_t>("gpt-oss.attention.sliding_window_pattern", 9); }});
    EXPECT_TRUE(has(load_error(bad), "gpt-oss.attention.sliding_window_pattern")) << load_error(bad);
    const std::vector<std::byte> no_window =
        rewrite(file, {.keep_key = [](const std::string& k) { return k != "gpt-oss.attention.sliding_window"; }});
    EXPECT_TRUE(has(load_error(no_window), "gpt-oss.attention.sliding_window")) << load_error(no_window);
}

TEST(GptOssWeights, MissingTensorsAreNamed) {
    const gguf::GgufFile file = open_tiny("tiny-gpt-oss-f16");
    EXPECT_EQ(load_error(rewrite(file, {})), "");
    for (const char* name :
         {"blk.1.attn_sinks.weight", "blk.0.ffn_gate_inp.bias", "blk.1.ffn_down_exps.bias", "blk.1.ffn_up_exps.bias",
          "blk.0.post_attention_norm.weight", "blk.1.attn_output.bias", "blk.0.attn_q.bias"}) {
        const std::string e = load_error(rewrite(file, without_tensor(name)));
        EXPECT_TRUE(has(e, std::string("'") + name + "'")) << name << ": " << e;
    }
}

// Sinks elsewhere are refused by name rather than ignored.
TEST(GptOssWeights, OtherArchitecturesRefuseSinks) {
    const gguf::GgufFile file = open_tiny("tiny-qwen2moe-f16");
    gguf::GgufWriter w;
    for (const gguf::Value& v : file.metadata()) w.add_value(v);
    for (const gguf::TensorInfo& t : file.tensors()) {
        w.add_tensor(t.name, t.type, std::span<const int64_t>(t.ne.data(), t.n_dims),
                     std::span<const std::byte>(t.data.data(), t.data.size()));
    }
    const std::vector<float> sinks(4, 1.0f);
    const int64_t n = 4;
    w.add_tensor("blk.0.attn_sinks.weight", quant::GgmlType::F32, std::span<const int64_t>(&n, 1),
                 std::as_bytes(std::span<const float>(sinks)));
    const std::string e = load_error(w.to_bytes());
    EXPECT_TRUE(has(e, "blk.0.attn_sinks.weight") && has(e, "gpt-oss only")) << e;
}

// The sinks count: sinks of -1e30 (exp(sink - max) = 0: no sinks) give other logits, and so does
// every sink at +20 (above every score: the attention output shrinks).
TEST(GptOssForward, TheSinksReachTheLogits) {
    const gguf::GgufFile file = open_tiny("tiny-gpt-oss-f16");
    const std::vector<float> want = logits_after_prompt(file);
    const std::vector<std::byte> none = rewrite(file, fill("attn_sinks.weight", -1e30f));
    EXPECT_GT(max_diff(logits_after_prompt(gguf::GgufFile::parse(none, "none.gguf")), want), 0.05f);
    const std::vector<std::byte> high = rewrite(file, fill("attn_sinks.weight", 20.0f));
    EXPECT_GT(max_diff(logits_after_prompt(gguf::GgufFile::parse(high, "high.gguf")), want), 0.05f);
}

// The window of the even layers counts past 16 tokens: a window of 2048 changes the logits.
TEST(GptOssForward, TheSlidingWindowCounts) {
    const gguf::GgufFile file = open_tiny("tiny-gpt-oss-f16");
    const std::vector<float> want = logits_after_prompt(file);
    const std::vector<std::byte> wide =
        rewrite(file, {.keep_key = [](const std::string& k) { return k != "gpt-oss.attention.sliding_window"; },
                       .add = [](gguf::GgufWriter& w) { w.add<uint32_t>("gpt-oss.attention.sliding_window", 2048); }});
    EXPECT_GT(max_diff(logits_after_prompt(gguf::GgufFile::parse(wide, "wide.gguf")), want), 0.05f);
}

// The router's bias and each of the experts' biases reach the logits.
TEST(GptOssForward, TheRouterAndExpertBiasesCount) {
    const gguf::GgufFile file = open_tiny("tiny-gpt-oss-f16");
    const std::vector<float> want = logits_after_prompt(file);
    for (const char* suffix : {"ffn_gate_inp.bias", "ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias"}) {
        const std::vector<std::byte> zeroed = rewrite(file, fill(suffix, 0.0f));
        EXPECT_GT(max_diff(logits_after_prompt(gguf::GgufFile::parse(zeroed, "zeroed.gguf")), want), 1e-3f) << suffix;
    }
}

}  // namespace
}  // namespace fitllm
