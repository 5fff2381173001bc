// KeyTransform (kv/key_transform.h): the query-aware and diagonal shaping of quantized K, its
// closed-form averages over RoPE's rotations, and how the cache calibrates it (kv/cache.h).
#include "kv/key_transform.h"

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

#include "kv/cache.h"
#include "kv/cache_test_support.h"
#include "ops/rope.h"
#include "quant/dequantize.h"
#include "quant/quantize.h"

namespace fitllm::kv {
namespace {

using quant::GgmlType;

ops::RopeParams neox(int d) {
    ops::RopeParams p;
    p.mode = ops::RopeMode::Neox;
    p.n_dims = d;
    p.freq_base = 10000.0f;
    return p;
}

// Keys and queries shaped like Gemma 3's (in RoPE's unrotated frame: a large common key, dims of
// very different sizes, queries that look along a few directions), then turned by RoPE at
// positions first .. first + n - 1. Rows: [n, n_head * d].
struct Rows {
    std::vector<float> k, q;
    std::vector<int32_t> pos;
};
Rows gemma_like_rows(int n, int first, int d, int n_head_q, uint32_t seed) {
    std::mt19937 shape_rng(7);  // the same "model" for every call
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> common(static_cast<size_t>(d)), size(static_cast<size_t>(d)), look(static_cast<size_t>(4 * d));
    for (int i = 0; i < d; ++i) {
        common[static_cast<size_t>(i)] = 2.0f * g(shape_rng);
        size[static_cast<size_t>(i)] = i % 8 == 0 ? 3.0f : 0.4f + 0.1f * static_cast<float>(i % 5);
    }
    for (float& x : look) x = g(shape_rng);
    std::mt19937 rng(seed);
    Rows r;
    r.k.resize(static_cast<size_t>(n) * d);
    r.q.resize(static_cast<size_t>(n) * n_head_q * d);
    for (int t = 0; t < n; ++t) {
        r.pos.push_back(first + t);
        for (int i = 0; i < d; ++i) {
            r.k[static_cast<size_t>(t * d + i)] =
                common[static_cast<size_t>(i)] + size[static_cast<size_t>(i)] * g(rng);
        }
        for (int h = 0; h < n_head_q; ++h) {
            float a[4];
            for (float& x : a) x = g(rng);
            for (int i = 0; i < d; ++i) {
                float x = 0.2f * g(rng);
                for (int j = 0; j < 4; ++j) x += a[j] * look[static_cast<size_t>(j * d + i)];
                r.q[static_cast<size_t>((t * n_head_q + h) * d + i)] = x;
            }
        }
    }
    ops::rope(r.k.data(), r.pos.data(), n, 1, d, neox(d));
    ops::rope(r.q.data(), r.pos.data(), n, n_head_q, d, neox(d));
    return r;
}

KeySample sample_of(const Rows& r, int n_head_q, int d) {
    return KeySample{.k = r.k.data(),
                     .q = r.q.data(),
                     .pos = r.pos.data(),
                     .n_rows = static_cast<int64_t>(r.pos.size()),
                     .n_head_q = n_head_q,
                     .rope = ops::rope_frame(neox(d), d)};
}

// Rows of a row-major d x d matrix turned by ops::rope at position p: S -> S R(p)^T.
std::vector<double> rotate_rows(const std::vector<double>& s, int d, int32_t p, const ops::RopeParams& rope) {
    std::vector<float> rows(s.begin(), s.end());
    const std::vector<int32_t> pos(static_cast<size_t>(d), p);
    ops::rope(rows.data(), pos.data(), d, 1, d, rope);
    return {rows.begin(), rows.end()};
}

std::vector<double> transpose(const std::vector<double>& s, int d) {
    std::vector<double> t(s.size());
    for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) t[static_cast<size_t>(j * d + i)] = s[static_cast<size_t>(i * d + j)];
    return t;
}

TEST(KeyTransform, RotationMeansAreTheMeansOverEveryPosition) {
    // Normal (adjacent-pair) RoPE over 12 of 16 dims: pairs and unrotated dims, with freq factors.
    const int d = 16, positions = 37;
    const float factors[6] = {1.0f, 1.5f, 2.0f, 1.0f, 4.0f, 8.0f};
    ops::RopeParams rope{
        .mode = ops::RopeMode::Normal, .n_dims = 12, .freq_base = 500.0f, .freq_scale = 0.5f, .freq_factors = factors};
    std::mt19937 rng(1);
    std::normal_distribution<double> g;
    std::vector<double> x(static_cast<size_t>(d * d)), m(static_cast<size_t>(d));
    for (double& v : x) v = g(rng);
    for (double& v : m) v = g(rng);
    std::vector<double> s(static_cast<size_t>(d * d), 0.0);  // symmetric: X X^T
    for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j)
            for (int l = 0; l < d; ++l) s[static_cast<size_t>(i * d + j)] += x[i * d + l] * x[j * d + l];

    std::vector<double> want_s(s.size(), 0.0), want_m(m.size(), 0.0);
    for (int p = 0; p < positions; ++p) {
        const std::vector<double> rsr = rotate_rows(transpose(rotate_rows(s, d, p, rope), d), d, p, rope);
        for (size_t i = 0; i < s.size(); ++i) want_s[i] += rsr[i] / positions;
        std::vector<float> mv(m.begin(), m.end());
        ops::rope(mv.data(), &p, 1, 1, d, rope);
        for (int i = 0; i < d; ++i) want_m[static_cast<size_t>(i)] += mv[static_cast<size_t>(i)] / positions;
    }
    const RopeFrame frame = ops::rope_frame(rope, d);
    EXPECT_EQ(frame.theta.size(), 6u);
    const std::vector<double> got_s = rotation_mean_moment(s, d, frame, positions);
    const std::vector<double> got_m = rotation_mean(m, frame, positions);
    for (size_t i = 0; i < s.size(); ++i) EXPECT_NEAR(got_s[i], want_s[i], 1e-4) << "entry " << i;
    for (int i = 0; i < d; ++i) EXPECT_NEAR(got_m[static_cast<size_t>(i)], want_m[static_cast<size_t>(i)], 1e-5);
    // One position: nothing to average.
    const std::vector<double> one = rotation_mean_moment(s, d, frame, 1);
    for (size_t i = 0; i < s.size(); ++i) EXPECT_NEAR(one[i], s[i], 1e-12);
}

// Attention dots shape_query(q) with the stored values: that must be q . (decoded key - c).
TEST(KeyTransform, ShapedQueriesDotStoredKeysAsQueriesDotTheDecodedKeys) {
    const int d = 64, n_head_q = 2;
    const Rows cal = gemma_like_rows(48, 0, d, n_head_q, 1);
    KeyTransform t;
    t.calibrate(sample_of(cal, n_head_q, d), 1, d, 512);
    ASSERT_TRUE(t.query_aware());
    const Rows test = gemma_like_rows(16, 200, d, n_head_q, 2);
    for (GgmlType type :
         {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::IQ4_NL}) {
        std::vector<std::byte> row(*quant::row_bytes(type, d));
        std::vector<float> scratch(KeyTransform::kScratchRows * d), stored(d), back(d), shaped(d);
        for (int r = 0; r < 16; ++r) {
            t.encode(test.k.data() + r * d, 0, type, row.data(), scratch.data());
            quant::dequantize_row(type, row.data(), stored.data(), d);
            t.decode(row.data(), 0, type, back.data());
            const float* q = test.q.data() + r * n_head_q * d;
            t.shape_query(q, 0, shaped.data());
            double got = 0.0, want = 0.0, norm = 0.0;
            for (int i = 0; i < d; ++i) {
                got += static_cast<double>(shaped[i]) * stored[i];
                want += static_cast<double>(q[i]) * (back[i] - t.center()[i]);
                norm += std::fabs(static_cast<double>(q[i]) * back[i]);
            }
            EXPECT_NEAR(got, want, 1e-4 * norm) << quant::type_name(static_cast<uint32_t>(type)) << " row " << r;
        }
    }
}

// The error q . (k_read_back - k) of keys stored at positions after the calibrating rows.
double score_error(const KeyTransform& t, GgmlType type, const Rows& test, int n_head_q, int d) {
    std::vector<std::byte> row(*quant::row_bytes(type, d));
    std::vector<float> scratch(KeyTransform::kScratchRows * d), back(d), shaped(d);
    double err = 0.0, signal = 0.0;
    const int n = static_cast<int>(test.pos.size());
    for (int r = 0; r < n; ++r) {
        const float* k = test.k.data() + r * d;
        if (t.query_aware()) {
            t.encode(k, 0, type, row.data(), scratch.data());
            t.decode(row.data(), 0, type, back.data());
        } else {
            t.apply(k, 0, d, shaped.data());
            quant::quantize_row(type, shaped.data(), row.data(), d);
            quant::dequantize_row(type, row.data(), back.data(), d);
            t.undo(back.data(), 0, d);
        }
        for (int s = 0; s < n; ++s) {  // every query of the test rows
            for (int h = 0; h < n_head_q; ++h) {
                const float* q = test.q.data() + (s * n_head_q + h) * d;
                double e = 0.0, x = 0.0;
                for (int i = 0; i < d; ++i) {
                    e += static_cast<double>(q[i]) * (back[i] - k[i]);
                    x += static_cast<double>(q[i]) * (k[i] - t.center()[i]);
                }
                err += e * e;
                signal += x * x;
            }
        }
    }
    return err / signal;
}

TEST(KeyTransform, QueryAwareKeysLoseFarLessOfTheScoresThanDiagonalOnes) {
    const int d = 64, n_head_q = 2;
    const Rows cal = gemma_like_rows(64, 0, d, n_head_q, 3);
    KeyTransform qa, diagonal;
    qa.calibrate(sample_of(cal, n_head_q, d), 1, d, 1024);
    diagonal.calibrate_diagonal(cal.k.data(), 64, 1, d);
    ASSERT_TRUE(qa.query_aware());
    ASSERT_EQ(diagonal.kind(), KeyTransform::Kind::Diagonal);
    const Rows test = gemma_like_rows(64, 700, d, n_head_q, 4);  // positions the first rows never had
    const double e_qa = score_error(qa, GgmlType::Q4_0, test, n_head_q, d);
    const double e_diag = score_error(diagonal, GgmlType::Q4_0, test, n_head_q, d);
    std::cout << "[ key_transform ] q4_0 score error / score energy at positions 700..763: query-aware " << e_qa
              << ", diagonal " << e_diag << "\n";
    EXPECT_LT(e_qa, 0.5 * e_diag);
}

TEST(KeyTransform, AFitWithoutQueriesOrWithBadRowsFallsBackToTheDiagonalKind) {
    const int d = 32;
    const Rows cal = gemma_like_rows(16, 0, d, 1, 5);
    KeySample s = sample_of(cal, 1, d);
    s.q = nullptr;
    KeyTransform t;
    t.calibrate(s, 1, d, 64);
    EXPECT_EQ(t.kind(), KeyTransform::Kind::Diagonal);
    std::vector<float> bad = cal.k;
    bad[5] = std::nanf("");
    s = sample_of(cal, 1, d);
    s.k = bad.data();
    t.calibrate(s, 1, d, 64);
    EXPECT_EQ(t.kind(), KeyTransform::Kind::Diagonal);
}

// --- In the cache --------------------------------------------------------------------------------

CacheParams q4_params(int n_cells) {
    CacheParams p = test::small_params(n_cells);
    p.type_k = GgmlType::Q4_0;
    p.type_v = GgmlType::Q4_0;
    return p;
}

// Feeds rows [from, to) of `rows` to the cache as one batch: calibrate_keys, then store.
void feed(KvCache& cache, const Rows& rows, int from, int to, int n_head_q, int d, std::vector<int32_t>& cells) {
    const std::vector<int32_t> c = test::place_run(cache, 0, from, to - from);
    cells.insert(cells.end(), c.begin(), c.end());
    KeySample s = sample_of(rows, n_head_q, d);
    s.k += static_cast<ptrdiff_t>(from) * d;
    s.q += static_cast<ptrdiff_t>(from) * n_head_q * d;
    s.pos += from;
    s.n_rows = to - from;
    cache.calibrate_keys(0, s);
    cache.store(0, c, rows.k.data() + from * d, rows.k.data() + from * d);
}

TEST(KeyTransform, SmallFirstBatchesWaitForEightRowsAndEndUpAsOneBatchOfThemAll) {
    const int d = 64, n_head_q = 2;
    const Rows rows = gemma_like_rows(12, 0, d, n_head_q, 6);
    const std::vector<LayerShape> shape{LayerShape{1, d, d, n_head_q}};
    KvCache a(shape, q4_params(32)), b(shape, q4_params(32));
    std::vector<int32_t> cells_a, cells_b;
    feed(a, rows, 0, 3, n_head_q, d, cells_a);  // 3 rows: kept, stored unshaped
    EXPECT_TRUE(a.needs_key_calibration(0));
    EXPECT_EQ(a.layer_view(0).key, nullptr);
    feed(a, rows, 3, 6, n_head_q, d, cells_a);  // 6
    EXPECT_TRUE(a.needs_key_calibration(0));
    feed(a, rows, 6, 12, n_head_q, d, cells_a);  // 12: fitted from all of them, the first 6 stored again
    EXPECT_FALSE(a.needs_key_calibration(0));
    ASSERT_NE(a.layer_view(0).key, nullptr);
    feed(b, rows, 0, 12, n_head_q, d, cells_b);  // the same rows in one batch
    ASSERT_EQ(cells_a, cells_b);
    std::vector<float> ka(d), kb(d);
    for (int c : cells_a) {
        a.read_k(0, c, ka.data());
        b.read_k(0, c, kb.data());
        EXPECT_EQ(ka, kb) << "cell " << c;
    }
}

TEST(KeyTransform, ACellWrittenOverBeforeTheFitIsStoredAgainFromWhatItHolds) {
    const int d = 64, n_head_q = 2;
    const Rows rows = gemma_like_rows(10, 0, d, n_head_q, 7);
    KvCache cache({LayerShape{1, d, d, n_head_q}}, q4_params(32));
    std::vector<int32_t> cells;
    feed(cache, rows, 0, 2, n_head_q, d, cells);
    // Cell cells[0] gets another key before the fit, without calibrate_keys (kept rows: stale).
    const std::vector<float> other = gemma_like_rows(1, 0, d, n_head_q, 8).k;
    cache.store(0, std::vector<int32_t>{cells[0]}, other.data(), other.data());
    feed(cache, rows, 2, 10, n_head_q, d, cells);
    ASSERT_FALSE(cache.needs_key_calibration(0));
    std::vector<float> back(d);
    cache.read_k(0, cells[0], back.data());
    double to_other = 0.0, to_stale = 0.0;
    for (int i = 0; i < d; ++i) {
        to_other += std::pow(back[i] - other[i], 2);
        to_stale += std::pow(back[i] - rows.k[i], 2);
    }
    EXPECT_LT(to_other, 0.1 * to_stale);
}

TEST(KeyTransform, ExternalStorageFitsTheDiagonalKindFromItsFirstBatchOrNever) {
    const int d = 32;
    const Rows rows = gemma_like_rows(12, 0, d, 1, 9);
    CacheParams p = q4_params(32);
    p.external_storage = true;
    KvCache few({LayerShape{1, d, d}}, p), enough({LayerShape{1, d, d}}, p);
    few.calibrate_keys(0, KeySample{.k = rows.k.data(), .n_rows = KvCache::kMinKeyRows - 1});
    EXPECT_FALSE(few.needs_key_calibration(0));  // given up: K stays as it is
    EXPECT_EQ(few.layer_view(0).k_center, nullptr);
    enough.calibrate_keys(0, sample_of(rows, 1, d));
    EXPECT_NE(enough.layer_view(0).q_scale, nullptr);
    EXPECT_EQ(enough.layer_view(0).key, nullptr);
}

TEST(KeyTransform, ALimitedCacheFitsTheDiagonalKindEvenWithQueries) {
    const int d = 32;
    const Rows rows = gemma_like_rows(12, 0, d, 1, 10);
    KvCache cache({LayerShape{1, d, d}}, q4_params(32));
    cache.limit_key_transform();
    std::vector<int32_t> cells;
    feed(cache, rows, 0, 12, 1, d, cells);
    EXPECT_EQ(cache.layer_view(0).key, nullptr);
    EXPECT_NE(cache.layer_view(0).q_scale, nullptr);
}

// A transform rebuilt from another's numbers() (prepare_numbers, finish_numbers), as the prompt
// cache rebuilds one from its file.
KeyTransform copy_of(const KeyTransform& key) {
    KeyTransform copy;
    const std::vector<std::span<const float>> from = key.numbers();
    const std::vector<std::span<float>> to = copy.prepare_numbers(key.kind(), key.n_head_kv(), key.head_dim());
    EXPECT_EQ(from.size(), to.size());
    for (size_t i = 0; i < std::min(from.size(), to.size()); ++i) {
        EXPECT_EQ(from[i].size(), to[i].size());
        std::copy_n(from[i].begin(), std::min(from[i].size(), to[i].size()), to[i].begin());
    }
    copy.finish_numbers();
    return copy;
}

// A fitted transform's numbers() filled into a new transform (prepare_numbers) make it the same,
// and a cache given it (set_key_transform, as the prompt cache does from its file) stores the same
// bytes as the cache that fitted it, from its first batch on. Only before anything is stored, and
// only a transform of the layer's shape and of a kind the cache fits.
TEST(KeyTransform, ATransformsNumbersGiveAnotherCacheTheSameStoredKeys) {
    const int d = 64, n_head_q = 2;
    const Rows rows = gemma_like_rows(12, 0, d, n_head_q, 11);
    const std::vector<LayerShape> shape{LayerShape{1, d, d, n_head_q}};
    for (const GgmlType type : {GgmlType::Q4_0, GgmlType::Q8_0}) {
        SCOPED_TRACE(quant::traits(type).name);
        CacheParams p = q4_params(32);
        p.type_k = type;
        KvCache fitted(shape, p), given(shape, p);
        EXPECT_EQ(fitted.key_transform(0), nullptr);
        std::vector<int32_t> cells_a, cells_b;
        feed(fitted, rows, 0, 12, n_head_q, d, cells_a);
        const KeyTransform* key = fitted.key_transform(0);
        ASSERT_NE(key, nullptr);
        EXPECT_EQ(key->query_aware(), type == GgmlType::Q4_0);
        const KeyTransform copy = copy_of(*key);
        EXPECT_TRUE(given.accepts_key_transform(0, copy));
        given.set_key_transform(0, copy);
        EXPECT_FALSE(given.needs_key_calibration(0));
        EXPECT_THROW(given.set_key_transform(0, copy), std::logic_error);  // fitted already
        // The rows fed one at a time now (the fitting cache kept its first ones until the fit).
        for (int t = 0; t < 12; ++t) feed(given, rows, t, t + 1, n_head_q, d, cells_b);
        ASSERT_EQ(cells_a, cells_b);
        std::vector<std::byte> out_a(cells_a.size() * fitted.cell_bytes()), out_b(out_a.size());
        fitted.copy_rows_out(cells_a, out_a.data());
        given.copy_rows_out(cells_b, out_b.data());
        EXPECT_EQ(out_a, out_b);

        // Not one of another shape, nor the query-aware kind for 8-bit or limited keys.
        KvCache wide({LayerShape{2, d, d, n_head_q}}, p);
        EXPECT_FALSE(wide.accepts_key_transform(0, copy));
        EXPECT_THROW(wide.set_key_transform(0, copy), std::logic_error);
        if (type == GgmlType::Q4_0) {
            CacheParams q8 = p;
            q8.type_k = GgmlType::Q8_0;
            EXPECT_FALSE(KvCache(shape, q8).accepts_key_transform(0, copy));
            KvCache limited(shape, p);
            limited.limit_key_transform();
            EXPECT_FALSE(limited.accepts_key_transform(0, copy));
        }
        // Nor once the layer has stored keys.
        KvCache stored(shape, p);
        std::vector<int32_t> cells;
        feed(stored, rows, 0, 2, n_head_q, d, cells);
        EXPECT_THROW(stored.set_key_transform(0, copy), std::logic_error);
    }
}

// After a pass whose keys were no sample of real text (the scheduler's warm-up), the fitted
// transform is forgotten and the next keys fit it anew, as in a fresh cache; a transform given by
// set_key_transform() stays. Only on an empty cache.
TEST(KeyTransform, AForgottenFitIsFittedAgainFromTheNextKeys) {
    const int d = 64, n_head_q = 2;
    const Rows warm = gemma_like_rows(12, 0, d, n_head_q, 21), real = gemma_like_rows(12, 0, d, n_head_q, 22);
    const std::vector<LayerShape> shape{LayerShape{1, d, d, n_head_q}};
    for (const GgmlType type : {GgmlType::Q4_0, GgmlType::Q8_0}) {
        SCOPED_TRACE(quant::traits(type).name);
        CacheParams p = q4_params(32);
        p.type_k = type;
        KvCache warmed(shape, p), fresh(shape, p);
        std::vector<int32_t> cells_w, cells_f;
        feed(warmed, warm, 0, 12, n_head_q, d, cells_w);
        ASSERT_NE(warmed.key_transform(0), nullptr);
        EXPECT_THROW(warmed.forget_fitted_key_transforms(), std::logic_error);  // cells in use
        warmed.clear();
        warmed.forget_fitted_key_transforms();
        EXPECT_TRUE(warmed.needs_key_calibration(0));
        EXPECT_EQ(warmed.key_transform(0), nullptr);
        cells_w.clear();
        feed(warmed, real, 0, 12, n_head_q, d, cells_w);
        feed(fresh, real, 0, 12, n_head_q, d, cells_f);
        ASSERT_EQ(cells_w, cells_f);
        std::vector<std::byte> out_w(cells_w.size() * warmed.cell_bytes()), out_f(out_w.size());
        warmed.copy_rows_out(cells_w, out_w.data());
        fresh.copy_rows_out(cells_f, out_f.data());
        EXPECT_EQ(out_w, out_f);

        // A given transform is kept.
        KvCache given(shape, p);
        given.set_key_transform(0, copy_of(*fresh.key_transform(0)));
        given.forget_fitted_key_transforms();
        EXPECT_FALSE(given.needs_key_calibration(0));
    }
}

}  // namespace
}  // namespace fitllm::kv
