#include "ops/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "quant/dequantize.h"
#include "quant/gemm.h"
#include "quant/quantize.h"

namespace fitllm::ops {
namespace {

using quant::GgmlType;

struct Matrix {
    std::vector<std::byte> bytes;
    WeightView view;
};

Matrix make_weights(GgmlType type, int64_t rows, int64_t cols, size_t padding, std::mt19937& rng) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const size_t packed = *quant::row_bytes(type, static_cast<uint64_t>(cols));
    const size_t stride = packed + padding;
    Matrix m;
    m.bytes.resize(stride * static_cast<size_t>(rows));
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
        for (float& v : row) v = dist(rng);
        std::byte* dst = m.bytes.data() + r * stride;
        if (type == GgmlType::F32) {
            std::memcpy(dst, row.data(), packed);
        } else {
            quant::quantize_row(type, row.data(), dst, cols);
        }
    }
    m.view = WeightView{type, rows, cols, m.bytes.data(), padding == 0 ? 0 : stride};
    return m;
}

// The scalar reference: the weights dequantized, the activations exact, the sum in double.
// Returns the expected value and a bound on the error that quantizing the activations may add.
struct Expected {
    double value;
    double tolerance;
};

Expected reference_dot(const WeightView& w, int64_t r, const float* x, bool quantized_activations) {
    std::vector<float> row(static_cast<size_t>(w.cols));
    quant::dequantize_row(w.type, w.row(r), row.data(), w.cols);
    double sum = 0.0;
    double sum_abs = 0.0;
    double sum_abs_w = 0.0;
    double amax_x = 0.0;
    for (int64_t c = 0; c < w.cols; ++c) {
        sum += static_cast<double>(row[c]) * x[c];
        sum_abs += std::fabs(static_cast<double>(row[c]) * x[c]);
        sum_abs_w += std::fabs(row[c]);
        amax_x = std::max(amax_x, std::fabs(static_cast<double>(x[c])));
    }
    // 8-bit activations are off by at most half a step of amax / 127 per value.
    double tolerance = 1e-5 * sum_abs + 1e-6;
    if (quantized_activations) tolerance += sum_abs_w * amax_x / 127.0 * 0.5 * 1.05;
    // F16 weights take f16 activations (as llama.cpp's do): each off by at most 2^-11 of itself.
    if (w.type == GgmlType::F16) tolerance += sum_abs * 0x1p-11;
    return {sum, tolerance};
}

struct Case {
    GgmlType type;
    int64_t cols;
};

class MatmulByType : public ::testing::TestWithParam<Case> {};

TEST_P(MatmulByType, MatchesDequantizedReference) {
    const Case c = GetParam();
    std::mt19937 rng(1234 + static_cast<unsigned>(c.type));
    std::normal_distribution<float> dist(0.0f, 1.0f);
    Scratch scratch;
    const bool quantized_activations = c.type != GgmlType::F32 && c.type != GgmlType::F16;

    for (int64_t rows : {1, 7, 33}) {
        const Matrix m = make_weights(c.type, rows, c.cols, rows == 7 ? 64 : 0, rng);
        constexpr int kMaxTok = 7;
        std::vector<float> x(static_cast<size_t>(kMaxTok * c.cols));
        for (float& v : x) v = dist(rng);

        // Single-token results: the reference each batched result must reproduce, bit for bit
        // where the batch runs on the dots; the tiled kernels (quant/gemm.h) sum in another order
        // and agree to float rounding (here: 1e-5 of sum |w x|).
        std::vector<float> single(static_cast<size_t>(kMaxTok * rows));
        const bool tiled = quant::select_gemm(c.type, scratch.features()).fn != nullptr;
        std::vector<double> rounding(static_cast<size_t>(kMaxTok * rows));
        for (int t = 0; t < kMaxTok; ++t) {
            for (int64_t r = 0; r < rows; ++r)
                rounding[t * rows + r] = reference_dot(m.view, r, x.data() + t * c.cols, false).tolerance;
        }
        ThreadPool one(1);
        for (int t = 0; t < kMaxTok; ++t)
            matmul(m.view, x.data() + t * c.cols, 1, single.data() + t * rows, one, scratch);

        for (int t = 0; t < kMaxTok; ++t) {
            for (int64_t r = 0; r < rows; ++r) {
                const Expected e = reference_dot(m.view, r, x.data() + t * c.cols, quantized_activations);
                ASSERT_NEAR(single[t * rows + r], e.value, e.tolerance) << "row " << r << " token " << t;
            }
        }
        for (int n_threads = 1; n_threads <= 3; ++n_threads) {
            ThreadPool pool(n_threads);
            for (int n_tok = 1; n_tok <= kMaxTok; ++n_tok) {
                std::vector<float> y(static_cast<size_t>(n_tok * rows), -1.0f);
                matmul(m.view, x.data(), n_tok, y.data(), pool, scratch);
                for (int64_t i = 0; i < n_tok * rows; ++i) {
                    if (tiled && n_tok > 1) {
                        ASSERT_NEAR(y[i], single[i], rounding[i])
                            << "rows " << rows << " n_tok " << n_tok << " threads " << n_threads << " index " << i;
                    } else {
                        ASSERT_EQ(y[i], single[i])
                            << "rows " << rows << " n_tok " << n_tok << " threads " << n_threads << " index " << i;
                    }
                }
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Matmul, MatmulByType,
                         ::testing::Values(Case{GgmlType::F32, 37}, Case{GgmlType::F16, 70}, Case{GgmlType::Q8_0, 96},
                                           Case{GgmlType::Q4_0, 160}, Case{GgmlType::Q4_1, 64},
                                           Case{GgmlType::Q5_0, 96}, Case{GgmlType::Q4_K, 512},
                                           Case{GgmlType::Q5_K, 256}, Case{GgmlType::Q6_K, 768},
                                           Case{GgmlType::Q2_K, 256}),
                         [](const ::testing::TestParamInfo<Case>& param_info) {
                             return std::string(quant::traits(param_info.param.type).name);
                         });

TEST(Matmul, TiledPathCoversManyTokensAndRows) {
    // More tokens and rows than one tile (16 rows x 8 tokens), with ragged edges.
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const Matrix m = make_weights(GgmlType::Q8_0, 45, 64, 0, rng);
    const int n_tok = 19;
    std::vector<float> x(static_cast<size_t>(n_tok * 64));
    for (float& v : x) v = dist(rng);
    Scratch scratch;
    ThreadPool pool(2);
    std::vector<float> y(static_cast<size_t>(n_tok * 45));
    matmul(m.view, x.data(), n_tok, y.data(), pool, scratch);
    for (int t = 0; t < n_tok; ++t) {
        for (int64_t r = 0; r < 45; ++r) {
            const Expected e = reference_dot(m.view, r, x.data() + t * 64, true);
            ASSERT_NEAR(y[t * 45 + r], e.value, e.tolerance) << "row " << r << " token " << t;
        }
    }
}

TEST(Matmul, TiledPathCoversLongPrompts) {
    // More tokens than one task's chunk (256) and rows that split unevenly over the threads.
    std::mt19937 rng(8);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (GgmlType type : {GgmlType::Q5_0, GgmlType::Q4_K}) {
        const int64_t rows = 83, cols = 256;
        const Matrix m = make_weights(type, rows, cols, 0, rng);
        const int n_tok = 600;
        std::vector<float> x(static_cast<size_t>(n_tok * cols));
        for (float& v : x) v = dist(rng);
        Scratch scratch;
        ThreadPool pool(2);
        std::vector<float> y(static_cast<size_t>(n_tok * rows));
        matmul(m.view, x.data(), n_tok, y.data(), pool, scratch);
        for (int t = 0; t < n_tok; t += 7) {
            for (int64_t r = 0; r < rows; ++r) {
                const Expected e = reference_dot(m.view, r, x.data() + t * cols, true);
                ASSERT_NEAR(y[t * rows + r], e.value, e.tolerance)
                    << quant::traits(type).name << " row " << r << " token " << t;
            }
        }
    }
}

TEST(Matmul, ScratchIsReusedNotReallocated) {
    // The decode loop must not allocate: same-sized calls get the same memory back.
    Scratch scratch;
    std::byte* first = scratch.bytes(1000);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
    EXPECT_EQ(scratch.bytes(1000), first);
    EXPECT_EQ(scratch.bytes(10), first);
}

TEST(Matmul, RefusesTypesWithoutKernelAndPartialBlocks) {
    Scratch scratch;
    ThreadPool pool(1);
    std::vector<std::byte> data(4096);
    std::vector<float> x(256), y(4);
    const WeightView iq{GgmlType::NVFP4, 1, 256, data.data(), 0};
    EXPECT_THROW(matmul(iq, x.data(), 1, y.data(), pool, scratch), std::invalid_argument);
    const WeightView partial{GgmlType::Q4_0, 1, 48, data.data(), 64};
    EXPECT_THROW(matmul(partial, x.data(), 1, y.data(), pool, scratch), std::invalid_argument);
}

}  // namespace
}  // namespace fitllm::ops
