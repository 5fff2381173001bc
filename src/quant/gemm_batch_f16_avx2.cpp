// F16's batch order (gemm_batch_f16.h) with AVX2: the reference's 16-lane accumulator is two 8-lane
// halves (lanes 0..7, 8..15), reduced in _mm512_reduce_add_ps's order; tiles of 2 rows x up to 2
// tokens (compiled with -mavx2 -mfma -mf16c).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "quant/gemm_batch_f16.h"
#include "quant/kquant_avx2.h"

namespace fitllm::quant::detail {
namespace {

__m256 load8(const std::byte* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <int R, int T>
void tile(int n, const std::byte* w, size_t w_stride, const std::byte* act, size_t act_stride, float* y,
          size_t y_stride) {
    __m256 lo[R][T], hi[R][T];
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) lo[r][t] = hi[r][t] = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __m256 a_lo[T], a_hi[T];
        for (int t = 0; t < T; ++t) {
            a_lo[t] = load8(act + t * act_stride + i * 2);
            a_hi[t] = load8(act + t * act_stride + i * 2 + 16);
        }
        for (int r = 0; r < R; ++r) {
            const __m256 x_lo = load8(w + r * w_stride + i * 2), x_hi = load8(w + r * w_stride + i * 2 + 16);
            for (int t = 0; t < T; ++t) {
                lo[r][t] = _mm256_fmadd_ps(x_lo, a_lo[t], lo[r][t]);
                hi[r][t] = _mm256_fmadd_ps(x_hi, a_hi[t], hi[r][t]);
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) y[t * y_stride + r] = reduce_add16(lo[r][t], hi[r][t]);
}

template <int R>
void rows(int n, int n_tok, const std::byte* w, size_t w_stride, const std::byte* act, size_t act_stride, float* y,
          size_t y_stride) {
    int t = 0;
    for (; t + 2 <= n_tok; t += 2)
        tile<R, 2>(n, w, w_stride, act + t * act_stride, act_stride, y + t * y_stride, y_stride);
    if (t < n_tok) tile<R, 1>(n, w, w_stride, act + t * act_stride, act_stride, y + t * y_stride, y_stride);
}

}  // namespace

void gemm_batch_f16_avx2(int n, int n_rows, int n_tok, const void* w, size_t w_stride, const void* act,
                         size_t act_stride, float* y, size_t y_stride) {
    const auto* wb = static_cast<const std::byte*>(w);
    const auto* ab = static_cast<const std::byte*>(act);
    int r = 0;
    for (; r + 2 <= n_rows; r += 2) rows<2>(n, n_tok, wb + r * w_stride, w_stride, ab, act_stride, y + r, y_stride);
    for (; r < n_rows; ++r) rows<1>(n, n_tok, wb + r * w_stride, w_stride, ab, act_stride, y + r, y_stride);
}

}  // namespace fitllm::quant::detail
