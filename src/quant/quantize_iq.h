#pragma once
// Internal to quant/: the grid i-quant quantizers behind quantize_model_row (quant/quantize_ref.h),
// written from the description of llama.cpp's quantize_row_iq3_xxs_impl / quantize_row_iq3_s_impl.
//
// IQ3_XXS and IQ3_S: each sub-block of 32 has its signs split off (IQ3_XXS: an even number of
// negatives per group of 8, the least important value flipped when needed), then 31 (IQ3_XXS) or
// 19 (IQ3_S) scales are tried: at each, every group of 4 magnitudes is rounded to the levels
// 2l + 1 (l in 0..7) and, when that point is not on the grid, replaced by the best of its
// neighbours on the grid (the points at the 2 / 3 smallest distances, precomputed for all 4096
// level combinations); the scale with the best weighted least-squares fit wins, the off-grid
// groups are searched once more at it, and the sub-block scales are coded against the largest
// (4 bits). Weights: the importance matrix's qw * sqrt(sigma^2 + x^2), else x^2.
#include <cstdint>

namespace fitllm::quant::detail {

// One row of n values (a multiple of 256); weights: n per-column importances or nullptr.
void quantize_row_iq3_xxs(const float* x, void* dst, int64_t n, const float* weights);
void quantize_row_iq3_s(const float* x, void* dst, int64_t n, const float* weights);
// IQ2_S: the same search on sub-blocks of 16 (two groups of 8 values on the levels 2l + 1, l in
// 0..2, all signs kept, each off-grid group replaced by its nearest grid points), 19 scales;
// without an importance matrix each value weighs sigma^2 / 4 + x^2.
void quantize_row_iq2_s(const float* x, void* dst, int64_t n, const float* weights);
// IQ2_XXS (sub-blocks of 32, groups of 8 on the 256-point grid, an even number of negative signs a
// group, a first scale from fit::positive then 13 more) and IQ2_XS (sub-blocks of 16, the
// 512-point grid, 19 scales): weights required (std::invalid_argument without), as llama.cpp.
void quantize_row_iq2_xxs(const float* x, void* dst, int64_t n, const float* weights);
void quantize_row_iq2_xs(const float* x, void* dst, int64_t n, const float* weights);

// IQ1_S (sub-blocks of 32) and IQ1_M (16): values -1, 0, +1 shifted by +-1/8 (one shift per
// sub-block, IQ1_M one per half), the two cut points between them found by an exhaustive search
// over the sorted values, each group of 8 then moved to its nearest grid point if off the grid.
// IQ1_S requires weights (std::invalid_argument without); IQ1_M takes x^2 without.
void quantize_row_iq1_s(const float* x, void* dst, int64_t n, const float* weights);
void quantize_row_iq1_m(const float* x, void* dst, int64_t n, const float* weights);

}  // namespace fitllm::quant::detail
