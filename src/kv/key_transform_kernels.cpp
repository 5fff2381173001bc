#include "kv/key_transform_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <optional>

#include "quant/block_grid.h"
#include "quant/cpu_features.h"

namespace fitllm::kv {

PaddedTriangle::PaddedTriangle(const float* dense, int d, bool upper) : d_(d), upper_(upper) {
    data_.reserve(floats_for(d));
    for (int i = 0; i < d; ++i) {
        const int first = upper ? i / 8 * 8 : 0;
        const int end = upper ? d : std::min(d, (i / 8 + 1) * 8);
        offset_.push_back(static_cast<ptrdiff_t>(data_.size()) - first);
        for (int j = first; j < end; ++j) {
            const bool inside = upper ? j >= i : j <= i;
            data_.push_back(inside ? dense[static_cast<size_t>(i) * d + j] : 0.0f);
        }
    }
}

PaddedTriangle::PaddedTriangle(int d, bool upper) : d_(d), upper_(upper) {
    data_.reserve(floats_for(d));
    for (int i = 0; i < d; ++i) {
        const int first = upper ? i / 8 * 8 : 0;
        const int end = upper ? d : std::min(d, (i / 8 + 1) * 8);
        offset_.push_back(static_cast<ptrdiff_t>(data_.size()) - first);
        data_.resize(data_.size() + static_cast<size_t>(end - first), 0.0f);
    }
}

void PaddedTriangle::zero_padding() {
    for (int i = 0; i < d_; ++i) {
        const int first = upper_ ? i / 8 * 8 : 0;
        const int end = upper_ ? d_ : std::min(d_, (i / 8 + 1) * 8);
        float* r = data_.data() + offset_[static_cast<size_t>(i)];
        for (int j = first; j < end; ++j) {
            if (upper_ ? j < i : j > i) r[j] = 0.0f;
        }
    }
}

float PaddedTriangle::at(int i, int j) const {
    return (upper_ ? j >= i : j <= i) ? row(i)[j] : 0.0f;
}

size_t PaddedTriangle::floats_for(int d) {
    size_t n = 0;
    for (int i = 0; i < d; ++i) n += static_cast<size_t>(d - i / 8 * 8);  // the same count for the lower one
    return n;
}

namespace key_kernels {
namespace {

constexpr int kBlock = quant::BlockGrid::kElements;

// c[r][j0 .. j0 + 8) (r < n, row stride ldc) += sign * sum over k < kn of a[r * lda + k] * B[i0 + k][j0 ..].
[[gnu::always_inline]] inline void panel_reference(const float* a, int lda, int n, int kn, const PaddedTriangle& b,
                                                   int i0, int j0, float* c, int ldc, float sign) {
    float acc[kRows][8] = {};
    for (int k = 0; k < kn; ++k) {
        const float* br = b.row(i0 + k) + j0;
        for (int r = 0; r < n; ++r) {
            const float ar = a[r * lda + k];
            for (int l = 0; l < 8; ++l) acc[r][l] += ar * br[l];
        }
    }
    for (int r = 0; r < n; ++r) {
        for (int l = 0; l < 8; ++l) c[r * ldc + j0 + l] += sign * acc[r][l];
    }
}

template <int N>
__attribute__((target("avx2,fma"))) inline void panel_avx2_n(const float* a, int lda, int kn, const PaddedTriangle& b,
                                                             int i0, int j0, float* c, int ldc, float sign) {
    __m256 acc[N];
    for (int r = 0; r < N; ++r) acc[r] = _mm256_setzero_ps();
    for (int k = 0; k < kn; ++k) {
        const __m256 br = _mm256_loadu_ps(b.row(i0 + k) + j0);
        for (int r = 0; r < N; ++r) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(a[r * lda + k]), br, acc[r]);
    }
    const __m256 s = _mm256_set1_ps(sign);
    for (int r = 0; r < N; ++r) {
        float* cr = c + r * ldc + j0;
        _mm256_storeu_ps(cr, _mm256_fmadd_ps(s, acc[r], _mm256_loadu_ps(cr)));
    }
}

__attribute__((target("avx2,fma"))) inline void panel_avx2(const float* a, int lda, int n, int kn,
                                                           const PaddedTriangle& b, int i0, int j0, float* c, int ldc,
                                                           float sign) {
    switch (n) {
        case 1:
            return panel_avx2_n<1>(a, lda, kn, b, i0, j0, c, ldc, sign);
        case 2:
            return panel_avx2_n<2>(a, lda, kn, b, i0, j0, c, ldc, sign);
        case 3:
            return panel_avx2_n<3>(a, lda, kn, b, i0, j0, c, ldc, sign);
        case 4:
            return panel_avx2_n<4>(a, lda, kn, b, i0, j0, c, ldc, sign);
        case 5:
            return panel_avx2_n<5>(a, lda, kn, b, i0, j0, c, ldc, sign);
        case 6:
            return panel_avx2_n<6>(a, lda, kn, b, i0, j0, c, ldc, sign);
        case 7:
            return panel_avx2_n<7>(a, lda, kn, b, i0, j0, c, ldc, sign);
        default:
            return panel_avx2_n<8>(a, lda, kn, b, i0, j0, c, ldc, sign);
    }
}

// out = x B, 8 columns at a time: an upper B's rows i < j0 + 8 reach columns j0 .. j0 + 7, a
// lower B's rows i >= j0.
template <class Panel>
[[gnu::always_inline]] inline void rows_times_impl(const float* x, int n, const PaddedTriangle& b, float* out,
                                                   Panel panel) {
    const int d = b.size();
    std::fill(out, out + static_cast<size_t>(n) * d, 0.0f);
    for (int j0 = 0; j0 < d; j0 += 8) {
        const int i0 = b.upper() ? 0 : j0;
        const int i1 = b.upper() ? j0 + 8 : d;
        panel(x + i0, d, n, i1 - i0, b, i0, j0, out, d, 1.0f);
    }
}

using Grids = std::array<std::optional<quant::BlockGrid>, kRows>;
using Codes = std::array<std::array<uint8_t, kBlock>, kRows>;

// One block (values b .. b + 31) of n <= 8 rows w (stride d), a row at a time (any grid): value j
// rounded on its row's grid, its error e_j = (w_j - rounded) / U_jj moving the block's later values;
// err[r * 32 + j - b] keeps the errors for the update of the blocks after it.
[[gnu::always_inline]] inline void round_block(float* w, int n, const PaddedTriangle& u, int b, const Grids& grids,
                                               Codes& codes, float* err) {
    const int d = u.size();
    for (int j = b; j < b + kBlock; ++j) {
        const float* uj = u.row(j);
        const float inv_diagonal = 1.0f / uj[j];
        for (int r = 0; r < n; ++r) {
            float* wr = w + r * d;
            const quant::BlockGrid& grid = *grids[static_cast<size_t>(r)];
            const int code = grid.nearest(wr[j]);
            codes[static_cast<size_t>(r)][static_cast<size_t>(j - b)] = static_cast<uint8_t>(code);
            const float e = (wr[j] - grid.value(code)) * inv_diagonal;
            err[r * kBlock + (j - b)] = e;
            for (int k = j + 1; k < b + kBlock; ++k) wr[k] -= e * uj[k];  // the rest of this block now
        }
    }
}

// The same for uniform grids with the rows in the lanes of a vector: tile[k] holds value b + k of
// every row, and each step rounds value j of all rows at once (nearest(), value() and the update as
// vector arithmetic; FMA may round a tie differently from the row-at-a-time version).
__attribute__((target("avx2,fma"))) void round_block_lanes(float* w, int n, const PaddedTriangle& u, int b,
                                                           const Grids& grids, Codes& codes, float* err) {
    const int d = u.size();
    alignas(32) float tile[kBlock][8] = {};
    alignas(32) float inv[8] = {}, step[8] = {}, min[8] = {};
    for (int r = 0; r < n; ++r) {
        const quant::BlockGrid& g = *grids[static_cast<size_t>(r)];
        inv[r] = g.inverse_step();
        step[r] = g.step();
        min[r] = g.min();
        for (int k = 0; k < kBlock; ++k) tile[k][r] = w[r * d + b + k];
    }
    const quant::BlockGrid& g0 = *grids[0];
    const __m256 v_inv = _mm256_load_ps(inv), v_step = _mm256_load_ps(step), v_min = _mm256_load_ps(min);
    const __m256 round = _mm256_set1_ps(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
    const __m256 lo = _mm256_set1_ps(static_cast<float>(-g0.offset()));
    const __m256 hi = _mm256_set1_ps(static_cast<float>(g0.max_code() - g0.offset()));
    alignas(32) float q_lanes[8], e_lanes[8];
    for (int j = 0; j < kBlock; ++j) {
        const float* uj = u.row(b + j);
        const __m256 x = _mm256_load_ps(tile[j]);
        const __m256 scaled = _mm256_mul_ps(_mm256_sub_ps(x, v_min), v_inv);
        const __m256 q = _mm256_min_ps(_mm256_max_ps(_mm256_sub_ps(_mm256_add_ps(scaled, round), round), lo), hi);
        const __m256 value = _mm256_add_ps(_mm256_mul_ps(v_step, q), v_min);
        const __m256 e = _mm256_mul_ps(_mm256_sub_ps(x, value), _mm256_set1_ps(1.0f / uj[b + j]));
        _mm256_store_ps(q_lanes, q);
        _mm256_store_ps(e_lanes, e);
        for (int r = 0; r < n; ++r) {
            codes[static_cast<size_t>(r)][static_cast<size_t>(j)] =
                static_cast<uint8_t>(static_cast<int>(q_lanes[r]) + g0.offset());
            err[r * kBlock + j] = e_lanes[r];
        }
        for (int k = j + 1; k < kBlock; ++k) {
            _mm256_store_ps(tile[k], _mm256_fnmadd_ps(e, _mm256_set1_ps(uj[b + k]), _mm256_load_ps(tile[k])));
        }
    }
}

template <bool kLanes, class Panel>
[[gnu::always_inline]] inline void round_impl(float* w, int n, const PaddedTriangle& u, quant::GgmlType type,
                                              std::byte* const* dst, float* err, Panel panel) {
    const int d = u.size();
    const size_t block_bytes = *quant::row_bytes(type, kBlock);
    Codes codes{};
    Grids grids;
    for (int b = 0; b < d; b += kBlock) {
        for (int r = 0; r < n; ++r) grids[static_cast<size_t>(r)] = quant::BlockGrid::fit(type, w + r * d + b, true);
        if constexpr (kLanes) {
            if (grids[0]->uniform()) {
                round_block_lanes(w, n, u, b, grids, codes, err);
            } else {
                round_block(w, n, u, b, grids, codes, err);
            }
        } else {
            round_block(w, n, u, b, grids, codes, err);
        }
        for (int r = 0; r < n; ++r) {
            grids[static_cast<size_t>(r)]->write(codes[static_cast<size_t>(r)].data(),
                                                 dst[r] + static_cast<size_t>(b / kBlock) * block_bytes);
        }
        // The blocks after it: w[r][j0 ..] -= sum over this block's j of err[r][j] U[j][j0 ..].
        for (int j0 = b + kBlock; j0 < d; j0 += 8) panel(err, kBlock, n, kBlock, u, b, j0, w, d, -1.0f);
    }
}

__attribute__((target("avx2,fma"))) void rows_times_avx2(const float* x, int n, const PaddedTriangle& b, float* out) {
    rows_times_impl(x, n, b, out, panel_avx2);
}
__attribute__((target("avx2,fma"))) void round_with_feedback_avx2(float* w, int n, const PaddedTriangle& u,
                                                                  quant::GgmlType type, std::byte* const* dst,
                                                                  float* err) {
    round_impl<true>(w, n, u, type, dst, err, panel_avx2);
}

}  // namespace

bool has_avx2() {
    static const bool avx2 = [] {
        const quant::CpuFeatures f = quant::host_cpu_features();
        return f.avx2 && f.fma;
    }();
    return avx2;
}

void rows_times_reference(const float* x, int n, const PaddedTriangle& b, float* out) {
    rows_times_impl(x, n, b, out, panel_reference);
}
void round_with_feedback_reference(float* w, int n, const PaddedTriangle& u, quant::GgmlType type,
                                   std::byte* const* dst, float* err) {
    round_impl<false>(w, n, u, type, dst, err, panel_reference);
}

void rows_times(const float* x, int n, const PaddedTriangle& b, float* out) {
    if (has_avx2()) return rows_times_avx2(x, n, b, out);
    rows_times_reference(x, n, b, out);
}
void round_with_feedback(float* w, int n, const PaddedTriangle& u, quant::GgmlType type, std::byte* const* dst,
                         float* err) {
    if (has_avx2()) return round_with_feedback_avx2(w, n, u, type, dst, err);
    round_with_feedback_reference(w, n, u, type, dst, err);
}

}  // namespace key_kernels
}  // namespace fitllm::kv
