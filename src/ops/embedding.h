#pragma once
// Token embedding lookup: one row of a (possibly quantized) embedding matrix as floats. With tied
// embeddings the same matrix serves as the output projection through ops::matmul.
#include <cstdint>

#include "ops/weight_view.h"

namespace fitllm::ops {

// out[0 .. table.cols) = row `row` of table, dequantized. Throws std::out_of_range for a row
// outside [0, table.rows) (naming it) and std::invalid_argument for types without dequantization.
void embedding_row(const WeightView& table, int64_t row, float* out);

// For each of the n_tok ids: out[t] = embedding_row(ids[t]); out is [n_tok, table.cols].
void embedding_rows(const WeightView& table, const int32_t* ids, int64_t n_tok, float* out);

}  // namespace fitllm::ops
