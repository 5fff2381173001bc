#pragma once
// Internal to ops/: the arithmetic of llama.cpp's tiled CPU flash attention
// (ggml_compute_forward_flash_attn_ext_tiled, which llama.cpp runs for batches of 64 or more
// queries with f16 or f32 K/V) as steps of one 64-key tile, so that ops::attention_f16_tiled (K/V
// as float arrays, attention_f16_tiled.h) and ops::attention_kv (the paged cache) run the same
// code and round the same way.
//
// Per query and tile of 64 consecutive cells (llama.cpp's KV tile; cells a query does not see are
// masked with -inf):
//   s_j = (q . k_j) * scale            q in f32, each dot one fused multiply-add chain over the
//                                      head dimension from 0 (ggml's simd_gemm); with soft-capping
//                                      s_j = tanhf(dot * (scale / softcap)) * softcap
//   m   = max over the tile's visible s_j; a tile the query sees nothing of changes nothing
//   M'  = max(M, m); where M' > M: acc *= expf(M - M') and S *= the same (libm expf)
//   e_j = ggml_expf(s_j - M')          ggml_v_expf of ggml's AVX-512 build, lane by lane
//   S  += the e_j summed per group of 16 slots as _mm512_reduce_add_ps does, the four group sums
//         added in double, the result rounded to float once
//   acc[i] = fma(e_j, v_j[i], acc[i])  for the keys in slot order (simd_gemm)
// and at the end out = acc * (1 / S) (0 where S is 0); with a sink, first S and acc take it
// (ops::apply_sink).
//
// The kernels vectorize over queries (lanes) and keys; every variant (the scalar reference, AVX2,
// AVX-512) gives the reference's bits: the AVX2 one reproduces the AVX-512 build's exponential and
// reductions, since the arithmetic must not depend on the instruction set.
#include <cstdint>

#include "ops/attention.h"
#include "quant/cpu_features.h"

namespace fitllm::ops::fa_tiled {

inline constexpr int kRows = 32;  // query rows per item (lanes of the state)
inline constexpr int kKeys = 64;  // GGML_FA_TILE_KV: the cells of one tile

// One item's queries (up to kRows rows) and their running state. Buffers belong to the caller.
struct State {
    float* qt;         // [d][kRows]: the queries transposed, as given (f32); unused lanes 0
    float* acc;        // [kRows][d]: the weighted sums of V
    float* w;          // [kKeys][kRows]: scores, then weights, of the current tile
    float max[kRows];  // running maximum (-inf before any key)
    float sum[kRows];  // running sum of the weights
    int n_rows;
    int d;
};

// The keys of one tile that some row of the item sees: key j (j < n) sits in slot slot[j] of the
// 64-cell tile (increasing), its K and V rows are rows j of k and v (d floats each, the cache's
// values exactly: f16 converted, or f32), and row r sees it when bit r of rows[j] is set.
struct TileKeys {
    int n;
    const uint8_t* slot;
    const float* k;
    const float* v;
    const uint32_t* rows;
};

// Sets up st with its buffers (qt and acc kRows * d floats, w kKeys * kRows) for the queries
// q_rows[r], r < n_rows <= kRows.
void begin(State& st, float* qt, float* acc, float* w, const float* const* q_rows, int n_rows, int d);
// out_rows[r] receives row r's result; row_sinks[r] is row r's attention sink (nullptr: none),
// applied after the last tile as ggml does (ops::apply_sink).
void end(const State& st, float* const* out_rows, const float* row_sinks = nullptr);

enum class Isa { Reference, Avx2, Avx512 };
using TileFn = void (*)(State& st, const TileKeys& keys, const AttentionParams& p);
// The tile step of an instruction set (Avx2 needs AVX2 + FMA, Avx512 AVX-512F/VL/BW as well).
TileFn tile_fn(Isa isa);
// The fastest the CPU has.
Isa best_isa(const quant::CpuFeatures& f);

// ggml_v_expf of ggml's AVX-512 build for one float (the reference the kernels are tested against).
float ggml_expf(float x);

}  // namespace fitllm::ops::fa_tiled
