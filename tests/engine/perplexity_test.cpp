// Perplexity as llama-perplexity computes it: the chunking and scoring checked by hand on a tiny
// model, and the value on the demo model against llama.cpp's (tools/gen_perplexity_goldens.py).
#include "engine/perplexity.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "engine/kl_divergence.h"
#include "gguf/gguf_reader.h"
#include "model/model.h"
#include "model/tiny_gemma3.h"
#include "quant/ggml_type.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace fitllm {
namespace {

TEST(Perplexity, LogProbIsTheLogSoftmax) {
    const std::vector<float> logits = {1.0f, 2.0f, 3.0f};
    const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
    EXPECT_NEAR(engine::log_prob(logits, 2), 3.0 - std::log(z), 1e-6);
    EXPECT_NEAR(engine::log_prob(logits, 0), 1.0 - std::log(z), 1e-6);
}

// The scored positions, the BOS substitution and the mean, recomputed one chunk at a time with
// every logit requested.
TEST(Perplexity, MatchesAHandComputationOnATinyModel) {
    const std::vector<std::byte> bytes = test::tiny_gemma3_bytes();
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const auto model = model::Model::load(file);
    ops::ThreadPool pool(2);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 70; ++i) tokens.push_back((i * 7 + 3) % 40);
    engine::PerplexityParams p;
    p.n_ctx = 16;
    p.n_batch = 5;
    p.score_batch = 3;
    p.bos = 2;
    std::vector<double> running;
    const engine::PerplexityResult r =
        engine::perplexity(*model, tokens, p, {}, pool, nullptr, [&](int, double ppl) { running.push_back(ppl); });

    const int n_vocab = model->n_vocab();
    double nll = 0.0;
    int64_t count = 0;
    for (int c = 0; c < 4; ++c) {  // 70 / 16 = 4 whole chunks
        std::vector<int32_t> chunk(tokens.begin() + c * 16, tokens.begin() + (c + 1) * 16);
        chunk[0] = 2;
        std::vector<int32_t> pos(16);
        for (int i = 0; i < 16; ++i) pos[static_cast<size_t>(i)] = i;
        kv::ModelCache cache = model->make_cache({.n_cells = 16}, 64);
        std::vector<float> logits(static_cast<size_t>(16 * n_vocab));
        model->forward(chunk, pos, cache, logits.data(), /*all_logits=*/true, pool);
        for (int i = 8; i < 15; ++i) {
            nll -= engine::log_prob(
                std::span<const float>(logits.data() + static_cast<size_t>(i) * n_vocab, static_cast<size_t>(n_vocab)),
                tokens[static_cast<size_t>(c * 16 + i + 1)]);
            ++count;
        }
        ASSERT_EQ(running.size(), 4u);
        EXPECT_NEAR(running[static_cast<size_t>(c)], std::exp(nll / static_cast<double>(count)),
                    1e-3 * running[static_cast<size_t>(c)]);
    }
    EXPECT_EQ(r.n_chunks, 4);
    EXPECT_EQ(r.n_scored, count);
    EXPECT_NEAR(r.ppl, std::exp(nll / static_cast<double>(count)), 1e-3 * r.ppl);
    EXPECT_GT(r.ppl_error, 0.0);

    p.n_chunks = 2;
    EXPECT_EQ(engine::perplexity(*model, tokens, p, {}, pool, nullptr).n_chunks, 2);
}

TEST(Perplexity, RefusesATextShorterThanTwoChunks) {
    const std::vector<std::byte> bytes = test::tiny_gemma3_bytes();
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const auto model = model::Model::load(file);
    ops::ThreadPool pool(1);
    const std::vector<int32_t> tokens(31, 5);
    engine::PerplexityParams p;
    p.n_ctx = 16;
    try {
        engine::perplexity(*model, tokens, p, {}, pool, nullptr);
        FAIL() << "expected std::invalid_argument";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("31 tokens"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("at least 32"), std::string::npos) << e.what();
    }
}

// Chunks evaluated together, one sequence each (-np), give the same result as one at a time:
// the logits of a sequence do not depend on the others in the batch, and each chunk's sum is
// added in chunk order.
TEST(Perplexity, ParallelChunksGiveTheSameResult) {
    const std::vector<std::byte> bytes = test::tiny_gemma3_bytes();
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const auto model = model::Model::load(file);
    ops::ThreadPool pool(2);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 90; ++i) tokens.push_back((i * 7 + 3) % 40);
    engine::PerplexityParams p;
    p.n_ctx = 16;
    p.n_batch = 6;
    p.score_batch = 6;
    p.bos = 2;
    std::vector<double> one_running, par_running;
    const engine::PerplexityResult one =
        engine::perplexity(*model, tokens, p, {}, pool, nullptr, [&](int, double ppl) { one_running.push_back(ppl); });
    p.n_seq = 3;  // 5 chunks: a group of 3, then one of 2
    const engine::PerplexityResult par =
        engine::perplexity(*model, tokens, p, {}, pool, nullptr, [&](int, double ppl) { par_running.push_back(ppl); });
    EXPECT_EQ(par.n_chunks, 5);
    EXPECT_EQ(par.n_scored, one.n_scored);
    EXPECT_EQ(par.ppl, one.ppl);
    EXPECT_EQ(par_running, one_running);
}

// The quantized KV cache on the demo model (issue 5): q8_0 and q4_0 K/V against f16 over 2 chunks
// of 512. Measured (8 chunks, the README's table): f16 14.917, q8_0 14.937 (+0.14%), q4_0 15.297
// (+2.55%; 17.317 without the rotation and key shaping). f32 14.961 is itself 0.30% from f16 on
// this small model, so the q8_0 bound is 1%, not the 0.2%; over 2 chunks it moves with
// last-bit changes too: -0.17% before the prompts' Q6_K matmuls took llama.cpp's tiled order,
// -1.35% after (8 chunks: f16 14.980, q8_0 14.918, -0.42%), hence 1.5%. Over these 2 chunks: f16 13.848,
// q4_0 14.125 (+2.0%), without rotation 15.620 (+12.8%). The q4_0 distance moves with last-bit
// changes anywhere in the pass (every K / V value's 4-bit rounding follows them): +1.7% with the
// matmuls of 137592b, +2.8% with the same and FITLLM_NO_GEMM=1, +4.4% with the dots in llama.cpp's
// float order (8 chunks: f16 14.999, q4_0 15.541, +3.6%); hence 5%.
// The quantized cache against the f16 one on 2 chunks of the demo model, judged as the README's
// table is: by the mean KL divergence of the next-token distributions from f16's (stable where
// PPL moves by up to a percent on 2 chunks with any change to the arithmetic) and by the PPL.
// Measured (AVX2, 2026-12-02): f16 13.8301; q8_0 KL 0.0060, PPL +0.11% (the KL of an f32 cache,
// about 0.0055, is the floor; with q8_0 keys shaped like q4_0's, +0.97% at KL 0.0059); q4_0
// 0.0137, +0.43%; q4_0 not rotated 0.126, +10.5%.
TEST(Perplexity, DemoModelQuantizedCacheStaysCloseToF16) {
    const auto path = test::demo_model();
    if (!path) GTEST_SKIP() << "demo model not found (scripts/setup.sh assembles it)";
    std::ifstream text_in(test::source_dir() / "tests/data/gpl-3.0.txt", std::ios::binary);
    ASSERT_TRUE(text_in);
    const std::string text((std::istreambuf_iterator<char>(text_in)), std::istreambuf_iterator<char>());
    const gguf::GgufFile file = gguf::GgufFile::open(path->string());
    const tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_gguf(file);
    const std::vector<int32_t> tokens = tok.tokenize(text, /*add_special=*/true, /*parse_special=*/false);
    const auto model = model::Model::load(file);
    ops::ThreadPool pool(2);
    engine::PerplexityParams p;
    p.n_ctx = 512;
    p.n_chunks = 2;
    p.bos = tok.vocab().special().bos;
    std::vector<engine::TopKDistribution> base(
        static_cast<size_t>(p.n_chunks * engine::perplexity_scored_per_chunk(p.n_ctx)));
    const double f16 = engine::perplexity(*model, tokens, p, {}, pool, nullptr, {},
                                          [&](int64_t i, std::span<const float> logits, double) {
                                              base[static_cast<size_t>(i)] =
                                                  engine::summarize_distribution(logits, engine::kKlTopK);
                                          })
                           .ppl;
    struct Run {
        double ppl, kl;
    };
    auto run = [&](KvType type, bool rotate) {
        const ContextConfig kv{.type_k = type, .type_v = type, .kv_rotation = rotate};
        double kl = 0.0;
        const double ppl = engine::perplexity(*model, tokens, p, kv, pool, nullptr, {},
                                              [&](int64_t i, std::span<const float> logits, double) {
                                                  kl += engine::kl_divergence(base[static_cast<size_t>(i)], logits).kl;
                                              })
                               .ppl;
        return Run{ppl, kl / static_cast<double>(base.size())};
    };
    const Run q8_0 = run(KvType::q8_0, true);
    const Run q4_0 = run(KvType::q4_0, true);
    const Run q4_0_plain = run(KvType::q4_0, false);
    EXPECT_NEAR(q8_0.ppl, f16, 0.015 * f16) << "q8_0 " << q8_0.ppl << " vs f16 " << f16;
    EXPECT_LT(q8_0.kl, 0.008) << "q8_0";
    EXPECT_NEAR(q4_0.ppl, f16, 0.025 * f16) << "q4_0 " << q4_0.ppl << " vs f16 " << f16;
    EXPECT_LT(q4_0.kl, 0.02) << "q4_0";
    EXPECT_LT(q4_0.kl, q4_0_plain.kl / 4) << "q4_0 rotated " << q4_0.kl << ", not rotated " << q4_0_plain.kl;
    EXPECT_LT(q4_0.ppl, q4_0_plain.ppl - 0.05 * f16)
        << "q4_0 rotated " << q4_0.ppl << ", not rotated " << q4_0_plain.ppl;
    std::printf("f16 %.4f; q8_0 %.4f KL %.5f; q4_0 %.4f KL %.5f; q4_0 not rotated %.4f KL %.5f\n", f16, q8_0.ppl,
                q8_0.kl, q4_0.ppl, q4_0.kl, q4_0_plain.ppl, q4_0_plain.kl);
}

// llama.cpp's value over the same 4 chunks of 512 tokens of the GPL-3.0 text. Measured: 15.2184
// against 15.1743 (+0.29%); the forward passes differ in float summation order (see
// gemma3_golden_test.cpp), so the bound is 1%.
TEST(Perplexity, DemoModelAgreesWithLlamaCpp) {
    const auto path = test::demo_model();
    if (!path) GTEST_SKIP() << "demo model not found (scripts/setup.sh assembles it)";
    const std::filesystem::path root = test::source_dir();
    std::ifstream golden_in(root / "tests/model/goldens/gemma3-270m-perplexity.json");
    ASSERT_TRUE(golden_in);
    const nlohmann::json golden = nlohmann::json::parse(golden_in);
    std::ifstream text_in(root / "tests/data/gpl-3.0.txt", std::ios::binary);
    ASSERT_TRUE(text_in);
    const std::string text((std::istreambuf_iterator<char>(text_in)), std::istreambuf_iterator<char>());

    const gguf::GgufFile file = gguf::GgufFile::open(path->string());
    const tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_gguf(file);
    const std::vector<int32_t> tokens = tok.tokenize(text, /*add_special=*/true, /*parse_special=*/false);
    ASSERT_EQ(static_cast<int64_t>(tokens.size()), golden["n_tokens"].get<int64_t>());
    const auto model = model::Model::load(file);
    ops::ThreadPool pool(2);
    engine::PerplexityParams p;
    p.n_ctx = golden["n_ctx"].get<int>();
    p.n_chunks = golden["n_chunks"].get<int>();
    p.bos = tok.vocab().special().bos;
    const engine::PerplexityResult r = engine::perplexity(*model, tokens, p, {}, pool, nullptr);
    EXPECT_EQ(r.n_scored, golden["n_scored"].get<int64_t>());
    const double want = golden["ppl"].get<double>();
    EXPECT_NEAR(r.ppl, want, 0.01 * want) << "fitllm " << r.ppl << " vs llama.cpp " << want;
}

}  // namespace
}  // namespace fitllm
