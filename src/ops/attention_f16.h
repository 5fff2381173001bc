#pragma once
// Attention as llama.cpp's CPU flash attention computes it over its default f16 KV cache, for
// outputs that match llama.cpp's to the rounding: the query is rounded to f16, keys are visited
// one at a time in cache order with an online softmax, and the weighted sum of V is kept in f16
// (rounded after every rescale and every multiply-add). Gemma 3's logits move by up to ~1 between
// this and exact float attention, enough to change greedy picks, so goldens need it.
//
// Same layout and contract as ops::attention (attention.h); K and V must already hold values
// representable in f16 (kv::KvCache rounds them when storing).
#include <cstdint>

#include "ops/attention.h"

namespace fitllm::ops {

void attention_f16(const float* q, const int32_t* q_pos, int64_t n_tok, const float* k, const float* v,
                   const int32_t* kv_pos, int64_t n_kv, const AttentionParams& params, float* out, ThreadPool& pool,
                   Scratch& scratch);

// The same with a choice of kernel, for tests and benchmarks: Best is what the overload above runs
// (AVX-512 where the CPU has it), Avx2 the AVX2 + F16C version of the same blocked kernel, OneQuery
// the one-query-at-a-time loop (also the fallback for head sizes that are not multiples of 32 and
// for CPUs without the instructions a choice needs). The q·k dot sums in the order of llama.cpp's
// build for the instruction set: 4 x 16 lanes for Best and OneQuery on a CPU with AVX-512, 4 x 8
// lanes otherwise (Avx2 always), so Best, OneQuery and Avx2 agree bit for bit except that on an
// AVX-512 CPU Avx2's scores may differ from the others' in the last bits.
enum class AttentionF16Kernel { Best, Avx2, OneQuery };
void attention_f16(const float* q, const int32_t* q_pos, int64_t n_tok, const float* k, const float* v,
                   const int32_t* kv_pos, int64_t n_kv, const AttentionParams& params, float* out, ThreadPool& pool,
                   Scratch& scratch, AttentionF16Kernel kernel);

// For tests: std::exp of n <= 8 floats as the kernel's softmax takes them (the blocked kernels
// vectorize glibc's expf algorithm and fall back to std::exp where a self-check finds another libm).
void attention_f16_exp(const float* x, int n, float* y, AttentionF16Kernel kernel);

// x rounded to the nearest f16 value (ties to even) and back to float; overflow gives infinity.
// Branch-free so that loops over it vectorize.
float round_to_f16(float x);

}  // namespace fitllm::ops
