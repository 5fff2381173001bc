#pragma once
// Attention of new query tokens over the paged, possibly quantized KV cache (kv/cache.h), read in
// place: flash-attention style, keys are visited in tiles of cells with an online softmax, so the
// working memory is O(threads * (tile + head_dim)) whatever the context length; no [n_tok, n_kv]
// buffer exists and nothing is dequantized beyond one tile of rows at a time.
//
// Arithmetic per K/V type:
//  - K and V both f16 or both f32, unshaped and unrotated, for a sequence with 64 or more tokens
//    in the call (llama.cpp's threshold for a ubatch, counted per sequence): exactly
//    ops::attention_f16_tiled (the same kernel, attention_f16_tiled_kernel.h; llama.cpp's tiled
//    CPU flash attention) with tiles of 64 positions (position / 64: the cells of llama.cpp's
//    cache for one sequence, which it keeps in position order): f32 q, scores and V sums.
//  - otherwise K and V f16 (the default): exactly ops::attention_f16 (the same kernel,
//    attention_f16_kernel.h; llama.cpp's CPU flash attention) over the visible cells in visit
//    order: q rounded to f16, one key at a time, V summed in f16; up to 32 queries (the heads of a
//    kv group for consecutive tokens of one sequence) share each pass over K/V.
//  - otherwise, with AVX2 or AVX-512 (attention_kv_tiled.inc): per work item of up to 32 queries
//    and tile of 64 visible cells, K and V rows are decoded to f32 once (SIMD for f32, f16, bf16,
//    q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl; the reference dequantization for the rest), scores are
//    f32 dots of q (times the layer's q_scale when its K is centred and scaled, kv/key_transform.h,
//    then rotated by the cache's Hadamard transform when the layer is stored rotated; rounded to
//    f16 for f16 K) with them, the softmax is rescaled once per tile and V is summed in
//    f32; a rotated layer's output is rotated back.
//  - otherwise (no AVX2): q quantized to the K type's dot activation format and scored with
//    quant::select_dot's kernel, V summed in f32 from rows dequantized one at a time.
// Blocks none of whose cells a work item's tokens can see (after the last position, before the
// first window) are passed over after one scan of their positions.
#include <cstddef>
#include <cstdint>

#include "kv/cache.h"
#include "ops/attention.h"
#include "ops/scratch.h"
#include "ops/thread_pool.h"

namespace fitllm::ops {

// For each token t (sequence q_seq[t], position q_pos[t]) and query head h, with kv head
// g = h / (n_head / n_head_kv):
//   out[t][h] = sum over visible cells c of softmax_c(scale * q[t][h] · K[c][g]) * V[c][g]
// where cell c is visible when it is in a block of cache.seq_blocks(q_seq[t]), holds that sequence
// (cell_has_seq), and its position passes the causal and sliding-window test of ops::attention.
// Cells are visited in block-table order, cells of a block in increasing index. A query that sees
// no cell gets zeros. q, out: [n_tok, n_head, head_dim]; the layer's K/V heads must match
// (n_head_kv, head_dim). Throws std::invalid_argument for inconsistent shapes or a K/V type
// without kernels.
void attention_kv(const float* q, const int32_t* q_pos, const kv::SeqId* q_seq, int64_t n_tok, const kv::KvCache& cache,
                  int layer, const AttentionParams& params, float* out, ThreadPool& pool, Scratch& scratch);

// The bytes of Scratch one call takes: per thread O(tile + head_dim), plus two ints per token;
// independent of the number of cells. For memory plans.
size_t attention_kv_scratch_bytes(int64_t n_tok, const AttentionParams& params, int n_threads);

}  // namespace fitllm::ops
