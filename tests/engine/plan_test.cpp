// memory/plan.h: the numbers of a plan against hand-computed ones and against the KV cache the
// runtime really makes, and --fit's choices.
#include "engine/plan.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "backend/backend.h"
#include "backend/virtual_device.h"
#include "kv/cache.h"
#include "model/layer_stream.h"
#include "model/model.h"
#include "model/offload.h"
#include "ops/thread_pool.h"
#include "test_support.h"

namespace fitllm::engine {
namespace {

using quant::GgmlType;

std::string tiny(const std::string& name) {
    return (test::source_dir() / "tests/model/data" / name).string();
}

// The KV bytes of the cache the runtime makes for these settings (model::Model::make_cache).
uint64_t real_kv_bytes(const model::Hparams& hp, const PlanParams& p) {
    std::vector<kv::LayerShape> layers(static_cast<size_t>(hp.n_layer),
                                       {hp.n_head_kv, hp.head_dim, hp.head_dim_v, hp.n_head});
    std::vector<int> windows(static_cast<size_t>(hp.n_layer), 0);
    for (size_t i = 0; i < hp.is_swa.size(); ++i) windows[i] = hp.is_swa[i] ? hp.sliding_window : 0;
    kv::CacheParams cp;
    cp.n_cells = kv_cells(p.n_ctx, p.n_seq, p.context_shift);  // as every context's cache
    cp.n_seq_max = p.n_seq;
    cp.type_k = p.type_k;
    cp.type_v = p.type_v;
    cp.rotate = p.kv_rotation;
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
    // Activations per token (model/activations.h): x 256, cur 256 (then attn), work: q 256, k, v
    // 128 (then gate, up 256 of one 64-token FFN slice) floats; plus a sequence id and a position.
    EXPECT_EQ(p.activations, 64u * ((256 + 256 + 512) * 4 + 8));
    EXPECT_EQ(p.matmul_scratch, 64u * 272);  // a Q8_0 activation row of 256 values: 8 blocks of 34 bytes
    EXPECT_EQ(p.scratch, p.activations + std::max(p.matmul_scratch, p.attention_scratch) + 64);
    EXPECT_EQ(p.logits, 450u * 4);
    // A sampler's candidate list: 450 candidates of 12 bytes (id, logit, probability).
    EXPECT_EQ(p.samplers, 450u * 12);
    EXPECT_EQ(p.overhead, kFixedOverhead + kMetadataFactor * 11584u + p.samplers);
    EXPECT_EQ(p.total(), p.weights_resident + p.kv + p.scratch + p.logits + p.overhead);
    EXPECT_TRUE(p.fits());
    EXPECT_EQ(p.kv, real_kv_bytes(shape.hp, p.params));

    // q8_0 K/V: 2 blocks of 34 bytes per head; and the diagonal K transforms (kv/key_transform.h):
    // per layer c, s and 1 / s (2 kv heads of 64 floats each) and the K rows kept until the fit
    // (7: 2 heads of 64 floats, a position and a cell).
    const Plan q = make_plan(
        shape, {.n_ctx = 256, .n_batch = 64, .type_k = GgmlType::Q8_0, .type_v = GgmlType::Q8_0, .budget = 1ull << 30});
    EXPECT_EQ(q.kv, 2u * 256 * 2 * 136 + 256 * 16 + 16 * 12 + 16 * 4 + 2u * (3 * 2 * 64 * 4 + 7u * (2 * 64 * 4 + 8)));
    // q4_0 K/V: 2 blocks of 18 bytes per head; the query-aware transforms: per layer and kv head c
    // (64 floats) and three padded 64 x 64 triangles (2304 floats and 64 row offsets each), the rows
    // kept until the fit (7 of K and Q: 6 heads of 64 floats, a position and a cell), and the fit's
    // working memory for 64-value heads.
    const Plan q4 = make_plan(
        shape, {.n_ctx = 256, .n_batch = 64, .type_k = GgmlType::Q4_0, .type_v = GgmlType::Q4_0, .budget = 1ull << 30});
    const uint64_t transforms =
        2u * (2u * (64 * 4 + 3 * (2304 * 4 + 64 * 8)) + 7u * (6 * 64 * 4 + 8)) + kv::query_aware_fit_bytes(64);
    EXPECT_EQ(q4.kv, 2u * 256 * 2 * 72 + 256 * 16 + 16 * 12 + 16 * 4 + transforms);
    EXPECT_EQ(q4.kv, real_kv_bytes(shape.hp, q4.params));
    // Without the rotation (--no-kv-rotation) K is stored as is: no transforms.
    const Plan plain = make_plan(shape, {.n_ctx = 256,
                                         .n_batch = 64,
                                         .type_k = GgmlType::Q8_0,
                                         .type_v = GgmlType::Q8_0,
                                         .kv_rotation = false,
                                         .budget = 1ull << 30});
    EXPECT_EQ(plain.kv, 2u * 256 * 2 * 136 + 256 * 16 + 16 * 12 + 16 * 4);
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
    // x 640, cur 4 x 256 (attn), work 1536 floats per token: q 4 x 256, k, v 256 side by side;
    // gate, up 2048 each of a 128-token FFN slice take 2 x 2048 x 128 = 512 x 1024 of it.
    EXPECT_EQ(p.activations, 512u * ((640 + 1024 + 1536) * 4 + 8));
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

TEST_F(Fit, KeepsQ8_0WhereQ4_0KeysCostMore) {
    // At 256 cells the tiny model's q4_0 cache is larger than its q8_0 one: the query-aware K
    // transforms and their fit's working memory outweigh the cells' savings.
    const Plan q8_0 = plan_with(GgmlType::Q8_0, 256, 0);
    ASSERT_GT(plan_with(GgmlType::Q4_0, 256, 0).kv, q8_0.kv);
    PlanParams params = base(q8_0.total() - 1);
    params.n_ctx = 256;
    const Plan p = fit_plan(shape_, params);
    EXPECT_EQ(p.params.type_k, GgmlType::Q8_0);
    EXPECT_EQ(p.params.type_v, GgmlType::Q8_0);
    ASSERT_GE(p.fit_steps.size(), 2u);
    EXPECT_NE(p.fit_steps[0].change.find("f16/f16 -> q8_0/q8_0"), std::string::npos) << p.fit_steps[0].change;
    EXPECT_EQ(p.fit_steps[1].change, "KV cache stays q8_0/q8_0");
    EXPECT_NE(p.fit_steps[1].reason.find("q4_0/q4_0 would take"), std::string::npos) << p.fit_steps[1].reason;
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
}  // namespace fitllm::engine

namespace fitllm::engine {
namespace {

// Offload (-ngl): the host's and the device's shares.
TEST(PlanOffload, SplitsWeightsAndKvBetweenHostAndDevice) {
    const auto file = gguf::GgufFile::open(tiny("tiny-llama-q8_0.gguf"));
    const ModelShape shape = model_shape(file);
    const PlanParams base{.n_ctx = 256, .n_batch = 64, .n_threads = 2, .budget = 1ull << 30};
    const Plan cpu = make_plan(shape, base);
    EXPECT_TRUE(cpu.device.name.empty());

    PlanParams q = base;
    q.device = "virtual";
    q.n_gpu_layers = 1;  // the last of 2 layers
    const Plan one = make_plan(shape, q);
    EXPECT_EQ(one.device.name, "virtual");
    EXPECT_EQ(one.device.n_layer, 1);
    EXPECT_FALSE(one.device.output);
    // Each tensor's copy is a buffer of its own (model::device_weight_bytes; what the device is
    // really charged: DeviceShareMatchesWhatTheModelCharges).
    EXPECT_EQ(one.device.weights, shape.device_weight_bytes[1]);
    EXPECT_GE(one.device.weights, shape.layer_bytes[1]);
    EXPECT_EQ(one.weights_resident, cpu.weights_resident - shape.layer_bytes[1]);
    const model::Hparams& hp = shape.hp;
    const uint64_t one_layer_pool =
        kv_pool_bytes(1, hp.n_head_kv, hp.head_dim, hp.head_dim_v, 256, 1, 16, GgmlType::F16, GgmlType::F16);
    EXPECT_EQ(one.kv, one_layer_pool);
    EXPECT_EQ(one.device.kv, one_layer_pool);
    EXPECT_GT(one.device.kv, 0u);
    EXPECT_LT(one.kv, cpu.kv);
    ASSERT_EQ(one.kv_pools.size(), 2u);
    EXPECT_FALSE(one.kv_pools[0].on_device);
    EXPECT_TRUE(one.kv_pools[1].on_device);
    EXPECT_EQ(one.total(), cpu.total() - shape.layer_bytes[1] - (cpu.kv - one.kv));  // nothing more on the host

    // Every layer and the output layer: the host keeps the token embedding (untied here).
    q.n_gpu_layers = 3;
    const Plan all = make_plan(shape, q);
    EXPECT_EQ(all.device.n_layer, 2);
    EXPECT_TRUE(all.device.output);
    EXPECT_EQ(all.kv, 0u);
    EXPECT_EQ(all.weights_resident, shape.token_embd_bytes);
    EXPECT_EQ(all.device.weights, shape.device_weight_bytes[3]);
    EXPECT_GE(all.device.weights, cpu.weights_resident - shape.token_embd_bytes);
    // --no-kv-offload: the KV stays on the host.
    q.kv_offload = false;
    const Plan host_kv = make_plan(shape, q);
    EXPECT_EQ(host_kv.device.kv, 0u);
    EXPECT_EQ(host_kv.kv, cpu.kv);
    // -ngl without a device is refused.
    PlanParams nodev = base;
    nodev.n_gpu_layers = 1;
    EXPECT_THROW(make_plan(shape, nodev), std::invalid_argument);
}

TEST(PlanOffload, HostSharesStayFlatAsTheContextGrowsWithEverythingOffloaded) {
    const auto file = gguf::GgufFile::open(tiny("tiny-llama-q8_0.gguf"));
    const ModelShape shape = model_shape(file);
    PlanParams q{.n_ctx = 512, .n_batch = 64, .n_threads = 2, .budget = 1ull << 30};
    q.device = "virtual";
    q.n_gpu_layers = 99;
    const Plan small = make_plan(shape, q);
    q.n_ctx = 65536;
    const Plan big = make_plan(shape, q);
    EXPECT_EQ(big.total(), small.total());
    EXPECT_GT(big.device.kv, 64 * small.device.kv);
}

TEST(PlanOffload, AutoOffloadsAsManyLayersAsTheDeviceHolds) {
    const auto file = gguf::GgufFile::open(tiny("tiny-llama-q8_0.gguf"));
    const ModelShape shape = model_shape(file);
    PlanParams q{.n_ctx = 256, .n_batch = 64, .n_threads = 2, .budget = 1ull << 30};
    q.device = "virtual";
    q.n_gpu_layers = 1;
    const uint64_t one_layer = make_plan(shape, q).device.total();
    q.n_gpu_layers = 2;
    const uint64_t two_layers = make_plan(shape, q).device.total();
    ASSERT_LT(one_layer, two_layers);
    q.n_gpu_layers = -1;
    q.vram = (one_layer + two_layers) / 2;
    const Plan p = make_plan(shape, q);
    EXPECT_EQ(p.params.n_gpu_layers, 1);
    EXPECT_TRUE(p.device.fits());
    q.vram = 0;  // no limit: everything, the output layer too
    EXPECT_EQ(make_plan(shape, q).params.n_gpu_layers, 3);
    q.vram = 1;  // nothing fits there
    EXPECT_EQ(make_plan(shape, q).params.n_gpu_layers, 0);
    // --fit says what it chose.
    q.vram = (one_layer + two_layers) / 2;
    const Plan f = fit_plan(shape, q);
    ASSERT_FALSE(f.fit_steps.empty());
    EXPECT_NE(f.fit_steps[0].change.find("offload 1 of 2 layers to virtual"), std::string::npos)
        << f.fit_steps[0].change;
    // An explicit -ngl over the device's budget does not fit.
    q.n_gpu_layers = 2;
    EXPECT_FALSE(make_plan(shape, q).fits());
}

// A unified device (PlanParams::unified): no copies, one budget. Its layers' weights stay in the
// host's resident weights, its KV pools and scratch are counted in the host's, --vram is ignored,
// and auto -ngl takes every layer that does not stream.
TEST(PlanOffload, AUnifiedDevicesShareIsTheHosts) {
    const auto file = gguf::GgufFile::open(tiny("tiny-llama-q8_0.gguf"));
    const ModelShape shape = model_shape(file);
    const PlanParams base{.n_ctx = 256, .n_batch = 64, .n_threads = 2, .budget = 1ull << 30};
    const Plan cpu = make_plan(shape, base);
    for (const int ngl : {1, 2, 3}) {
        SCOPED_TRACE("-ngl " + std::to_string(ngl));
        PlanParams q = base;
        q.device = "virtual";
        q.n_gpu_layers = ngl;
        const Plan separate = make_plan(shape, q);
        q.device = "virtual-unified";
        q.unified = true;
        q.vram = 1;  // ignored: one budget
        const Plan u = make_plan(shape, q);
        EXPECT_TRUE(u.device.unified);
        EXPECT_EQ(u.params.vram, 0u);
        EXPECT_TRUE(u.device.fits());
        EXPECT_EQ(u.device.weights, 0u);
        EXPECT_EQ(u.weights_resident, cpu.weights_resident);  // read in place: nothing leaves the host
        uint64_t in_place = shape.layer_bytes[1] + (ngl >= 2 ? shape.layer_bytes[0] : 0);
        if (ngl == 3) in_place += shape.output_bytes;
        EXPECT_EQ(u.device.weights_in_place, in_place);
        EXPECT_EQ(u.device.kv, separate.device.kv);
        EXPECT_EQ(u.kv, separate.kv + separate.device.kv);  // the host's "kv" pool holds every pool
        EXPECT_EQ(u.device.scratch, separate.device.scratch);
        EXPECT_EQ(u.scratch, cpu.scratch + u.device.scratch);
        EXPECT_EQ(u.total(), cpu.total() + (u.kv - cpu.kv) + u.device.scratch);
        // Over --mem by a byte: the host does not fit, and nothing else is to blame.
        q.budget = u.total() - 1;
        EXPECT_FALSE(make_plan(shape, q).fits());
        q.budget = u.total();
        EXPECT_TRUE(make_plan(shape, q).fits());
    }
    PlanParams q = base;
    q.device = "virtual-unified";
    q.unified = true;
    q.n_gpu_layers = -1;  // auto: every layer and the output
    EXPECT_EQ(make_plan(shape, q).params.n_gpu_layers, 3);
    q.n_streamed_layers = 1;  // the streamed layer runs on the host
    const Plan streamed = make_plan(shape, q);
    EXPECT_EQ(streamed.params.n_gpu_layers, 1);
    EXPECT_EQ(streamed.params.n_streamed_layers, 1);
    EXPECT_EQ(streamed.weights_streamed, shape.layer_bytes[0]);
    // An explicit -ngl leaves no host layer to stream: the plan says none streams (as the model).
    q.n_gpu_layers = 3;
    EXPECT_EQ(make_plan(shape, q).params.n_streamed_layers, 0);
    // --fit says it offloads everything to the unified device, and why.
    q.n_gpu_layers = -1;
    q.n_streamed_layers = 0;
    const Plan f = fit_plan(shape, q);
    ASSERT_FALSE(f.fit_steps.empty());
    EXPECT_NE(f.fit_steps[0].change.find("offload 2 of 2 layers and the output layer to virtual-unified"),
              std::string::npos)
        << f.fit_steps[0].change;
    EXPECT_NE(f.fit_steps[0].reason.find("shares the host's memory"), std::string::npos) << f.fit_steps[0].reason;
}

TEST(PlanOffload, DemoModelKvPoolsPerPlace) {
    const auto path = test::source_dir() / "models/gemma-3-270m-q4_k_m.gguf";
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "demo model not present (scripts/setup.sh fetches it)";
    const auto file = gguf::GgufFile::open(path.string());
    const ModelShape shape = model_shape(file);
    PlanParams q{.n_ctx = 8192, .n_batch = 512, .n_threads = 2, .budget = 1ull << 32};
    const Plan cpu = make_plan(shape, q);
    q.device = "virtual";
    q.n_gpu_layers = 9;  // 18 layers: the last 9, local and global ones
    const Plan half = make_plan(shape, q);
    uint64_t host = 0, device = 0;
    int host_layers = 0, device_layers = 0;
    for (const KvPoolPlan& pool : half.kv_pools) {
        (pool.on_device ? device : host) += pool.bytes;
        (pool.on_device ? device_layers : host_layers) += pool.n_layer;
    }
    EXPECT_EQ(host, half.kv);
    EXPECT_EQ(device, half.device.kv);
    EXPECT_EQ(host_layers, 9);
    EXPECT_EQ(device_layers, 9);
    EXPECT_EQ(half.kv_pools.size(), 4u);          // (host, device) x (full, window)
    EXPECT_GT(half.kv + half.device.kv, cpu.kv);  // the same K/V, twice the bookkeeping
    EXPECT_LT(half.kv + half.device.kv, cpu.kv + cpu.kv / 20);
    // Tied output: offloading it copies the token embedding; the host keeps its own.
    q.n_gpu_layers = 19;
    const Plan all = make_plan(shape, q);
    EXPECT_TRUE(all.device.output);
    EXPECT_EQ(all.weights_resident, shape.global_bytes);
    EXPECT_GE(all.device.weights, all.shape.output_bytes + (cpu.weights_resident - shape.global_bytes));
    EXPECT_EQ(all.device.weights, shape.device_weight_bytes[19]);
}

}  // namespace
}  // namespace fitllm::engine

namespace fitllm::engine {
namespace {

using memory::Device;
using memory::PoolStats;
namespace pool_names = memory::pool_names;

// The most a device's pool ever held (0 for a pool never made).
uint64_t peak_of(const Device& device, std::string_view pool) {
    for (const PoolStats& s : device.pools()) {
        if (s.name == pool) return s.peak;
    }
    return 0;
}

// One batch of n tokens (ids and positions 0..n-1) through the model, no logits kept.
void forward_batch(model::Model& m, kv::ModelCache& cache, int n) {
    std::vector<int32_t> tokens(static_cast<size_t>(n)), pos(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) tokens[i] = pos[i] = i;
    std::vector<float> logits(static_cast<size_t>(m.n_vocab()));
    ops::ThreadPool pool(1);
    m.forward(tokens, pos, cache, logits.data(), false, pool);
}

// The plan's device share against what a model offloaded to the virtual device charges there: the
// weights and KV byte for byte; scratch after a full batch within the plan (the plan counts the
// largest op scratch of any matmul or attention; the device grows to what it used).
TEST(PlanOffload, DeviceShareMatchesWhatTheModelCharges) {
    for (const char* name : {"tiny-llama-q8_0.gguf", "tiny-qwen2-q4_k_m.gguf"}) {
        const auto file = gguf::GgufFile::open(tiny(name));
        const ModelShape shape = model_shape(file);
        for (const int ngl : {1, 2, 3}) {
            PlanParams q{.n_ctx = 256, .n_batch = 32, .n_outputs = 1, .n_threads = 1, .budget = 1ull << 30};
            q.device = "virtual";
            q.n_gpu_layers = ngl;
            const Plan p = make_plan(shape, q);
            const auto dev = backend::open_device("virtual", UINT64_MAX);
            memory::Device host("host", UINT64_MAX);
            auto m = model::Model::load(
                file, {.device = &host, .offload = dev.get(), .n_offload_layers = ngl, .offload_kv = true});
            kv::CacheParams cp;
            cp.n_cells = q.n_ctx;
            cp.pool = &host.pool(pool_names::kKv);
            kv::ModelCache cache = m->make_cache(cp, q.n_batch);
            forward_batch(*m, cache, 32);
            const uint64_t weights = peak_of(dev->memory(), pool_names::kWeights);
            const uint64_t kv_bytes = peak_of(dev->memory(), pool_names::kKv);
            const uint64_t scratch = peak_of(dev->memory(), pool_names::kScratch);
            EXPECT_EQ(weights, p.device.weights) << name << " -ngl " << ngl;
            EXPECT_EQ(kv_bytes, p.device.kv) << name << " -ngl " << ngl;
            EXPECT_LE(scratch, p.device.scratch) << name << " -ngl " << ngl;
            EXPECT_GE(scratch, p.device.scratch - (p.scratch - p.activations)) << name << " -ngl " << ngl;
            EXPECT_EQ(peak_of(host, pool_names::kKv), p.kv) << name << " -ngl " << ngl;
        }
    }
}

// A unified device's share against what the model charges the host's pools: KV byte for byte
// (the host's pools and the device's, all in the host's "kv"); no weights charged and none of the
// device's buffers a weight (its buffers are its activations, byte for byte); the host's scratch
// after a full batch within the plan.
TEST(PlanOffload, UnifiedShareMatchesWhatTheModelChargesTheHost) {
    for (const char* name : {"tiny-llama-q8_0.gguf", "tiny-qwen2-q4_k_m.gguf"}) {
        const auto file = gguf::GgufFile::open(tiny(name));
        const ModelShape shape = model_shape(file);
        for (const int ngl : {1, 2, 3}) {
            for (const bool kv_offload : {true, false}) {
                SCOPED_TRACE(std::string(name) + " -ngl " + std::to_string(ngl) +
                             (kv_offload ? "" : " --no-kv-offload"));
                PlanParams q{.n_ctx = 256, .n_batch = 32, .n_outputs = 1, .n_threads = 1, .budget = 1ull << 30};
                q.device = "virtual-unified";
                q.unified = true;
                q.n_gpu_layers = ngl;
                q.kv_offload = kv_offload;
                const Plan p = make_plan(shape, q);
                memory::Device host("host", UINT64_MAX);
                const auto dev = backend::open_unified_device("virtual", host);
                auto m = model::Model::load(
                    file, {.device = &host, .offload = dev.get(), .n_offload_layers = ngl, .offload_kv = kv_offload});
                kv::CacheParams cp;
                cp.n_cells = q.n_ctx;
                cp.pool = &host.pool(pool_names::kKv);
                kv::ModelCache cache = m->make_cache(cp, q.n_batch);
                forward_batch(*m, cache, 32);
                const uint64_t weights = peak_of(host, pool_names::kWeights);
                const uint64_t kv_bytes = peak_of(host, pool_names::kKv);
                const uint64_t scratch = peak_of(host, pool_names::kScratch);
                EXPECT_EQ(weights, 0u);  // (cli::RunBudget charges p.weights_resident, the mapped file's)
                EXPECT_EQ(kv_bytes, p.kv);
                const auto& virt = dynamic_cast<const backend::VirtualDevice&>(*dev);
                EXPECT_EQ(virt.allocated_bytes(), model::device_scratch_bytes(shape.hp, ngl, 32, 1));
                EXPECT_LE(scratch, p.scratch);
                EXPECT_GE(scratch, p.scratch - 2 * (p.scratch - p.activations - p.device.scratch));
            }
        }
    }
}

}  // namespace
}  // namespace fitllm::engine
