#include "engine/prompt_cache.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "fitllm/error.h"

namespace fitllm::engine {

namespace {

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

// Writes or reads all n bytes at offset 0 of fd; false on an error (errno set) or a short file.
bool write_all(int fd, const std::byte* data, size_t n) {
    for (size_t done = 0; done < n;) {
        const ssize_t w = ::pwrite(fd, data + done, n - done, static_cast<off_t>(done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        done += static_cast<size_t>(w);
    }
    return true;
}

bool read_all(int fd, std::byte* data, size_t n) {
    for (size_t done = 0; done < n;) {
        const ssize_t r = ::pread(fd, data + done, n - done, static_cast<off_t>(done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        done += static_cast<size_t>(r);
    }
    return true;
}

}  // namespace

PromptCache::PromptCache(kv::ModelCache& cache, const ContextConfig& context, memory::Pool& ram_pool)
    : cache_(cache), context_(context), ram_pool_(ram_pool) {
    for (int s = context_.n_seq + context_.n_cached_prompts - 1; s >= context_.n_seq; --s) free_ids_.push_back(s);
    if (context_.prompt_cache_disk > 0) {
        std::string base = context_.prompt_cache_dir;
        if (base.empty()) base = std::filesystem::temp_directory_path().string();
        std::string pattern = base + "/fitllm-prompts-XXXXXX";
        if (mkdtemp(pattern.data()) == nullptr) {
            throw ConfigError("--cache-dir: cannot make a directory for kept prompts in '" + base +
                              "': " + std::strerror(errno));
        }
        disk_dir_ = pattern;
    }
}

PromptCache::~PromptCache() {
    while (!disk_.empty()) drop_disk(disk_.size() - 1);
    if (!disk_dir_.empty()) ::rmdir(disk_dir_.c_str());
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
    if (best_disk < disk_.size()) {
        Saved read;
        if (read_disk(best_disk, read)) {  // through host memory: kept there again when this request ends
            const int restored = restore(seq, read, static_cast<int>(disk_n));
            if (restored > 0) return restored;
        }
    } else if (best_saved < saved_.size()) {
        Saved saved = std::move(saved_[best_saved]);
        drop_saved(best_saved);  // copied back, it is kept again when this request ends
        const int restored = restore(seq, saved, static_cast<int>(saved_n));
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
    while (disk_bytes_ + bytes > context_.prompt_cache_disk && !disk_.empty()) {
        drop_disk(least_recently_used(disk_));
    }
    OnDisk d{.tokens = std::move(sp.tokens),
             .places = std::move(sp.places),
             .path = disk_dir_ + "/prompt-" + std::to_string(++disk_serial_) + ".kv",
             .bytes = bytes,
             .last_used = sp.last_used,
             .tokens_charge = {}};
    uint64_t held = d.tokens.size() * sizeof(int32_t);
    for (const auto& places : d.places) held += places.size() * sizeof(kv::Pos);
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
    // Written, synced and dropped from the page cache (which a memory cgroup counts).
    const int fd = ::open(d.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    bool ok = fd >= 0 && write_all(fd, sp.rows.data(), bytes) && ::fdatasync(fd) == 0;
    if (fd >= 0) {
        ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        ok = ::close(fd) == 0 && ok;
    }
    if (!ok) {
        ::unlink(d.path.c_str());
        ++n_disk_failures_;
        return;
    }
    disk_bytes_ += bytes;
    disk_index_bytes_ += held;
    disk_.push_back(std::move(d));
}

void PromptCache::drop_disk(size_t i) {
    ::unlink(disk_[i].path.c_str());
    disk_bytes_ -= disk_[i].bytes;
    disk_index_bytes_ -= disk_[i].index_bytes;
    disk_.erase(disk_.begin() + static_cast<std::ptrdiff_t>(i));
}

bool PromptCache::read_disk(size_t i, Saved& out) {
    OnDisk d = std::move(disk_[i]);
    disk_bytes_ -= d.bytes;
    disk_index_bytes_ -= d.index_bytes;
    disk_.erase(disk_.begin() + static_cast<std::ptrdiff_t>(i));
    const uint64_t charged = memory::PoolBuffer<std::byte>::bytes_for(d.bytes);
    bool ok = make_room_in_host_memory(charged);
    if (ok) {
        try {
            out = Saved{.tokens = std::move(d.tokens),
                        .places = std::move(d.places),
                        .rows = memory::PoolBuffer<std::byte>(ram_pool_, d.bytes, "a kept prompt's K/V rows"),
                        .last_used = d.last_used};
        } catch (const memory::BudgetError&) {
            ok = false;
        }
    }
    bool failed = false;
    if (ok) {
        const int fd = ::open(d.path.c_str(), O_RDONLY | O_CLOEXEC);
        ok = fd >= 0 && read_all(fd, out.rows.data(), d.bytes);
        if (fd >= 0) {
            ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            ::close(fd);
        }
        failed = !ok;
    }
    ::unlink(d.path.c_str());
    if (failed) ++n_disk_failures_;
    if (ok) ++n_disk_reads_;
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
            .n_disk_failures = n_disk_failures_.load()};
}

}  // namespace fitllm::engine
