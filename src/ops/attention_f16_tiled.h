#pragma once
// Attention as llama.cpp's tiled CPU flash attention computes it (the kernel it runs for a batch
// of 64 or more queries over an f16 or f32 KV cache; attention_f16_tiled_kernel.h has the
// arithmetic): q stays f32, keys go in tiles of 64 consecutive entries with one rescale of the f32
// sums per tile. ops::attention_kv runs the same kernel over the paged cache; this form over
// plain arrays is for tests against ggml and for benchmarks.
//
// Same layout and contract as ops::attention (attention.h): key j of k / v is tile j / 64, slot
// j % 64; K and V hold the cache's values (f16 values for an f16 cache).
#include <cstdint>

#include "ops/attention.h"

namespace fitllm::ops {

// Which implementation: Best (AVX-512 where the CPU has it, else AVX2, else Reference), or one of
// them (one the CPU lacks falls back to Reference). All give the same bits.
enum class AttentionTiledKernel { Best, Avx512, Avx2, Reference };

void attention_f16_tiled(const float* q, const int32_t* q_pos, int64_t n_tok, const float* k, const float* v,
                         const int32_t* kv_pos, int64_t n_kv, const AttentionParams& params, float* out,
                         ThreadPool& pool, Scratch& scratch, AttentionTiledKernel kernel = AttentionTiledKernel::Best);

}  // namespace fitllm::ops
