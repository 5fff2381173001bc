#pragma once
// The checks llama_test.cpp, qwen2_test.cpp and qwen3_test.cpp run on tiny_llama.h's models: the
// load error a file gets, and a forward pass against the double-precision reference.
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
#include "ops/thread_pool.h"

namespace fitllm::test {

// The ModelError loading such a file gives ("" when it loads).
inline std::string tiny_load_error(const TinyLlamaOptions& options) {
    const std::vector<std::byte> bytes = tiny_llama_bytes(options);
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    try {
        model::Model::load(file);
    } catch (const model::ModelError& e) {
        return e.what();
    }
    return "";
}

// Runs the whole prompt in one batch and returns all its logits.
inline std::vector<float> tiny_batch_logits(model::Model& model, const std::vector<int32_t>& tokens,
                                            ops::ThreadPool& pool) {
    std::vector<int32_t> positions(tokens.size());
    std::iota(positions.begin(), positions.end(), 0);
    kv::ModelCache cache = model.make_cache({.n_cells = 32}, 64);
    std::vector<float> all(tokens.size() * static_cast<size_t>(model.n_vocab()));
    model.forward(tokens, positions, cache, all.data(), /*all_logits=*/true, pool);
    return all;
}

// fitllm against the reference: the runtime rounds K, V and Q to f16 in attention, so the logits
// agree to a small fraction of their scale, not to float precision (measured: at most 1.4e-3 of
// the largest logit; a wrong rotation pairing or a missing bias moves them by 10x more).
inline void expect_matches_reference(const TinyLlamaOptions& options) {
    const std::vector<std::byte> bytes = tiny_llama_bytes(options);
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const auto model = model::Model::load(file);
    ops::ThreadPool pool(2);
    const std::vector<int32_t> tokens = {1, 7, 3, 39, 0, 12, 5, 5, 20, 31, 2};
    const std::vector<float> got = tiny_batch_logits(*model, tokens, pool);
    const std::vector<float> want = reference_logits(file, options, tokens);
    ASSERT_EQ(got.size(), want.size());
    float scale = 0.0f, max_diff = 0.0f;
    for (size_t i = 0; i < want.size(); ++i) {
        scale = std::max(scale, std::fabs(want[i]));
        max_diff = std::max(max_diff, std::fabs(got[i] - want[i]));
    }
    ASSERT_GT(scale, 0.5f);
    EXPECT_LE(max_diff, 5e-3f * scale) << "scale " << scale;
}

}  // namespace fitllm::test
