#include "model/expert_cache.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>

#include "io/mapped_file.h"
#include "util/text.h"

namespace fitllm::model {
namespace {

uint64_t align_down(uint64_t x) {
    return x / kExpertAlign * kExpertAlign;
}
uint64_t align_up(uint64_t x) {
    return (x + kExpertAlign - 1) / kExpertAlign * kExpertAlign;
}

// Layer il's expert tensor m (kExpertTensors), checked to hold n_expert slices.
const gguf::TensorInfo& expert_tensor(const gguf::GgufFile& file, const Hparams& hp, int il, int m) {
    const std::string name = "blk." + std::to_string(il) + "." + kExpertTensors[m];
    const gguf::TensorInfo* t = file.find_tensor(name);
    if (t == nullptr) throw ModelError(file.source() + ": missing tensor '" + name + "' for the expert cache");
    if (hp.n_expert <= 0 || t->n_bytes == 0 || t->n_bytes % static_cast<uint64_t>(hp.n_expert) != 0) {
        throw ModelError(file.source() + ": tensor '" + name + "' of " + std::to_string(t->n_bytes) + " bytes is not " +
                         std::to_string(hp.n_expert) + " experts' slices of equal size");
    }
    return *t;
}

}  // namespace

std::string_view expert_evict_name(ExpertEvict e) {
    return e == ExpertEvict::lfu ? "lfu" : "lru";
}

double top_fifth_share(const std::vector<uint64_t>& counts, int n_layer, int n_expert) {
    if (n_layer <= 0 || n_expert <= 0 || counts.size() != static_cast<size_t>(n_layer) * static_cast<size_t>(n_expert))
        return 0.0;
    const auto top = static_cast<std::ptrdiff_t>(std::max(1, n_expert / 5));
    uint64_t all = 0, busiest = 0;
    std::vector<uint64_t> layer(static_cast<size_t>(n_expert));
    for (int il = 0; il < n_layer; ++il) {
        const auto from = counts.begin() + static_cast<std::ptrdiff_t>(il) * n_expert;
        std::copy(from, from + n_expert, layer.begin());
        std::partial_sort(layer.begin(), layer.begin() + top, layer.end(), std::greater<>());
        for (std::ptrdiff_t i = 0; i < n_expert; ++i) {
            all += layer[static_cast<size_t>(i)];
            if (i < top) busiest += layer[static_cast<size_t>(i)];
        }
    }
    return all == 0 ? 0.0 : double(busiest) / double(all);
}

bool is_expert_tensor(std::string_view name) {
    if (!name.starts_with("blk.")) return false;
    for (const char* t : kExpertTensors) {
        const std::string_view s(t);
        if (name.size() > s.size() && name.ends_with(s) && name[name.size() - s.size() - 1] == '.') return true;
    }
    return false;
}

uint64_t expert_slot_bytes(const gguf::GgufFile& file, const Hparams& hp) {
    uint64_t slot = 0;
    for (int m = 0; m < 3; ++m) {
        uint64_t largest = 0;
        for (int il = 0; il < hp.n_layer; ++il)
            largest = std::max(largest, expert_tensor(file, hp, il, m).n_bytes / static_cast<uint64_t>(hp.n_expert));
        slot += align_up(largest) + kExpertAlign;
    }
    return slot;
}

int min_expert_slots(const Hparams& hp) {
    return std::max(1, hp.n_expert_used * hp.n_layer);
}

uint64_t expert_cache_bytes(uint64_t slot_bytes, int n_slots) {
    return n_slots <= 0 ? 0
                        : memory::PoolBuffer<std::byte>::bytes_for(
                              static_cast<size_t>(slot_bytes * static_cast<uint64_t>(n_slots) + kExpertAlign));
}

ExpertCache::ExpertCache(const gguf::GgufFile& file, const Hparams& hp, int n_slots, memory::Pool& pool, bool direct_io,
                         bool prefetch, ExpertEvict evict)
    : n_layer_(hp.n_layer), n_expert_(hp.n_expert), n_used_(hp.n_expert_used), n_slots_(n_slots), evict_(evict) {
    if (!hp.is_moe()) throw std::invalid_argument(file.source() + ": an expert cache needs a mixture-of-experts model");
    if (n_slots < min_expert_slots(hp)) {
        throw std::invalid_argument(file.source() + ": an expert cache of " + std::to_string(n_slots) +
                                    " slots is too small: it needs at least " + std::to_string(min_expert_slots(hp)) +
                                    " (" + std::to_string(hp.n_expert_used) + " experts used x " +
                                    std::to_string(hp.n_layer) + " layers)");
    }
    if (file.mapping() == nullptr) {
        throw ModelError(file.source() + ": an expert cache needs a model opened from a file (GgufFile::open)");
    }
    path_ = file.mapping()->path();
    for (int il = 0; il < n_layer_; ++il) {
        for (int m = 0; m < 3; ++m) {
            const gguf::TensorInfo& t = expert_tensor(file, hp, il, m);
            const uint64_t each = t.n_bytes / static_cast<uint64_t>(n_expert_);
            slices_.push_back({file.data_offset() + t.offset, each});
            region_bytes_[m] = std::max(region_bytes_[m], align_up(each) + kExpertAlign);
        }
    }
    slot_bytes_ = region_bytes_[0] + region_bytes_[1] + region_bytes_[2];
    const uint64_t total = slot_bytes_ * static_cast<uint64_t>(n_slots) + kExpertAlign;
    buffer_ = memory::PoolBuffer<std::byte>(
        pool, static_cast<size_t>(total),
        "expert cache of " + std::to_string(n_slots) + " slots of " + util::human_bytes(slot_bytes_));
    const auto address = reinterpret_cast<uintptr_t>(buffer_.data());
    base_ = buffer_.data() + (kExpertAlign - address % kExpertAlign) % kExpertAlign;
    where_.assign(static_cast<size_t>(n_layer_) * static_cast<size_t>(n_expert_), -1);
    owner_.assign(static_cast<size_t>(n_slots), -1);
    last_use_.assign(static_cast<size_t>(n_slots), 0);
    ptr_.assign(static_cast<size_t>(n_slots) * 3, nullptr);
    ready_.assign(static_cast<size_t>(n_slots), 0);
    ahead_.assign(static_cast<size_t>(n_slots), 0);
    recent_.assign(where_.size(), 0);
    chosen_.assign(where_.size(), 0);
    age_period_ = static_cast<uint64_t>(kLfuAgeTokens) * static_cast<uint64_t>(min_expert_slots(hp));
    open_file(file_, direct_io);
    if (static_cast<uint64_t>(::lseek(file_.fd, 0, SEEK_END)) != file.size()) {
        ::close(file_.fd);
        file_.fd = -1;
        throw io::IoError(path_ + ": the file changed size since it was mapped; cannot read its experts");
    }
    direct_ = file_.direct;
    if (prefetch) {
        open_file(reader_file_, direct_io);
        reader_ = std::thread([this] { reader(); });
    }
}

ExpertCache::~ExpertCache() {
    if (reader_.joinable()) {
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        changed_.notify_all();
        reader_.join();
    }
    for (const File& f : {file_, reader_file_}) {
        if (f.fd >= 0) ::close(f.fd);
    }
}

void ExpertCache::open_file(File& f, bool direct) {
    if (f.fd >= 0) ::close(f.fd);
    f.fd = -1;
    f.direct = false;
    if (direct) {
        f.fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
        f.direct = f.fd >= 0;
    }
    if (f.fd < 0) f.fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (f.fd < 0) throw io::IoError(path_ + ": cannot open to read experts: " + std::strerror(errno));
    if (!f.direct) ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_RANDOM);
}

std::vector<FileRange> ExpertCache::ranges() const {
    std::vector<FileRange> out;
    for (const Slice& s : slices_) out.push_back({s.offset, s.bytes * static_cast<uint64_t>(n_expert_)});
    return out;
}

ExpertCacheStats ExpertCache::stats() const {
    ExpertCacheStats s;
    s.n_slots = n_slots_;
    s.slot_bytes = slot_bytes_;
    s.hits = hits_.load(std::memory_order_relaxed);
    s.misses = misses_.load(std::memory_order_relaxed);
    s.bytes_read = bytes_read_.load(std::memory_order_relaxed);
    s.tokens = tokens_.load(std::memory_order_relaxed);
    s.prefetched = prefetched_.load(std::memory_order_relaxed);
    s.prefetch_used = prefetch_used_.load(std::memory_order_relaxed);
    s.direct_io = direct_.load(std::memory_order_relaxed);
    s.evict = evict_;
    std::lock_guard lock(mutex_);
    s.top_fifth_share = top_fifth_share(chosen_, n_layer_, n_expert_);
    return s;
}

// Expert e's slice of matrix m into `region` (kExpertAlign-aligned, region_bytes_[m] long); the
// slice starts at (s.offset + e * bytes) % kExpertAlign in it. Widened to whole blocks either
// way, so that the same reads work with and without O_DIRECT.
void ExpertCache::read(File& f, const Slice& s, int m, int il, int e, std::byte* region) {
    const uint64_t begin = s.offset + static_cast<uint64_t>(e) * s.bytes;
    const uint64_t from = align_down(begin);
    const uint64_t needed = begin + s.bytes - from;
    const uint64_t length = align_up(needed);
    uint64_t done = 0;
    while (done < needed) {
        const ssize_t got = ::pread(f.fd, region + done, length - done, static_cast<off_t>(from + done));
        if (got < 0) {
            if (errno == EINTR) continue;
            if (f.direct && errno == EINVAL) {
                // The filesystem took O_DIRECT at open but refuses these reads: read buffered.
                open_file(f, false);
                direct_ = false;
                continue;
            }
            throw io::IoError(path_ + ": reading expert " + std::to_string(e) + " of tensor 'blk." +
                              std::to_string(il) + "." + kExpertTensors[m] + "' at byte offset " +
                              std::to_string(from + done) + ": " + std::strerror(errno));
        }
        if (got == 0) {
            throw io::IoError(path_ + ": reading expert " + std::to_string(e) + " of tensor 'blk." +
                              std::to_string(il) + "." + kExpertTensors[m] + "': the file ends at byte offset " +
                              std::to_string(from + done) + ", " + std::to_string(needed - done) +
                              " bytes short (truncated?)");
        }
        if (!f.direct) ::posix_fadvise(f.fd, static_cast<off_t>(from + done), got, POSIX_FADV_DONTNEED);
        done += static_cast<uint64_t>(got);
    }
    bytes_read_.fetch_add(done, std::memory_order_relaxed);
}

// Reads expert e of layer il into `slot` (claimed: owner set, not ready) and sets ptr_; outside
// mutex_ (the slot is the caller's until it is marked ready).
void ExpertCache::read_expert(File& f, int slot, int il, int e) {
    std::byte* region = base_ + static_cast<uint64_t>(slot) * slot_bytes_;
    const std::byte* ptr[3];
    for (int m = 0; m < 3; ++m) {
        const Slice& s = slices_[static_cast<size_t>(il) * 3 + static_cast<size_t>(m)];
        read(f, s, m, il, e, region);
        const uint64_t begin = s.offset + static_cast<uint64_t>(e) * s.bytes;
        ptr[m] = region + (begin - align_down(begin));
        region += region_bytes_[m];
    }
    std::lock_guard lock(mutex_);
    for (int m = 0; m < 3; ++m) ptr_[static_cast<size_t>(slot) * 3 + static_cast<size_t>(m)] = ptr[m];
}

int ExpertCache::victim() const {
    int best = -1;
    if (evict_ == ExpertEvict::lru) {
        for (int s = 0; s < n_slots_; ++s) {
            const auto i = static_cast<size_t>(s);
            if (owner_[i] < 0) return s;
            if (s == in_use_ || !ready_[i]) continue;
            if (best < 0 || last_use_[i] < last_use_[static_cast<size_t>(best)]) best = s;
        }
        return best;
    }
    // lfu: the fewest recent lookups, then the least recently used; an expert read ahead is spared
    // while the next layer may still want it (its lookups and read-aheads: a few n_used of ticks).
    const uint64_t spare_ticks = 4 * static_cast<uint64_t>(std::max(1, n_used_));
    bool best_spared = false;
    uint32_t best_count = 0;
    for (int s = 0; s < n_slots_; ++s) {
        const auto i = static_cast<size_t>(s);
        if (owner_[i] < 0) return s;
        if (s == in_use_ || !ready_[i]) continue;
        const bool spared = ahead_[i] && tick_ - last_use_[i] <= spare_ticks;
        const uint32_t count = recent_[static_cast<size_t>(owner_[i])];
        if (best < 0 || spared < best_spared ||
            (spared == best_spared &&
             (count < best_count || (count == best_count && last_use_[i] < last_use_[static_cast<size_t>(best)])))) {
            best = s;
            best_spared = spared;
            best_count = count;
        }
    }
    return best;
}

void ExpertCache::prefetch(int il, const int32_t* experts, int n) {
    if (!reader_.joinable() || il < 0 || il >= n_layer_) return;
    {
        std::lock_guard lock(mutex_);
        for (int r = 0; r < n; ++r) {
            if (experts[r] < 0 || experts[r] >= n_expert_) continue;
            const int key = il * n_expert_ + experts[r];
            if (where_[static_cast<size_t>(key)] < 0) queue_.push_back(key);
        }
    }
    changed_.notify_all();
}

void ExpertCache::drain() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return queue_.empty() && !reading_; });
}

void ExpertCache::reader() {
    for (;;) {
        int key = -1, slot = -1;
        {
            std::unique_lock lock(mutex_);
            changed_.wait(lock, [&] { return stop_ || !queue_.empty(); });
            if (stop_) return;
            key = queue_.front();
            queue_.pop_front();
            if (queue_.empty()) changed_.notify_all();            // (drain() waits for it)
            if (where_[static_cast<size_t>(key)] >= 0) continue;  // got or read meanwhile
            slot = victim();
            if (slot < 0) continue;  // every slot in use or being read: drop it
            const auto i = static_cast<size_t>(slot);
            if (owner_[i] >= 0) where_[static_cast<size_t>(owner_[i])] = -1;
            owner_[i] = key;
            where_[static_cast<size_t>(key)] = slot;
            ready_[i] = 0;
            ahead_[i] = 1;
            last_use_[i] = ++tick_;  // recent: the next layer is about to want it
            reading_ = true;
        }
        bool ok = true;
        try {
            read_expert(reader_file_, slot, key / n_expert_, key % n_expert_);
            prefetched_.fetch_add(1, std::memory_order_relaxed);
        } catch (...) {
            ok = false;  // get() reads it again and reports the error
        }
        {
            std::lock_guard lock(mutex_);
            reading_ = false;
            const auto i = static_cast<size_t>(slot);
            if (ok) {
                ready_[i] = 1;
            } else {
                where_[static_cast<size_t>(key)] = -1;
                owner_[i] = -1;
                ready_[i] = 1;
                ahead_[i] = 0;
            }
        }
        changed_.notify_all();
    }
}

ExpertCache::Expert ExpertCache::get(int il, int e) {
    if (il < 0 || il >= n_layer_ || e < 0 || e >= n_expert_) {
        throw std::invalid_argument("expert cache: no expert " + std::to_string(e) + " in layer " + std::to_string(il));
    }
    const int key = il * n_expert_ + e;
    std::unique_lock lock(mutex_);
    in_use_ = -1;  // the caller is done with the slot it got last
    ++chosen_[static_cast<size_t>(key)];
    if (uint32_t& r = recent_[static_cast<size_t>(key)]; r < UINT32_MAX) ++r;
    if (++since_aged_ >= age_period_) {
        since_aged_ = 0;
        for (uint32_t& r : recent_) r >>= 1;
    }
    int slot = where_[static_cast<size_t>(key)];
    if (slot >= 0) {  // in a slot, or being read ahead: wait for it
        changed_.wait(lock, [&] {
            const int s = where_[static_cast<size_t>(key)];
            return s < 0 || ready_[static_cast<size_t>(s)];
        });
        slot = where_[static_cast<size_t>(key)];
    }
    if (slot >= 0) {
        hits_.fetch_add(1, std::memory_order_relaxed);
        if (ahead_[static_cast<size_t>(slot)]) {
            prefetch_used_.fetch_add(1, std::memory_order_relaxed);
            ahead_[static_cast<size_t>(slot)] = 0;
        }
    } else {
        misses_.fetch_add(1, std::memory_order_relaxed);
        changed_.wait(lock, [&] { return victim() >= 0; });  // (only while the reader holds every other slot)
        slot = victim();
        const auto i = static_cast<size_t>(slot);
        if (owner_[i] >= 0) where_[static_cast<size_t>(owner_[i])] = -1;
        owner_[i] = key;
        where_[static_cast<size_t>(key)] = slot;
        ready_[i] = 0;
        ahead_[i] = 0;
        in_use_ = slot;  // (the reader leaves it alone while it is read)
        lock.unlock();
        try {
            read_expert(file_, slot, il, e);
        } catch (...) {
            lock.lock();
            where_[static_cast<size_t>(key)] = -1;
            owner_[i] = -1;
            ready_[i] = 1;
            changed_.notify_all();
            throw;
        }
        lock.lock();
        ready_[i] = 1;
        changed_.notify_all();
    }
    const auto i = static_cast<size_t>(slot);
    in_use_ = slot;
    last_use_[i] = ++tick_;
    return {ptr_[i * 3], ptr_[i * 3 + 1], ptr_[i * 3 + 2]};
}

std::string expert_cache_text(const ExpertCacheStats& x) {
    char rate[32];
    std::snprintf(rate, sizeof rate, "%.1f%%", 100.0 * x.hit_rate());
    char share[32];
    std::snprintf(share, sizeof share, "%.1f%%", 100.0 * x.top_fifth_share);
    return "expert cache: " + std::to_string(x.n_slots) + " slots, " + std::to_string(x.hits) + " hits, " +
           std::to_string(x.misses) + " misses (hit rate " + rate + "), " + util::human_bytes(x.bytes_read) +
           " read, " + util::human_bytes(static_cast<uint64_t>(x.bytes_per_token())) + " per token" +
           (x.prefetched > 0
                ? ", " + std::to_string(x.prefetched) + " read ahead (" + std::to_string(x.prefetch_used) + " used)"
                : std::string()) +
           (x.direct_io ? " (O_DIRECT)" : " (buffered reads: O_DIRECT refused here)") + ", " +
           std::string(expert_evict_name(x.evict)) + " eviction; routing: each layer's busiest fifth of experts took " +
           share + " of the lookups";
}

}  // namespace fitllm::model
