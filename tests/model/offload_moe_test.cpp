// Offloaded mixture-of-experts layers, their routed experts on the device (llama.cpp's default with
// -ngl; model/moe.h moe_experts_on_device) or kept on the host (model/tensor_override.h,
// model/offload.h experts_on_host; llama.cpp's --cpu-moe, --n-cpu-moe, -ot), give the CPU's logits
// bit for bit on the virtual device, for every split and the KV on either side; the device is
// charged what the plan says; rules the forward pass cannot follow are refused naming the flag and
// pattern.
//
// Tolerance: none (as offload_test.cpp: the virtual device runs the host's kernels on copies of the
// same bytes at the same alignment, the host routes in both runs, rows cross by memcpy).
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
#include "model/expert_cache.h"
#include "model/model.h"
#include "model/offload.h"
#include "model/offload_script.h"
#include "model/tensor_override.h"
#include "model/tiny_llama.h"
#include "ops/thread_pool.h"
#include "test_support.h"

namespace fitllm {
namespace {

std::string data(const std::string& name) {
    return (test::source_dir() / "tests/model/data" / name).string();
}

test::TinyLlamaOptions qwen3moe() {
    test::TinyLlamaOptions o;
    o.arch = "qwen3moe";
    o.qk_norm = true;
    o.tied = true;
    o.head_dim = 16;
    o.expert_count = 6;
    o.expert_used = 2;
    return o;
}

struct Rules {
    std::string name;
    std::vector<model::TensorOverride> rules;
};

std::vector<Rules> host_expert_rules(int n_layer) {
    return {{"--cpu-moe", model::cpu_moe_overrides(-1)},
            {"--n-cpu-moe n_layer", model::cpu_moe_overrides(n_layer)},
            {"-ot exps=CPU", model::parse_tensor_overrides("exps=CPU", "-ot")},
            {"-ot attention on the device first, then the experts",
             model::parse_tensor_overrides("blk\\.1\\.attn=VIRTUAL,ffn_(up|gate|down)_exps=cpu", "-ot")}};
}

// Every split, with each way of keeping the experts on the host, the KV on the device and on the
// host: the CPU's logits; the device's "weights" pool holds what model::device_weight_bytes and the
// plan say (no expert), its scratch what device_scratch_bytes says.
TEST(ModelOffloadMoe, HostExpertsGiveTheLogitsOfTheCpu) {
    ops::ThreadPool pool(2);
    for (const char* f : {"tiny-qwen3moe-f16.gguf", "tiny-qwen3moe-q8_0.gguf", "tiny-qwen3moe-q4_k_m.gguf",
                          "tiny-mixtral-f16.gguf", "tiny-mixtral-q8_0.gguf", "tiny-mixtral-q4_k_m.gguf",
                          "tiny-qwen2moe-f16.gguf", "tiny-qwen2moe-q8_0.gguf", "tiny-qwen2moe-q4_k_m.gguf",
                          "tiny-gpt-oss-f16.gguf", "tiny-gpt-oss-q8_0.gguf", "tiny-gpt-oss-mxfp4_moe.gguf"}) {
        SCOPED_TRACE(f);
        const gguf::GgufFile file = gguf::GgufFile::open(data(f));
        const auto cpu = model::Model::load(file);
        const std::vector<float> want = test::offload_script(*cpu, pool);
        const int n_layer = cpu->hparams().n_layer;
        const engine::ModelShape shape = engine::model_shape(file);
        for (const Rules& r : host_expert_rules(n_layer)) {
            for (int ngl = 1; ngl <= n_layer + 1; ++ngl) {
                for (const bool offload_kv : {true, false}) {
                    SCOPED_TRACE(r.name + ", -ngl " + std::to_string(ngl) + (offload_kv ? ", kv on device" : ""));
                    backend::VirtualDevice dev("virtual", 256 << 20);
                    auto m = model::Model::load(file, {.offload = &dev,
                                                       .n_offload_layers = ngl,
                                                       .offload_kv = offload_kv,
                                                       .tensor_overrides = r.rules});
                    const std::vector<bool> host =
                        model::experts_on_host(model::tensor_names(file), m->hparams(), ngl, "virtual", r.rules);
                    const uint64_t weights = dev.memory().pool(memory::pool_names::kWeights).live();
                    EXPECT_EQ(weights, model::device_weight_bytes(file, m->hparams(), ngl, false, host));
                    EXPECT_LT(weights, model::device_weight_bytes(file, m->hparams(), ngl));  // no expert copied
                    const engine::Plan p = engine::make_plan(shape, {.n_ctx = 128,
                                                                     .n_batch = 40,
                                                                     .n_outputs = 40,
                                                                     .n_threads = 2,
                                                                     .device = "virtual",
                                                                     .n_gpu_layers = ngl,
                                                                     .kv_offload = offload_kv,
                                                                     .tensor_overrides = r.rules});
                    EXPECT_EQ(p.device.weights, weights);
                    EXPECT_EQ(p.device.n_host_expert_layers, std::min(ngl, n_layer));
                    test::expect_same_bits(want, test::offload_script(*m, pool));
                    EXPECT_EQ(dev.memory().pool(memory::pool_names::kScratch).live() - dev.op_scratch_bytes(),
                              model::device_scratch_bytes(m->hparams(), ngl, 40, 40));
                    EXPECT_LE(dev.memory().pool(memory::pool_names::kScratch).peak(), p.device.scratch);
                }
            }
        }
    }
}

// The routed experts on the device (llama.cpp's default with -ngl): every split, the KV on either
// side, with every offloaded layer's experts there or only some (--n-cpu-moe 1 keeps layer 0's on
// the host): the CPU's logits; the device's weights pool holds the experts (all of each offloaded
// layer but its router, which stays on the host), as the plan says; its scratch what
// device_scratch_bytes says with the experts' buffers, and its weights and scratch peaks stay within
// the plan.
TEST(ModelOffloadMoe, DeviceExpertsGiveTheLogitsOfTheCpu) {
    ops::ThreadPool pool(2);
    for (const char* f : {"tiny-qwen3moe-f16.gguf", "tiny-qwen3moe-q8_0.gguf", "tiny-qwen3moe-q4_k_m.gguf",
                          "tiny-mixtral-f16.gguf", "tiny-mixtral-q8_0.gguf", "tiny-mixtral-q4_k_m.gguf",
                          "tiny-qwen2moe-f16.gguf", "tiny-qwen2moe-q8_0.gguf", "tiny-qwen2moe-q4_k_m.gguf",
                          "tiny-gpt-oss-f16.gguf", "tiny-gpt-oss-q8_0.gguf", "tiny-gpt-oss-mxfp4_moe.gguf"}) {
        SCOPED_TRACE(f);
        const gguf::GgufFile file = gguf::GgufFile::open(data(f));
        const auto cpu = model::Model::load(file);
        const std::vector<float> want = test::offload_script(*cpu, pool);
        const int n_layer = cpu->hparams().n_layer;
        const engine::ModelShape shape = engine::model_shape(file);
        const std::vector<Rules> all_rules = {{"experts on the device", {}},
                                              {"--n-cpu-moe 1", model::cpu_moe_overrides(1)}};
        for (const Rules& r : all_rules) {
            for (int ngl = 1; ngl <= n_layer + 1; ++ngl) {
                for (const bool offload_kv : {true, false}) {
                    SCOPED_TRACE(r.name + ", -ngl " + std::to_string(ngl) + (offload_kv ? ", kv on device" : ""));
                    const std::vector<bool> host =
                        model::experts_on_host(model::tensor_names(file), cpu->hparams(), ngl, "virtual", r.rules);
                    const int n_device = std::min(ngl, n_layer);
                    const int n_host_experts = static_cast<int>(std::count(host.begin(), host.end(), true));
                    if (n_host_experts == n_device) continue;  // no expert on the device (the test above)
                    backend::VirtualDevice dev("virtual", 256 << 20);
                    auto m = model::Model::load(file, {.offload = &dev,
                                                       .n_offload_layers = ngl,
                                                       .offload_kv = offload_kv,
                                                       .tensor_overrides = r.rules});
                    const uint64_t weights = dev.memory().pool(memory::pool_names::kWeights).live();
                    EXPECT_EQ(weights, model::device_weight_bytes(file, m->hparams(), ngl, false, host));
                    uint64_t device_experts = 0;  // the expert tensors of the layers whose experts it runs
                    for (const gguf::TensorInfo& t : file.tensors()) {
                        for (int il = n_layer - n_device; il < n_layer; ++il) {
                            if (!host[size_t(il)] && model::is_expert_tensor(t.name) &&
                                t.name.starts_with("blk." + std::to_string(il) + "."))
                                device_experts += t.n_bytes;
                        }
                    }
                    EXPECT_GT(device_experts, 0u);
                    EXPECT_GT(weights, device_experts);
                    const engine::Plan p = engine::make_plan(shape, {.n_ctx = 128,
                                                                     .n_batch = 40,
                                                                     .n_outputs = 40,
                                                                     .n_threads = 2,
                                                                     .device = "virtual",
                                                                     .n_gpu_layers = ngl,
                                                                     .kv_offload = offload_kv,
                                                                     .tensor_overrides = r.rules});
                    EXPECT_EQ(p.device.weights, weights);
                    EXPECT_EQ(p.device.n_host_expert_layers, n_host_experts);
                    test::expect_same_bits(want, test::offload_script(*m, pool));
                    EXPECT_EQ(dev.memory().pool(memory::pool_names::kScratch).live() - dev.op_scratch_bytes(),
                              model::device_scratch_bytes(m->hparams(), ngl, 40, 40, false, /*experts=*/true));
                    EXPECT_LE(dev.memory().pool(memory::pool_names::kScratch).peak(), p.device.scratch);
                    EXPECT_LE(dev.memory().pool(memory::pool_names::kWeights).peak(), p.device.weights);
                }
            }
        }
    }
}

// Every offloaded tensor's bytes overwritten with NaNs on the host after the load, experts and all:
// the device computes from its own copies, the host reads only the routers and the embedding.
TEST(ModelOffloadMoe, DeviceExpertsReadTheDevicesCopies) {
    ops::ThreadPool pool(2);
    for (const char* f : {"tiny-qwen3moe-q8_0.gguf", "tiny-qwen2moe-q8_0.gguf", "tiny-gpt-oss-q8_0.gguf"}) {
        SCOPED_TRACE(f);
        const gguf::GgufFile mapped = gguf::GgufFile::open(data(f));
        std::vector<std::byte> bytes(mapped.bytes().begin(), mapped.bytes().end());
        const gguf::GgufFile file = gguf::GgufFile::parse(bytes, f);
        const auto cpu = model::Model::load(file);
        const int n_layer = cpu->hparams().n_layer;
        const std::vector<float> want = test::offload_script(*cpu, pool);
        backend::VirtualDevice dev("virtual", 256 << 20);
        auto m = model::Model::load(file, {.offload = &dev, .n_offload_layers = n_layer + 1});
        int poisoned = 0, experts = 0;
        for (const std::string& name : model::device_tensor_names(file, m->hparams(), n_layer + 1)) {
            if (name == "token_embd.weight") continue;  // tied: the host embeds with it
            EXPECT_FALSE(model::is_router_tensor(name)) << name;
            const gguf::TensorInfo& t = *file.find_tensor(name);
            std::fill_n(bytes.begin() + static_cast<std::ptrdiff_t>(file.data_offset() + t.offset), t.n_bytes,
                        std::byte{0xFF});
            ++poisoned;
            experts += model::is_expert_tensor(name) ? 1 : 0;
        }
        EXPECT_EQ(experts, 3 * n_layer);
        EXPECT_GT(poisoned, 10);
        test::expect_same_bits(want, test::offload_script(*m, pool));
    }
}

// A unified device runs the experts from the mapped file: the same.
TEST(ModelOffloadMoe, UnifiedDeviceWithDeviceExperts) {
    ops::ThreadPool pool(2);
    const gguf::GgufFile file = gguf::GgufFile::open(data("tiny-qwen2moe-q8_0.gguf"));
    const auto cpu = model::Model::load(file);
    memory::Device host("host", UINT64_MAX);
    const auto dev = backend::open_unified_device("virtual", host);
    auto m = model::Model::load(file, {.device = &host, .offload = dev.get(), .n_offload_layers = 3});
    test::expect_same_bits(test::offload_script(*cpu, pool), test::offload_script(*m, pool));
}

// A generated file whose device copies are then overwritten with NaNs on the host: the host reads
// only its experts (and the embedding), never the copied tensors.
TEST(ModelOffloadMoe, TheHostReadsOnlyItsExperts) {
    ops::ThreadPool pool(2);
    std::vector<std::byte> bytes = test::tiny_llama_bytes(qwen3moe());
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny-moe.gguf");
    const auto cpu = model::Model::load(file);
    const int n_layer = cpu->hparams().n_layer;
    const std::vector<float> want = test::offload_script(*cpu, pool);
    backend::VirtualDevice dev("virtual", 256 << 20);
    const std::vector<model::TensorOverride> rules = model::cpu_moe_overrides(-1);
    auto m = model::Model::load(file, {.offload = &dev, .n_offload_layers = n_layer + 1, .tensor_overrides = rules});
    const std::vector<bool> host =
        model::experts_on_host(model::tensor_names(file), m->hparams(), n_layer + 1, "virtual", rules);
    int poisoned = 0;
    for (const std::string& name : model::device_tensor_names(file, m->hparams(), n_layer + 1, host)) {
        if (name == "token_embd.weight") continue;  // tied: the host embeds with it
        EXPECT_FALSE(model::is_routed_block_tensor(name)) << name;
        const gguf::TensorInfo& t = *file.find_tensor(name);
        std::fill_n(bytes.begin() + static_cast<std::ptrdiff_t>(file.data_offset() + t.offset), t.n_bytes,
                    std::byte{0xFF});
        ++poisoned;
    }
    EXPECT_GT(poisoned, 10);
    test::expect_same_bits(want, test::offload_script(*m, pool));
}

// A unified device reads the dense tensors in place and leaves the experts to the host: the same.
TEST(ModelOffloadMoe, UnifiedDeviceWithHostExperts) {
    ops::ThreadPool pool(2);
    const gguf::GgufFile file = gguf::GgufFile::open(data("tiny-qwen3moe-q8_0.gguf"));
    const auto cpu = model::Model::load(file);
    memory::Device host("host", UINT64_MAX);
    const auto dev = backend::open_unified_device("virtual", host);
    auto m = model::Model::load(file, {.device = &host,
                                       .offload = dev.get(),
                                       .n_offload_layers = 3,
                                       .tensor_overrides = model::cpu_moe_overrides(-1)});
    test::expect_same_bits(test::offload_script(*cpu, pool), test::offload_script(*m, pool));
}

std::string load_error(const gguf::GgufFile& file, int ngl, const std::vector<model::TensorOverride>& rules) {
    backend::VirtualDevice dev("virtual", 256 << 20);
    try {
        model::Model::load(file, {.offload = &dev, .n_offload_layers = ngl, .tensor_overrides = rules});
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return "(loaded)";
}

std::string parse_error(const std::string& list) {
    try {
        model::parse_tensor_overrides(list, "-ot");
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return "(parsed)";
}

bool has(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

TEST(ModelOffloadMoe, RulesItCannotFollowAreRefusedByName) {
    const gguf::GgufFile file = gguf::GgufFile::open(data("tiny-qwen3moe-q8_0.gguf"));  // 2 layers
    const auto ot = [](const std::string& list) { return model::parse_tensor_overrides(list, "-ot"); };
    // Experts on the device: they run there (DeviceExpertsGiveTheLogitsOfTheCpu), all or some.
    EXPECT_EQ(load_error(file, 1, {}), "(loaded)");
    EXPECT_EQ(load_error(file, 2, model::cpu_moe_overrides(1)), "(loaded)");
    EXPECT_EQ(load_error(file, 2, ot("exps=virtual,exps=CPU")), "(loaded)");  // the first rule decides
    EXPECT_EQ(load_error(file, 1, ot("attn_q=CPU")), "(loaded)");
    // The expert cache serves the host's layers: with offloaded layers it is refused by name.
    for (const auto& rules : {std::vector<model::TensorOverride>{}, model::cpu_moe_overrides(-1)}) {
        backend::VirtualDevice dev("virtual", 256 << 20);
        try {
            model::Model::load(file,
                               {.offload = &dev, .n_offload_layers = 1, .tensor_overrides = rules, .expert_slots = 8});
            ADD_FAILURE() << "an expert cache with offloaded layers";
        } catch (const std::invalid_argument& x) {
            EXPECT_TRUE(has(x.what(), "expert cache (--expert-cache)") && has(x.what(), "offloaded to virtual"))
                << x.what();
            EXPECT_EQ(has(x.what(), "with their routed experts"), rules.empty()) << x.what();
        }
    }
    // Only the whole block moves.
    std::string e = load_error(file, 1, ot("ffn_up_exps=CPU"));
    EXPECT_TRUE(has(e, "-ot 'ffn_up_exps=CPU'") && has(e, "1 of the 3 expert tensors of offloaded layer 1")) << e;
    // A host layer's tensor sent to the device.
    e = load_error(file, 1, ot("blk\\.0\\.attn=virtual,exps=CPU"));
    EXPECT_TRUE(has(e, "-ot 'blk\\.0\\.attn=virtual'") && has(e, "layer 0 runs on the host")) << e;
    // Unknown devices, also without an offload device.
    e = load_error(file, 1, ot("exps=CUDA0"));
    EXPECT_TRUE(has(e, "-ot 'exps=CUDA0'") && has(e, "unknown device 'CUDA0'") && has(e, "CPU or virtual")) << e;
    try {
        model::Model::load(file, {.tensor_overrides = ot("exps=virtual")});
        ADD_FAILURE() << "a device rule without a device";
    } catch (const std::invalid_argument& x) {
        EXPECT_TRUE(has(x.what(), "-ot 'exps=virtual'") && has(x.what(), "only CPU")) << x.what();
    }
    // Syntax.
    e = parse_error("exps");
    EXPECT_TRUE(has(e, "-ot 'exps'") && has(e, "expected REGEX=DEVICE")) << e;
    e = parse_error("exps=CPU,=CPU");
    EXPECT_TRUE(has(e, "-ot '=CPU'")) << e;
    e = parse_error("ffn_(up=CPU");
    EXPECT_TRUE(has(e, "-ot 'ffn_(up=CPU'") && has(e, "is not a regular expression")) << e;
    EXPECT_EQ(parse_error("a=b=CPU"), "(parsed)");  // split at the last '='
    EXPECT_EQ(model::parse_tensor_overrides("a=b=CPU", "-ot")[0].pattern, "a=b");
    // Rules about host layers' tensors going to the host change nothing: a dense model loads.
    const gguf::GgufFile dense = gguf::GgufFile::open(data("tiny-qwen3-q8_0.gguf"));
    EXPECT_EQ(load_error(dense, 1, model::cpu_moe_overrides(-1)), "(loaded)");
    EXPECT_EQ(load_error(dense, 1, ot("blk\\.0\\.=CPU")), "(loaded)");
}

// The plan: per device what is resident (the experts of the offloaded layers on the host, in its
// resident weights), the same refusals.
TEST(ModelOffloadMoe, ThePlanShowsWhereTheExpertsAre) {
    const gguf::GgufFile file = gguf::GgufFile::open(data("tiny-qwen3moe-q8_0.gguf"));
    const engine::ModelShape shape = engine::model_shape(file);
    const engine::PlanParams base{.n_ctx = 128, .n_threads = 2, .device = "virtual", .n_gpu_layers = 3};
    engine::PlanParams q = base;
    q.tensor_overrides = model::cpu_moe_overrides(-1);
    const engine::Plan p = engine::make_plan(shape, q);
    const engine::Plan cpu = engine::make_plan(shape, {.n_ctx = 128, .n_threads = 2});
    EXPECT_EQ(p.device.n_host_expert_layers, 2);
    uint64_t routed = 0;
    for (const uint64_t b : shape.layer_routed_bytes) routed += b;
    EXPECT_GT(routed, shape.expert_bytes);  // and the routers
    EXPECT_EQ(p.device.host_experts, routed);
    // Every layer and the output on the device: the host keeps the globals (the embedding; the output
    // when tied to it) and the routed-expert blocks.
    EXPECT_EQ(p.weights_resident, shape.global_bytes - (shape.tied_output ? 0 : shape.output_bytes) + routed);
    EXPECT_LT(p.weights_resident, cpu.weights_resident);
    const std::string text = engine::plan_text(p, "test");
    EXPECT_TRUE(has(text, "the routed experts of 2 offloaded layers")) << text;
    EXPECT_TRUE(has(text, "the routed experts of 2 of them stay on the host")) << text;
    const auto json = engine::plan_json(p, "test");
    EXPECT_EQ(json.at("devices").at(1).at("host_expert_layers"), 2);
    EXPECT_EQ(json.at("devices").at(1).at("host_experts"), routed);
    // The experts on the device: copied with their layers (the routers stay on the host), their
    // buffers in its scratch.
    const engine::Plan d = engine::make_plan(shape, base);
    EXPECT_EQ(d.device.n_host_expert_layers, 0);
    EXPECT_EQ(d.device.weights, model::device_weight_bytes(file, shape.hp, 3));
    uint64_t routers = 0, routed_on_device = 0;
    for (const uint64_t b : shape.layer_router_bytes) routers += b;
    for (const uint64_t b : shape.layer_routed_device_bytes) routed_on_device += b;
    EXPECT_GT(routers, 0u);
    EXPECT_EQ(d.weights_resident, shape.global_bytes - (shape.tied_output ? 0 : shape.output_bytes) + routers);
    EXPECT_EQ(d.device.weights, p.device.weights + routed_on_device);
    EXPECT_GT(d.device.scratch, p.device.scratch);
    const std::string dtext = engine::plan_text(d, "test");
    EXPECT_TRUE(has(dtext, "resident, those of 2 offloaded layers on virtual")) << dtext;
    EXPECT_FALSE(has(dtext, "stay on the host")) << dtext;
    // Auto (-ngl unset): every layer and the output, with the experts there or on the host.
    engine::PlanParams a = base;
    a.n_gpu_layers = -1;
    EXPECT_EQ(engine::make_plan(shape, a).device.n_layer, 2);
    a.tensor_overrides = model::cpu_moe_overrides(-1);
    EXPECT_EQ(engine::make_plan(shape, a).device.n_layer, 2);
    EXPECT_TRUE(engine::make_plan(shape, a).device.output);
}

}  // namespace
}  // namespace fitllm
