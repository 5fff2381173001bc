#pragma once
// Model-file quantization: floats to the weight types as llama.cpp's llama-quantize writes them
// without an importance matrix, byte for byte (what `fitllm quantize` uses).
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

// The types quantize_model_row writes: can_quantize's, less the activation-only ones (Q8_1, Q8_K).
bool can_quantize_model(GgmlType type);

// Writes the n values of src as one row of `type` at dst (row_bytes(type, n) bytes); n a whole
// number of blocks, std::invalid_argument otherwise.
void quantize_model_row(GgmlType type, const float* src, void* dst, int64_t n);

}  // namespace fitllm::quant
