// The tiled kernels of IQ4_NL and IQ4_XS (select_gemm at every level this CPU runs): each (row,
// token) against the scalar reference dot and against the exact sum in float64 of the dequantized
// weights times the dequantized activations, over every token count from 1 to 14 (all the
// micro-kernels' widths and their remainders), row counts around the tiles (1, 7, 17, 33) and rows
// of several chunks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "quant/dot.h"
#include "quant/gemm.h"
#include "quant_test_data.h"

namespace fitllm::quant {
namespace {

TEST(GemmIq4, EveryTokenCountMatchesReferenceAndFloat64) {
    const CpuFeatures cpu = detect_cpu_features();
    int tested = 0;
    for (GgmlType w_type : {GgmlType::IQ4_NL, GgmlType::IQ4_XS}) {
        const DotKernel ref = select_dot(w_type, CpuFeatures{});
        const GgmlType a_type = dot_activation_type(w_type);
        // IQ4_NL: 2, 33 and 70 blocks (the kernels' chunks are 32 blocks); IQ4_XS: 1, 5 and 9
        // super-blocks (chunks of 4).
        const std::vector<int> widths =
            w_type == GgmlType::IQ4_NL ? std::vector<int>{64, 1056, 2240} : std::vector<int>{256, 1280, 2304};
        for (Isa isa : kAllIsas) {
            if (isa > cpu.best_isa()) continue;
            const GemmKernel k = select_gemm(w_type, limit_to(cpu, isa));
            if (k.fn == nullptr) continue;
            ASSERT_EQ(k.act_type, a_type);
            ++tested;
            double worst_ref = 0, worst_f64 = 0;
            for (int n : widths) {
                for (int rows : {1, 7, 17, 33}) {
                    const auto w = test::weight_rows(w_type, rows, n, static_cast<uint32_t>(n + rows), rows % 2 == 1);
                    const size_t w_row = test::bytes_of_row(w_type, n), a_row = test::bytes_of_row(a_type, n);
                    std::vector<std::vector<float>> w_f;
                    for (int r = 0; r < rows; ++r) w_f.push_back(test::dequantized(w_type, w.data() + r * w_row, n));
                    for (int toks = 1; toks <= 14; ++toks) {
                        const auto x =
                            test::gaussian(static_cast<size_t>(toks) * n, static_cast<uint32_t>(toks * 31 + n));
                        std::vector<uint8_t> act(a_row * toks);
                        for (int t = 0; t < toks; ++t) {
                            quantize_row(a_type, x.data() + static_cast<size_t>(t) * n, act.data() + t * a_row, n);
                        }
                        std::vector<float> y(static_cast<size_t>(rows) * toks, -1.0f);
                        k.fn(n, rows, toks, w.data(), w_row, act.data(), a_row, y.data(), rows);
                        for (int t = 0; t < toks; ++t) {
                            const auto a_f = test::dequantized(a_type, act.data() + t * a_row, n);
                            for (int r = 0; r < rows; ++r) {
                                double exact = 0, abs_sum = 0;
                                for (int i = 0; i < n; ++i) {
                                    exact += double{w_f[r][i]} * a_f[i];
                                    abs_sum += std::fabs(double{w_f[r][i]} * a_f[i]);
                                }
                                float want = 0;
                                ref.fn(n, &want, w.data() + r * w_row, act.data() + t * a_row);
                                const float got = y[static_cast<size_t>(t) * rows + r];
                                // The integer sums are exact; each block's (super-block's) term is
                                // its integer times d_w d_y (two roundings), added in float one
                                // block after another: at most (blocks + 2) roundings of partial
                                // sums bounded by sum |w a|.
                                const double blocks = n / (w_type == GgmlType::IQ4_NL ? 32.0 : 256.0);
                                const double bound = (blocks + 2) * 0x1p-24 * abs_sum + 1e-30;
                                const std::string where = std::string(traits(w_type).name) + " " +
                                                          std::string(isa_name(isa)) + " n=" + std::to_string(n) +
                                                          " rows=" + std::to_string(rows) +
                                                          " toks=" + std::to_string(toks) + " t=" + std::to_string(t) +
                                                          " r=" + std::to_string(r);
                                ASSERT_LE(std::fabs(double{got} - exact), bound) << where << ": got " << got;
                                ASSERT_LE(std::fabs(double{got} - want), 2 * bound) << where << ": got " << got;
                                worst_f64 = std::max(worst_f64, std::fabs(double{got} - exact) / (abs_sum + 1e-30));
                                worst_ref = std::max(worst_ref, std::fabs(double{got} - want) / (abs_sum + 1e-30));
                            }
                        }
                    }
                }
            }
            std::printf("%-6s %-11s worst / sum|w a|: against the reference dot %.3g, against float64 %.3g\n",
                        std::string(traits(w_type).name).c_str(), std::string(isa_name(isa)).c_str(), worst_ref,
                        worst_f64);
        }
    }
    if (tested == 0) GTEST_SKIP() << "no IQ4 tiled kernel on this CPU (" << cpu.describe() << ")";
}

}  // namespace
}  // namespace fitllm::quant
