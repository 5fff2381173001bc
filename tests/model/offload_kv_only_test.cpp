// KV-only offload and other matrices kept on the host (model/offload.h host_kept_tensors; llama.cpp's
// `-ngl 99 -ot '.*=CPU'`): an offloaded layer whose weight matrices stay in host memory multiplies by
// them on the host (its rows cross), while norms, RoPE, the KV store and attention run on the
// device. The logits are the CPU's bit for bit on the virtual device, for dense, Gemma and MoE files,
// every rule and split, the KV on either side; the device holds no weight matrix and is charged what
// the plan says, the host its activations and op scratch as planned.
//
// Tolerance: none (as offload_test.cpp: the host matmuls run the CPU run's kernels on the CPU run's
// mapped bytes, the device's ops the same kernels on copies at the same alignment, rows cross by
// memcpy).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "backend/virtual_device.h"
#include "engine/plan.h"
#include "engine/plan_report.h"
#include "gguf/gguf_reader.h"
#include "kv/cache.h"
#include "memory/device.h"
#include "memory/pool.h"
#include "model/model.h"
#include "model/offload.h"
#include "model/offload_script.h"
#include "model/tensor_override.h"
#include "model/tiny_gemma3.h"
#include "ops/thread_pool.h"
#include "test_support.h"

namespace fitllm {
namespace {

namespace pools = memory::pool_names;

std::string data(const std::string& name) {
    return (test::source_dir() / "tests/model/data" / name).string();
}

std::vector<model::TensorOverride> ot(const std::string& list) {
    return model::parse_tensor_overrides(list, "-ot");
}

struct Case {
    std::string name;
    std::vector<std::byte> bytes;  // a generated model, or empty
    std::string path;              // a model file
    bool moe = false;
};

std::vector<Case> cases() {
    std::vector<Case> c = {{"generated gemma3, 6 layers", test::tiny_gemma3_bytes({.n_layer = 6}), {}}};
    for (const char* f : {"tiny-llama-q8_0.gguf", "tiny-llama-q4_k_m.gguf", "tiny-qwen2-q4_k_m.gguf",
                          "tiny-qwen2-f16.gguf", "tiny-gemma2-q8_0.gguf", "tiny-phi3-q4_k_m.gguf"})
        c.push_back({f, {}, data(f)});
    for (const char* f : {"tiny-qwen3moe-q8_0.gguf", "tiny-mixtral-q4_k_m.gguf", "tiny-qwen2moe-q8_0.gguf",
                          "tiny-gpt-oss-mxfp4_moe.gguf"})
        c.push_back({f, {}, data(f), true});
    return c;
}

gguf::GgufFile open_case(const Case& c) {
    return c.path.empty() ? gguf::GgufFile::parse(c.bytes, c.name) : gguf::GgufFile::open(c.path);
}

// '.*=CPU' (every matrix on the host: KV-only offload), the attention matrices only, the FFN's down
// matrix only (a MoE file keeps its experts there too; with them on the device:
// offload_moe_test.cpp).
std::vector<std::string> rule_lists(bool moe) {
    if (moe) return {".*=CPU", "attn=CPU,exps=CPU", "attn_(q|k|v)\\.=CPU,exps=CPU"};
    return {".*=CPU", "attn=CPU", "ffn_down=CPU"};
}

uint64_t peak_of(const memory::Device& device, std::string_view pool) {
    for (const memory::PoolStats& s : device.pools()) {
        if (s.name == pool) return s.peak;
    }
    return 0;
}

// Every rule at every split, the KV on the device and on the host: the CPU's logits; the device
// holds what device_weight_bytes says for what host_kept_tensors keeps (with '.*=CPU' and the output
// layer asked for, 1-D tensors only), and the activations device_scratch_bytes says.
TEST(ModelOffloadKvOnly, HostMatricesGiveTheLogitsOfTheCpu) {
    ops::ThreadPool pool(2);
    for (const Case& c : cases()) {
        SCOPED_TRACE(c.name);
        const gguf::GgufFile file = open_case(c);
        const auto cpu = model::Model::load(file);
        const std::vector<float> want = test::offload_script(*cpu, pool);
        const model::Hparams& hp = cpu->hparams();
        const int n_layer = hp.n_layer;
        for (const std::string& list : rule_lists(c.moe)) {
            for (const int ngl : {1, n_layer, n_layer + 1}) {
                for (const bool offload_kv : {true, false}) {
                    SCOPED_TRACE("-ot '" + list + "' -ngl " + std::to_string(ngl) +
                                 (offload_kv ? ", kv on device" : ", kv on host"));
                    backend::VirtualDevice dev("virtual", 256 << 20);
                    auto m = model::Model::load(file, {.offload = &dev,
                                                       .n_offload_layers = ngl,
                                                       .offload_kv = offload_kv,
                                                       .tensor_overrides = ot(list)});
                    const model::HostKept kept =
                        model::host_kept_tensors(model::tensor_entries(file), hp, ngl, "virtual", ot(list));
                    EXPECT_FALSE(kept.matrices.empty());
                    const uint64_t weights = dev.memory().pool(pools::kWeights).live();
                    EXPECT_EQ(weights, model::device_weight_bytes(file, hp, ngl, false, kept));
                    EXPECT_LT(weights, model::device_weight_bytes(file, hp, ngl));
                    if (list == ".*=CPU") {
                        EXPECT_EQ(kept.output, ngl > n_layer);
                        for (const std::string& name : model::device_tensor_names(file, hp, ngl, kept))
                            EXPECT_EQ(file.find_tensor(name)->n_dims, 1u) << name << " copied to the device";
                    }
                    test::expect_same_bits(want, test::offload_script(*m, pool));
                    EXPECT_EQ(dev.memory().pool(pools::kScratch).live() - dev.op_scratch_bytes(),
                              model::device_scratch_bytes(hp, ngl, 40, 40, kept.output));
                    if (HasFatalFailure()) return;
                }
            }
        }
    }
}

// The demo model (Gemma 3 270M Q4_K_M) with every matrix on the host and everything else, the
// output layer aside, on the device: the CPU's logits.
TEST(ModelOffloadKvOnly, DemoModelGivesTheLogitsOfTheCpu) {
    const auto path = test::demo_model();
    if (!path) GTEST_SKIP() << "demo model absent (scripts/setup.sh downloads it)";
    ops::ThreadPool pool(2);
    const gguf::GgufFile file = gguf::GgufFile::open(path->string());
    const auto cpu = model::Model::load(file);
    const std::vector<float> want = test::offload_script(*cpu, pool);
    for (const std::string& list : {std::string(".*=CPU"), std::string("attn_(q|k|v|output)=CPU")}) {
        SCOPED_TRACE(list);
        backend::VirtualDevice dev("virtual", 1ull << 30);
        auto m = model::Model::load(
            file, {.offload = &dev, .n_offload_layers = cpu->hparams().n_layer + 1, .tensor_overrides = ot(list)});
        if (list == ".*=CPU") {
            EXPECT_LT(dev.memory().pool(pools::kWeights).live(), uint64_t{1} << 20);
        }
        test::expect_same_bits(want, test::offload_script(*m, pool));
    }
}

// The device's copies of what stays on the host are never made: a generated file whose host-kept
// matrices are NaN after loading still gives finite logits only if the host reads them (it does),
// and one whose device-copied tensors are NaN on the host gives the CPU's logits (the host never
// reads those).
TEST(ModelOffloadKvOnly, TheHostReadsItsMatricesAndNothingCopied) {
    ops::ThreadPool pool(2);
    std::vector<std::byte> bytes = test::tiny_gemma3_bytes({.n_layer = 6});
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "generated gemma3");
    const auto cpu = model::Model::load(file);
    const std::vector<float> want = test::offload_script(*cpu, pool);
    const model::Hparams& hp = cpu->hparams();
    const int ngl = hp.n_layer + 1;
    backend::VirtualDevice dev("virtual", 256 << 20);
    auto m = model::Model::load(file, {.offload = &dev, .n_offload_layers = ngl, .tensor_overrides = ot("attn=CPU")});
    const model::HostKept kept =
        model::host_kept_tensors(model::tensor_entries(file), hp, ngl, "virtual", ot("attn=CPU"));
    for (const std::string& name : model::device_tensor_names(file, hp, ngl, kept)) {
        if (name == "token_embd.weight") continue;  // the host embeds with it
        const gguf::TensorInfo& t = *file.find_tensor(name);
        std::fill_n(bytes.begin() + static_cast<std::ptrdiff_t>(file.data_offset() + t.offset), t.n_bytes,
                    std::byte{0xFF});
    }
    test::expect_same_bits(want, test::offload_script(*m, pool));
    for (const std::string& name : kept.matrices) {
        const gguf::TensorInfo& t = *file.find_tensor(name);
        std::fill_n(bytes.begin() + static_cast<std::ptrdiff_t>(file.data_offset() + t.offset), t.n_bytes,
                    std::byte{0xFF});
    }
    const std::vector<float> poisoned = test::offload_script(*m, pool);
    EXPECT_TRUE(std::any_of(poisoned.begin(), poisoned.end(), [](float v) { return v != v; }));
}

// The plan against what a model offloaded with '.*=CPU' charges, after a full batch: the device's
// weights (none but 1-D tensors) and KV byte for byte, its scratch buffers byte for byte and its
// peak within the plan; the host's KV (none with the KV on the device) byte for byte, its scratch
// within the plan (the host matmuls' rows are its activations: nothing more).
TEST(ModelOffloadKvOnly, PlanMatchesWhatTheModelCharges) {
    std::vector<Case> all = cases();
    if (const auto demo = test::demo_model()) all.push_back({"demo model", {}, demo->string()});
    for (const Case& c : all) {
        const gguf::GgufFile file = open_case(c);
        const engine::ModelShape shape = engine::model_shape(file);
        const model::Hparams& hp = shape.hp;
        for (const std::string& list : rule_lists(c.moe)) {
            for (const int ngl : {hp.n_layer, 99}) {
                for (const bool kv_offload : {true, false}) {
                    SCOPED_TRACE(c.name + " -ot '" + list + "' -ngl " + std::to_string(ngl) +
                                 (kv_offload ? "" : " --no-kv-offload"));
                    engine::PlanParams q{
                        .n_ctx = 256, .n_batch = 32, .n_outputs = 1, .n_threads = 1, .budget = 1ull << 32};
                    q.device = "virtual";
                    q.n_gpu_layers = ngl;
                    q.kv_offload = kv_offload;
                    q.tensor_overrides = ot(list);
                    const engine::Plan p = engine::make_plan(shape, q);
                    memory::Device host("host", UINT64_MAX);
                    backend::VirtualDevice dev("virtual", 1ull << 30);
                    auto m = model::Model::load(file, {.device = &host,
                                                       .offload = &dev,
                                                       .n_offload_layers = ngl,
                                                       .offload_kv = kv_offload,
                                                       .tensor_overrides = q.tensor_overrides});
                    kv::CacheParams cp;
                    cp.n_cells = q.n_ctx;
                    cp.pool = &host.pool(pools::kKv);
                    kv::ModelCache cache = m->make_cache(cp, q.n_batch);
                    std::vector<int32_t> tokens(32), pos(32);
                    for (int i = 0; i < 32; ++i) tokens[size_t(i)] = pos[size_t(i)] = i;
                    std::vector<float> logits(static_cast<size_t>(m->n_vocab()));
                    ops::ThreadPool pool(1);
                    m->forward(tokens, pos, cache, logits.data(), false, pool);
                    const model::HostKept kept =
                        model::host_kept_tensors(model::tensor_entries(file), hp, ngl, "virtual", q.tensor_overrides);
                    EXPECT_EQ(p.device.n_host_matrices, static_cast<int>(kept.matrices.size()));
                    EXPECT_EQ(p.device.output, ngl > hp.n_layer && !kept.output);
                    EXPECT_EQ(peak_of(dev.memory(), pools::kWeights), p.device.weights);
                    EXPECT_EQ(peak_of(dev.memory(), pools::kKv), p.device.kv);
                    EXPECT_EQ(dev.allocated_bytes() - peak_of(dev.memory(), pools::kWeights),
                              model::device_scratch_bytes(hp, ngl, 32, 1, kept.output));
                    const uint64_t dev_scratch = peak_of(dev.memory(), pools::kScratch);
                    EXPECT_LE(dev_scratch, p.device.scratch);
                    EXPECT_EQ(peak_of(host, pools::kKv), p.kv);
                    EXPECT_LE(peak_of(host, pools::kScratch), p.scratch);
                    if (list == ".*=CPU" && ngl == 99) {
                        // KV-only offload: every matrix resident on the host, as without a device.
                        engine::PlanParams cpu_q = q;
                        cpu_q.device.clear();
                        cpu_q.n_gpu_layers = 0;
                        cpu_q.tensor_overrides.clear();
                        // Less the 1-D tensors of the layers, which follow them to the device (their
                        // pages given back).
                        uint64_t copied = 0;
                        for (const std::string& name : model::device_tensor_names(file, hp, ngl, kept))
                            copied += name.starts_with("blk.") ? file.find_tensor(name)->n_bytes : 0;
                        EXPECT_EQ(p.weights_resident + copied, engine::make_plan(shape, cpu_q).weights_resident);
                        const std::string json = engine::plan_json(p, "test").dump();
                        EXPECT_NE(json.find("\"host_matrices\":" + std::to_string(kept.matrices.size())),
                                  std::string::npos)
                            << json;
                    }
                }
            }
        }
    }
}

// A unified device (shared memory) with every matrix on the host: the CPU's logits, the host's KV
// as planned byte for byte, its scratch within the plan, the device's buffers its activations, and
// the plan reads in place only the 1-D tensors.
TEST(ModelOffloadKvOnly, UnifiedDevice) {
    ops::ThreadPool pool(2);
    for (const char* f : {"tiny-llama-q8_0.gguf", "tiny-qwen3moe-q8_0.gguf"}) {
        SCOPED_TRACE(f);
        const gguf::GgufFile file = gguf::GgufFile::open(data(f));
        const engine::ModelShape shape = engine::model_shape(file);
        const auto cpu = model::Model::load(file);
        const std::vector<float> want = test::offload_script(*cpu, pool);
        engine::PlanParams q{.n_ctx = 128, .n_batch = 40, .n_outputs = 40, .n_threads = 2, .budget = 1ull << 32};
        q.device = "virtual-unified";
        q.unified = true;
        q.n_gpu_layers = 99;
        q.tensor_overrides = ot(".*=CPU");
        const engine::Plan p = engine::make_plan(shape, q);
        uint64_t in_place = 0;
        for (const model::TensorEntry& t : shape.tensor_entries()) {
            if (t.n_dims == 1 && t.name.starts_with("blk.")) in_place += file.find_tensor(t.name)->n_bytes;
        }
        EXPECT_EQ(p.device.weights_in_place, in_place);
        memory::Device host("host", UINT64_MAX);
        const auto dev = backend::open_unified_device("virtual", host);
        auto m = model::Model::load(
            file,
            {.device = &host, .offload = dev.get(), .n_offload_layers = 99, .tensor_overrides = q.tensor_overrides});
        test::expect_same_bits(want, test::offload_script(*m, pool));
        const auto& virt = dynamic_cast<const backend::VirtualDevice&>(*dev);
        EXPECT_EQ(virt.allocated_bytes(), model::device_scratch_bytes(shape.hp, 99, 40, 40, /*output_on_host=*/true));
        EXPECT_EQ(peak_of(host, pools::kWeights), 0u);
        EXPECT_LE(peak_of(host, pools::kScratch), p.scratch);
    }
}

// Rules the placement cannot follow are still refused by name; 1-D tensors follow their layer.
TEST(ModelOffloadKvOnly, RefusalsAndWhatFollowsTheLayer) {
    const gguf::GgufFile file = gguf::GgufFile::open(data("tiny-llama-q8_0.gguf"));
    const model::Hparams hp = model::Model::load(file)->hparams();
    const auto entries = model::tensor_entries(file);
    // Norm weights matched by a rule stay with their layer (and the output norm with the output layer).
    model::HostKept k = model::host_kept_tensors(entries, hp, hp.n_layer + 1, "virtual", ot("norm=CPU"));
    EXPECT_TRUE(k.matrices.empty());
    EXPECT_FALSE(k.output);
    k = model::host_kept_tensors(entries, hp, hp.n_layer + 1, "virtual", ot("^output\\.weight=CPU"));
    EXPECT_TRUE(k.output);
    EXPECT_TRUE(k.matrices.empty());
    // A host layer's matrix sent to the device, and a device the rules do not know.
    EXPECT_THROW(model::host_kept_tensors(entries, hp, 1, "virtual", ot("blk\\.0\\.attn_q=virtual")),
                 std::invalid_argument);
    try {
        model::host_kept_tensors(entries, hp, 1, "virtual", ot(".*=cuda1"));
        ADD_FAILURE() << "an unknown device";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("-ot '.*=cuda1'"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace fitllm
