// The top-K KL estimate against the exact full-vocabulary KL, the base file's round trip and its
// refusals, and base-then-compare runs of perplexity() on a tiny generated model.
#include "engine/kl_divergence.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "engine/perplexity.h"
#include "gguf/gguf_reader.h"
#include "model/model.h"
#include "quant/ggml_type.h"
#include "test_support.h"

namespace fitllm {
namespace {

using engine::KlBaseReader;
using engine::KlBaseWriter;
using engine::KlFileError;
using engine::KlHeader;

bool has(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

std::vector<double> log_softmax(const std::vector<float>& logits) {
    double max = logits[0];
    for (const float v : logits) max = std::max(max, static_cast<double>(v));
    double sum = 0.0;
    for (const float v : logits) sum += std::exp(static_cast<double>(v) - max);
    std::vector<double> out;
    for (const float v : logits) out.push_back(static_cast<double>(v) - max - std::log(sum));
    return out;
}

// KL(p||q) over the whole vocabulary, and the part of it the top-K estimate leaves out:
// p_rest * KL(p's tail || q's tail), the tails being p and q renormalized outside p's top K.
struct ExactKl {
    double kl = 0.0;
    double tail_term = 0.0;
};
ExactKl exact_kl(const std::vector<float>& p_logits, const std::vector<float>& q_logits,
                 const std::vector<int32_t>& top) {
    const std::vector<double> lp = log_softmax(p_logits), lq = log_softmax(q_logits);
    std::vector<bool> in_top(p_logits.size(), false);
    for (const int32_t id : top) in_top[static_cast<size_t>(id)] = true;
    ExactKl r;
    double p_rest = 0.0, q_rest = 0.0, tail = 0.0;
    for (size_t j = 0; j < lp.size(); ++j) {
        r.kl += std::exp(lp[j]) * (lp[j] - lq[j]);
        if (in_top[j]) continue;
        p_rest += std::exp(lp[j]);
        q_rest += std::exp(lq[j]);
        tail += std::exp(lp[j]) * (lp[j] - lq[j]);
    }
    // sum_tail p_j log(p_j/q_j) = p_rest [KL(tails) + log(p_rest/q_rest)]
    r.tail_term = tail - p_rest * std::log(p_rest / q_rest);
    return r;
}

std::vector<float> random_logits(std::mt19937& rng, int n, float sigma, int n_peaked = 0, float peak = 0.0f) {
    std::normal_distribution<float> normal(0.0f, sigma);
    std::vector<float> v(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) v[static_cast<size_t>(j)] = normal(rng) + (j < n_peaked ? peak : 0.0f);
    std::shuffle(v.begin(), v.end(), rng);
    return v;
}

std::vector<float> perturbed(std::mt19937& rng, const std::vector<float>& logits, float sigma) {
    std::normal_distribution<float> normal(0.0f, sigma);
    std::vector<float> v = logits;
    for (float& x : v) x += normal(rng);
    return v;
}

TEST(KlDivergence, SummaryIsTheTopKOfTheLogSoftmax) {
    std::mt19937 rng(1);
    const std::vector<float> logits = random_logits(rng, 300, 2.0f);
    const engine::TopKDistribution d = engine::summarize_distribution(logits, 64);
    ASSERT_EQ(d.ids.size(), 64u);
    const std::vector<double> lp = log_softmax(logits);
    std::vector<double> sorted = lp;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    double top_mass = 0.0;
    for (size_t i = 0; i < 64; ++i) {
        // Bit for bit what log_prob() gives (the same float exponentials summed in the same order).
        EXPECT_EQ(d.log_probs[i], engine::log_prob(logits, d.ids[i])) << i;
        EXPECT_NEAR(d.log_probs[i], sorted[i], 1e-5) << i;
        top_mass += std::exp(lp[static_cast<size_t>(d.ids[i])]);
    }
    EXPECT_NEAR(std::exp(d.log_rest), 1.0 - top_mass, 1e-6);
}

TEST(KlDivergence, TiesGoToTheLowerIdAndASmallVocabularyKeepsEverything) {
    const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 0.5f, 3.0f};
    const engine::TopKDistribution two = engine::summarize_distribution(logits, 2);
    EXPECT_EQ(two.ids, (std::vector<int32_t>{1, 2}));
    const engine::TopKDistribution all = engine::summarize_distribution(logits, 64);
    EXPECT_EQ(all.ids, (std::vector<int32_t>{1, 2, 4, 0, 3}));
    EXPECT_EQ(all.log_rest, std::log(engine::kKlMinProb));  // nothing outside: clamped, not -inf
    EXPECT_EQ(engine::kl_divergence(all, logits).q_top, 1);
}

TEST(KlDivergence, ADistributionAgainstItselfIsExactlyZero) {
    std::mt19937 rng(2);
    for (int trial = 0; trial < 20; ++trial) {
        const std::vector<float> logits = random_logits(rng, 500, 3.0f);
        const engine::TopKDistribution p = engine::summarize_distribution(logits, 64);
        const engine::KlToken t = engine::kl_divergence(p, logits);
        EXPECT_EQ(t.kl, 0.0);
        EXPECT_EQ(t.q_top, p.ids[0]);
    }
}

// Merging outcomes never increases a KL divergence, so the estimate is at most the exact value,
// and it misses exactly p_rest * KL(tails), on flat distributions where the top K holds little.
TEST(KlDivergence, EstimateIsALowerBoundOfTheExactKl) {
    std::mt19937 rng(3);
    for (int trial = 0; trial < 200; ++trial) {
        const int n = 65 + trial;
        const int k = 1 + trial % 64;
        const std::vector<float> p_logits = random_logits(rng, n, 1.0f + 0.02f * static_cast<float>(trial % 50));
        const std::vector<float> q_logits = perturbed(rng, p_logits, 0.5f);
        const engine::TopKDistribution p = engine::summarize_distribution(p_logits, k);
        const double estimate = engine::kl_divergence(p, q_logits).kl;
        const ExactKl exact = exact_kl(p_logits, q_logits, p.ids);
        EXPECT_LE(estimate, exact.kl + 1e-12) << "trial " << trial;
        EXPECT_GE(estimate, -1e-12) << "trial " << trial;
        EXPECT_NEAR(exact.kl - estimate, exact.tail_term, 1e-6 + 1e-5 * exact.kl) << "trial " << trial;
    }
}

// Next-token distributions put most of their mass on a few tokens. With at most 1% of p outside
// its top 64 the estimate is within 2% of the exact KL: the gap p_rest * KL(tails) is about
// p_rest times the whole KL when q differs from p alike everywhere (measured: 1.4% at worst).
TEST(KlDivergence, EstimateIsCloseWhenTheTopKHoldsMostOfTheMass) {
    std::mt19937 rng(4);
    for (int trial = 0; trial < 50; ++trial) {
        const std::vector<float> p_logits = random_logits(rng, 2000, 1.0f, 20, 10.0f);
        const std::vector<float> q_logits = perturbed(rng, p_logits, 0.2f + 0.01f * static_cast<float>(trial));
        const engine::TopKDistribution p = engine::summarize_distribution(p_logits, engine::kKlTopK);
        ASSERT_LE(std::exp(p.log_rest), 0.01) << "trial " << trial;
        const double estimate = engine::kl_divergence(p, q_logits).kl;
        const double exact = exact_kl(p_logits, q_logits, p.ids).kl;
        EXPECT_LE(estimate, exact + 1e-12) << "trial " << trial;
        EXPECT_GE(estimate, 0.98 * exact) << "trial " << trial << ": exact " << exact;
    }
}

KlHeader small_header() {
    KlHeader h;
    h.n_vocab = 200;
    h.n_ctx = 16;
    h.n_chunks = 3;
    h.n_scored = 3 * engine::perplexity_scored_per_chunk(16);
    h.top_k = 64;
    h.tokens_hash = 0x1234abcd5678ef00ull;
    return h;
}

// A base file of small_header()'s shape with random rows; returns the rows.
std::vector<std::vector<float>> write_base(const std::filesystem::path& path, const KlHeader& h) {
    std::mt19937 rng(5);
    std::vector<std::vector<float>> rows;
    for (int64_t i = 0; i < h.n_scored; ++i) rows.push_back(random_logits(rng, h.n_vocab, 2.0f));
    KlBaseWriter w(path.string(), h);
    for (int64_t i = h.n_scored - 1; i >= 0; --i)
        w.add(i, rows[static_cast<size_t>(i)], -0.5 - 0.01 * static_cast<double>(i));
    w.finish(1.25);
    return rows;
}

std::string error_of(const std::function<void()>& f) {
    return test::thrown_message<KlFileError>(f);
}

TEST(KlDivergence, BaseFileRoundTrip) {
    const test::TempDir dir;
    const auto path = dir / "base.kld";
    const KlHeader h = small_header();
    const auto rows = write_base(path, h);
    EXPECT_FALSE(std::filesystem::exists(dir / "base.kld.tmp"));
    const KlBaseReader r = KlBaseReader::open(path.string());
    EXPECT_EQ(r.header().n_vocab, h.n_vocab);
    EXPECT_EQ(r.header().n_ctx, h.n_ctx);
    EXPECT_EQ(r.header().n_chunks, h.n_chunks);
    EXPECT_EQ(r.header().n_scored, h.n_scored);
    EXPECT_EQ(r.header().top_k, h.top_k);
    EXPECT_EQ(r.header().tokens_hash, h.tokens_hash);
    EXPECT_EQ(r.header().mean_nll, 1.25);
    r.check(h);
    for (int64_t i = 0; i < h.n_scored; ++i) {
        const engine::TopKDistribution want = engine::summarize_distribution(rows[static_cast<size_t>(i)], 64);
        const engine::TopKDistribution got = r.read(i);
        EXPECT_EQ(got.ids, want.ids) << i;
        EXPECT_EQ(got.log_probs, want.log_probs) << i;
        EXPECT_EQ(got.log_rest, want.log_rest) << i;
        EXPECT_EQ(got.target_log_prob, -0.5 - 0.01 * static_cast<double>(i)) << i;
    }
    EXPECT_EQ(std::filesystem::file_size(path), 56u + static_cast<uint64_t>(h.n_scored) * (64 * 12 + 16));
}

TEST(KlDivergence, AnUnfinishedBaseLeavesNoFile) {
    const test::TempDir dir;
    const auto path = dir / "base.kld";
    {
        KlBaseWriter w(path.string(), small_header());
        std::vector<float> row(200, 0.0f);
        w.add(0, row, -1.0);
        EXPECT_TRUE(std::filesystem::exists(dir / "base.kld.tmp"));
    }  // destroyed without finish(), as when the run throws
    EXPECT_FALSE(std::filesystem::exists(path));
    EXPECT_FALSE(std::filesystem::exists(dir / "base.kld.tmp"));
    EXPECT_TRUE(has(error_of([&] { KlBaseWriter((dir / "no/such/dir.kld").string(), small_header()); }),
                    "cannot create '" + (dir / "no/such/dir.kld.tmp").string() + "'"));
}

TEST(KlDivergence, ATruncatedBaseIsRefused) {
    const test::TempDir dir;
    const auto path = dir / "base.kld";
    write_base(path, small_header());
    const uint64_t size = std::filesystem::file_size(path);
    std::filesystem::resize_file(path, size - 1);
    std::string e = error_of([&] { KlBaseReader::open(path.string()); });
    EXPECT_TRUE(has(e, "KL base '" + path.string() + "'")) << e;
    EXPECT_TRUE(has(e,
                    "truncated: the header announces 21 scored tokens of 784 bytes (16520 bytes in all), the "
                    "file has 16519"))
        << e;
    std::filesystem::resize_file(path, 30);
    e = error_of([&] { KlBaseReader::open(path.string()); });
    EXPECT_TRUE(has(e, "truncated: 30 bytes, the header alone is 56")) << e;
    std::filesystem::resize_file(path, 0);
    e = error_of([&] { KlBaseReader::open(path.string()); });
    EXPECT_TRUE(has(e, "not a fitllm KL-divergence base file")) << e;
    e = error_of([&] { KlBaseReader::open((dir / "missing.kld").string()); });
    EXPECT_TRUE(has(e, "KL base '" + (dir / "missing.kld").string() + "': cannot open")) << e;
}

TEST(KlDivergence, AForeignOrCorruptBaseIsRefused) {
    const test::TempDir dir;
    const auto path = dir / "base.kld";
    const std::string text = "GGUF this is not a KL base file, it only has enough bytes to hold a header.......";
    test::write_file(path, std::as_bytes(std::span(text.data(), text.size())));
    std::string e = error_of([&] { KlBaseReader::open(path.string()); });
    EXPECT_TRUE(has(e, "KL base '" + path.string() + "': not a fitllm KL-divergence base file")) << e;

    // A record whose first token id is outside the vocabulary: found when it is read.
    write_base(path, small_header());
    std::vector<std::byte> bytes = test::read_file(path);
    const int32_t bad = 1000;
    std::memcpy(bytes.data() + 56 + 784 * 8, &bad, sizeof bad);
    test::write_file(path, bytes);
    const KlBaseReader r = KlBaseReader::open(path.string());
    e = error_of([&] { r.read(8); });
    EXPECT_TRUE(has(e, "record 8 (chunk 2, scored token 1) is corrupt: token id 1000 outside the vocabulary of 200"))
        << e;
    // Another version of the format.
    const uint32_t version = 7;
    std::memcpy(bytes.data() + 8, &version, sizeof version);
    test::write_file(path, bytes);
    e = error_of([&] { KlBaseReader::open(path.string()); });
    EXPECT_TRUE(has(e, "format version 7; this fitllm reads version 1")) << e;
}

TEST(KlDivergence, AMismatchedRunIsRefusedSayingWhatDiffers) {
    const test::TempDir dir;
    const auto path = dir / "base.kld";
    const KlHeader h = small_header();
    write_base(path, h);
    const KlBaseReader r = KlBaseReader::open(path.string());
    const std::string prefix = "KL base '" + path.string() + "' does not match this run: ";
    KlHeader run = h;
    run.n_vocab = 32000;
    EXPECT_EQ(error_of([&] { r.check(run); }), prefix + "made with a model of 200 tokens, this model has 32000");
    run = h;
    run.n_ctx = 32;
    EXPECT_EQ(error_of([&] { r.check(run); }), prefix + "made with n_ctx (-c) 16, this run has 32");
    run = h;
    run.n_chunks = 2;
    run.n_scored = 14;
    EXPECT_EQ(error_of([&] { r.check(run); }), prefix + "made over 3 chunks, this run evaluates 2 (--chunks)");
    run = h;
    run.tokens_hash = 1;
    EXPECT_EQ(error_of([&] { r.check(run); }), prefix +
                                                   "made from another text: its chunks' tokens hash to "
                                                   "1234abcd5678ef00, this run's to 0000000000000001");
}

// ---- base, then compare, on a model ------------------------------------------------------------

// A generated Llama (tests/model/data, tools/gen_test_models.py): head size 64, so its KV cache
// can be quantized, and a vocabulary of a few hundred tokens, more than the top 64.
std::filesystem::path tiny_llama() {
    return test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf";
}

struct KlRun {
    engine::PerplexityResult ppl;
    engine::KlStats kl;
};

class KlDivergenceRun : public ::testing::Test {
protected:
    void SetUp() override {
        if (!std::filesystem::exists(tiny_llama())) GTEST_SKIP() << "tiny model absent (tools/gen_test_models.py)";
        file_ = std::make_unique<gguf::GgufFile>(gguf::GgufFile::open(tiny_llama().string()));
        model_ = model::Model::load(*file_);
        for (int i = 0; i < 200; ++i) tokens_.push_back((i * 7 + 3) % model_->n_vocab());
        params_.n_ctx = 64;
        params_.n_chunks = 3;
        params_.bos = 1;
    }
    void write_base(const std::filesystem::path& path, const engine::PerplexityParams& p) {
        KlBaseWriter w(path.string(), engine::kl_header(model_->n_vocab(), tokens_, p));
        const auto r = engine::perplexity(*model_, tokens_, p, {}, pool_, nullptr, {},
                                          [&](int64_t i, std::span<const float> l, double lp) { w.add(i, l, lp); });
        w.finish(r.mean_nll);
    }
    KlRun compare(const std::filesystem::path& path, const engine::PerplexityParams& p, const ContextConfig& kv = {}) {
        const KlBaseReader base = KlBaseReader::open(path.string());
        base.check(engine::kl_header(model_->n_vocab(), tokens_, p));
        engine::KlComparison cmp(base);
        KlRun r;
        r.ppl = engine::perplexity(*model_, tokens_, p, kv, pool_, nullptr, {},
                                   [&](int64_t i, std::span<const float> l, double lp) { cmp.add(i, l, lp); });
        r.kl = cmp.stats();
        return r;
    }

    std::unique_ptr<gguf::GgufFile> file_;
    std::unique_ptr<model::Model> model_;
    ops::ThreadPool pool_{2};
    std::vector<int32_t> tokens_;
    engine::PerplexityParams params_;
    test::TempDir dir_;
};

TEST_F(KlDivergenceRun, TheSameSettingsGiveExactlyZero) {
    write_base(dir_ / "f16.kld", params_);
    const KlRun same = compare(dir_ / "f16.kld", params_);
    EXPECT_EQ(same.kl.n, 3 * 31);
    EXPECT_EQ(same.kl.mean_kl, 0.0);
    EXPECT_EQ(same.kl.max_kl, 0.0);
    EXPECT_EQ(same.kl.same_top, 1.0);
    EXPECT_EQ(same.kl.ln_ppl_ratio, 0.0);
    EXPECT_EQ(same.kl.base_ppl, same.ppl.ppl);
}

// -np: the chunks evaluated together write the same file and compare to the same numbers (with
// an unshaped q8_0 cache: a shaped one is calibrated on the first batch of keys, which holds
// every sequence's with -np, so its logits depend on -np).
TEST_F(KlDivergenceRun, ParallelChunksGiveTheSameNumbers) {
    write_base(dir_ / "one.kld", params_);
    engine::PerplexityParams par = params_;
    par.n_seq = 2;  // 3 chunks: a group of 2, then one
    write_base(dir_ / "par.kld", par);
    EXPECT_EQ(test::read_file(dir_ / "one.kld"), test::read_file(dir_ / "par.kld"));

    engine::PerplexityParams q8 = params_;
    const ContextConfig kv{.type_k = KvType::q8_0, .type_v = KvType::q8_0, .kv_rotation = false};
    const KlRun one = compare(dir_ / "one.kld", q8, kv);
    EXPECT_GT(one.kl.mean_kl, 0.0);
    q8.n_seq = 3;
    const KlRun all = compare(dir_ / "one.kld", q8, kv);
    EXPECT_EQ(all.ppl.ppl, one.ppl.ppl);
    EXPECT_EQ(all.kl.mean_kl, one.kl.mean_kl);
    EXPECT_EQ(all.kl.mean_kl_error, one.kl.mean_kl_error);
    EXPECT_EQ(all.kl.median_kl, one.kl.median_kl);
    EXPECT_EQ(all.kl.p99_kl, one.kl.p99_kl);
    EXPECT_EQ(all.kl.max_kl, one.kl.max_kl);
    EXPECT_EQ(all.kl.same_top, one.kl.same_top);
    EXPECT_EQ(all.kl.ln_ppl_ratio, one.kl.ln_ppl_ratio);
}

TEST_F(KlDivergenceRun, AQuantizedCacheGivesASmallPositiveKl) {
    write_base(dir_ / "f16.kld", params_);
    const KlRun r = compare(dir_ / "f16.kld", params_, {.type_k = KvType::q8_0, .type_v = KvType::q8_0});
    EXPECT_GT(r.kl.mean_kl, 0.0);
    EXPECT_LT(r.kl.mean_kl, 0.01);
    EXPECT_LE(r.kl.median_kl, r.kl.p99_kl);
    EXPECT_LE(r.kl.p99_kl, r.kl.max_kl);
    EXPECT_GT(r.kl.same_top, 0.9);
    EXPECT_NEAR(std::exp(r.kl.ln_ppl_ratio), r.ppl.ppl / r.kl.base_ppl, 1e-9);
}

TEST_F(KlDivergenceRun, AnotherTextOrChunkCountIsRefused) {
    write_base(dir_ / "f16.kld", params_);
    const KlBaseReader base = KlBaseReader::open((dir_ / "f16.kld").string());
    std::vector<int32_t> other = tokens_;
    other[100] = (other[100] + 1) % model_->n_vocab();
    EXPECT_TRUE(has(error_of([&] { base.check(engine::kl_header(model_->n_vocab(), other, params_)); }),
                    "made from another text"));
    other[100] = tokens_[100];
    other[195] = (other[195] + 1) % model_->n_vocab();  // after the 3 chunks: not evaluated, not hashed
    base.check(engine::kl_header(model_->n_vocab(), other, params_));
    engine::PerplexityParams two = params_;
    two.n_chunks = 2;
    EXPECT_TRUE(has(error_of([&] { base.check(engine::kl_header(model_->n_vocab(), tokens_, two)); }),
                    "made over 3 chunks, this run evaluates 2"));
}

}  // namespace
}  // namespace fitllm
