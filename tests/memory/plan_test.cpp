// memory/plan.h: the numbers of a plan against hand-computed ones and against the KV cache the
// runtime really makes, and --fit's choices.
#include "memory/plan.h"

#include <gtest/gtest.h>

#include "kv/cache.h"
#include "model/layer_stream.h"
#include "test_support.h"

namespace fitllm::memory {
namespace {

using quant::GgmlType;

std::string tiny(const std::string& name) {
    return (test::source_dir() / "tests/model/data" / name).string();
}

// The KV bytes of the cache the runtime makes for these settings (model::Model::make_cache).
uint64_t real_kv_bytes(const model::Hparams& hp, const PlanParams& p) {
    std::vector<kv::LayerShape> layers(static_cast<size_t>(hp.n_layer), {hp.n_head_kv, hp.head_dim, hp.head_dim_v});
    std::vector<int> windows(static_cast<size_t>(hp.n_layer), 0);
    for (size_t i = 0; i < hp.is_swa.size(); ++i) windows[i] = hp.is_swa[i] ? hp.sliding_window : 0;
    kv::CacheParams cp;
    cp.n_cells = p.n_ctx;
    cp.n_seq_max = p.n_seq;
    cp.type_k = p.type_k;
    cp.type_v = p.type_v;
    return kv::ModelCache(layers, windows, cp, p.n_batch).bytes();
}

TEST(Plan, TinyLlamaByHand) {
    const auto file = gguf::GgufFile::open(tiny("tiny-llama-q8_0.gguf"));
    const ModelShape shape = model_shape(file);
    // 2 layers, n_embd 256, 4 heads of 64, 2 KV heads, n_ff 256, 450 tokens; Q8_0 matrices.
    EXPECT_EQ(shape.global_bytes, 122400u + 1024u + 122400u);  // output, output_norm, token_embd
    ASSERT_EQ(shape.layer_bytes.size(), 2u);
    EXPECT_EQ(shape.layer_bytes[0], 2 * 34816u + 5 * 69632u + 2 * 1024u);
    EXPECT_EQ(shape.metadata_bytes, 11584u);

    const Plan p = make_plan(shape, {.n_ctx = 256, .n_batch = 64, .n_threads = 2, .budget = 1ull << 30});
    EXPECT_EQ(p.weights_resident, 1085504u);  // every tensor
    EXPECT_EQ(p.weights_streamed, 0u);
    EXPECT_EQ(p.stream_buffer, 0u);
    // f16 K/V: 2 heads x 64 x 2 bytes = 256 bytes per row each, 256 cells, 2 layers; per cell
    // position + shift + sequence set (16 bytes); 16 blocks x 12 bytes; one table of 16 blocks.
    EXPECT_EQ(p.kv, 2u * 256 * 2 * 256 + 256 * 16 + 16 * 12 + 16 * 4);
    ASSERT_EQ(p.kv_pools.size(), 1u);
    EXPECT_EQ(p.kv_pools[0].n_cells, 256);
    // Activations per token: x, cur 256; q 256; k, v 128; attn 256; gate, up 256 floats; plus
    // a sequence id and a position.
    EXPECT_EQ(p.activations, 64u * (1792 * 4 + 8));
    EXPECT_EQ(p.matmul_scratch, 64u * 272);  // a Q8_0 activation row of 256 values: 8 blocks of 34 bytes
    EXPECT_EQ(p.scratch, p.activations + std::max(p.matmul_scratch, p.attention_scratch) + 64);
    EXPECT_EQ(p.logits, 450u * 4);
    EXPECT_EQ(p.overhead, kFixedOverhead + kMetadataFactor * 11584u);
    EXPECT_EQ(p.total(), p.weights_resident + p.kv + p.scratch + p.logits + p.overhead);
    EXPECT_TRUE(p.fits());
    EXPECT_EQ(p.kv, real_kv_bytes(shape.hp, p.params));

    // q8_0 K/V: 2 blocks of 34 bytes per head.
    const Plan q = make_plan(
        shape, {.n_ctx = 256, .n_batch = 64, .type_k = GgmlType::Q8_0, .type_v = GgmlType::Q8_0, .budget = 1ull << 30});
    EXPECT_EQ(q.kv, 2u * 256 * 2 * 136 + 256 * 16 + 16 * 12 + 16 * 4);
    EXPECT_EQ(q.kv, real_kv_bytes(shape.hp, q.params));
}

TEST(Plan, KvMatchesTheRuntimeCacheAcrossSettings) {
    for (const char* name : {"tiny-llama-f16.gguf", "tiny-qwen2-q4_k_m.gguf"}) {
        const auto file = gguf::GgufFile::open(tiny(name));
        const ModelShape shape = model_shape(file);
        for (const int n_ctx : {1, 100, 4096}) {
            for (const int n_seq : {1, 3}) {
                for (const GgmlType t : {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::F32}) {
                    const Plan p = make_plan(
                        shape, {.n_ctx = n_ctx, .n_seq = n_seq, .n_batch = 32, .type_k = t, .type_v = GgmlType::F16});
                    EXPECT_EQ(p.kv, real_kv_bytes(shape.hp, p.params)) << name << " -c " << n_ctx << " -np " << n_seq;
                }
            }
        }
    }
}

TEST(Plan, StreamingTheLastLayers) {
    const auto file = gguf::GgufFile::open(tiny("tiny-llama-q8_0.gguf"));
    const ModelShape shape = model_shape(file);
    const Plan p = make_plan(shape, {.n_ctx = 256, .n_batch = 64, .n_streamed_layers = 1});
    EXPECT_EQ(p.weights_resident, shape.global_bytes + shape.layer_bytes[0]);
    EXPECT_EQ(p.weights_streamed, shape.layer_bytes[1]);
    EXPECT_EQ(p.stream_buffer, model::stream_staging_bytes(file, 1, 2));  // what LayerStream charges
}

TEST(Plan, RefusesWhatTheRuntimeRefuses) {
    const auto file = gguf::GgufFile::open(tiny("tiny-llama-q8_0.gguf"));
    const ModelShape shape = model_shape(file);
    EXPECT_THROW(make_plan(shape, {.n_batch = 0}), std::invalid_argument);
    EXPECT_THROW(make_plan(shape, {.n_seq = 65}), std::invalid_argument);
    EXPECT_THROW(make_plan(shape, {.type_k = GgmlType::Q4_K}), std::invalid_argument);
    EXPECT_EQ(make_plan(shape, {.n_ctx = 0}).params.n_ctx, 2048);  // the training context
}

TEST(Plan, DemoModelGemma3WindowPools) {
    const auto path = test::demo_model();
    if (!path) GTEST_SKIP() << "demo model absent (scripts/setup.sh fetches it)";
    const auto file = gguf::GgufFile::open(path->string());
    const ModelShape shape = model_shape(file);
    ASSERT_EQ(shape.hp.n_layer, 18);
    const Plan p = make_plan(shape, {.n_ctx = 4096, .n_batch = 512, .n_threads = 2, .budget = 1ull << 30});
    EXPECT_EQ(p.weights_resident, 246587904u);  // every tensor of the file
    // Full attention: layers 5, 11, 17 (every sixth), 4096 cells; one K/V head of 256 f16 = 512
    // bytes each. Sliding window 512: 15 layers, 1 x (32 + 2) + 32 blocks = 1056 cells.
    ASSERT_EQ(p.kv_pools.size(), 2u);
    EXPECT_EQ(p.kv_pools[0].n_layer, 3);
    EXPECT_EQ(p.kv_pools[0].n_cells, 4096);
    EXPECT_EQ(p.kv_pools[0].bytes, 3u * 4096 * 1024 + 4096 * 16 + 256 * 12 + 256 * 4);
    EXPECT_EQ(p.kv_pools[1].window, 512);
    EXPECT_EQ(p.kv_pools[1].n_layer, 15);
    EXPECT_EQ(p.kv_pools[1].n_cells, 1056);
    EXPECT_EQ(p.kv_pools[1].bytes, 15u * 1056 * 1024 + 1056 * 16 + 66 * 12 + 66 * 4);
    EXPECT_EQ(p.kv, real_kv_bytes(shape.hp, p.params));
    EXPECT_EQ(p.logits, 262144u * 4);
    // x, cur 640; q, attn 4 x 256; k, v 256; gate, up 2048 floats per token.
    EXPECT_EQ(p.activations, 512u * (7936 * 4 + 8));
    EXPECT_TRUE(p.fits());

    // A short context: the window pool would be no smaller than the full one, so one pool.
    const Plan s = make_plan(shape, {.n_ctx = 512, .n_batch = 512});
    ASSERT_EQ(s.kv_pools.size(), 1u);
    EXPECT_EQ(s.kv_pools[0].n_layer, 18);
    EXPECT_EQ(s.kv, real_kv_bytes(shape.hp, s.params));
}

// --fit, on the tiny model with a long context so the KV cache matters.
class Fit : public ::testing::Test {
protected:
    void SetUp() override {
        file_ = std::make_unique<gguf::GgufFile>(gguf::GgufFile::open(tiny("tiny-llama-q8_0.gguf")));
        shape_ = model_shape(*file_);
    }
    PlanParams base(uint64_t budget) const { return {.n_ctx = 65536, .n_batch = 64, .n_threads = 2, .budget = budget}; }
    Plan plan_with(GgmlType kv, int n_ctx, int streamed) const {
        PlanParams p = base(0);
        p.type_k = p.type_v = kv;
        p.n_ctx = n_ctx;
        p.n_streamed_layers = streamed;
        return make_plan(shape_, p);
    }
    std::unique_ptr<gguf::GgufFile> file_;
    ModelShape shape_;
};

TEST_F(Fit, FitsAsAskedChangesNothing) {
    const Plan p = fit_plan(shape_, base(1ull << 30));
    EXPECT_TRUE(p.fits());
    EXPECT_TRUE(p.fit_steps.empty());
    EXPECT_EQ(p.params.type_k, GgmlType::F16);
}

TEST_F(Fit, QuantizesKvBeforeAnythingElse) {
    const Plan p = fit_plan(shape_, base(plan_with(GgmlType::Q8_0, 65536, 0).total()));
    EXPECT_TRUE(p.fits());
    EXPECT_EQ(p.params.type_k, GgmlType::Q8_0);
    EXPECT_EQ(p.params.type_v, GgmlType::Q8_0);
    EXPECT_EQ(p.params.n_ctx, 65536);
    EXPECT_EQ(p.params.n_streamed_layers, 0);
    ASSERT_EQ(p.fit_steps.size(), 1u);
    EXPECT_NE(p.fit_steps[0].change.find("f16/f16 -> q8_0/q8_0"), std::string::npos) << p.fit_steps[0].change;

    const Plan q = fit_plan(shape_, base(plan_with(GgmlType::Q4_0, 65536, 0).total()));
    EXPECT_EQ(q.params.type_k, GgmlType::Q4_0);
    EXPECT_EQ(q.params.n_ctx, 65536);
    EXPECT_EQ(q.fit_steps.size(), 2u);
}

TEST_F(Fit, ThenStreamsLayersKeepingTheContext) {
    // Streaming pays off only past two layers (the buffer holds two): eight layers of 100 MiB.
    shape_.hp.n_layer = 8;
    shape_.hp.is_swa.assign(8, false);
    shape_.layer_bytes.assign(8, 100ull << 20);
    const Plan p = fit_plan(shape_, base(plan_with(GgmlType::Q4_0, 65536, 3).total()));
    EXPECT_TRUE(p.fits());
    EXPECT_EQ(p.params.type_k, GgmlType::Q4_0);
    EXPECT_EQ(p.params.n_ctx, 65536);
    EXPECT_EQ(p.params.n_streamed_layers, 3);
    EXPECT_EQ(p.weights_streamed, 300ull << 20);
    EXPECT_EQ(p.stream_buffer, 200ull << 20);
    ASSERT_EQ(p.fit_steps.size(), 3u);
    EXPECT_NE(p.fit_steps[2].change.find("stream the weights of 3 of 8 layers"), std::string::npos)
        << p.fit_steps[2].change;
}

TEST_F(Fit, StreamingTwoLayersOrFewerNeverHelps) {
    // The tiny model's two layers: streaming one costs buffers for two.
    const Plan resident = plan_with(GgmlType::Q4_0, 65536, 0);
    EXPECT_GT(plan_with(GgmlType::Q4_0, 65536, 1).total(), resident.total());
    // Both: the buffers (each a layer's file range, aligned for O_DIRECT) outweigh the layers.
    EXPECT_GT(plan_with(GgmlType::Q4_0, 65536, 2).total(), resident.total());
}

TEST_F(Fit, ShortensTheContextLast) {
    const Plan p = fit_plan(shape_, base(plan_with(GgmlType::Q4_0, 16384, 0).total()));
    EXPECT_TRUE(p.fits());
    EXPECT_EQ(p.params.type_k, GgmlType::Q4_0);
    EXPECT_EQ(p.params.n_ctx, 16384);  // halved twice
    EXPECT_EQ(p.params.n_streamed_layers, 0);
    EXPECT_NE(p.fit_steps.back().change.find("context 65536 -> 16384"), std::string::npos) << p.fit_steps.back().change;
}

TEST_F(Fit, SaysWhenNothingFits) {
    const Plan p = fit_plan(shape_, base(1 << 20));
    EXPECT_FALSE(p.fits());
    EXPECT_EQ(p.fit_steps.back().change, "nothing fits");
    EXPECT_NE(p.fit_steps.back().reason.find("budget is 1.00 MiB"), std::string::npos) << p.fit_steps.back().reason;
}

}  // namespace
}  // namespace fitllm::memory
