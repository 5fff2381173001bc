// The dot kernels: every SIMD variant the CPU can run against the scalar reference, and the
// reference against the dot of the dequantized rows.
#include "quant/dot.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "quant_test_data.h"

namespace fitllm::quant {
namespace {

using test::kDotWeightTypes;

// |variant - reference| <= tolerance * sum |w_i a_i|. The integer part of every quantized dot is
// exact, so variants differ from the reference (which sums in double) only by float rounding:
// d_w * d_a products, int-to-float conversions, and accumulation in a different order. The worst
// seen (Gaussian data, n up to 8192, every level) is 2e-8 .. 9e-8; the bounds leave ~10x.
double variant_tolerance(GgmlType w) {
    switch (w) {
        case GgmlType::F32:
        case GgmlType::F16:  // exact (below), but the reference of this test sums in double
        case GgmlType::BF16:
            return 1e-6;  // float FMA chains of n / 32 .. n / 64 terms per accumulator
        case GgmlType::Q4_1:
        case GgmlType::Q5_1:
            return 1e-6;  // two float sums (d q y and m s) that may cancel
        default:
            return 5e-7;  // one float term per block or super-block
    }
}

// The weight types whose float arithmetic dot_ref.cpp defines as llama.cpp's (lanes8 or serial):
// every variant must give the reference's float bit for bit.
bool exact_arithmetic(GgmlType w) {
    switch (w) {
        case GgmlType::F16:  // ggml_vec_dot_f16
        case GgmlType::Q4_0:
        case GgmlType::Q5_0:
        case GgmlType::Q8_0:
        case GgmlType::IQ4_NL:
        case GgmlType::IQ4_XS:
        case GgmlType::TQ1_0:
        case GgmlType::TQ2_0:
        case GgmlType::MXFP4:
        case GgmlType::IQ3_XXS:
        case GgmlType::IQ3_S:
        case GgmlType::IQ2_XXS:
        case GgmlType::IQ2_XS:
        case GgmlType::IQ2_S:
        case GgmlType::IQ1_S:
        case GgmlType::IQ1_M:
        case GgmlType::Q2_K:
        case GgmlType::Q3_K:
        case GgmlType::Q4_K:
        case GgmlType::Q5_K:
        case GgmlType::Q6_K:
            return true;
        default:
            return false;
    }
}

std::vector<int> sizes_for(GgmlType w) {
    switch (traits(w).block_elements) {
        case 1:
            return {1, 7, 8, 31, 32, 33, 100, 255, 4097, 8191, 8192};
        case 32:
            return {32, 64, 96, 160, 256, 4096 + 32, 8192};
        default:
            return {256, 512, 768, 1280, 4096, 8192};
    }
}

struct Rows {
    GgmlType w_type, act_type;
    int n, rows;
    std::vector<uint8_t> w;    // rows x row_bytes(w_type, n)
    std::vector<uint8_t> act;  // one row of act_type
    std::vector<float> act_f;  // the activations dequantized (what the integer dot sees)

    const void* w_row(int r) const { return w.data() + static_cast<size_t>(r) * test::bytes_of_row(w_type, n); }
};

Rows make_rows(GgmlType w_type, int n, int rows, uint32_t seed, bool from_floats) {
    Rows d{w_type, dot_activation_type(w_type), n, rows, {}, {}, {}};
    d.w = test::weight_rows(w_type, rows, n, seed, from_floats);
    const auto a = test::gaussian(static_cast<size_t>(n), seed + 1000);
    d.act.resize(test::bytes_of_row(d.act_type, n));
    quantize_row(d.act_type, a.data(), d.act.data(), n);
    d.act_f = test::dequantized(d.act_type, d.act.data(), n);
    return d;
}

struct Exact {
    double dot = 0;      // sum w_i a_i of the dequantized values, in double
    double abs_sum = 0;  // sum |w_i a_i|: the scale of the rounding errors
};
Exact exact_dot(const Rows& d, int r) {
    const auto w = test::dequantized(d.w_type, d.w_row(r), d.n);
    Exact e;
    for (int i = 0; i < d.n; ++i) {
        const double p = static_cast<double>(w[i]) * d.act_f[i];
        e.dot += p;
        e.abs_sum += std::fabs(p);
    }
    return e;
}

// Q4_1 / Q5_1: the Q8_1 activations carry s = d * sum(q) rounded to fp16 (as llama.cpp does),
// so the kernels' min term m_w * s differs from m_w * d * sum(q) by at most |m_w| |s| 2^-11.
double q8_1_rounding_bound(const Rows& d, int r) {
    if (d.act_type != GgmlType::Q8_1) return 0;
    const auto* a = static_cast<const BlockQ8_1*>(static_cast<const void*>(d.act.data()));
    double bound = 0;
    for (int b = 0; b < d.n / 32; ++b) {
        uint16_t m;  // Q4_1 and Q5_1 both start with d, m
        std::memcpy(&m, static_cast<const uint8_t*>(d.w_row(r)) + b * traits(d.w_type).block_bytes + 2, 2);
        bound += std::fabs(fp16_to_fp32(m)) * std::fabs(fp16_to_fp32(a[b].s)) * 0x1p-11;
    }
    return bound;
}

std::string label(GgmlType w, Isa isa, int n, bool from_floats) {
    return std::string(traits(w).name) + " " + std::string(isa_name(isa)) + " n=" + std::to_string(n) +
           (from_floats ? " quantized floats" : " random blocks");
}

TEST(Dot, ActivationPairsFollowLlamaCpp) {
    EXPECT_EQ(dot_activation_type(GgmlType::Q4_0), GgmlType::Q8_0);
    EXPECT_EQ(dot_activation_type(GgmlType::Q5_0), GgmlType::Q8_0);
    EXPECT_EQ(dot_activation_type(GgmlType::Q8_0), GgmlType::Q8_0);
    EXPECT_EQ(dot_activation_type(GgmlType::IQ4_NL), GgmlType::Q8_0);
    EXPECT_EQ(dot_activation_type(GgmlType::Q4_1), GgmlType::Q8_1);
    EXPECT_EQ(dot_activation_type(GgmlType::Q5_1), GgmlType::Q8_1);
    EXPECT_EQ(dot_activation_type(GgmlType::MXFP4), GgmlType::Q8_0);
    for (GgmlType k : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS,
                       GgmlType::TQ1_0, GgmlType::TQ2_0, GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ2_XXS,
                       GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ1_S, GgmlType::IQ1_M}) {
        EXPECT_EQ(dot_activation_type(k), GgmlType::Q8_K);
    }
    for (GgmlType f : {GgmlType::F32, GgmlType::BF16}) EXPECT_EQ(dot_activation_type(f), GgmlType::F32);
    EXPECT_EQ(dot_activation_type(GgmlType::F16), GgmlType::F16);  // llama.cpp's vec_dot_type for F16
}

TEST(Dot, EveryWeightTypeHasAKernelAtEveryLevel) {
    for (GgmlType w : kDotWeightTypes) {
        EXPECT_TRUE(has_dot(w)) << traits(w).name;
        for (Isa isa : kAllIsas) {
            // Features as a CPU of exactly that level would report them.
            CpuFeatures f;
            f.avx2 = f.fma = f.f16c = isa >= Isa::Avx2;
            f.avx512f = f.avx512bw = f.avx512vl = isa >= Isa::Avx512;
            f.avx512_vnni = isa >= Isa::Avx512Vnni;
            const DotKernel k = select_dot(w, f);
            ASSERT_NE(k.fn, nullptr);
            EXPECT_EQ(k.isa, isa) << traits(w).name;
            EXPECT_EQ(k.act_type, dot_activation_type(w));
        }
    }
    EXPECT_FALSE(has_dot(GgmlType::NVFP4));
    EXPECT_EQ(select_dot(GgmlType::NVFP4, detect_cpu_features()).fn, nullptr);
    EXPECT_EQ(select_dot(GgmlType::Q8_K, detect_cpu_features()).fn, nullptr);  // an activation format
}

TEST(Dot, ReferenceMatchesDequantizedDot) {
    for (GgmlType w : kDotWeightTypes) {
        for (bool from_floats : {true, false}) {
            for (int n : sizes_for(w)) {
                const Rows d =
                    make_rows(w, n, 3, static_cast<uint32_t>(n) * 31 + static_cast<uint32_t>(w), from_floats);
                const DotKernel ref = select_dot(w, CpuFeatures{});
                ASSERT_EQ(ref.isa, Isa::Scalar);
                for (int r = 0; r < d.rows; ++r) {
                    float got = 0;
                    ref.fn(n, &got, d.w_row(r), d.act.data());
                    const Exact e = exact_dot(d, r);
                    // The reference sums in double: it is off by the final rounding to float and the
                    // float products of the dequantized values, a few 1e-7 of sum |w a|.
                    EXPECT_NEAR(got, e.dot, 1e-6 * e.abs_sum + q8_1_rounding_bound(d, r))
                        << label(w, Isa::Scalar, n, from_floats) << " row " << r;
                }
            }
        }
    }
}

TEST(Dot, VariantsMatchReference) {
    const CpuFeatures cpu = detect_cpu_features();
    const Isa best = cpu.best_isa();
    if (best == Isa::Scalar) GTEST_SKIP() << "no SIMD level on this CPU (" << cpu.describe() << ")";
    for (GgmlType w : kDotWeightTypes) {
        double worst = 0;  // the largest |variant - reference| / sum |w a| seen, for the record
        const DotKernel ref = select_dot(w, CpuFeatures{});
        for (Isa isa : kAllIsas) {
            if (isa == Isa::Scalar || isa > best) continue;
            const DotKernel k = select_dot(w, limit_to(cpu, isa));
            ASSERT_EQ(k.isa, isa) << traits(w).name;
            for (bool from_floats : {true, false}) {
                for (int n : sizes_for(w)) {
                    const int rows = n <= 256 ? 5 : 3;  // odd row counts
                    const Rows d =
                        make_rows(w, n, rows, static_cast<uint32_t>(n) * 7 + static_cast<uint32_t>(w), from_floats);
                    for (int r = 0; r < rows; ++r) {
                        float want = 0, got = 0;
                        ref.fn(n, &want, d.w_row(r), d.act.data());
                        k.fn(n, &got, d.w_row(r), d.act.data());
                        const Exact e = exact_dot(d, r);
                        const double err = std::fabs(static_cast<double>(got) - want);
                        worst = std::max(worst, err / e.abs_sum);
                        EXPECT_LE(err, variant_tolerance(w) * e.abs_sum + 1e-30)
                            << label(w, isa, n, from_floats) << " row " << r << ": got " << got << ", want " << want;
                        if (exact_arithmetic(w)) {
                            EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0)
                                << label(w, isa, n, from_floats) << " row " << r << ": got " << got << ", want " << want
                                << " (not the reference's bits)";
                        }
                    }
                }
            }
        }
        std::printf("%-5s worst |variant - reference| / sum|w a| = %.3g\n", std::string(traits(w).name).c_str(), worst);
    }
}

// DotKernel::rows (matrix-vector over many rows at once) gives every row the float its fn gives,
// for row counts around its groups of eight and sixteen, at every level the CPU has; and rows of
// more than 512 blocks of 32 (the AVX-512 kernels' offsets come in chunks of 512 blocks), and of 67
// super-blocks for the k-quants.
TEST(Dot, RowsGiveEachRowTheDotsBits) {
    const CpuFeatures cpu = detect_cpu_features();
    if (cpu.best_isa() < Isa::Avx2) GTEST_SKIP() << "no AVX2 on this CPU (" << cpu.describe() << ")";
    int checked = 0;
    for (GgmlType w : kDotWeightTypes) {
        for (Isa isa : kAllIsas) {
            if (isa > cpu.best_isa()) continue;
            const DotKernel k = select_dot(w, limit_to(cpu, isa));
            if (k.rows == nullptr) continue;
            std::vector<int> sizes = sizes_for(w);
            if (traits(w).block_elements == 32) sizes.push_back(32 * (2 * 512 + 3));
            if (traits(w).block_elements == 256) sizes.push_back(256 * 67);  // rows longer than the model's
            for (int n : sizes) {
                for (int n_rows : {1, 7, 8, 9, 15, 16, 17, 19, 24, 33, 47}) {
                    if (n > 8192 && n_rows > 19) continue;
                    const Rows d = make_rows(w, n, n_rows, static_cast<uint32_t>(n * 31 + n_rows), false);
                    std::vector<float> got(static_cast<size_t>(n_rows), -1.0f);
                    k.rows(n, n_rows, got.data(), d.w_row(0), test::bytes_of_row(w, n), d.act.data());
                    for (int r = 0; r < n_rows; ++r) {
                        float want = 0;
                        k.fn(n, &want, d.w_row(r), d.act.data());
                        EXPECT_EQ(std::memcmp(&got[size_t(r)], &want, sizeof want), 0)
                            << label(w, isa, n, false) << " row " << r << " of " << n_rows << ": got " << got[size_t(r)]
                            << ", want " << want;
                    }
                }
            }
            ++checked;
        }
    }
    // Q4_0 and IQ4_NL have one from AVX2 on (their serial order is the same at every level); with
    // AVX-512 Q4_0 has its own sixteen-row kernel, and IQ4_NL too where there is VNNI; Q4_K has one
    // at both AVX-512 levels, none below; so have Q8_0 and Q5_0 (in their lanes8 order).
    EXPECT_NE(select_dot(GgmlType::Q4_0, limit_to(cpu, Isa::Avx2)).rows, nullptr);
    EXPECT_NE(select_dot(GgmlType::IQ4_NL, limit_to(cpu, Isa::Avx2)).rows, nullptr);
    EXPECT_EQ(select_dot(GgmlType::Q4_0, CpuFeatures{}).rows, nullptr);
    EXPECT_EQ(select_dot(GgmlType::Q4_K, limit_to(cpu, Isa::Avx2)).rows, nullptr);
    EXPECT_EQ(select_dot(GgmlType::Q8_0, limit_to(cpu, Isa::Avx2)).rows, nullptr);
    EXPECT_EQ(select_dot(GgmlType::Q5_0, limit_to(cpu, Isa::Avx2)).rows, nullptr);
    for (Isa isa : {Isa::Avx512, Isa::Avx512Vnni}) {
        if (isa > cpu.best_isa()) continue;
        const auto rows = [&](GgmlType w, Isa level) { return select_dot(w, limit_to(cpu, level)).rows; };
        EXPECT_NE(rows(GgmlType::Q4_0, isa), rows(GgmlType::Q4_0, Isa::Avx2)) << isa_name(isa);
        EXPECT_NE(rows(GgmlType::Q4_K, isa), nullptr) << isa_name(isa);
        EXPECT_NE(rows(GgmlType::Q8_0, isa), nullptr) << isa_name(isa);
        EXPECT_NE(rows(GgmlType::Q5_0, isa), nullptr) << isa_name(isa);
        if (isa == Isa::Avx512Vnni)
            EXPECT_NE(rows(GgmlType::IQ4_NL, isa), rows(GgmlType::IQ4_NL, Isa::Avx2));
        else
            EXPECT_EQ(rows(GgmlType::IQ4_NL, isa), rows(GgmlType::IQ4_NL, Isa::Avx2));
    }
    EXPECT_GT(checked, 0);
}

// Rows apart (a stride past the row's bytes, as a view of a wider matrix): each row still the
// float fn gives it. The Q8_0 kernel reads back-to-back rows another way.
TEST(Dot, RowsApartGiveEachRowTheDotsBits) {
    const CpuFeatures cpu = detect_cpu_features();
    if (cpu.best_isa() < Isa::Avx2) GTEST_SKIP() << "no AVX2 on this CPU (" << cpu.describe() << ")";
    int checked = 0;
    for (GgmlType w : kDotWeightTypes) {
        for (Isa isa : kAllIsas) {
            if (isa > cpu.best_isa()) continue;
            const DotKernel k = select_dot(w, limit_to(cpu, isa));
            if (k.rows == nullptr) continue;
            const int n = 4 * traits(w).block_elements, n_rows = 35;
            const size_t row_bytes = test::bytes_of_row(w, n), stride = row_bytes + 40;
            const Rows d = make_rows(w, n, n_rows, 77, false);
            std::vector<uint8_t> apart(stride * n_rows, 0xA5);
            for (int r = 0; r < n_rows; ++r)
                std::memcpy(apart.data() + static_cast<size_t>(r) * stride, d.w_row(r), row_bytes);
            std::vector<float> got(static_cast<size_t>(n_rows), -1.0f);
            k.rows(n, n_rows, got.data(), apart.data(), stride, d.act.data());
            for (int r = 0; r < n_rows; ++r) {
                float want = 0;
                k.fn(n, &want, d.w_row(r), d.act.data());
                EXPECT_EQ(std::memcmp(&got[size_t(r)], &want, sizeof want), 0)
                    << label(w, isa, n, false) << " row " << r << ": got " << got[size_t(r)] << ", want " << want;
            }
            ++checked;
        }
    }
    EXPECT_GT(checked, 0);
}

TEST(Dot, ZeroActivationsGiveZero) {
    const CpuFeatures cpu = detect_cpu_features();
    for (GgmlType w : kDotWeightTypes) {
        const int n = 512;
        const auto weights = test::weight_rows(w, 1, n, 5, false);
        const GgmlType at = dot_activation_type(w);
        std::vector<uint8_t> act(test::bytes_of_row(at, n));
        const std::vector<float> zeros(n, 0.0f);
        quantize_row(at, zeros.data(), act.data(), n);
        for (Isa isa : kAllIsas) {
            if (isa > cpu.best_isa()) continue;
            float got = 1;
            select_dot(w, limit_to(cpu, isa)).fn(n, &got, weights.data(), act.data());
            EXPECT_EQ(got, 0.0f) << label(w, isa, n, false);
        }
    }
}

}  // namespace
}  // namespace fitllm::quant
