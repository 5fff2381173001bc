// Context shifts on models with global attention: what a shifted cache holds, compared with caches
// that reach the same state without re-rotating K.
//
// A shift (engine::Session::shift_context) drops tokens after n_keep and moves the rest back, as
// llama.cpp's does: the K/V rows of the tokens it keeps are those computed while the dropped tokens
// were still there, K only re-rotated to the new positions. So where a kept token's attention
// reached a dropped one in any layer but the last, the logits after a shift are not those of a
// fresh session fed the kept tokens, in llama.cpp either (tiny-llama-f16: 2.9 apart, max logit
// 10.9). What they are is fixed by RoPE being relative: with no kept tokens every distance stays
// what it was, so the shifted cache scores like the same cache with the tokens only removed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/session.h"
#include "gguf/gguf_reader.h"
#include "model/gguf_rewrite.h"
#include "model/model.h"
#include "model/tiny_gemma3.h"

namespace fitllm {
namespace {

struct Loaded {
    std::vector<std::byte> bytes;
    gguf::GgufFile file;
    std::unique_ptr<model::Model> model;
};

// A file of tests/model/data, or "gemma3-6": tiny Gemma 3 with five local layers and a global one.
Loaded load(const std::string& name) {
    if (name == "gemma3-6") {
        std::vector<std::byte> bytes = test::tiny_gemma3_bytes({.n_layer = 6});
        gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny-gemma3-6.gguf");
        auto model = model::Model::load(file);
        return {std::move(bytes), std::move(file), std::move(model)};
    }
    gguf::GgufFile file = test::open_tiny(name);
    auto model = model::Model::load(file);
    return {{}, std::move(file), std::move(model)};
}

std::vector<int32_t> some_tokens(int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>((i * 11 + 3) % 37);
    return t;
}

// The largest difference, as a fraction of the largest |want|.
float relative_diff(std::span<const float> got, std::span<const float> want) {
    float max_logit = 0.0f, max_diff = 0.0f;
    for (size_t i = 0; i < want.size(); ++i) {
        max_logit = std::max(max_logit, std::fabs(want[i]));
        max_diff = std::max(max_diff, std::fabs(got[i] - want[i]));
    }
    return max_diff / max_logit;
}

class ContextShift : public ::testing::TestWithParam<std::string> {};

// n_keep 0: the shift drops the oldest 8 of 16 tokens and moves the rest back by 8, so every
// distance between two kept tokens, and from the next token to them, is what it was. The logits
// are those of the cache that only forgot the 8 tokens (seq_rm, no K rotated) and takes the next
// token at position 16. Catches a K re-rotation by the wrong angle, sign or frequencies on any
// layer, one applied to SmolLM3's layers without RoPE, and one that scales K by YaRN's or
// LongRoPE's magnitude again (ops::rotation_only; 7.7% and 17% of the largest logit off before).
// llama.cpp 0.3.36 does both of the last two: its shifted caches end up 4.3 (smollm3, max logit
// 14), 1.1 (qwen3-yarn) and 2.5 (phi3-longrope) from its own seq_rm-only ones.
TEST_P(ContextShift, WithNothingKeptTheLogitsAreThoseOfTheCacheThatOnlyDropped) {
    const Loaded m = load(GetParam());
    ops::ThreadPool pool(2);
    const std::vector<int32_t> tokens = some_tokens(17);
    for (const KvType type : {KvType::f16, KvType::f32}) {
        ContextConfig p{.n_ctx = 16, .n_batch = 16, .type_k = type, .type_v = type};
        p.context_shift = true;
        p.n_keep = 0;
        engine::Session shifted(*m.model, p, pool);
        shifted.feed(std::span<const int32_t>(tokens.data(), 16));
        const std::vector<float> got = [&] {
            const std::span<const float> l = shifted.feed(std::span<const int32_t>(&tokens[16], 1));
            return std::vector<float>(l.begin(), l.end());
        }();
        ASSERT_EQ(shifted.n_past(), 9);  // 8 dropped, then one more
        ASSERT_EQ(shifted.n_shifts(), 1);

        engine::Session dropped(*m.model, {.n_ctx = 32, .n_batch = 16, .type_k = type, .type_v = type}, pool);
        dropped.feed(std::span<const int32_t>(tokens.data(), 16));
        dropped.cache().seq_rm(0, 0, 8);
        const std::span<const float> want = dropped.feed(std::span<const int32_t>(&tokens[16], 1));  // position 16
        ASSERT_EQ(got.size(), want.size());
        EXPECT_LT(relative_diff(got, want), type == KvType::f32 ? 2e-3f : 1e-2f)
            << GetParam() << " " << (type == KvType::f32 ? "f32" : "f16");
    }
}

// Forgetting tokens in the middle (seq_rm, no shift) and filling the hole they leave: the next
// token's cell is in the middle of the block, before cells of earlier positions. Its logits are
// those of the same cache with the token in a cell after the others, the hole filled by tokens of
// later positions that the causal mask hides from it.
TEST_P(ContextShift, ATokenPlacedInAHoleScoresLikeOnePlacedAfterTheOthers) {
    const Loaded m = load(GetParam());
    ops::ThreadPool pool(2);
    const std::vector<int32_t> tokens = some_tokens(17);
    const int32_t pos16 = 16;
    const auto next = [&](engine::Session& s) {
        std::vector<float> logits(static_cast<size_t>(m.model->n_vocab()));
        m.model->forward(std::span<const int32_t>(&tokens[16], 1), std::span<const int32_t>(&pos16, 1), s.cache(),
                         logits.data(), /*all_logits=*/false, pool);
        return logits;
    };
    // The same context size for both (LongRoPE picks its factors by it).
    engine::Session full(*m.model, {.n_ctx = 32, .n_batch = 16}, pool);
    full.feed(std::span<const int32_t>(tokens.data(), 16));
    full.cache().seq_rm(0, 2, 9);
    const std::vector<float> got = next(full);
    ASSERT_EQ(full.cache().cells(0).size(), 1u);
    EXPECT_GE(full.cache().cells(0)[0], 2);  // in the hole (the block it shares with the others has room)
    EXPECT_LT(full.cache().cells(0)[0], 9);

    engine::Session roomy(*m.model, {.n_ctx = 32, .n_batch = 16}, pool);
    roomy.feed(std::span<const int32_t>(tokens.data(), 16));
    roomy.cache().seq_rm(0, 2, 9);
    const std::vector<int32_t> later = {5, 6, 7, 8, 9, 10, 11};
    const std::vector<int32_t> later_pos = {100, 101, 102, 103, 104, 105, 106};
    std::vector<float> ignored(static_cast<size_t>(m.model->n_vocab()));
    m.model->forward(later, later_pos, roomy.cache(), ignored.data(), /*all_logits=*/false, pool);
    const std::vector<float> want = next(roomy);
    EXPECT_GE(roomy.cache().cells(0)[0], 16);  // after the others
    // Only the order of the sums differs; the 7 later tokens, were they seen, would move them far.
    EXPECT_LT(relative_diff(got, want), 5e-3f) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(GlobalAttention, ContextShift,
                         ::testing::Values("tiny-llama-f16", "gemma3-6", "tiny-smollm3-f16", "tiny-qwen3-yarn-f16",
                                           "tiny-phi3-longrope-f16"),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                             std::string s = param.param;
                             std::replace(s.begin(), s.end(), '-', '_');
                             return s;
                         });

}  // namespace
}  // namespace fitllm
