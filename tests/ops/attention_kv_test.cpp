// Attention over the paged, quantized KV cache: against exact attention over the cache's own
// (dequantized) K/V for every type, fragmented caches and odd sizes, bit for bit against
// attention_f16 for f16, shared prefixes, windows, bounded scratch.
#include "ops/attention_kv.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv/cache.h"
#include "ops/attention_f16.h"
#include "ops/attention_f16_tiled.h"
#include "quant/cpu_features.h"
#include "quant/dequantize.h"
#include "quant/dot.h"

namespace fitllm::ops {
namespace {

using kv::KvCache;
using kv::Pos;
using kv::SeqId;
using quant::GgmlType;

// Gaussian rows; a token's K/V come from (content, pos) so that the same token can be written to
// different caches.
std::vector<float> gaussian(uint32_t seed, size_t n, float sigma = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, sigma);
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng);
    return x;
}

struct Shape {
    int n_head = 8, n_head_kv = 2, head_dim = 128;
    int kv_width() const { return n_head_kv * head_dim; }
};

// Writes tokens (seq[i], pos[i]) into the cache's layer 0 with K/V rows from `content[i]`. outlier > 0 adds
// it to K channel 5 of every head (what rotation is for).
void add_tokens(KvCache& cache, const Shape& s, const std::vector<SeqId>& seq, const std::vector<Pos>& pos,
                const std::vector<uint32_t>& content, float outlier = 0.0f) {
    std::vector<int32_t> cells(seq.size());
    cache.place(seq, pos, cells);
    std::vector<float> k, v;
    for (size_t i = 0; i < seq.size(); ++i) {
        const uint32_t seed = content[i] * 1000003u + static_cast<uint32_t>(pos[i]) * 2u;
        std::vector<float> kr = gaussian(seed, s.kv_width()), vr = gaussian(seed + 1, s.kv_width());
        if (outlier > 0) {
            for (int h = 0; h < s.n_head_kv; ++h) kr[h * s.head_dim + 5] += outlier;
        }
        k.insert(k.end(), kr.begin(), kr.end());
        v.insert(v.end(), vr.begin(), vr.end());
    }
    for (int layer = 0; layer < cache.n_layer(); ++layer) cache.store(layer, cells, k.data(), v.data());
}

// One sequence of n tokens from `content`, placed in batches of `batch`.
void add_sequence(KvCache& cache, const Shape& s, SeqId seq, Pos first, int n, uint32_t content, int batch = 64,
                  float outlier = 0.0f) {
    for (int i = 0; i < n; i += batch) {
        const int m = std::min(batch, n - i);
        std::vector<SeqId> seqs(m, seq);
        std::vector<Pos> pos(m);
        for (int j = 0; j < m; ++j) pos[j] = first + i + j;
        add_tokens(cache, s, seqs, pos, std::vector<uint32_t>(m, content), outlier);
    }
}

AttentionParams params_of(const Shape& s) {
    return AttentionParams{.n_head = s.n_head,
                           .n_head_kv = s.n_head_kv,
                           .head_dim = s.head_dim,
                           .scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim))};
}

// The cells token (seq, pos) sees, in attention_kv's visit order, through the cache's per-cell API.
std::vector<int32_t> visible_cells(const KvCache& cache, SeqId seq, Pos pos, int window) {
    std::vector<int32_t> cells;
    const int bs = cache.params().block_size;
    for (int32_t b : cache.seq_blocks(seq)) {
        for (int32_t c = b * bs; c < (b + 1) * bs && c < cache.capacity(); ++c) {
            if (!cache.cell_has_seq(c, seq)) continue;
            const Pos p = cache.cell_pos(c);
            if (p > pos || (window > 0 && static_cast<int64_t>(p) <= static_cast<int64_t>(pos) - window)) continue;
            cells.push_back(c);
        }
    }
    return cells;
}

// Exact attention in double over K/V as the cache gives them back (read_k / read_v: dequantized,
// un-rotated), or over `original` K/V rows when given (k_of / v_of by cell).
template <class KOf, class VOf>
std::vector<float> reference_with(const KvCache& cache, const std::vector<float>& q, const std::vector<Pos>& q_pos,
                                  const std::vector<SeqId>& q_seq, const AttentionParams& p, KOf k_of, VOf v_of) {
    const size_t n_tok = q_pos.size(), d = p.head_dim;
    const int group = p.n_head / p.n_head_kv;
    std::vector<float> out(n_tok * p.n_head * d, 0.0f);
    for (size_t t = 0; t < n_tok; ++t) {
        const std::vector<int32_t> cells = visible_cells(cache, q_seq[t], q_pos[t], p.sliding_window);
        if (cells.empty()) continue;
        std::vector<std::vector<float>> k, v;
        for (int32_t c : cells) {
            k.push_back(k_of(c));
            v.push_back(v_of(c));
        }
        for (int h = 0; h < p.n_head; ++h) {
            const size_t g = h / group;
            const float* qh = q.data() + (t * p.n_head + h) * d;
            std::vector<double> score(cells.size());
            double max = -INFINITY;
            for (size_t j = 0; j < cells.size(); ++j) {
                double s = 0;
                for (size_t i = 0; i < d; ++i) s += static_cast<double>(qh[i]) * k[j][g * d + i];
                s *= p.scale;
                if (p.softcap > 0) s = p.softcap * std::tanh(s / p.softcap);
                score[j] = s;
                max = std::max(max, s);
            }
            if (p.sinks) max = std::max(max, static_cast<double>(p.sinks[h]));  // gpt-oss's sink: no value
            double sum = p.sinks ? std::exp(p.sinks[h] - max) : 0.0;
            for (double& s : score) sum += s = std::exp(s - max);
            for (size_t i = 0; i < d; ++i) {
                double acc = 0;
                for (size_t j = 0; j < cells.size(); ++j) acc += score[j] * v[j][g * d + i];
                out[(t * p.n_head + h) * d + i] = static_cast<float>(acc / sum);
            }
        }
    }
    return out;
}

std::vector<float> reference(const KvCache& cache, const std::vector<float>& q, const std::vector<Pos>& q_pos,
                             const std::vector<SeqId>& q_seq, const AttentionParams& p) {
    const int width = cache.layer_view(0).n_head_kv * cache.layer_view(0).head_dim_k;
    auto read = [&](bool is_k) {
        return [&cache, width, is_k](int32_t c) {
            std::vector<float> row(width);
            if (is_k) {
                cache.read_k(0, c, row.data());
            } else {
                cache.read_v(0, c, row.data());
            }
            return row;
        };
    };
    return reference_with(cache, q, q_pos, q_seq, p, read(true), read(false));
}

std::vector<float> run(const KvCache& cache, const std::vector<float>& q, const std::vector<Pos>& q_pos,
                       const std::vector<SeqId>& q_seq, const AttentionParams& p, int n_threads = 2,
                       const quant::CpuFeatures& features = quant::host_cpu_features()) {
    std::vector<float> out(q.size(), std::numeric_limits<float>::quiet_NaN());
    ThreadPool pool(n_threads);
    Scratch scratch(features);
    attention_kv(q.data(), q_pos.data(), q_seq.data(), static_cast<int64_t>(q_pos.size()), cache, 0, p, out.data(),
                 pool, scratch);
    return out;
}

struct Errors {
    double max_abs = 0, rms_ref = 0, rms_diff = 0;
    double rel_rms() const { return rms_diff / rms_ref; }
};
Errors compare(const std::vector<float>& got, const std::vector<float>& want) {
    Errors e;
    for (size_t i = 0; i < got.size(); ++i) {
        const double diff = std::abs(static_cast<double>(got[i]) - want[i]);
        e.max_abs = std::max(e.max_abs, std::isnan(diff) ? INFINITY : diff);
        e.rms_diff += diff * diff;
        e.rms_ref += static_cast<double>(want[i]) * want[i];
    }
    e.rms_diff = std::sqrt(e.rms_diff / got.size());
    e.rms_ref = std::sqrt(e.rms_ref / got.size());
    return e;
}

bool has_kernels(GgmlType type) {
    return (quant::has_dot(type) || quant::can_dequantize(type)) && quant::can_dequantize(type);
}

// ---- Per type, against exact attention over the dequantized cache ---------------------------------

struct TypeCase {
    GgmlType type;
    bool rotate;
    double max_abs;  // bounds on |out - reference| (outputs have rms ~0.1-0.3)
    double rel_rms;
};

class AttentionKvTypes : public ::testing::TestWithParam<TypeCase> {};

// Two sequences whose blocks interleave, a prefill batch of one and a decode token of the other
// in one call: every query against exact softmax attention over what read_k / read_v return.
TEST_P(AttentionKvTypes, MatchesExactAttentionOverTheDequantizedCache) {
    const TypeCase tc = GetParam();
    if (!has_kernels(tc.type)) GTEST_SKIP() << "no kernels for this type yet";
    const Shape s;
    KvCache cache(
        {kv::LayerShape{s.n_head_kv, s.head_dim, s.head_dim}},
        kv::CacheParams{.n_cells = 512, .n_seq_max = 2, .type_k = tc.type, .type_v = tc.type, .rotate = tc.rotate});
    for (int round = 0; round < 5; ++round) {
        add_sequence(cache, s, 0, 60 * round, 60, 1, 24);
        add_sequence(cache, s, 1, 10 * round, 10, 2, 7);
    }
    // The batch: 5 new tokens of sequence 0, 1 of sequence 1, stored before attending as a model does.
    const std::vector<SeqId> q_seq = {0, 0, 0, 1, 0, 0};
    const std::vector<Pos> q_pos = {300, 301, 302, 50, 303, 304};
    add_tokens(cache, s, q_seq, q_pos, {1, 1, 1, 2, 1, 1});
    const std::vector<float> q = gaussian(77, q_pos.size() * s.n_head * s.head_dim, 1.5f);
    const AttentionParams p = params_of(s);
    const std::vector<float> want = reference(cache, q, q_pos, q_seq, p);
    const std::vector<float> got = run(cache, q, q_pos, q_seq, p);
    const Errors e = compare(got, want);
    std::cout << "[ attention_kv ] " << quant::type_name(static_cast<uint32_t>(tc.type))
              << (cache.rotated() ? " rotated" : "") << ": max |err| " << e.max_abs << ", rms err / rms " << e.rel_rms()
              << " (rms " << e.rms_ref << ")\n";
    EXPECT_EQ(cache.rotated(),
              tc.rotate && tc.type != GgmlType::F32 && tc.type != GgmlType::F16 && tc.type != GgmlType::BF16);
    EXPECT_LE(e.max_abs, tc.max_abs);
    EXPECT_LE(e.rel_rms(), tc.rel_rms);
    // Every ISA level gives the same within the bounds (the dots differ in rounding only).
    for (quant::Isa isa : {quant::Isa::Scalar, quant::Isa::Avx2}) {
        const Errors ei =
            compare(run(cache, q, q_pos, q_seq, p, 1, quant::limit_to(quant::host_cpu_features(), isa)), want);
        EXPECT_LE(ei.max_abs, tc.max_abs) << quant::isa_name(isa);
    }
}

// The error comes from q's rounding to the dot's activation format (f16 for f16 K, q8_0 / q8_1 for
// the quantized types, none for f32 / bf16) and, for f16, the f16 sums of V. Measured (outputs of
// rms 0.18): f32 / bf16 5e-7 max; f16 4e-3 max, 0.2% rms; quantized 1e-2 max, 0.7-0.8% rms. Bounds
// at 3-4x that.
INSTANTIATE_TEST_SUITE_P(
    AttentionKv, AttentionKvTypes,
    ::testing::Values(TypeCase{GgmlType::F32, false, 5e-6, 5e-6}, TypeCase{GgmlType::F16, false, 1.5e-2, 8e-3},
                      TypeCase{GgmlType::BF16, false, 5e-6, 5e-6}, TypeCase{GgmlType::Q8_0, false, 4e-2, 3e-2},
                      TypeCase{GgmlType::Q8_0, true, 4e-2, 3e-2}, TypeCase{GgmlType::Q4_0, false, 4e-2, 3e-2},
                      TypeCase{GgmlType::Q4_0, true, 4e-2, 3e-2}, TypeCase{GgmlType::Q4_1, false, 4e-2, 3e-2},
                      TypeCase{GgmlType::Q4_1, true, 4e-2, 3e-2}, TypeCase{GgmlType::Q5_0, false, 4e-2, 3e-2},
                      TypeCase{GgmlType::Q5_0, true, 4e-2, 3e-2}, TypeCase{GgmlType::Q5_1, false, 4e-2, 3e-2},
                      TypeCase{GgmlType::Q5_1, true, 4e-2, 3e-2}, TypeCase{GgmlType::IQ4_NL, false, 4e-2, 3e-2},
                      TypeCase{GgmlType::IQ4_NL, true, 4e-2, 3e-2}),
    [](const ::testing::TestParamInfo<TypeCase>& param_info) {
        return std::string(quant::type_name(static_cast<uint32_t>(param_info.param.type))) +
               (param_info.param.rotate ? "_rotated" : "_plain");
    });

// K and V of different types: each side takes its own path (q8_0 K scored in integers with f16 V
// summed in f32; f16 K scored in f32 with rotated q4_0 V).
TEST(AttentionKv, MixedKAndVTypes) {
    const Shape s{.n_head = 4, .n_head_kv = 2, .head_dim = 64};
    for (const auto& [type_k, type_v] : std::vector<std::pair<GgmlType, GgmlType>>{
             {GgmlType::Q8_0, GgmlType::F16}, {GgmlType::F16, GgmlType::Q4_0}, {GgmlType::BF16, GgmlType::Q8_0}}) {
        KvCache cache({kv::LayerShape{s.n_head_kv, s.head_dim, s.head_dim}},
                      kv::CacheParams{.n_cells = 256, .type_k = type_k, .type_v = type_v});
        add_sequence(cache, s, 0, 0, 150, 1, 40);
        const std::vector<Pos> q_pos = {20, 149};
        const std::vector<SeqId> q_seq = {0, 0};
        const std::vector<float> q = gaussian(6, q_pos.size() * s.n_head * s.head_dim, 1.5f);
        const AttentionParams p = params_of(s);
        const Errors e = compare(run(cache, q, q_pos, q_seq, p), reference(cache, q, q_pos, q_seq, p));
        EXPECT_LE(e.max_abs, 4e-2) << quant::type_name(static_cast<uint32_t>(type_k)) << " / "
                                   << quant::type_name(static_cast<uint32_t>(type_v));
    }
}

// ---- f16: attention_f16's bits ----------------------------------------------------------------------

// The cells a sequence's last token sees, gathered in visit order into attention_f16's float layout.
void gather(const KvCache& cache, const std::vector<int32_t>& cells, int width, std::vector<float>& k,
            std::vector<float>& v, std::vector<int32_t>& pos) {
    k.assign(cells.size() * width, 0.0f);
    v.assign(cells.size() * width, 0.0f);
    pos.clear();
    for (size_t j = 0; j < cells.size(); ++j) {
        cache.read_k(0, cells[j], k.data() + j * width);
        cache.read_v(0, cells[j], v.data() + j * width);
        pos.push_back(cache.cell_pos(cells[j]));
    }
}

TEST(AttentionKv, F16IsAttentionF16BitForBitOverTheSameCells) {
    for (const int head_dim : {128, 64, 96, 80}) {
        Shape s;
        s.head_dim = head_dim;
        s.n_head = 6;
        s.n_head_kv = 2;
        KvCache cache({kv::LayerShape{s.n_head_kv, head_dim, head_dim}},
                      kv::CacheParams{.n_cells = 1024, .n_seq_max = 3, .block_size = 16});
        // Fragmented: three sequences interleave their blocks, one loses a range in the middle.
        for (int round = 0; round < 6; ++round) {
            add_sequence(cache, s, 0, 50 * round, 50, 1, 50);
            add_sequence(cache, s, 1, 20 * round, 20, 2, 20);
            add_sequence(cache, s, 2, 9 * round, 9, 3, 9);
        }
        cache.seq_rm(0, 100, 130);
        // Prefill of sequence 0 (12 tokens, stored first), decode of 1 and 2, in one batch.
        std::vector<SeqId> q_seq(12, 0);
        std::vector<Pos> q_pos(12);
        for (int i = 0; i < 12; ++i) q_pos[i] = 300 + i;
        add_tokens(cache, s, q_seq, q_pos, std::vector<uint32_t>(12, 1));
        q_seq.insert(q_seq.begin() + 5, {1, 2});
        q_pos.insert(q_pos.begin() + 5, {119, 53});
        const std::vector<float> q = gaussian(9, q_pos.size() * s.n_head * head_dim, 2.0f);
        AttentionParams p = params_of(s);
        p.sliding_window = head_dim == 96 ? 40 : 0;

        // attention_f16 per sequence over the cells it sees, in the same order: its Best kernel for
        // the host's instruction set, its Avx2 one (ggml's AVX2 dot order) for AVX2.
        ThreadPool pool(2);
        Scratch scratch;
        const auto attention_f16_of = [&](AttentionF16Kernel kernel) {
            std::vector<float> want(q.size());
            for (SeqId seq = 0; seq < 3; ++seq) {
                std::vector<float> k, v, q_s;
                std::vector<int32_t> kv_pos, tok_pos, rows;
                const Pos last = *std::max_element(q_pos.begin(), q_pos.end());
                std::vector<int32_t> cells = visible_cells(cache, seq, last, 0);
                gather(cache, cells, s.kv_width(), k, v, kv_pos);
                for (size_t t = 0; t < q_pos.size(); ++t) {
                    if (q_seq[t] != seq) continue;
                    rows.push_back(static_cast<int32_t>(t));
                    tok_pos.push_back(q_pos[t]);
                    q_s.insert(q_s.end(), q.begin() + t * s.n_head * head_dim,
                               q.begin() + (t + 1) * s.n_head * head_dim);
                }
                std::vector<float> out_s(q_s.size());
                attention_f16(q_s.data(), tok_pos.data(), static_cast<int64_t>(rows.size()), k.data(), v.data(),
                              kv_pos.data(), static_cast<int64_t>(kv_pos.size()), p, out_s.data(), pool, scratch,
                              kernel);
                for (size_t i = 0; i < rows.size(); ++i) {
                    std::copy(out_s.begin() + i * s.n_head * head_dim, out_s.begin() + (i + 1) * s.n_head * head_dim,
                              want.begin() + rows[i] * s.n_head * head_dim);
                }
            }
            return want;
        };
        const std::vector<float> want_best = attention_f16_of(AttentionF16Kernel::Best);
        const std::vector<float> want_avx2 = attention_f16_of(AttentionF16Kernel::Avx2);
        for (quant::Isa isa : {quant::Isa::Avx512Vnni, quant::Isa::Avx2}) {
            const std::vector<float>& want = isa == quant::Isa::Avx2 ? want_avx2 : want_best;
            for (int threads : {1, 2, 3}) {
                const std::vector<float> got =
                    run(cache, q, q_pos, q_seq, p, threads, quant::limit_to(quant::host_cpu_features(), isa));
                ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
                    << "head_dim " << head_dim << ", " << quant::isa_name(isa) << ", " << threads << " threads";
            }
        }
    }
}

// From 64 queries of a sequence in one call, f16 and f32 K/V take llama.cpp's tiled kernel
// (attention_f16_tiled) with tiles of 64 positions; a sequence with fewer queries in the same call
// keeps attention_f16's bits. The reference gets keys indexed by position (positions the sequence
// lacks are there but seen by no query), so its tiles of 64 keys are the positions' tiles. Every
// instruction set, several thread counts, a sequence whose first positions were removed.
TEST(AttentionKv, From64QueriesASequenceGetsTheTiledKernelsBits) {
    for (const GgmlType type : {GgmlType::F16, GgmlType::F32}) {
        for (const int head_dim : {128, 64, 80}) {
            Shape s;
            s.head_dim = head_dim;
            s.n_head = 8;
            s.n_head_kv = 2;
            KvCache cache(
                {kv::LayerShape{s.n_head_kv, head_dim, head_dim}},
                kv::CacheParams{.n_cells = 1024, .n_seq_max = 2, .block_size = 16, .type_k = type, .type_v = type});
            // Interleaved blocks: sequence 0's cells are not the cache's first ones.
            for (int round = 0; round < 4; ++round) {
                add_sequence(cache, s, 0, 30 * round, 30, 1, 30);
                add_sequence(cache, s, 1, 10 * round, 10, 2, 10);
            }
            if (head_dim == 64) cache.seq_rm(0, 0, 50);
            // A prompt of 70 tokens of sequence 0 and 5 of sequence 1, in one call.
            std::vector<SeqId> q_seq(70, 0);
            std::vector<Pos> q_pos(70);
            for (int i = 0; i < 70; ++i) q_pos[i] = 120 + i;
            add_tokens(cache, s, q_seq, q_pos, std::vector<uint32_t>(70, 1));
            std::vector<SeqId> seq1(5, 1);
            std::vector<Pos> pos1 = {40, 41, 42, 43, 44};
            add_tokens(cache, s, seq1, pos1, std::vector<uint32_t>(5, 2));
            q_seq.insert(q_seq.begin() + 20, seq1.begin(), seq1.end());
            q_pos.insert(q_pos.begin() + 20, pos1.begin(), pos1.end());
            const std::vector<float> q = gaussian(4, q_pos.size() * s.n_head * head_dim, 2.0f);
            const AttentionParams p = params_of(s);

            ThreadPool pool(2);
            Scratch scratch;
            std::vector<float> want(q.size(), 0.0f);
            for (SeqId seq = 0; seq < 2; ++seq) {
                std::vector<float> k, v, q_s;
                std::vector<int32_t> kv_pos, tok_pos, rows;
                const std::vector<int32_t> cells = visible_cells(cache, seq, 1000, 0);
                gather(cache, cells, s.kv_width(), k, v, kv_pos);
                for (size_t t = 0; t < q_pos.size(); ++t) {
                    if (q_seq[t] != seq) continue;
                    rows.push_back(static_cast<int32_t>(t));
                    tok_pos.push_back(q_pos[t]);
                    q_s.insert(q_s.end(), q.begin() + t * s.n_head * head_dim,
                               q.begin() + (t + 1) * s.n_head * head_dim);
                }
                std::vector<float> out_s(q_s.size());
                const auto n = static_cast<int64_t>(rows.size());
                if (seq == 0) {
                    // Key j at position j; a position the sequence lacks is after every query.
                    const int n_pos = *std::max_element(kv_pos.begin(), kv_pos.end()) + 1;
                    std::vector<float> k_at(static_cast<size_t>(n_pos) * s.kv_width(), 0.0f), v_at(k_at.size(), 0.0f);
                    std::vector<int32_t> pos_at(n_pos, 1 << 30);
                    for (size_t j = 0; j < kv_pos.size(); ++j) {
                        std::copy_n(k.begin() + j * s.kv_width(), s.kv_width(),
                                    k_at.begin() + kv_pos[j] * s.kv_width());
                        std::copy_n(v.begin() + j * s.kv_width(), s.kv_width(),
                                    v_at.begin() + kv_pos[j] * s.kv_width());
                        pos_at[kv_pos[j]] = kv_pos[j];
                    }
                    attention_f16_tiled(q_s.data(), tok_pos.data(), n, k_at.data(), v_at.data(), pos_at.data(), n_pos,
                                        p, out_s.data(), pool, scratch);
                } else if (type == GgmlType::F16) {
                    attention_f16(q_s.data(), tok_pos.data(), n, k.data(), v.data(), kv_pos.data(),
                                  static_cast<int64_t>(kv_pos.size()), p, out_s.data(), pool, scratch);
                } else {
                    continue;  // f32 below 64 queries: the f32 tiled kernel, checked against exact attention elsewhere
                }
                for (size_t i = 0; i < rows.size(); ++i) {
                    std::copy(out_s.begin() + i * s.n_head * head_dim, out_s.begin() + (i + 1) * s.n_head * head_dim,
                              want.begin() + rows[i] * s.n_head * head_dim);
                }
            }
            const size_t row = static_cast<size_t>(s.n_head) * head_dim;
            for (quant::Isa isa : {quant::Isa::Avx512Vnni, quant::Isa::Avx2, quant::Isa::Scalar}) {
                for (int threads : {1, 3}) {
                    const std::vector<float> got =
                        run(cache, q, q_pos, q_seq, p, threads, quant::limit_to(quant::host_cpu_features(), isa));
                    for (size_t t = 0; t < q_pos.size(); ++t) {
                        // Sequence 1's f16 bits follow the instruction set's dot order (attention_f16).
                        if (q_seq[t] == 1 && (type != GgmlType::F16 || isa != quant::Isa::Avx512Vnni)) continue;
                        ASSERT_EQ(0, std::memcmp(got.data() + t * row, want.data() + t * row, row * sizeof(float)))
                            << quant::type_name(static_cast<uint32_t>(type)) << ", head_dim " << head_dim << ", "
                            << quant::isa_name(isa) << ", " << threads << " threads, token " << t;
                    }
                }
            }
        }
    }
}

// ---- Every type, fragmented caches, odd sizes -----------------------------------------------------

// Three sequences whose blocks interleave, one with a hole, a prefill of 13 tokens and two decode
// tokens in one batch (so items of several sizes and partial tiles), head sizes that are not a
// multiple of the vector width, a sliding window: every type, on every instruction set and thread
// count, against exact attention over the dequantized cache. With AVX2 the scores and sums are f32
// over the exactly decoded rows (tiled kernel), so the bound is tight; without it q is quantized to
// the dot's format.
TEST(AttentionKv, EveryTypeMatchesExactAttentionInFragmentedCaches) {
    const std::vector<GgmlType> types = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16,
                                         GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1,
                                         GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::IQ4_NL};
    const bool tiled = quant::host_cpu_features().avx2 && quant::host_cpu_features().fma;
    for (const GgmlType type : types) {
        const bool block_type = type != GgmlType::F32 && type != GgmlType::F16 && type != GgmlType::BF16;
        for (const int head_dim : {128, 64, 96, 80, 40}) {
            if (block_type && head_dim % 32 != 0) continue;
            const Shape s{.n_head = 6, .n_head_kv = 2, .head_dim = head_dim};
            KvCache cache({kv::LayerShape{s.n_head_kv, head_dim, head_dim}}, kv::CacheParams{.n_cells = 1024,
                                                                                             .n_seq_max = 3,
                                                                                             .block_size = 16,
                                                                                             .type_k = type,
                                                                                             .type_v = type,
                                                                                             .rotate = head_dim == 64});
            for (int round = 0; round < 6; ++round) {
                add_sequence(cache, s, 0, 50 * round, 50, 1, 50);
                add_sequence(cache, s, 1, 20 * round, 20, 2, 20);
                add_sequence(cache, s, 2, 9 * round, 9, 3, 9);
            }
            cache.seq_rm(0, 100, 130);
            std::vector<SeqId> q_seq(13, 0);
            std::vector<Pos> q_pos(13);
            for (int i = 0; i < 13; ++i) q_pos[i] = 300 + i;
            add_tokens(cache, s, q_seq, q_pos, std::vector<uint32_t>(13, 1));
            q_seq.insert(q_seq.begin() + 5, {1, 2});
            q_pos.insert(q_pos.begin() + 5, {119, 53});
            const std::vector<float> q = gaussian(9, q_pos.size() * s.n_head * head_dim, 2.0f);
            AttentionParams p = params_of(s);
            p.sliding_window = head_dim == 96 ? 40 : 0;
            const std::vector<float> want = reference(cache, q, q_pos, q_seq, p);
            const std::string name =
                std::string(quant::type_name(static_cast<uint32_t>(type))) + " head_dim " + std::to_string(head_dim);
            for (quant::Isa isa : {quant::Isa::Avx512Vnni, quant::Isa::Avx2, quant::Isa::Scalar}) {
                const quant::CpuFeatures f = quant::limit_to(quant::host_cpu_features(), isa);
                const bool isa_tiled = tiled && isa != quant::Isa::Scalar;
                for (int threads : {1, 3}) {
                    const Errors e = compare(run(cache, q, q_pos, q_seq, p, threads, f), want);
                    // f16 K/V: llama.cpp's f16 flash-attention arithmetic (q and the V sums in f16).
                    const double bound = type == GgmlType::F16                                          ? 1.5e-2
                                         : isa_tiled || type == GgmlType::F32 || type == GgmlType::BF16 ? 2e-5
                                                                                                        : 4e-2;
                    EXPECT_LE(e.max_abs, bound)
                        << name << ", " << quant::isa_name(isa) << ", " << threads << " threads";
                }
            }
        }
    }
}

// ---- Sequences ----------------------------------------------------------------------------------------

// A prefix shared by seq_cp, then different continuations (copy on write of the last shared block):
// each sequence's tokens, attended in one mixed batch, give the same bits as the sequence alone in
// a cache of its own.
TEST(AttentionKv, SharedPrefixGivesWhatEachSequenceGivesAlone) {
    const Shape s{.n_head = 4, .n_head_kv = 2, .head_dim = 64};
    const int prefix = 40;
    const std::vector<int> extra = {7, 13, 21};
    for (const auto& [type, rotate] : std::vector<std::pair<GgmlType, bool>>{
             {GgmlType::F16, false}, {GgmlType::Q8_0, false}, {GgmlType::Q4_0, true}}) {
        kv::CacheParams cp{.n_cells = 512, .n_seq_max = 3, .type_k = type, .type_v = type, .rotate = rotate};
        KvCache shared({kv::LayerShape{s.n_head_kv, s.head_dim, s.head_dim}}, cp);
        add_sequence(shared, s, 0, 0, prefix, 100, 16);
        shared.seq_cp(0, 1, -1, -1);
        shared.seq_cp(0, 2, -1, -1);
        for (int round = 0; round < 3; ++round) {  // continuations interleaved
            for (SeqId seq = 0; seq < 3; ++seq) {
                const int n = extra[seq];
                add_sequence(shared, s, seq, prefix + round * n, n, seq, 5);
            }
        }
        std::vector<SeqId> q_seq;
        std::vector<Pos> q_pos;
        for (int i = 0; i < 2; ++i) {
            for (SeqId seq = 0; seq < 3; ++seq) {
                q_seq.push_back(seq);
                q_pos.push_back(prefix + 3 * extra[seq] + i);
            }
        }
        std::vector<uint32_t> content(q_seq.begin(), q_seq.end());
        add_tokens(shared, s, q_seq, q_pos, content);
        const std::vector<float> q = gaussian(5, q_pos.size() * s.n_head * s.head_dim, 2.0f);
        const AttentionParams p = params_of(s);
        const std::vector<float> got = run(shared, q, q_pos, q_seq, p);

        const size_t row = s.n_head * s.head_dim;
        for (SeqId seq = 0; seq < 3; ++seq) {
            cp.n_seq_max = 1;
            KvCache alone({kv::LayerShape{s.n_head_kv, s.head_dim, s.head_dim}}, cp);
            add_sequence(alone, s, 0, 0, prefix, 100, 16);
            add_sequence(alone, s, 0, prefix, 3 * extra[seq], seq, 9);
            const std::vector<Pos> pos = {q_pos[seq], q_pos[seq + 3]};
            add_tokens(alone, s, {0, 0}, pos, {static_cast<uint32_t>(seq), static_cast<uint32_t>(seq)});
            std::vector<float> q_alone(q.begin() + seq * row, q.begin() + (seq + 1) * row);
            q_alone.insert(q_alone.end(), q.begin() + (seq + 3) * row, q.begin() + (seq + 4) * row);
            const std::vector<float> want = run(alone, q_alone, pos, {0, 0}, p);
            EXPECT_EQ(0, std::memcmp(want.data(), got.data() + seq * row, row * sizeof(float)))
                << quant::type_name(static_cast<uint32_t>(type)) << " seq " << seq;
            EXPECT_EQ(0, std::memcmp(want.data() + row, got.data() + (seq + 3) * row, row * sizeof(float)))
                << quant::type_name(static_cast<uint32_t>(type)) << " seq " << seq;
        }
    }
}

TEST(AttentionKv, SlidingWindowAndSoftcap) {
    const Shape s{.n_head = 4, .n_head_kv = 1, .head_dim = 128};
    for (GgmlType type : {GgmlType::F16, GgmlType::Q8_0}) {
        KvCache cache({kv::LayerShape{s.n_head_kv, s.head_dim, s.head_dim}},
                      kv::CacheParams{.n_cells = 256, .type_k = type, .type_v = type});
        add_sequence(cache, s, 0, 0, 100, 1, 33);
        std::vector<Pos> q_pos;
        for (Pos pos = 85; pos < 100; pos += 2) q_pos.push_back(pos);
        const std::vector<SeqId> q_seq(q_pos.size(), 0);
        const std::vector<float> q = gaussian(3, q_pos.size() * s.n_head * s.head_dim, 3.0f);
        AttentionParams p = params_of(s);
        p.sliding_window = 7;
        p.softcap = 2.0f;
        const std::vector<float> want = reference(cache, q, q_pos, q_seq, p);
        const Errors e = compare(run(cache, q, q_pos, q_seq, p), want);
        std::cout << "[ attention_kv ] window 7, softcap 2, " << quant::type_name(static_cast<uint32_t>(type))
                  << ": max |err| " << e.max_abs << ", rms err / rms " << e.rel_rms() << "\n";
        EXPECT_LE(e.max_abs, type == GgmlType::F16 ? 2e-2 : 8e-2);
        // The window matters: without it the outputs differ.
        p.sliding_window = 0;
        EXPECT_GT(compare(run(cache, q, q_pos, q_seq, p), want).max_abs, 0.05);
    }
}

// gpt-oss's attention sinks (AttentionParams::sinks) in every kernel attention_kv takes: f16 (the
// blocked kernels, the one-query kernels without AVX2) and f32 K/V, one sequence of 70 queries (the
// tiled kernels) beside a decode token, and quantized types through the tiled (AVX2, AVX-512) and
// generic (scalar) kernels, centred K included; sinks above, near and below the scores. Against
// exact attention whose softmax denominator has exp(sink); ignoring the sinks would fail.
TEST(AttentionKv, SinksJoinTheSoftmaxOnEveryPathAndIsa) {
    const Shape s{.n_head = 8, .n_head_kv = 2, .head_dim = 64};
    std::vector<float> sinks = {6.0f, -4.0f, 0.5f, 2.0f, -1.0f, 12.0f, 0.0f, 1.5f};
    struct TypeTol {
        GgmlType type;
        bool rotate;
        double tol;
    };
    for (const TypeTol tt : {TypeTol{GgmlType::F16, false, 1e-2}, TypeTol{GgmlType::F32, false, 1e-4},
                             TypeTol{GgmlType::Q8_0, false, 4e-2}, TypeTol{GgmlType::Q8_0, true, 4e-2},
                             TypeTol{GgmlType::Q4_0, true, 1.5e-1}}) {
        KvCache cache({kv::LayerShape{s.n_head_kv, s.head_dim, s.head_dim}}, kv::CacheParams{.n_cells = 512,
                                                                                             .n_seq_max = 2,
                                                                                             .block_size = 16,
                                                                                             .type_k = tt.type,
                                                                                             .type_v = tt.type,
                                                                                             .rotate = tt.rotate});
        add_sequence(cache, s, 1, 0, 40, 2, 40);
        std::vector<SeqId> q_seq(70, 0);
        std::vector<Pos> q_pos(70);
        for (int i = 0; i < 70; ++i) q_pos[i] = i;
        add_tokens(cache, s, q_seq, q_pos, std::vector<uint32_t>(70, 1));
        q_seq.push_back(1);
        q_pos.push_back(39);
        const std::vector<float> q = gaussian(5, q_pos.size() * s.n_head * s.head_dim, 1.5f);
        AttentionParams p = params_of(s);
        p.sinks = sinks.data();
        const std::vector<float> want = reference(cache, q, q_pos, q_seq, p);
        AttentionParams no_sinks = p;
        no_sinks.sinks = nullptr;
        const std::vector<float> without = reference(cache, q, q_pos, q_seq, no_sinks);
        ASSERT_GT(compare(without, want).max_abs, 0.1) << "the sinks must matter in this test";
        for (quant::Isa isa : {quant::Isa::Scalar, quant::Isa::Avx2, quant::Isa::Avx512Vnni}) {
            const quant::CpuFeatures f = quant::limit_to(quant::host_cpu_features(), isa);
            const Errors e = compare(run(cache, q, q_pos, q_seq, p, 2, f), want);
            EXPECT_LE(e.max_abs, tt.tol) << quant::type_name(static_cast<uint32_t>(tt.type)) << ", "
                                         << quant::isa_name(isa);
        }
        // A kernel that ignored the sinks would be outside the tolerance.
        EXPECT_GT(compare(run(cache, q, q_pos, q_seq, no_sinks), want).max_abs, 2 * tt.tol)
            << quant::type_name(static_cast<uint32_t>(tt.type));
    }
}

TEST(AttentionKv, NothingVisibleGivesZeros) {
    const Shape s{.n_head = 4, .n_head_kv = 2, .head_dim = 64};
    for (GgmlType type : {GgmlType::F16, GgmlType::Q8_0, GgmlType::F32}) {
        KvCache cache({kv::LayerShape{s.n_head_kv, s.head_dim, s.head_dim}},
                      kv::CacheParams{.n_cells = 128, .n_seq_max = 3, .type_k = type, .type_v = type});
        add_sequence(cache, s, 0, 10, 20, 1);
        // Before every cell of sequence 0; sequence 2 has no cell; outside the window of sequence 0.
        const std::vector<SeqId> q_seq = {0, 2, 0};
        const std::vector<Pos> q_pos = {5, 100, 200};
        const std::vector<float> q = gaussian(1, q_pos.size() * s.n_head * s.head_dim);
        AttentionParams p = params_of(s);
        p.sliding_window = 50;
        for (float x : run(cache, q, q_pos, q_seq, p)) ASSERT_EQ(x, 0.0f);
        const std::vector<float> sinks = {3.0f, -2.0f, 0.0f, 1.0f};  // a sink alone carries no value
        p.sinks = sinks.data();
        for (float x : run(cache, q, q_pos, q_seq, p)) ASSERT_EQ(x, 0.0f);
    }
}

// Scratch is per thread O(tile + head_dim) plus O(n_tok): the same memory serves 1k and 16k cells.
TEST(AttentionKv, ScratchDoesNotGrowWithTheContext) {
    const Shape s{.n_head = 4, .n_head_kv = 1, .head_dim = 64};
    const AttentionParams p = params_of(s);
    EXPECT_LT(attention_kv_scratch_bytes(64, p, 2), size_t{160} * 1024);
    for (GgmlType type : {GgmlType::F16, GgmlType::Q8_0}) {
        KvCache cache({kv::LayerShape{s.n_head_kv, s.head_dim, s.head_dim}},
                      kv::CacheParams{.n_cells = 16384 + 64, .type_k = type, .type_v = type});
        ThreadPool pool(2);
        Scratch scratch;
        auto attend = [&](Pos first, int n_tok) {
            std::vector<Pos> pos(n_tok);
            for (int i = 0; i < n_tok; ++i) pos[i] = first + i;
            const std::vector<SeqId> seq(n_tok, 0);
            const std::vector<float> q = gaussian(2, n_tok * s.n_head * s.head_dim);
            std::vector<float> out(q.size());
            attention_kv(q.data(), pos.data(), seq.data(), n_tok, cache, 0, p, out.data(), pool, scratch);
            for (float x : out) ASSERT_TRUE(std::isfinite(x));
        };
        add_sequence(cache, s, 0, 0, 1024, 1, 512);
        attend(960, 64);
        attend(1023, 1);
        const std::byte* before = scratch.bytes(0);
        add_sequence(cache, s, 0, 1024, 16384 - 1024, 1, 512);
        attend(16384 - 64, 64);
        attend(16383, 1);
        EXPECT_EQ(scratch.bytes(0), before) << "the scratch buffer was reallocated: it grew with the context";
    }
}

// Outlier channels in K (as real models have) ruin a 4-bit block's scale; the Hadamard rotation
// spreads them over the head. Against attention over the original float K/V, rotated q4_0 is
// closer than plain q4_0.
TEST(AttentionKv, RotationHelpsQ4_0WithOutliers) {
    const Shape s{.n_head = 4, .n_head_kv = 1, .head_dim = 128};
    double err[2] = {};
    for (bool rotate : {false, true}) {
        KvCache cache(
            {kv::LayerShape{s.n_head_kv, s.head_dim, s.head_dim}},
            kv::CacheParams{.n_cells = 256, .type_k = GgmlType::Q4_0, .type_v = GgmlType::Q4_0, .rotate = rotate});
        add_sequence(cache, s, 0, 0, 200, 1, 64, 12.0f);
        const std::vector<Pos> q_pos = {150, 199};
        const std::vector<SeqId> q_seq = {0, 0};
        const std::vector<float> q = gaussian(4, q_pos.size() * s.n_head * s.head_dim, 2.0f);
        const AttentionParams p = params_of(s);
        // The original rows, regenerated as add_tokens made them.
        auto original = [&](bool is_k) {
            return [&cache, &s, is_k](int32_t c) {
                const uint32_t seed = 1u * 1000003u + static_cast<uint32_t>(cache.cell_pos(c)) * 2u;
                std::vector<float> row = gaussian(is_k ? seed : seed + 1, s.kv_width());
                if (is_k) row[5] += 12.0f;
                return row;
            };
        };
        const std::vector<float> want = reference_with(cache, q, q_pos, q_seq, p, original(true), original(false));
        err[rotate] = compare(run(cache, q, q_pos, q_seq, p), want).rel_rms();
    }
    std::cout << "[ attention_kv ] q4_0 with outliers, rms err / rms vs float K/V: plain " << err[0] << ", rotated "
              << err[1] << "\n";
    EXPECT_LT(err[1], err[0]);
}

TEST(AttentionKv, RejectsMismatchedShapesAndSequences) {
    const Shape s{.n_head = 4, .n_head_kv = 2, .head_dim = 64};
    KvCache cache({kv::LayerShape{s.n_head_kv, s.head_dim, s.head_dim}}, kv::CacheParams{.n_cells = 64});
    add_sequence(cache, s, 0, 0, 4, 1);
    std::vector<float> q(s.n_head * s.head_dim), out(q.size());
    const Pos pos = 3;
    ThreadPool pool(1);
    Scratch scratch;
    AttentionParams p = params_of(s);
    p.head_dim = 128;
    const SeqId seq = 0;
    EXPECT_THROW(attention_kv(q.data(), &pos, &seq, 1, cache, 0, p, out.data(), pool, scratch), std::invalid_argument);
    p = params_of(s);
    const SeqId bad = 1;
    EXPECT_THROW(attention_kv(q.data(), &pos, &bad, 1, cache, 0, p, out.data(), pool, scratch), std::invalid_argument);
    EXPECT_NO_THROW(attention_kv(q.data(), &pos, &seq, 1, cache, 0, p, out.data(), pool, scratch));
}

}  // namespace
}  // namespace fitllm::ops
