#include "ops/embedding.h"

#include <stdexcept>
#include <string>

#include "quant/dequantize.h"

namespace fitllm::ops {

void embedding_row(const WeightView& table, int64_t row, float* out) {
    if (row < 0 || row >= table.rows) {
        throw std::out_of_range("embedding: token id " + std::to_string(row) + " is outside the table's " +
                                std::to_string(table.rows) + " rows");
    }
    quant::dequantize_row(table.type, table.row(row), out, table.cols);
}

void embedding_rows(const WeightView& table, const int32_t* ids, int64_t n_tok, float* out) {
    for (int64_t t = 0; t < n_tok; ++t) embedding_row(table, ids[t], out + t * table.cols);
}

}  // namespace fitllm::ops
