#include "engine/key_transform_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "engine/file_io.h"

namespace fitllm::engine {

namespace {

using file_io::Hash;
using file_io::read_all;
using file_io::write_all;

constexpr char kMagic[8] = {'F', 'I', 'T', 'L', 'L', 'M', 'K', 'T'};
constexpr uint32_t kVersion = 1;
struct Head {
    char magic[8];
    uint32_t version;
    uint32_t n_layers;  // records
    uint64_t model;     // model_file_identity()
    uint64_t key;       // key_transform_file_key()
    uint64_t bytes;     // the whole file's
    uint64_t content;   // key_transforms_identity() of the records and numbers (never 0)
};
static_assert(sizeof(Head) == 48);
struct Record {
    int32_t kind;  // kv::KeyTransform::Kind
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t reserved;
};

Record record_of(const kv::KeyTransform& key) {
    return {static_cast<int32_t>(key.kind()), key.n_head_kv(), key.head_dim(), 0};
}

// (pool, layer) of every layer whose keys are shaped, in the file's order.
std::vector<std::pair<int, int>> shaped_layers(const kv::ModelCache& cache) {
    std::vector<std::pair<int, int>> layers;
    for (int p = 0; p < cache.n_pools(); ++p) {
        if (!cache.pool(p).shapes_keys()) continue;
        for (int l = 0; l < cache.pool(p).n_layer(); ++l) layers.emplace_back(p, l);
    }
    return layers;
}

bool all_finite(std::span<const float> v) {
    return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

// The file's transforms, read whole and checked, into keys (one per layer of `layers`); empty when
// they are this cache's, else why not.
std::string read_file(int fd, const kv::ModelCache& cache, uint64_t model, uint64_t key,
                      const std::vector<std::pair<int, int>>& layers, std::vector<kv::KeyTransform>& keys,
                      uint64_t& identity) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return std::string("cannot stat it: ") + std::strerror(errno);
    const auto size = static_cast<uint64_t>(st.st_size);
    Head h{};
    if (size < sizeof h || !read_all(fd, &h, sizeof h, 0)) {
        return "truncated: " + std::to_string(size) + " bytes, less than a header";
    }
    if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return "not a fitllm K transform file";
    if (h.version != kVersion)
        return "format version " + std::to_string(h.version) + ", not " + std::to_string(kVersion);
    if (h.model != model) return "mismatched: of another model file";
    if (h.key != key) return "mismatched: of another KV layout or K transform kind";
    if (h.bytes != size) {
        return (size < h.bytes ? "truncated: " : "too long: ") + std::to_string(size) + " bytes, its header says " +
               std::to_string(h.bytes);
    }
    if (h.n_layers != layers.size()) {
        return "mismatched: " + std::to_string(h.n_layers) + " layers, the cache shapes K in " +
               std::to_string(layers.size());
    }
    Hash content;
    uint64_t offset = sizeof h;
    keys.reserve(layers.size());
    for (const auto& [p, l] : layers) {
        const std::string where = "layer " + std::to_string(l) + " of KV pool " + std::to_string(p);
        Record r{};
        if (offset + sizeof r > size || !read_all(fd, &r, sizeof r, offset)) return "truncated in " + where;
        content.add_value(r);
        offset += sizeof r;
        const kv::KvCache::LayerView view = cache.pool(p).layer_view(l);
        if (r.kind < 0 || r.kind > static_cast<int32_t>(kv::KeyTransform::Kind::QueryAware) ||
            r.n_head_kv != view.n_head_kv || r.head_dim != view.head_dim_k) {
            return "mismatched: " + where + " holds kind " + std::to_string(r.kind) + " for " +
                   std::to_string(r.n_head_kv) + " heads of " + std::to_string(r.head_dim) + ", the cache has " +
                   std::to_string(view.n_head_kv) + " of " + std::to_string(view.head_dim_k);
        }
        kv::KeyTransform& k = keys.emplace_back();
        std::vector<std::span<float>> numbers;
        try {
            numbers = k.prepare_numbers(static_cast<kv::KeyTransform::Kind>(r.kind), r.n_head_kv, r.head_dim);
        } catch (const std::invalid_argument& e) {
            return "mismatched: " + where + ": " + e.what();
        }
        for (const std::span<float> v : numbers) {
            if (offset + v.size_bytes() > size || !read_all(fd, v.data(), v.size_bytes(), offset)) {
                return "truncated in " + where;
            }
            content.add(v.data(), v.size_bytes());
            offset += v.size_bytes();
            if (!all_finite(v)) return "corrupt: " + where + " holds a number that is not finite";
        }
        k.finish_numbers();
        if (!cache.pool(p).accepts_key_transform(l, k)) {
            return "mismatched: " + where + "'s transform is of a kind this cache does not fit (-ctk, device)";
        }
    }
    if (offset != size) {
        return "too long: " + std::to_string(size) + " bytes, its layers take " + std::to_string(offset);
    }
    if (content.identity() != h.content) return "corrupt: its numbers do not match their hash";
    identity = h.content;
    return {};
}

}  // namespace

uint64_t key_transform_file_key(uint64_t model, uint64_t layout, const kv::ModelCache& cache) {
    Hash name;
    name.add_value(kVersion);
    name.add_value(model);
    name.add_value(layout);
    for (int p = 0; p < cache.n_pools(); ++p) {
        const uint8_t limited = cache.pool(p).key_transform_limited() ? 1 : 0;
        name.add_value(limited);
    }
    return name.value();
}

std::string key_transform_file_name(uint64_t key) {
    return "keys-" + file_io::hex(key) + ".fitllm-keys";
}

uint64_t key_transforms_identity(const kv::ModelCache& cache) {
    Hash h;
    for (const auto& [p, l] : shaped_layers(cache)) {
        const kv::KeyTransform* key = cache.pool(p).key_transform(l);
        if (key == nullptr) return 0;
        h.add_value(record_of(*key));
        for (const std::span<const float> v : key->numbers()) h.add(v.data(), v.size_bytes());
    }
    return h.identity();
}

KeyTransformLoad load_key_transform_file(int fd, kv::ModelCache& cache, uint64_t model, uint64_t key) {
    const std::vector<std::pair<int, int>> layers = shaped_layers(cache);
    // Read whole before any pool takes one: the transforms, as large as the fitted ones would be
    // (the KV cache's charge holds them), and checked against the cache and the file's hash.
    std::vector<kv::KeyTransform> keys;
    KeyTransformLoad got;
    got.why = read_file(fd, cache, model, key, layers, keys, got.identity);
    if (!got.why.empty()) {
        got.identity = 0;
        return got;
    }
    for (size_t i = 0; i < layers.size(); ++i) {
        cache.pool(layers[i].first).set_key_transform(layers[i].second, std::move(keys[i]));
    }
    return got;
}

std::string write_key_transform_file(const std::string& temp, const std::string& path, const kv::ModelCache& cache,
                                     uint64_t model, uint64_t key, uint64_t identity) {
    std::vector<const kv::KeyTransform*> keys;
    uint64_t bytes = sizeof(Head);
    for (const auto& [p, l] : shaped_layers(cache)) {
        keys.push_back(cache.pool(p).key_transform(l));
        bytes += sizeof(Record);
        for (const std::span<const float> v : keys.back()->numbers()) bytes += v.size_bytes();
    }
    Head h{};
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.version = kVersion;
    h.n_layers = static_cast<uint32_t>(keys.size());
    h.model = model;
    h.key = key;
    h.bytes = bytes;
    h.content = identity;
    // As a prompt file: a temporary name of this process's (one a start removes when its writer
    // died), synced, then linked to its name, which never replaces a file there: a transform file
    // another server wrote first stays.
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) ::flock(fd, LOCK_EX | LOCK_NB);
    bool ok = fd >= 0 && write_all(fd, &h, sizeof h, 0);
    uint64_t offset = sizeof h;
    for (const kv::KeyTransform* k : keys) {
        if (!ok) break;
        const Record r = record_of(*k);
        ok = write_all(fd, &r, sizeof r, offset);
        offset += sizeof r;
        for (const std::span<const float> v : k->numbers()) {
            ok = ok && write_all(fd, v.data(), v.size_bytes(), offset);
            offset += v.size_bytes();
        }
    }
    ok = ok && ::fdatasync(fd) == 0;
    if (fd >= 0) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    std::string why;
    if (!ok) {
        why = std::string("cannot be written: ") + std::strerror(errno);
    } else if (::link(temp.c_str(), path.c_str()) != 0) {
        if (errno == EEXIST) {
            why = "written by another server meanwhile, with another transform";
        } else if (::access(path.c_str(), F_OK) == 0 || ::rename(temp.c_str(), path.c_str()) != 0) {
            why = std::string("cannot be linked into place: ") + std::strerror(errno);
        }  // else renamed: a file system without hard links
    }
    ::unlink(temp.c_str());
    if (fd >= 0) ::close(fd);
    return why;
}

}  // namespace fitllm::engine
