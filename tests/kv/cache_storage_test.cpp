// The KV cache's storage: the rows store() writes in each type, with and without the Hadamard
// rotation, the layout layer_view() describes, copy on write of the data, and the K shift.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "kv/cache.h"
#include "kv/cache_test_support.h"
#include "kv/hadamard.h"
#include "quant/blocks.h"
#include "quant/dequantize.h"
#include "quant/quantize.h"

namespace fitllm::kv {
namespace {

using quant::GgmlType;
using test::place_run;
using test::shapes;
using test::small_params;

std::vector<float> gaussian(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(n);
    for (float& v : x) v = dist(rng);
    return x;
}

// Gaussian heads where channel 3 of every head is an outlier (as in real K: a few channels
// dominate), the case where the rotation helps most.
std::vector<float> with_outliers(size_t n, int head_dim, uint32_t seed) {
    std::vector<float> x = gaussian(n, seed);
    for (size_t i = 3; i < n; i += static_cast<size_t>(head_dim)) x[i] = 25.0f * (x[i] >= 0 ? 1.0f : -1.0f);
    return x;
}

CacheParams typed(GgmlType type, bool rotate, int n_cells = 16) {
    CacheParams p = small_params(n_cells, 1, 4);
    p.type_k = type;
    p.type_v = type;
    p.rotate = rotate;
    return p;
}

// RMS of (read back - stored) over RMS of stored, K and V of every cell stored.
double relative_error(const KvCache& cache, int layer, const std::vector<int32_t>& cells, const std::vector<float>& k,
                      const std::vector<float>& v, size_t row) {
    double err = 0, ref = 0;
    std::vector<float> out(row);
    for (size_t i = 0; i < cells.size(); ++i) {
        for (int which = 0; which < 2; ++which) {
            const std::vector<float>& src = which == 0 ? k : v;
            if (which == 0) {
                cache.read_k(layer, cells[i], out.data());
            } else {
                cache.read_v(layer, cells[i], out.data());
            }
            for (size_t j = 0; j < row; ++j) {
                const double d = out[j] - src[i * row + j];
                err += d * d;
                ref += static_cast<double>(src[i * row + j]) * src[i * row + j];
            }
        }
    }
    return std::sqrt(err / ref);
}

struct Stored {
    std::vector<int32_t> cells;
    std::vector<float> k, v;
    size_t row;
};

// 8 tokens of K and V (2 heads of 64) stored in layer 1 of a 2-layer cache.
Stored store_tokens(KvCache& cache, bool outliers, uint32_t seed = 11) {
    const LayerShape shape{2, 64, 64};
    Stored s;
    s.row = static_cast<size_t>(shape.n_head_kv * shape.head_dim_k);
    s.cells = place_run(cache, 0, 0, 8);
    s.k = outliers ? with_outliers(8 * s.row, 64, seed) : gaussian(8 * s.row, seed);
    s.v = outliers ? with_outliers(8 * s.row, 64, seed + 1) : gaussian(8 * s.row, seed + 1);
    cache.store(1, s.cells, s.k.data(), s.v.data());
    return s;
}

TEST(KvCacheStorage, F16RoundsExactlyAsTheOldCache) {
    KvCache cache(shapes(2, 2, 64, 64), small_params(16));
    EXPECT_EQ(cache.params().type_k, GgmlType::F16);  // the default, as llama.cpp's
    EXPECT_FALSE(cache.rotated());
    Stored s = store_tokens(cache, true);
    // Values f16 cannot hold exactly, a tie, a subnormal and one past the range.
    s.k[0] = 0.1f;
    s.k[1] = 1.0f + 0x1p-11f;
    s.k[2] = 1e-6f;
    s.k[3] = 70000.0f;
    cache.store(1, s.cells, s.k.data(), s.v.data());
    std::vector<float> out(s.row);
    const KvCache::LayerView view = cache.layer_view(1);
    for (size_t i = 0; i < s.cells.size(); ++i) {
        cache.read_k(1, s.cells[i], out.data());
        const auto* raw =
            reinterpret_cast<const uint16_t*>(view.k + static_cast<size_t>(s.cells[i]) * view.k_row_bytes);
        for (size_t j = 0; j < s.row; ++j) {
            const float x = s.k[i * s.row + j];
            // The old kv::KvCache stored fp16_to_fp32(fp32_to_fp16(x)).
            ASSERT_EQ(std::bit_cast<uint32_t>(out[j]),
                      std::bit_cast<uint32_t>(quant::fp16_to_fp32(quant::fp32_to_fp16(x))))
                << "value " << x;
            ASSERT_EQ(raw[j], quant::fp32_to_fp16(x));
        }
        cache.read_v(1, s.cells[i], out.data());
        for (size_t j = 0; j < s.row; ++j) {
            ASSERT_EQ(out[j], quant::fp16_to_fp32(quant::fp32_to_fp16(s.v[i * s.row + j])));
        }
    }
}

TEST(KvCacheStorage, F32IsExactAndBf16RoundsToBf16) {
    KvCache f32(shapes(2, 2, 64, 64), typed(GgmlType::F32, true));
    EXPECT_FALSE(f32.rotated());  // never for float types
    const Stored s = store_tokens(f32, true);
    EXPECT_EQ(relative_error(f32, 1, s.cells, s.k, s.v, s.row), 0.0);

    KvCache bf16(shapes(2, 2, 64, 64), typed(GgmlType::BF16, true));
    const Stored b = store_tokens(bf16, true);
    std::vector<float> out(b.row);
    bf16.read_v(1, b.cells[5], out.data());
    for (size_t j = 0; j < b.row; ++j) {
        EXPECT_EQ(out[j], quant::bf16_to_fp32(quant::fp32_to_bf16(b.v[5 * b.row + j])));
    }
}

TEST(KvCacheStorage, LayerViewDescribesTheRows) {
    KvCache cache(shapes(2, 2, 64, 32), typed(GgmlType::Q8_0, false));
    const KvCache::LayerView view = cache.layer_view(1);
    EXPECT_EQ(view.type_k, GgmlType::Q8_0);
    EXPECT_EQ(view.n_head_kv, 2);
    EXPECT_EQ(view.head_dim_k, 64);
    EXPECT_EQ(view.head_dim_v, 32);
    EXPECT_EQ(view.k_head_bytes, 2 * 34u);
    EXPECT_EQ(view.k_row_bytes, 2 * 2 * 34u);
    EXPECT_EQ(view.v_head_bytes, 34u);
    EXPECT_EQ(view.v_row_bytes, 2 * 34u);
    EXPECT_FALSE(view.rotated);
    const auto cells = place_run(cache, 0, 0, 3);
    const std::vector<float> k = gaussian(3 * 128, 1), v = gaussian(3 * 64, 2);
    cache.store(1, cells, k.data(), v.data());
    // Cell c, head h: k + c * k_row_bytes + h * k_head_bytes, one row of the type.
    std::vector<float> head(64), expected(64);
    std::vector<std::byte> quantized(view.k_head_bytes);
    for (size_t i = 0; i < 3; ++i) {
        for (int h = 0; h < 2; ++h) {
            const std::byte* at = view.k + static_cast<size_t>(cells[i]) * view.k_row_bytes + h * view.k_head_bytes;
            quant::dequantize_row(GgmlType::Q8_0, at, head.data(), 64);
            quant::quantize_row(GgmlType::Q8_0, k.data() + i * 128 + h * 64, quantized.data(), 64);
            quant::dequantize_row(GgmlType::Q8_0, quantized.data(), expected.data(), 64);
            EXPECT_EQ(head, expected) << "cell " << cells[i] << ", head " << h;
        }
    }
    // The other layer is untouched (zeros).
    std::vector<float> other(128);
    cache.read_k(0, cells[0], other.data());
    for (float x : other) EXPECT_EQ(x, 0.0f);
}

TEST(KvCacheStorage, RotatedHeadsAreTheHadamardTransformOfTheInput) {
    KvCache cache(shapes(2, 2, 64, 64), typed(GgmlType::Q8_0, true));
    EXPECT_TRUE(cache.rotated());
    EXPECT_TRUE(cache.layer_view(0).rotated);
    const Stored s = store_tokens(cache, false);
    const KvCache::LayerView view = cache.layer_view(1);
    std::vector<float> head(64), rotated(64);
    for (int h = 0; h < 2; ++h) {
        quant::dequantize_row(GgmlType::Q8_0,
                              view.v + static_cast<size_t>(s.cells[2]) * view.v_row_bytes + h * view.v_head_bytes,
                              head.data(), 64);
        std::copy_n(s.v.data() + 2 * s.row + static_cast<size_t>(h) * 64, 64, rotated.begin());
        hadamard_transform(rotated.data(), 64);
        for (int j = 0; j < 64; ++j) EXPECT_NEAR(head[static_cast<size_t>(j)], rotated[static_cast<size_t>(j)], 0.03);
    }
}

TEST(KvCacheStorage, RotationNeedsQuantizedTypesAndPowerOfTwoHeads) {
    EXPECT_FALSE(KvCache(shapes(1, 2, 64, 64), typed(GgmlType::F16, true)).rotated());
    EXPECT_FALSE(KvCache(shapes(1, 2, 64, 64), typed(GgmlType::Q8_0, false)).rotated());
    EXPECT_FALSE(KvCache(shapes(1, 2, 96, 96), typed(GgmlType::Q8_0, true)).rotated());
    CacheParams mixed = typed(GgmlType::F16, true);
    mixed.type_k = GgmlType::Q4_0;  // either type quantized rotates both
    EXPECT_TRUE(KvCache(shapes(1, 2, 64, 64), mixed).rotated());
    // A head size that is not a power of two is stored unrotated and reads back right.
    KvCache odd(shapes(2, 1, 96, 96), typed(GgmlType::Q8_0, true));
    const auto cells = place_run(odd, 0, 0, 2);
    const std::vector<float> k = gaussian(2 * 96, 3), v = gaussian(2 * 96, 4);
    odd.store(1, cells, k.data(), v.data());
    EXPECT_LT(relative_error(odd, 1, cells, k, v, 96), 0.01);
}

// Quantized round trips: relative RMS error bounds per type (round to nearest, scales fitted to
// each block of 32), with and without rotation, on Gaussian data.
TEST(KvCacheStorage, QuantizedRoundTripsStayWithinBounds) {
    struct Case {
        GgmlType type;
        double bound;
    };
    const Case cases[] = {{GgmlType::Q8_0, 0.008}, {GgmlType::Q5_0, 0.06}, {GgmlType::Q5_1, 0.05},
                          {GgmlType::Q4_0, 0.12},  {GgmlType::Q4_1, 0.1},  {GgmlType::IQ4_NL, 0.11}};
    for (const Case& c : cases) {
        if (!quant::can_quantize(c.type)) continue;  // iq4_nl: being added to quant::
        for (bool rotate : {false, true}) {
            KvCache cache(shapes(2, 2, 64, 64), typed(c.type, rotate));
            EXPECT_EQ(cache.rotated(), rotate);
            const Stored s = store_tokens(cache, false);
            const double err = relative_error(cache, 1, s.cells, s.k, s.v, s.row);
            EXPECT_LT(err, c.bound) << quant::traits(c.type).name << (rotate ? " rotated" : "");
            EXPECT_GT(err, 0.0);
        }
    }
}

TEST(KvCacheStorage, RotationLowersTheErrorOnOutliers) {
    for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q8_0}) {
        KvCache plain(shapes(2, 2, 64, 64), typed(type, false));
        KvCache rotated(shapes(2, 2, 64, 64), typed(type, true));
        const Stored a = store_tokens(plain, true);
        const Stored b = store_tokens(rotated, true);
        const double err_plain = relative_error(plain, 1, a.cells, a.k, a.v, a.row);
        const double err_rotated = relative_error(rotated, 1, b.cells, b.k, b.v, b.row);
        EXPECT_LT(err_rotated, 0.7 * err_plain)
            << quant::traits(type).name << ": " << err_rotated << " vs " << err_plain;
    }
}

TEST(KvCacheStorage, CopyOnWriteCopiesEveryLayer) {
    CacheParams p = typed(GgmlType::Q4_0, true, 32);
    p.n_seq_max = 2;
    KvCache shared(shapes(2, 2, 64, 64), p);
    const auto cells = place_run(shared, 0, 0, 6);
    const std::vector<float> k = gaussian(6 * 128, 5), v = gaussian(6 * 128, 6);
    shared.store(0, cells, k.data(), v.data());
    shared.store(1, cells, v.data(), k.data());
    shared.seq_cp(0, 1, -1, -1);
    place_run(shared, 1, 6, 1);  // copies block 1 (cells 4, 5) to block 2 (cells 8, 9)
    ASSERT_EQ(shared.cell_pos(8), 4);
    std::vector<float> a(128), b(128);
    for (int layer = 0; layer < 2; ++layer) {
        for (int32_t c : {4, 5}) {
            shared.read_k(layer, c, a.data());
            shared.read_k(layer, c + 4, b.data());
            EXPECT_EQ(a, b) << "layer " << layer << ", cell " << c;
            shared.read_v(layer, c, a.data());
            shared.read_v(layer, c + 4, b.data());
            EXPECT_EQ(a, b) << "layer " << layer << ", cell " << c;
        }
    }
}

TEST(KvCacheStorage, StoreChecksLayerAndCells) {
    KvCache cache(shapes(2, 1, 32, 32), small_params(8));
    const std::vector<float> row(32);
    const std::vector<int32_t> bad_cell{8};
    const std::vector<int32_t> good_cell{0};
    EXPECT_THROW(cache.store(2, good_cell, row.data(), row.data()), std::out_of_range);
    EXPECT_THROW(cache.store(0, bad_cell, row.data(), row.data()), std::out_of_range);
    EXPECT_THROW(cache.layer_view(-1), std::out_of_range);
    std::vector<float> out(32);
    EXPECT_THROW(cache.read_k(0, -1, out.data()), std::out_of_range);
}

// A K shift re-rotates K by each cell's delta; here the "rotation" adds the delta to every value,
// so read_k shows what was applied.
void check_k_shift(GgmlType type, bool rotate, double tolerance) {
    CacheParams p = typed(type, rotate, 64);
    KvCache cache(shapes(2, 2, 64, 64), p);
    const auto cells = place_run(cache, 0, 0, 40);
    const std::vector<float> k = gaussian(40 * 128, 8), v = gaussian(40 * 128, 9);
    for (int layer = 0; layer < 2; ++layer) cache.store(layer, cells, k.data(), v.data());
    std::vector<float> before(40 * 128), v_before(40 * 128);
    for (size_t i = 0; i < 40; ++i) {
        cache.read_k(1, cells[i], before.data() + i * 128);
        cache.read_v(1, cells[i], v_before.data() + i * 128);
    }
    cache.seq_rm(0, 0, 2);        // cells 0, 1 go
    cache.seq_add(0, 2, 20, -2);  // cells 2..19 move by -2
    cache.seq_add(0, 20, -1, 3);  // cells 20..39 by +3
    ASSERT_TRUE(cache.has_k_shift());
    for (int layer = 0; layer < 2; ++layer) {
        int calls = 0, rows = 0;
        cache.apply_k_shift(layer, [&](float* k_rows, const int32_t* deltas, int n) {
            ++calls;
            rows += n;
            EXPECT_LE(n, 32);
            for (int i = 0; i < n; ++i) {
                for (int j = 0; j < 128; ++j) k_rows[i * 128 + j] += static_cast<float>(deltas[i]);
            }
        });
        EXPECT_EQ(rows, 38);
        EXPECT_EQ(calls, 2);
    }
    cache.clear_k_shift();
    EXPECT_FALSE(cache.has_k_shift());
    std::vector<float> out(128);
    for (size_t i = 2; i < 40; ++i) {
        const float delta = i < 20 ? -2.0f : 3.0f;
        cache.read_k(1, cells[i], out.data());
        double mean = 0;
        for (size_t j = 0; j < 128; ++j) {
            ASSERT_NEAR(out[j], before[i * 128 + j] + delta, tolerance) << "cell " << cells[i] << ", value " << j;
            mean += out[j] - before[i * 128 + j];
        }
        ASSERT_NEAR(mean / 128, delta, 0.02) << "cell " << cells[i];
        cache.read_v(1, cells[i], out.data());
        for (size_t j = 0; j < 128; ++j) ASSERT_EQ(out[j], v_before[i * 128 + j]);  // V never moves
    }
    // Nothing pending: a second pass calls nothing.
    cache.apply_k_shift(0, [](float*, const int32_t*, int) { FAIL() << "no shift is pending"; });
}

TEST(KvCacheStorage, KShiftReRotatesKOfShiftedCells) {
    check_k_shift(GgmlType::F32, false, 0.0);
    check_k_shift(GgmlType::F16, false, 0.01);
    check_k_shift(GgmlType::Q8_0, true, 0.3);  // the delta becomes one large rotated value per head
    check_k_shift(GgmlType::Q8_0, false, 0.1);
}

TEST(KvCacheStorage, BytesCountKAndV) {
    KvCache f16(shapes(3, 4, 64, 64), small_params(256));
    KvCache q8(shapes(3, 4, 64, 64), typed(GgmlType::Q8_0, true, 256));
    const size_t f16_kv = size_t{3} * 256 * 2 * 4 * 64 * 2;
    EXPECT_GE(f16.bytes(), f16_kv);
    EXPECT_LT(f16.bytes(), f16_kv + f16_kv / 10);
    const size_t q8_kv = size_t{3} * 256 * 2 * 4 * 2 * 34;
    EXPECT_GE(q8.bytes(), q8_kv);
    const size_t transform = KvCache::key_transform_bytes(shapes(3, 4, 64, 64), typed(GgmlType::Q8_0, true, 256));
    EXPECT_GT(transform, 0u);
    EXPECT_LT(q8.bytes(), q8_kv + q8_kv / 10 + transform);
}

}  // namespace
}  // namespace fitllm::kv
