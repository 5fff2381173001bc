#pragma once
// Reference quantization: floats to ggml blocks.
//
// Activations: Q8_0, Q8_1 and Q8_K, rounded the way llama.cpp rounds them, so that the integer
// dots see the same inputs as llama.cpp's. Weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K,
// Q4_K, Q5_K, Q6_K) and F16 / BF16: plain round-to-nearest with the scales fitted to each block's
// range (no error search like llama.cpp's quantizer), which is what tests and benchmarks need to
// make data; real models come quantized by llama.cpp. IQ4_NL, a KV cache format: as llama.cpp
// quantizes it, byte for byte (below). IQ4_XS: from IQ4_NL's searched sub-block scales, as
// llama.cpp's quantizer without an importance matrix. TQ1_0, TQ2_0 and MXFP4: llama.cpp's
// reference quantizers byte for byte (they take no importance matrix).
#include <cstdint>

#include "quant/ggml_type.h"

namespace fitllm::quant {

// The i-quants on lattice grids (IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M): llama.cpp
// quantizes them with a search over the grid (weighted by an importance matrix), which only
// quantize_model_row does (quant/quantize_ref.h, for fitllm quantize).
bool is_grid_iquant(GgmlType type);

// The types quantize_row writes: those dequantize_row reads but the grid i-quants.
bool can_quantize(GgmlType type);

// Writes the n values of src as one row of `type` at dst (row_bytes(type, n) bytes). n must be a
// whole number of blocks; throws std::invalid_argument (naming the type and n) otherwise.
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

// IQ4_NL (32 values a block: an fp16 scale and 4-bit indices into a fixed table of 16 int8 values):
// quantize_row gives the bytes of llama.cpp's quantize_row_iq4_nl_ref, which its CPU backend uses
// to write an IQ4_NL KV cache: indices for the scale that maps the block's largest |x| to -127, then
// the scale refitted to them by least squares (each x weighted by x^2). This one adds llama.cpp's
// scale search (quantize_iq4_nl without an importance matrix: 15 more scales tried, the best fit
// kept, indices recomputed): ~3% less RMS error on Gaussian data (0.076 against 0.079 of the
// data's RMS) for ~15x the time.
void quantize_row_iq4_nl_searched(const float* src, void* dst, int64_t n);

}  // namespace fitllm::quant
