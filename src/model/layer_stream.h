#pragma once
// Streaming the last layers of a model from its file (docs/architecture.md, idea 5): when the weights do not
// fit, the first layers stay mapped and the last ones are read, layer by layer, into a few
// staging buffers by a background thread that reads ahead while the forward pass computes.
//
//   LayerStream stream(file, /*first_layer=*/16, /*n_layer=*/22, device.pool("staging"));
//   for (int il = 16; il < 22; ++il) {
//       LayerStream::Lease lease = stream.acquire(il);  // waits until layer il is in a buffer
//       const float* norm = lease.translate(mapped_norm_pointer);  // the same bytes, in the buffer
//       ...                                                        // compute; ~Lease frees it
//   }
//
// Streamed layers are never touched through the mapping: their bytes come from pread (O_DIRECT
// when the filesystem allows, else buffered reads whose page cache is dropped right after with
// POSIX_FADV_DONTNEED), so the page cache charged to the process stays small. The reader streams
// the layers in order, round and round: layer first..n_layer-1, then first again for the next
// forward pass, as far ahead as the free buffers allow.
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gguf/gguf_reader.h"
#include "memory/pool.h"
#include "model/model.h"

namespace fitllm::model {

// How many staging buffers a stream rotates through: one being computed, one being read. More
// let the reader run further ahead during the resident layers, but every buffer costs a layer
// that could have stayed resident. memory/plan.cpp's stream_buffer reads this.
inline constexpr int kStreamBuffers = 2;
// Reads are aligned to this (O_DIRECT needs the logical block size; 4096 covers 512 and 4096).
inline constexpr uint64_t kStreamAlign = 4096;

// The bytes one staging buffer needs for layer il of `file`: its tensors' file range (tensors
// named "blk.<il>.*"; ranges less than 1 MiB apart are read as one), widened to kStreamAlign at
// both ends, plus kStreamAlign for aligning the buffer itself. Throws ModelError when the file has
// no tensors for that layer.
uint64_t stream_buffer_bytes(const gguf::GgufFile& file, int il);
// What LayerStream charges to its pool for streaming layers [first_layer, n_layer):
// kStreamBuffers buffers of the largest stream_buffer_bytes() among them (0 when none).
uint64_t stream_staging_bytes(const gguf::GgufFile& file, int first_layer, int n_layer);

class LayerStream {
public:
    // Plans the reads of layers [first_layer, n_layer), charges kStreamBuffers buffers to
    // `staging` (memory::BudgetError before allocating when they do not fit), opens the file
    // behind `file` (which must come from GgufFile::open) and starts the reader. direct_io: try
    // O_DIRECT (falls back to buffered reads where the filesystem refuses it).
    LayerStream(const gguf::GgufFile& file, int first_layer, int n_layer, memory::Pool& staging, bool direct_io = true);
    ~LayerStream();  // stops the reader; no Lease may outlive the stream
    LayerStream(const LayerStream&) = delete;
    LayerStream& operator=(const LayerStream&) = delete;

    // One layer's bytes in a staging buffer, until the Lease goes. Move-only.
    class Lease {
    public:
        Lease() = default;
        Lease(Lease&& o) noexcept
            : stream_(std::exchange(o.stream_, nullptr)), layer_(o.layer_), slot_(o.slot_), buffer_(o.buffer_) {}
        Lease& operator=(Lease&& o) noexcept;
        ~Lease() { reset(); }
        explicit operator bool() const { return stream_ != nullptr; }

        // The buffer's copy of what `mapped` points at in the file's mapping (a pointer into this
        // layer's tensors; anything else is returned unchanged).
        template <class T>
        const T* translate(const T* mapped) const {
            return static_cast<const T*>(translate_bytes(mapped));
        }
        void reset() noexcept;

    private:
        friend class LayerStream;
        Lease(LayerStream* stream, int layer, int slot, const std::byte* buffer)
            : stream_(stream), layer_(layer), slot_(slot), buffer_(buffer) {}
        const void* translate_bytes(const void* mapped) const;
        LayerStream* stream_ = nullptr;
        int layer_ = 0, slot_ = 0;
        const std::byte* buffer_ = nullptr;
    };

    // Waits until layer il is in a buffer (reading layers the reader had queued before it, if the
    // last pass stopped early) and leases it. Throws io::IoError naming the file, the tensor and
    // the offset when reading it failed (short file, I/O error); the stream stays failed then.
    // std::invalid_argument for a layer that is not streamed; std::logic_error when every buffer
    // is already leased.
    Lease acquire(int il);

    int first_layer() const { return first_layer_; }
    int n_layer() const { return n_layer_; }
    // The streamed layers' tensor bytes in the file, in file order (merged where they touch).
    std::vector<FileRange> ranges() const;
    uint64_t staging_bytes() const;  // charged to the pool
    bool direct_io() const;          // whether reads bypass the page cache now
    uint64_t bytes_read() const;     // from the file so far, all layers and passes

private:
    friend uint64_t stream_buffer_bytes(const gguf::GgufFile& file, int il);
    // A run of a layer's tensors read with one pread loop: file bytes [offset, offset + length)
    // aligned to kStreamAlign, placed at buffer_offset; tensor bytes end at needed_end.
    struct Extent {
        uint64_t offset = 0, length = 0, buffer_offset = 0, needed_end = 0;
        std::vector<std::pair<uint64_t, std::string>> tensors;  // file offset, name: for errors
    };
    struct LayerReads {
        std::vector<Extent> extents;
        uint64_t buffer_bytes = 0;
    };
    static LayerReads plan_layer(const gguf::GgufFile& file, int il);

    void reader();
    void read_layer(const LayerReads& layer, std::byte* buffer);
    void read_extent(const Extent& e, std::byte* buffer);
    void open_file(bool direct);
    void release(int slot) noexcept;

    std::string path_;
    const std::byte* map_base_ = nullptr;
    int first_layer_ = 0, n_layer_ = 0;
    std::vector<LayerReads> layers_;  // index il - first_layer_
    // The file bytes all streamed layers span, dropped from the page cache after each layer read
    // buffered (a drop takes only the cached folios wholly inside its range: a large folio across
    // two extents or layers stays after each one's own drop).
    uint64_t span_begin_ = 0, span_end_ = 0;
    std::vector<memory::PoolBuffer<std::byte>> buffers_;
    std::vector<std::byte*> slots_;  // kStreamAlign-aligned starts inside buffers_
    int fd_ = -1;                    // used by the reader thread only, after the constructor
    std::atomic<bool> direct_ = false;

    mutable std::mutex mutex_;
    std::condition_variable changed_;
    uint64_t next_read_ = 0;     // sequence number the reader fills next (layer first + seq % n)
    uint64_t ready_ = 0;         // sequences [0, ready_) have been read
    uint64_t next_acquire_ = 0;  // sequence the next acquire() takes
    std::vector<bool> leased_;   // per slot
    std::exception_ptr error_;   // why sequence ready_ could not be read; the reader stopped
    uint64_t bytes_read_ = 0;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace fitllm::model
