#pragma once
// Matrix products of a (usually quantized) weight matrix with float activations: every linear
// layer of a forward pass. Matrix-vector for decode (n_tok == 1); for a few tokens (a decode step of
// several sequences) each weight row is read once for all of them with the dot's arithmetic, so each
// token's results equal its n_tok == 1 results bit for bit where the type has such a kernel
// (quant::select_small_batch); cache-blocked matrix-matrix for prompt processing. All split the
// weight rows over the thread pool.
#include "ops/scratch.h"
#include "ops/thread_pool.h"
#include "ops/weight_view.h"

namespace fitllm::ops {

// y[t][r] = sum over c of w[r][c] * x[t][c] for t < n_tok, r < w.rows.
// x: [n_tok, w.cols] floats; y: [n_tok, w.rows] floats. The activations are converted once per
// token to the dot kernel's format (quant/dot.h). Throws std::invalid_argument for weight types
// without a dot kernel and for cols that are not whole blocks.
void matmul(const WeightView& w, const float* x, int n_tok, float* y, ThreadPool& pool, Scratch& scratch);

}  // namespace fitllm::ops
