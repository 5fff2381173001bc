#pragma once
// Binding a model's tensors by name, with their shapes checked against the hyper-parameters.
// The weights are views into the mapped GGUF file: nothing is copied.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "model/hparams.h"
#include "ops/weight_view.h"

namespace fitllm::model {

// Looks tensors up in one file and checks what it finds; every error is a ModelError naming the
// file, the tensor, and the expected and actual shape or type.
class TensorBinder {
public:
    explicit TensorBinder(const gguf::GgufFile& file) : file_(file) {}
    // A matrix of `rows` outputs by `cols` inputs (GGUF ne = [cols, rows]), any type matmul reads.
    ops::WeightView matrix(const std::string& name, int64_t rows, int64_t cols) const;
    // As matrix(), or a view with data == nullptr when the file has no such tensor.
    ops::WeightView optional_matrix(const std::string& name, int64_t rows, int64_t cols) const;
    // A mixture-of-experts layer's n_expert matrices of `rows` by `cols` each, stored as one 3-D
    // tensor (GGUF ne = [cols, rows, n_expert]), seen as one matrix of n_expert * rows rows: expert
    // e's matrix is rows e * rows .. (e + 1) * rows (model::expert_matrix).
    ops::WeightView experts(const std::string& name, int64_t n_expert, int64_t rows, int64_t cols) const;
    // A float vector of n values (norm weights, biases).
    const float* vector(const std::string& name, int64_t n) const;
    // As vector(), or nullptr when the file has no such tensor.
    const float* optional_vector(const std::string& name, int64_t n) const;
    // A float tensor of `rows` vectors of n values each (GGUF ne = [n, rows]): gpt-oss's per-expert
    // biases, row e expert e's.
    const float* vectors(const std::string& name, int64_t rows, int64_t n) const;
    // Throws a ModelError naming the tensor if the file has it: for tensors a forward pass would
    // otherwise silently leave out.
    void refuse(const std::string& name, const std::string& why) const;

private:
    const gguf::TensorInfo& find(const std::string& name) const;
    // t as `rows` rows of `cols` values, of a type matmul reads, whose bytes are exactly that.
    ops::WeightView checked_view(const gguf::TensorInfo& t, const std::string& name, int64_t rows, int64_t cols) const;
    const gguf::GgufFile& file_;
};

}  // namespace fitllm::model
