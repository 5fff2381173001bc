// fitllm's kernels against llama.cpp's own (the ggml libraries of PyPI's llama-cpp-python in the
// project venv, opened with dlopen): dequantization and activation quantization must give the
// same bits, the dots the same sums within the variant tolerance. Skipped where the venv is absent.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "quant/dot.h"
#include "quant/quantize.h"
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
    {GgmlType::Q4_0, "q4_0"}, {GgmlType::Q4_1, "q4_1"}, {GgmlType::Q5_0, "q5_0"},     {GgmlType::Q5_1, "q5_1"},
    {GgmlType::Q8_0, "q8_0"}, {GgmlType::Q2_K, "q2_K"}, {GgmlType::Q3_K, "q3_K"},     {GgmlType::Q4_K, "q4_K"},
    {GgmlType::Q5_K, "q5_K"}, {GgmlType::Q6_K, "q6_K"}, {GgmlType::IQ4_NL, "iq4_nl"},
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

TEST(DotVsGgml, SameSums) {
    REQUIRE_GGML();
    const CpuFeatures cpu = detect_cpu_features();
    for (const auto& q : kQuantTypes) {
        auto fn = ggml()->cpu_fn<VecDotFn>(
            ("ggml_vec_dot_" + std::string(q.ggml) + "_" + ggml_name(dot_activation_type(q.type))).c_str());
        ASSERT_NE(fn, nullptr) << q.ggml;
        for (int n : {256, 4096, 8192}) {
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
            }
        }
    }
}

}  // namespace
}  // namespace fitllm::quant
