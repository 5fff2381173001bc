#pragma once
// Tiles of a matrix product: several weight rows times several activation rows in one call, so
// that each weight block is loaded and unpacked once for several tokens (prompt processing).
// Same pairing of weight and activation formats as the dot kernels (quant/dot.h); a kernel's
// results agree with select_dot's kernel of the same ISA to float rounding, and equal them bit for
// bit where it says so (dot_order).
//
// For weight types without a tiled kernel select_gemm returns fn == nullptr and callers fall
// back to one dot per (row, token).
#include <cstddef>
#include <cstdint>

#include "quant/cpu_features.h"
#include "quant/ggml_type.h"

namespace fitllm::quant {

// y[t * y_stride + r] = dot(n, row r of w, row t of act) for r < n_rows, t < n_tok.
// n is a whole number of blocks of both row types; strides are in bytes (w, act) and floats (y).
// n_rows and n_tok may be any positive count; kernels handle partial tiles themselves.
using GemmFn = void (*)(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act,
                        size_t act_stride, float* y, size_t y_stride);

struct GemmKernel {
    GemmFn fn = nullptr;  // nullptr: no tiled kernel for this type at this ISA
    Isa isa = Isa::Scalar;
    GgmlType act_type = GgmlType::F32;
    // The tile the kernel is fastest at: callers hand it row and token counts that are multiples
    // of these where they can.
    int row_tile = 1;
    int tok_tile = 1;
    // Every result is select_dot's (same features) for that (row, token) bit for bit: the same
    // float steps in the same order. Where false (Q5_0 at AVX2; Q4_1, Q5_1; IQ4_XS at AVX2 and
    // AVX-512 VNNI) the tile sums in another order, and ops::matmul runs the small-batch kernel
    // (Q5_0 at AVX2: a lanes8 tile) or the dots for the tokens that must get their one-token
    // floats (tests/quant/matmul_token_order_test.cpp).
    bool dot_order = false;
};

GemmKernel select_gemm(GgmlType weight_type, const CpuFeatures& features);

// Small batches (decoding a token of each of a few sequences): a GemmFn that loads and unpacks each
// weight row once and dots it with up to kSmallBatchMaxTok activation rows (more take several
// passes). Unlike the tiles above, every result equals what select_dot's kernel gives for that
// (row, token) bit for bit: the same operations in the same order, so a sequence gets the same
// logits decoded alone or in a batch. fn is nullptr where the type has no such kernel at the
// level select_dot picks (callers then run the dots); row_tile and tok_tile are 1.
inline constexpr int kSmallBatchMaxTok = 8;
GemmKernel select_small_batch(GgmlType weight_type, const CpuFeatures& features);
// The most tokens callers hand a small-batch kernel in one call: F16's reads each weight row from
// memory once for up to kSmallBatchMaxTokF16 (a draft model's check of its drafts), the others for
// kSmallBatchMaxTok.
inline constexpr int kSmallBatchMaxTokF16 = 16;
constexpr int small_batch_max_tok(GgmlType weight_type) {
    return weight_type == GgmlType::F16 ? kSmallBatchMaxTokF16 : kSmallBatchMaxTok;
}

// llama.cpp's CPU backend is not batch-invariant: for a batch of tokens of one sequence (a prompt)
// it runs other kernels than for a lone token on some weight types, which sum in another float
// order (its tiled k-quant kernels, its repacked gemm). To give its bits for prompts too, fitllm
// runs such a kernel exactly for the tokens llama.cpp would run it for: `applies` says, from the
// weight's shape and where the token sits in its sequence's run of tokens in the batch
// (run_len tokens, this one at run_pos), whether llama.cpp computes that token with it; the others
// keep the single-token (dot) order. kernel.fn is nullptr (and applies too) for types that have no
// such order, or none at this CPU's level; a kernel's results do not depend on the ISA it runs at.
struct BatchOrderGemm {
    GemmKernel kernel;
    bool (*applies)(int64_t weight_rows, int64_t weight_cols, int32_t run_len, int32_t run_pos) = nullptr;
};
BatchOrderGemm select_batch_order_gemm(GgmlType weight_type, const CpuFeatures& features);

}  // namespace fitllm::quant
