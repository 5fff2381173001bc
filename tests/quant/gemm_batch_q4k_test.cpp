// The batch-order kernels of Q4_K and Q2_K (quant/gemm_batch_q4k.h): every SIMD variant this CPU runs
// (host_cpu_features, so FITLLM_CPU_ISA lowers it) gives the scalar reference's floats bit for bit,
// on odd shapes and padded strides; the reference differs from the one-token order only by
// rounding. That the reference is llama.cpp's batch arithmetic is checked against ggml itself in
// ggml_oracle_test.cpp (MatmulVsGgml).
#include "quant/gemm_batch_q4k.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "quant/dot.h"
#include "quant_test_data.h"
#include "test_support.h"

namespace fitllm::quant {
namespace {

struct Problem {
    int n, n_rows, n_tok;
    size_t w_stride, act_stride, y_stride;  // bytes, bytes, floats: all with some padding
    std::vector<uint8_t> w, act;
};

Problem make_problem(GgmlType type, int n, int n_rows, int n_tok, bool from_floats, uint32_t seed) {
    Problem p{n, n_rows, n_tok, 0, 0, 0, {}, {}};
    const size_t w_row = test::bytes_of_row(type, n), a_row = test::bytes_of_row(GgmlType::Q8_K, n);
    p.w_stride = w_row + 4;  // padded, block fields still aligned
    p.act_stride = a_row + 8;
    p.y_stride = static_cast<size_t>(n_rows) + 3;
    const std::vector<uint8_t> rows = test::weight_rows(type, n_rows, n, seed, from_floats);
    p.w.assign(p.w_stride * static_cast<size_t>(n_rows), 0xA5);
    for (int r = 0; r < n_rows; ++r) std::memcpy(p.w.data() + r * p.w_stride, rows.data() + r * w_row, w_row);
    p.act.assign(p.act_stride * static_cast<size_t>(n_tok), 0x5A);
    // Large activations too (sigma 30): the Q8_K quants then reach +-127 in many places.
    const auto x = test::gaussian(static_cast<size_t>(n) * n_tok, seed + 1000, seed % 2 ? 1.0f : 30.0f);
    for (int t = 0; t < n_tok; ++t) {
        quantize_row(GgmlType::Q8_K, x.data() + static_cast<size_t>(t) * n, p.act.data() + t * p.act_stride, n);
    }
    return p;
}

std::vector<float> run(GemmFn fn, const Problem& p) {
    std::vector<float> y(p.y_stride * static_cast<size_t>(p.n_tok), std::numeric_limits<float>::quiet_NaN());
    fn(p.n, p.n_rows, p.n_tok, p.w.data(), p.w_stride, p.act.data(), p.act_stride, y.data(), p.y_stride);
    return y;
}

bool same_bits(float a, float b) {
    return std::memcmp(&a, &b, sizeof a) == 0;
}

struct Variant {
    GgmlType type;
    Isa isa;
    GemmKernel kernel;
};

// The SIMD variants this CPU runs: Q4_K at AVX2 and up, Q2_K at AVX-512 and up.
std::vector<Variant> variants() {
    std::vector<Variant> v;
    const Isa best = host_cpu_features().best_isa();
    for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q2_K}) {
        if (best >= Isa::Avx2) v.push_back({type, Isa::Avx2, detail::gemm_batch_q4k_avx2(type)});
        if (best >= Isa::Avx512) v.push_back({type, Isa::Avx512, detail::gemm_batch_q4k_avx512(type, false)});
        if (best >= Isa::Avx512Vnni) v.push_back({type, Isa::Avx512Vnni, detail::gemm_batch_q4k_avx512(type, true)});
    }
    return v;
}

TEST(GemmBatchQ4K, KernelTables) {
    EXPECT_NE(detail::gemm_batch_q4k_ref(GgmlType::Q4_K), nullptr);
    EXPECT_NE(detail::gemm_batch_q4k_ref(GgmlType::Q2_K), nullptr);
    EXPECT_EQ(detail::gemm_batch_q4k_ref(GgmlType::Q5_K), nullptr);
    EXPECT_EQ(detail::gemm_batch_q4k_avx2(GgmlType::Q2_K).fn, nullptr);  // llama.cpp repacks Q2_K on AVX-512 only
    EXPECT_EQ(detail::gemm_batch_q4k_avx512(GgmlType::Q6_K, true).fn, nullptr);
    for (const Variant& v : variants()) {
        if (v.type == GgmlType::Q2_K && v.isa == Isa::Avx2) {
            EXPECT_EQ(v.kernel.fn, nullptr);
            continue;
        }
        ASSERT_NE(v.kernel.fn, nullptr) << traits(v.type).name << " " << isa_name(v.isa);
        EXPECT_EQ(v.kernel.isa, v.isa);
        EXPECT_EQ(v.kernel.act_type, GgmlType::Q8_K);
    }
}

// Shapes around the kernels' tiles (8 or 16 rows), token passes (up to 4) and chunks of the row
// (4 super-blocks): 5 and 9 super-blocks cross a chunk boundary.
TEST(GemmBatchQ4K, SimdVariantsGiveTheReferenceBits) {
    const std::vector<Variant> vs = variants();
    if (vs.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
    const std::pair<int, int> shapes[] = {{1, 1}, {7, 3}, {16, 5}, {17, 2}, {9, 9}, {33, 4}, {64, 7}};
    for (const Variant& v : vs) {
        if (v.kernel.fn == nullptr) continue;
        const GemmFn ref = detail::gemm_batch_q4k_ref(v.type);
        for (int n : {256, 1024, 1280, 2304}) {
            for (bool from_floats : {true, false}) {
                for (const auto& [n_rows, n_tok] : shapes) {
                    const uint32_t seed =
                        static_cast<uint32_t>(n * 7 + n_rows * 131 + n_tok * 3 + (from_floats ? 1 : 0));
                    const Problem p = make_problem(v.type, n, n_rows, n_tok, from_floats, seed);
                    const std::vector<float> want = run(ref, p), got = run(v.kernel.fn, p);
                    int differ = 0, written_past = 0;
                    for (int t = 0; t < n_tok; ++t) {
                        for (size_t r = 0; r < p.y_stride; ++r) {
                            const float g = got[t * p.y_stride + r];
                            if (r >= static_cast<size_t>(n_rows)) {
                                written_past += std::isnan(g) ? 0 : 1;
                                continue;
                            }
                            differ += same_bits(g, want[t * p.y_stride + r]) ? 0 : 1;
                        }
                    }
                    const std::string what = std::string(traits(v.type).name) + " " + std::string(isa_name(v.isa)) +
                                             " n=" + std::to_string(n) + " rows=" + std::to_string(n_rows) +
                                             " tok=" + std::to_string(n_tok) + (from_floats ? " floats" : " random");
                    EXPECT_EQ(differ, 0) << what;
                    EXPECT_EQ(written_past, 0) << what << ": wrote past n_rows";
                }
            }
        }
    }
}

// The batch order sums the same exact integers as the one-token order (the scalar dot_ref.cpp), in
// other float steps: the two agree to float rounding, and differ somewhere (else this order would
// be no order of its own).
TEST(GemmBatchQ4K, ReferenceDiffersFromTheOneTokenOrderByRoundingOnly) {
    for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q2_K}) {
        const GemmFn batch = detail::gemm_batch_q4k_ref(type);
        const DotFn one = select_dot(type, CpuFeatures{}).fn;
        const int n = 4096, n_rows = 16, n_tok = 8;
        const Problem p = make_problem(type, n, n_rows, n_tok, true, 5);
        const std::vector<float> y = run(batch, p);
        int differ = 0;
        for (int t = 0; t < n_tok; ++t) {
            for (int r = 0; r < n_rows; ++r) {
                float want = 0;
                one(n, &want, p.w.data() + r * p.w_stride, p.act.data() + t * p.act_stride);
                const float got = y[t * p.y_stride + r];
                EXPECT_NEAR(got, want, 1e-5f * (std::fabs(want) + 1.0f)) << traits(type).name;
                differ += same_bits(got, want) ? 0 : 1;
            }
        }
        EXPECT_GT(differ, 0) << traits(type).name;
    }
}

// The rules of dot_kernels.h for these files (dot_isolation_test.cpp checks the dot files): nothing
// compiled for AVX2 / AVX-512 may be a weak symbol another file's caller could end up with, and
// the kVnni = false kernels use no VNNI instruction.
std::string object_file(const std::string& source) {
    return (std::filesystem::path(FITLLM_BINARY_DIR) / "src" / "CMakeFiles" / "fitllm_core.dir" / "quant" /
            (source + ".o"))
        .string();
}

TEST(GemmBatchQ4K, IsaFilesDefineNoSharedSymbolsAndNonVnniUsesNoVnni) {
    if (fitllm::test::run_command("command -v nm && command -v objdump").status != 0) {
        GTEST_SKIP() << "needs nm and objdump (Debian's binutils)";
    }
    // Where CMake puts the objects: a move of the sources to another target must move this too.
    ASSERT_TRUE(std::filesystem::exists(object_file("gemm_batch_q4k_avx2.cpp")))
        << object_file("gemm_batch_q4k_avx2.cpp");
    for (const char* source : {"gemm_batch_q4k_avx2.cpp", "gemm_batch_q4k_avx512.cpp"}) {
        const auto r = fitllm::test::run_command("nm -C --defined-only " + object_file(source));
        ASSERT_EQ(r.status, 0) << source;
        std::istringstream lines(r.output);
        for (std::string line; std::getline(lines, line);) {
            std::istringstream fields(line);
            std::string address, type, name;
            fields >> address >> type >> name;
            if (name.starts_with("DW.ref.__gxx_personality_v0")) continue;
            EXPECT_TRUE(type == "T" || type == "t" || type == "r" || type == "d" || type == "b")
                << source << " defines a shared symbol: " << line;
        }
    }
    const auto r =
        fitllm::test::run_command("objdump -d -C --no-show-raw-insn " + object_file("gemm_batch_q4k_avx512.cpp") +
                                  " | awk '/^[0-9a-f]+ <.*>:$/ { fn = $0 } /vpdp/ { print fn }' | grep -c false");
    EXPECT_EQ(r.output, "0\n");
}

}  // namespace
}  // namespace fitllm::quant
