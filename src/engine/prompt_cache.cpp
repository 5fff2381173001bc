#include "engine/prompt_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "engine/file_io.h"
#include "engine/key_transform_file.h"
#include "fitllm/error.h"
#include "gguf/gguf_reader.h"

namespace fitllm::engine {

namespace {

using file_io::Hash;
using file_io::hex;
using file_io::read_all;
using file_io::write_all;

bool starts(std::span<const int32_t> a, std::span<const int32_t> prefix) {
    return prefix.size() <= a.size() && std::equal(prefix.begin(), prefix.end(), a.begin());
}

// How many of `tokens` (at most `most`) `held` starts with.
size_t common_prefix(std::span<const int32_t> held, std::span<const int32_t> tokens, size_t most) {
    const size_t limit = std::min(most, held.size());
    size_t n = 0;
    while (n < limit && held[n] == tokens[n]) ++n;
    return n;
}

// Whether a prefix of n tokens can be taken from a prompt whose first kept position in pool p is
// first(p) (-1: none there): a query at position n sees window-pool keys after n - window, and
// every other pool must hold the prompt from its start.
template <class First>
bool prefix_whole(const kv::ModelCache& cache, size_t n, First&& first) {
    for (int p = 0; p < cache.n_pools(); ++p) {
        const int window = cache.pool(p).params().window;
        const kv::Pos needed = window > 0 ? std::max<kv::Pos>(0, static_cast<kv::Pos>(n) - window + 1) : 0;
        const kv::Pos f = first(p);
        if (f < 0 || f > needed) return false;
    }
    return true;
}

// Of stored prompts outside the cells (host memory's or disk's: tokens, and the positions each
// pool kept), the one that gives `tokens` the longest prefix a request can take, if it is longer
// than `at_least`: its index (stored.size() for none) and the prefix's length.
template <class Stored>
std::pair<size_t, size_t> longest_stored_prefix(const std::vector<Stored>& stored, std::span<const int32_t> tokens,
                                                size_t most, size_t at_least, const kv::ModelCache& cache) {
    std::pair<size_t, size_t> best{stored.size(), at_least};
    for (size_t i = 0; i < stored.size(); ++i) {
        const size_t n = common_prefix(stored[i].tokens, tokens, most);
        const auto first = [&](int p) {
            const std::vector<kv::Pos>& places = stored[i].places[static_cast<size_t>(p)];
            return places.empty() ? kv::Pos{-1} : places.front();
        };
        if (n > best.second && prefix_whole(cache, n, first)) best = {i, n};
    }
    return best;
}

// The index of the least recently used of entries (each with a last_used); entries is not empty.
template <class Entry>
size_t least_recently_used(const std::vector<Entry>& entries) {
    const auto lru = std::min_element(entries.begin(), entries.end(),
                                      [](const Entry& a, const Entry& b) { return a.last_used < b.last_used; });
    return static_cast<size_t>(lru - entries.begin());
}

constexpr char kMagic[8] = {'F', 'I', 'T', 'L', 'L', 'M', 'K', 'V'};
constexpr uint32_t kFileVersion = 1;
constexpr const char* kFileSuffix = ".fitllm-prompt";
constexpr const char* kTempSuffix = ".tmp";
constexpr const char* kFilePrefix = "prompt-";
constexpr const char* kDirPrefix = "fitllm-prompts-";
constexpr size_t kMaxNotes = 32;
// A leftover younger than this may be a live writer's between its open() and its flock().
constexpr auto kStaleAfter = std::chrono::seconds(2);

}  // namespace

uint64_t model_file_identity(const gguf::GgufFile& file) {
    Hash h;
    const std::span<const std::byte> bytes = file.bytes();
    h.add_value(static_cast<uint64_t>(bytes.size()));
    h.add(bytes.data(), std::min<size_t>(bytes.size(), file.data_offset()));
    for (const gguf::TensorInfo& t : file.tensors()) {
        const size_t n = std::min<size_t>(t.data.size(), 64);
        h.add(t.data.data(), n);
        h.add(t.data.data() + t.data.size() - n, n);
    }
    return h.identity();
}

uint64_t kv_layout_identity(const kv::ModelCache& cache) {
    Hash h;
    h.add_value(cache.n_pools());
    for (int p = 0; p < cache.n_pools(); ++p) {
        const kv::KvCache& pool = cache.pool(p);
        h.add_value(pool.params().window);
        h.add_value(static_cast<uint64_t>(pool.cell_bytes()));
        h.add_value(pool.n_layer());
        for (int l = 0; l < pool.n_layer(); ++l) {
            const kv::KvCache::LayerView v = pool.layer_view(l);
            const int32_t fields[] = {static_cast<int32_t>(v.type_k),
                                      static_cast<int32_t>(v.type_v),
                                      v.n_head_kv,
                                      v.head_dim_k,
                                      v.head_dim_v,
                                      v.rotated ? 1 : 0};
            h.add(fields, sizeof fields);
            const uint64_t rows[] = {v.k_row_bytes, v.k_head_bytes, v.v_row_bytes, v.v_head_bytes};
            h.add(rows, sizeof rows);
        }
    }
    return h.value();
}

PromptCache::PromptCache(kv::ModelCache& cache, const ContextConfig& context, memory::Pool& ram_pool, uint64_t model)
    : cache_(cache), context_(context), ram_pool_(ram_pool), model_(model) {
    for (int s = context_.n_seq + context_.n_cached_prompts - 1; s >= context_.n_seq; --s) free_ids_.push_back(s);
    if (context_.prompt_cache_disk == 0) return;
    layout_ = kv_layout_identity(cache_);
    // Rows another run copies back must be the ones this run would compute: on the host, and keys
    // shaped by the same K transform (its file goes along: load_keys()).
    persistent_ = model_ != 0 && !context_.prompt_cache_dir.empty();
    bool external = false, shaped = false;
    for (int p = 0; p < cache_.n_pools(); ++p) {
        external = external || cache_.pool(p).params().external_storage;
        shaped = shaped || cache_.pool(p).shapes_keys();
    }
    if (external) persistent_ = false;
    shaped_ = persistent_ && shaped;
    if (persistent_) {
        disk_dir_ = context_.prompt_cache_dir;
        std::error_code ec;
        std::filesystem::create_directory(disk_dir_, ec);
        if (!std::filesystem::is_directory(disk_dir_) || ::access(disk_dir_.c_str(), W_OK | X_OK) != 0) {
            throw ConfigError("--cache-dir: '" + disk_dir_ + "' is not a directory this process can write" +
                              (ec ? ": " + ec.message() : std::string()));
        }
        remove_stale(disk_dir_, true);
    } else {
        make_dir();
    }
    std::random_device random;
    file_prefix_ = disk_dir_ + "/prompt-" + hex((uint64_t{random()} << 32) ^ random() ^ uint64_t(::getpid()));
    if (shaped_) load_keys();  // before anything is stored (the scheduler's warm-up comes after)
    if (persistent_) index_dir();
}

void PromptCache::make_dir() {
    std::string base = context_.prompt_cache_dir;
    if (base.empty()) base = std::filesystem::temp_directory_path().string();
    std::string pattern = base + "/fitllm-prompts-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
        throw ConfigError("--cache-dir: cannot make a directory for kept prompts in '" + base +
                          "': " + std::strerror(errno));
    }
    disk_dir_ = pattern;
    // Held while the cache lives: a later start removes the directory only once no one holds it.
    dir_lock_ = ::open(disk_dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_lock_ >= 0) ::flock(dir_lock_, LOCK_EX | LOCK_NB);
    remove_stale(base, true);
}

void PromptCache::note(const std::string& line) {
    if (notes_.size() < kMaxNotes) {
        notes_.push_back(line);
        return;
    }
    ++n_notes_left_out_;
    const std::string more = "... and " + std::to_string(n_notes_left_out_) + " more (see the counts)";
    if (notes_.size() == kMaxNotes) {
        notes_.push_back(more);
    } else {
        notes_.back() = more;
    }
}

namespace {

// The file or directory at path, opened (without following a link) and flocked, when it is a dead
// process's: no one holds its flock, and it is older than kStaleAfter; -1 otherwise. Closing the
// descriptor releases the lock.
int lock_if_stale(const std::string& path, bool dir) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | (dir ? O_DIRECTORY : 0));
    if (fd < 0) return -1;
    struct stat st {};
    bool stale = ::fstat(fd, &st) == 0 && (dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode)) &&
                 ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    if (stale) {
        const auto changed =
            std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
                std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
        stale = std::chrono::system_clock::now() - changed >= kStaleAfter;
    }
    if (!stale) {
        ::close(fd);
        return -1;
    }
    return fd;
}

// A name the cache writes: prompt-TAG-N.fitllm-prompt, and with ".tmp" while it is written.
bool prompt_file_name(const std::string& name, bool temp) {
    const std::string suffix = std::string(kFileSuffix) + (temp ? kTempSuffix : "");
    return name.starts_with(kFilePrefix) && name.ends_with(suffix);
}

}  // namespace

void PromptCache::remove_stale(const std::string& dir, bool dirs) {
    std::error_code ec;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        const std::string path = it->path().string();
        if (prompt_file_name(name, true)) {
            const int fd = lock_if_stale(path, false);
            if (fd < 0) continue;
            ::close(fd);  // names are unique per process: no writer makes this one again
            if (::unlink(path.c_str()) == 0) {
                note(path + ": removed, a temporary file of a write that did not finish (its process is gone)");
            }
        } else if (dirs && name.starts_with(kDirPrefix) && path != disk_dir_) {
            // Another cache's directory whose process is gone: its files (only names it writes, through
            // the descriptor locked, so a directory put in its place meanwhile is not read), then it.
            const int fd = lock_if_stale(path, true);
            if (fd < 0) continue;
            size_t n = 0;
            const int listing = ::dup(fd);
            if (DIR* d = listing >= 0 ? ::fdopendir(listing) : nullptr) {
                std::vector<std::string> names;
                while (const dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
                ::closedir(d);
                for (const std::string& f : names) {
                    if ((prompt_file_name(f, false) || prompt_file_name(f, true)) && ::unlinkat(fd, f.c_str(), 0) == 0)
                        ++n;
                }
            } else if (listing >= 0) {
                ::close(listing);
            }
            if (::rmdir(path.c_str()) == 0) {
                note(path + ": removed with its " + std::to_string(n) +
                     " files, the prompt cache directory of a process that is gone");
            }
            ::close(fd);
        }
    }
}

PromptCache::~PromptCache() {
    if (persistent_) {
        persist();
        if (!shaped_ || keys_on_disk_) return;
        // The transform its keys were shaped by is not in the directory: no later run could read them.
    }
    while (!disk_.empty()) drop_disk(disk_.size() - 1);
    if (persistent_) return;
    if (!disk_dir_.empty()) ::rmdir(disk_dir_.c_str());
    if (dir_lock_ >= 0) ::close(dir_lock_);
}

uint64_t PromptCache::file_layout() const {
    if (!shaped_) return layout_;
    Hash h;
    h.add_value(layout_);
    h.add_value(keys_id_);
    return h.value();
}

namespace {

// Shaped keys: a prompt file's FileHead::reserved, a tag of the layout without the transform (so a
// start tells a file of its layout shaped by another transform from one of another layout); 0 else.
uint32_t keys_tag(uint64_t layout) {
    return static_cast<uint32_t>(layout >> 32) | 1u;
}

}  // namespace

void PromptCache::load_keys() {
    keys_key_ = key_transform_file_key(model_, layout_, cache_);
    keys_path_ = disk_dir_ + "/" + key_transform_file_name(keys_key_);
    const int fd = ::open(keys_path_.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        // None (the first run, or one that wrote no prompt): prompt files with shaped keys are skipped.
        if (errno != ENOENT) {
            note("warning: K transform file " + keys_path_ + ": cannot open it: " + std::strerror(errno) +
                 "; the prompt files written with it are not used");
        }
        return;
    }
    const KeyTransformLoad got = load_key_transform_file(fd, cache_, model_, keys_key_);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    if (!got.why.empty()) {
        ++n_disk_bad_;
        note("warning: K transform file " + keys_path_ + ": " + got.why +
             "; deleted, and the prompt files written with it are not used (this run fits its own)");
        ::unlink(keys_path_.c_str());
        return;
    }
    keys_id_ = got.identity;
    keys_on_disk_ = true;
}

void PromptCache::ensure_keys() {
    if (!shaped_ || keys_id_ != 0) return;
    // The rows about to be written were copied out once every layer had its transform.
    keys_id_ = key_transforms_identity(cache_);
    if (keys_id_ == 0 || keys_write_tried_) return;
    keys_write_tried_ = true;
    const std::string why = write_key_transform_file(file_prefix_ + "-keys" + kFileSuffix + kTempSuffix, keys_path_,
                                                     cache_, model_, keys_key_, keys_id_);
    keys_on_disk_ = why.empty();
    if (!keys_on_disk_) {
        std::fprintf(stderr,
                     "fitllm: warning: K transform file %s: %s; this run's prompt files are deleted when it ends "
                     "(a later run could not read them)\n",
                     keys_path_.c_str(), why.c_str());
    }
}

void PromptCache::persist() {
    // Least recently used first, so that the files' times order them as their use did.
    try {
        while (evict()) {
        }
        while (!saved_.empty()) give_up_saved(least_recently_used(saved_));
    } catch (const std::exception&) {
        // Whatever is not written is computed again after the restart.
    }
}

std::string PromptCache::check_head(const FileHead& h, uint64_t size, bool& foreign, bool& stale) const {
    foreign = false;
    stale = false;
    if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return "not a fitllm prompt file (its first bytes)";
    foreign = true;
    if (h.version != kFileVersion)
        return "format version " + std::to_string(h.version) + ", not " + std::to_string(kFileVersion);
    if (h.model != model_) return "another model file";
    if (h.layout != file_layout() || (shaped_ && keys_id_ == 0)) {
        if (shaped_ && h.reserved == keys_tag(layout_)) {
            // This layout's keys, shaped by a transform no run will use again.
            stale = true;
            return keys_id_ == 0 ? "its keys are shaped by a K transform that is not in the directory (" + keys_path_ +
                                       "); deleted"
                                 : "its keys are shaped by another K transform than " + keys_path_ + "'s; deleted";
        }
        return "another KV layout (types, layers, heads or rows)";
    }
    if (h.n_tokens > static_cast<uint32_t>(context_.n_ctx)) {
        return std::to_string(h.n_tokens) + " tokens, more than this context's " + std::to_string(context_.n_ctx);
    }
    foreign = false;
    if (h.n_pools != static_cast<uint32_t>(cache_.n_pools())) {
        return "a header of " + std::to_string(h.n_pools) + " pools, the cache has " + std::to_string(cache_.n_pools());
    }
    if (h.n_tokens == 0) return "a header of no tokens";
    // The smallest file the counts allow: the place counts and tokens at least.
    const uint64_t least = sizeof(FileHead) + 4ull * (h.n_pools + h.n_tokens);
    if (size < least)
        return "truncated: " + std::to_string(size) + " bytes, its header needs at least " + std::to_string(least);
    return {};
}

std::string PromptCache::read_index(int fd, OnDisk& d) const {
    const FileHead& h = d.head;
    const size_t n_pools = h.n_pools;
    std::vector<uint32_t> counts(n_pools);
    if (!read_all(fd, counts.data(), n_pools * 4, sizeof(FileHead))) return "cannot read its place counts";
    uint64_t n_places = 0, rows = 0;
    for (size_t p = 0; p < n_pools; ++p) {
        if (counts[p] > h.n_tokens) {
            return "pool " + std::to_string(p) + " keeps " + std::to_string(counts[p]) + " positions of " +
                   std::to_string(h.n_tokens) + " tokens";
        }
        n_places += counts[p];
        rows += uint64_t{counts[p]} * cache_.pool(static_cast<int>(p)).cell_bytes();
    }
    if (rows != h.rows_bytes) {
        return "a header of " + std::to_string(h.rows_bytes) + " bytes of rows, its positions take " +
               std::to_string(rows);
    }
    d.rows_offset = sizeof(FileHead) + 4 * (n_pools + h.n_tokens + n_places);
    const uint64_t want = d.rows_offset + rows;
    if (d.bytes != want) {
        return (d.bytes < want ? "truncated: " : "too long: ") + std::to_string(d.bytes) + " bytes, its header says " +
               std::to_string(want);
    }
    // The place counts again, then the tokens and places: hashed as written, in one piece.
    std::vector<int32_t> index(n_pools + h.n_tokens + n_places);
    if (!read_all(fd, index.data(), index.size() * 4, sizeof(FileHead))) return "cannot read its tokens";
    Hash hash;
    FileHead zeroed = h;
    zeroed.index_hash = 0;
    hash.add_value(zeroed);
    hash.add(index.data(), index.size() * 4);
    if (hash.value() != h.index_hash || !std::equal(counts.begin(), counts.end(), index.begin(),
                                                    [](uint32_t a, int32_t b) { return a == uint32_t(b); })) {
        return "corrupt: its tokens and positions do not match their hash";
    }
    const auto tokens = index.begin() + static_cast<std::ptrdiff_t>(n_pools);
    d.tokens.assign(tokens, tokens + h.n_tokens);
    d.places.assign(n_pools, {});
    auto it = tokens + h.n_tokens;
    for (size_t p = 0; p < n_pools; ++p) {
        std::vector<kv::Pos>& places = d.places[p];
        places.assign(it, it + counts[p]);
        it += counts[p];
        for (size_t i = 0; i < places.size(); ++i) {
            if (places[i] < 0 || places[i] >= static_cast<kv::Pos>(h.n_tokens) ||
                (i > 0 && places[i] <= places[i - 1])) {
                return "corrupt: pool " + std::to_string(p) + "'s positions are not ascending within its tokens";
            }
        }
    }
    return {};
}

void PromptCache::index_dir() {
    // The files of this model and layout, their sizes and times first (headers only); then newest
    // first, their tokens, within prompt_cache_disk and the index's share (older ones deleted).
    struct Found {
        OnDisk d;
        struct timespec mtime {};
    };
    std::vector<Found> found;
    const auto note = [&](const std::string& path, const std::string& why) { this->note(path + ": skipped, " + why); };
    std::error_code ec;
    for (std::filesystem::directory_iterator it(disk_dir_, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string path = it->path().string();
        if (!path.ends_with(kFileSuffix)) continue;
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        struct stat st {};
        if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            if (fd >= 0) ::close(fd);
            continue;  // gone meanwhile, or not a file
        }
        Found f;
        f.d.path = path;
        f.d.bytes = static_cast<uint64_t>(st.st_size);
        f.mtime = st.st_mtim;
        bool foreign = false, stale = false;
        std::string why;
        if (f.d.bytes < sizeof(FileHead) || !read_all(fd, &f.d.head, sizeof(FileHead), 0)) {
            why = "truncated: " + std::to_string(f.d.bytes) + " bytes, less than a header";
        } else {
            why = check_head(f.d.head, f.d.bytes, foreign, stale);
        }
        ::close(fd);
        if (!why.empty()) {
            ++(foreign ? n_disk_foreign_ : n_disk_bad_);
            note(path, why);
            if (stale) ::unlink(path.c_str());
            continue;
        }
        found.push_back(std::move(f));
    }
    std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
        return a.mtime.tv_sec != b.mtime.tv_sec ? a.mtime.tv_sec > b.mtime.tv_sec : a.mtime.tv_nsec > b.mtime.tv_nsec;
    });
    const uint64_t index_limit = context_.prompt_cache_disk / ContextConfig::kPromptCacheDiskIndexShare;
    for (Found& f : found) {
        OnDisk& d = f.d;
        const int fd = ::open(d.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) continue;
        std::string why = read_index(fd, d);
        ::close(fd);
        if (!why.empty()) {
            ++n_disk_bad_;
            note(d.path, why);
            continue;
        }
        uint64_t held = d.tokens.size() * sizeof(int32_t);
        for (const auto& places : d.places) held += places.size() * sizeof(kv::Pos);
        bool room = disk_bytes_ + d.bytes <= context_.prompt_cache_disk && disk_index_bytes_ + held <= index_limit;
        if (room) {
            try {
                d.tokens_charge = memory::Charge(ram_pool_, held, "a kept prompt's tokens (its rows on disk)");
            } catch (const memory::BudgetError&) {
                room = false;
            }
        }
        if (!room) {
            ::unlink(d.path.c_str());  // this model's, older than what fits: as least recently used
            continue;
        }
        d.index_bytes = held;
        disk_bytes_ += d.bytes;
        disk_index_bytes_ += held;
        ++n_disk_loaded_;
        disk_.push_back(std::move(d));
    }
    // Oldest first: the least recently used.
    for (size_t i = disk_.size(); i-- > 0;) disk_[i].last_used = ++clock_;
}

void PromptCache::keep(kv::SeqId seq, std::span<const int32_t> fed) {
    if (context_.n_cached_prompts == 0 || fed.empty()) return;
    for (auto it = kept_.begin(); it != kept_.end();) {
        if (starts(it->tokens, fed)) {  // kept already (it shared them, or computed the same)
            it->last_used = ++clock_;
            return;
        }
        if (starts(fed, it->tokens)) {  // this one holds all of it, and more
            cache_.seq_rm(it->seq, -1, -1);
            free_ids_.push_back(it->seq);
            it = kept_.erase(it);
        } else {
            ++it;
        }
    }
    if (free_ids_.empty()) evict();
    Kept kept{.seq = free_ids_.back(), .tokens = {fed.begin(), fed.end()}, .last_used = ++clock_};
    free_ids_.pop_back();
    cache_.seq_cp(seq, kept.seq, 0, static_cast<kv::Pos>(fed.size()));
    kept_.push_back(std::move(kept));
}

PromptCache::Prefix PromptCache::longest_kept(std::span<const int32_t> tokens, size_t most) const {
    Prefix best;
    for (size_t i = 0; i < kept_.size(); ++i) {
        if (consider(best, kept_[i].seq, kept_[i].tokens, tokens, most)) best.kept = i;
    }
    return best;
}

bool PromptCache::consider(Prefix& best, kv::SeqId seq, std::span<const int32_t> held, std::span<const int32_t> tokens,
                           size_t most) const {
    const size_t n = common_prefix(held, tokens, most);
    if (n <= best.n || !prefix_whole(cache_, n, [&](int p) { return cache_.pool(p).seq_pos_min(seq); })) {
        return false;
    }
    best = Prefix{.seq = seq, .n = n, .kept = kNone};
    return true;
}

int PromptCache::take(kv::SeqId seq, std::span<const int32_t> tokens, size_t most, const Prefix& best) {
    // Host memory: worth copying back only for a longer prefix than the cells give; disk: only for
    // a longer one than host memory gives.
    const auto [best_saved, saved_n] = longest_stored_prefix(saved_, tokens, most, best.n, cache_);
    const auto [best_disk, disk_n] = longest_stored_prefix(disk_, tokens, most, saved_n, cache_);
    // Copied back whole, a stored prompt is kept again when this request ends (its cells); one
    // whose prefix only is taken (a system prompt another conversation shares) stays where it was.
    if (best_disk < disk_.size()) {
        Saved read;
        const bool part = disk_n < disk_[best_disk].tokens.size();
        if (read_disk(best_disk, read, part)) {  // through host memory
            const int restored = restore(seq, read, static_cast<int>(disk_n));
            if (restored > 0) return restored;
        }
    } else if (best_saved < saved_.size()) {
        // Out of the list while cells are made for it (which may give host memory's to disk).
        saved_bytes_ -= memory::PoolBuffer<std::byte>::bytes_for(saved_[best_saved].rows.size());
        Saved saved = std::move(saved_[best_saved]);
        saved_.erase(saved_.begin() + static_cast<std::ptrdiff_t>(best_saved));
        const int restored = restore(seq, saved, static_cast<int>(saved_n));
        if (saved_n < saved.tokens.size()) {
            const uint64_t charged = memory::PoolBuffer<std::byte>::bytes_for(saved.rows.size());
            if (make_room_in_host_memory(charged)) {
                saved.last_used = ++clock_;
                saved_bytes_ += charged;
                saved_.push_back(std::move(saved));
            }
        }
        if (restored > 0) return restored;
    }
    if (best.seq < 0) return 0;
    if (best.kept != kNone) kept_[best.kept].last_used = ++clock_;
    cache_.seq_cp(best.seq, seq, 0, static_cast<kv::Pos>(best.n));
    return static_cast<int>(best.n);
}

bool PromptCache::evict() {
    if (kept_.empty()) return false;
    const auto lru = kept_.begin() + static_cast<std::ptrdiff_t>(least_recently_used(kept_));
    save(*lru);
    cache_.seq_rm(lru->seq, -1, -1);
    free_ids_.push_back(lru->seq);
    kept_.erase(lru);
    ++n_evictions_;
    return true;
}

void PromptCache::save(const Kept& c) {
    if (context_.prompt_cache_ram == 0) return;
    const int n_pools = cache_.n_pools();
    for (int p = 0; p < n_pools; ++p) {
        if (!cache_.pool(p).rows_stable()) return;
    }
    // The prompt's cells in each pool, by position.
    std::vector<std::vector<std::pair<kv::Pos, int32_t>>> cells(static_cast<size_t>(n_pools));
    size_t bytes = 0;
    for (int p = 0; p < n_pools; ++p) {
        const kv::KvCache& pool = cache_.pool(p);
        const int block = pool.params().block_size;
        auto& list = cells[static_cast<size_t>(p)];
        for (const int32_t b : pool.seq_blocks(c.seq)) {
            for (int32_t cell = b * block; cell < (b + 1) * block; ++cell) {
                if (pool.cell_has_seq(cell, c.seq)) list.emplace_back(pool.cell_pos(cell), cell);
            }
        }
        std::sort(list.begin(), list.end());
        bytes += list.size() * pool.cell_bytes();
    }
    const uint64_t charged = memory::PoolBuffer<std::byte>::bytes_for(bytes);
    if (bytes == 0 || charged > context_.prompt_cache_ram) return;
    // Room: prompts this one holds all of go (from disk too), then the least recently used.
    for (size_t i = saved_.size(); i-- > 0;) {
        if (starts(c.tokens, saved_[i].tokens)) drop_saved(i);
    }
    for (size_t i = disk_.size(); i-- > 0;) {
        if (starts(c.tokens, disk_[i].tokens)) drop_disk(i);
    }
    if (!make_room_in_host_memory(charged)) return;
    Saved sp{.tokens = c.tokens, .places = {}, .rows = {}, .last_used = c.last_used};
    try {
        sp.rows = memory::PoolBuffer<std::byte>(ram_pool_, bytes, "a kept prompt's K/V rows");
    } catch (const memory::BudgetError&) {
        return;  // the budget has no room now: the prompt is only dropped, as without --cache-ram
    }
    std::byte* out = sp.rows.data();
    std::vector<int32_t> ids;
    for (int p = 0; p < n_pools; ++p) {
        const auto& list = cells[static_cast<size_t>(p)];
        std::vector<kv::Pos>& places = sp.places.emplace_back();
        ids.clear();
        for (const auto& [pos, cell] : list) {
            places.push_back(pos);
            ids.push_back(cell);
        }
        cache_.pool(p).copy_rows_out(ids, out);
        out += ids.size() * cache_.pool(p).cell_bytes();
    }
    saved_bytes_ += charged;
    saved_.push_back(std::move(sp));
}

void PromptCache::drop_saved(size_t i) {
    saved_bytes_ -= memory::PoolBuffer<std::byte>::bytes_for(saved_[i].rows.size());
    saved_.erase(saved_.begin() + static_cast<std::ptrdiff_t>(i));
}

void PromptCache::give_up_saved(size_t i) {
    Saved sp = std::move(saved_[i]);
    const uint64_t charged = memory::PoolBuffer<std::byte>::bytes_for(sp.rows.size());
    saved_.erase(saved_.begin() + static_cast<std::ptrdiff_t>(i));
    if (context_.prompt_cache_disk > 0) write_disk(std::move(sp));  // frees its host memory after
    saved_bytes_ -= charged;
}

bool PromptCache::make_room_in_host_memory(uint64_t charged) {
    if (charged > context_.prompt_cache_ram) return false;
    while (saved_bytes_ + charged > context_.prompt_cache_ram && !saved_.empty()) {
        give_up_saved(least_recently_used(saved_));
    }
    return true;
}

void PromptCache::write_disk(Saved sp) {
    const uint64_t bytes = sp.rows.size();
    if (bytes == 0 || bytes > context_.prompt_cache_disk) return;
    // Prompts this one holds all of go, then the least recently used, until it fits.
    for (size_t i = disk_.size(); i-- > 0;) {
        if (starts(sp.tokens, disk_[i].tokens)) drop_disk(i);
    }
    OnDisk d{.tokens = std::move(sp.tokens),
             .places = std::move(sp.places),
             .path = file_prefix_ + "-" + std::to_string(++disk_serial_) + kFileSuffix,
             .head = {},
             .bytes = 0,
             .rows_offset = 0,
             .index_bytes = 0,
             .last_used = sp.last_used,
             .tokens_charge = {}};
    uint64_t held = d.tokens.size() * sizeof(int32_t);
    for (const auto& places : d.places) held += places.size() * sizeof(kv::Pos);
    // The header: place counts, tokens, places.
    std::vector<int32_t> index;
    index.reserve(d.places.size() + held / 4);
    for (const auto& places : d.places) index.push_back(static_cast<int32_t>(places.size()));
    index.insert(index.end(), d.tokens.begin(), d.tokens.end());
    for (const auto& places : d.places) index.insert(index.end(), places.begin(), places.end());
    if (shaped_) ensure_keys();
    FileHead& h = d.head;
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.version = kFileVersion;
    h.n_pools = static_cast<uint32_t>(d.places.size());
    h.model = model_;
    h.layout = file_layout();
    h.reserved = shaped_ ? keys_tag(layout_) : 0;
    h.n_tokens = static_cast<uint32_t>(d.tokens.size());
    h.rows_bytes = bytes;
    Hash rows_hash;
    rows_hash.add(sp.rows.data(), bytes);
    h.rows_hash = rows_hash.value();
    Hash index_hash;
    index_hash.add_value(h);  // index_hash 0
    index_hash.add(index.data(), index.size() * 4);
    h.index_hash = index_hash.value();
    d.rows_offset = sizeof(FileHead) + index.size() * 4;
    d.bytes = d.rows_offset + bytes;
    if (d.bytes > context_.prompt_cache_disk) return;
    while (disk_bytes_ + d.bytes > context_.prompt_cache_disk && !disk_.empty()) {
        drop_disk(least_recently_used(disk_));
    }
    const uint64_t index_limit = context_.prompt_cache_disk / ContextConfig::kPromptCacheDiskIndexShare;
    if (held > index_limit) return;
    while (disk_index_bytes_ + held > index_limit && !disk_.empty()) {
        drop_disk(least_recently_used(disk_));
    }
    d.index_bytes = held;
    try {
        d.tokens_charge = memory::Charge(ram_pool_, held, "a kept prompt's tokens (its rows on disk)");
    } catch (const memory::BudgetError&) {
        return;  // no room for its token list: dropped, as without --cache-disk
    }
    // Written under a temporary name, synced and dropped from the page cache (which a memory
    // cgroup counts), then renamed: a file of that name is whole.
    // The temporary file is flocked until renamed (closed after), so that a start meanwhile, of
    // this server or another sharing the directory, does not take it for a crashed one's.
    const std::string temp = d.path + kTempSuffix;
    // (A file system without flock leaves it unlocked: then no start takes any for a crashed one's.)
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) ::flock(fd, LOCK_EX | LOCK_NB);
    bool ok = fd >= 0 && write_all(fd, &h, sizeof h, 0) &&
              write_all(fd, index.data(), index.size() * 4, sizeof(FileHead)) &&
              write_all(fd, sp.rows.data(), bytes, d.rows_offset) && ::fdatasync(fd) == 0;
    if (fd >= 0) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ok = ok && ::rename(temp.c_str(), d.path.c_str()) == 0;
    if (!ok) ::unlink(temp.c_str());
    if (fd >= 0) ok = ::close(fd) == 0 && ok;
    if (!ok) {
        ::unlink(d.path.c_str());  // renamed, but not closed cleanly
        ++n_disk_failures_;
        return;
    }
    disk_bytes_ += d.bytes;
    disk_index_bytes_ += held;
    disk_.push_back(std::move(d));
}

void PromptCache::drop_disk(size_t i) {
    ::unlink(disk_[i].path.c_str());
    disk_bytes_ -= disk_[i].bytes;
    disk_index_bytes_ -= disk_[i].index_bytes;
    disk_.erase(disk_.begin() + static_cast<std::ptrdiff_t>(i));
}

bool PromptCache::read_disk(size_t i, Saved& out, bool keep) {
    OnDisk d = std::move(disk_[i]);
    disk_bytes_ -= d.bytes;
    disk_index_bytes_ -= d.index_bytes;
    disk_.erase(disk_.begin() + static_cast<std::ptrdiff_t>(i));
    const uint64_t rows = d.head.rows_bytes;
    const uint64_t charged = memory::PoolBuffer<std::byte>::bytes_for(rows);
    bool ok = make_room_in_host_memory(charged);
    if (ok) {
        try {
            out = Saved{.tokens = keep ? d.tokens : std::move(d.tokens),
                        .places = keep ? d.places : std::move(d.places),
                        .rows = memory::PoolBuffer<std::byte>(ram_pool_, rows, "a kept prompt's K/V rows"),
                        .last_used = d.last_used};
        } catch (const memory::BudgetError&) {
            ok = false;
        }
    }
    bool failed = false;
    if (ok) {
        // The file as written: the same header, size and rows (another process may have deleted
        // it; nothing else writes a file of its name).
        const int fd = ::open(d.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        struct stat st {};
        FileHead head{};
        std::string why;
        if (fd < 0) {
            why = errno == ENOENT ? "" : std::string("cannot open it: ") + std::strerror(errno);  // gone: taken
        } else if (::fstat(fd, &st) != 0) {
            why = std::string("cannot stat it: ") + std::strerror(errno);
        } else if (static_cast<uint64_t>(st.st_size) != d.bytes) {
            why = (static_cast<uint64_t>(st.st_size) < d.bytes ? "truncated: " : "changed: ") +
                  std::to_string(st.st_size) + " bytes, it was written with " + std::to_string(d.bytes);
        } else if (!read_all(fd, &head, sizeof head, 0) || std::memcmp(&head, &d.head, sizeof head) != 0) {
            why = "corrupt: its header is not the one it was indexed with";
        } else if (!read_all(fd, out.rows.data(), rows, d.rows_offset)) {
            why = "cannot read its rows";
        } else {
            Hash hash;
            hash.add(out.rows.data(), rows);
            if (hash.value() != d.head.rows_hash) why = "corrupt: its K/V rows do not match their hash";
        }
        ok = fd >= 0 && why.empty();
        if (fd >= 0) {
            ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            ::close(fd);
        }
        failed = !ok;
        // Never loaded: the prompt is computed again. Worth a line in the log, naming the file.
        if (!why.empty()) {
            std::fprintf(stderr, "fitllm: warning: prompt cache file %s: %s; ignored (the prompt is computed again)\n",
                         d.path.c_str(), why.c_str());
        }
    }
    if (failed) ++n_disk_failures_;
    if (ok) ++n_disk_reads_;
    if (ok && keep) {
        // Back in the list, as used now (what was written while it was out may leave no room).
        const uint64_t index_limit = context_.prompt_cache_disk / ContextConfig::kPromptCacheDiskIndexShare;
        while (
            (disk_bytes_ + d.bytes > context_.prompt_cache_disk || disk_index_bytes_ + d.index_bytes > index_limit) &&
            !disk_.empty()) {
            drop_disk(least_recently_used(disk_));
        }
        d.last_used = ++clock_;
        disk_bytes_ += d.bytes;
        disk_index_bytes_ += d.index_bytes;
        disk_.push_back(std::move(d));
    } else {
        ::unlink(d.path.c_str());
    }
    return ok;
}

int PromptCache::restore(kv::SeqId seq, const Saved& saved, int n) {
    // Cells for positions 0 .. n - 1, placed a batch at a time as the forward pass places them (the
    // window pools trimmed after each), each filled from the saved rows of its position where the
    // pool kept one (a window pool's positions before its window were never saved: trimmed at once,
    // or, one at most, never seen by the tokens after n).
    const int block = cache_.pool(0).params().block_size;
    while (cache_.pool(0).free_cells() < n + block && evict()) {
    }
    const int n_pools = cache_.n_pools();
    std::vector<size_t> offsets(static_cast<size_t>(n_pools));  // where each pool's rows start
    for (int p = 1; p < n_pools; ++p) {
        offsets[static_cast<size_t>(p)] =
            offsets[static_cast<size_t>(p - 1)] +
            saved.places[static_cast<size_t>(p - 1)].size() * cache_.pool(p - 1).cell_bytes();
    }
    std::vector<kv::SeqId> seqs;
    std::vector<kv::Pos> positions;
    std::vector<int32_t> cells;
    for (int a = 0; a < n; a += context_.n_batch) {
        const int b = std::min(n, a + context_.n_batch);
        seqs.assign(static_cast<size_t>(b - a), seq);
        positions.resize(static_cast<size_t>(b - a));
        for (int i = a; i < b; ++i) positions[static_cast<size_t>(i - a)] = i;
        if (!cache_.has_room(seqs)) {
            cache_.seq_rm(seq, -1, -1);
            return 0;
        }
        cache_.place(seqs, positions);
        for (int p = 0; p < n_pools; ++p) {
            const std::vector<kv::Pos>& places = saved.places[static_cast<size_t>(p)];
            const auto first = std::lower_bound(places.begin(), places.end(), a);
            const auto last = std::lower_bound(places.begin(), places.end(), b);
            if (first == last) continue;
            const std::span<const int32_t> placed = cache_.cells(p);
            cells.clear();
            for (auto it = first; it != last; ++it) cells.push_back(placed[static_cast<size_t>(*it - a)]);
            const size_t index = static_cast<size_t>(first - places.begin());
            cache_.pool(p).copy_rows_in(
                cells, saved.rows.data() + offsets[static_cast<size_t>(p)] + index * cache_.pool(p).cell_bytes());
        }
        cache_.end_batch();
    }
    ++n_restores_;
    return n;
}

PromptCache::Holdings PromptCache::holdings() const {
    Holdings h;
    h.n_kept = static_cast<int>(kept_.size());
    for (const Kept& c : kept_) h.kept_tokens += static_cast<int>(c.tokens.size());
    h.n_saved = static_cast<int>(saved_.size());
    h.saved_bytes = saved_bytes_;
    h.n_disk = static_cast<int>(disk_.size());
    h.disk_bytes = disk_bytes_;
    return h;
}

PromptCache::Counters PromptCache::counters() const {
    return {.n_evictions = n_evictions_.load(),
            .n_restores = n_restores_.load(),
            .n_disk_reads = n_disk_reads_.load(),
            .n_disk_failures = n_disk_failures_.load(),
            .n_disk_loaded = n_disk_loaded_,
            .n_disk_foreign = n_disk_foreign_,
            .n_disk_bad = n_disk_bad_};
}

}  // namespace fitllm::engine
