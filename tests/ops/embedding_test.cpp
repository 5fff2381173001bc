#include "ops/embedding.h"

#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <vector>

#include "quant/dequantize.h"
#include "quant/quantize.h"

namespace fitllm::ops {
namespace {

using quant::GgmlType;

TEST(Embedding, RowsAreDequantizedRows) {
    for (GgmlType type : {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
        const int64_t rows = 5, cols = 256;
        std::mt19937 rng(3);
        std::normal_distribution<float> dist(0.0f, 1.0f);
        const size_t row_bytes = *quant::row_bytes(type, cols);
        std::vector<std::byte> data(row_bytes * rows);
        std::vector<float> src(cols);
        for (int64_t r = 0; r < rows; ++r) {
            for (float& v : src) v = dist(rng);
            quant::quantize_row(type, src.data(), data.data() + r * row_bytes, cols);
        }
        const WeightView table{type, rows, cols, data.data(), 0};
        const std::vector<int32_t> ids = {4, 0, 4};
        std::vector<float> out(ids.size() * cols), want(cols);
        embedding_rows(table, ids.data(), static_cast<int64_t>(ids.size()), out.data());
        for (size_t t = 0; t < ids.size(); ++t) {
            quant::dequantize_row(type, data.data() + ids[t] * row_bytes, want.data(), cols);
            for (int64_t i = 0; i < cols; ++i) ASSERT_EQ(out[t * cols + i], want[i]);
        }
    }
}

TEST(Embedding, RejectsIdsOutsideTheTable) {
    std::vector<float> data(4 * 32);
    const WeightView table{GgmlType::F32, 4, 32, data.data(), 0};
    std::vector<float> out(32);
    EXPECT_THROW(embedding_row(table, 4, out.data()), std::out_of_range);
    EXPECT_THROW(embedding_row(table, -1, out.data()), std::out_of_range);
    EXPECT_NO_THROW(embedding_row(table, 3, out.data()));
}

}  // namespace
}  // namespace fitllm::ops
