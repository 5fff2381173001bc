#pragma once
// Dot products of one weight row with one activation row: the inner loop of every matmul.
//
// Each weight type is paired with the activation format llama.cpp pairs it with, so that the
// activations are quantized once per matmul and the dot runs on integers:
//   Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 -> Q8_0      Q4_1, Q5_1 -> Q8_1 (its s = d * sum(q) carries the min term)
//   Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, TQ1_0, TQ2_0, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS,
//   IQ2_S, IQ1_S, IQ1_M -> Q8_K
//   F32, F16, BF16 -> F32. llama.cpp rounds activations to F16 / BF16 for these; we keep them in
//   F32: converting the weights costs one instruction per 8 or 16 values, the activation row of a
//   matrix-vector product sits in L1 either way, and the result is more accurate.
//
// For every weight type there is a scalar reference (dot_ref.cpp) and AVX2 / AVX-512 / AVX-512 VNNI
// versions (dot_avx2*.cpp, dot_avx512*.cpp) that tests hold to the reference.
#include <cstddef>

#include "quant/cpu_features.h"
#include "quant/ggml_type.h"

namespace fitllm::quant {

// *out = sum over i < n of w[i] * act[i]. n is a whole number of blocks of both row types;
// w_row is a row of the weight type, act_row one of the kernel's act_type.
using DotFn = void (*)(int n, float* out, const void* w_row, const void* act_row);

// out[r] = the dot of weight row r (at w + r * w_stride) with act_row, for r < n_rows: each out[r]
// the very float DotFn gives for that row, computed for several rows at once (one weight row's
// block at a time in every row, the per-row reductions shared).
using DotRowsFn = void (*)(int n, int n_rows, float* out, const void* w, size_t w_stride, const void* act_row);

struct DotKernel {
    DotFn fn = nullptr;  // nullptr: no kernel for this weight type
    Isa isa = Isa::Scalar;
    GgmlType act_type = GgmlType::F32;
    DotRowsFn rows = nullptr;  // where there is one: fn for many rows (matrix-vector), fn's bits
};

// The weight types select_dot has kernels for.
bool has_dot(GgmlType weight_type);

// The activation format paired with a weight type (see above); F32 for types without a dot.
GgmlType dot_activation_type(GgmlType weight_type);

// The fastest kernel for the weight type that the features allow (kernel.isa tells which).
// fn is nullptr when !has_dot(weight_type).
DotKernel select_dot(GgmlType weight_type, const CpuFeatures& features);

}  // namespace fitllm::quant
