// Qwen3-MoE (model/moe.h, the qwen3moe variant of model/llama.cpp): its hyper-parameters and the
// refusals of bad files, the router's choice, the forward pass against the double-precision
// reference (tiny_llama.h), the grouping of a batch's tokens by expert against one token at a
// time, streamed layers against resident ones, the scratch it charges against the plan, and the
// plan's expert counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/plan.h"
#include "engine/plan_report.h"
#include "gguf/gguf_reader.h"
#include "memory/device.h"
#include "memory/pool.h"
#include "model/activations.h"
#include "model/hparams.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/tiny_llama.h"
#include "model/tiny_llama_checks.h"
#include "model/weights.h"
#include "ops/activation.h"
#include "ops/scratch.h"
#include "ops/thread_pool.h"
#include "test_support.h"

namespace fitllm {
namespace {

test::TinyLlamaOptions qwen3moe(test::TinyLlamaOptions o = {}) {
    o.arch = "qwen3moe";
    o.qk_norm = true;
    o.tied = true;
    o.head_dim = 16;
    o.expert_count = 6;
    o.expert_used = 2;
    return o;
}

TEST(Qwen3MoeHparams, ReadsTheExpertCounts) {
    const std::vector<std::byte> bytes = test::tiny_llama_bytes(qwen3moe());
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const model::Hparams hp = model::read_hparams(file);
    EXPECT_EQ(hp.arch, "qwen3moe");
    EXPECT_TRUE(hp.is_moe());
    EXPECT_EQ(hp.n_expert, 6);
    EXPECT_EQ(hp.n_expert_used, 2);
    EXPECT_EQ(hp.n_ff_exp, test::kTinyFfExp);
    EXPECT_EQ(hp.head_dim, 16);
}

TEST(Qwen3MoeHparams, MoreExpertsUsedThanThereAreIsRefused) {
    test::TinyLlamaOptions o = qwen3moe();
    o.expert_count = 2;
    o.expert_used = 3;
    const std::string error = test::tiny_load_error(o);
    EXPECT_NE(error.find("'qwen3moe.expert_used_count' = 3"), std::string::npos) << error;
}

TEST(Qwen3MoeHparams, MissingExpertCountIsNamed) {
    test::TinyLlamaOptions o = qwen3moe();
    o.expert_count = 0;  // not written
    o.expert_used = 2;
    const std::vector<std::byte> bytes = test::tiny_llama_bytes(o);
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    try {
        model::read_hparams(file);
        FAIL() << "loaded without expert_count";
    } catch (const model::ModelError& e) {
        EXPECT_NE(std::string(e.what()).find("missing metadata key 'qwen3moe.expert_count'"), std::string::npos)
            << e.what();
    }
}

TEST(Qwen3MoeWeights, MissingExpertTensorIsNamed) {
    test::TinyLlamaOptions o = qwen3moe();
    o.skip = "blk.1.ffn_down_exps.weight";
    const std::string error = test::tiny_load_error(o);
    EXPECT_NE(error.find("missing tensor 'blk.1.ffn_down_exps.weight'"), std::string::npos) << error;
}

// Experts of another size than the metadata's: the first such tensor's shape is refused by name.
TEST(Qwen3MoeWeights, MisshapenExpertTensorIsNamed) {
    test::TinyLlamaOptions o = qwen3moe();
    o.expert_ff = 8;
    const std::string error = test::tiny_load_error(o);
    EXPECT_NE(error.find("tensor 'blk.0.ffn_gate_exps.weight' has shape [32, 8, 6]; expected [32, 16, 6]"),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("one matrix per expert"), std::string::npos) << error;
}

TEST(Qwen3MoeWeights, SharedExpertIsRefusedByName) {
    test::TinyLlamaOptions o = qwen3moe();
    o.extra = "blk.0.ffn_up_shexp.weight";
    const std::string error = test::tiny_load_error(o);
    EXPECT_NE(error.find("blk.0.ffn_up_shexp.weight"), std::string::npos) << error;
    EXPECT_NE(error.find("shared expert"), std::string::npos) << error;
}

TEST(MoeRouting, PicksTheBestFirstAndNormalizes) {
    const float probs[] = {0.1f, 0.4f, 0.05f, 0.3f, 0.15f};
    int32_t chosen[3];
    float weights[3];
    model::route_token(probs, 5, 3, 0.0f, chosen, weights);
    EXPECT_EQ(chosen[0], 1);
    EXPECT_EQ(chosen[1], 3);
    EXPECT_EQ(chosen[2], 4);
    EXPECT_FLOAT_EQ(weights[0], 0.4f / 0.85f);
    EXPECT_FLOAT_EQ(weights[1], 0.3f / 0.85f);
    EXPECT_FLOAT_EQ(weights[2], 0.15f / 0.85f);
    // Equal probabilities: the lower index first; a scale multiplies the normalized weights.
    const float equal[] = {0.25f, 0.25f, 0.25f, 0.25f};
    model::route_token(equal, 4, 2, 2.0f, chosen, weights);
    EXPECT_EQ(chosen[0], 0);
    EXPECT_EQ(chosen[1], 1);
    EXPECT_FLOAT_EQ(weights[0], 1.0f);
    EXPECT_FLOAT_EQ(weights[1], 1.0f);
    // Vanishing probabilities: the sum is clamped (no division by zero).
    const float tiny[] = {0.0f, 0.0f, 1.0f};
    model::route_token(tiny, 3, 2, 0.0f, chosen, weights);
    EXPECT_EQ(chosen[0], 2);
    EXPECT_FLOAT_EQ(weights[0], 1.0f);
    EXPECT_FLOAT_EQ(weights[1], 0.0f);
}

// The router's softmax: llama.cpp's arithmetic, which for fewer than 16 experts is std::exp and a
// double sum (ops::softmax's, bit for bit), and for groups of 16 its vectorized exp: within float
// rounding of the exact softmax either way (within 1e-6 of it: a few ulp).
TEST(MoeRouting, SoftmaxAsLlamaCpp) {
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (const int n : {8, 32, 128, 40}) {
        std::vector<float> scores(static_cast<size_t>(n));
        for (float& v : scores) v = normal(rng);
        std::vector<float> ours = scores, plain = scores;
        model::router_softmax(ours.data(), n);
        ops::softmax(plain.data(), n);
        double max_score = *std::max_element(scores.begin(), scores.end()), sum = 0.0;
        for (const float v : scores) sum += std::exp(double(v) - max_score);
        for (int i = 0; i < n; ++i) {
            const double exact = std::exp(double(scores[size_t(i)]) - max_score) / sum;
            EXPECT_NEAR(ours[size_t(i)], exact, 1e-6 * exact) << n << " experts, " << i;
        }
        if (n < 16) {
            EXPECT_EQ(0, std::memcmp(ours.data(), plain.data(), ours.size() * sizeof(float)));
        }
    }
}

TEST(Qwen3MoeForward, MatchesTheReference) {
    test::expect_matches_reference(qwen3moe());
}

TEST(Qwen3MoeForward, MatchesTheReferenceWithOneExpertPerToken) {
    test::TinyLlamaOptions o = qwen3moe();
    o.expert_used = 1;
    test::expect_matches_reference(o);
}

// The experts matter: the reference with the router's choice ignored (all of them used) differs.
TEST(Qwen3MoeForward, TheRoutingChangesTheLogits) {
    const test::TinyLlamaOptions with = qwen3moe();
    test::TinyLlamaOptions all = with;
    all.expert_used = with.expert_count;
    const std::vector<std::byte> bytes = test::tiny_llama_bytes(with);
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    const std::vector<int32_t> tokens = {1, 7, 3, 39};
    const std::vector<float> a = test::reference_logits(file, with, tokens);
    const std::vector<float> b = test::reference_logits(file, all, tokens);
    float max_diff = 0.0f;
    for (size_t i = 0; i < a.size(); ++i) max_diff = std::max(max_diff, std::fabs(a[i] - b[i]));
    EXPECT_GT(max_diff, 0.05f);
}

std::string generated(const std::string& name) {
    return (test::source_dir() / "tests/model/data" / name).string();
}

std::vector<int32_t> prompt_of(int n) {
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = (i * 37 + 11) % 300;
    return tokens;
}

// All n logits rows of a prompt in one batch.
std::vector<float> batch_logits(model::Model& m, const std::vector<int32_t>& tokens, ops::ThreadPool& pool) {
    std::vector<int32_t> pos(tokens.size());
    std::iota(pos.begin(), pos.end(), 0);
    kv::ModelCache cache = m.make_cache({.n_cells = 256}, static_cast<int>(tokens.size()));
    std::vector<float> logits(tokens.size() * static_cast<size_t>(m.n_vocab()));
    m.forward(tokens, pos, cache, logits.data(), /*all_logits=*/true, pool);
    return logits;
}

// Grouping a slice's tokens by expert (each expert's tokens in one matmul: the small-batch or tiled
// kernels for the experts several tokens chose) gives every token the bits it gets alone
// (matrix-vector), and the router picks different experts for different tokens.
TEST(MoeFfn, GroupedSliceEqualsOneTokenAtATime) {
    for (const char* name : {"tiny-qwen3moe-q8_0.gguf", "tiny-qwen3moe-q4_k_m.gguf", "tiny-qwen3moe-f16.gguf"}) {
        const gguf::GgufFile file = gguf::GgufFile::open(generated(name));
        const model::Hparams hp = model::read_hparams(file);
        const model::TensorBinder b(file);
        model::MoeWeights w;
        w.router = b.matrix("blk.1.ffn_gate_inp.weight", hp.n_expert, hp.n_embd);
        w.gate_exps = b.experts("blk.1.ffn_gate_exps.weight", hp.n_expert, hp.n_ff_exp, hp.n_embd);
        w.up_exps = b.experts("blk.1.ffn_up_exps.weight", hp.n_expert, hp.n_ff_exp, hp.n_embd);
        w.down_exps = b.experts("blk.1.ffn_down_exps.weight", hp.n_expert, hp.n_embd, hp.n_ff_exp);
        const int m = 100;
        const model::MoeLayout l = model::moe_layout(hp, m);
        std::vector<float> work(l.floats), h(static_cast<size_t>(m * hp.n_embd));
        std::mt19937 rng(5);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (float& v : h) v = normal(rng);
        const std::vector<float> input = h;
        ops::ThreadPool pool(2);
        ops::Scratch scratch;
        model::moe_ffn(hp, w, h.data(), m, work.data(), l, {}, pool, scratch);
        std::vector<int> used(static_cast<size_t>(hp.n_expert), 0);
        for (int t = 0; t < m; ++t) {
            for (int r = 0; r < hp.n_expert_used; ++r)
                ++used[static_cast<size_t>(work[l.ids + t * hp.n_expert_used + r])];
        }
        for (int e = 0; e < hp.n_expert; ++e) EXPECT_GT(used[static_cast<size_t>(e)], 1) << name << ": expert " << e;
        for (int t = 0; t < m; ++t) {
            std::vector<float> alone(input.begin() + t * hp.n_embd, input.begin() + (t + 1) * hp.n_embd);
            model::moe_ffn(hp, w, alone.data(), 1, work.data(), l, {}, pool, scratch);
            ASSERT_EQ(0, std::memcmp(alone.data(), h.data() + t * hp.n_embd, alone.size() * sizeof(float)))
                << name << ": token " << t;
        }
    }
}

// The last layer streamed (read into a buffer each pass, its expert views moved there): the same
// logits, bit for bit.
TEST(Qwen3MoeForward, StreamedLayerGivesTheResidentLogits) {
    const gguf::GgufFile file = gguf::GgufFile::open(generated("tiny-qwen3moe-q4_k_m.gguf"));
    ops::ThreadPool pool(2);
    const std::vector<int32_t> tokens = prompt_of(40);
    const auto resident = model::Model::load(file);
    const auto streamed = model::Model::load(file, {.n_streamed_layers = 1, .stream_direct_io = false});
    ASSERT_EQ(streamed->n_streamed_layers(), 1);
    const std::vector<float> a = batch_logits(*resident, tokens, pool);
    const std::vector<float> b = batch_logits(*streamed, tokens, pool);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

// Offloaded with its experts (model/moe.h moe_experts_on_device): the resident run's logits (the
// splits and the KV's sides: offload_moe_test.cpp).
TEST(Qwen3MoeForward, OffloadRunsTheExpertsOnTheDevice) {
    const gguf::GgufFile file = gguf::GgufFile::open(generated("tiny-qwen3moe-q8_0.gguf"));
    ops::ThreadPool pool(2);
    const std::vector<int32_t> tokens = prompt_of(40);
    const auto dev = backend::open_device("virtual", UINT64_MAX);
    const auto resident = model::Model::load(file);
    const auto offloaded = model::Model::load(file, {.offload = dev.get(), .n_offload_layers = 1});
    const std::vector<float> a = batch_logits(*resident, tokens, pool);
    const std::vector<float> b = batch_logits(*offloaded, tokens, pool);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

uint64_t scratch_peak(const memory::Device& device) {
    for (const memory::PoolStats& s : device.pools()) {
        if (s.name == memory::pool_names::kScratch) return s.peak;
    }
    return 0;
}

// The scratch a batch charges (its activations with the MoE buffers, op scratch) stays within the
// plan's, for a batch of one FFN slice and one of two.
TEST(Qwen3MoePlan, ScratchWithinThePlan) {
    const gguf::GgufFile file = gguf::GgufFile::open(generated("tiny-qwen3moe-q8_0.gguf"));
    const engine::ModelShape shape = engine::model_shape(file);
    for (const int n : {1, 32, 200}) {
        const engine::Plan p = engine::make_plan(shape, {.n_ctx = 256, .n_batch = n, .n_outputs = 1, .n_threads = 2});
        memory::Device host("host", UINT64_MAX);
        const auto m = model::Model::load(file, {.device = &host});
        ops::ThreadPool pool(2);
        const std::vector<int32_t> tokens = prompt_of(n);
        std::vector<int32_t> pos(tokens.size());
        std::iota(pos.begin(), pos.end(), 0);
        kv::ModelCache cache = m->make_cache({.n_cells = 256}, n);
        std::vector<float> logits(static_cast<size_t>(m->n_vocab()));
        m->forward(tokens, pos, cache, logits.data(), false, pool);
        const uint64_t scratch = scratch_peak(host);
        EXPECT_LE(scratch, p.scratch) << n << " tokens";
        EXPECT_GE(scratch, p.activations - uint64_t(n) * sizeof(int32_t)) << n << " tokens";
        // The MoE buffers are in the plan's activations.
        EXPECT_GE(p.activations, model::activation_layout(shape.hp, n).moe.floats * sizeof(float));
    }
}

TEST(Qwen3MoePlan, ShowsTheExpertCounts) {
    const gguf::GgufFile file = gguf::GgufFile::open(generated("tiny-qwen3moe-q8_0.gguf"));
    const engine::Plan p = engine::make_plan(engine::model_shape(file), {.n_ctx = 256});
    const std::string text = engine::plan_text(p, "test");
    EXPECT_NE(text.find("(qwen3moe, 2 layers, 8 experts (2 used, all resident)"), std::string::npos) << text;
    const auto json = engine::plan_json(p, "test");
    EXPECT_EQ(json.at("n_expert"), 8);
    EXPECT_EQ(json.at("n_expert_used"), 2);
    const gguf::GgufFile dense = gguf::GgufFile::open(generated("tiny-qwen3-q8_0.gguf"));
    const engine::Plan d = engine::make_plan(engine::model_shape(dense), {.n_ctx = 256});
    EXPECT_EQ(engine::plan_text(d, "test").find("experts"), std::string::npos);
    EXPECT_EQ(engine::plan_json(d, "test").at("n_expert"), 0);
}

}  // namespace
}  // namespace fitllm
