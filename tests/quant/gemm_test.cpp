// The tiled kernels (select_gemm): every kernel any weight type has at any level the CPU can run,
// tile by tile against the scalar reference dot, over odd row, token and block counts and padded
// strides.
#include "quant/gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "quant/dot.h"
#include "quant_test_data.h"

namespace fitllm::quant {
namespace {

// Every type: the test asks select_gemm about all of them and tests whatever it returns.
std::vector<GgmlType> all_types() {
    std::vector<GgmlType> v;
    for (uint32_t i = 0; i < kGgmlTypeIdEnd; ++i) {
        const auto t = static_cast<GgmlType>(i);
        if (has_dot(t)) v.push_back(t);
    }
    return v;
}

// |gemm - reference| <= tolerance * sum |w_i a_i| (+ the min term for Q4_1 / Q5_1), as dot_test.cpp:
// the integer parts are exact, the rest is float rounding in another order.
double tolerance(GgmlType w) {
    switch (w) {
        case GgmlType::Q4_1:
        case GgmlType::Q5_1:
        case GgmlType::F32:
        case GgmlType::F16:
        case GgmlType::BF16:
            return 1e-6;
        default:
            return 5e-7;
    }
}

struct Case {
    int n, rows, toks;
};

std::vector<Case> cases_for(GgmlType w) {
    if (traits(w).block_elements == kQK) {
        return {{256, 1, 1}, {256, 5, 3}, {512, 17, 9}, {1280, 16, 8}, {2048 + 256, 33, 13}, {768, 7, 300}};
    }
    // 33 and 70 blocks cross the kernels' chunks of the row; 300 tokens a chunk of tokens.
    return {{32, 1, 1}, {32, 5, 3}, {96, 16, 8}, {640, 17, 9}, {1056, 33, 13}, {2240, 3, 21}, {160, 19, 300}};
}

struct Data {
    int n, rows, toks;
    size_t w_stride, a_stride, y_stride;
    std::vector<uint8_t> w, act;
    std::vector<std::vector<float>> w_f, a_f;  // dequantized rows, for the error scale
};

// Rows with padding after each (strides larger than the rows), as views of bigger matrices have.
Data make(GgmlType w_type, GgmlType a_type, const Case& c, uint32_t seed, bool from_floats) {
    Data d{c.n,
           c.rows,
           c.toks,
           test::bytes_of_row(w_type, c.n) + 64,
           test::bytes_of_row(a_type, c.n) + 36,
           static_cast<size_t>(c.rows) + 3,
           {},
           {},
           {},
           {}};
    const auto packed = test::weight_rows(w_type, c.rows, c.n, seed, from_floats);
    const size_t w_row = test::bytes_of_row(w_type, c.n);
    d.w.assign(d.w_stride * c.rows, 0xCD);
    for (int r = 0; r < c.rows; ++r) {
        std::memcpy(d.w.data() + r * d.w_stride, packed.data() + r * w_row, w_row);
        d.w_f.push_back(test::dequantized(w_type, d.w.data() + r * d.w_stride, c.n));
    }
    d.act.assign(d.a_stride * c.toks, 0xCD);
    const auto x = test::gaussian(static_cast<size_t>(c.toks) * c.n, seed + 77);
    for (int t = 0; t < c.toks; ++t) {
        quantize_row(a_type, x.data() + static_cast<size_t>(t) * c.n, d.act.data() + t * d.a_stride, c.n);
        d.a_f.push_back(test::dequantized(a_type, d.act.data() + t * d.a_stride, c.n));
    }
    return d;
}

std::string label(GgmlType w, Isa isa, const Case& c, bool from_floats) {
    return std::string(traits(w).name) + " " + std::string(isa_name(isa)) + " n=" + std::to_string(c.n) +
           " rows=" + std::to_string(c.rows) + " toks=" + std::to_string(c.toks) +
           (from_floats ? " quantized floats" : " random blocks");
}

TEST(Gemm, KernelsUseTheDotActivationFormat) {
    const CpuFeatures cpu = detect_cpu_features();
    for (GgmlType w : all_types()) {
        for (Isa isa : kAllIsas) {
            if (isa > cpu.best_isa()) continue;
            const GemmKernel k = select_gemm(w, limit_to(cpu, isa));
            if (k.fn == nullptr) continue;
            EXPECT_EQ(k.act_type, dot_activation_type(w)) << traits(w).name;
            EXPECT_LE(k.isa, isa) << traits(w).name;
            EXPECT_GE(k.row_tile, 1);
            EXPECT_GE(k.tok_tile, 1);
        }
    }
    EXPECT_EQ(select_gemm(GgmlType::Q5_0, CpuFeatures{}).fn, nullptr);  // no scalar tiles: the dots
}

TEST(Gemm, TilesMatchReferenceDots) {
    const CpuFeatures cpu = detect_cpu_features();
    int tested = 0;
    for (GgmlType w : all_types()) {
        const DotKernel ref = select_dot(w, CpuFeatures{});
        for (Isa isa : kAllIsas) {
            if (isa > cpu.best_isa()) continue;
            const GemmKernel k = select_gemm(w, limit_to(cpu, isa));
            if (k.fn == nullptr) continue;
            ++tested;
            double worst = 0;
            for (bool from_floats : {true, false}) {
                for (const Case& c : cases_for(w)) {
                    const Data d =
                        make(w, k.act_type, c, static_cast<uint32_t>(c.n * 13 + c.rows) + static_cast<uint32_t>(w),
                             from_floats);
                    const float sentinel = -12345.0f;
                    std::vector<float> y(d.y_stride * c.toks, sentinel);
                    k.fn(c.n, c.rows, c.toks, d.w.data(), d.w_stride, d.act.data(), d.a_stride, y.data(), d.y_stride);
                    int failures = 0;
                    for (int t = 0; t < c.toks; ++t) {
                        for (size_t r = 0; r < d.y_stride; ++r) {
                            const float got = y[t * d.y_stride + r];
                            if (r >= static_cast<size_t>(c.rows)) {  // outside the tile: untouched
                                ASSERT_EQ(got, sentinel) << label(w, isa, c, from_floats) << " t=" << t << " r=" << r;
                                continue;
                            }
                            float want = 0;
                            ref.fn(c.n, &want, d.w.data() + r * d.w_stride, d.act.data() + t * d.a_stride);
                            double abs_sum = 0;
                            for (int i = 0; i < c.n; ++i) abs_sum += std::fabs(double{d.w_f[r][i]} * d.a_f[t][i]);
                            const double err = std::fabs(double{got} - want);
                            worst = std::max(worst, err / (abs_sum + 1e-30));
                            if (!(err <= tolerance(w) * abs_sum + 1e-30) && failures++ < 5) {
                                ADD_FAILURE() << label(w, isa, c, from_floats) << " t=" << t << " r=" << r << ": got "
                                              << got << ", want " << want;
                            }
                        }
                    }
                }
            }
            std::printf("%-5s %-11s worst |gemm - reference| / sum|w a| = %.3g\n", std::string(traits(w).name).c_str(),
                        std::string(isa_name(isa)).c_str(), worst);
        }
    }
    std::printf("%d kernels tested\n", tested);
    if (tested == 0) GTEST_SKIP() << "no tiled kernel on this CPU (" << cpu.describe() << ")";
}

TEST(Gemm, ZeroActivationsGiveZero) {
    const CpuFeatures cpu = detect_cpu_features();
    for (GgmlType w : all_types()) {
        for (Isa isa : kAllIsas) {
            if (isa > cpu.best_isa()) continue;
            const GemmKernel k = select_gemm(w, limit_to(cpu, isa));
            if (k.fn == nullptr) continue;
            const int n = 512, rows = 5, toks = 3;
            const auto weights = test::weight_rows(w, rows, n, 5, false);
            const size_t w_row = test::bytes_of_row(w, n), a_row = test::bytes_of_row(k.act_type, n);
            std::vector<uint8_t> act(a_row * toks);
            const std::vector<float> zeros(n, 0.0f);
            for (int t = 0; t < toks; ++t) quantize_row(k.act_type, zeros.data(), act.data() + t * a_row, n);
            std::vector<float> y(rows * toks, 1.0f);
            k.fn(n, rows, toks, weights.data(), w_row, act.data(), a_row, y.data(), rows);
            for (float v : y) EXPECT_EQ(v, 0.0f) << traits(w).name << " " << isa_name(isa);
        }
    }
}

}  // namespace
}  // namespace fitllm::quant
