// kv/key_transform_kernels.h: the padded triangles, rows times a triangle, and the error-feedback
// rounding; the AVX2 + FMA variants against the scalar reference.
#include "kv/key_transform_kernels.h"

#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <cmath>
#include <random>
#include <vector>

#include "quant/block_grid.h"
#include "quant/dequantize.h"

namespace fitllm::kv {
namespace {

using quant::GgmlType;

std::vector<float> random_triangle(int d, bool upper, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> g;
    std::vector<float> m(static_cast<size_t>(d) * d, 0.0f);
    for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j)
            if (upper ? j >= i : j <= i) m[static_cast<size_t>(i) * d + j] = i == j ? 2.0f + std::fabs(g(rng)) : g(rng);
    return m;
}

std::vector<float> gaussian(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> g;
    std::vector<float> x(n);
    for (float& v : x) v = g(rng);
    return x;
}

TEST(KeyTransformKernels, PaddedTrianglesHoldTheTriangleAndZerosAround) {
    for (bool upper : {true, false}) {
        const int d = 40;
        const std::vector<float> dense = random_triangle(d, upper, 1);
        const PaddedTriangle t(dense.data(), d, upper);
        EXPECT_EQ(t.floats(), PaddedTriangle::floats_for(d));
        for (int i = 0; i < d; ++i) {
            for (int j = 0; j < d; ++j) ASSERT_EQ(t.at(i, j), dense[static_cast<size_t>(i) * d + j]) << i << "," << j;
            // Every 8 columns a product reads are stored: zeros where the triangle has none.
            const int first = upper ? i / 8 * 8 : 0, end = upper ? d : std::min(d, (i / 8 + 1) * 8);
            for (int j = first; j < end; ++j) EXPECT_EQ(t.row(i)[j], dense[static_cast<size_t>(i) * d + j]);
        }
    }
}

TEST(KeyTransformKernels, RowsTimesATriangleIsTheProductInEveryVariant) {
    for (int d : {32, 64, 256}) {
        for (bool upper : {true, false}) {
            const std::vector<float> dense = random_triangle(d, upper, static_cast<uint32_t>(d));
            const PaddedTriangle t(dense.data(), d, upper);
            for (int n = 1; n <= key_kernels::kRows; ++n) {
                const std::vector<float> x = gaussian(static_cast<size_t>(n) * d, static_cast<uint32_t>(n));
                std::vector<float> ref(x.size()), fast(x.size());
                key_kernels::rows_times_reference(x.data(), n, t, ref.data());
                key_kernels::rows_times(x.data(), n, t, fast.data());
                for (int r = 0; r < n; ++r) {
                    for (int j = 0; j < d; ++j) {
                        double want = 0.0, size = 0.0;
                        for (int i = 0; i < d; ++i) {
                            want += static_cast<double>(x[r * d + i]) * dense[static_cast<size_t>(i) * d + j];
                            size +=
                                std::fabs(static_cast<double>(x[r * d + i]) * dense[static_cast<size_t>(i) * d + j]);
                        }
                        ASSERT_NEAR(ref[r * d + j], want, 1e-5 * size + 1e-6) << "d " << d << " n " << n;
                        ASSERT_NEAR(fast[r * d + j], ref[r * d + j], 1e-5 * size + 1e-6) << "d " << d << " n " << n;
                    }
                }
            }
        }
    }
}

// U from a random metric M (U^T U = M^-1), as kv/key_calibration.cpp makes it.
std::pair<PaddedTriangle, Eigen::MatrixXd> metric_factor(int d, uint32_t seed) {
    const std::vector<float> a = gaussian(static_cast<size_t>(d) * d, seed);
    Eigen::MatrixXd x(d, d);
    for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) x(i, j) = a[static_cast<size_t>(i) * d + j];
    Eigen::MatrixXd m = x * x.transpose() / d;
    for (int i = 0; i < 4; ++i) m += 20.0 * x.col(i) * x.col(i).transpose() / d;  // a few directions matter most
    m.diagonal().array() += 0.01 * m.trace() / d;
    const Eigen::MatrixXd u = Eigen::LLT<Eigen::MatrixXd>(m.inverse()).matrixU();
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> uf = u.cast<float>();
    return {PaddedTriangle(uf.data(), d, true), m};
}

double metric_error(const std::vector<float>& x, const std::vector<float>& y, const Eigen::MatrixXd& m, int d) {
    Eigen::VectorXd e(d);
    for (int i = 0; i < d; ++i) e(i) = y[static_cast<size_t>(i)] - x[static_cast<size_t>(i)];
    return e.dot(m * e);
}

TEST(KeyTransformKernels, TheFeedbackLowersTheMetricsErrorAndTheVariantsAgree) {
    const int d = 128, n = key_kernels::kRows;
    const auto [u, m] = metric_factor(d, 3);
    for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::IQ4_NL}) {
        const size_t row_bytes = *quant::row_bytes(type, d);
        const std::vector<float> x = gaussian(static_cast<size_t>(n) * d, 4);
        std::vector<std::byte> ref(n * row_bytes), fast(n * row_bytes), plain(n * row_bytes);
        std::vector<std::byte*> dst_ref(n), dst_fast(n);
        for (int r = 0; r < n; ++r) dst_ref[r] = ref.data() + r * row_bytes, dst_fast[r] = fast.data() + r * row_bytes;
        std::vector<float> w = x, err(n * 32);
        key_kernels::round_with_feedback_reference(w.data(), n, u, type, dst_ref.data(), err.data());
        w = x;
        key_kernels::round_with_feedback(w.data(), n, u, type, dst_fast.data(), err.data());
        double e_feedback = 0.0, e_plain = 0.0;
        int same = 0;
        for (int r = 0; r < n; ++r) {
            std::vector<float> a(d), b(d), p(d), row(x.begin() + r * d, x.begin() + (r + 1) * d);
            quant::dequantize_row(type, ref.data() + r * row_bytes, a.data(), d);
            quant::dequantize_row(type, fast.data() + r * row_bytes, b.data(), d);
            for (int blk = 0; blk < d; blk += 32) {  // each value alone on the searched grid
                const quant::BlockGrid g = quant::BlockGrid::fit(type, row.data() + blk, true);
                for (int i = blk; i < blk + 32; ++i)
                    p[static_cast<size_t>(i)] = g.value(g.nearest(row[static_cast<size_t>(i)]));
            }
            for (int i = 0; i < d; ++i) same += a[static_cast<size_t>(i)] == b[static_cast<size_t>(i)];
            e_feedback += metric_error(row, a, m, d);
            e_plain += metric_error(row, p, m, d);
            EXPECT_NEAR(metric_error(row, b, m, d), metric_error(row, a, m, d), 0.05 * metric_error(row, a, m, d));
        }
        std::cout << "[ kernels ] " << quant::type_name(static_cast<uint32_t>(type)) << " metric error: feedback "
                  << e_feedback << ", each value alone " << e_plain
                  << "; AVX2 values equal to the reference's: " << same << " of " << n * d << "\n";
        EXPECT_LT(e_feedback, 0.8 * e_plain);
        EXPECT_GE(same, n * d * 95 / 100);
    }
}

TEST(KeyTransformKernels, WithoutAMetricTheFeedbackIsPlainRounding) {
    const int d = 64, n = 3;
    std::vector<float> identity(static_cast<size_t>(d) * d, 0.0f);
    for (int i = 0; i < d; ++i) identity[static_cast<size_t>(i) * d + i] = 1.0f;
    const PaddedTriangle u(identity.data(), d, true);
    const std::vector<float> x = gaussian(static_cast<size_t>(n) * d, 5);
    for (bool reference : {true, false}) {
        const size_t row_bytes = *quant::row_bytes(GgmlType::Q4_0, d);
        std::vector<std::byte> out(n * row_bytes);
        std::vector<std::byte*> dst(n);
        for (int r = 0; r < n; ++r) dst[r] = out.data() + r * row_bytes;
        std::vector<float> w = x, err(n * 32);
        (reference ? key_kernels::round_with_feedback_reference : key_kernels::round_with_feedback)(
            w.data(), n, u, GgmlType::Q4_0, dst.data(), err.data());
        for (int r = 0; r < n; ++r) {
            std::vector<float> got(d);
            quant::dequantize_row(GgmlType::Q4_0, out.data() + r * row_bytes, got.data(), d);
            for (int blk = 0; blk < d; blk += 32) {
                const quant::BlockGrid g = quant::BlockGrid::fit(GgmlType::Q4_0, x.data() + r * d + blk, true);
                for (int i = blk; i < blk + 32; ++i)
                    ASSERT_EQ(got[static_cast<size_t>(i)], g.value(g.nearest(x[r * d + i])));
            }
        }
    }
}

}  // namespace
}  // namespace fitllm::kv
