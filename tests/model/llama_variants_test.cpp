// Granite's, OLMo 2's, SmolLM3's and Mistral 3's hyper-parameters and refusals (model/llama.cpp's
// variants of Llama).
// Their forward passes against llama.cpp: generated_golden_test.cpp (GeneratedLlamaVariants).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/session.h"
#include "gguf/gguf_writer.h"
#include "model/gguf_rewrite.h"
#include "model/hparams.h"
#include "model/model.h"
#include "ops/thread_pool.h"
#include "quant/ggml_type.h"

namespace fitllm {
namespace {

using test::load_error;
using test::open_tiny;
using test::rewrite;

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

TEST(GraniteHparams, FourMultipliersFromTheFile) {
    const model::Hparams hp = model::read_hparams(open_tiny("tiny-granite-f16"));
    EXPECT_EQ(hp.arch, "granite");
    EXPECT_FLOAT_EQ(hp.embedding_scale, 2.0f);  // tools/gen_test_models.py's GRANITE_* values
    EXPECT_FLOAT_EQ(hp.residual_scale, 0.5f);
    EXPECT_FLOAT_EQ(hp.attn_scale, 0.2f);
    EXPECT_FLOAT_EQ(hp.logit_scale, 4.0f);
}

// Each multiplier moves the last logits: a copy without it (residual and embedding scales are
// optional in Granite files) gives other logits than the file.
TEST(GraniteHparams, EachOptionalMultiplierMatters) {
    const gguf::GgufFile file = open_tiny("tiny-granite-f16");
    ops::ThreadPool pool(2);
    const std::vector<int32_t> prompt = {1, 40, 41, 42, 43, 44};
    const auto last_logits = [&](const gguf::GgufFile& f) {
        const auto model = model::Model::load(f);
        engine::Session session(*model, {.n_ctx = 64, .n_batch = 64}, pool);
        const auto logits = session.feed(prompt);
        return std::vector<float>(logits.begin(), logits.end());
    };
    const std::vector<float> base = last_logits(file);
    for (const std::string key : {"granite.residual_scale", "granite.embedding_scale"}) {
        const std::vector<std::byte> bytes =
            rewrite(file, {.keep_key = [&](const std::string& k) { return k != key; }});
        const gguf::GgufFile copy = gguf::GgufFile::parse(bytes, "granite.gguf");
        const std::vector<float> other = last_logits(copy);
        ASSERT_EQ(other.size(), base.size());
        float diff = 0.0f;
        for (size_t i = 0; i < base.size(); ++i) diff = std::max(diff, std::fabs(other[i] - base[i]));
        EXPECT_GT(diff, 0.1f) << "without " << key;
    }
}

TEST(GraniteRefusals, NameTheKey) {
    const gguf::GgufFile file = open_tiny("tiny-granite-f16");
    EXPECT_EQ(load_error(rewrite(file, {})), "");  // an unchanged copy loads
    std::string e =
        load_error(rewrite(file, {.keep_key = [](const std::string& k) { return k != "granite.logit_scale"; }}));
    EXPECT_TRUE(contains(e, "'granite.logit_scale' = (missing): Granite files must have it")) << e;
    e = load_error(
        rewrite(file, {.add = [](gguf::GgufWriter& w) { w.add<bool>("granite.rope.scaling.finetuned", false); }}));
    EXPECT_TRUE(contains(e, "'granite.rope.scaling.finetuned' = false: Granite without rotary embeddings")) << e;
}

// An F32 vector of n ones named name.
void add_ones(gguf::GgufWriter& w, const std::string& name, int64_t n) {
    std::vector<std::byte> data(static_cast<size_t>(n) * sizeof(float));
    const float one = 1.0f;
    for (int64_t i = 0; i < n; ++i) std::memcpy(data.data() + i * sizeof(float), &one, sizeof(float));
    const int64_t ne[] = {n};
    w.add_tensor(name, quant::GgmlType::F32, ne, std::move(data));
}

TEST(Olmo2Hparams, HeadSizeIsTheEmbeddingOverTheHeads) {
    const model::Hparams hp = model::read_hparams(open_tiny("tiny-olmo2-f16"));
    EXPECT_EQ(hp.arch, "olmo2");
    EXPECT_EQ(hp.head_dim * hp.n_head, hp.n_embd);
    EXPECT_EQ(hp.is_swa, std::vector<bool>(static_cast<size_t>(hp.n_layer), false));
    EXPECT_FLOAT_EQ(hp.logit_scale, 0.0f);
}

TEST(Olmo2Refusals, NameTheKeyOrTheTensor) {
    const gguf::GgufFile file = open_tiny("tiny-olmo2-f16");
    EXPECT_EQ(load_error(rewrite(file, {})), "");
    // OLMo 3's sliding window.
    std::string e = load_error(
        rewrite(file, {.add = [](gguf::GgufWriter& w) { w.add<uint32_t>("olmo2.attention.sliding_window", 4096); }}));
    EXPECT_TRUE(
        contains(e, "'olmo2.attention.sliding_window' = 4096: OLMo 3's sliding-window layers are not supported"))
        << e;
    // A pre-norm the forward pass would not use.
    e = load_error(rewrite(file, {.add = [](gguf::GgufWriter& w) { add_ones(w, "blk.0.attn_norm.weight", 256); }}));
    EXPECT_TRUE(contains(e, "blk.0.attn_norm.weight")) << e;
    EXPECT_TRUE(contains(e, "olmo2 has no norms before its blocks")) << e;
    // Q's norm of one head (Qwen3's shape) instead of all heads.
    e = load_error(
        rewrite(file, {.add = [](gguf::GgufWriter& w) { add_ones(w, "blk.1.attn_q_norm.weight", 64); },
                       .tensor = [](const std::string& name,
                                    std::vector<std::byte>&) { return name != "blk.1.attn_q_norm.weight"; }}));
    EXPECT_TRUE(contains(e, "blk.1.attn_q_norm.weight")) << e;
}

TEST(SmolLm3Hparams, EveryFourthLayerHasNoRope) {
    const model::Hparams hp = model::read_hparams(open_tiny("tiny-smollm3-f16"));
    EXPECT_EQ(hp.arch, "smollm3");
    ASSERT_EQ(hp.n_layer, 4);
    EXPECT_TRUE(hp.rotates(0));
    EXPECT_TRUE(hp.rotates(2));
    EXPECT_FALSE(hp.rotates(3));
}

// tools/gen_test_models.py's MISTRAL3_* values: temperature beta 0.5 stepping every 64 positions
// (YaRN's original context), yarn_log_multiplier 1 over a YaRN factor of 4.
TEST(Mistral3Hparams, TemperatureAndYarnMagnitude) {
    const model::Hparams hp = model::read_hparams(open_tiny("tiny-mistral3-f16"));
    EXPECT_EQ(hp.arch, "mistral3");
    EXPECT_FLOAT_EQ(hp.attn_temp_scale, 0.5f);
    EXPECT_EQ(hp.attn_temp_floor, 64);
    EXPECT_EQ(hp.attn_temp(0), 1.0f);
    EXPECT_EQ(hp.attn_temp(63), 1.0f);
    EXPECT_FLOAT_EQ(hp.attn_temp(64), 1.0f + 0.5f * std::log(2.0f));
    EXPECT_FLOAT_EQ(hp.attn_temp(200), 1.0f + 0.5f * std::log(4.0f));
    // mscale(1) / mscale(1) / (1 + 0.1 ln 4): the rotation's own 1 + 0.1 ln 4 cancels to 1.
    EXPECT_FLOAT_EQ(hp.rope_attn_factor, 1.0f / (1.0f + 0.1f * std::log(4.0f)));
    EXPECT_FLOAT_EQ(hp.rope_freq_scale, 0.25f);
}

// The temperature and yarn_log_multiplier each move the logits of a prompt past position 64: a
// copy without either key gives other logits than the file.
TEST(Mistral3Hparams, TemperatureAndLogMultiplierMatter) {
    const gguf::GgufFile file = open_tiny("tiny-mistral3-f16");
    ops::ThreadPool pool(2);
    std::vector<int32_t> prompt = {1};
    for (int i = 0; i < 99; ++i) prompt.push_back(30 + (i * 7) % 200);
    const auto last_logits = [&](const gguf::GgufFile& f) {
        const auto model = model::Model::load(f);
        engine::Session session(*model, {.n_ctx = 128, .n_batch = 128}, pool);
        const auto logits = session.feed(prompt);
        return std::vector<float>(logits.begin(), logits.end());
    };
    const std::vector<float> base = last_logits(file);
    for (const std::string key :
         {"mistral3.attention.temperature_scale", "mistral3.rope.scaling.yarn_log_multiplier"}) {
        const std::vector<std::byte> bytes =
            rewrite(file, {.keep_key = [&](const std::string& k) { return k != key; }});
        const gguf::GgufFile copy = gguf::GgufFile::parse(bytes, "mistral3.gguf");
        const std::vector<float> other = last_logits(copy);
        ASSERT_EQ(other.size(), base.size());
        float diff = 0.0f;
        for (size_t i = 0; i < base.size(); ++i) diff = std::max(diff, std::fabs(other[i] - base[i]));
        EXPECT_GT(diff, 0.1f) << "without " << key;
    }
}

// rope.scaling.attn_factor a scales cos and sin, so Q and K by a each and every attention score by
// a^2: a Llama file with it gives the logits of the file whose attention.scale is a^2 / sqrt(head_dim)
// (up to rounding), and clearly other logits than the file without it. Read for every
// architecture, as llama.cpp does.
TEST(RopeAttnFactor, ScalesEveryAttentionScoreBySquare) {
    const gguf::GgufFile file = open_tiny("tiny-llama-f16");
    const model::Hparams base_hp = model::read_hparams(file);
    ops::ThreadPool pool(2);
    std::vector<int32_t> prompt = {1};
    for (int i = 0; i < 40; ++i) prompt.push_back(30 + (i * 11) % 200);
    const auto last_logits = [&](const std::vector<std::byte>& bytes) {
        const gguf::GgufFile f = gguf::GgufFile::parse(bytes, "llama.gguf");
        const auto model = model::Model::load(f);
        // f32 K/V: f16 would round the scaled keys differently from the plain ones.
        engine::Session session(*model, {.n_ctx = 64, .n_batch = 64, .type_k = KvType::f32, .type_v = KvType::f32},
                                pool);
        const auto logits = session.feed(prompt);
        return std::vector<float>(logits.begin(), logits.end());
    };
    constexpr float a = 1.6f;
    const std::vector<float> plain = last_logits(rewrite(file, {}));
    const std::vector<std::byte> with_factor =
        rewrite(file, {.add = [&](gguf::GgufWriter& w) { w.add<float>("llama.rope.scaling.attn_factor", a); }});
    EXPECT_FLOAT_EQ(model::read_hparams(gguf::GgufFile::parse(with_factor, "llama.gguf")).rope_attn_factor,
                    base_hp.rope_attn_factor * a);
    const std::vector<float> factor = last_logits(with_factor);
    const std::vector<float> scaled = last_logits(
        rewrite(file, {.add = [&](gguf::GgufWriter& w) {
                    w.add<float>("llama.attention.scale", a * a / std::sqrt(static_cast<float>(base_hp.head_dim)));
                }}));
    ASSERT_EQ(factor.size(), plain.size());
    ASSERT_EQ(scaled.size(), plain.size());
    float moved = 0.0f, apart = 0.0f;
    for (size_t i = 0; i < plain.size(); ++i) {
        moved = std::max(moved, std::fabs(factor[i] - plain[i]));
        apart = std::max(apart, std::fabs(factor[i] - scaled[i]));
    }
    float largest = 0.0f;
    for (float v : plain) largest = std::max(largest, std::fabs(v));
    std::printf(
        "  rope.scaling.attn_factor %.1f moves the logits by up to %.4f (largest %.2f); %.6f from attention.scale\n", a,
        moved, largest, apart);
    EXPECT_GT(moved, 0.1f) << "the factor does not move the logits";
    // Rounding only, grown through the layers by the sharper softmax: measured 0.0044 for a move of 5.76.
    EXPECT_LT(apart, 0.01f * moved) << "the factor is not a^2 on the attention scores";

    const std::string e = load_error(
        rewrite(file, {.add = [](gguf::GgufWriter& w) { w.add<float>("llama.rope.scaling.attn_factor", 0.0f); }}));
    EXPECT_TRUE(contains(e, "'llama.rope.scaling.attn_factor' = 0.000000: must be a positive number")) << e;
}

TEST(Mistral3Refusals, NameTheKey) {
    const gguf::GgufFile file = open_tiny("tiny-mistral3-f16");
    EXPECT_EQ(load_error(rewrite(file, {})), "");
    const auto with = [&](const std::string& key, float value) {
        return load_error(rewrite(file, {.keep_key = [&](const std::string& k) { return k != key; },
                                         .add = [&](gguf::GgufWriter& w) { w.add<float>(key, value); }}));
    };
    std::string e = with("mistral3.attention.temperature_scale", NAN);
    EXPECT_TRUE(contains(e, "'mistral3.attention.temperature_scale' = nan: must be finite")) << e;
    e = with("mistral3.rope.scaling.yarn_log_multiplier", -1.0f);
    EXPECT_TRUE(contains(e, "'mistral3.rope.scaling.yarn_log_multiplier' = -1.000000: must be a finite number >= 0"))
        << e;
    // The temperature's step is YaRN's original context: 0 is refused naming it.
    e = load_error(rewrite(
        file,
        {.keep_key = [](const std::string& k) { return k != "mistral3.rope.scaling.original_context_length"; },
         .add = [](gguf::GgufWriter& w) { w.add<uint32_t>("mistral3.rope.scaling.original_context_length", 0); }}));
    EXPECT_TRUE(contains(e, "'mistral3.rope.scaling.original_context_length' = 0")) << e;
    // Mistral 3's mixture-of-experts files (Mistral Small 4 style) are not supported.
    e = load_error(rewrite(file, {.add = [](gguf::GgufWriter& w) { w.add<uint32_t>("mistral3.expert_count", 8); }}));
    EXPECT_TRUE(contains(e, "'mistral3.expert_count' = 8: mixture-of-experts models")) << e;
}

}  // namespace
}  // namespace fitllm
