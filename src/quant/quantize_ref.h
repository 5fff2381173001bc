#pragma once
// Model-file quantization: floats to the weight types as llama.cpp's llama-quantize writes them,
// without or with an importance matrix, byte for byte (what `fitllm quantize` uses).
//
// quantize_row (quant/quantize.h) rounds weights plainly, for tests and benchmarks that only need
// data; llama-quantize uses ggml's reference quantizers, which differ in the details: Q4_0 / Q5_0
// scale by the unrounded d and round by truncating x/d + 8.5; Q4_1 / Q5_1 subtract the unrounded
// block minimum; Q8_0 rounds half away from zero; the k-quants search each sub-block's scale (and
// min) for the least squared error. This file has those, written from their description (the
// oracle test checks them against ggml's own quantize_chunk). IQ4_NL uses the scale search of
// quantize_row_iq4_nl_searched; IQ4_XS, TQ1_0, TQ2_0, MXFP4, F16, BF16 and F32 are quantize_row's,
// which already match llama.cpp.
#include <cstdint>

#include "quant/ggml_type.h"

namespace fitllm::quant {

// The types quantize_model_row writes: can_quantize's, less the activation-only ones (Q8_1, Q8_K),
// plus the grid i-quants IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S and IQ1_M (quant/quantize_iq.h:
// llama.cpp's grid searches; IQ2_XXS, IQ2_XS and IQ1_S only with weights, as in llama.cpp).
bool can_quantize_model(GgmlType type);

// Writes the n values of src as one row of `type` at dst (row_bytes(type, n) bytes); n a whole
// number of blocks, std::invalid_argument otherwise.
void quantize_model_row(GgmlType type, const float* src, void* dst, int64_t n);

// The types whose quantizer llama.cpp weights by an importance matrix (ggml_quantize_chunk's
// quant_weights): Q4_0, Q4_1, Q5_0, Q5_1, the k-quants Q2_K..Q6_K, IQ4_NL, IQ4_XS and the
// grid i-quants. The others (Q8_0, F16, TQ*, MXFP4, ...) quantize the same with or without one.
bool uses_importance(GgmlType type);

// quantize_model_row with an importance matrix, as llama-quantize --imatrix writes the row:
// `weights` holds n per-column importances (the imatrix entry of the tensor, its expert's slice),
// each value weighted by weight * sqrt(sigma^2 + x^2) in the scale searches (llama.cpp's
// quantize_row_*_impl). weights == nullptr, or a type that takes none: quantize_model_row above.
void quantize_model_row(GgmlType type, const float* src, void* dst, int64_t n, const float* weights);

}  // namespace fitllm::quant
