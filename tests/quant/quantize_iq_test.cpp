// The grid i-quant quantizers (quant/quantize_iq.h, through quantize_model_row) round trip through
// fitllm's own dequantizer: the error of Gaussian rows is what the bits allow (bounds a little
// above the measured values), every point lies on its grid (dequantize_row reads it), and with
// an importance matrix the error where the weights are large falls. Their bytes against ggml's:
// QuantizeVsGgml in ggml_oracle_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "quant/dequantize.h"
#include "quant/quantize_ref.h"
#include "quant_test_data.h"

namespace fitllm::quant {
namespace {

struct Case {
    GgmlType type;
    float max_rel_rmse;  // RMS error / RMS of the data, without weights (with them where required)
};

// Relative RMS error, each value's square error times w (1 when w is null).
float rel_error(const std::vector<float>& x, const std::vector<float>& y, const float* w, int n) {
    double err = 0, ref = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        const double wi = w ? w[i % static_cast<size_t>(n)] : 1.0;
        err += wi * (x[i] - y[i]) * (x[i] - y[i]);
        ref += wi * x[i] * x[i];
    }
    return static_cast<float>(std::sqrt(err / ref));
}

std::vector<float> round_trip(GgmlType type, const std::vector<float>& x, int n, const float* w) {
    const int rows = static_cast<int>(x.size()) / n;
    const size_t row = *row_bytes(type, n);
    std::vector<uint8_t> q(row * static_cast<size_t>(rows));
    std::vector<float> y(x.size());
    for (int r = 0; r < rows; ++r) {
        quantize_model_row(type, x.data() + r * n, q.data() + r * row, n, w);
        dequantize_row(type, q.data() + r * row, y.data() + r * n, n);
    }
    return y;
}

TEST(GridQuantizers, RoundTripErrorIsWhatTheBitsAllow) {
    // Measured (8 rows of 2048, sigma 0.03): IQ3_S 0.166, IQ3_XXS 0.216, IQ2_S 0.264, IQ2_XS 0.300,
    // IQ2_XXS 0.345, IQ1_M 0.575, IQ1_S 0.485; with the weights the weighted error falls 2 to 3x.
    const Case cases[] = {
        {GgmlType::IQ3_S, 0.18f},   {GgmlType::IQ3_XXS, 0.24f}, {GgmlType::IQ2_S, 0.29f}, {GgmlType::IQ2_XS, 0.33f},
        {GgmlType::IQ2_XXS, 0.38f}, {GgmlType::IQ1_M, 0.63f},   {GgmlType::IQ1_S, 0.54f},
    };
    const int n = 2048, rows = 8;
    const auto x = test::gaussian(static_cast<size_t>(n) * rows, 7, 0.03f);
    // Importance: a few columns matter far more than the rest, as in real activations.
    std::vector<float> w(static_cast<size_t>(n), 1.0f);
    for (int i = 0; i < n; i += 17) w[static_cast<size_t>(i)] = 300.0f;
    for (const Case& c : cases) {
        SCOPED_TRACE(std::string(traits(c.type).name));
        const bool needs_weights =
            c.type == GgmlType::IQ2_XXS || c.type == GgmlType::IQ2_XS || c.type == GgmlType::IQ1_S;
        const std::vector<float> flat(static_cast<size_t>(n), 1.0f);
        const std::vector<float> plain = round_trip(c.type, x, n, needs_weights ? flat.data() : nullptr);
        const float e = rel_error(x, plain, nullptr, n);
        EXPECT_LT(e, c.max_rel_rmse);
        EXPECT_GT(e, 0.01f);  // a quantizer, not a copy
        // With the importance matrix the error that it weighs falls.
        const std::vector<float> weighted = round_trip(c.type, x, n, w.data());
        EXPECT_LT(rel_error(x, weighted, w.data(), n), 0.7f * rel_error(x, plain, w.data(), n));
    }
}

TEST(GridQuantizers, ZeroAndTinyBlocksStayZero) {
    const int n = 512;
    std::vector<float> x(static_cast<size_t>(n), 0.0f);
    for (int i = 256; i < n; ++i) x[static_cast<size_t>(i)] = 1e-30f * static_cast<float>(i % 7 - 3);
    const std::vector<float> w(static_cast<size_t>(n), 1.0f);
    for (GgmlType t : {GgmlType::IQ3_S, GgmlType::IQ3_XXS, GgmlType::IQ2_S, GgmlType::IQ2_XS, GgmlType::IQ2_XXS,
                       GgmlType::IQ1_M, GgmlType::IQ1_S}) {
        SCOPED_TRACE(std::string(traits(t).name));
        const std::vector<float> y = round_trip(t, x, n, w.data());
        for (int i = 0; i < 256; ++i) ASSERT_EQ(y[static_cast<size_t>(i)], 0.0f) << i;
        for (int i = 256; i < n; ++i) ASSERT_LT(std::fabs(y[static_cast<size_t>(i)]), 1e-20f) << i;
    }
}

TEST(GridQuantizers, TypesThatNeedWeightsRefuseRowsWithout) {
    const auto x = test::gaussian(256, 3);
    for (GgmlType t : {GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ1_S}) {
        std::vector<uint8_t> q(*row_bytes(t, 256));
        EXPECT_THROW(quantize_model_row(t, x.data(), q.data(), 256), std::invalid_argument) << traits(t).name;
    }
}

}  // namespace
}  // namespace fitllm::quant
