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
// A slot stays valid until the next get() that misses and evicts it: the least recently used,
// never the one got last while there are two slots or more. Not thread-safe (the forward pass
// calls it from its own thread); stats() may be read from any thread.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "memory/pool.h"
#include "model/hparams.h"
#include "model/model.h"

namespace fitllm::model {

// Reads are aligned to this (O_DIRECT needs the logical block size; 4096 covers 512 and 4096).
inline constexpr uint64_t kExpertAlign = 4096;

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
    ExpertCache(const gguf::GgufFile& file, const Hparams& hp, int n_slots, memory::Pool& pool, bool direct_io = true);
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
    void read(const Slice& s, int m, int il, int e, std::byte* region);
    void open_file(bool direct);

    std::string path_;
    int n_layer_ = 0, n_expert_ = 0, n_slots_ = 0;
    std::vector<Slice> slices_;  // [il][3]: the tensors of layer il
    uint64_t region_bytes_[3] = {};
    uint64_t slot_bytes_ = 0;
    memory::PoolBuffer<std::byte> buffer_;
    std::byte* base_ = nullptr;          // kExpertAlign-aligned start in buffer_
    std::vector<int32_t> where_;         // [il * n_expert + e]: its slot, or -1
    std::vector<int32_t> owner_;         // [slot]: il * n_expert + e, or -1
    std::vector<uint64_t> last_use_;     // [slot]: the tick of its last get()
    std::vector<const std::byte*> ptr_;  // [slot * 3 + m]: the matrix's first byte in the slot
    uint64_t tick_ = 0;
    int fd_ = -1;
    std::atomic<bool> direct_ = false;
    std::atomic<uint64_t> hits_ = 0, misses_ = 0, bytes_read_ = 0, tokens_ = 0;
};

}  // namespace fitllm::model
