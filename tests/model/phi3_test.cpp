// Phi-3's hyper-parameters (llama.cpp's rules: no sliding window, LongRoPE's attention factor),
// its refusals, and LongRoPE's choice of factors by the context size. Its forward pass against
// llama.cpp (fused and separate Q/K/V, fused gate-up, partial rotary, the long factors):
// generated_golden_test.cpp; through every offload split: offload_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
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

TEST(Phi3Hparams, NoSlidingWindowFullRotaryAndTheHeadScale) {
    const gguf::GgufFile file = open_tiny("tiny-phi3-f16");
    const model::Hparams hp = model::read_hparams(file);
    EXPECT_EQ(hp.arch, "phi3");
    ASSERT_TRUE(file.has("phi3.attention.sliding_window"));  // 2047, as Phi-3-mini-4k's
    EXPECT_EQ(hp.sliding_window, 0);                         // llama.cpp turns Phi's window off
    EXPECT_EQ(hp.is_swa, std::vector<bool>(2, false));
    EXPECT_EQ(hp.n_rot, 64);
    EXPECT_FLOAT_EQ(hp.attn_scale, 0.125f);  // 1 / sqrt(head_dim 64)
    EXPECT_FLOAT_EQ(hp.rope_attn_factor, 1.0f);
    EXPECT_FLOAT_EQ(hp.rope_freq_scale, 1.0f);
}

TEST(Phi3Hparams, LongRopeFilesHavePartialRotaryAndTheirAttentionFactor) {
    const model::Hparams hp = model::read_hparams(open_tiny("tiny-phi3-longrope-f16"));
    EXPECT_EQ(hp.n_rot, 48);
    // The converter's sqrt(1 + ln(2048 / 32) / ln(32)), through rope.scaling.attn_factor.
    EXPECT_NEAR(hp.rope_attn_factor, std::sqrt(1.0 + std::log(64.0) / std::log(32.0)), 1e-6);
    EXPECT_FLOAT_EQ(hp.rope_freq_scale, 1.0f);
    EXPECT_FLOAT_EQ(hp.rope_ext_factor, 0.0f);
}

TEST(Phi3Refusals, NameWhatTheForwardPassCannotRun) {
    const gguf::GgufFile fused = open_tiny("tiny-phi3-f16");
    const gguf::GgufFile longrope = open_tiny("tiny-phi3-longrope-f16");

    std::string e =
        load_error(rewrite(fused, {.add = [](gguf::GgufWriter& w) { w.add<uint32_t>("phi3.expert_count", 16); }}));
    EXPECT_NE(e.find("'phi3.expert_count' = 16: mixture-of-experts Phi (Phi-3.5-MoE) is not supported"),
              std::string::npos)
        << e;

    // Phi-3.5-MoE is its own architecture, refused by name.
    e = load_error(
        rewrite(fused, {.keep_key = [](const std::string& k) { return k != "general.architecture"; },
                        .add = [](gguf::GgufWriter& w) { w.add_string("general.architecture", "phimoe"); }}));
    EXPECT_NE(e.find("architecture 'phimoe' is not supported"), std::string::npos) << e;

    // An unchanged copy loads: the refusals below come from what each copy changes.
    EXPECT_EQ(load_error(rewrite(fused, {})), "");

    // Fused and separate Q/K/V both: which to use is not ours to guess.
    const gguf::TensorInfo& qi = *longrope.find_tensor("blk.0.attn_q.weight");
    const std::vector<std::byte> q(qi.data.begin(), qi.data.end());
    {
        gguf::GgufWriter w;
        for (const gguf::Value& v : fused.metadata()) w.add_value(v);
        for (const gguf::TensorInfo& t : fused.tensors())
            w.add_tensor(t.name, t.type, std::span<const int64_t>(t.ne.data(), t.n_dims), t.data);
        w.add_tensor("blk.0.attn_q.weight", qi.type, std::span<const int64_t>(qi.ne.data(), qi.n_dims), q);
        e = load_error(w.to_bytes());
        EXPECT_NE(e.find("blk.0.attn_q.weight"), std::string::npos) << e;
        EXPECT_NE(e.find("also has 'blk.0.attn_qkv.weight'"), std::string::npos) << e;
    }

    // LongRoPE needs both sets of factors.
    e = load_error(rewrite(longrope, {.tensor = [](const std::string& name, std::vector<std::byte>&) {
                               return name != "rope_factors_short.weight";
                           }}));
    EXPECT_NE(e.find("'rope_factors_short.weight' is missing"), std::string::npos) << e;

    // A gate-up matrix of n_ff rows (an unfused file's ffn_up) is misshapen.
    e = load_error(
        rewrite(fused, {.keep_key = [](const std::string& k) { return k != "phi3.feed_forward_length"; },
                        .add = [](gguf::GgufWriter& w) { w.add<uint32_t>("phi3.feed_forward_length", 512); }}));
    EXPECT_NE(e.find("blk.0.ffn_up.weight"), std::string::npos) << e;
}

// The logits after a short prompt with a context of n_ctx tokens.
std::vector<float> logits_after(model::Model& m, int n_ctx) {
    ops::ThreadPool pool(2);
    engine::Session session(m, {.n_ctx = n_ctx, .n_batch = 64}, pool);
    const std::vector<int32_t> prompt = {1, 300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310};
    const std::span<const float> logits = session.feed(prompt);
    return {logits.begin(), logits.end()};
}

// llama.cpp's get_rope_factors: the short factors while a sequence's context is at most
// rope.scaling.original_context_length (32 here), the long ones beyond. A copy of the file whose
// long factors are its short ones must give, with a long context, the logits the original gives
// with a short one; and the original's two contexts must differ (the goldens check the long
// factors' values against llama.cpp).
TEST(Phi3LongRope, ShortFactorsUpToTheOriginalContextLongBeyond) {
    const gguf::GgufFile file = open_tiny("tiny-phi3-longrope-f16");
    const gguf::TensorInfo& short_t = *file.find_tensor("rope_factors_short.weight");
    const std::vector<std::byte> short_bytes(short_t.data.begin(), short_t.data.end());
    const std::vector<std::byte> swapped_bytes =
        rewrite(file, {.tensor = [&](const std::string& name, std::vector<std::byte>& data) {
                    if (name == "rope_factors_long.weight") data = short_bytes;
                    return true;
                }});
    const gguf::GgufFile swapped = gguf::GgufFile::parse(swapped_bytes, "swapped.gguf");
    std::unique_ptr<model::Model> original = model::Model::load(file);
    std::unique_ptr<model::Model> short_as_long = model::Model::load(swapped);

    const std::vector<float> at32 = logits_after(*original, 32);
    const std::vector<float> at33 = logits_after(*original, 33);
    const std::vector<float> swapped33 = logits_after(*short_as_long, 33);
    EXPECT_EQ(at32, swapped33);  // same factors, same bits
    float max_diff = 0.0f;
    for (size_t i = 0; i < at32.size(); ++i) max_diff = std::max(max_diff, std::fabs(at32[i] - at33[i]));
    EXPECT_GT(max_diff, 0.01f) << "the long factors changed nothing";
}

}  // namespace
}  // namespace fitllm
