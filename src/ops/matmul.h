#pragma once
// Matrix products of a (usually quantized) weight matrix with float activations: every linear
// layer of a forward pass. Matrix-vector for decode (n_tok == 1); for a few tokens (a decode step of
// several sequences) each weight row is read once for all of them with the dot's arithmetic, so each
// token's results equal its n_tok == 1 results bit for bit where the type has such a kernel
// (quant::select_small_batch); cache-blocked matrix-matrix for prompt processing. All split the
// weight rows over the thread pool.
#include <cstdint>
#include <span>

#include "ops/scratch.h"
#include "ops/thread_pool.h"
#include "ops/weight_view.h"

namespace fitllm::ops {

// Where a token sits in its sequence's run of tokens in a batch: the sequence has run_len tokens
// in the batch (counted over the tokens the matmul multiplies), this one is number run_pos of them.
struct TokenPlace {
    int32_t run_len = 1;
    int32_t run_pos = 0;
};

// y[t][r] = sum over c of w[r][c] * x[t][c] for t < n_tok, r < w.rows.
// x: [n_tok, w.cols] floats; y: [n_tok, w.rows] floats. The activations are converted once per
// token to the dot kernel's format (quant/dot.h). Throws std::invalid_argument for weight types
// without a dot kernel, for cols that are not whole blocks, and for places that are neither empty
// nor one per token.
//
// places (one per token, or empty: every token alone) lets matmul give llama.cpp's bits for
// prompts: for the tokens quant::select_batch_order_gemm's rule picks (those llama.cpp multiplies
// with a batch kernel, such as the k-quants' tiled kernels for runs of 8 or more tokens) it runs
// that kernel, the others get the single-token order. A token's results then depend on its place
// and never on the other sequences in the batch; runs of 1 (decode) take exactly the path they
// take without places.
void matmul(const WeightView& w, const float* x, int n_tok, float* y, ThreadPool& pool, Scratch& scratch,
            std::span<const TokenPlace> places = {});

}  // namespace fitllm::ops
