#include "gguf/imatrix.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <utility>

#include "fitllm/error.h"
#include "gguf/gguf_reader.h"

namespace fitllm::gguf {
namespace {

constexpr std::string_view kSums = ".in_sum2", kCounts = ".counts";

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

void check_finite(const std::string& path, const std::string& name, const std::vector<float>& w) {
    for (size_t i = 0; i < w.size(); ++i) {
        if (!std::isfinite(w[i]))
            throw Error(path + ": importance matrix entry '" + name + "': value " + std::to_string(i) +
                        " is not finite (" + std::to_string(w[i]) + ")");
    }
}

std::vector<float> f32_values(const TensorInfo& t) {
    std::vector<float> v(t.n_elements);
    if (!v.empty()) std::memcpy(v.data(), t.data.data(), v.size() * sizeof(float));
    return v;
}

ImportanceMatrix load_gguf(const std::string& path) {
    const GgufFile f = GgufFile::open(path);
    ImportanceMatrix m;
    m.path = path;
    if (f.tensors().empty()) throw Error(path + ": importance matrix without tensors");
    const Value* datasets = f.find("imatrix.datasets");
    const Value* chunk_count = f.find("imatrix.chunk_count");
    const Value* chunk_size = f.find("imatrix.chunk_size");
    if (!datasets || !chunk_count || !chunk_size)
        throw Error(path +
                    ": not an importance matrix: the metadata imatrix.datasets, imatrix.chunk_count and "
                    "imatrix.chunk_size are missing (llama-imatrix writes them)");
    if (datasets->is_array() && datasets->array_type() == ValueType::STRING) {
        for (std::string_view s : datasets->strings()) m.datasets.emplace_back(s);
    }
    try {
        m.chunk_count = chunk_count->to_int();
    } catch (const Error& e) {
        throw Error(path + ": imatrix.chunk_count: " + e.what());
    }

    std::map<std::string, std::pair<const TensorInfo*, const TensorInfo*>> pairs;
    for (const TensorInfo& t : f.tensors()) {
        if (ends_with(t.name, kSums)) {
            pairs[std::string(t.name.substr(0, t.name.size() - kSums.size()))].first = &t;
        } else if (ends_with(t.name, kCounts)) {
            pairs[std::string(t.name.substr(0, t.name.size() - kCounts.size()))].second = &t;
        }
    }
    for (const auto& [name, p] : pairs) {
        const auto [sums, counts] = p;
        if (!sums || !counts)
            throw Error(path + ": importance matrix entry '" + name + "': tensor '" + name +
                        std::string(sums ? kCounts : kSums) + "' is missing");
        for (const TensorInfo* t : {sums, counts}) {
            if (t->type != quant::GgmlType::F32)
                throw Error(path + ": tensor '" + std::string(t->name) + "' is " +
                            std::string(quant::traits(t->type).name) + ", not F32");
        }
        const uint64_t n = sums->n_elements, n_counts = counts->n_elements;
        if (n_counts == 0 || n == 0 || n % n_counts != 0)
            throw Error(path + ": importance matrix entry '" + name + "': " + std::to_string(n) + " sums for " +
                        std::to_string(n_counts) + " counts (a whole number of sums per count expected)");
        const std::vector<float> s = f32_values(*sums), c = f32_values(*counts);
        const uint64_t per = n / n_counts;
        std::vector<float> w(n);
        for (uint64_t e = 0; e < n_counts; ++e) {
            if (!std::isfinite(c[e]) || c[e] < 0.0f)
                throw Error(path + ": importance matrix entry '" + name + "': count " + std::to_string(e) + " is " +
                            std::to_string(c[e]));
            // llama.cpp rounds the stored counts to integers, then divides by them as floats.
            const float count = static_cast<float>(std::lround(c[e]));
            for (uint64_t j = 0; j < per; ++j) w[e * per + j] = count > 0.0f ? s[e * per + j] / count : 1.0f;
        }
        check_finite(path, name, w);
        m.weights.emplace(name, std::move(w));
    }
    if (m.weights.empty()) throw Error(path + ": importance matrix without any '*.in_sum2' / '*.counts' tensors");
    return m;
}

class LegacyReader {
public:
    LegacyReader(const std::string& path, std::vector<char> bytes) : path_(path), bytes_(std::move(bytes)) {}
    bool at_end() const { return pos_ == bytes_.size(); }
    void read(void* dst, size_t n, const std::string& what) {
        if (bytes_.size() - pos_ < n)
            throw Error(path_ + ": truncated importance matrix: byte " + std::to_string(pos_) + " (" + what +
                        "): " + std::to_string(n) + " bytes needed, " + std::to_string(bytes_.size() - pos_) + " left");
        std::memcpy(dst, bytes_.data() + pos_, n);
        pos_ += n;
    }
    int32_t i32(const std::string& what) {
        int32_t v;
        read(&v, sizeof v, what);
        return v;
    }

private:
    const std::string& path_;
    std::vector<char> bytes_;
    size_t pos_ = 0;
};

ImportanceMatrix load_legacy(const std::string& path, std::vector<char> bytes) {
    ImportanceMatrix m;
    m.path = path;
    m.legacy = true;
    LegacyReader r(path, std::move(bytes));
    const int32_t n_entries = r.i32("entry count");
    if (n_entries < 1)
        throw Error(path + ": not an importance matrix (neither GGUF nor llama.cpp's legacy format: entry count " +
                    std::to_string(n_entries) + ")");
    for (int32_t i = 0; i < n_entries; ++i) {
        const std::string entry = "entry " + std::to_string(i + 1);
        const int32_t len = r.i32(entry + " name length");
        if (len < 1 || len > 4096)
            throw Error(path + ": importance matrix " + entry + ": name length " + std::to_string(len));
        std::string name(static_cast<size_t>(len), '\0');
        r.read(name.data(), name.size(), entry + " name");
        const std::string where = entry + " '" + name + "'";
        const int32_t ncall = r.i32(where + " ncall");
        const int32_t nval = r.i32(where + " value count");
        if (nval < 1) throw Error(path + ": importance matrix " + where + ": value count " + std::to_string(nval));
        std::vector<float> w(static_cast<size_t>(nval));
        r.read(w.data(), w.size() * sizeof(float), where + " values");
        if (ncall > 0) {
            for (float& v : w) v = v / static_cast<float>(static_cast<int64_t>(ncall));
        }
        check_finite(path, name, w);
        if (!m.weights.emplace(name, std::move(w)).second)
            throw Error(path + ": importance matrix " + where + " appears twice");
    }
    if (!r.at_end()) {
        m.chunk_count = r.i32("chunk count");
        if (!r.at_end()) {
            const int32_t len = r.i32("dataset name length");
            if (len > 0) {
                std::string dataset(static_cast<size_t>(len), '\0');
                r.read(dataset.data(), dataset.size(), "dataset name");
                m.datasets.push_back(dataset.c_str());
            }
        }
    }
    return m;
}

}  // namespace

ImportanceMatrix load_imatrix(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path + ": cannot open the importance matrix: " + std::strerror(errno));
    char magic[4] = {};
    in.read(magic, 4);
    if (in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0) return load_gguf(path);
    in.clear();
    in.seekg(0);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return load_legacy(path, std::move(bytes));
}

void filter_imatrix(ImportanceMatrix& m, const std::vector<std::string>& include,
                    const std::vector<std::string>& exclude) {
    auto contains_any = [](const std::string& name, const std::vector<std::string>& parts) {
        for (const std::string& p : parts) {
            if (name.find(p) != std::string::npos) return true;
        }
        return false;
    };
    for (auto it = m.weights.begin(); it != m.weights.end();) {
        const bool drop = (!include.empty() && !contains_any(it->first, include)) || contains_any(it->first, exclude);
        it = drop ? m.weights.erase(it) : std::next(it);
    }
}

}  // namespace fitllm::gguf
