#pragma once
// `fitllm quantize`: a GGUF file rewritten with its weight matrices in another type, chosen per
// tensor by llama.cpp's rules (llama-quantize's), streamed tensor by tensor.
//
// What changes: the 2-D and 3-D "*weight" tensors llama.cpp would quantize (not norms, 1-D
// tensors, MoE routers, position embeddings, ...) get the file type's type, with llama.cpp's mixes
// for the k-quant presets (Q4_K_M: attn_v and ffn_down in Q6_K on a fixed set of layers, ...),
// output.weight (and a tied token embedding) in Q6_K, and a row length that is no whole number of
// blocks falling back as llama.cpp does (Q4_K -> Q5_0, ..., F16 at last). What stays: every
// metadata key, in order (general.file_type and general.quantization_version set), the alignment
// and the tensor order; the tensors that keep their type are copied byte for byte.
// The rows are quantized by quant/quantize_ref.h, the bytes llama-quantize writes.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/imatrix.h"
#include "quant/ggml_type.h"

namespace fitllm::gguf {

struct QuantizeParams {
    uint32_t ftype = 15;                                  // llama.cpp's llama_ftype (general.file_type): 15 = Q4_K_M
    std::optional<quant::GgmlType> output_tensor_type;    // --output-tensor-type
    std::optional<quant::GgmlType> token_embedding_type;  // --token-embedding-type
    // --tensor-type: ECMAScript regexes searched in the tensor name, the first match wins.
    std::vector<std::pair<std::string, quant::GgmlType>> tensor_types;
    bool allow_requantize = false;  // start from a quantized tensor (dequantize, then quantize)
    bool leave_output_tensor = false;
    bool pure = false;  // the file type's type for every quantized tensor: no mixes
    int threads = 1;
    // --imatrix (after --include-weights / --exclude-weights); nullptr or no entries: none. Changes
    // the rows of the types that take one (quant/quantize_ref.h: uses_importance) and, as in
    // llama.cpp, a few of the mixes' choices; its file name, dataset and counts go into the output's
    // metadata (quantize.imatrix.*). Must outlive the call.
    const ImportanceMatrix* imatrix = nullptr;
};

// A file type named as llama-quantize takes it: "Q4_K_M", "q8_0", "Q4_K" (Q4_K_M), "Q5_K"
// (Q5_K_M), "Q3_K" (Q3_K_M) or the number; nullopt for an unknown name. Supported or not.
std::optional<uint32_t> parse_file_type(std::string_view name);
// The file types fitllm quantize writes (their names, for messages and --help).
std::vector<std::string> supported_file_types();
// Throws Error when fitllm quantize cannot write file type `ftype`, saying why.
void check_file_type(uint32_t ftype);

struct TensorChoice {
    std::string name;
    quant::GgmlType from;
    quant::GgmlType to;
    bool fallback = false;  // the row length forced another type
    // The tensor's importance weights (ne[0] per expert, into QuantizeParams::imatrix), nullptr:
    // none (no imatrix, no entry for it, or a token embedding whose entry has another size).
    const float* imatrix = nullptr;
};

// The type of every tensor of `in`, in file order, as llama-quantize would choose it. Throws
// Error for what cannot be done: an unsupported file type, a target that needs an importance
// matrix it lacks, an imatrix entry of the wrong size, a quantized tensor without
// allow_requantize (naming it), a type that does not fit.
std::vector<TensorChoice> plan_quantization(const GgufFile& in, const QuantizeParams& params);

struct QuantizeResult {
    std::vector<TensorChoice> tensors;
    uint64_t bytes_in = 0;   // tensor data
    uint64_t bytes_out = 0;  // tensor data
    int n_fallback = 0;
};

// Reads input_path and writes output_path (through output_path + ".tmp", renamed at the end, so
// it never holds half a file). The input is mapped and its pages given back after each slab of
// rows, so memory stays at a few slabs whatever the model's size. progress (optional) is called
// after each tensor with its index. Refuses an output that is the input file.
QuantizeResult quantize_file(const std::string& input_path, const std::string& output_path,
                             const QuantizeParams& params,
                             const std::function<void(size_t, const TensorChoice&)>& progress = {});

}  // namespace fitllm::gguf
