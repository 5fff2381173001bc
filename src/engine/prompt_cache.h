#pragma once
// The scheduler's prompt cache (engine/scheduler.h), in three tiers: prompts kept in the KV cache
// (the cells of a sequence id of their own), their rows copied to host memory when the KV cache
// evicts them (ContextConfig::prompt_cache_ram), and those written to files when host memory gives
// them up (ContextConfig::prompt_cache_disk). Only the scheduler thread calls it, except counters().
//
// Kept prompts: a request that ends leaves the cells of the tokens it fed under a sequence id of
// the cache's (n_seq .. n_seq + n_cached_prompts - 1), with the token list they hold. A prompt that
// another kept prompt extends is dropped. They give their cells back, least recently used first,
// whenever a request needs room (evict()), so they never hold more than the cache.
//
// Host memory: an evicted prompt's cells' rows in every pool, charged to the budget's
// "prompt_cache" pool, at most prompt_cache_ram bytes (least recently used go first). A request
// whose longest prefix is there, longer than anything in the KV cache, gets cells placed for it and
// the rows copied back, bit for bit, instead of computing them. Not with K/V in a device's memory,
// nor before the K transforms are fitted (kv::KvCache::rows_stable()).
//
// Disk: what host memory gives up goes to files (at most prompt_cache_disk bytes, least recently
// used deleted first) and comes back through host memory the same way. Their token lists stay in
// host memory (charged). Each file starts with a header: a format version, the identities of the
// model file and of the KV layout, the token list and the positions each pool kept, hashed, then
// the rows (hashed too, checked when read back). Written to a temporary name and renamed, so a
// reader never sees half a file; names are unique per process, so servers sharing a directory
// never write the same file. The writer holds an flock on the temporary file until it is renamed,
// and a cache's own directory (not persistent) is flocked while the cache lives; at the start, a
// temporary file or such a directory that no one holds and that is older than a few seconds was
// left by a process that died (killed mid-write) and is removed (a note says so).
//
// Persistent (a model identity given, prompt_cache_dir set, K/V rows on the host): the files are in
// prompt_cache_dir itself and outlive the cache. At its end, the prompts in the cells and in host
// memory are written there too; at its start, the files already there of the same model file and
// KV layout are indexed, newest first, within prompt_cache_disk (older ones deleted), and the
// others skipped and counted: of another model, layout or format version (left alone), truncated
// or corrupt (left alone too). Otherwise the files are in a directory made for this cache under
// prompt_cache_dir (the system's temporary directory when empty), deleted with it.
//
// Shaped keys (a quantized K with the rotation: kv/key_transform.h) are stored as a K transform
// fitted from the first keys a run stores shapes them, so the transform goes with the files: one
// file per model file and KV layout, keys-ID.fitllm-keys (every layer's transform, hashed), written
// (to a temporary name, then linked: never replaced) before the first prompt file that needs it,
// and read at the start, before anything is stored, so that the run stores keys with that
// transform instead of fitting one. Each prompt file's layout identity then includes the
// transform's (a hash of its numbers). A transform file that is corrupt or of another model,
// layout or shape is named in a warning (a note) and deleted; prompt files written with a
// transform that is not the one read (or with none) are skipped and deleted. When the run cannot
// write its transform (another server wrote one first, or a write error), its files are deleted
// at its end instead of kept.
//
// A sliding-window pool holds only a window of each prompt, so a prefix is taken only where the
// window before it is still there.
//
//   PromptCache prompts(cache, context, pool_of(device, memory::pool_names::kPromptCache));
//   PromptCache::Prefix best = prompts.longest_kept(tokens, tokens.size() - 1);
//   prompts.consider(best, running_seq, running_fed, tokens, tokens.size() - 1);  // running ones too
//   int n = prompts.take(seq, tokens, tokens.size() - 1, best);  // seq's cells hold tokens[0 .. n)
//   ...
//   prompts.keep(seq, fed);  // when the request ends, before its cells are freed
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "fitllm/config.h"
#include "kv/cache.h"
#include "memory/pool.h"

namespace fitllm::gguf {
class GgufFile;
}

namespace fitllm::engine {

// An identity of a model file for the prompt cache's files (never 0): a hash of its size, its
// header (metadata and tensor table) and the first and last bytes of every tensor's data.
uint64_t model_file_identity(const gguf::GgufFile& file);
// An identity of the rows a cache's cells hold: per pool, per layer, the K and V types, heads,
// head sizes, rotation and row bytes, and the pool's window.
uint64_t kv_layout_identity(const kv::ModelCache& cache);

class PromptCache {
public:
    // The sequence ids context.n_seq .. context.n_seq + context.n_cached_prompts - 1 of cache are
    // its. context is the scheduler's (n_batch: the most positions placed at once when rows are
    // copied back). Host memory for rows and disk token lists is charged to ram_pool. model: the
    // model file's identity (model_file_identity(); 0: none, the files are not kept). With
    // prompt_cache_disk, makes its directory, or indexes the files of an earlier run (persistent);
    // throws ConfigError when it cannot.
    PromptCache(kv::ModelCache& cache, const ContextConfig& context, memory::Pool& ram_pool, uint64_t model = 0);
    // Persistent: writes the prompts in the cells and host memory to files; else deletes its files
    // and directory.
    ~PromptCache();
    bool persistent() const { return persistent_; }
    // What the start found in the directory: a line per file skipped (persistent) or removed as a
    // crashed process's leftover, at most kMaxNotes, then one saying how many more.
    const std::vector<std::string>& notes() const { return notes_; }
    PromptCache(const PromptCache&) = delete;
    PromptCache& operator=(const PromptCache&) = delete;

    // The cells of seq hold `fed` at positions 0 .. size - 1 (its request ends): they are kept
    // (shared, copy on write) unless a kept prompt holds them already; kept prompts they extend go.
    // Nothing without n_cached_prompts or with nothing fed.
    void keep(kv::SeqId seq, std::span<const int32_t> fed);

    // A prefix of a request's tokens that cells hold: seq's first n. kept: the kept prompt's index
    // (kNone: a running sequence's, or none).
    static constexpr size_t kNone = std::numeric_limits<size_t>::max();
    struct Prefix {
        kv::SeqId seq = -1;
        size_t n = 0;
        size_t kept = kNone;
    };
    // Of the kept prompts, the one giving `tokens` the longest prefix (at most `most` tokens).
    Prefix longest_kept(std::span<const int32_t> tokens, size_t most) const;
    // Whether the cells of seq, holding `held` at positions 0 .., give `tokens` a longer prefix
    // than best (at most `most`); if so, best becomes it (kept: kNone).
    bool consider(Prefix& best, kv::SeqId seq, std::span<const int32_t> held, std::span<const int32_t> tokens,
                  size_t most) const;
    // Gives seq (with no cells) the longest prefix of `tokens` there is, at most `most`: copied back
    // from host memory or disk when one there is longer than best, else best's cells shared. Returns
    // how many tokens seq's cells now hold.
    int take(kv::SeqId seq, std::span<const int32_t> tokens, size_t most, const Prefix& best);

    // Drops the least recently used kept prompt (to host memory when it can); false when none is kept.
    bool evict();

    // What it holds now (scheduler thread).
    struct Holdings {
        int n_kept = 0;
        int kept_tokens = 0;  // summed (a prefix two of them share counts twice)
        int n_saved = 0;      // in host memory
        uint64_t saved_bytes = 0;
        int n_disk = 0;  // in files
        uint64_t disk_bytes = 0;
    };
    Holdings holdings() const;
    // Events so far (any thread).
    struct Counters {
        uint64_t n_evictions = 0;      // kept prompts dropped for room
        uint64_t n_restores = 0;       // prompts copied back from host memory into cells
        uint64_t n_disk_reads = 0;     // read back from files into host memory
        uint64_t n_disk_failures = 0;  // writes or reads that failed (the prompt dropped)
        // Persistent, at the start: files of an earlier run indexed; skipped as another model's,
        // KV layout's or format version's; skipped as truncated or corrupt.
        uint64_t n_disk_loaded = 0, n_disk_foreign = 0, n_disk_bad = 0;
    };
    Counters counters() const;

private:
    struct Kept {
        kv::SeqId seq = -1;
        std::vector<int32_t> tokens;  // the cells hold these at positions 0 .. size - 1
        uint64_t last_used = 0;
    };
    struct Saved {
        std::vector<int32_t> tokens;               // positions 0 .. size - 1
        std::vector<std::vector<kv::Pos>> places;  // per pool: the positions saved, ascending
        memory::PoolBuffer<std::byte> rows;        // per pool in turn, each position's cell_bytes()
        uint64_t last_used = 0;
    };
    // A file's fixed header (prompt_cache.cpp); the pools' place counts, the tokens and the places
    // follow (int32 each), then the rows.
    struct FileHead {
        char magic[8];
        uint32_t version;
        uint32_t n_pools;
        uint64_t model;   // model_file_identity()
        uint64_t layout;  // kv_layout_identity(), and with shaped keys the K transform's identity
        uint32_t n_tokens;
        uint32_t reserved;  // shaped keys: a tag of kv_layout_identity() alone (prompt_cache.cpp); else 0
        uint64_t rows_bytes;
        uint64_t rows_hash;
        uint64_t index_hash;  // of this header (index_hash 0) and what follows up to the rows
    };
    static_assert(sizeof(FileHead) == 64);
    struct OnDisk {
        std::vector<int32_t> tokens;
        std::vector<std::vector<kv::Pos>> places;
        std::string path;
        FileHead head{};
        uint64_t bytes = 0;        // the file's (charged to prompt_cache_disk)
        uint64_t rows_offset = 0;  // where its rows start
        uint64_t index_bytes = 0;  // of tokens and places, in host memory
        uint64_t last_used = 0;
        memory::Charge tokens_charge;  // tokens and places, in host memory
    };
    void make_dir();   // the directory of a cache that is not persistent (locked while it lives)
    void index_dir();  // persistent: the files an earlier run left
    // What crashed processes left under `dir`: their temporary files (a write that did not finish)
    // and, with `dirs`, the directories of caches that are not persistent (with their files).
    // Removed only when no live process holds their lock (flock) and they are older than a few
    // seconds; each one removed is a note.
    void remove_stale(const std::string& dir, bool dirs);
    void note(const std::string& line);
    void persist();  // persistent: the prompts in the cells and host memory to files
    // A file's header checked against this cache (nothing read past `size` bytes); empty when it is
    // this cache's, else why not (foreign: another model, layout or version, or longer than the context).
    // stale: of this model and layout, but its keys shaped by a K transform this run does not use.
    std::string check_head(const FileHead& h, uint64_t size, bool& foreign, bool& stale) const;
    // Shaped keys (persistent): the K transform file (engine/key_transform_file.h). load_keys() at
    // the start gives the pools the transforms it holds (or warns and deletes it); ensure_keys()
    // before a prompt file is written takes this run's transforms' identity and writes them once
    // when none was read.
    void load_keys();
    void ensure_keys();
    uint64_t file_layout() const;  // the layout identity prompt files are written with
    // Reads a checked file's place counts, tokens and places into d (tokens, places, head, bytes,
    // rows_offset); empty when they hold together, else why not.
    std::string read_index(int fd, OnDisk& d) const;
    void save(const Kept& c);  // into host memory, when there is room for it
    void drop_saved(size_t i);
    void give_up_saved(size_t i);  // host memory's: to disk with --cache-disk, else dropped
    // Host memory for `charged` bytes of rows: the least recently used saved prompts given up until
    // they fit ContextConfig::prompt_cache_ram. False when they cannot.
    bool make_room_in_host_memory(uint64_t charged);
    void write_disk(Saved sp);  // when the disk has room for it (else dropped)
    void drop_disk(size_t i);
    // Into host memory; the entry (and its file) is gone, unless `keep` and it was read.
    bool read_disk(size_t i, Saved& out, bool keep);
    int restore(kv::SeqId seq, const Saved& saved, int n);  // its first n tokens into seq's cells

    kv::ModelCache& cache_;
    ContextConfig context_;
    memory::Pool& ram_pool_;
    std::vector<Kept> kept_;
    std::vector<kv::SeqId> free_ids_;  // n_seq .. n_seq + n_cached_prompts - 1
    std::vector<Saved> saved_;
    uint64_t saved_bytes_ = 0;
    std::vector<OnDisk> disk_;
    uint64_t disk_bytes_ = 0;
    uint64_t disk_index_bytes_ = 0;  // at most prompt_cache_disk / ContextConfig::kPromptCacheDiskIndexShare
    std::string disk_dir_;           // persistent: prompt_cache_dir; else made for this cache under it
    int dir_lock_ = -1;              // not persistent: disk_dir_ open and flocked while the cache lives
    size_t n_notes_left_out_ = 0;
    std::string file_prefix_;  // disk_dir_ + "/prompt-" + a random tag of this cache's
    uint64_t disk_serial_ = 0;
    uint64_t model_ = 0, layout_ = 0;
    bool persistent_ = false;
    bool shaped_ = false;        // persistent, and some pool shapes K: the transform file goes along
    std::string keys_path_;      // that file
    uint64_t keys_key_ = 0;      // its name's identity: the model, the KV layout, the pools' limits
    uint64_t keys_id_ = 0;       // the identity of the transforms in use (0: not known yet)
    bool keys_on_disk_ = false;  // keys_path_ holds them: the files outlive this cache
    bool keys_write_tried_ = false;
    std::vector<std::string> notes_;
    uint64_t clock_ = 0;
    std::atomic<uint64_t> n_evictions_{0}, n_restores_{0}, n_disk_reads_{0}, n_disk_failures_{0};
    uint64_t n_disk_loaded_ = 0, n_disk_foreign_ = 0, n_disk_bad_ = 0;  // set by the constructor
};

}  // namespace fitllm::engine
