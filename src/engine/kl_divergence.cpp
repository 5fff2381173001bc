#include "engine/kl_divergence.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

namespace fitllm::engine {
namespace {

// Header: magic[8], version u32, top_k i32, n_vocab i32, n_ctx i32, n_chunks i32, reserved i32,
// n_scored i64, tokens_hash u64, mean_nll f64.
constexpr size_t kHeaderBytes = 56;

constexpr size_t record_bytes(int top_k) {
    return static_cast<size_t>(top_k) * (sizeof(int32_t) + sizeof(double)) + 2 * sizeof(double);
}

template <typename T>
void put(std::byte* at, size_t offset, T value) {
    std::memcpy(at + offset, &value, sizeof value);
}
template <typename T>
T get(const std::byte* at, size_t offset) {
    T value;
    std::memcpy(&value, at + offset, sizeof value);
    return value;
}

std::array<std::byte, kHeaderBytes> encode_header(const KlHeader& h) {
    std::array<std::byte, kHeaderBytes> b{};
    std::memcpy(b.data(), kKlMagic, sizeof kKlMagic);
    put<uint32_t>(b.data(), 8, kKlVersion);
    put<int32_t>(b.data(), 12, h.top_k);
    put<int32_t>(b.data(), 16, h.n_vocab);
    put<int32_t>(b.data(), 20, h.n_ctx);
    put<int32_t>(b.data(), 24, h.n_chunks);
    put<int32_t>(b.data(), 28, 0);
    put<int64_t>(b.data(), 32, h.n_scored);
    put<uint64_t>(b.data(), 40, h.tokens_hash);
    put<double>(b.data(), 48, h.mean_nll);
    return b;
}

std::string system_error(const std::string& what) {
    return what + ": " + std::strerror(errno);
}

// log softmax(logits) at `ids` into log_probs, and the log of the mass outside them (clamped to
// kKlMinProb). The exponentials are float, summed in double in vocabulary order, as log_prob()
// sums them, so a stored log-prob is bit for bit what log_prob() gives for that token, and the
// same logits and ids always give the same numbers (a run compared with itself: KL exactly 0).
void log_probs_at(std::span<const float> logits, float max, std::span<const int32_t> ids, std::span<double> log_probs,
                  double& log_rest) {
    std::array<int32_t, kKlTopK> sorted{};
    std::copy(ids.begin(), ids.end(), sorted.begin());
    std::sort(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(ids.size()));
    double total = 0.0;
    double rest = 0.0;  // summed apart, not 1 - sum(top k): no cancellation when the rest is tiny
    size_t next = 0;
    for (size_t j = 0; j < logits.size(); ++j) {
        const double e = static_cast<double>(std::exp(logits[j] - max));
        total += e;
        if (next < ids.size() && sorted[next] == static_cast<int32_t>(j)) {
            ++next;
        } else {
            rest += e;
        }
    }
    const double log_total = std::log(total);
    for (size_t i = 0; i < ids.size(); ++i) {
        log_probs[i] = static_cast<double>(logits[static_cast<size_t>(ids[i])] - max) - log_total;
    }
    log_rest = std::log(std::max(rest / total, kKlMinProb));
}

// How to read a record index for a person: chunk and scored token within it.
std::string record_name(const KlHeader& h, int64_t index) {
    const int64_t per_chunk = h.n_chunks > 0 ? h.n_scored / h.n_chunks : 1;
    return "record " + std::to_string(index) + " (chunk " + std::to_string(index / per_chunk + 1) + ", scored token " +
           std::to_string(index % per_chunk) + ")";
}

}  // namespace

uint64_t hash_tokens(std::span<const int32_t> tokens) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const int32_t t : tokens) {
        const auto u = static_cast<uint32_t>(t);
        for (int byte = 0; byte < 4; ++byte) {
            h ^= (u >> (8 * byte)) & 0xffu;
            h *= 0x100000001b3ull;
        }
    }
    return h;
}

KlHeader kl_header(int32_t n_vocab, std::span<const int32_t> tokens, const PerplexityParams& params) {
    KlHeader h;
    h.n_vocab = n_vocab;
    h.n_ctx = params.n_ctx;
    h.n_chunks = perplexity_chunks(static_cast<int64_t>(tokens.size()), params);
    h.n_scored = int64_t{h.n_chunks} * perplexity_scored_per_chunk(params.n_ctx);
    h.top_k = std::min(kKlTopK, n_vocab);
    h.tokens_hash = hash_tokens(tokens.first(static_cast<size_t>(h.n_chunks) * static_cast<size_t>(params.n_ctx)));
    return h;
}

TopKDistribution summarize_distribution(std::span<const float> logits, int k) {
    if (logits.empty()) throw std::invalid_argument("summarize_distribution: no logits");
    k = std::clamp(k, 1, static_cast<int>(std::min<size_t>(logits.size(), kKlTopK)));
    // The k best (higher logit, then lower id) in a heap whose front is the worst kept.
    using Entry = std::pair<float, int32_t>;
    const auto better = [](const Entry& a, const Entry& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    std::array<Entry, kKlTopK> heap;
    size_t n_heap = 0;
    float max = logits[0];
    for (size_t j = 0; j < logits.size(); ++j) {
        const Entry e{logits[j], static_cast<int32_t>(j)};
        max = std::max(max, e.first);
        if (n_heap < static_cast<size_t>(k)) {
            heap[n_heap++] = e;
            std::push_heap(heap.begin(), heap.begin() + static_cast<std::ptrdiff_t>(n_heap), better);
        } else if (better(e, heap[0])) {
            std::pop_heap(heap.begin(), heap.begin() + k, better);
            heap[static_cast<size_t>(k) - 1] = e;
            std::push_heap(heap.begin(), heap.begin() + k, better);
        }
    }
    std::sort(heap.begin(), heap.begin() + k, better);
    TopKDistribution d;
    d.ids.resize(static_cast<size_t>(k));
    d.log_probs.resize(static_cast<size_t>(k));
    for (int i = 0; i < k; ++i) d.ids[static_cast<size_t>(i)] = heap[static_cast<size_t>(i)].second;
    log_probs_at(logits, max, d.ids, d.log_probs, d.log_rest);
    return d;
}

KlToken kl_divergence(const TopKDistribution& p, std::span<const float> q_logits) {
    if (q_logits.empty() || p.ids.empty() || p.ids.size() > kKlTopK || p.log_probs.size() != p.ids.size()) {
        throw std::invalid_argument("kl_divergence: empty logits or a malformed summary");
    }
    for (const int32_t id : p.ids) {
        if (id < 0 || static_cast<size_t>(id) >= q_logits.size()) {
            throw std::invalid_argument("kl_divergence: token " + std::to_string(id) + " outside the " +
                                        std::to_string(q_logits.size()) + " logits");
        }
    }
    KlToken r;
    float max = q_logits[0];
    r.q_top = 0;
    for (size_t j = 1; j < q_logits.size(); ++j) {
        if (q_logits[j] > max) {
            max = q_logits[j];
            r.q_top = static_cast<int32_t>(j);
        }
    }
    std::array<double, kKlTopK> log_q{};
    double log_q_rest = 0.0;
    log_probs_at(q_logits, max, p.ids, std::span<double>(log_q.data(), p.ids.size()), log_q_rest);
    for (size_t i = 0; i < p.ids.size(); ++i) r.kl += std::exp(p.log_probs[i]) * (p.log_probs[i] - log_q[i]);
    r.kl += std::exp(p.log_rest) * (p.log_rest - log_q_rest);
    return r;
}

// ---- writing ----------------------------------------------------------------------------------

KlBaseWriter::KlBaseWriter(std::string path, const KlHeader& header)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp"), header_(header) {
    if (header_.top_k < 1 || header_.top_k > kKlTopK || header_.top_k > header_.n_vocab || header_.n_scored < 0) {
        throw std::invalid_argument("KlBaseWriter: top_k " + std::to_string(header_.top_k) + " for a vocabulary of " +
                                    std::to_string(header_.n_vocab) + ", n_scored " + std::to_string(header_.n_scored));
    }
    fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw KlFileError(system_error("KL base: cannot create '" + tmp_path_ + "'"));
    added_.assign(static_cast<size_t>(header_.n_scored), false);
    record_.resize(record_bytes(header_.top_k));
    header_.mean_nll = std::numeric_limits<double>::quiet_NaN();  // until finish(): an unfinished file reads as bad
    const auto h = encode_header(header_);
    write_at(0, h.data(), h.size());
}

KlBaseWriter::~KlBaseWriter() {
    if (fd_ >= 0) {
        ::close(fd_);
        ::unlink(tmp_path_.c_str());
    }
}

void KlBaseWriter::write_at(uint64_t offset, const void* data, size_t size) {
    const auto* p = static_cast<const char*>(data);
    while (size > 0) {
        const ssize_t n = ::pwrite(fd_, p, size, static_cast<off_t>(offset));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            throw KlFileError(system_error("KL base: writing '" + tmp_path_ + "' at byte " + std::to_string(offset)));
        p += n;
        offset += static_cast<uint64_t>(n);
        size -= static_cast<size_t>(n);
    }
}

void KlBaseWriter::add(int64_t index, std::span<const float> logits, double target_log_prob) {
    if (index < 0 || index >= header_.n_scored || static_cast<int64_t>(logits.size()) != header_.n_vocab) {
        throw std::invalid_argument("KlBaseWriter::add: token " + std::to_string(index) + " of " +
                                    std::to_string(header_.n_scored) + " with " + std::to_string(logits.size()) +
                                    " logits for a vocabulary of " + std::to_string(header_.n_vocab));
    }
    const TopKDistribution d = summarize_distribution(logits, header_.top_k);
    const size_t k = d.ids.size();
    std::memcpy(record_.data(), d.ids.data(), k * sizeof(int32_t));
    std::memcpy(record_.data() + k * sizeof(int32_t), d.log_probs.data(), k * sizeof(double));
    put<double>(record_.data(), k * (sizeof(int32_t) + sizeof(double)), d.log_rest);
    put<double>(record_.data(), k * (sizeof(int32_t) + sizeof(double)) + sizeof(double), target_log_prob);
    write_at(kHeaderBytes + static_cast<uint64_t>(index) * record_.size(), record_.data(), record_.size());
    added_[static_cast<size_t>(index)] = true;
}

void KlBaseWriter::finish(double mean_nll) {
    const auto missing = std::find(added_.begin(), added_.end(), false);
    if (missing != added_.end()) {
        throw std::logic_error("KlBaseWriter::finish: scored token " + std::to_string(missing - added_.begin()) +
                               " was never added");
    }
    header_.mean_nll = mean_nll;
    const auto h = encode_header(header_);
    write_at(0, h.data(), h.size());
    // On disk before the rename, so the name never points at a file whose data is still in flight.
    if (::fsync(fd_) != 0) throw KlFileError(system_error("KL base: writing '" + tmp_path_ + "'"));
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) {
        ::unlink(tmp_path_.c_str());
        throw KlFileError(system_error("KL base: writing '" + tmp_path_ + "'"));
    }
    if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
        const std::string msg = system_error("KL base: renaming '" + tmp_path_ + "' to '" + path_ + "'");
        ::unlink(tmp_path_.c_str());
        throw KlFileError(msg);
    }
}

// ---- reading ----------------------------------------------------------------------------------

KlBaseReader::KlBaseReader(std::string path, int fd, const KlHeader& header)
    : path_(std::move(path)), fd_(fd), header_(header) {}

KlBaseReader::KlBaseReader(KlBaseReader&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), header_(other.header_) {}

KlBaseReader::~KlBaseReader() {
    if (fd_ >= 0) ::close(fd_);
}

KlBaseReader KlBaseReader::open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw KlFileError(system_error("KL base '" + path + "': cannot open"));
    KlBaseReader reader(path, fd, KlHeader{});  // closes fd on a throw below
    const auto fail = [&](const std::string& what) { throw KlFileError("KL base '" + path + "': " + what); };
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw KlFileError(system_error("KL base '" + path + "': cannot stat"));
    const auto size = static_cast<uint64_t>(st.st_size);
    std::array<std::byte, kHeaderBytes> b{};
    const ssize_t got = ::pread(fd, b.data(), b.size(), 0);
    if (got < 0) throw KlFileError(system_error("KL base '" + path + "': cannot read"));
    const auto n_read = static_cast<size_t>(got);
    if (n_read < sizeof kKlMagic || std::memcmp(b.data(), kKlMagic, sizeof kKlMagic) != 0) {
        fail("not a fitllm KL-divergence base file (it does not start with \"FITLLMKL\")");
    }
    if (n_read < kHeaderBytes) {
        fail("truncated: " + std::to_string(size) + " bytes, the header alone is " + std::to_string(kHeaderBytes));
    }
    const auto version = get<uint32_t>(b.data(), 8);
    if (version != kKlVersion) {
        fail("format version " + std::to_string(version) + "; this fitllm reads version " + std::to_string(kKlVersion));
    }
    KlHeader& h = reader.header_;
    h.top_k = get<int32_t>(b.data(), 12);
    h.n_vocab = get<int32_t>(b.data(), 16);
    h.n_ctx = get<int32_t>(b.data(), 20);
    h.n_chunks = get<int32_t>(b.data(), 24);
    h.n_scored = get<int64_t>(b.data(), 32);
    h.tokens_hash = get<uint64_t>(b.data(), 40);
    h.mean_nll = get<double>(b.data(), 48);
    if (h.n_vocab < 1 || h.top_k < 1 || h.top_k > kKlTopK || h.top_k > h.n_vocab || h.n_ctx < 4 || h.n_chunks < 1 ||
        h.n_scored < h.n_chunks || h.n_scored % h.n_chunks != 0) {
        fail("corrupt header: top_k " + std::to_string(h.top_k) + ", n_vocab " + std::to_string(h.n_vocab) +
             ", n_ctx " + std::to_string(h.n_ctx) + ", chunks " + std::to_string(h.n_chunks) + ", scored tokens " +
             std::to_string(h.n_scored));
    }
    if (!std::isfinite(h.mean_nll)) fail("unfinished: the base run's mean NLL was never written");
    const uint64_t per_record = record_bytes(h.top_k);
    if (static_cast<uint64_t>(h.n_scored) > (size - kHeaderBytes) / per_record) {
        fail("truncated: the header announces " + std::to_string(h.n_scored) + " scored tokens of " +
             std::to_string(per_record) + " bytes (" +
             std::to_string(kHeaderBytes + static_cast<uint64_t>(h.n_scored) * per_record) +
             " bytes in all), the file has " + std::to_string(size));
    }
    const uint64_t want = kHeaderBytes + static_cast<uint64_t>(h.n_scored) * per_record;
    if (size != want) {
        fail(std::to_string(size - want) + " bytes after the last of its " + std::to_string(h.n_scored) + " records (" +
             std::to_string(want) + " bytes expected)");
    }
    return reader;
}

void KlBaseReader::check(const KlHeader& run) const {
    const KlHeader& f = header_;
    const auto fail = [&](const std::string& what) {
        throw KlFileError("KL base '" + path_ + "' does not match this run: " + what);
    };
    if (f.n_vocab != run.n_vocab) {
        fail("made with a model of " + std::to_string(f.n_vocab) + " tokens, this model has " +
             std::to_string(run.n_vocab));
    }
    if (f.top_k != run.top_k) {
        fail("it keeps the top " + std::to_string(f.top_k) + " tokens, this run the top " + std::to_string(run.top_k));
    }
    if (f.n_ctx != run.n_ctx) {
        fail("made with n_ctx (-c) " + std::to_string(f.n_ctx) + ", this run has " + std::to_string(run.n_ctx));
    }
    if (f.n_chunks != run.n_chunks) {
        fail("made over " + std::to_string(f.n_chunks) + " chunks, this run evaluates " + std::to_string(run.n_chunks) +
             " (--chunks)");
    }
    if (f.n_scored != run.n_scored) {
        fail("it holds " + std::to_string(f.n_scored) + " scored tokens, this run scores " +
             std::to_string(run.n_scored));
    }
    if (f.tokens_hash != run.tokens_hash) {
        char msg[160];
        std::snprintf(msg, sizeof msg,
                      "made from another text: its chunks' tokens hash to %016llx, this run's to %016llx",
                      static_cast<unsigned long long>(f.tokens_hash), static_cast<unsigned long long>(run.tokens_hash));
        fail(msg);
    }
}

TopKDistribution KlBaseReader::read(int64_t index) const {
    if (index < 0 || index >= header_.n_scored) {
        throw std::out_of_range("KlBaseReader::read: record " + std::to_string(index) + " of " +
                                std::to_string(header_.n_scored));
    }
    const size_t k = static_cast<size_t>(header_.top_k);
    std::array<std::byte, record_bytes(kKlTopK)> b{};
    const size_t n = record_bytes(header_.top_k);
    const uint64_t offset = kHeaderBytes + static_cast<uint64_t>(index) * n;
    size_t done = 0;
    while (done < n) {
        const ssize_t got = ::pread(fd_, b.data() + done, n - done, static_cast<off_t>(offset + done));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) throw KlFileError(system_error("KL base '" + path_ + "': reading " + record_name(header_, index)));
        if (got == 0) {
            throw KlFileError("KL base '" + path_ + "': " + record_name(header_, index) +
                              " cut short (the file shrank while in use)");
        }
        done += static_cast<size_t>(got);
    }
    TopKDistribution d;
    d.ids.resize(k);
    d.log_probs.resize(k);
    std::memcpy(d.ids.data(), b.data(), k * sizeof(int32_t));
    std::memcpy(d.log_probs.data(), b.data() + k * sizeof(int32_t), k * sizeof(double));
    d.log_rest = get<double>(b.data(), k * (sizeof(int32_t) + sizeof(double)));
    d.target_log_prob = get<double>(b.data(), k * (sizeof(int32_t) + sizeof(double)) + sizeof(double));

    const auto corrupt = [&](const std::string& what) {
        throw KlFileError("KL base '" + path_ + "': " + record_name(header_, index) + " is corrupt: " + what);
    };
    std::array<int32_t, kKlTopK> sorted{};
    std::copy(d.ids.begin(), d.ids.end(), sorted.begin());
    std::sort(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(k));
    if (sorted[0] < 0 || sorted[k - 1] >= header_.n_vocab) {
        corrupt("token id " + std::to_string(sorted[0] < 0 ? sorted[0] : sorted[k - 1]) +
                " outside the vocabulary of " + std::to_string(header_.n_vocab));
    }
    if (std::adjacent_find(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(k)) !=
        sorted.begin() + static_cast<std::ptrdiff_t>(k)) {
        corrupt("a token id listed twice");
    }
    const auto bad = [](double lp) { return !std::isfinite(lp) || lp > 1e-9; };
    if (std::any_of(d.log_probs.begin(), d.log_probs.end(), bad) || bad(d.log_rest) || bad(d.target_log_prob)) {
        corrupt("a log-probability that is not finite or above 0");
    }
    return d;
}

// ---- comparing --------------------------------------------------------------------------------

KlComparison::KlComparison(const KlBaseReader& base)
    : base_(base),
      kl_(static_cast<size_t>(base.header().n_scored)),
      nll_diff_(static_cast<size_t>(base.header().n_scored)),
      same_top_(static_cast<size_t>(base.header().n_scored)),
      added_(static_cast<size_t>(base.header().n_scored), false) {}

void KlComparison::add(int64_t index, std::span<const float> logits, double target_log_prob) {
    const TopKDistribution p = base_.read(index);  // checks index
    const KlToken t = kl_divergence(p, logits);
    const auto i = static_cast<size_t>(index);
    kl_[i] = t.kl;
    nll_diff_[i] = p.target_log_prob - target_log_prob;
    same_top_[i] = t.q_top == p.ids[0] ? 1 : 0;
    added_[i] = true;
}

namespace {

// Linear interpolation between the closest ranks, as llama.cpp's percentiles.
double percentile(const std::vector<double>& sorted, double fraction) {
    const double at = fraction * static_cast<double>(sorted.size() - 1);
    const auto lo = static_cast<size_t>(at);
    const size_t hi = std::min(lo + 1, sorted.size() - 1);
    const double w = at - static_cast<double>(lo);
    return (1.0 - w) * sorted[lo] + w * sorted[hi];
}

// Mean and standard error of the mean, summed in index order (the same for any -np).
std::pair<double, double> mean_and_error(const std::vector<double>& values) {
    double sum = 0.0;
    double sum2 = 0.0;
    for (const double v : values) {
        sum += v;
        sum2 += v * v;
    }
    const auto n = static_cast<double>(values.size());
    const double mean = sum / n;
    const double var = sum2 / n - mean * mean;
    return {mean, var > 0.0 && values.size() > 1 ? std::sqrt(var / (n - 1.0)) : 0.0};
}

}  // namespace

KlStats KlComparison::stats() const {
    const auto missing = std::find(added_.begin(), added_.end(), false);
    if (missing != added_.end() || added_.empty()) {
        throw KlFileError("KL base '" + base_.path() + "': " +
                          (added_.empty()
                               ? std::string("no scored tokens")
                               : record_name(base_.header(), missing - added_.begin()) + " was never compared"));
    }
    KlStats s;
    s.n = static_cast<int64_t>(kl_.size());
    std::tie(s.mean_kl, s.mean_kl_error) = mean_and_error(kl_);
    std::vector<double> sorted = kl_;
    std::sort(sorted.begin(), sorted.end());
    s.median_kl = percentile(sorted, 0.5);
    s.p99_kl = percentile(sorted, 0.99);
    s.max_kl = sorted.back();
    int64_t same = 0;
    for (const uint8_t v : same_top_) same += v;
    const auto n = static_cast<double>(s.n);
    s.same_top = static_cast<double>(same) / n;
    s.same_top_error = s.n > 1 ? std::sqrt(s.same_top * (1.0 - s.same_top) / (n - 1.0)) : 0.0;
    s.base_ppl = std::exp(base_.header().mean_nll);
    std::tie(s.ln_ppl_ratio, s.ln_ppl_ratio_error) = mean_and_error(nll_diff_);
    return s;
}

}  // namespace fitllm::engine
