// The batch-order kernels (quant::select_batch_order_gemm: llama.cpp's tiled order for Q3_K, Q5_K,
// Q6_K): every level the CPU can run against the scalar reference that defines their arithmetic,
// bit for bit, for odd tile shapes and strides and rows wide enough to run in several slabs; and
// the rule of when llama.cpp runs them. MatmulVsGgml (ggml_oracle_test.cpp) holds the reference's
// bits to llama.cpp's own.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "quant/gemm.h"
#include "quant/gemm_batch_f16.h"
#include "quant/gemm_batch_kernels.h"
#include "quant/quantize.h"
#include "quant_test_data.h"

namespace fitllm::quant {
namespace {

constexpr GgmlType kTiledTypes[] = {GgmlType::Q3_K,  GgmlType::Q5_K,    GgmlType::Q6_K,   GgmlType::IQ3_XXS,
                                    GgmlType::IQ3_S, GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S,
                                    GgmlType::IQ1_S, GgmlType::IQ1_M};

struct Problem {
    int n, n_rows, n_tok;
    size_t w_stride, act_stride, y_stride;  // padded: kernels may not assume contiguous rows
    std::vector<uint8_t> w, act;
};

Problem make_problem(GgmlType type, int n, int n_rows, int n_tok, uint32_t seed) {
    Problem p{n,
              n_rows,
              n_tok,
              test::bytes_of_row(type, n) + 8,
              test::bytes_of_row(GgmlType::Q8_K, n) + 8,
              static_cast<size_t>(n_rows) + 3,
              {},
              {}};
    const size_t w_row = test::bytes_of_row(type, n);
    const std::vector<uint8_t> rows = test::weight_rows(type, n_rows, n, seed, seed % 2 == 0);
    p.w.assign(p.w_stride * static_cast<size_t>(n_rows), 0xA5);
    for (int r = 0; r < n_rows; ++r) std::copy_n(rows.data() + r * w_row, w_row, p.w.begin() + r * p.w_stride);
    p.act.assign(p.act_stride * static_cast<size_t>(n_tok), 0x5A);
    const auto x = test::gaussian(static_cast<size_t>(n) * static_cast<size_t>(n_tok), seed + 1000);
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

TEST(GemmBatchOrder, EveryLevelGivesTheReferenceBits) {
    const CpuFeatures cpu = host_cpu_features();
    struct Shape {
        int n, n_rows, n_tok;
    };
    // 40 blocks of 8 tokens' activations are more than one slab of L1. The VNNI kernels of Q3_K, Q5_K
    // and Q6_K take rows 16 at a time: 16, 31 and 48 rows are whole and partial tiles of them.
    const Shape shapes[] = {{256, 1, 1},   {512, 7, 3},   {768, 17, 8},  {1024, 33, 13}, {2048, 5, 19},
                            {10240, 3, 9}, {512, 16, 16}, {768, 31, 11}, {256, 48, 7}};
    int levels = 0;
    for (GgmlType type : kTiledTypes) {
        const GemmFn ref = detail::tiled_order_ref(type);
        ASSERT_NE(ref, nullptr) << traits(type).name;
        uint32_t seed = 3;
        for (const Shape& s : shapes) {
            const Problem p = make_problem(type, s.n, s.n_rows, s.n_tok, seed++);
            const std::vector<float> expected = run(ref, p);
            for (Isa isa : kAllIsas) {
                if (isa > cpu.best_isa() || isa == Isa::Scalar) continue;
                const BatchOrderGemm order = select_batch_order_gemm(type, limit_to(cpu, isa));
                ASSERT_NE(order.kernel.fn, nullptr) << traits(type).name << " " << isa_name(isa);
                EXPECT_EQ(order.kernel.isa, isa);
                EXPECT_EQ(order.kernel.act_type, GgmlType::Q8_K);
                ++levels;
                const std::vector<float> got = run(order.kernel.fn, p);
                int differ = 0;
                for (int t = 0; t < p.n_tok; ++t) {
                    for (int r = 0; r < p.n_rows; ++r) {
                        const size_t i = static_cast<size_t>(t) * p.y_stride + r;
                        differ += std::memcmp(&got[i], &expected[i], sizeof(float)) == 0 ? 0 : 1;
                    }
                }
                EXPECT_EQ(differ, 0) << traits(type).name << " " << isa_name(isa) << " n=" << s.n
                                     << " rows=" << s.n_rows << " tokens=" << s.n_tok;
            }
        }
    }
    if (levels == 0) GTEST_SKIP() << "the batch-order kernels need AVX2; this CPU has " << cpu.describe();
}

// Every token count from 1 to 12 (passes of 8, 4, 2 and 1 tokens and their combinations) over a
// partial tile of rows, for the types with a kernel of their own at each level.
TEST(GemmBatchOrder, EveryTokenCountGivesTheReferenceBits) {
    const CpuFeatures cpu = host_cpu_features();
    if (cpu.best_isa() < Isa::Avx2)
        GTEST_SKIP() << "the batch-order kernels need AVX2; this CPU has " << cpu.describe();
    for (GgmlType type : {GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q3_K, GgmlType::IQ3_XXS, GgmlType::IQ3_S,
                          GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ1_S, GgmlType::IQ1_M}) {
        for (int n_tok = 1; n_tok <= 12; ++n_tok) {
            const Problem p = make_problem(type, 512, 21, n_tok, 40 + static_cast<uint32_t>(n_tok));
            const std::vector<float> expected = run(detail::tiled_order_ref(type), p);
            for (Isa isa : kAllIsas) {
                if (isa > cpu.best_isa() || isa == Isa::Scalar) continue;
                const std::vector<float> got = run(select_batch_order_gemm(type, limit_to(cpu, isa)).kernel.fn, p);
                for (int t = 0; t < p.n_tok; ++t) {
                    for (int r = 0; r < p.n_rows; ++r) {
                        const size_t i = static_cast<size_t>(t) * p.y_stride + r;
                        ASSERT_EQ(std::memcmp(&got[i], &expected[i], sizeof(float)), 0)
                            << traits(type).name << " " << isa_name(isa) << " tokens=" << n_tok << " t=" << t
                            << " r=" << r << ": " << got[i] << " vs " << expected[i];
                    }
                }
                // Outputs between the rows (the padding of y_stride) are left alone.
                for (int t = 0; t < p.n_tok; ++t) {
                    for (size_t r = static_cast<size_t>(p.n_rows); r < p.y_stride; ++r)
                        ASSERT_TRUE(std::isnan(got[static_cast<size_t>(t) * p.y_stride + r])) << traits(type).name;
                }
            }
        }
    }
}

TEST(GemmBatchOrder, RunsOfEightOrMoreTokens) {
    const CpuFeatures cpu = host_cpu_features();
    if (cpu.best_isa() < Isa::Avx2) GTEST_SKIP() << "no batch order below AVX2 (llama.cpp's tiled kernels need AVX)";
    for (GgmlType type : kTiledTypes) {
        const BatchOrderGemm order = select_batch_order_gemm(type, cpu);
        ASSERT_NE(order.applies, nullptr);
        EXPECT_FALSE(order.applies(64, 256, 1, 0));
        EXPECT_FALSE(order.applies(64, 256, 7, 6));
        EXPECT_TRUE(order.applies(64, 256, 8, 0));
        EXPECT_TRUE(order.applies(60, 256, 512, 511));
    }
    // No batch order for the types llama.cpp multiplies in one order at any batch size, nor below AVX2.
    EXPECT_EQ(select_batch_order_gemm(GgmlType::Q8_0, cpu).kernel.fn, nullptr);
    EXPECT_EQ(select_batch_order_gemm(GgmlType::Q6_K, limit_to(cpu, Isa::Scalar)).kernel.fn, nullptr);
}

// F16's batch order (llamafile's sgemm): every SIMD level gives the reference's bits, for odd row
// and token counts and padded strides; the rule takes runs of 2 or more where the tiles fit.
TEST(GemmBatchOrder, F16SimdVariantsGiveTheReferencesBits) {
    const CpuFeatures cpu = host_cpu_features();
    if (cpu.best_isa() < Isa::Avx2) GTEST_SKIP() << "no batch order below AVX2; this CPU has " << cpu.describe();
    int levels = 0;
    uint32_t seed = 11;
    for (const auto& [n, n_rows, n_tok] : {std::tuple{16, 1, 1}, {64, 5, 3}, {640, 8, 7}, {2048, 13, 9}}) {
        const size_t w_stride = static_cast<size_t>(n) * 2 + 64, a_stride = static_cast<size_t>(n) * 2 + 32;
        const size_t y_stride = static_cast<size_t>(n_rows) + 3;
        const std::vector<float> wf = test::gaussian(static_cast<size_t>(n) * n_rows, seed++);
        const std::vector<float> af = test::gaussian(static_cast<size_t>(n) * n_tok, seed++);
        std::vector<uint8_t> w(w_stride * n_rows), a(a_stride * n_tok);
        for (int r = 0; r < n_rows; ++r)
            quantize_row(GgmlType::F16, wf.data() + static_cast<size_t>(r) * n, w.data() + r * w_stride, n);
        for (int t = 0; t < n_tok; ++t)
            quantize_row(GgmlType::F16, af.data() + static_cast<size_t>(t) * n, a.data() + t * a_stride, n);
        auto run = [&](GemmFn fn) {
            std::vector<float> y(y_stride * n_tok, -1.0f);
            fn(n, n_rows, n_tok, w.data(), w_stride, a.data(), a_stride, y.data(), y_stride);
            return y;
        };
        const std::vector<float> expected = run(detail::gemm_batch_f16_ref);
        for (Isa isa : kAllIsas) {
            if (isa > cpu.best_isa() || isa == Isa::Scalar) continue;
            const BatchOrderGemm order = select_batch_order_gemm(GgmlType::F16, limit_to(cpu, isa));
            ASSERT_NE(order.kernel.fn, nullptr) << isa_name(isa);
            EXPECT_EQ(order.kernel.act_type, GgmlType::F16);
            ++levels;
            const std::vector<float> got = run(order.kernel.fn);
            EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0)
                << isa_name(isa) << " n=" << n << " rows=" << n_rows << " tokens=" << n_tok;
        }
    }
    EXPECT_GT(levels, 0);
    const BatchOrderGemm order = select_batch_order_gemm(GgmlType::F16, cpu);
    EXPECT_FALSE(order.applies(64, 256, 1, 0));   // one token: vec_dot
    EXPECT_TRUE(order.applies(64, 256, 2, 1));    // a run of 2: sgemm
    EXPECT_FALSE(order.applies(62, 256, 8, 0));   // rows not a multiple of 4
    EXPECT_FALSE(order.applies(64, 1000, 8, 0));  // columns not whole vectors
}

}  // namespace
}  // namespace fitllm::quant
