#pragma once
// The expert cache (issue 21): a mixture-of-experts model whose dense part fits the budget but
// whose routed experts do not keeps the dense weights mapped and resident, and its experts in a
// fixed pool of slots charged to the device's "experts" pool, filled on demand. A miss reads
// that expert's three matrices (its slice of blk.<il>.ffn_{gate,up,down}_exps.weight, contiguous
// in each tensor) from the file with pread into the least recently used slot: O_DIRECT where the
// filesystem takes it (reads widened to kExpertAlign), else buffered reads whose page cache is
// dropped right after (POSIX_FADV_DONTNEED). The mapping of the expert tensors is never touched.
//
//   ExpertCache cache(file, hp, /*n_slots=*/64, device.pool("experts"));
//   ExpertCache::Expert x = cache.get(il, e);   // x.gate, x.up, x.down: the bytes of expert e
//
// A slot stays valid until the next get(): eviction (ExpertEvict) takes the least recently used
// slot (lru) or the one whose expert was looked up least often lately (lfu: a count per expert,
// kept while it has no slot too, all counts halved every kLfuAgeTokens tokens' worth of lookups;
// ties go to the least recently used), never the one got last nor one being read; lfu also
// spares an expert read ahead until the next layer had its chance to use it. prefetch() reads
// experts ahead on a thread of its own (the forward pass asks for the experts the next layer's
// router would choose from the current hidden state, while that layer's attention computes);
// get() waits for one being read. Whatever is prefetched, get() gives the same bytes: only hits
// and misses change. get() and prefetch() are for one thread (the forward pass); stats() may be
// read from any thread.
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gguf/gguf_reader.h"
#include "memory/pool.h"
#include "model/hparams.h"
#include "model/model.h"

namespace fitllm::model {

// Reads are aligned to this (O_DIRECT needs the logical block size; 4096 covers 512 and 4096).
inline constexpr uint64_t kExpertAlign = 4096;
// lfu: the lookup counts are halved after this many tokens' lookups (n_expert_used x n_layer each).
inline constexpr int kLfuAgeTokens = 32;
// "lru" or "lfu".
std::string_view expert_evict_name(ExpertEvict e);
// The share of the lookups that went to each layer's most looked-up fifth of its experts (at
// least one): counts[il * n_expert + e] the lookups of expert e of layer il. 0 without lookups.
double top_fifth_share(const std::vector<uint64_t>& counts, int n_layer, int n_expert);

// The three routed-expert tensors of layer il, in the order gate, up, down.
inline constexpr const char* kExpertTensors[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
// Whether a tensor name is one of a layer's routed-expert tensors ("blk.3.ffn_up_exps.weight").
bool is_expert_tensor(std::string_view name);

// The bytes one slot takes for `file`'s experts: for each of the three matrices, the largest one
// expert's slice of any layer rounded up to kExpertAlign, plus kExpertAlign (a slice that starts
// inside a block). Throws ModelError when a layer lacks an expert tensor or its size is not
// n_expert slices.
uint64_t expert_slot_bytes(const gguf::GgufFile& file, const Hparams& hp);
// The fewest slots a cache may have: n_expert_used x n_layer, one token's experts in every layer.
// With fewer, least-recently-used eviction throws each expert out before the next token can use
// it again (a decode reads the layers in the same order each token), so nothing would ever hit.
int min_expert_slots(const Hparams& hp);
// What ExpertCache charges for n slots: n slots and kExpertAlign for aligning the buffer.
uint64_t expert_cache_bytes(uint64_t slot_bytes, int n_slots);

// "expert cache: 96 slots, 1200 hits, 300 misses (hit rate 80.0%), 12.0 MiB read, 41.0 KiB per
// token (O_DIRECT)": what `fitllm run` prints (Engine::peak_summary) for a model with one.
std::string expert_cache_text(const ExpertCacheStats& x);

class ExpertCache {
public:
    // Charges the slots to `pool` (memory::BudgetError before allocating when they do not fit),
    // opens the file behind `file` (which must come from GgufFile::open). Throws
    // std::invalid_argument for fewer than min_expert_slots() slots or a model without experts.
    // prefetch: start the reader thread for prefetch() (false: prefetch() does nothing).
    ExpertCache(const gguf::GgufFile& file, const Hparams& hp, int n_slots, memory::Pool& pool, bool direct_io = true,
                bool prefetch = false, ExpertEvict evict = ExpertEvict::lru);
    ~ExpertCache();
    ExpertCache(const ExpertCache&) = delete;
    ExpertCache& operator=(const ExpertCache&) = delete;

    struct Expert {
        const std::byte* gate = nullptr;
        const std::byte* up = nullptr;
        const std::byte* down = nullptr;
    };
    // Expert e of layer il in a slot, read from the file on a miss. Throws io::IoError naming the
    // file, the tensor and the offset when the read fails.
    Expert get(int il, int e);
    // Queues reads of these experts of layer il that have no slot yet, for the reader thread
    // (dropped when every slot is in use or being read). Returns at once.
    void prefetch(int il, const int32_t* experts, int n);
    bool prefetching() const { return reader_.joinable(); }
    // Waits until the reader thread has no read queued or running (tests, benchmarks).
    void drain();
    // Counts tokens that went through the experts (for the bytes read per token).
    void count_tokens(int n) { tokens_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed); }

    int n_slots() const { return n_slots_; }
    uint64_t slot_bytes() const { return slot_bytes_; }
    // The expert tensors' file ranges: never touched through the mapping (engine::prefault skips them).
    std::vector<FileRange> ranges() const;
    ExpertCacheStats stats() const;

private:
    struct Slice {
        uint64_t offset = 0;  // in the file
        uint64_t bytes = 0;   // one expert's
    };
    // One open file: the forward pass's and the reader thread's each (a fallback from O_DIRECT
    // reopens only its own).
    struct File {
        int fd = -1;
        bool direct = false;
    };
    void read(File& f, const Slice& s, int m, int il, int e, std::byte* region);
    void read_expert(File& f, int slot, int il, int e);
    void open_file(File& f, bool direct);
    // The slot to fill: an empty one, else the least recently used that is neither the one got
    // last nor being read; -1 when there is none. Under mutex_.
    int victim() const;
    void reader();

    std::string path_;
    int n_layer_ = 0, n_expert_ = 0, n_used_ = 0, n_slots_ = 0;
    ExpertEvict evict_ = ExpertEvict::lru;
    std::vector<Slice> slices_;  // [il][3]: the tensors of layer il
    uint64_t region_bytes_[3] = {};
    uint64_t slot_bytes_ = 0;
    memory::PoolBuffer<std::byte> buffer_;
    std::byte* base_ = nullptr;          // kExpertAlign-aligned start in buffer_
    std::vector<int32_t> where_;         // [il * n_expert + e]: its slot, or -1
    std::vector<int32_t> owner_;         // [slot]: il * n_expert + e, or -1
    std::vector<uint64_t> last_use_;     // [slot]: the tick of its last get()
    std::vector<const std::byte*> ptr_;  // [slot * 3 + m]: the matrix's first byte in the slot
    std::vector<uint8_t> ready_;         // [slot]: its owner's bytes are in (0: being read)
    std::vector<uint8_t> ahead_;         // [slot]: read ahead by prefetch() and not got since
    std::vector<uint32_t> recent_;       // [il * n_expert + e]: lookups, halved every age_period_ (lfu)
    std::vector<uint64_t> chosen_;       // [il * n_expert + e]: all its lookups (top_fifth_share)
    uint64_t age_period_ = 0, since_aged_ = 0;
    int in_use_ = -1;  // the slot get() gave last
    uint64_t tick_ = 0;
    File file_, reader_file_;
    std::atomic<bool> direct_ = false;
    std::atomic<uint64_t> hits_ = 0, misses_ = 0, bytes_read_ = 0, tokens_ = 0, prefetched_ = 0, prefetch_used_ = 0;

    mutable std::mutex mutex_;  // guards where_, owner_, last_use_, ptr_, ready_, ahead_, recent_, chosen_,
                                // since_aged_, in_use_, tick_, queue_
    std::condition_variable changed_;
    std::deque<int32_t> queue_;  // keys to read ahead
    bool reading_ = false;       // the reader thread is reading one
    bool stop_ = false;
    std::thread reader_;
};

}  // namespace fitllm::model
