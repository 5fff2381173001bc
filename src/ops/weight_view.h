#pragma once
// A weight matrix as GGUF stores it, seen without owning it: what matmul and embedding read.
#include <cstddef>
#include <cstdint>

#include "quant/ggml_type.h"

namespace fitllm::ops {

// `rows` rows (output features) of `cols` values (input features) each, row r starting at
// data + r * stride() bytes.
struct WeightView {
    quant::GgmlType type = quant::GgmlType::F32;
    int64_t rows = 0;
    int64_t cols = 0;
    const void* data = nullptr;
    size_t row_stride = 0;  // bytes; 0 means packed rows: row_bytes(type, cols)

    // row_stride, or the packed row size when it is 0 (0 when cols is not whole blocks).
    size_t stride() const {
        if (row_stride != 0) return row_stride;
        const auto bytes = quant::row_bytes(type, static_cast<uint64_t>(cols));
        return bytes ? static_cast<size_t>(*bytes) : 0;
    }
    const void* row(int64_t r) const { return static_cast<const std::byte*>(data) + r * stride(); }
};

}  // namespace fitllm::ops
