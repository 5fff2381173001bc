#include "model/weights.h"

#include "quant/dequantize.h"
#include "quant/dot.h"
#include "quant/ggml_type.h"

namespace fitllm::model {
namespace {

std::string shape_string(const gguf::TensorInfo& t) {
    std::string s = "[";
    for (uint32_t d = 0; d < t.n_dims; ++d) {
        if (d) s += ", ";
        s += std::to_string(t.ne[d]);
    }
    return s + "]";
}

// "F32, F16, Q4_0, ...": the weight types matmul and the embedding lookup read.
std::string computable_type_names() {
    std::string names;
    for (uint32_t id = 0; id < quant::kGgmlTypeIdEnd; ++id) {
        if (!quant::is_supported(id)) continue;
        const auto type = static_cast<quant::GgmlType>(id);
        if (quant::has_dot(type) && quant::can_dequantize(type))
            names += (names.empty() ? "" : ", ") + std::string(quant::type_name(id));
    }
    return names;
}

}  // namespace

const gguf::TensorInfo& TensorBinder::find(const std::string& name) const {
    const gguf::TensorInfo* t = file_.find_tensor(name);
    if (!t) throw ModelError(file_.source() + ": missing tensor '" + name + "'");
    return *t;
}

ops::WeightView TensorBinder::matrix(const std::string& name, int64_t rows, int64_t cols) const {
    const gguf::TensorInfo& t = find(name);
    if (t.n_dims != 2 || t.ne[0] != cols || t.ne[1] != rows) {
        throw ModelError(file_.source() + ": tensor '" + name + "' has shape " + shape_string(t) + "; expected [" +
                         std::to_string(cols) + ", " + std::to_string(rows) + "] (ne order)");
    }
    return checked_view(t, name, rows, cols);
}

ops::WeightView TensorBinder::checked_view(const gguf::TensorInfo& t, const std::string& name, int64_t rows,
                                           int64_t cols) const {
    // Refused here, at load, rather than by the first matmul or embedding lookup of the run.
    if (!quant::has_dot(t.type) || !quant::can_dequantize(t.type)) {
        throw ModelError(file_.source() + ": tensor '" + name + "' has type " +
                         std::string(quant::type_name(static_cast<uint32_t>(t.type))) +
                         ", which fitllm cannot compute with yet (weight types it runs: " + computable_type_names() +
                         ")");
    }
    ops::WeightView w;
    w.type = t.type;
    w.rows = rows;
    w.cols = cols;
    w.data = t.data.data();
    if (w.stride() == 0 || static_cast<uint64_t>(w.stride()) * static_cast<uint64_t>(rows) != t.n_bytes) {
        throw ModelError(file_.source() + ": tensor '" + name + "' of type " +
                         std::string(quant::type_name(static_cast<uint32_t>(t.type))) + " cannot be read as " +
                         std::to_string(rows) + " rows of " + std::to_string(cols) + " values");
    }
    return w;
}

ops::WeightView TensorBinder::experts(const std::string& name, int64_t n_expert, int64_t rows, int64_t cols) const {
    const gguf::TensorInfo& t = find(name);
    if (t.n_dims != 3 || t.ne[0] != cols || t.ne[1] != rows || t.ne[2] != n_expert) {
        throw ModelError(file_.source() + ": tensor '" + name + "' has shape " + shape_string(t) + "; expected [" +
                         std::to_string(cols) + ", " + std::to_string(rows) + ", " + std::to_string(n_expert) +
                         "] (ne order: one matrix per expert)");
    }
    return checked_view(t, name, n_expert * rows, cols);
}

ops::WeightView TensorBinder::optional_matrix(const std::string& name, int64_t rows, int64_t cols) const {
    if (!file_.find_tensor(name)) return {};
    return matrix(name, rows, cols);
}

const float* TensorBinder::vector(const std::string& name, int64_t n) const {
    const gguf::TensorInfo& t = find(name);
    if (t.n_elements != static_cast<uint64_t>(n) || t.ne[0] != n) {
        throw ModelError(file_.source() + ": tensor '" + name + "' has shape " + shape_string(t) + "; expected [" +
                         std::to_string(n) + "]");
    }
    if (t.type != quant::GgmlType::F32) {
        throw ModelError(file_.source() + ": tensor '" + name + "' has type " +
                         std::string(quant::type_name(static_cast<uint32_t>(t.type))) + "; expected F32");
    }
    return reinterpret_cast<const float*>(t.data.data());
}

const float* TensorBinder::vectors(const std::string& name, int64_t rows, int64_t n) const {
    const gguf::TensorInfo& t = find(name);
    if (t.n_dims != 2 || t.ne[0] != n || t.ne[1] != rows) {
        throw ModelError(file_.source() + ": tensor '" + name + "' has shape " + shape_string(t) + "; expected [" +
                         std::to_string(n) + ", " + std::to_string(rows) + "]");
    }
    if (t.type != quant::GgmlType::F32) {
        throw ModelError(file_.source() + ": tensor '" + name + "' has type " +
                         std::string(quant::type_name(static_cast<uint32_t>(t.type))) + "; expected F32");
    }
    return reinterpret_cast<const float*>(t.data.data());
}

const float* TensorBinder::optional_vector(const std::string& name, int64_t n) const {
    if (!file_.find_tensor(name)) return nullptr;
    return vector(name, n);
}

void TensorBinder::refuse(const std::string& name, const std::string& why) const {
    if (file_.find_tensor(name)) throw ModelError(file_.source() + ": tensor '" + name + "' is not supported: " + why);
}

}  // namespace fitllm::model
