// Gemma 2's hyper-parameters (llama.cpp's rules and defaults), its refusals, and the logit cap on
// the tiny generated file. Its forward pass against llama.cpp: generated_golden_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "engine/session.h"
#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "model/hparams.h"
#include "model/model.h"
#include "model/tiny_gemma3.h"
#include "ops/thread_pool.h"
#include "test_support.h"

namespace fitllm {
namespace {

// The tiny Gemma-3-shaped model as a gemma2 file (its Q/K norm tensors are left unread), with its
// metadata filtered by `keep` (false drops a key), extra keys added by `add`, and with_output an
// output.weight (a copy of the embedding).
std::vector<std::byte> gemma2_bytes(int64_t n_layer, const std::function<bool(const gguf::Value&)>& keep,
                                    const std::function<void(gguf::GgufWriter&)>& add, bool with_output = false) {
    const std::vector<std::byte> tiny = test::tiny_gemma3_bytes({.arch = "gemma2", .n_layer = n_layer});
    const gguf::GgufFile source = gguf::GgufFile::parse(tiny, "tiny.gguf");
    gguf::GgufWriter w;
    for (const gguf::Value& v : source.metadata()) {
        if (keep(v)) w.add_value(v);
    }
    add(w);
    for (const gguf::TensorInfo& t : source.tensors()) {
        w.add_tensor(t.name, t.type, std::span<const int64_t>(t.ne.data(), t.n_dims), t.data);
        if (with_output && t.name == "token_embd.weight") {
            w.add_tensor("output.weight", t.type, std::span<const int64_t>(t.ne.data(), t.n_dims), t.data);
        }
    }
    return w.to_bytes();
}

const auto kKeepAll = [](const gguf::Value&) { return true; };
const auto kAddNone = [](gguf::GgufWriter&) {};

std::string hparams_error(const std::vector<std::byte>& bytes) {
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "g2.gguf");
    try {
        model::Model::load(file);
    } catch (const model::ModelError& e) {
        return e.what();
    }
    return "";
}

TEST(Gemma2Hparams, EvenLayersAreLocalAndTheCapsDefaultToLlamaCpps) {
    const std::vector<std::byte> bytes = gemma2_bytes(5, kKeepAll, kAddNone);
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "g2.gguf");
    const model::Hparams hp = model::read_hparams(file);
    EXPECT_EQ(hp.arch, "gemma2");
    EXPECT_EQ(hp.is_swa, (std::vector<bool>{true, false, true, false, true}));
    EXPECT_EQ(hp.sliding_window, 4);
    EXPECT_FLOAT_EQ(hp.attn_softcap, 50.0f);
    EXPECT_FLOAT_EQ(hp.final_logit_softcap, 30.0f);
    EXPECT_FLOAT_EQ(hp.rope_base_swa, hp.rope_base);  // one base unless rope.freq_base_swa
    EXPECT_FLOAT_EQ(hp.rope_freq_scale, 1.0f);
    EXPECT_FLOAT_EQ(hp.attn_scale, 0.25f);  // 1 / sqrt(head_dim 16)
}

TEST(Gemma2Hparams, FileValuesReplaceTheDefaults) {
    const std::vector<std::byte> bytes = gemma2_bytes(
        4, [](const gguf::Value& v) { return v.key() != "gemma2.attention.sliding_window"; },
        [](gguf::GgufWriter& w) {
            w.add<float>("gemma2.attn_logit_softcapping", 4.0f);
            w.add<float>("gemma2.final_logit_softcapping", 8.0f);
            w.add<float>("gemma2.rope.freq_base_swa", 10000.0f);
        });
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "g2.gguf");
    const model::Hparams hp = model::read_hparams(file);
    EXPECT_EQ(hp.sliding_window, 4096);  // no key: Gemma 2's window
    EXPECT_FLOAT_EQ(hp.attn_softcap, 4.0f);
    EXPECT_FLOAT_EQ(hp.final_logit_softcap, 8.0f);
    EXPECT_FLOAT_EQ(hp.rope_base, 1e6f);
    EXPECT_FLOAT_EQ(hp.rope_base_swa, 1e4f);
}

TEST(Gemma2Hparams, TheSlidingWindowPatternAsAPeriodOrPerLayerFlags) {
    {
        const std::vector<std::byte> bytes = gemma2_bytes(
            6, kKeepAll, [](gguf::GgufWriter& w) { w.add<uint32_t>("gemma2.attention.sliding_window_pattern", 3); });
        const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "g2.gguf");
        EXPECT_EQ(model::read_hparams(file).is_swa, (std::vector<bool>{true, true, false, true, true, false}));
    }
    {
        const std::vector<std::byte> bytes = gemma2_bytes(3, kKeepAll, [](gguf::GgufWriter& w) {
            const bool flags[] = {false, true, true};
            w.add_array<bool>("gemma2.attention.sliding_window_pattern", flags);
        });
        const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "g2.gguf");
        EXPECT_EQ(model::read_hparams(file).is_swa, (std::vector<bool>{false, true, true}));
    }
    const std::string error = hparams_error(gemma2_bytes(3, kKeepAll, [](gguf::GgufWriter& w) {
        const bool flags[] = {false, true};
        w.add_array<bool>("gemma2.attention.sliding_window_pattern", flags);
    }));
    EXPECT_NE(error.find("gemma2.attention.sliding_window_pattern"), std::string::npos) << error;
    EXPECT_NE(error.find("one bool per layer (3)"), std::string::npos) << error;
}

TEST(Gemma2Hparams, The27BScalesQueriesByEmbeddingPerHead) {
    // llama.cpp knows the 27B by its 46 layers: Q scaled by 1/sqrt(n_embd / n_head) = 1/4 here as
    // well, so change the head size to tell the rules apart.
    const std::vector<std::byte> bytes = gemma2_bytes(
        46,
        [](const gguf::Value& v) {
            return v.key() != "gemma2.attention.key_length" && v.key() != "gemma2.attention.value_length";
        },
        [](gguf::GgufWriter& w) {
            w.add<uint32_t>("gemma2.attention.key_length", 8);
            w.add<uint32_t>("gemma2.attention.value_length", 8);
        });
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "g2.gguf");
    const model::Hparams hp = model::read_hparams(file);
    EXPECT_EQ(hp.head_dim, 8);
    EXPECT_FLOAT_EQ(hp.attn_scale, 0.25f);  // 1 / sqrt(32 / 2), not 1 / sqrt(8)
}

TEST(Gemma2Hparams, ANonPositiveCapIsRefusedByName) {
    for (const char* key : {"gemma2.attn_logit_softcapping", "gemma2.final_logit_softcapping"}) {
        const std::string error =
            hparams_error(gemma2_bytes(2, kKeepAll, [key](gguf::GgufWriter& w) { w.add<float>(key, 0.0f); }));
        EXPECT_NE(error.find(key), std::string::npos) << error;
        EXPECT_NE(error.find("must be a positive number"), std::string::npos) << error;
    }
}

TEST(Gemma2Weights, AnOutputMatrixIsRefused) {
    const std::string error = hparams_error(gemma2_bytes(2, kKeepAll, kAddNone, /*with_output=*/true));
    EXPECT_NE(error.find("output.weight"), std::string::npos) << error;
    EXPECT_NE(error.find("ties the output matrix"), std::string::npos) << error;
}

// The tiny file caps its logits at 8 (tools/gen_test_models.py): every logit stays inside, and
// the largest come close to it.
TEST(Gemma2Forward, LogitsStayInsideTheFinalCap) {
    const gguf::GgufFile file =
        gguf::GgufFile::open((test::source_dir() / "tests/model/data/tiny-gemma2-f16.gguf").string());
    const auto model = model::Model::load(file);
    ASSERT_FLOAT_EQ(model->hparams().final_logit_softcap, 8.0f);
    ops::ThreadPool pool(2);
    engine::Session session(*model, {.n_ctx = 64, .n_batch = 64}, pool);
    const std::vector<int32_t> ids = {1, 300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310};
    const std::span<const float> logits = session.feed(ids);
    float top = 0.0f;
    for (const float l : logits) {
        ASSERT_LT(std::fabs(l), 8.0f);
        top = std::max(top, std::fabs(l));
    }
    EXPECT_GT(top, 6.0f);
}

}  // namespace
}  // namespace fitllm
