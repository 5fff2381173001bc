// model/activations.h: a batch longer than kFfnSliceTokens runs its feed-forward block a slice of
// tokens at a time, in a work buffer the attention block's q, k, v share. Its logits are those of
// the same tokens fed in batches short enough to be one slice each, bit for bit (matmul rows do
// not depend on the other rows of a batch; attention over an f16 cache visits a query's cells in
// position order either way), on the three architectures, with float and quantized weights (the
// tiled matmul kernels).
#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "kv/cache.h"
#include "model/activations.h"
#include "model/hparams.h"
#include "model/model.h"
#include "model/tiny_gemma3.h"
#include "model/tiny_llama.h"
#include "ops/thread_pool.h"
#include "test_support.h"

namespace fitllm {
namespace {

using model::activation_layout;
using model::ffn_slice_tokens;
using model::kFfnSliceTokens;

TEST(FfnSlice, SlicesAreEqualAndNoneShort) {
    EXPECT_EQ(ffn_slice_tokens(1), 1);
    EXPECT_EQ(ffn_slice_tokens(kFfnSliceTokens), kFfnSliceTokens);
    EXPECT_EQ(ffn_slice_tokens(kFfnSliceTokens + 1), (kFfnSliceTokens + 2) / 2);  // two, not 128 + 1
    EXPECT_EQ(ffn_slice_tokens(4 * kFfnSliceTokens), kFfnSliceTokens);
    for (int n = 1; n <= 5 * kFfnSliceTokens; ++n) {
        const int s = ffn_slice_tokens(n);
        ASSERT_LE(s, kFfnSliceTokens) << n;
        const int n_slices = (n + s - 1) / s;
        ASSERT_GT(n - (n_slices - 1) * s, s - n_slices) << n;  // the last slice is short by less than their number
    }
}

TEST(FfnSlice, LayoutHoldsEveryStepOfALayer) {
    model::Hparams hp;  // Gemma 3 270M's shape: q and attn wider than n_embd
    hp.n_embd = 640, hp.n_head = 4, hp.n_head_kv = 1, hp.head_dim = 256, hp.head_dim_v = 256, hp.n_ff = 2048;
    for (const int n : {1, 7, 128, 129, 512}) {
        const model::ActivationLayout l = activation_layout(hp, n);
        const auto tok = static_cast<uint64_t>(n);
        EXPECT_EQ(l.x, tok * 640);
        EXPECT_EQ(l.cur, tok * 1024);                                   // attention's output lands in cur
        EXPECT_GE(l.work, l.v_offset + tok * 256);                      // q, k, v side by side
        EXPECT_GE(l.work, tok * 640);                                   // the output projection where q was
        EXPECT_GE(l.work, l.up_offset + uint64_t(l.ffn_slice) * 2048);  // gate and up of a slice
        EXPECT_EQ(l.k_offset, tok * 1024);
        EXPECT_EQ(l.v_offset, tok * 1280);
    }
    // A 512-token batch holds 3200 floats per token instead of the 7936 of separate buffers.
    EXPECT_EQ(activation_layout(hp, 512).floats(), 512u * 3200);
}

struct Case {
    std::string name;
    std::vector<std::byte> bytes;  // empty: open `path`
    std::string path;
};

std::vector<float> logits_in_batches(model::Model& model, const std::vector<int32_t>& tokens, int batch,
                                     ops::ThreadPool& pool) {
    const auto n = static_cast<int>(tokens.size());
    const size_t n_vocab = static_cast<size_t>(model.n_vocab());
    kv::CacheParams cp;
    cp.n_cells = n;
    // Sized for the whole prompt in one batch either way: the same pools (a Gemma 3 window pool
    // sized for shorter batches would be a ring, visited in another order).
    kv::ModelCache cache = model.make_cache(cp, n);
    std::vector<float> out(tokens.size() * n_vocab);
    for (int t0 = 0; t0 < n; t0 += batch) {
        const int m = std::min(batch, n - t0);
        std::vector<int32_t> pos(static_cast<size_t>(m));
        for (int i = 0; i < m; ++i) pos[static_cast<size_t>(i)] = t0 + i;
        const auto first = static_cast<size_t>(t0);
        model.forward(
            {.tokens = std::span(tokens).subspan(first, static_cast<size_t>(m)), .positions = pos, .all_logits = true},
            cache, out.data() + first * n_vocab, pool);
    }
    return out;
}

TEST(FfnSlice, ASlicedBatchGivesTheLogitsOfShortBatchesBitForBit) {
    const std::vector<Case> cases = {
        {"gemma3 with a global layer", test::tiny_gemma3_bytes({.n_layer = 6}), ""},
        {"llama", test::tiny_llama_bytes({.rope_freqs = true}), ""},
        {"qwen2", test::tiny_llama_bytes({.arch = "qwen2", .qkv_bias = true}), ""},
        {"llama q8_0", {}, (test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf").string()},
        {"qwen2 q4_k_m", {}, (test::source_dir() / "tests/model/data/tiny-qwen2-q4_k_m.gguf").string()},
    };
    const int n = 3 * 100;  // one batch: 3 FFN slices of 100 tokens; batches of 100: one slice each
    ASSERT_EQ(ffn_slice_tokens(n), 100);
    ops::ThreadPool pool(2);
    for (const Case& c : cases) {
        SCOPED_TRACE(c.name);
        const gguf::GgufFile file =
            c.bytes.empty() ? gguf::GgufFile::open(c.path) : gguf::GgufFile::parse(c.bytes, "tiny.gguf");
        const auto model = model::Model::load(file);
        std::vector<int32_t> tokens(static_cast<size_t>(n));
        for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((7 * i + 3) % 40);
        const std::vector<float> whole = logits_in_batches(*model, tokens, n, pool);
        const std::vector<float> short_batches = logits_in_batches(*model, tokens, 100, pool);
        ASSERT_EQ(whole.size(), short_batches.size());
        for (size_t i = 0; i < whole.size(); ++i) {
            ASSERT_EQ(whole[i], short_batches[i]) << "token " << i / static_cast<size_t>(model->n_vocab());
        }
    }
}

}  // namespace
}  // namespace fitllm
