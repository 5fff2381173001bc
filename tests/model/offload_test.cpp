// Layers on a device (model::LoadOptions::offload; backend/virtual_device.h): every split of the
// layers between the host and the virtual device, with the KV on either, gives the logits and the
// greedy tokens of the CPU-only model; budgets are per device; with everything offloaded the host's
// charges do not grow with the context; the copied layers' mapped pages are given back.
//
// Tolerance: none. The virtual device runs the ops:: kernels on copies of the same bytes, and a
// batch's rows cross devices by memcpy, so the logits are equal bit for bit.
#include "model/offload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/virtual_device.h"
#include "engine/prefault.h"
#include "gguf/gguf_reader.h"
#include "io/mapped_file.h"
#include "kv/cache.h"
#include "memory/pool.h"
#include "model/model.h"
#include "model/tiny_gemma3.h"
#include "model/tiny_llama.h"
#include "ops/thread_pool.h"
#include "quant/ggml_type.h"
#include "test_support.h"

namespace fitllm {
namespace {

namespace fs = std::filesystem;

struct ScriptRun {
    std::vector<float> logits;    // every row asked for, in order
    std::vector<int32_t> greedy;  // the greedy tokens of sequence 0
};

int32_t argmax(const float* row, int n) {
    return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

kv::CacheParams cache_params(int n_seq, int n_cells, quant::GgmlType type) {
    kv::CacheParams p;
    p.n_cells = n_cells;
    p.n_seq_max = n_seq;
    p.block_size = 4;
    p.type_k = p.type_v = type;
    return p;
}

// Greedy decoding of one sequence, then three sequences in one batch (interleaved prompts, flagged
// outputs), decode steps of all three together, and a context shift of sequence 0 (seq_rm +
// seq_add, so K is re-rotated) before two more steps.
ScriptRun run_script(model::Model& m, int n_cells, quant::GgmlType kv_type, ops::ThreadPool& pool, int greedy_steps) {
    const int V = m.n_vocab();
    ScriptRun r;
    std::vector<float> row(static_cast<size_t>(V) * 3);
    {
        kv::ModelCache cache = m.make_cache(cache_params(1, n_cells, kv_type), 16);
        std::vector<int32_t> tokens = {1, 7, 3, 9, 12, 5};
        std::vector<int32_t> pos(tokens.size());
        for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
        m.forward(tokens, pos, cache, row.data(), false, pool);
        for (int s = 0; s < greedy_steps; ++s) {
            r.logits.insert(r.logits.end(), row.begin(), row.begin() + V);
            const int32_t t = argmax(row.data(), V) % std::min(V, 40);  // tiny vocabularies: stay in range
            const int32_t p = static_cast<int32_t>(tokens.size());
            r.greedy.push_back(argmax(row.data(), V));
            tokens.push_back(t);
            m.forward(std::span(&t, 1), std::span(&p, 1), cache, row.data(), false, pool);
        }
    }
    kv::ModelCache cache = m.make_cache(cache_params(3, n_cells, kv_type), 16);
    const std::vector<std::vector<int32_t>> prompts = {{1, 7, 3, 39, 0, 12, 5}, {2, 9, 4}, {30, 31, 6, 6, 18}};
    std::vector<int32_t> tokens, pos;
    std::vector<kv::SeqId> seq;
    std::vector<uint8_t> out;
    std::vector<int32_t> next(3, 0);
    for (size_t i = 0; i < 7; ++i) {
        for (size_t s = 0; s < 3; ++s) {
            if (i >= prompts[s].size()) continue;
            tokens.push_back(prompts[s][i]);
            pos.push_back(static_cast<int32_t>(i));
            seq.push_back(static_cast<kv::SeqId>(s));
            out.push_back(i + 1 == prompts[s].size() ? 1 : 0);
        }
    }
    for (size_t s = 0; s < 3; ++s) next[s] = static_cast<int32_t>(prompts[s].size());
    m.forward({.tokens = tokens, .positions = pos, .seq_ids = seq, .output = out}, cache, row.data(), pool);
    r.logits.insert(r.logits.end(), row.begin(), row.end());
    const auto step = [&](int i) {
        std::vector<int32_t> t = {static_cast<int32_t>(3 + i), static_cast<int32_t>(11 + i),
                                  static_cast<int32_t>(20 + i)};
        std::vector<kv::SeqId> s = {0, 1, 2};
        m.forward({.tokens = t, .positions = next, .seq_ids = s, .all_logits = true}, cache, row.data(), pool);
        r.logits.insert(r.logits.end(), row.begin(), row.end());
        for (int32_t& p : next) ++p;
    };
    for (int i = 0; i < 3; ++i) step(i);
    cache.seq_rm(0, 1, 3);  // drop two tokens of sequence 0 and move the rest back
    cache.seq_add(0, 3, -1, -2);
    next[0] -= 2;
    for (int i = 3; i < 5; ++i) step(i);
    return r;
}

struct Case {
    std::string name;
    std::vector<std::byte> bytes;  // a generated model, or empty
    fs::path path;                 // a model file
};

std::vector<Case> tiny_cases() {
    std::vector<Case> cases = {
        {"generated gemma3, 6 layers", test::tiny_gemma3_bytes({.n_layer = 6}), {}},
        {"generated llama, rope_freqs, tied", test::tiny_llama_bytes({.tied = true, .rope_freqs = true}), {}},
    };
    for (const char* f :
         {"tiny-llama-f16.gguf", "tiny-llama-q4_k_m.gguf", "tiny-llama-q8_0.gguf", "tiny-qwen2-q4_0.gguf",
          "tiny-qwen2-q6_k.gguf", "tiny-gemma2-q8_0.gguf", "tiny-phi3-q4_k_m.gguf", "tiny-phi3-longrope-q8_0.gguf",
          "tiny-granite-q8_0.gguf", "tiny-olmo2-q4_k_m.gguf", "tiny-smollm3-q8_0.gguf", "tiny-mistral3-q8_0.gguf"}) {
        cases.push_back({f, {}, test::source_dir() / "tests/model/data" / f});
    }
    return cases;
}

gguf::GgufFile open_case(const Case& c) {
    return c.path.empty() ? gguf::GgufFile::parse(c.bytes, c.name) : gguf::GgufFile::open(c.path.string());
}

// Fills the host bytes of the tensors copied to the device (but the token embedding and
// the RoPE factors, which the host reads too) with NaNs.
void poison_offloaded(const gguf::GgufFile& file, const model::Hparams& hp, int ngl, std::vector<std::byte>& bytes) {
    for (const std::string& name : model::device_tensor_names(file, hp, ngl)) {
        if (name == "token_embd.weight" || name == "rope_freqs.weight" || name == "rope_factors_long.weight" ||
            name == "rope_factors_short.weight")
            continue;
        const gguf::TensorInfo& t = *file.find_tensor(name);
        std::fill_n(bytes.begin() + static_cast<std::ptrdiff_t>(file.data_offset() + t.offset), t.n_bytes,
                    std::byte{0xFF});
    }
}

void expect_same(const ScriptRun& want, const ScriptRun& got) {
    ASSERT_EQ(want.logits.size(), got.logits.size());
    EXPECT_EQ(want.greedy, got.greedy);
    for (size_t i = 0; i < want.logits.size(); ++i) {
        ASSERT_EQ(want.logits[i], got.logits[i]) << "logit " << i;
    }
}

// Every split n_offload_layers = 0 .. n_layer + 1, the KV on the device and on the host, f16 and
// q8_0 K/V, and small (windowed layers in the full pool) and large caches.
TEST(ModelOffload, EverySplitGivesTheLogitsOfTheCpu) {
    ops::ThreadPool pool(2);
    for (const Case& c : tiny_cases()) {
        SCOPED_TRACE(c.name);
        const gguf::GgufFile file = open_case(c);
        const auto cpu = model::Model::load(file);
        const int n_layer = cpu->hparams().n_layer;
        // q8_0 K/V needs heads of whole 32-value blocks; the tiny Gemma's are 16 wide: f32 then.
        const auto other = cpu->hparams().head_dim % 32 == 0 ? quant::GgmlType::Q8_0 : quant::GgmlType::F32;
        for (const auto kv_type : {quant::GgmlType::F16, other}) {
            for (const int n_cells : {64, 256}) {
                const ScriptRun want = run_script(*cpu, n_cells, kv_type, pool, 6);
                for (int ngl = 0; ngl <= n_layer + 1; ++ngl) {
                    for (const bool offload_kv : {true, false}) {
                        SCOPED_TRACE("ngl " + std::to_string(ngl) + (offload_kv ? ", kv on device" : ", kv on host") +
                                     ", " + std::to_string(n_cells) + " cells, " +
                                     std::string(quant::type_name(static_cast<uint32_t>(kv_type))));
                        backend::VirtualDevice dev("virtual", 256 << 20);
                        // A generated model gets a private copy whose offloaded tensors are then
                        // overwritten with NaNs: the host must never read them again.
                        std::vector<std::byte> own = c.bytes;
                        const gguf::GgufFile private_file =
                            c.path.empty() ? gguf::GgufFile::parse(own, c.name) : open_case(c);
                        auto m = model::Model::load(
                            private_file, {.offload = &dev, .n_offload_layers = ngl, .offload_kv = offload_kv});
                        EXPECT_EQ(dev.memory().pool(memory::pool_names::kWeights).live(),
                                  model::device_weight_bytes(private_file, m->hparams(), ngl));
                        if (c.path.empty()) {
                            // The CPU's answer for these very bytes (F32 kernels' sums depend on
                            // the weights' alignment, which the copy changed), before the poison.
                            const auto cpu_here = model::Model::load(private_file);
                            const ScriptRun want_here = run_script(*cpu_here, n_cells, kv_type, pool, 6);
                            poison_offloaded(private_file, m->hparams(), ngl, own);
                            expect_same(want_here, run_script(*m, n_cells, kv_type, pool, 6));
                        } else {
                            expect_same(want, run_script(*m, n_cells, kv_type, pool, 6));
                        }
                        // The script's largest batch is 15 tokens, and at most 3 rows want logits.
                        EXPECT_EQ(dev.memory().pool(memory::pool_names::kScratch).live() - dev.op_scratch_bytes(),
                                  model::device_scratch_bytes(m->hparams(), ngl, 15, 3));
                        if (HasFatalFailure()) return;
                    }
                }
            }
        }
    }
}

// A matrix of a type the device has no matmul for (Backend::matmul_supports; CUDA lacks the
// i-quants, for one) is refused at load, naming it and the ways out, before anything is copied;
// kept on the host by -ot, the same file loads and gives the CPU's logits.
TEST(ModelOffload, AMatrixTheDeviceCannotMultiplyIsRefusedAtLoad) {
    ops::ThreadPool pool(2);
    const gguf::GgufFile file =
        gguf::GgufFile::open((test::source_dir() / "tests/model/data/tiny-llama-q4_k_m.gguf").string());
    const auto cpu = model::Model::load(file);
    const int n_layer = cpu->hparams().n_layer;
    backend::VirtualDevice dev("virtual", 256 << 20);
    dev.limit_matmul_types({quant::GgmlType::F32, quant::GgmlType::F16, quant::GgmlType::Q4_K});  // no Q6_K
    try {
        model::Model::load(file, {.offload = &dev, .n_offload_layers = n_layer});
        ADD_FAILURE() << "loaded";
    } catch (const std::invalid_argument& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("is Q6_K, which virtual has no matmul for"), std::string::npos) << what;
        EXPECT_NE(what.find("-ot '"), std::string::npos) << what;
    }
    EXPECT_EQ(dev.allocated_bytes(), 0u);  // nothing copied
    // Q4_K_M keeps some ffn_down and attn_v matrices in Q6_K: on the host by -ot, the rest offloads.
    auto m = model::Model::load(
        file, {.offload = &dev, .n_offload_layers = n_layer, .tensor_overrides = {{"ffn_down|attn_v", "CPU", "-ot"}}});
    expect_same(run_script(*cpu, 64, quant::GgmlType::F16, pool, 4), run_script(*m, 64, quant::GgmlType::F16, pool, 4));
}

TEST(ModelOffload, DemoModelSplitsGiveTheLogitsOfTheCpu) {
    const auto path = test::demo_model();
    if (!path) GTEST_SKIP() << "demo model absent (scripts/setup.sh downloads it)";
    ops::ThreadPool pool(2);
    const gguf::GgufFile file = gguf::GgufFile::open(path->string());
    const auto cpu = model::Model::load(file);
    const int n_layer = cpu->hparams().n_layer;
    const ScriptRun want = run_script(*cpu, 64, quant::GgmlType::F16, pool, 4);
    // A few splits (the tiny models cover every one): one layer, half with the KV on the host, all
    // layers, and the output too with the KV on either.
    const std::pair<int, bool> splits[] = {
        {1, true}, {n_layer / 2, false}, {n_layer, true}, {n_layer + 1, true}, {n_layer + 1, false}};
    for (const auto& [ngl, offload_kv] : splits) {
        SCOPED_TRACE("ngl " + std::to_string(ngl) + (offload_kv ? ", kv on device" : ", kv on host"));
        backend::VirtualDevice dev("virtual", 1ull << 30);
        auto m = model::Model::load(file, {.offload = &dev, .n_offload_layers = ngl, .offload_kv = offload_kv});
        expect_same(want, run_script(*m, 64, quant::GgmlType::F16, pool, 4));
        if (HasFatalFailure()) return;
    }
}

// A unified device (shared memory) charges the host's pools, copies no weights (it reads the
// mapped tensors in place: nothing given back, nothing charged to "weights", none of its own
// buffers holds a weight) and gives the CPU's logits bit for bit at every split, KV on either side.
TEST(ModelOffload, AUnifiedDeviceSharesTheHostsBudgetAndWeights) {
    ops::ThreadPool pool(2);
    for (const Case& c : tiny_cases()) {
        SCOPED_TRACE(c.name);
        const gguf::GgufFile file = open_case(c);
        const auto cpu = model::Model::load(file);
        const int n_layer = cpu->hparams().n_layer;
        const ScriptRun want = run_script(*cpu, 64, quant::GgmlType::F16, pool, 4);
        for (int ngl = 0; ngl <= n_layer + 1; ++ngl) {
            for (const bool offload_kv : {true, false}) {
                SCOPED_TRACE("ngl " + std::to_string(ngl) + (offload_kv ? ", kv on device" : ", kv on host"));
                memory::Device host("host", 1ull << 30);
                const auto dev = backend::open_unified_device("virtual", host);
                ASSERT_TRUE(dev->unified());
                EXPECT_EQ(dev->name(), "virtual-unified");
                EXPECT_EQ(&dev->memory(), &host);
                auto m = model::Model::load(
                    file, {.device = &host, .offload = dev.get(), .n_offload_layers = ngl, .offload_kv = offload_kv});
                const auto& virt = dynamic_cast<const backend::VirtualDevice&>(*dev);
                EXPECT_EQ(virt.allocated_bytes(), 0u);  // no copies
                EXPECT_EQ(host.pool(memory::pool_names::kWeights).live(), 0u);
                EXPECT_EQ(model::device_weight_bytes(file, m->hparams(), ngl, /*unified=*/true), 0u);
                EXPECT_TRUE(m->offloaded_ranges().empty());  // nothing given back: the device reads them
                expect_same(want, run_script(*m, 64, quant::GgmlType::F16, pool, 4));
                // Its buffers are the activations of the largest batch (15 tokens, 3 logits rows),
                // charged to the host's scratch pool with its op scratch.
                EXPECT_EQ(virt.allocated_bytes(), model::device_scratch_bytes(m->hparams(), ngl, 15, 3));
                EXPECT_GE(host.pool(memory::pool_names::kScratch).live(),
                          virt.allocated_bytes() + virt.op_scratch_bytes());
                if (HasFatalFailure()) return;
            }
        }
    }
}

TEST(ModelOffload, UnifiedDevicesByName) {
    memory::Device host("host", 1ull << 20);
    EXPECT_EQ(backend::open_unified_device("virtual", host)->name(), "virtual-unified");
    EXPECT_EQ(backend::open_unified_device("virtual2", host)->name(), "virtual2-unified");
    EXPECT_EQ(backend::open_unified_device("virtual-unified", host)->name(), "virtual-unified");
    EXPECT_THROW(backend::open_unified_device("nosuch", host), std::invalid_argument);
    // It has no capacity of its own to open it with.
    EXPECT_THROW(backend::open_device("virtual-unified", 1 << 20), std::invalid_argument);
    EXPECT_FALSE(backend::device_is_integrated("virtual"));
    // Only a unified device maps host memory; the others get copies.
    const auto unified = backend::open_unified_device("virtual", host);
    const int x = 7;
    EXPECT_EQ(unified->map_host(&x, sizeof x), &x);
    EXPECT_THROW(backend::open_device("virtual", 1 << 20)->map_host(&x, sizeof x), std::logic_error);
}

// Streaming applies to the last layers left on the host: layer 0 streamed, layer 1 (and the
// output) on the device.
TEST(ModelOffload, StreamedHostLayersAndDeviceLayersTogether) {
    ops::ThreadPool pool(2);
    const gguf::GgufFile file =
        gguf::GgufFile::open((test::source_dir() / "tests/model/data/tiny-llama-q4_k_m.gguf").string());
    const auto cpu = model::Model::load(file);
    const ScriptRun want = run_script(*cpu, 64, quant::GgmlType::F16, pool, 4);
    for (const int ngl : {1, 3}) {
        SCOPED_TRACE("ngl " + std::to_string(ngl));
        backend::VirtualDevice dev("virtual", 64 << 20);
        const int n_streamed = ngl == 1 ? 1 : 0;
        auto m = model::Model::load(file, {.n_streamed_layers = n_streamed, .offload = &dev, .n_offload_layers = ngl});
        EXPECT_EQ(m->n_streamed_layers(), n_streamed);
        expect_same(want, run_script(*m, 64, quant::GgmlType::F16, pool, 4));
    }
}

TEST(ModelOffload, ADeviceWithoutRoomIsABudgetErrorNamingItsPool) {
    const auto bytes = test::tiny_llama_bytes();
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    {
        backend::VirtualDevice dev("virtual7", 4096);
        try {
            model::Model::load(file, {.offload = &dev, .n_offload_layers = 2});
            FAIL() << "two layers fit in 4 KiB";
        } catch (const memory::BudgetError& e) {
            EXPECT_EQ(e.pool(), "weights");
            EXPECT_NE(std::string(e.what()).find("device 'virtual7'"), std::string::npos) << e.what();
        }
        EXPECT_EQ(dev.memory().live(), 0u);  // what was copied before the refusal went back
    }
    {
        // Room for the weights but not the K/V of a long context.
        const auto probe = model::Model::load(file);
        const uint64_t weights = model::device_weight_bytes(file, probe->hparams(), 2);
        backend::VirtualDevice dev("virtual", weights + (64 << 10));
        auto m = model::Model::load(file, {.offload = &dev, .n_offload_layers = 2});
        try {
            m->make_cache(cache_params(1, 4096, quant::GgmlType::F16), 16);
            FAIL() << "4096 cells of K/V fit in 64 KiB";
        } catch (const memory::BudgetError& e) {
            EXPECT_EQ(e.pool(), "kv");
            EXPECT_NE(std::string(e.what()).find("device 'virtual'"), std::string::npos) << e.what();
        }
        EXPECT_EQ(dev.memory().pool(memory::pool_names::kKv).live(), 0u);
        // Without offload_kv the same cache is the host's.
        m.reset();
        auto host_kv = model::Model::load(file, {.offload = &dev, .n_offload_layers = 2, .offload_kv = false});
        EXPECT_NO_THROW(host_kv->make_cache(cache_params(1, 4096, quant::GgmlType::F16), 16));
    }
    const auto bytes2 = test::tiny_llama_bytes();
    const gguf::GgufFile file2 = gguf::GgufFile::parse(bytes2, "tiny.gguf");
    backend::VirtualDevice dev("virtual", 64 << 20);
    EXPECT_THROW(model::Model::load(file2, {.n_offload_layers = 1}), std::invalid_argument);  // no device
    EXPECT_THROW(model::Model::load(file2, {.offload = &dev, .n_offload_layers = -1}), std::invalid_argument);
    // Streaming applies to the layers left on the host only.
    EXPECT_THROW(model::Model::load(file2, {.n_streamed_layers = 2, .offload = &dev, .n_offload_layers = 1}),
                 std::invalid_argument);
}

// With every layer and the output on the device, the host's charges are the same at 64 and at
// 2048 cells of context: only the device's "kv" pool grows.
TEST(ModelOffload, HostChargesStayFlatAsTheContextGrows) {
    const auto bytes = test::tiny_gemma3_bytes({.n_layer = 6});
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "tiny.gguf");
    ops::ThreadPool pool(2);
    std::vector<uint64_t> host_live, device_kv;
    for (const int n_cells : {64, 2048}) {
        memory::Device host("host", 1ull << 30);
        backend::VirtualDevice dev("virtual", 1ull << 30);
        auto m = model::Model::load(file, {.device = &host, .offload = &dev, .n_offload_layers = 7});
        kv::CacheParams p = cache_params(1, n_cells, quant::GgmlType::F16);
        p.pool = &host.pool(memory::pool_names::kKv);
        kv::ModelCache cache = m->make_cache(p, 16);
        std::vector<int32_t> tokens(40), pos(40);
        for (int i = 0; i < 40; ++i) tokens[static_cast<size_t>(i)] = i % 40, pos[static_cast<size_t>(i)] = i;
        std::vector<float> logits(static_cast<size_t>(m->n_vocab()));
        m->forward(std::span(tokens).first(16), std::span(pos).first(16), cache, logits.data(), false, pool);
        for (size_t i = 16; i < 40; ++i) {
            m->forward(std::span(tokens).subspan(i, 1), std::span(pos).subspan(i, 1), cache, logits.data(), false,
                       pool);
        }
        EXPECT_EQ(host.pool(memory::pool_names::kKv).peak(), 0u);
        // What a plan computes from the header alone is what the device's "kv" pool holds.
        const std::vector<size_t> planned = kv::ModelCache::bytes_per_device(
            m->cache_layers(), m->cache_windows(), p, 16, model::cache_layer_devices(m->hparams(), 7, true));
        EXPECT_EQ(planned[0], 0u);
        EXPECT_EQ(planned[1], dev.memory().pool(memory::pool_names::kKv).live());
        host_live.push_back(host.peak());
        device_kv.push_back(dev.memory().pool(memory::pool_names::kKv).live());
    }
    EXPECT_EQ(host_live[0], host_live[1]);
    EXPECT_GT(device_kv[1], device_kv[0]);
}

// Resident bytes of this process in the mapping that holds `address` (/proc/self/smaps "Rss"), or
// -1 when it cannot be read.
int64_t mapping_rss(const void* address) {
    std::ifstream smaps("/proc/self/smaps");
    const auto at = reinterpret_cast<uintptr_t>(address);
    std::string line;
    bool inside = false;
    while (std::getline(smaps, line)) {
        uintptr_t lo = 0, hi = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && line.find(':') != 3) {
            inside = at >= lo && at < hi;
            continue;
        }
        long kb = 0;
        if (inside && std::sscanf(line.c_str(), "Rss: %ld kB", &kb) == 1) return kb * 1024;
    }
    return -1;
}

// The tensors copied to the device leave the process (and, where the file system drops clean
// pages, the page cache), and prefault and a forward pass leave them out. A private copy of the
// file, so no other test's use of it counts.
TEST(ModelOffload, CopiedLayersGiveTheirMappedPagesBack) {
    test::TempDir dir;
    const fs::path path = dir / "tiny.gguf";
    fs::copy_file(test::source_dir() / "tests/model/data/tiny-llama-f16.gguf", path);
    gguf::GgufFile file = gguf::GgufFile::open(path.string());
    ASSERT_TRUE(file.mapping()->is_file_mapping());
    engine::prefault(file);
    const int64_t rss_before = mapping_rss(file.bytes().data());
    if (rss_before < 0) GTEST_SKIP() << "/proc/self/smaps cannot be read here";
    ops::ThreadPool pool(1);
    backend::VirtualDevice dev("virtual", 64 << 20);
    auto m = model::Model::load(file, {.offload = &dev, .n_offload_layers = 3});  // both layers and the output
    const std::vector<model::FileRange> ranges = m->offloaded_ranges();
    ASSERT_FALSE(ranges.empty());
    uint64_t released = 0;
    const uint64_t page = io::MappedFile::page_size();
    for (const model::FileRange& r : ranges) {
        const uint64_t from = (r.offset + page - 1) / page * page;
        const uint64_t to = (r.offset + r.length) / page * page;
        if (to > from) released += to - from;
    }
    ASSERT_GT(released, 0u);
    const auto expect_gone = [&] {
        EXPECT_LE(mapping_rss(file.bytes().data()), rss_before - static_cast<int64_t>(released));
        const io::MappedFile& map = *file.mapping();
        const bool cache_drops = map.resident_bytes(0, map.size()) < map.size();
        for (const model::FileRange& r : ranges) {
            const uint64_t from = (r.offset + page - 1) / page * page;
            const uint64_t to = (r.offset + r.length) / page * page;
            if (cache_drops && to > from) {
                EXPECT_EQ(map.resident_bytes(from, to - from), 0u) << "range at " << r.offset;
            }
        }
    };
    expect_gone();
    engine::prefault(file, *m);
    kv::ModelCache cache = m->make_cache(cache_params(1, 64, quant::GgmlType::F16), 16);
    std::vector<int32_t> tokens = {1, 2, 3}, pos = {0, 1, 2};
    std::vector<float> logits(static_cast<size_t>(m->n_vocab()));
    m->forward(tokens, pos, cache, logits.data(), false, pool);
    expect_gone();
}

}  // namespace
}  // namespace fitllm
