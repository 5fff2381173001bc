#include "quant/quantize_iq.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "quant/blocks.h"
#include "quant/iq_grids.h"
#include "quant/quantize_fit.h"

namespace fitllm::quant::detail {
namespace {

using fit::nearest;  // ggml's nearest_int

// A lattice grid for the searches: points of kDims values on the levels 2l + 1 (l < 2^kBits), each
// point as kDims bytes; the grid index of each level combination (its code, kBits a value); and,
// for the combinations off the grid whose levels are all at most max_level, their nearest grid
// points (the n_distances smallest squared distances, every point at each).
template <typename Point, int kDims, int kBits>
struct LatticeGrid {
    std::vector<Point> points;         // bytes 2l + 1
    std::vector<int> index_of;         // code -> grid index, or -1 - offset of its neighbour list
    std::vector<uint16_t> neighbours;  // per off-grid code: count, then grid indices

    const uint16_t* neighbours_of(int code) const { return neighbours.data() + (-index_of[code] - 1); }
    static int code(const int8_t* L) {
        int u = 0;
        for (int i = 0; i < kDims; ++i) u |= L[i] << (kBits * i);
        return u;
    }
};
using Iq3Grid = LatticeGrid<uint32_t, 4, 3>;  // IQ3_XXS, IQ3_S: levels 0..7
using Iq2Grid = LatticeGrid<uint64_t, 8, 2>;  // IQ2_*, IQ1_*: levels 0..2

// `level_of_byte` turns a byte of the dequantization grid into its level l.
template <typename Grid, typename Point, size_t N, typename Level>
Grid make_lattice_grid(const Point (&grid)[N], Level level_of_byte, int n_distances, int max_level) {
    constexpr int kDims = sizeof(Point);
    constexpr int kBits = kDims == 4 ? 3 : 2;
    constexpr int kCodes = 1 << (kBits * kDims);
    constexpr int kMask = (1 << kBits) - 1;
    Grid g;
    g.points.resize(N);
    g.index_of.assign(kCodes, -1);
    for (size_t k = 0; k < N; ++k) {
        Point point = 0;
        int code = 0;
        for (int i = 0; i < kDims; ++i) {
            const int l = level_of_byte(static_cast<int>((grid[k] >> (8 * i)) & 0xFF));
            point |= static_cast<Point>(2 * l + 1) << (8 * i);
            code |= l << (kBits * i);
        }
        g.points[k] = point;
        g.index_of[code] = static_cast<int>(k);
    }
    std::vector<std::pair<int, int>> dist(N);
    for (int code = 0; code < kCodes; ++code) {
        if (g.index_of[code] >= 0) continue;
        bool queried = true;
        for (int i = 0; i < kDims; ++i) queried = queried && ((code >> (kBits * i)) & kMask) <= max_level;
        if (!queried) continue;
        int pos[kDims];
        for (int i = 0; i < kDims; ++i) pos[i] = 2 * ((code >> (kBits * i)) & kMask) + 1;
        for (size_t j = 0; j < N; ++j) {
            int d2 = 0;
            for (int i = 0; i < kDims; ++i) {
                const int d = static_cast<int>((g.points[j] >> (8 * i)) & 0xFF) - pos[i];
                d2 += d * d;
            }
            dist[j] = {d2, static_cast<int>(j)};
        }
        std::sort(dist.begin(), dist.end());
        const size_t start = g.neighbours.size();
        g.index_of[code] = -static_cast<int>(start) - 1;
        g.neighbours.push_back(0);
        int have = 1, d2 = dist[0].first;
        for (size_t j = 0; j < N; ++j) {
            if (dist[j].first > d2) {
                if (have == n_distances) break;
                d2 = dist[j].first;
                ++have;
            }
            g.neighbours.push_back(static_cast<uint16_t>(dist[j].second));
        }
        g.neighbours[start] = static_cast<uint16_t>(g.neighbours.size() - start - 1);
    }
    return g;
}

int level_of(uint64_t point, int i) {
    return (static_cast<int>((point >> (8 * i)) & 0xFF) - 1) / 2;
}

// The neighbour of `code` with the least weighted squared error at `scale`; writes its levels.
template <typename Grid>
int best_neighbour(const Grid& g, int code, const float* xval, const float* weight, float scale, int8_t* L) {
    constexpr int kDims = sizeof(g.points[0]);
    const uint16_t* list = g.neighbours_of(code);
    float best_d2 = FLT_MAX;
    int best = -1;
    for (int j = 1; j <= list[0]; ++j) {
        float d2 = 0.0f;
        for (int i = 0; i < kDims; ++i) {
            const float q = static_cast<float>((g.points[list[j]] >> (8 * i)) & 0xFF);
            const float diff = scale * q - xval[i];
            d2 += weight[i] * diff * diff;
        }
        if (d2 < best_d2) {
            best_d2 = d2;
            best = list[j];
        }
    }
    if (best < 0) throw std::logic_error("i-quant quantizer: no grid neighbour");
    for (int i = 0; i < kDims; ++i) L[i] = static_cast<int8_t>(level_of(g.points[best], i));
    return best;
}

const Iq3Grid& iq3xxs_grid() {
    static const Iq3Grid g = make_lattice_grid<Iq3Grid>(
        kIq3xxsGrid, [](int v) { return v == 62 ? 7 : (v - 4) / 8; }, 2, 7);
    return g;
}

const Iq3Grid& iq3s_grid() {
    static const Iq3Grid g = make_lattice_grid<Iq3Grid>(
        kIq3sGrid, [](int v) { return (v - 1) / 2; }, 3, 7);
    return g;
}

constexpr int kMaxQ = 8;

// The scale search of one sub-block of 32 magnitudes xval (the part IQ3_XXS and IQ3_S share).
// `n_try`: scales (2 kMaxQ - 1 + 0.2 t) / max for t in [-n_try, n_try]; `initially_on_grid`: the
// groups' state before any scale won (IQ3_XXS true, IQ3_S false); `all_again`: whether the second
// pass redoes every group (IQ3_S) or only those that were off the grid (IQ3_XXS). Returns the scale;
// L: the levels, every group a grid point.
float search_sub_block(const Iq3Grid& g, const float* xval, const float* weight, const float* waux, float max,
                       int n_try, bool initially_on_grid, bool all_again, int8_t* L) {
    int8_t Laux[32];
    bool on_grid[8], on_grid_aux[8];
    float best = 0.0f;
    float scale = max / (2 * kMaxQ - 1);
    std::fill(on_grid, on_grid + 8, initially_on_grid);
    for (int t = -n_try; t <= n_try; ++t) {
        const float id = (2 * kMaxQ - 1 + t * 0.2f) / max;
        const float this_scale = 1 / id;
        for (int k = 0; k < 8; ++k) {
            for (int i = 0; i < 4; ++i) {
                const int l = nearest(0.5f * (id * xval[4 * k + i] - 1));
                Laux[4 * k + i] = static_cast<int8_t>(std::max(0, std::min(kMaxQ - 1, l)));
            }
            const int u = Iq3Grid::code(Laux + 4 * k);
            on_grid_aux[k] = g.index_of[u] >= 0;
            if (!on_grid_aux[k]) best_neighbour(g, u, xval + 4 * k, waux + 4 * k, this_scale, Laux + 4 * k);
        }
        float sumqx = 0.0f, sumq2 = 0.0f;
        for (int i = 0; i < 32; ++i) {
            const float w = weight[i];
            const float q = 2 * Laux[i] + 1;
            sumqx += w * xval[i] * q;
            sumq2 += w * q * q;
        }
        if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            std::copy(Laux, Laux + 32, L);
            std::copy(on_grid_aux, on_grid_aux + 8, on_grid);
        }
    }
    int n_off = 0;
    for (int k = 0; k < 8; ++k) n_off += on_grid[k] ? 0 : 1;
    if (n_off > 0 && scale > 0.0f) {
        const float id = 1 / scale;
        for (int k = 0; k < 8; ++k) {
            if (!all_again && on_grid[k]) continue;
            int u = 0;
            for (int i = 0; i < 4; ++i) {
                const int l = std::max(0, std::min(kMaxQ - 1, nearest(0.5f * (id * xval[4 * k + i] - 1))));
                u |= l << (3 * i);
            }
            int index = g.index_of[u];
            if (index < 0) index = best_neighbour(g, u, xval + 4 * k, waux + 4 * k, scale, L + 4 * k);
            for (int i = 0; i < 4; ++i)
                L[4 * k + i] = static_cast<int8_t>((((g.points[index] >> (8 * i)) & 0xFF) - 1) / 2);
        }
        float sumqx = 0.0f, sumq2 = 0.0f;
        for (int i = 0; i < 32; ++i) {
            const float w = weight[i];
            const float q = 2 * L[i] + 1;
            sumqx += w * xval[i] * q;
            sumq2 += w * q * q;
        }
        if (sumq2 > 0.0f) scale = sumqx / sumq2;
    }
    return scale;
}

void weights_of(const float* xb, const float* qw, float sigma2, float* weight, float* waux) {
    for (int i = 0; i < 32; ++i) weight[i] = qw ? qw[i] * std::sqrt(sigma2 + xb[i] * xb[i]) : xb[i] * xb[i];
    for (int i = 0; i < 32; ++i) waux[i] = std::sqrt(weight[i]);
}

float sigma2_of(const float* x) {
    float sumx2 = 0.0f;
    for (int i = 0; i < kQK; ++i) sumx2 += x[i] * x[i];
    return 2 * sumx2 / kQK;
}

// ---- IQ2_*, IQ1_*: grids of 8 values on the levels 2l + 1, l in 0..2 (Iq2Grid) ----

// IQ2 grid bytes 8, 25, 43 -> levels 0, 1, 2; IQ1 bytes -1, 0, 1 (int8) -> 0, 1, 2.
int iq2_level(int v) {
    return v == 8 ? 0 : v == 25 ? 1 : 2;
}
int iq1_level(int v) {
    return static_cast<int8_t>(v) + 1;
}

const Iq2Grid& iq1s_grid() {
    static const Iq2Grid g = make_lattice_grid<Iq2Grid>(kIq1sGrid, iq1_level, 3, 2);
    return g;
}

const Iq2Grid& iq2s_grid() {
    static const Iq2Grid g = make_lattice_grid<Iq2Grid>(kIq2sGrid, iq2_level, 1, 2);
    return g;
}

// The signs of groups of 8 split off: xval the magnitudes, a bit per negative value (IQ2_S, IQ3_S).
void split_signs(const float* xb, int groups, float* xval, uint8_t* block_signs) {
    for (int k = 0; k < groups; ++k) {
        uint8_t s = 0;
        for (int i = 0; i < 8; ++i) {
            if (xb[8 * k + i] >= 0) {
                xval[8 * k + i] = xb[8 * k + i];
            } else {
                xval[8 * k + i] = -xb[8 * k + i];
                s = static_cast<uint8_t>(s | (1 << i));
            }
        }
        block_signs[k] = s;
    }
}

// As split_signs, with an even number of negatives per group: where the count is odd, the value of
// least weight * x^2 is taken with the wrong sign (IQ2_XXS, IQ2_XS, IQ3_XXS).
void even_signs(const float* xb, const float* weight, int groups, float* xval, uint8_t* block_signs) {
    split_signs(xb, groups, xval, block_signs);
    for (int k = 0; k < groups; ++k) {
        if (std::popcount(block_signs[k]) % 2) {
            int imin = 0;
            float min = weight[8 * k] * xb[8 * k] * xb[8 * k];
            for (int i = 1; i < 8; ++i) {
                const float ax = weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                if (ax < min) {
                    min = ax;
                    imin = i;
                }
            }
            xval[8 * k + imin] = -xval[8 * k + imin];
            block_signs[k] = static_cast<uint8_t>(block_signs[k] ^ (1 << imin));
        }
        block_signs[k] &= 127;
    }
}

const Iq2Grid& iq2xxs_grid() {
    static const Iq2Grid g = make_lattice_grid<Iq2Grid>(kIq2xxsGrid, iq2_level, 2, 2);
    return g;
}

const Iq2Grid& iq2xs_grid() {
    static const Iq2Grid g = make_lattice_grid<Iq2Grid>(kIq2xsGrid, iq2_level, 2, 2);
    return g;
}

// One trial scale of the IQ2 searches: every group of 8 rounded to the levels at 1 / id, off-grid
// groups replaced by their best neighbour; on_grid (optional) says which were on the grid.
void iq2_trial(const Iq2Grid& g, int groups, const float* xval, const float* waux, float id, int8_t* Laux,
               bool* on_grid) {
    const float this_scale = 1 / id;
    for (int k = 0; k < groups; ++k) {
        for (int i = 0; i < 8; ++i) {
            const int l = nearest(0.5f * (id * xval[8 * k + i] - 1));
            Laux[8 * k + i] = static_cast<int8_t>(std::max(0, std::min(2, l)));
        }
        const int u = Iq2Grid::code(Laux + 8 * k);
        const bool on = g.index_of[u] >= 0;
        if (on_grid) on_grid[k] = on;
        if (!on) best_neighbour(g, u, xval + 8 * k, waux + 8 * k, this_scale, Laux + 8 * k);
    }
}

float weighted_fit(int n, const float* weight, const float* xval, const int8_t* L, float* sumqx_out) {
    float sumqx = 0.0f, sumq2 = 0.0f;
    for (int i = 0; i < n; ++i) {
        const float q = 2 * L[i] + 1;
        sumqx += weight[i] * xval[i] * q;
        sumq2 += weight[i] * q * q;
    }
    *sumqx_out = sumqx;
    return sumq2;
}

// The scale search of a sub-block of 16 magnitudes, two groups of 8 (IQ2_XS and IQ2_S): 19 trial
// scales (5 + 0.1 t) / max; at the best, the groups that were off the grid are rounded again and
// moved to their best neighbours, and the scale refitted. Returns the scale (its sign unchecked);
// L: the levels (0..2), both groups grid points.
float search_pair_of_groups(const Iq2Grid& g, const float* xval, const float* weight, const float* waux, float max,
                            int8_t* L) {
    int8_t Laux[16];
    float best = 0.0f;
    float scale = max / 5;
    bool on_grid[2] = {true, true}, on_grid_aux[2];
    for (int t = -9; t <= 9; ++t) {
        const float id = (2 * 3 - 1 + t * 0.1f) / max;
        iq2_trial(g, 2, xval, waux, id, Laux, on_grid_aux);
        float sumqx;
        const float sumq2 = weighted_fit(16, weight, xval, Laux, &sumqx);
        if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            std::copy(Laux, Laux + 16, L);
            on_grid[0] = on_grid_aux[0];
            on_grid[1] = on_grid_aux[1];
        }
    }
    if ((!on_grid[0] || !on_grid[1]) && scale > 0.0f) {
        const float id = 1 / scale;
        for (int k = 0; k < 2; ++k) {
            if (on_grid[k]) continue;
            for (int i = 0; i < 8; ++i)
                L[8 * k + i] =
                    static_cast<int8_t>(std::max(0, std::min(2, nearest(0.5f * (id * xval[8 * k + i] - 1)))));
            const int u = Iq2Grid::code(L + 8 * k);
            if (g.index_of[u] < 0) best_neighbour(g, u, xval + 8 * k, waux + 8 * k, scale, L + 8 * k);
        }
        float sumqx;
        const float sumq2 = weighted_fit(16, weight, xval, L, &sumqx);
        if (sumq2 > 0.0f) scale = sumqx / sumq2;
    }
    return scale;
}

// ---- IQ1_S / IQ1_M: values -1, 0, 1 shifted by +-1/8, an exhaustive search of the two cut points ----

constexpr float kIq1Delta = 0.125f;
constexpr float kXp[3] = {-1 + kIq1Delta, kIq1Delta, 1 + kIq1Delta};
constexpr float kXm[3] = {-1 - kIq1Delta, -kIq1Delta, 1 - kIq1Delta};

// The group of 8 nearest its off-grid code among the code's neighbours, values xg[level] at scale.
int iq1_best_neighbour(const Iq2Grid& g, int code, const float* xval, const float* weight, float scale, const float* xg,
                       int8_t* L) {
    const uint16_t* list = g.neighbours_of(code);
    float best = FLT_MAX;
    int index = -1;
    for (int j = 1; j <= list[0]; ++j) {
        float d2 = 0.0f;
        for (int i = 0; i < 8; ++i) {
            const float q = xg[level_of(g.points[list[j]], i)];
            const float diff = scale * q - xval[i];
            d2 += weight[i] * diff * diff;
        }
        if (d2 < best) {
            best = d2;
            index = list[j];
        }
    }
    if (index < 0) throw std::logic_error("IQ1 quantizer: no grid neighbour");
    for (int i = 0; i < 8; ++i) L[i] = static_cast<int8_t>(level_of(g.points[index], i));
    return index;
}

// The values of a block in ascending order, stably (glibc's qsort, a merge sort, as llama.cpp).
void sort_order(const float* xb, int n, int* idx) {
    for (int j = 0; j < n; ++j) idx[j] = j;
    std::stable_sort(idx, idx + n, [xb](int a, int b) { return xb[a] < xb[b]; });
}

}  // namespace

void quantize_row_iq1_s(const float* x, void* dst, int64_t n, const float* weights) {
    if (!weights) throw std::invalid_argument("IQ1_S needs an importance matrix");
    constexpr int kBlock = 32;
    const Iq2Grid& g = iq1s_grid();
    auto* y = static_cast<BlockIQ1_S*>(dst);
    float scales[8], weight[kBlock], sumx[kBlock + 1], sumw[kBlock + 1];
    int8_t L[kBlock], shifts[8];
    int idx[kBlock];
    uint16_t index[4];
    for (int64_t ibl = 0; ibl < n / kQK; ++ibl) {
        y[ibl].d = fp32_to_fp16(0.0f);
        std::memset(y[ibl].qs, 0, sizeof y[ibl].qs);
        std::memset(y[ibl].qh, 0, sizeof y[ibl].qh);
        float max_scale = 0.0f;
        const float* xbl = x + kQK * ibl;
        const float sigma2 = sigma2_of(xbl);
        for (int ib = 0; ib < kQK / kBlock; ++ib) {
            const float* xb = xbl + kBlock * ib;
            const float* qw = weights + kQK * ibl + kBlock * ib;
            for (int i = 0; i < kBlock; ++i) weight[i] = qw[i] * std::sqrt(sigma2 + xb[i] * xb[i]);
            float max = std::fabs(xb[0]);
            for (int i = 1; i < kBlock; ++i) max = std::max(max, std::fabs(xb[i]));
            if (max < 1e-12f) {
                scales[ib] = 0.0f;
                shifts[ib] = 1;
                continue;
            }
            sort_order(xb, kBlock, idx);
            sumx[0] = sumw[0] = 0.0f;
            for (int j = 0; j < kBlock; ++j) {
                const int i = idx[j];
                sumx[j + 1] = sumx[j] + weight[i] * xb[i];
                sumw[j + 1] = sumw[j] + weight[i];
            }
            float best_score = -FLT_MAX, scale = max;
            int besti1 = -1, besti2 = -1, best_shift = 0;
            for (int i1 = 0; i1 <= kBlock; ++i1) {
                for (int i2 = i1; i2 <= kBlock; ++i2) {
                    for (int side = 0; side < 2; ++side) {
                        const float* v = side == 0 ? kXp : kXm;
                        const float sumqx = (sumx[i1] - sumx[0]) * v[0] + (sumx[i2] - sumx[i1]) * v[1] +
                                            (sumx[kBlock] - sumx[i2]) * v[2];
                        const float sumq2 = (sumw[i1] - sumw[0]) * v[0] * v[0] + (sumw[i2] - sumw[i1]) * v[1] * v[1] +
                                            (sumw[kBlock] - sumw[i2]) * v[2] * v[2];
                        if (sumq2 > 0.0f && sumqx * sumqx > best_score * sumq2) {
                            scale = sumqx / sumq2;
                            best_score = scale * sumqx;
                            besti1 = i1;
                            besti2 = i2;
                            best_shift = side == 0 ? 1 : -1;
                        }
                    }
                }
            }
            if (besti1 < 0 || besti2 < 0 || best_shift == 0) {
                scales[ib] = 0.0f;
                shifts[ib] = 1;
                continue;
            }
            for (int j = 0; j < besti1; ++j) L[idx[j]] = 0;
            for (int j = besti1; j < besti2; ++j) L[idx[j]] = 1;
            for (int j = besti2; j < kBlock; ++j) L[idx[j]] = 2;
            if (scale < 0.0f) {
                for (int j = 0; j < kBlock; ++j) L[j] = static_cast<int8_t>(2 - L[j]);
                scale = -scale;
                best_shift = -best_shift;
            }
            bool all_on_grid = true;
            const float* xx = best_shift == 1 ? kXp : kXm;
            for (int k = 0; k < kBlock / 8; ++k) {
                const int u = Iq2Grid::code(L + 8 * k);
                int gi = g.index_of[u];
                if (gi < 0) {
                    all_on_grid = false;
                    gi = iq1_best_neighbour(g, u, xb + 8 * k, weight + 8 * k, scale, xx, L + 8 * k);
                }
                index[k] = static_cast<uint16_t>(gi);
            }
            if (!all_on_grid) {
                float sumqx = 0.0f, sumq2 = 0.0f;
                for (int k = 0; k < kBlock / 8; ++k) {
                    for (int j = 0; j < 8; ++j) {
                        const float w = weight[8 * k + j];
                        const float q = xx[level_of(g.points[index[k]], j)];
                        sumqx += w * q * xb[8 * k + j];
                        sumq2 += w * q * q;
                    }
                }
                if (sumqx > 0.0f && sumq2 > 0.0f) scale = sumqx / sumq2;
            }
            uint16_t h = 0;
            for (int k = 0; k < kBlock / 8; ++k) {
                y[ibl].qs[(kBlock / 8) * ib + k] = static_cast<uint8_t>(index[k] & 255);
                h = static_cast<uint16_t>(h | ((index[k] >> 8) << (3 * k)));
            }
            y[ibl].qh[ib] = h;
            scales[ib] = scale;
            shifts[ib] = static_cast<int8_t>(best_shift);
            max_scale = std::max(max_scale, scale);
        }
        if (max_scale == 0.0f) continue;
        const float d = max_scale / 15;
        y[ibl].d = fp32_to_fp16(d * 1.125f);
        const float id = 1 / d;
        for (int ib = 0; ib < kQK / kBlock; ++ib) {
            int l = std::max(0, std::min(7, nearest(0.5f * (id * scales[ib] - 1))));
            if (shifts[ib] == -1) l |= 8;
            y[ibl].qh[ib] = static_cast<uint16_t>(y[ibl].qh[ib] | (l << 12));
        }
    }
}

void quantize_row_iq1_m(const float* x, void* dst, int64_t n, const float* weights) {
    constexpr int kBlock = 16;
    constexpr uint8_t kMasks[4] = {0x00, 0x80, 0x08, 0x88};
    const Iq2Grid& g = iq1s_grid();
    auto* y = static_cast<BlockIQ1_M*>(dst);
    float scales[16], weight[kBlock];
    int8_t L[kBlock], shifts[16];
    int idx[kBlock];
    uint16_t index[2];
    // The values of sub-block group k (0: the first 8, 1: the second) for shift code `shift`.
    auto values = [](int shift, int k) { return k == 0 ? (shift < 2 ? kXp : kXm) : (shift % 2 == 0 ? kXp : kXm); };
    auto weigh = [&](const float* xb, const float* qw, float sigma2) {
        for (int i = 0; i < kBlock; ++i) weight[i] = qw ? qw[i] * std::sqrt(sigma2 + xb[i] * xb[i]) : xb[i] * xb[i];
    };
    for (int64_t ibl = 0; ibl < n / kQK; ++ibl) {
        std::memset(&y[ibl], 0, sizeof y[ibl]);
        float max_scale = 0.0f;
        const float* xbl = x + kQK * ibl;
        const float sigma2 = sigma2_of(xbl);
        for (int ib = 0; ib < kQK / kBlock; ++ib) {
            const float* xb = xbl + kBlock * ib;
            weigh(xb, weights ? weights + kQK * ibl + kBlock * ib : nullptr, sigma2);
            float max = std::fabs(xb[0]);
            for (int i = 1; i < kBlock; ++i) max = std::max(max, std::fabs(xb[i]));
            if (max < 1e-7f) {
                scales[ib] = 0.0f;
                shifts[ib] = 0;
                continue;
            }
            sort_order(xb, kBlock, idx);
            float best_score = -FLT_MAX, scale = max;
            int besti1 = -1, besti2 = -1, best_k = -1;
            {
                // Prefix sums per half (each half has its own shift); with v0 - v1 = v1 - v2 = -1 the
                // sums over the three groups of a split are T v2 - px[i1] - px[i2].
                float px[2][kBlock + 1], pw[2][kBlock + 1];
                px[0][0] = px[1][0] = pw[0][0] = pw[1][0] = 0.0f;
                for (int j = 0; j < kBlock; ++j) {
                    const int i = idx[j];
                    const int h = i < kBlock / 2 ? 0 : 1;
                    px[h][j + 1] = px[h][j] + weight[i] * xb[i];
                    px[1 - h][j + 1] = px[1 - h][j];
                    pw[h][j + 1] = pw[h][j] + weight[i];
                    pw[1 - h][j + 1] = pw[1 - h][j];
                }
                const float txs[2] = {px[0][kBlock], px[1][kBlock]};
                const float tws[2] = {pw[0][kBlock], pw[1][kBlock]};
                const float p2 = kXp[2], m2 = kXm[2];
                const float cp1 = kXp[0] * kXp[0] - kXp[1] * kXp[1];
                const float cp2 = kXp[1] * kXp[1] - kXp[2] * kXp[2];
                const float cm1 = kXm[0] * kXm[0] - kXm[1] * kXm[1];
                const float cm2 = kXm[1] * kXm[1] - kXm[2] * kXm[2];
                for (int i1 = 0; i1 <= kBlock; ++i1) {
                    for (int i2 = i1; i2 <= kBlock; ++i2) {
                        float qx_p[2], qx_m[2], q2_p[2], q2_m[2];
                        for (int h = 0; h < 2; ++h) {
                            const float sx = px[h][i1] + px[h][i2];
                            qx_p[h] = txs[h] * p2 - sx;
                            qx_m[h] = txs[h] * m2 - sx;
                            q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                            q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
                        }
                        const float sumqx[4] = {qx_p[0] + qx_p[1], qx_p[0] + qx_m[1], qx_m[0] + qx_p[1],
                                                qx_m[0] + qx_m[1]};
                        const float sumq2[4] = {q2_p[0] + q2_p[1], q2_p[0] + q2_m[1], q2_m[0] + q2_p[1],
                                                q2_m[0] + q2_m[1]};
                        for (int k = 0; k < 4; ++k) {
                            if (sumq2[k] > 0.0f && sumqx[k] * sumqx[k] > best_score * sumq2[k]) {
                                scale = sumqx[k] / sumq2[k];
                                best_score = scale * sumqx[k];
                                besti1 = i1;
                                besti2 = i2;
                                best_k = k;
                            }
                        }
                    }
                }
            }
            if (besti1 < 0 || besti2 < 0 || best_k < 0) {
                scales[ib] = 0.0f;
                shifts[ib] = 0;
                continue;
            }
            for (int j = 0; j < besti1; ++j) L[idx[j]] = 0;
            for (int j = besti1; j < besti2; ++j) L[idx[j]] = 1;
            for (int j = besti2; j < kBlock; ++j) L[idx[j]] = 2;
            if (scale < 0.0f) {
                for (int j = 0; j < kBlock; ++j) L[j] = static_cast<int8_t>(2 - L[j]);
                scale = -scale;
                best_k = 3 - best_k;
            }
            bool all_on_grid = true;
            for (int k = 0; k < 2; ++k) {
                const int u = Iq2Grid::code(L + 8 * k);
                int gi = g.index_of[u];
                if (gi < 0) {
                    all_on_grid = false;
                    gi = iq1_best_neighbour(g, u, xb + 8 * k, weight + 8 * k, scale, values(best_k, k), L + 8 * k);
                }
                index[k] = static_cast<uint16_t>(gi);
            }
            if (!all_on_grid) {
                float sumqx = 0.0f, sumq2 = 0.0f;
                for (int k = 0; k < 2; ++k) {
                    const float* xx = values(best_k, k);
                    for (int j = 0; j < 8; ++j) {
                        const float w = weight[8 * k + j];
                        const float q = xx[level_of(g.points[index[k]], j)];
                        sumqx += w * q * xb[8 * k + j];
                        sumq2 += w * q * q;
                    }
                }
                if (sumqx > 0.0f && sumq2 > 0.0f) scale = sumqx / sumq2;
            }
            y[ibl].qs[2 * ib] = static_cast<uint8_t>(index[0] & 255);
            y[ibl].qs[2 * ib + 1] = static_cast<uint8_t>(index[1] & 255);
            y[ibl].qh[ib] = static_cast<uint8_t>((index[0] >> 8) | ((index[1] >> 8) << 4));
            scales[ib] = scale;
            shifts[ib] = static_cast<int8_t>(best_k);
            max_scale = std::max(max_scale, scale);
        }
        if (max_scale == 0.0f) continue;
        uint16_t sc[4] = {};
        float d = max_scale / 15;
        const float id = 1 / d;
        float sumqx = 0.0f, sumq2 = 0.0f;
        for (int ib = 0; ib < kQK / kBlock; ++ib) {
            const int l = std::max(0, std::min(7, nearest(0.5f * (id * scales[ib] - 1))));
            sc[ib / 4] = static_cast<uint16_t>(sc[ib / 4] | (l << (3 * (ib % 4))));
            y[ibl].qh[ib] = static_cast<uint8_t>(y[ibl].qh[ib] | kMasks[shifts[ib]]);
            const float* xb = xbl + kBlock * ib;
            weigh(xb, weights ? weights + kQK * ibl + kBlock * ib : nullptr, sigma2);
            for (int k = 0; k < 2; ++k) {
                const float* xx = values(shifts[ib], k);
                const int gi = y[ibl].qs[2 * ib + k] + ((y[ibl].qh[ib] << (8 - 4 * k)) & 0x700);
                for (int j = 0; j < 8; ++j) {
                    const float w = weight[8 * k + j];
                    const float q = xx[level_of(g.points[gi], j)] * (2 * l + 1);
                    sumqx += w * q * xb[8 * k + j];
                    sumq2 += w * q * q;
                }
            }
        }
        if (sumq2 > 0.0f) d = sumqx / sumq2;
        const uint16_t s = fp32_to_fp16(d * 1.1125f);
        sc[0] = static_cast<uint16_t>(sc[0] | ((s & 0x000F) << 12));
        sc[1] = static_cast<uint16_t>(sc[1] | ((s & 0x00F0) << 8));
        sc[2] = static_cast<uint16_t>(sc[2] | ((s & 0x0F00) << 4));
        sc[3] = static_cast<uint16_t>(sc[3] | (s & 0xF000));
        std::memcpy(y[ibl].scales, sc, sizeof sc);
    }
}

void quantize_row_iq2_xxs(const float* x, void* dst, int64_t n, const float* weights) {
    if (!weights) throw std::invalid_argument("IQ2_XXS needs an importance matrix");
    const Iq2Grid& g = iq2xxs_grid();
    auto* y = static_cast<BlockIQ2_XXS*>(dst);
    float scales[8], weight[32], waux[32], xval[32];
    int8_t L[32], Laux[32];
    uint32_t q2[16];
    for (int64_t ibl = 0; ibl < n / kQK; ++ibl) {
        y[ibl].d = fp32_to_fp16(0.0f);
        std::memset(q2, 0, sizeof q2);
        float max_scale = 0.0f;
        const float* xbl = x + kQK * ibl;
        float sumx2 = 0.0f;
        for (int i = 0; i < kQK; ++i) sumx2 += xbl[i] * xbl[i];
        const float sigma2 = sumx2 / kQK;
        for (int ib = 0; ib < 8; ++ib) {
            const float* xb = xbl + 32 * ib;
            const float* qw = weights + kQK * ibl + 32 * ib;
            for (int i = 0; i < 32; ++i) weight[i] = qw[i] * std::sqrt(sigma2 + xb[i] * xb[i]);
            for (int i = 0; i < 32; ++i) waux[i] = std::sqrt(weight[i]);
            uint8_t block_signs[4];
            even_signs(xb, weight, 4, xval, block_signs);
            float max = xval[0];
            for (int i = 1; i < 32; ++i) max = std::max(max, xval[i]);
            if (max < 1e-15f) {
                scales[ib] = 0.0f;
                std::memset(L, 0, sizeof L);
                continue;
            }
            uint8_t Lp[32];
            float scale = fit::positive(32, 4, xval, Lp, weight);
            for (int i = 0; i < 32; ++i) L[i] = static_cast<int8_t>(Lp[i]);
            const float eff_max = scale * 3;
            if (eff_max <= 0.0f) {
                scales[ib] = 0.0f;
                std::memset(L, 0, sizeof L);
                continue;
            }
            float best = 0.0f;
            for (int t = -6; t <= 6; ++t) {
                const float id = (2 * 3 - 1 + t * 0.1f) / eff_max;
                iq2_trial(g, 4, xval, waux, id, Laux, nullptr);
                float sumqx;
                const float sumq2 = weighted_fit(32, weight, xval, Laux, &sumqx);
                if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
                    scale = sumqx / sumq2;
                    best = scale * sumqx;
                    std::copy(Laux, Laux + 32, L);
                }
            }
            if (scale > 0.0f) {
                const float id = 1 / scale;
                for (int k = 0; k < 4; ++k) {
                    int8_t l8[8];
                    for (int i = 0; i < 8; ++i)
                        l8[i] =
                            static_cast<int8_t>(std::max(0, std::min(2, nearest(0.5f * (id * xval[8 * k + i] - 1)))));
                    const int u = Iq2Grid::code(l8);
                    int index = g.index_of[u];
                    if (index < 0) index = best_neighbour(g, u, xval + 8 * k, waux + 8 * k, scale, L + 8 * k);
                    for (int i = 0; i < 8; ++i) L[8 * k + i] = static_cast<int8_t>(level_of(g.points[index], i));
                }
                float sumqx;
                const float sumq2 = weighted_fit(32, weight, xval, L, &sumqx);
                if (sumq2 > 0.0f) scale = sumqx / sumq2;
            }
            if (scale < 0.0f) {
                scale = -scale;
                for (uint8_t& s : block_signs) s = static_cast<uint8_t>(~s & 127);
            }
            for (int k = 0; k < 4; ++k) {
                const int index = g.index_of[Iq2Grid::code(L + 8 * k)];
                if (index < 0) throw std::logic_error("IQ2_XXS quantizer: a point off the grid");
                q2[2 * ib] |= static_cast<uint32_t>(index) << (8 * k);
                q2[2 * ib + 1] |= static_cast<uint32_t>(block_signs[k]) << (7 * k);
            }
            scales[ib] = scale;
            max_scale = std::max(max_scale, scale);
        }
        if (max_scale == 0.0f) {
            std::memset(y[ibl].qs, 0, sizeof y[ibl].qs);
            continue;
        }
        const float d = max_scale / 31;
        y[ibl].d = fp32_to_fp16(d);
        const float id = 1 / d;
        for (int ib = 0; ib < 8; ++ib) {
            const int l = std::max(0, std::min(15, nearest(0.5f * (id * scales[ib] - 1))));
            q2[2 * ib + 1] |= static_cast<uint32_t>(l) << 28;
        }
        std::memcpy(y[ibl].qs, q2, sizeof q2);
    }
}

void quantize_row_iq2_xs(const float* x, void* dst, int64_t n, const float* weights) {
    if (!weights) throw std::invalid_argument("IQ2_XS needs an importance matrix");
    const Iq2Grid& g = iq2xs_grid();
    auto* y = static_cast<BlockIQ2_XS*>(dst);
    float scales[16], weight[16], waux[16], xval[16];
    int8_t L[16];
    uint16_t q2[32];
    for (int64_t ibl = 0; ibl < n / kQK; ++ibl) {
        y[ibl].d = fp32_to_fp16(0.0f);
        std::memset(q2, 0, sizeof q2);
        std::memset(y[ibl].scales, 0, sizeof y[ibl].scales);
        float max_scale = 0.0f;
        const float* xbl = x + kQK * ibl;
        float sumx2 = 0.0f;
        for (int i = 0; i < kQK; ++i) sumx2 += xbl[i] * xbl[i];
        const float sigma2 = sumx2 / kQK;
        for (int ib = 0; ib < 16; ++ib) {
            const float* xb = xbl + 16 * ib;
            const float* qw = weights + kQK * ibl + 16 * ib;
            for (int i = 0; i < 16; ++i) weight[i] = qw[i] * std::sqrt(sigma2 + xb[i] * xb[i]);
            for (int i = 0; i < 16; ++i) waux[i] = std::sqrt(weight[i]);
            uint8_t block_signs[2];
            even_signs(xb, weight, 2, xval, block_signs);
            float max = xval[0];
            for (int i = 1; i < 16; ++i) max = std::max(max, xval[i]);
            std::memset(L, 0, sizeof L);
            if (max < 1e-15f) {
                scales[ib] = 0.0f;
                continue;
            }
            float scale = search_pair_of_groups(g, xval, weight, waux, max, L);
            if (scale < 0.0f) {
                scale = -scale;
                for (uint8_t& s : block_signs) s = static_cast<uint8_t>(~s & 127);
            }
            for (int k = 0; k < 2; ++k) {
                const int index = g.index_of[Iq2Grid::code(L + 8 * k)];
                if (index < 0) throw std::logic_error("IQ2_XS quantizer: a point off the grid");
                q2[2 * ib + k] = static_cast<uint16_t>(index | (block_signs[k] << 9));
            }
            scales[ib] = scale;
            max_scale = std::max(max_scale, scale);
        }
        if (max_scale == 0.0f) {
            std::memset(y[ibl].qs, 0, sizeof y[ibl].qs);
            continue;
        }
        const float d = max_scale / 31;
        y[ibl].d = fp32_to_fp16(d);
        const float id = 1 / d;
        for (int ib = 0; ib < 16; ++ib) {
            const int l = std::max(0, std::min(15, nearest(0.5f * (id * scales[ib] - 1))));
            y[ibl].scales[ib / 2] = static_cast<uint8_t>(ib % 2 == 0 ? l : y[ibl].scales[ib / 2] | (l << 4));
        }
        std::memcpy(y[ibl].qs, q2, sizeof q2);
    }
}

void quantize_row_iq2_s(const float* x, void* dst, int64_t n, const float* weights) {
    const Iq2Grid& g = iq2s_grid();
    auto* y = static_cast<BlockIQ2_S*>(dst);
    float scales[16], weight[16], waux[16], xval[16];
    int8_t L[16];
    for (int64_t ibl = 0; ibl < n / kQK; ++ibl) {
        std::memset(&y[ibl], 0, sizeof y[ibl]);
        const float* xbl = x + kQK * ibl;
        float max_scale = 0.0f;
        const float sigma2 = sigma2_of(xbl);
        for (int ib = 0; ib < 16; ++ib) {
            const float* xb = xbl + 16 * ib;
            const float* qw = weights ? weights + kQK * ibl + 16 * ib : nullptr;
            for (int i = 0; i < 16; ++i)
                weight[i] = qw ? qw[i] * std::sqrt(sigma2 + xb[i] * xb[i]) : 0.25f * sigma2 + xb[i] * xb[i];
            for (int i = 0; i < 16; ++i) waux[i] = std::sqrt(weight[i]);
            uint8_t block_signs[2];
            split_signs(xb, 2, xval, block_signs);
            float max = xval[0];
            for (int i = 1; i < 16; ++i) max = std::max(max, xval[i]);
            std::memset(L, 0, sizeof L);
            if (max < 1e-8f) {
                scales[ib] = 0.0f;
                continue;
            }
            float scale = search_pair_of_groups(g, xval, weight, waux, max, L);
            if (scale < 0.0f) {
                scale = -scale;
                for (uint8_t& s : block_signs) s = static_cast<uint8_t>(~s);
            }
            for (int k = 0; k < 2; ++k) {
                const int index = g.index_of[Iq2Grid::code(L + 8 * k)];
                if (index < 0) throw std::logic_error("IQ2_S quantizer: a point off the grid");
                const int i8 = 2 * ib + k;
                y[ibl].qs[i8] = static_cast<uint8_t>(index & 255);
                y[ibl].qh[i8 / 4] = static_cast<uint8_t>(y[ibl].qh[i8 / 4] | ((index >> 8) << (2 * (i8 % 4))));
                y[ibl].qs[kQK / 8 + i8] = block_signs[k];
            }
            scales[ib] = scale;
            max_scale = std::max(max_scale, scale);
        }
        if (max_scale == 0.0f) continue;
        const float d = max_scale / 31;
        y[ibl].d = fp32_to_fp16(d * 0.9875f);
        const float id = 1 / d;
        for (int ib = 0; ib < 16; ++ib) {
            const int l = std::max(0, std::min(15, nearest(0.5f * (id * scales[ib] - 1))));
            y[ibl].scales[ib / 2] = static_cast<uint8_t>(ib % 2 == 0 ? l : y[ibl].scales[ib / 2] | (l << 4));
        }
    }
}

void quantize_row_iq3_xxs(const float* x, void* dst, int64_t n, const float* weights) {
    const Iq3Grid& g = iq3xxs_grid();
    auto* y = static_cast<BlockIQ3_XXS*>(dst);
    float scales[8], weight[32], waux[32], xval[32];
    int8_t L[32];
    uint8_t q3[3 * kQK / 8];
    for (int64_t ibl = 0; ibl < n / kQK; ++ibl) {
        const float* xbl = x + kQK * ibl;
        y[ibl].d = fp32_to_fp16(0.0f);
        std::memset(q3, 0, sizeof q3);
        uint32_t signs_and_scales[8] = {};
        float max_scale = 0.0f;
        const float sigma2 = sigma2_of(xbl);
        for (int ib = 0; ib < 8; ++ib) {
            const float* xb = xbl + 32 * ib;
            weights_of(xb, weights ? weights + kQK * ibl + 32 * ib : nullptr, sigma2, weight, waux);
            uint8_t block_signs[4];
            even_signs(xb, weight, 4, xval, block_signs);
            float max = xval[0];
            for (int i = 1; i < 32; ++i) max = std::max(max, xval[i]);
            std::memset(L, 0, sizeof L);
            if (max < 1e-8f) {
                scales[ib] = 0.0f;
                continue;
            }
            float scale = search_sub_block(g, xval, weight, waux, max, 15, true, false, L);
            if (scale < 0.0f) {
                scale = -scale;
                for (uint8_t& s : block_signs) s = static_cast<uint8_t>(~s & 127);
            }
            for (int k = 0; k < 8; ++k) {
                const int index = g.index_of[Iq3Grid::code(L + 4 * k)];
                if (index < 0) throw std::logic_error("IQ3_XXS quantizer: a point off the grid");
                q3[8 * ib + k] = static_cast<uint8_t>(index);
            }
            signs_and_scales[ib] = block_signs[0] | (block_signs[1] << 7) | (block_signs[2] << 14) |
                                   (static_cast<uint32_t>(block_signs[3]) << 21);
            scales[ib] = scale;
            max_scale = std::max(max_scale, scale);
        }
        if (max_scale == 0.0f) {
            std::memset(y[ibl].qs, 0, sizeof y[ibl].qs);
            continue;
        }
        const float d = max_scale / 31;
        y[ibl].d = fp32_to_fp16(d * 1.0125f);
        const float id = 1 / d;
        for (int ib = 0; ib < 8; ++ib) {
            const int l = std::max(0, std::min(15, nearest(0.5f * (id * scales[ib] - 1))));
            signs_and_scales[ib] |= static_cast<uint32_t>(l) << 28;
        }
        std::memcpy(q3 + kQK / 4, signs_and_scales, sizeof signs_and_scales);
        std::memcpy(y[ibl].qs, q3, sizeof y[ibl].qs);
    }
}

void quantize_row_iq3_s(const float* x, void* dst, int64_t n, const float* weights) {
    const Iq3Grid& g = iq3s_grid();
    auto* y = static_cast<BlockIQ3_S*>(dst);
    float scales[8], weight[32], waux[32], xval[32];
    int8_t L[32];
    for (int64_t ibl = 0; ibl < n / kQK; ++ibl) {
        std::memset(&y[ibl], 0, sizeof y[ibl]);
        const float* xbl = x + kQK * ibl;
        // As llama.cpp: a sub-block of zeros does not advance where the next one's points and signs
        // are written (they land in its place; the zero sub-block's scale code stays 0).
        uint8_t* qs = y[ibl].qs;
        uint8_t* signs = y[ibl].signs;
        float max_scale = 0.0f;
        const float sigma2 = sigma2_of(xbl);
        for (int ib = 0; ib < 8; ++ib) {
            const float* xb = xbl + 32 * ib;
            weights_of(xb, weights ? weights + kQK * ibl + 32 * ib : nullptr, sigma2, weight, waux);
            uint8_t block_signs[4];
            split_signs(xb, 4, xval, block_signs);
            float max = xval[0];
            for (int i = 1; i < 32; ++i) max = std::max(max, xval[i]);
            std::memset(L, 0, sizeof L);
            if (max == 0.0f) {
                scales[ib] = 0.0f;
                continue;
            }
            float scale = search_sub_block(g, xval, weight, waux, max, 9, false, true, L);
            if (scale < 0.0f) {
                scale = -scale;
                for (uint8_t& s : block_signs) s = static_cast<uint8_t>(~s);
            }
            for (int k = 0; k < 8; ++k) {
                const int index = g.index_of[Iq3Grid::code(L + 4 * k)];
                if (index < 0) throw std::logic_error("IQ3_S quantizer: a point off the grid");
                qs[k] = static_cast<uint8_t>(index & 255);
                y[ibl].qh[(ib * 8 + k) / 8] |= static_cast<uint8_t>((index >> 8) << ((ib * 8 + k) % 8));
            }
            qs += 8;
            std::memcpy(signs, block_signs, 4);
            signs += 4;
            scales[ib] = scale;
            max_scale = std::max(max_scale, scale);
        }
        if (max_scale == 0.0f) continue;
        const float d = max_scale / 31;
        y[ibl].d = fp32_to_fp16(d * 1.033f);
        const float id = 1 / d;
        for (int ib = 0; ib < 8; ib += 2) {
            const int l1 = std::max(0, std::min(15, nearest(0.5f * (id * scales[ib] - 1))));
            const int l2 = std::max(0, std::min(15, nearest(0.5f * (id * scales[ib + 1] - 1))));
            y[ibl].scales[ib / 2] = static_cast<uint8_t>(l1 | (l2 << 4));
        }
    }
}

}  // namespace fitllm::quant::detail
