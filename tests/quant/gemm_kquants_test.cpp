// The tiled kernels of the k-quants (gemm_avx2_kquants.cpp, gemm_avx512_kquants.cpp): every
// level the CPU can run (host_cpu_features, so FITLLM_CPU_ISA lowers it) against the scalar
// reference dot and the dot kernel of the same level, for odd tile shapes and strides.
//
// Against the dot kernel of the same level the results are bit for bit equal: the tiles do the
// same integer arithmetic in the same lanes and the same float steps in the same order, so a
// prompt gives the same logits whether matmul runs it as a batch or token by token
// (tests/ops/matmul_test.cpp holds matmul to that).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "quant/dot.h"
#include "quant/gemm.h"
#include "quant_test_data.h"

namespace fitllm::quant {
namespace {

constexpr GgmlType kKQuants[] = {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

// |gemm - reference| <= kTolerance * sum |w_i a_i|. The integer sums of a super-block are exact in
// both, so they differ only by float rounding (d_w * d_a, the int-to-float conversions, the order
// of accumulation), as the dot kernels do (dot_test.cpp: worst seen ~1e-7, bound 5e-7).
constexpr double kTolerance = 5e-7;

struct Problem {
    GgmlType type;
    int n, n_rows, n_tok;
    size_t w_stride, act_stride, y_stride;  // bytes, bytes, floats: all with some padding
    std::vector<uint8_t> w, act;
    std::vector<double> abs_sum;  // [t * n_rows + r]: sum |w_i a_i| of the dequantized values

    const void* w_row(int r) const { return w.data() + static_cast<size_t>(r) * w_stride; }
    const void* act_row(int t) const { return act.data() + static_cast<size_t>(t) * act_stride; }
};

Problem make_problem(GgmlType type, int n, int n_rows, int n_tok, bool from_floats, uint32_t seed) {
    Problem p{type, n, n_rows, n_tok, 0, 0, 0, {}, {}, {}};
    const size_t w_row = test::bytes_of_row(type, n), a_row = test::bytes_of_row(GgmlType::Q8_K, n);
    // Padded strides: the kernels may not assume rows are contiguous. (Rows stay aligned to their
    // blocks' fields, as ggml's are: a misaligned block is undefined behaviour in C++.)
    p.w_stride = w_row + 8;
    p.act_stride = a_row + 8;
    p.y_stride = static_cast<size_t>(n_rows) + 3;
    const std::vector<uint8_t> rows = test::weight_rows(type, n_rows, n, seed, from_floats);
    p.w.assign(p.w_stride * static_cast<size_t>(n_rows), 0xA5);
    for (int r = 0; r < n_rows; ++r) std::copy_n(rows.data() + r * w_row, w_row, p.w.begin() + r * p.w_stride);
    p.act.assign(p.act_stride * static_cast<size_t>(n_tok), 0x5A);
    const auto x = test::gaussian(static_cast<size_t>(n) * static_cast<size_t>(n_tok), seed + 1000);
    for (int t = 0; t < n_tok; ++t) {
        quantize_row(GgmlType::Q8_K, x.data() + static_cast<size_t>(t) * n, p.act.data() + t * p.act_stride, n);
    }
    std::vector<std::vector<float>> wf, af;
    for (int r = 0; r < n_rows; ++r) wf.push_back(test::dequantized(type, p.w_row(r), n));
    for (int t = 0; t < n_tok; ++t) af.push_back(test::dequantized(GgmlType::Q8_K, p.act_row(t), n));
    for (int t = 0; t < n_tok; ++t) {
        for (int r = 0; r < n_rows; ++r) {
            double s = 0;
            for (int i = 0; i < n; ++i) s += std::fabs(static_cast<double>(wf[r][i]) * af[t][i]);
            p.abs_sum.push_back(s);
        }
    }
    return p;
}

// Fills y (n_tok rows of y_stride, NaN everywhere first) with the kernel's results.
std::vector<float> run(const GemmKernel& k, const Problem& p) {
    std::vector<float> y(p.y_stride * static_cast<size_t>(p.n_tok), std::numeric_limits<float>::quiet_NaN());
    k.fn(p.n, p.n_rows, p.n_tok, p.w.data(), p.w_stride, p.act.data(), p.act_stride, y.data(), p.y_stride);
    return y;
}

std::string label(const Problem& p, Isa isa, bool from_floats) {
    return std::string(traits(p.type).name) + " " + std::string(isa_name(isa)) + " n=" + std::to_string(p.n) +
           " rows=" + std::to_string(p.n_rows) + " tok=" + std::to_string(p.n_tok) +
           (from_floats ? " quantized floats" : " random blocks");
}

// The levels with SIMD kernels that this CPU (lowered by FITLLM_CPU_ISA) runs.
std::vector<Isa> simd_levels() {
    std::vector<Isa> levels;
    const Isa best = host_cpu_features().best_isa();
    for (Isa isa : kAllIsas) {
        if (isa != Isa::Scalar && isa <= best) levels.push_back(isa);
    }
    return levels;
}

TEST(GemmKQuants, EveryKQuantHasATiledKernelAtEverySimdLevel) {
    for (GgmlType type : kKQuants) {
        for (Isa isa : kAllIsas) {
            CpuFeatures f;  // as a CPU of exactly that level would report them
            f.avx2 = f.fma = f.f16c = isa >= Isa::Avx2;
            f.avx512f = f.avx512bw = f.avx512vl = isa >= Isa::Avx512;
            f.avx512_vnni = isa >= Isa::Avx512Vnni;
            const GemmKernel k = select_gemm(type, f);
            if (isa == Isa::Scalar) {
                EXPECT_EQ(k.fn, nullptr) << traits(type).name;
                continue;
            }
            ASSERT_NE(k.fn, nullptr) << traits(type).name << " " << isa_name(isa);
            EXPECT_EQ(k.isa, isa) << traits(type).name;
            EXPECT_EQ(k.act_type, GgmlType::Q8_K);
            EXPECT_GE(k.row_tile, 1);
            EXPECT_GE(k.tok_tile, 1);
        }
    }
}

TEST(GemmKQuants, MatchesDotKernels) {
    const std::vector<Isa> levels = simd_levels();
    if (levels.empty()) GTEST_SKIP() << "no SIMD level on this CPU";
    const CpuFeatures cpu = host_cpu_features();
    // Tile shapes around the kernels' token passes (8, 4, 2, 1), and one as matmul hands them out (up
    // to 64 rows and 256 tokens).
    const std::pair<int, int> shapes[] = {{1, 1}, {3, 7}, {7, 17}, {17, 3}, {2, 9}, {5, 8}, {1, 16}, {4, 5}, {64, 37}};
    for (GgmlType type : kKQuants) {
        const DotKernel ref = select_dot(type, CpuFeatures{});
        ASSERT_EQ(ref.isa, Isa::Scalar);
        double worst = 0;  // the largest |gemm - reference| / sum|w a| seen, for the record
        for (Isa isa : levels) {
            const GemmKernel k = select_gemm(type, limit_to(cpu, isa));
            ASSERT_NE(k.fn, nullptr) << traits(type).name << " " << isa_name(isa);
            ASSERT_EQ(k.isa, isa);
            const DotKernel dot = select_dot(type, limit_to(cpu, isa));
            ASSERT_EQ(dot.isa, isa);
            // 4608: wide enough that the AVX-512 kernels run the row in two slabs (gemm_avx512_kquants.cpp).
            for (int n : {256, 512, 2816, 4608}) {
                for (bool from_floats : {true, false}) {
                    for (const auto& [n_rows, n_tok] : shapes) {
                        const uint32_t seed =
                            static_cast<uint32_t>(n * 131 + n_rows * 17 + n_tok) + static_cast<uint32_t>(type);
                        const Problem p = make_problem(type, n, n_rows, n_tok, from_floats, seed);
                        const std::vector<float> y = run(k, p);
                        for (int t = 0; t < n_tok; ++t) {
                            for (int r = 0; r < static_cast<int>(p.y_stride); ++r) {
                                const float got = y[t * p.y_stride + r];
                                if (r >= n_rows) {  // padding: not to be written
                                    EXPECT_TRUE(std::isnan(got)) << label(p, isa, from_floats) << " wrote y[" << t
                                                                 << "][" << r << "] past n_rows";
                                    continue;
                                }
                                float want = 0, want_dot = 0;
                                ref.fn(n, &want, p.w_row(r), p.act_row(t));
                                dot.fn(n, &want_dot, p.w_row(r), p.act_row(t));
                                const double scale = p.abs_sum[t * n_rows + r] + 1e-30;
                                const double err = std::fabs(static_cast<double>(got) - want);
                                worst = std::max(worst, err / scale);
                                EXPECT_LE(err, kTolerance * scale)
                                    << label(p, isa, from_floats) << " row " << r << " tok " << t << ": got " << got
                                    << ", reference " << want;
                                EXPECT_EQ(got, want_dot) << label(p, isa, from_floats) << " row " << r << " tok " << t
                                                         << ": not the dot kernel's result";
                            }
                        }
                    }
                }
            }
        }
        std::printf("%-5s worst |gemm - reference| / sum|w a| = %.3g\n", std::string(traits(type).name).c_str(), worst);
    }
}

TEST(GemmKQuants, ZeroActivationsGiveZero) {
    const CpuFeatures cpu = host_cpu_features();
    for (GgmlType type : kKQuants) {
        for (Isa isa : simd_levels()) {
            const GemmKernel k = select_gemm(type, limit_to(cpu, isa));
            ASSERT_NE(k.fn, nullptr);
            const int n = 512, n_rows = 3, n_tok = 11;
            const auto w = test::weight_rows(type, n_rows, n, 9, false);
            const size_t w_row = test::bytes_of_row(type, n), a_row = test::bytes_of_row(GgmlType::Q8_K, n);
            std::vector<uint8_t> act(a_row * n_tok);
            const std::vector<float> zeros(n, 0.0f);
            for (int t = 0; t < n_tok; ++t) quantize_row(GgmlType::Q8_K, zeros.data(), act.data() + t * a_row, n);
            std::vector<float> y(static_cast<size_t>(n_rows * n_tok), 1.0f);
            k.fn(n, n_rows, n_tok, w.data(), w_row, act.data(), a_row, y.data(), n_rows);
            for (float v : y) EXPECT_EQ(v, 0.0f) << traits(type).name << " " << isa_name(isa);
        }
    }
}

}  // namespace
}  // namespace fitllm::quant
