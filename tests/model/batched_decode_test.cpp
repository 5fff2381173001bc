// Several sequences in one forward pass (issue 5): decoding tokens of different sequences together
// gives the logits each gets alone, and a prefix shared with seq_cp, then diverging (copy on
// write), gives what each continuation gets from its own copy of the prefix. Tiny models of the
// three architectures (Gemma 3 with a sliding-window layer in its own pool), f16 cache; and two of
// the generated quantized models of tests/model/data/, whose Q6_K / Q5_K matmuls run a prompt of
// 8 or more tokens in llama.cpp's batch order (ops::matmul's token places: the 11-token prompt,
// interleaved with the others, is still a run of 11).
//
// Tolerance: none. Matmul rows do not depend on the other rows of a batch, and attention_kv over
// an f16 cache visits a sequence's cells in position order with attention_f16's arithmetic per
// query, so the logits are equal bit for bit.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "kv/cache.h"
#include "model/model.h"
#include "model/tiny_gemma3.h"
#include "model/tiny_llama.h"
#include "ops/thread_pool.h"
#include "test_support.h"

namespace fitllm {
namespace {

struct TinyModel {
    std::string name;
    std::vector<std::byte> bytes;
};

std::vector<std::byte> file_bytes(const std::string& name) {
    std::ifstream in(test::source_dir() / "tests/model/data" / name, std::ios::binary);
    const std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> bytes(chars.size());
    std::memcpy(bytes.data(), chars.data(), chars.size());
    return bytes;
}

std::vector<TinyModel> tiny_models() {
    std::vector<TinyModel> models = {{"gemma3", test::tiny_gemma3_bytes()},
                                     {"gemma3 with a global layer", test::tiny_gemma3_bytes({.n_layer = 6})},
                                     {"llama", test::tiny_llama_bytes({.rope_freqs = true})},
                                     {"qwen2", test::tiny_llama_bytes({.arch = "qwen2", .qkv_bias = true})}};
    for (const char* name : {"tiny-llama-q6_k.gguf", "tiny-qwen2-q5_k_m.gguf"}) {
        std::vector<std::byte> bytes = file_bytes(name);
        EXPECT_FALSE(bytes.empty()) << "tests/model/data/" << name << " is missing";
        if (!bytes.empty()) models.push_back({name, std::move(bytes)});
    }
    return models;
}

const std::vector<std::vector<int32_t>> kPrompts = {
    {1, 7, 3, 39, 0, 12, 5},
    {2, 9, 4},
    {30, 31, 6, 6, 18, 22, 8, 1, 11, 2, 17},
};
constexpr int kSteps = 6;  // decode steps after the prompts

// The token sequence s decodes at step i (fixed, so both runs feed the same tokens).
int32_t step_token(size_t s, int i) {
    return static_cast<int32_t>((7 * s + 5 * static_cast<size_t>(i) + 3) % 40);
}

// 64 cells: the tiny Gemmas' window layers share the full pool (a window pool would not be
// smaller); 256: they get a window pool of their own, trimmed after every batch.
kv::CacheParams params(int n_seq, int n_cells = 64) {
    kv::CacheParams p;
    p.n_cells = n_cells;
    p.n_seq_max = n_seq;
    p.block_size = 4;  // small blocks: sequences span several, and share the last one after seq_cp
    return p;
}

// Logits of sequence s alone: its prompt in one batch, then one token per step. Returns
// [1 + kSteps][n_vocab].
std::vector<float> alone(model::Model& model, size_t s, int n_cells, ops::ThreadPool& pool) {
    kv::ModelCache cache = model.make_cache(params(1, n_cells), 32);
    const size_t n_vocab = static_cast<size_t>(model.n_vocab());
    std::vector<float> out((1 + kSteps) * n_vocab);
    const std::vector<int32_t>& prompt = kPrompts[s];
    std::vector<int32_t> pos(prompt.size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
    model.forward(prompt, pos, cache, out.data(), false, pool);
    for (int i = 0; i < kSteps; ++i) {
        const int32_t token = step_token(s, i);
        const int32_t p = static_cast<int32_t>(prompt.size()) + i;
        model.forward(std::span(&token, 1), std::span(&p, 1), cache, out.data() + (1 + i) * n_vocab, false, pool);
    }
    return out;
}

TEST(BatchedDecode, SequencesTogetherGiveTheLogitsOfEachAlone) {
    ops::ThreadPool pool(2);
    for (const int n_cells : {64, 256}) {
        for (const TinyModel& tm : tiny_models()) {
            SCOPED_TRACE(tm.name + ", " + std::to_string(n_cells) + " cells");
            const gguf::GgufFile file = gguf::GgufFile::parse(tm.bytes, "tiny.gguf");
            const auto model = model::Model::load(file);
            const size_t n_seq = kPrompts.size();
            const size_t n_vocab = static_cast<size_t>(model->n_vocab());

            std::vector<std::vector<float>> want;
            for (size_t s = 0; s < n_seq; ++s) want.push_back(alone(*model, s, n_cells, pool));

            // Together: all prompts in one batch, their tokens interleaved, each sequence's last
            // token flagged for logits; then one token of every sequence per step.
            kv::ModelCache cache = model->make_cache(params(static_cast<int>(n_seq), n_cells), 32);
            if (n_cells == 256 && tm.name != "gemma3") {
                EXPECT_EQ(cache.n_pools(), tm.name == "gemma3 with a global layer" ? 2 : 1);
            }
            std::vector<int32_t> tokens, pos;
            std::vector<kv::SeqId> seq;
            std::vector<uint8_t> output;
            for (size_t i = 0; i < 11; ++i) {
                for (size_t s = 0; s < n_seq; ++s) {
                    if (i >= kPrompts[s].size()) continue;
                    tokens.push_back(kPrompts[s][i]);
                    pos.push_back(static_cast<int32_t>(i));
                    seq.push_back(static_cast<kv::SeqId>(s));
                    output.push_back(i + 1 == kPrompts[s].size() ? 1 : 0);
                }
            }
            std::vector<float> logits(n_seq * n_vocab);
            model->forward({.tokens = tokens, .positions = pos, .seq_ids = seq, .output = output}, cache, logits.data(),
                           pool);
            // Output rows come in batch order: the sequence whose prompt ends first comes first.
            std::vector<size_t> row_of(n_seq);
            for (size_t t = 0, r = 0; t < tokens.size(); ++t) {
                if (output[t]) row_of[static_cast<size_t>(seq[t])] = r++;
            }
            for (size_t s = 0; s < n_seq; ++s) {
                for (size_t i = 0; i < n_vocab; ++i) {
                    ASSERT_EQ(logits[row_of[s] * n_vocab + i], want[s][i])
                        << "prompt of sequence " << s << ", logit " << i;
                }
            }

            for (int step = 0; step < kSteps; ++step) {
                tokens.clear();
                pos.clear();
                seq.clear();
                for (size_t k = 0; k < n_seq; ++k) {
                    const size_t s = (k + static_cast<size_t>(step)) % n_seq;  // a different order each step
                    tokens.push_back(step_token(s, step));
                    pos.push_back(static_cast<int32_t>(kPrompts[s].size()) + step);
                    seq.push_back(static_cast<kv::SeqId>(s));
                }
                model->forward({.tokens = tokens, .positions = pos, .seq_ids = seq, .all_logits = true}, cache,
                               logits.data(), pool);
                for (size_t k = 0; k < n_seq; ++k) {
                    const size_t s = static_cast<size_t>(seq[k]);
                    for (size_t i = 0; i < n_vocab; ++i) {
                        ASSERT_EQ(logits[k * n_vocab + i], want[s][(1 + static_cast<size_t>(step)) * n_vocab + i])
                            << "step " << step << ", sequence " << s << ", logit " << i;
                    }
                }
            }
        }
    }
}

TEST(BatchedDecode, ASharedPrefixThenDivergingContinuationsCopyOnWrite) {
    ops::ThreadPool pool(2);
    const std::vector<int32_t> prefix = {1, 7, 3, 39, 0, 12, 5};  // 7 tokens: the second block of 4 is partly used
    const std::vector<std::vector<int32_t>> continuations = {{4, 4, 9}, {20, 1, 33}, {8, 8, 8}};
    for (const TinyModel& tm : tiny_models()) {
        SCOPED_TRACE(tm.name);
        const gguf::GgufFile file = gguf::GgufFile::parse(tm.bytes, "tiny.gguf");
        const auto model = model::Model::load(file);
        const size_t n_vocab = static_cast<size_t>(model->n_vocab());
        const size_t n_seq = continuations.size();

        // Alone: prefix + continuation in a cache of its own, token by token after the prefix.
        std::vector<std::vector<float>> want(n_seq);
        for (size_t s = 0; s < n_seq; ++s) {
            kv::ModelCache cache = model->make_cache(params(1), 32);
            std::vector<int32_t> pos(prefix.size());
            for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
            std::vector<float> logits(n_vocab);
            model->forward(prefix, pos, cache, logits.data(), false, pool);
            for (size_t i = 0; i < continuations[s].size(); ++i) {
                const int32_t p = static_cast<int32_t>(prefix.size() + i);
                model->forward(std::span(&continuations[s][i], 1), std::span(&p, 1), cache, logits.data(), false, pool);
                want[s].insert(want[s].end(), logits.begin(), logits.end());
            }
        }

        // Together: the prefix once in sequence 0, shared with 1 and 2 by seq_cp (no copy), then
        // each step one token per sequence: the first write to the shared, partly used block copies it.
        kv::ModelCache cache = model->make_cache(params(static_cast<int>(n_seq)), 32);
        std::vector<int32_t> pos(prefix.size());
        for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
        std::vector<float> logits(n_seq * n_vocab);
        model->forward(prefix, pos, cache, logits.data(), false, pool);
        const int used_before = cache.pool(0).used_cells();
        for (size_t s = 1; s < n_seq; ++s) cache.seq_cp(0, static_cast<kv::SeqId>(s), -1, -1);
        EXPECT_EQ(cache.pool(0).used_cells(), used_before);  // shared cells, not copies
        for (size_t i = 0; i < continuations[0].size(); ++i) {
            std::vector<int32_t> tokens, step_pos;
            std::vector<kv::SeqId> seq;
            for (size_t s = 0; s < n_seq; ++s) {
                tokens.push_back(continuations[s][i]);
                step_pos.push_back(static_cast<int32_t>(prefix.size() + i));
                seq.push_back(static_cast<kv::SeqId>(s));
            }
            model->forward({.tokens = tokens, .positions = step_pos, .seq_ids = seq, .all_logits = true}, cache,
                           logits.data(), pool);
            for (size_t s = 0; s < n_seq; ++s) {
                for (size_t v = 0; v < n_vocab; ++v) {
                    ASSERT_EQ(logits[s * n_vocab + v], want[s][i * n_vocab + v])
                        << "step " << i << ", sequence " << s << ", logit " << v;
                }
            }
        }
        // Two of the three sequences copied the partly used block (its 3 prefix cells each); the last
        // writer kept the original. Plus 3 new tokens per sequence.
        EXPECT_EQ(cache.seq_pos_max(1), static_cast<kv::Pos>(prefix.size() + continuations[1].size() - 1));
        EXPECT_EQ(cache.pool(0).used_cells(), used_before + 2 * 3 + 3 * 3);
    }
}

TEST(BatchedDecode, ABatchWithABadSequenceIdChangesNothing) {
    const std::vector<std::byte> bytes = test::tiny_llama_bytes({});
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const auto model = model::Model::load(file);
    ops::ThreadPool pool(1);
    kv::ModelCache cache = model->make_cache(params(2), 8);
    const std::vector<int32_t> tokens = {1, 2};
    const std::vector<int32_t> pos = {0, 0};
    const std::vector<kv::SeqId> seq = {0, 2};
    std::vector<float> logits(2 * static_cast<size_t>(model->n_vocab()));
    EXPECT_THROW(model->forward({.tokens = tokens, .positions = pos, .seq_ids = seq}, cache, logits.data(), pool),
                 kv::KvCacheError);
    EXPECT_EQ(cache.pool(0).used_cells(), 0);
    const std::vector<kv::SeqId> short_seq = {0};
    EXPECT_THROW(model->forward({.tokens = tokens, .positions = pos, .seq_ids = short_seq}, cache, logits.data(), pool),
                 std::invalid_argument);
}

}  // namespace
}  // namespace fitllm
