// fitllm's kernels against llama.cpp's own (the ggml libraries of PyPI's llama-cpp-python in the
// project venv, opened with dlopen): dequantization and activation quantization must give the
// same bits, the dots the same sums within the variant tolerance. Skipped where the venv is absent.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/attention_f16.h"
#include "ops/attention_f16_tiled.h"
#include "ops/matmul.h"
#include "ops/scratch.h"
#include "ops/thread_pool.h"
#include "quant/dot.h"
#include "quant/gemm_batch_q4k.h"
#include "quant/quantize.h"
#include "quant/quantize_ref.h"
#include "quant_test_data.h"
#include "test_support.h"

namespace fitllm::quant {
namespace {

namespace fs = std::filesystem;

// $FITLLM_LLAMA_CPP_LIB, else the venv's site-packages/llama_cpp/lib (as bench/llama_cpp_lib.cpp).
std::string ggml_lib_dir() {
    if (const char* env = std::getenv("FITLLM_LLAMA_CPP_LIB")) return env;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(fitllm::test::source_dir() / ".venv" / "lib", ec)) {
        const fs::path dir = entry.path() / "site-packages" / "llama_cpp" / "lib";
        if (fs::exists(dir / "libggml-cpu.so")) return dir.string();
    }
    return {};
}

// The two ggml libraries, opened once for the whole test binary and never closed (ggml keeps
// global state; unloading it is not worth the risk in a test).
struct Ggml {
    void* base = nullptr;
    void* cpu = nullptr;
    template <typename Fn>
    Fn base_fn(const char* name) const {
        return reinterpret_cast<Fn>(dlsym(base, name));
    }
    template <typename Fn>
    Fn cpu_fn(const char* name) const {
        return reinterpret_cast<Fn>(dlsym(cpu, name));
    }
};
const Ggml* ggml() {
    static const Ggml* g = [] {
        const std::string dir = ggml_lib_dir();
        if (dir.empty()) return static_cast<Ggml*>(nullptr);
        auto* lib = new Ggml;
        lib->base = dlopen((dir + "/libggml-base.so").c_str(), RTLD_NOW | RTLD_LOCAL);
        lib->cpu = dlopen((dir + "/libggml-cpu.so").c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!lib->base || !lib->cpu) return static_cast<Ggml*>(nullptr);
        if (auto init = lib->cpu_fn<void (*)()>("ggml_cpu_init")) init();
        return lib;
    }();
    return g;
}

#define REQUIRE_GGML()                                                                 \
    if (ggml() == nullptr)                                                             \
    GTEST_SKIP() << "llama.cpp's ggml libraries not found (scripts/setup.sh --oracle " \
                    "installs llama-cpp-python; FITLLM_LLAMA_CPP_LIB overrides)"

using DequantFn = void (*)(const void*, float*, int64_t);
using QuantFn = void (*)(const float*, void*, int64_t);
using VecDotFn = void (*)(int, float*, size_t, const void*, size_t, const void*, size_t, int);

struct QuantName {
    GgmlType type;
    const char* ggml;  // ggml's spelling in function names
};
constexpr QuantName kQuantTypes[] = {
    {GgmlType::Q4_0, "q4_0"},       {GgmlType::Q4_1, "q4_1"},     {GgmlType::Q5_0, "q5_0"},
    {GgmlType::Q5_1, "q5_1"},       {GgmlType::Q8_0, "q8_0"},     {GgmlType::Q2_K, "q2_K"},
    {GgmlType::Q3_K, "q3_K"},       {GgmlType::Q4_K, "q4_K"},     {GgmlType::Q5_K, "q5_K"},
    {GgmlType::Q6_K, "q6_K"},       {GgmlType::IQ4_NL, "iq4_nl"}, {GgmlType::IQ4_XS, "iq4_xs"},
    {GgmlType::TQ1_0, "tq1_0"},     {GgmlType::TQ2_0, "tq2_0"},   {GgmlType::MXFP4, "mxfp4"},
    {GgmlType::IQ3_XXS, "iq3_xxs"}, {GgmlType::IQ3_S, "iq3_s"},   {GgmlType::IQ2_XXS, "iq2_xxs"},
    {GgmlType::IQ2_XS, "iq2_xs"},   {GgmlType::IQ2_S, "iq2_s"},   {GgmlType::IQ1_S, "iq1_s"},
    {GgmlType::IQ1_M, "iq1_m"},
};
const char* ggml_name(GgmlType t) {
    switch (t) {
        case GgmlType::Q8_1:
            return "q8_1";
        case GgmlType::Q8_K:
            return "q8_K";
        default:
            for (const auto& q : kQuantTypes) {
                if (q.type == t) return q.ggml;
            }
            return "?";
    }
}

bool same_bits(float a, float b) {
    return std::memcmp(&a, &b, sizeof a) == 0;
}

TEST(DequantizeVsGgml, SameFloatsForRandomBlocks) {
    REQUIRE_GGML();
    const int n = 8192;
    for (const auto& q : kQuantTypes) {
        SCOPED_TRACE(q.ggml);
        auto fn = ggml()->base_fn<DequantFn>(("dequantize_row_" + std::string(q.ggml)).c_str());
        ASSERT_NE(fn, nullptr);
        const auto blocks = test::random_blocks(q.type, test::bytes_of_row(q.type, n), 77);
        std::vector<float> theirs(n);
        fn(blocks.data(), theirs.data(), n);
        const auto ours = test::dequantized(q.type, blocks.data(), n);
        int differ = 0;
        for (int i = 0; i < n; ++i) differ += same_bits(ours[i], theirs[i]) ? 0 : 1;
        EXPECT_EQ(differ, 0) << "first: " << [&] {
            for (int i = 0; i < n; ++i) {
                if (!same_bits(ours[i], theirs[i])) {
                    return std::to_string(i) + ": " + std::to_string(ours[i]) + " vs " + std::to_string(theirs[i]);
                }
            }
            return std::string();
        }();
    }
}

// The activation formats: the bytes llama.cpp's CPU backend feeds its dots (quantize_row_q8_*) and
// those of its reference quantizer.
TEST(QuantizeVsGgml, ActivationsHaveTheSameBytes) {
    REQUIRE_GGML();
    const int n = 8192;
    const auto x = test::gaussian(n, 5, 0.7f);
    for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K}) {
        SCOPED_TRACE(ggml_name(t));
        const size_t bytes = test::bytes_of_row(t, n);
        std::vector<uint8_t> ours(bytes), ref(bytes), cpu(bytes);
        quantize_row(t, x.data(), ours.data(), n);
        auto ref_fn = ggml()->base_fn<QuantFn>(("quantize_row_" + std::string(ggml_name(t)) + "_ref").c_str());
        auto cpu_fn = ggml()->cpu_fn<QuantFn>(("quantize_row_" + std::string(ggml_name(t))).c_str());
        ASSERT_TRUE(ref_fn && cpu_fn);
        ref_fn(x.data(), ref.data(), n);
        cpu_fn(x.data(), cpu.data(), n);
        EXPECT_EQ(ours, ref);
        EXPECT_EQ(ours, cpu);
    }
}

// IQ4_NL rows as equal as llama.cpp defines them: blocks with d = 0 (max|x| < 1e-15) dequantize to
// zeros whatever their indices, which some llama.cpp versions leave uninitialized in
// quantize_row_iq4_nl_ref; all other blocks byte for byte. Returns the blocks that differ.
int differing_iq4_nl_blocks(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
    int differ = 0;
    for (size_t i = 0; i < a.size(); i += sizeof(BlockIQ4_NL)) {
        const bool zero_scale = a[i] == 0 && a[i + 1] == 0;
        const size_t bytes = zero_scale ? 2 : sizeof(BlockIQ4_NL);
        differ += std::memcmp(&a[i], &b[i], bytes) == 0 ? 0 : 1;
    }
    return differ;
}

// IQ4_NL, the KV cache format: quantize_row gives the bytes of llama.cpp's quantize_row_iq4_nl (what
// its CPU backend writes to the cache) and of quantize_row_iq4_nl_ref; quantize_row_iq4_nl_searched
// those of quantize_iq4_nl without an importance matrix. Gaussian rows at two scales, a zero block,
// a block of equal values, blocks below the 1e-15 cutoff and tiny ones above it.
TEST(QuantizeVsGgml, Iq4NlHasTheSameBytes) {
    REQUIRE_GGML();
    using RowsFn = size_t (*)(const float*, void*, int64_t, int64_t, const float*);
    auto cpu_fn = ggml()->cpu_fn<QuantFn>("quantize_row_iq4_nl");
    auto ref_fn = ggml()->base_fn<QuantFn>("quantize_row_iq4_nl_ref");
    auto rows_fn = ggml()->base_fn<RowsFn>("quantize_iq4_nl");
    ASSERT_TRUE(cpu_fn && ref_fn && rows_fn);
    const int n = 8192;
    for (uint32_t seed = 0; seed < 4; ++seed) {
        auto x = test::gaussian(n, 40 + seed, seed % 2 == 0 ? 1.0f : 0.02f);
        if (seed == 3) {
            for (int i = 0; i < 32; ++i) x[i] = 0.0f;
            for (int i = 32; i < 64; ++i) x[i] = -0.75f;
            for (int i = 64; i < 96; ++i) x[i] *= 1e-17f;
            for (int i = 96; i < 128; ++i) x[i] *= 1e-12f;
        }
        const size_t bytes = test::bytes_of_row(GgmlType::IQ4_NL, n);
        std::vector<uint8_t> ours(bytes, 0xAA), cpu(bytes, 0x55), ref(bytes, 0x66), searched(bytes, 0x77),
            theirs_searched(bytes, 0x88);
        quantize_row(GgmlType::IQ4_NL, x.data(), ours.data(), n);
        cpu_fn(x.data(), cpu.data(), n);
        ref_fn(x.data(), ref.data(), n);
        quantize_row_iq4_nl_searched(x.data(), searched.data(), n);
        rows_fn(x.data(), theirs_searched.data(), 1, n, nullptr);
        EXPECT_EQ(differing_iq4_nl_blocks(ours, cpu), 0) << "seed " << seed;
        EXPECT_EQ(differing_iq4_nl_blocks(ours, ref), 0) << "seed " << seed;
        EXPECT_EQ(differing_iq4_nl_blocks(searched, theirs_searched), 0) << "seed " << seed;
    }
}

// TQ1_0, TQ2_0, MXFP4 weights: quantize_row gives the bytes of llama.cpp's reference quantizers
// (quantize_row_*_ref, what llama-quantize runs for these types: they take no importance matrix).
// Gaussian rows at two scales, MXFP4 across exponents 2^-30 .. 2^6, a zero block, equal values,
// values exactly halfway between two ternary or e2m1 levels.
TEST(QuantizeVsGgml, TernaryAndMxfp4HaveTheSameBytes) {
    REQUIRE_GGML();
    const int n = 8192;
    for (GgmlType t : {GgmlType::TQ1_0, GgmlType::TQ2_0, GgmlType::MXFP4}) {
        auto ref_fn = ggml()->base_fn<QuantFn>(("quantize_row_" + std::string(ggml_name(t)) + "_ref").c_str());
        ASSERT_NE(ref_fn, nullptr) << ggml_name(t);
        for (uint32_t seed = 0; seed < 4; ++seed) {
            auto x = test::gaussian(n, 60 + seed, seed % 2 == 0 ? 1.0f : 0.02f);
            for (int i = 0; i < n; ++i) x[i] *= std::ldexp(1.0f, (i / 256) % 37 - 30);
            if (seed == 3) {
                for (int i = 0; i < 256; ++i) x[i] = 0.0f;
                for (int i = 256; i < 512; ++i) x[i] = -0.75f;
                for (int i = 512; i < 768; ++i) x[i] = static_cast<float>(i % 5 - 2) * 0.25f;   // +-0.5 of max
                for (int i = 768; i < 1024; ++i) x[i] = static_cast<float>(i % 13 - 6) * 0.5f;  // e2m1 midpoints
            }
            const size_t bytes = test::bytes_of_row(t, n);
            std::vector<uint8_t> ours(bytes, 0xAA), theirs(bytes, 0x55);
            quantize_row(t, x.data(), ours.data(), n);
            ref_fn(x.data(), theirs.data(), n);
            EXPECT_EQ(ours, theirs) << ggml_name(t) << " seed " << seed;
        }
    }
}

// The weight types whose dots follow ggml_vec_dot_*'s float order (dot_ref.cpp's lanes8): their
// results must be llama.cpp's bits. The others are compared within a tolerance: Q4_0, IQ4_NL, Q4_K
// and Q2_K follow llama.cpp's repacked gemv kernels instead (MatmulVsGgml below checks those),
// Q4_1 and Q5_1 keep their own order.
bool vec_dot_order(GgmlType t) {
    return t == GgmlType::Q8_0 || t == GgmlType::Q5_0 || t == GgmlType::Q3_K || t == GgmlType::Q5_K ||
           t == GgmlType::Q6_K || t == GgmlType::TQ1_0 || t == GgmlType::TQ2_0 || t == GgmlType::MXFP4 ||
           t == GgmlType::IQ3_XXS || t == GgmlType::IQ3_S || t == GgmlType::IQ2_XXS || t == GgmlType::IQ2_XS ||
           t == GgmlType::IQ2_S || t == GgmlType::IQ1_S || t == GgmlType::IQ1_M;
}

// Same sums: within 2e-6 of sum |w a| for every type, bit for bit for the vec_dot_order types.
TEST(DotVsGgml, SameSums) {
    REQUIRE_GGML();
    const CpuFeatures cpu = detect_cpu_features();
    for (const auto& q : kQuantTypes) {
        auto fn = ggml()->cpu_fn<VecDotFn>(
            ("ggml_vec_dot_" + std::string(q.ggml) + "_" + ggml_name(dot_activation_type(q.type))).c_str());
        ASSERT_NE(fn, nullptr) << q.ggml;
        for (int n : {256, 4096, 8192, 8192 + 32}) {
            if (n % traits(q.type).block_elements != 0) continue;
            const auto w = test::random_blocks(q.type, test::bytes_of_row(q.type, n), 9 + n);
            const GgmlType at = dot_activation_type(q.type);
            const auto a = test::gaussian(n, 10 + n);
            std::vector<uint8_t> act(test::bytes_of_row(at, n));
            quantize_row(at, a.data(), act.data(), n);
            const auto wf = test::dequantized(q.type, w.data(), n);
            const auto af = test::dequantized(at, act.data(), n);
            double abs_sum = 0;
            for (int i = 0; i < n; ++i) abs_sum += std::fabs(static_cast<double>(wf[i]) * af[i]);
            float theirs = 0;
            fn(n, &theirs, 0, w.data(), 0, act.data(), 0, 1);
            for (Isa isa : kAllIsas) {
                if (isa > cpu.best_isa()) continue;
                float ours = 0;
                select_dot(q.type, limit_to(cpu, isa)).fn(n, &ours, w.data(), act.data());
                EXPECT_NEAR(ours, theirs, 2e-6 * abs_sum) << q.ggml << " " << isa_name(isa) << " n=" << n;
                if (vec_dot_order(q.type)) {
                    EXPECT_TRUE(same_bits(ours, theirs))
                        << q.ggml << " " << isa_name(isa) << " n=" << n << ": " << ours << " vs " << theirs;
                }
            }
        }
    }
}

// ---- Whole matrix products through ggml's CPU backend ----
//
// llama.cpp does not run one kernel per weight type: its CPU backend repacks Q4_0, IQ4_NL, Q4_K (and
// Q2_K on AVX-512) weights whose row count is a multiple of 8 and runs its own gemv / gemm on them,
// hands batches of Q8_0, Q4_0, Q5_0, IQ4_NL and F16 to llamafile's sgemm, batches of 8 or more
// tokens of the other k-quants to its tiled kernels, and everything else to ggml_vec_dot. The only
// way to see what it computes is to run its matrix product: a ggml graph of one mul_mat on the CPU
// backend, with the weights in its repack buffer type as llama.cpp loads them.

// The few ggml types and calls the graph needs (ggml.h, ggml-backend.h; all opaque but one).
struct GgmlInitParams {
    size_t mem_size;
    void* mem_buffer;
    bool no_alloc;
};
using InitFn = void* (*)(GgmlInitParams);
using FreeFn = void (*)(void*);
using NewTensor2dFn = void* (*)(void*, int, int64_t, int64_t);
using MulMatFn = void* (*)(void*, void*, void*);
using NewGraphFn = void* (*)(void*);
using BuildForwardFn = void (*)(void*, void*);
using SizeFn = size_t (*)();
using BackendInitFn = void* (*)();
using SetThreadsFn = void (*)(void*, int);
using AllocTensorsFn = void* (*)(void*, void*);
using BufferTypeFn = void* (*)();
using TensorSetFn = void (*)(void*, const void*, size_t, size_t);
using TensorGetFn = void (*)(const void*, void*, size_t, size_t);
using GraphComputeFn = int (*)(void*, void*);
using BufferFreeFn = void (*)(void*);
using RegFn = void* (*)();
using RegDevGetFn = void* (*)(void*, size_t);
using RegProcFn = void* (*)(void*, const char*);
using ExtraBuftsFn = void** (*)(void*);

// Whether llama.cpp's loader puts such a weight matrix in the repack buffer on this CPU
// (ggml_repack_get_optimal_repack_type, x86: AVX2 for Q4_0 / IQ4_NL / Q4_K, AVX-512 for Q2_K).
bool repacked(GgmlType type, int rows) {
    const CpuFeatures cpu = detect_cpu_features();
    if (rows % 8 != 0) return false;
    switch (type) {
        case GgmlType::Q4_0:
        case GgmlType::IQ4_NL:
        case GgmlType::Q4_K:
            return cpu.best_isa() >= Isa::Avx2;
        case GgmlType::Q2_K:
            return cpu.best_isa() >= Isa::Avx512;
        default:
            return false;
    }
}

// ggml's CPU matrix product y[t][r] = w[r] . x[t] for a rows x n weight matrix of `type` and n_tok
// float activation rows, on `threads` threads, the weights in the repack buffer type (as llama.cpp
// loads them; types it does not repack stay in plain CPU memory). Empty on any failure.
std::vector<float> ggml_matmul(GgmlType type, const std::vector<uint8_t>& w, int rows, int n,
                               const std::vector<float>& x, int n_tok, int threads) {
    const Ggml* g = ggml();
    auto init = g->base_fn<InitFn>("ggml_init");
    auto free_ctx = g->base_fn<FreeFn>("ggml_free");
    auto new_tensor = g->base_fn<NewTensor2dFn>("ggml_new_tensor_2d");
    auto mul_mat = g->base_fn<MulMatFn>("ggml_mul_mat");
    auto new_graph = g->base_fn<NewGraphFn>("ggml_new_graph");
    auto build = g->base_fn<BuildForwardFn>("ggml_build_forward_expand");
    auto tensor_overhead = g->base_fn<SizeFn>("ggml_tensor_overhead");
    auto graph_overhead = g->base_fn<SizeFn>("ggml_graph_overhead");
    auto alloc_tensors = g->base_fn<AllocTensorsFn>("ggml_backend_alloc_ctx_tensors_from_buft");
    auto cpu_buft = g->base_fn<BufferTypeFn>("ggml_backend_cpu_buffer_type");
    auto tensor_set = g->base_fn<TensorSetFn>("ggml_backend_tensor_set");
    auto tensor_get = g->base_fn<TensorGetFn>("ggml_backend_tensor_get");
    auto compute = g->base_fn<GraphComputeFn>("ggml_backend_graph_compute");
    auto buffer_free = g->base_fn<BufferFreeFn>("ggml_backend_buffer_free");
    auto backend_free = g->base_fn<FreeFn>("ggml_backend_free");
    auto reg_dev_get = g->base_fn<RegDevGetFn>("ggml_backend_reg_dev_get");
    auto reg_proc = g->base_fn<RegProcFn>("ggml_backend_reg_get_proc_address");
    auto cpu_init = g->cpu_fn<BackendInitFn>("ggml_backend_cpu_init");
    auto set_threads = g->cpu_fn<SetThreadsFn>("ggml_backend_cpu_set_n_threads");
    auto cpu_reg = g->cpu_fn<RegFn>("ggml_backend_cpu_reg");
    if (!init || !free_ctx || !new_tensor || !mul_mat || !new_graph || !build || !tensor_overhead || !graph_overhead ||
        !alloc_tensors || !cpu_buft || !tensor_set || !tensor_get || !compute || !buffer_free || !backend_free ||
        !reg_dev_get || !reg_proc || !cpu_init || !set_threads || !cpu_reg) {
        return {};
    }
    // The repack buffer type: the CPU device's first extra buffer type named CPU_REPACK.
    void* repack = nullptr;
    auto name_of = g->base_fn<const char* (*)(void*)>("ggml_backend_buft_name");
    if (auto extra = reinterpret_cast<ExtraBuftsFn>(reg_proc(cpu_reg(), "ggml_backend_dev_get_extra_bufts"))) {
        for (void** b = extra(reg_dev_get(cpu_reg(), 0)); b != nullptr && *b != nullptr; ++b) {
            if (name_of && std::string(name_of(*b)) == "CPU_REPACK") repack = *b;
        }
    }
    if (repack == nullptr) return {};

    const size_t meta = 8 * tensor_overhead() + graph_overhead();
    void* ctx_w = init({meta, nullptr, true});
    void* ctx = init({meta, nullptr, true});
    void* tw = new_tensor(ctx_w, static_cast<int>(type), n, rows);
    void* tx = new_tensor(ctx, 0, n, n_tok);
    void* ty = mul_mat(ctx, tw, tx);
    void* graph = new_graph(ctx);
    build(graph, ty);
    // The repack buffer refuses nothing at allocation; types without a repacked layout compute
    // from plain memory there too (ggml_repack_get_optimal_repack_type returns no traits).
    void* buf_w = alloc_tensors(ctx_w, repacked(type, rows) ? repack : cpu_buft());
    void* buf = alloc_tensors(ctx, cpu_buft());
    std::vector<float> y;
    void* backend = cpu_init();
    if (buf_w && buf && backend) {
        set_threads(backend, threads);
        tensor_set(tw, w.data(), 0, w.size());
        tensor_set(tx, x.data(), 0, x.size() * sizeof(float));
        if (compute(backend, graph) == 0) {
            y.resize(static_cast<size_t>(rows) * n_tok);
            tensor_get(ty, y.data(), 0, y.size() * sizeof(float));
        }
    }
    if (backend) backend_free(backend);
    if (buf) buffer_free(buf);
    if (buf_w) buffer_free(buf_w);
    free_ctx(ctx);
    free_ctx(ctx_w);
    return y;
}

// fitllm's matmul against ggml's, output by output, for the weight types of the demo model and the
// generated goldens, one token (decode) and batches on each side of ggml's thresholds (2..7 tokens:
// vec_dot or sgemm; 8 and more: the tiled k-quant kernels). The batch goes through matmul three
// ways: as one sequence's run (places: what a prompt passes), as tokens of separate sequences
// (places: runs of 1, a decode step of several sequences) and without places; the last two must
// give the same bits. Printed: how many outputs differ in their bits; required: none for the
// (type, batch) pairs listed in kExact.
TEST(MatmulVsGgml, SameBitsWhereFitllmFollowsLlamaCpp) {
    REQUIRE_GGML();
    const CpuFeatures cpu = detect_cpu_features();
    if (cpu.best_isa() < Isa::Avx2) GTEST_SKIP() << "the orders fitllm follows are llama.cpp's AVX2 / AVX-512 ones";
    // The oracle is llama.cpp built for this CPU's own level; its batch orders at that level are not
    // those of a lower one, so a level forced below the CPU's (FITLLM_CPU_ISA) has nothing to match.
    if (host_cpu_features().best_isa() != cpu.best_isa()) {
        GTEST_SKIP() << "FITLLM_CPU_ISA forces " << isa_name(host_cpu_features().best_isa())
                     << " but the oracle runs llama.cpp's " << isa_name(cpu.best_isa())
                     << " kernels: their batch orders differ (the single-token dots are compared per level in "
                        "DotVsGgml)";
    }
    // Where fitllm gives llama.cpp's bits, by batch size. llama.cpp's batch kernels sum in another
    // order than its single-token one: Q4_K and Q2_K in groups of 4 tokens (the repacked gemm fmas
    // per 64 or 128 elements instead of per super-block), Q3_K / Q5_K / Q6_K from 8 tokens on (the
    // tiled kernels: one float product per super-block, unfused). fitllm follows them where a batch
    // is one sequence's run (quant::select_batch_order_gemm); tokens of separate sequences keep the
    // single-token order, so those match llama.cpp's bits below the batch kernels' thresholds only.
    // F16 rounds its activations to f16 and sums 4 x 16 lanes (vec_dot: one token) or 16 lanes
    // (llamafile's sgemm: 2 tokens or more).
    struct Exact {
        GgmlType type;
        int max_tok;      // separate tokens: outputs equal for batches of up to this many tokens
        int max_run_tok;  // one run: likewise
    };
    // The grid i-quants (IQ1_*, IQ2_*, IQ3_*) go through llama.cpp's tiled matmul from 8 tokens too.
    constexpr Exact kExact[] = {
        {GgmlType::Q8_0, 64, 64},   {GgmlType::Q5_0, 64, 64},  {GgmlType::Q4_0, 64, 64},   {GgmlType::Q4_K, 3, 64},
        {GgmlType::Q5_K, 7, 64},    {GgmlType::Q6_K, 7, 64},   {GgmlType::Q3_K, 7, 64},    {GgmlType::Q2_K, 3, 64},
        {GgmlType::F16, 1, 64},     {GgmlType::TQ1_0, 64, 64}, {GgmlType::TQ2_0, 64, 64},  {GgmlType::MXFP4, 64, 64},
        {GgmlType::IQ3_XXS, 7, 64}, {GgmlType::IQ3_S, 7, 64},  {GgmlType::IQ2_XXS, 7, 64}, {GgmlType::IQ2_XS, 7, 64},
        {GgmlType::IQ2_S, 7, 64},   {GgmlType::IQ1_S, 7, 64},  {GgmlType::IQ1_M, 7, 64},
    };
    ops::ThreadPool pool(2);
    ops::Scratch scratch;
    const int rows = 64;
    // 1536: wider than the chunks of blocks the tiled kernels of the blocks of 32 work in; 5632
    // (22 super-blocks): wider than one slab of fitllm's batch-order kernels (Q4_K / Q2_K: chunks of
    // 4 super-blocks).
    for (const auto& [type, n] : std::initializer_list<std::pair<GgmlType, int>>{
             {GgmlType::F16, 512},     {GgmlType::Q8_0, 512},     {GgmlType::Q8_0, 1536},  {GgmlType::Q6_K, 512},
             {GgmlType::Q6_K, 5632},   {GgmlType::Q5_K, 512},     {GgmlType::Q5_K, 2048},  {GgmlType::Q5_0, 512},
             {GgmlType::Q5_0, 1536},   {GgmlType::Q4_K, 512},     {GgmlType::Q4_K, 5632},  {GgmlType::Q4_0, 512},
             {GgmlType::Q4_0, 1536},   {GgmlType::Q3_K, 512},     {GgmlType::Q3_K, 2048},  {GgmlType::Q2_K, 512},
             {GgmlType::Q2_K, 2048},   {GgmlType::TQ1_0, 1536},   {GgmlType::TQ2_0, 1536}, {GgmlType::MXFP4, 512},
             {GgmlType::MXFP4, 1536},  {GgmlType::IQ3_XXS, 1536}, {GgmlType::IQ3_S, 1536}, {GgmlType::IQ2_XXS, 1536},
             {GgmlType::IQ2_XS, 1536}, {GgmlType::IQ2_S, 1536},   {GgmlType::IQ1_S, 1536}, {GgmlType::IQ1_M, 1536}}) {
        const auto w = test::weight_rows(type, rows, n, 31 + static_cast<uint32_t>(type), true);
        int exact_up_to = 0, run_exact_up_to = 0;
        for (const Exact& e : kExact) {
            if (e.type == type) exact_up_to = e.max_tok, run_exact_up_to = e.max_run_tok;
        }
        std::string line, run_line;
        for (int n_tok : {1, 2, 5, 8, 16, 33}) {
            const auto x = test::gaussian(static_cast<size_t>(n) * n_tok, 700 + static_cast<uint32_t>(n_tok));
            const std::vector<float> theirs = ggml_matmul(type, w, rows, n, x, n_tok, 2);
            ASSERT_EQ(theirs.size(), static_cast<size_t>(rows) * n_tok) << "ggml's mul_mat did not run";
            std::vector<float> ours(theirs.size());
            const ops::WeightView view{type, rows, n, w.data(), 0};
            ops::matmul(view, x.data(), n_tok, ours.data(), pool, scratch);
            std::vector<ops::TokenPlace> run(n_tok), alone(n_tok);
            for (int t = 0; t < n_tok; ++t) run[t] = {n_tok, t};
            std::vector<float> ours_run(theirs.size()), ours_alone(theirs.size());
            ops::matmul(view, x.data(), n_tok, ours_run.data(), pool, scratch, run);
            ops::matmul(view, x.data(), n_tok, ours_alone.data(), pool, scratch, alone);
            int differ = 0, run_differ = 0, alone_differ = 0;
            for (size_t i = 0; i < ours.size(); ++i) {
                differ += same_bits(ours[i], theirs[i]) ? 0 : 1;
                run_differ += same_bits(ours_run[i], theirs[i]) ? 0 : 1;
                alone_differ += same_bits(ours_alone[i], ours[i]) ? 0 : 1;
            }
            line += " " + std::to_string(n_tok) + ":" + std::to_string(differ);
            run_line += " " + std::to_string(n_tok) + ":" + std::to_string(run_differ);
            EXPECT_EQ(alone_differ, 0) << traits(type).name << " n_tok=" << n_tok
                                       << ": runs of 1 differ from matmul without places";
            if (n_tok <= exact_up_to) {
                EXPECT_EQ(differ, 0) << traits(type).name << " n_tok=" << n_tok << " differs from llama.cpp's bits";
            }
            if (n_tok <= run_exact_up_to) {
                EXPECT_EQ(run_differ, 0) << traits(type).name << " n_tok=" << n_tok
                                         << " as one run differs from llama.cpp's bits";
            }
        }
        std::printf("  %-5s n=%-4d outputs of %d differing (by batch size), separate tokens:%s\n",
                    std::string(traits(type).name).c_str(), n, rows, line.c_str());
        std::printf("  %-5s n=%-4d outputs of %d differing (by batch size), one run:        %s\n",
                    std::string(traits(type).name).c_str(), n, rows, run_line.c_str());
    }
}

// llama.cpp's batch order of the weight types it repacks with a gemm (Q4_K; Q2_K on AVX-512): its
// CPU backend runs every group of 4 tokens of a batch through that gemm, so batches of a multiple
// of 4 tokens show its bits in every output. fitllm's scalar reference of that order and each of
// its SIMD kernels this CPU runs must give them bit for bit. 72 rows: ggml's AVX-512 gemm takes
// 16 rows at a time and the last 8 in its AVX2 code.
TEST(MatmulVsGgml, BatchOrderKernelsGiveLlamaCppBatchBits) {
    REQUIRE_GGML();
    const CpuFeatures cpu = detect_cpu_features();
    for (const auto& [type, n, rows] :
         std::initializer_list<std::tuple<GgmlType, int, int>>{{GgmlType::Q4_K, 512, 64},
                                                               {GgmlType::Q4_K, 2304, 72},
                                                               {GgmlType::Q2_K, 512, 64},
                                                               {GgmlType::Q2_K, 1280, 72}}) {
        if (!repacked(type, rows)) continue;  // llama.cpp runs no batch gemm for it on this CPU
        std::vector<std::pair<std::string, GemmFn>> kernels = {{"scalar", detail::gemm_batch_q4k_ref(type)}};
        if (cpu.best_isa() >= Isa::Avx2) kernels.push_back({"avx2", detail::gemm_batch_q4k_avx2(type).fn});
        if (cpu.best_isa() >= Isa::Avx512) kernels.push_back({"avx512", detail::gemm_batch_q4k_avx512(type, false).fn});
        if (cpu.best_isa() >= Isa::Avx512Vnni) {
            kernels.push_back({"avx512_vnni", detail::gemm_batch_q4k_avx512(type, true).fn});
        }
        const auto w = test::weight_rows(type, rows, n, 57 + static_cast<uint32_t>(type), true);
        const size_t w_row = test::bytes_of_row(type, n), a_row = test::bytes_of_row(GgmlType::Q8_K, n);
        for (int n_tok : {4, 8, 12}) {
            const auto x = test::gaussian(static_cast<size_t>(n) * n_tok, 900 + static_cast<uint32_t>(n_tok));
            const std::vector<float> theirs = ggml_matmul(type, w, rows, n, x, n_tok, 2);
            ASSERT_EQ(theirs.size(), static_cast<size_t>(rows) * n_tok) << "ggml's mul_mat did not run";
            std::vector<uint8_t> act(a_row * n_tok);
            for (int t = 0; t < n_tok; ++t) {
                quantize_row(GgmlType::Q8_K, x.data() + static_cast<size_t>(t) * n, act.data() + t * a_row, n);
            }
            for (const auto& [name, fn] : kernels) {
                if (fn == nullptr) continue;  // Q2_K has no AVX2 batch kernel (nor does llama.cpp)
                std::vector<float> ours(theirs.size());
                fn(n, rows, n_tok, w.data(), w_row, act.data(), a_row, ours.data(), static_cast<size_t>(rows));
                int differ = 0;
                for (size_t i = 0; i < ours.size(); ++i) differ += same_bits(ours[i], theirs[i]) ? 0 : 1;
                EXPECT_EQ(differ, 0) << traits(type).name << " " << name << " n=" << n << " rows=" << rows
                                     << " n_tok=" << n_tok << ": outputs differing from llama.cpp's batch bits";
            }
        }
    }
}

}  // namespace
}  // namespace fitllm::quant

namespace fitllm::quant {
namespace {

// ---- Flash attention through ggml's CPU backend ----

using NewTensor3dFn = void* (*)(void*, int, int64_t, int64_t, int64_t);
using FlashAttnExtFn = void* (*)(void*, void*, void*, void*, void*, float, float, float);

// ggml's flash_attn_ext on its CPU backend: q [n_tok][n_head][d] f32, k / v [n_kv][n_head_kv][d]
// (f16 values, stored as f16), mask [n_tok][n_kv] (0 or -inf, stored as f16); the output in q's
// layout. Empty on any failure.
std::vector<float> ggml_flash_attn(const std::vector<float>& q, const std::vector<float>& k,
                                   const std::vector<float>& v, const std::vector<float>& mask, int n_tok, int n_kv,
                                   int n_head, int n_head_kv, int d, float scale, int threads) {
    const Ggml* g = ggml();
    auto init = g->base_fn<InitFn>("ggml_init");
    auto free_ctx = g->base_fn<FreeFn>("ggml_free");
    auto new_tensor2 = g->base_fn<NewTensor2dFn>("ggml_new_tensor_2d");
    auto new_tensor3 = g->base_fn<NewTensor3dFn>("ggml_new_tensor_3d");
    auto flash = g->base_fn<FlashAttnExtFn>("ggml_flash_attn_ext");
    auto new_graph = g->base_fn<NewGraphFn>("ggml_new_graph");
    auto build = g->base_fn<BuildForwardFn>("ggml_build_forward_expand");
    auto tensor_overhead = g->base_fn<SizeFn>("ggml_tensor_overhead");
    auto graph_overhead = g->base_fn<SizeFn>("ggml_graph_overhead");
    auto alloc_tensors = g->base_fn<AllocTensorsFn>("ggml_backend_alloc_ctx_tensors_from_buft");
    auto cpu_buft = g->base_fn<BufferTypeFn>("ggml_backend_cpu_buffer_type");
    auto tensor_set = g->base_fn<TensorSetFn>("ggml_backend_tensor_set");
    auto tensor_get = g->base_fn<TensorGetFn>("ggml_backend_tensor_get");
    auto compute = g->base_fn<GraphComputeFn>("ggml_backend_graph_compute");
    auto buffer_free = g->base_fn<BufferFreeFn>("ggml_backend_buffer_free");
    auto backend_free = g->base_fn<FreeFn>("ggml_backend_free");
    auto cpu_init = g->cpu_fn<BackendInitFn>("ggml_backend_cpu_init");
    auto set_threads = g->cpu_fn<SetThreadsFn>("ggml_backend_cpu_set_n_threads");
    if (!init || !free_ctx || !new_tensor2 || !new_tensor3 || !flash || !new_graph || !build || !tensor_overhead ||
        !graph_overhead || !alloc_tensors || !cpu_buft || !tensor_set || !tensor_get || !compute || !buffer_free ||
        !backend_free || !cpu_init || !set_threads) {
        return {};
    }
    constexpr int kF32 = 0, kF16 = 1;
    // ggml's layouts: q [d, n_tok, n_head], k / v [d, n_kv, n_head_kv], mask [n_kv, n_tok].
    std::vector<float> q_g(q.size());
    for (int t = 0; t < n_tok; ++t)
        for (int h = 0; h < n_head; ++h)
            for (int i = 0; i < d; ++i)
                q_g[(static_cast<size_t>(h) * n_tok + t) * d + i] = q[(static_cast<size_t>(t) * n_head + h) * d + i];
    const auto to_half_heads = [&](const std::vector<float>& x) {
        std::vector<uint16_t> y(x.size());
        for (int j = 0; j < n_kv; ++j)
            for (int h = 0; h < n_head_kv; ++h)
                for (int i = 0; i < d; ++i)
                    y[(static_cast<size_t>(h) * n_kv + j) * d + i] =
                        fp32_to_fp16(x[(static_cast<size_t>(j) * n_head_kv + h) * d + i]);
        return y;
    };
    const std::vector<uint16_t> k_g = to_half_heads(k), v_g = to_half_heads(v);
    std::vector<uint16_t> mask_g(mask.size());
    for (size_t i = 0; i < mask.size(); ++i) mask_g[i] = fp32_to_fp16(mask[i]);

    const size_t meta = 8 * tensor_overhead() + graph_overhead();
    void* ctx = init({meta, nullptr, true});
    void* tq = new_tensor3(ctx, kF32, d, n_tok, n_head);
    void* tk = new_tensor3(ctx, kF16, d, n_kv, n_head_kv);
    void* tv = new_tensor3(ctx, kF16, d, n_kv, n_head_kv);
    void* tm = new_tensor2(ctx, kF16, n_kv, n_tok);
    void* out = flash(ctx, tq, tk, tv, tm, scale, 0.0f, 0.0f);
    void* graph = new_graph(ctx);
    build(graph, out);
    void* buf = alloc_tensors(ctx, cpu_buft());
    std::vector<float> y;
    void* backend = cpu_init();
    if (buf && backend) {
        set_threads(backend, threads);
        tensor_set(tq, q_g.data(), 0, q_g.size() * sizeof(float));
        tensor_set(tk, k_g.data(), 0, k_g.size() * sizeof(uint16_t));
        tensor_set(tv, v_g.data(), 0, v_g.size() * sizeof(uint16_t));
        tensor_set(tm, mask_g.data(), 0, mask_g.size() * sizeof(uint16_t));
        if (compute(backend, graph) == 0) {
            y.resize(q.size());
            tensor_get(out, y.data(), 0, y.size() * sizeof(float));
        }
    }
    if (backend) backend_free(backend);
    if (buf) buffer_free(buf);
    free_ctx(ctx);
    return y;
}

// llama.cpp runs its tiled flash attention (f32 q, tiles of 64 keys) for 64 queries and more with
// an f16 cache; fitllm's attention_f16_tiled must give its bits for every variant, for the head
// sizes of common models, grouped queries, causal masks (-inf entries), a sliding window, and
// keys that do not fill the last tile.
TEST(FlashAttentionVsGgml, TiledKernelHasTheSameBits) {
    REQUIRE_GGML();
    ops::ThreadPool pool(2);
    ops::Scratch scratch;
    struct Shape {
        int n_tok, n_prefix, n_head, n_head_kv, d, window;
    };
    for (const Shape& s : {Shape{64, 0, 4, 2, 64, 0}, Shape{100, 37, 8, 2, 128, 0}, Shape{130, 70, 4, 1, 256, 0},
                           Shape{96, 200, 4, 1, 256, 80}, Shape{200, 0, 6, 6, 64, 0},
                           Shape{189, 1024, 4, 1, 256, 512}}) {  // Gemma 3 270M's local layers, a third batch
        const int n_kv = s.n_prefix + s.n_tok;
        std::vector<float> q = test::gaussian(static_cast<size_t>(s.n_tok) * s.n_head * s.d, 11);
        std::vector<float> k = test::gaussian(static_cast<size_t>(n_kv) * s.n_head_kv * s.d, 12);
        std::vector<float> v = test::gaussian(k.size(), 13);
        for (float& x : q) x *= 2.0f;  // sharper softmaxes: more rescales
        for (float& x : k) x = fp16_to_fp32(fp32_to_fp16(x));
        for (float& x : v) x = fp16_to_fp32(fp32_to_fp16(x));
        std::vector<int32_t> q_pos(s.n_tok), kv_pos(n_kv);
        for (int j = 0; j < n_kv; ++j) kv_pos[j] = j;
        for (int t = 0; t < s.n_tok; ++t) q_pos[t] = s.n_prefix + t;
        std::vector<float> mask(static_cast<size_t>(s.n_tok) * n_kv);
        for (int t = 0; t < s.n_tok; ++t) {
            for (int j = 0; j < n_kv; ++j) {
                const bool seen = j <= q_pos[t] && (s.window == 0 || j > q_pos[t] - s.window);
                mask[static_cast<size_t>(t) * n_kv + j] = seen ? 0.0f : -INFINITY;
            }
        }
        const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
        const std::vector<float> theirs =
            ggml_flash_attn(q, k, v, mask, s.n_tok, n_kv, s.n_head, s.n_head_kv, s.d, scale, 2);
        ASSERT_EQ(theirs.size(), q.size()) << "ggml's flash_attn_ext did not run";
        const ops::AttentionParams p{
            .n_head = s.n_head, .n_head_kv = s.n_head_kv, .head_dim = s.d, .scale = scale, .sliding_window = s.window};
        for (const auto kernel :
             {ops::AttentionTiledKernel::Best, ops::AttentionTiledKernel::Avx2, ops::AttentionTiledKernel::Reference}) {
            std::vector<float> ours(q.size());
            ops::attention_f16_tiled(q.data(), q_pos.data(), s.n_tok, k.data(), v.data(), kv_pos.data(), n_kv, p,
                                     ours.data(), pool, scratch, kernel);
            int differ = 0;
            for (size_t i = 0; i < ours.size(); ++i) differ += same_bits(ours[i], theirs[i]) ? 0 : 1;
            EXPECT_EQ(differ, 0) << "of " << ours.size() << " outputs, " << s.n_tok << " queries, head size " << s.d
                                 << ", window " << s.window << ", kernel " << static_cast<int>(kernel);
        }
        // The check can fail: llama.cpp's one-query kernel (f16 q and sums, what it runs below 64
        // queries) does not give these bits.
        std::vector<float> one_query(q.size());
        ops::attention_f16(q.data(), q_pos.data(), s.n_tok, k.data(), v.data(), kv_pos.data(), n_kv, p,
                           one_query.data(), pool, scratch);
        int differ = 0;
        for (size_t i = 0; i < q.size(); ++i) differ += same_bits(one_query[i], theirs[i]) ? 0 : 1;
        EXPECT_GT(differ, static_cast<int>(q.size() / 2)) << "the one-query kernel's bits";
    }
}

// fitllm quantize's rows (quantize_model_row) against ggml_quantize_chunk without an importance
// matrix, what llama-quantize runs: the same bytes for every type fitllm quantize writes. Gaussian
// rows at three scales, rows with an outlier, a zero block, equal values, a tiny block.
TEST(QuantizeVsGgml, ModelRowsHaveLlamaQuantizeBytes) {
    REQUIRE_GGML();
    using ChunkFn = size_t (*)(int, const float*, void*, int64_t, int64_t, int64_t, const float*);
    auto chunk = ggml()->base_fn<ChunkFn>("ggml_quantize_chunk");
    ASSERT_NE(chunk, nullptr);
    const GgmlType types[] = {GgmlType::Q4_0,  GgmlType::Q4_1,  GgmlType::Q5_0,    GgmlType::Q5_1,   GgmlType::Q8_0,
                              GgmlType::Q2_K,  GgmlType::Q3_K,  GgmlType::Q4_K,    GgmlType::Q5_K,   GgmlType::Q6_K,
                              GgmlType::F16,   GgmlType::BF16,  GgmlType::IQ4_NL,  GgmlType::IQ4_XS, GgmlType::TQ1_0,
                              GgmlType::TQ2_0, GgmlType::MXFP4, GgmlType::IQ3_XXS, GgmlType::IQ3_S,  GgmlType::IQ2_S,
                              GgmlType::IQ1_M};
    const int n = 4096, rows = 4;
    for (uint32_t seed = 0; seed < 4; ++seed) {
        auto x = test::gaussian(static_cast<size_t>(n) * rows, 90 + seed, seed == 1 ? 0.02f : seed == 2 ? 30.0f : 1.0f);
        if (seed == 3) {
            for (int i = 0; i < 256; ++i) x[i] = 0.0f;
            for (int i = 256; i < 512; ++i) x[i] = -0.75f;
            for (int i = 512; i < 768; ++i) x[i] *= 1e-20f;
            x[1000] = 40.0f;
            x[3000] = -55.0f;
        }
        for (GgmlType type : types) {
            SCOPED_TRACE(std::string(traits(type).name) + " seed " + std::to_string(seed));
            ASSERT_TRUE(can_quantize_model(type));
            const size_t row = test::bytes_of_row(type, n);
            std::vector<uint8_t> ours(row * rows, 0xAA), theirs(row * rows, 0x55);
            for (int r = 0; r < rows; ++r) quantize_model_row(type, x.data() + r * n, ours.data() + r * row, n);
            chunk(static_cast<int>(type), x.data(), theirs.data(), 0, rows, n, nullptr);
            size_t first = ours.size();
            for (size_t i = 0; i < ours.size() && first == ours.size(); ++i) first = ours[i] != theirs[i] ? i : first;
            EXPECT_EQ(first, ours.size()) << "first differing byte " << first << " of " << ours.size();
        }
    }
}

// The same with an importance matrix, what llama-quantize --imatrix runs: per-column weights
// spanning six orders of magnitude (some zero), the same bytes for every type, including those
// that ignore the weights.
TEST(QuantizeVsGgml, ModelRowsWithImatrixHaveLlamaQuantizeBytes) {
    REQUIRE_GGML();
    using ChunkFn = size_t (*)(int, const float*, void*, int64_t, int64_t, int64_t, const float*);
    auto chunk = ggml()->base_fn<ChunkFn>("ggml_quantize_chunk");
    ASSERT_NE(chunk, nullptr);
    const GgmlType types[] = {
        GgmlType::Q4_0,    GgmlType::Q4_1,   GgmlType::Q5_0,  GgmlType::Q5_1,    GgmlType::Q8_0,  GgmlType::Q2_K,
        GgmlType::Q3_K,    GgmlType::Q4_K,   GgmlType::Q5_K,  GgmlType::Q6_K,    GgmlType::F16,   GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,  GgmlType::TQ2_0,  GgmlType::MXFP4, GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ2_S,
        GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ1_S, GgmlType::IQ1_M};
    const int n = 4096, rows = 4;
    for (uint32_t seed = 0; seed < 4; ++seed) {
        auto x = test::gaussian(static_cast<size_t>(n) * rows, 190 + seed,
                                seed == 1   ? 0.02f
                                : seed == 2 ? 30.0f
                                            : 1.0f);
        auto g = test::gaussian(static_cast<size_t>(n), 290 + seed, 3.0f);
        std::vector<float> w(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) w[i] = std::exp(g[i]) * (seed == 2 ? 1e-3f : 1.0f);  // log-normal, like sums of x^2
        if (seed == 3) {
            for (int i = 0; i < 256; ++i) x[i] = 0.0f;
            for (int i = 256; i < 512; ++i) x[i] = -0.75f;
            for (int i = 512; i < 768; ++i) x[i] *= 1e-20f;
            for (int i = 1024; i < 1100; ++i) w[i] = 0.0f;
            x[1000] = 40.0f;
            x[3000] = -55.0f;
        }
        for (GgmlType type : types) {
            SCOPED_TRACE(std::string(traits(type).name) + " seed " + std::to_string(seed));
            const size_t row = test::bytes_of_row(type, n);
            std::vector<uint8_t> ours(row * rows, 0xAA), theirs(row * rows, 0x55), plain(row * rows, 0x11);
            for (int r = 0; r < rows; ++r)
                quantize_model_row(type, x.data() + r * n, ours.data() + r * row, n, w.data());
            chunk(static_cast<int>(type), x.data(), theirs.data(), 0, rows, n, w.data());
            size_t first = ours.size();
            for (size_t i = 0; i < ours.size() && first == ours.size(); ++i) first = ours[i] != theirs[i] ? i : first;
            EXPECT_EQ(first, ours.size()) << "first differing byte " << first << " of " << ours.size();
            // The weights change the rows of exactly the types said to use them (IQ2_XXS, IQ2_XS and
            // IQ1_S take no row without them, as ggml asserts).
            if (type == GgmlType::IQ2_XXS || type == GgmlType::IQ2_XS || type == GgmlType::IQ1_S) {
                EXPECT_THROW(quantize_model_row(type, x.data(), plain.data(), n), std::invalid_argument);
                continue;
            }
            for (int r = 0; r < rows; ++r) quantize_model_row(type, x.data() + r * n, plain.data() + r * row, n);
            EXPECT_EQ(plain != ours, uses_importance(type));
        }
    }
}

}  // namespace
}  // namespace fitllm::quant
