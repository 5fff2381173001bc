// F16's batch order (gemm_batch_f16.h) with AVX-512: tiles of 4 rows x up to 4 tokens, one 16-lane
// accumulator each (compiled with -mavx512f -mavx512bw -mavx512vl -mfma -mf16c).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "quant/gemm_batch_f16.h"

// GCC 12's _mm512_cvtph_ps and _mm512_reduce_add_ps pass _mm512_undefined_*() as the ignored merge
// source, which -Wuninitialized reports in every caller (GCC bug 105593): not a fault of this file.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace fitllm::quant::detail {
namespace {

__m512 load16(const std::byte* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

template <int R, int T>
void tile(int n, const std::byte* w, size_t w_stride, const std::byte* act, size_t act_stride, float* y,
          size_t y_stride) {
    __m512 acc[R][T];
    for (auto& row : acc)
        for (auto& v : row) v = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __m512 a[T];
        for (int t = 0; t < T; ++t) a[t] = load16(act + t * act_stride + i * 2);
        for (int r = 0; r < R; ++r) {
            const __m512 x = load16(w + r * w_stride + i * 2);
            for (int t = 0; t < T; ++t) acc[r][t] = _mm512_fmadd_ps(x, a[t], acc[r][t]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) y[t * y_stride + r] = _mm512_reduce_add_ps(acc[r][t]);
}

template <int R>
void rows(int n, int n_tok, const std::byte* w, size_t w_stride, const std::byte* act, size_t act_stride, float* y,
          size_t y_stride) {
    int t = 0;
    for (; t + 4 <= n_tok; t += 4)
        tile<R, 4>(n, w, w_stride, act + t * act_stride, act_stride, y + t * y_stride, y_stride);
    const std::byte* a = act + t * act_stride;
    float* yt = y + t * y_stride;
    switch (n_tok - t) {
        case 3:
            return tile<R, 3>(n, w, w_stride, a, act_stride, yt, y_stride);
        case 2:
            return tile<R, 2>(n, w, w_stride, a, act_stride, yt, y_stride);
        case 1:
            return tile<R, 1>(n, w, w_stride, a, act_stride, yt, y_stride);
        default:
            return;
    }
}

}  // namespace

void gemm_batch_f16_avx512(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act,
                           size_t act_stride, float* y, size_t y_stride) {
    const auto* wb = static_cast<const std::byte*>(w);
    const auto* ab = static_cast<const std::byte*>(act);
    int r = 0;
    for (; r + 4 <= n_rows; r += 4) rows<4>(n, n_tok, wb + r * w_stride, w_stride, ab, act_stride, y + r, y_stride);
    for (; r < n_rows; ++r) rows<1>(n, n_tok, wb + r * w_stride, w_stride, ab, act_stride, y + r, y_stride);
}

}  // namespace fitllm::quant::detail
