#pragma once
// KL divergence of a run's next-token distributions from a reference run's, as llama.cpp's
// `llama-perplexity --kl-divergence-base FILE [--kl-divergence]` measures it, to judge a quantized
// KV cache (or weights, or kernels) by more than its perplexity.
//
// llama.cpp stores every scored token's whole distribution (16 bits a vocabulary entry). With the
// demo model's 262144-token vocabulary that is 512 KiB a token, 1 GiB for 8 chunks of 512, so the
// base file keeps a summary instead (784 bytes a token): the K = 64 most probable tokens with
// their log-probabilities and the log of the mass outside them. The KL divergence is then taken
// between the two distributions coarsened to those K tokens plus one "rest" outcome:
//
//   KL(p||q) ~ sum_{i in top-K(p)} p_i (log p_i - log q_i) + p_rest (log p_rest - log q_rest)
//
// with q_rest = q's mass outside p's top K. Merging outcomes never increases a KL divergence (the
// log-sum inequality), so this is a lower bound of the exact value; the gap is exactly
// p_rest * KL(p's tail || q's tail), small when the top K holds most of the mass, as it does
// for next-token distributions.
//
//   KlBaseWriter base("f16.kld", header);             // writes f16.kld.tmp
//   base.add(index, logits_row, log_prob_of_target);  // each scored token, in any order
//   base.finish(mean_nll);                            // renames to f16.kld; not called: removed
//
//   KlBaseReader base = KlBaseReader::open("f16.kld");  // KlFileError: foreign or truncated
//   base.check(header_of_this_run);                     // KlFileError: what differs
//   KlComparison cmp(base);
//   cmp.add(index, logits_row, log_prob_of_target);
//   KlStats stats = cmp.stats();
//
// The file: a fixed header (kKlMagic, kKlVersion, the counts below, the hash of the evaluated
// tokens, the base's mean NLL), then n_scored records of K token ids (int32), their K log-probs
// (double), the log of the rest and the target's log-prob (double), in the scoring order
// (chunk by chunk, position by position), native little-endian.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/perplexity.h"
#include "fitllm/error.h"

namespace fitllm::engine {

// A KL base file that cannot be used: missing, foreign, truncated, or made for another model,
// context, chunk count or text. The message names the file and what differs.
class KlFileError : public Error {
public:
    using Error::Error;
};

inline constexpr int kKlTopK = 64;  // tokens kept per distribution (fewer when the vocabulary is smaller)
inline constexpr char kKlMagic[8] = {'F', 'I', 'T', 'L', 'L', 'M', 'K', 'L'};
inline constexpr uint32_t kKlVersion = 1;
inline constexpr double kKlMinProb = 1e-30;  // the rest's probability is clamped to it (log 0 is -inf)

// What a base file was made from; a comparison run must match it field for field (but mean_nll).
struct KlHeader {
    int32_t n_vocab = 0;
    int32_t n_ctx = 0;
    int32_t n_chunks = 0;
    int64_t n_scored = 0;
    int32_t top_k = 0;         // min(kKlTopK, n_vocab)
    uint64_t tokens_hash = 0;  // hash_tokens() of the evaluated chunks' tokens
    double mean_nll = 0.0;     // the base run's: PPL = exp(mean_nll)
};

// 64-bit FNV-1a of the token ids (as 4 little-endian bytes each).
uint64_t hash_tokens(std::span<const int32_t> tokens);

// The header of perplexity() over `tokens` with `params` on a model of n_vocab tokens: the chunks
// it evaluates, the tokens it scores and their hash (mean_nll 0: KlBaseWriter::finish() sets it).
KlHeader kl_header(int32_t n_vocab, std::span<const int32_t> tokens, const PerplexityParams& params);

// One distribution's summary: its top_k tokens, most probable first (ties: lower id first),
// their log-probabilities, the log of the mass outside them, and the scored target's log-prob.
struct TopKDistribution {
    std::vector<int32_t> ids;
    std::vector<double> log_probs;
    double log_rest = 0.0;
    double target_log_prob = 0.0;
};

// The top k of log softmax(logits), the exponentials summed in double as engine::log_prob does.
TopKDistribution summarize_distribution(std::span<const float> logits, int k);

// One token's comparison of q (full logits) with a stored p.
struct KlToken {
    double kl = 0.0;     // the estimate above (>= 0 up to rounding)
    int32_t q_top = -1;  // q's most probable token (ties: the lowest id)
};
KlToken kl_divergence(const TopKDistribution& p, std::span<const float> q_logits);

// Writes a base file at `path` through `path`.tmp, renamed into place by finish(): a run that
// fails (or a writer destroyed without finish()) leaves no file, not half of one.
class KlBaseWriter {
public:
    // Throws KlFileError when path.tmp cannot be created.
    KlBaseWriter(std::string path, const KlHeader& header);
    KlBaseWriter(const KlBaseWriter&) = delete;
    KlBaseWriter& operator=(const KlBaseWriter&) = delete;
    ~KlBaseWriter();

    // The scored token number `index` (0 .. n_scored - 1, in any order; each once).
    void add(int64_t index, std::span<const float> logits, double target_log_prob);
    // Stores the mean NLL in the header, checks every record was added, and renames into place.
    void finish(double mean_nll);
    const std::string& path() const { return path_; }

private:
    void write_at(uint64_t offset, const void* data, size_t size);

    std::string path_;
    std::string tmp_path_;
    KlHeader header_;
    int fd_ = -1;
    std::vector<bool> added_;
    std::vector<std::byte> record_;  // one record's bytes, reused
};

class KlBaseReader {
public:
    // Reads and validates the header (magic, version, sizes) and checks the file's size against
    // it. Throws KlFileError naming the file.
    static KlBaseReader open(const std::string& path);
    KlBaseReader(KlBaseReader&& other) noexcept;
    KlBaseReader& operator=(KlBaseReader&&) = delete;
    KlBaseReader(const KlBaseReader&) = delete;
    ~KlBaseReader();

    const KlHeader& header() const { return header_; }
    const std::string& path() const { return path_; }
    // Throws KlFileError naming the first field where `run` (this run's header; mean_nll
    // ignored) differs from the file's.
    void check(const KlHeader& run) const;
    // Record `index`; throws KlFileError on a read error or a record that cannot be a summary
    // (ids out of range or repeated, log-probs not finite).
    TopKDistribution read(int64_t index) const;

private:
    KlBaseReader(std::string path, int fd, const KlHeader& header);

    std::string path_;
    int fd_ = -1;
    KlHeader header_;
};

struct KlStats {
    int64_t n = 0;
    double mean_kl = 0.0;
    double mean_kl_error = 0.0;  // standard error of the mean
    double median_kl = 0.0;
    double p99_kl = 0.0;
    double max_kl = 0.0;
    double same_top = 0.0;  // fraction of tokens whose most probable token is the base's
    double same_top_error = 0.0;
    double base_ppl = 0.0;  // exp(the base's mean NLL)
    // Mean of (NLL here - NLL in the base) over the tokens: ln(PPL / PPL base), and its
    // standard error from the per-token differences (much smaller than either PPL's).
    double ln_ppl_ratio = 0.0;
    double ln_ppl_ratio_error = 0.0;
};

// Compares each scored token of a run with the base file's record of it.
class KlComparison {
public:
    explicit KlComparison(const KlBaseReader& base);
    void add(int64_t index, std::span<const float> logits, double target_log_prob);
    // Throws KlFileError unless every scored token was added. The same for any order of add().
    KlStats stats() const;

private:
    const KlBaseReader& base_;
    std::vector<double> kl_;        // per scored token, in file order
    std::vector<double> nll_diff_;  // NLL here - NLL in the base
    std::vector<uint8_t> same_top_;
    std::vector<bool> added_;
};

}  // namespace fitllm::engine
