#include "model/layer_stream.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "io/mapped_file.h"
#include "model/hparams.h"
#include "util/text.h"

namespace fitllm::model {
namespace {

// Tensors of one layer closer than this are read as one run: reading the gap costs less than
// another request.
constexpr uint64_t kMergeGap = uint64_t{1} << 20;
// One pread at most this long: buffered reads drop their page cache after each one, so the
// cache a layer leaves behind stays this small.
constexpr uint64_t kReadChunk = uint64_t{8} << 20;

uint64_t align_down(uint64_t x) {
    return x / kStreamAlign * kStreamAlign;
}
uint64_t align_up(uint64_t x) {
    return (x + kStreamAlign - 1) / kStreamAlign * kStreamAlign;
}

}  // namespace

LayerStream::LayerReads LayerStream::plan_layer(const gguf::GgufFile& file, int il) {
    const std::string prefix = "blk." + std::to_string(il) + ".";
    struct Piece {
        uint64_t offset, end;
        std::string name;
    };
    std::vector<Piece> pieces;
    for (const gguf::TensorInfo& t : file.tensors()) {
        if (t.name.substr(0, prefix.size()) != prefix || t.n_bytes == 0) continue;
        const uint64_t offset = file.data_offset() + t.offset;
        pieces.push_back({offset, offset + t.n_bytes, std::string(t.name)});
    }
    if (pieces.empty()) throw ModelError(file.source() + ": no tensors named '" + prefix + "*' to stream");
    std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.offset < b.offset; });

    LayerReads layer;
    Extent e;
    const auto close = [&] {
        e.offset = align_down(e.offset);
        e.length = align_up(e.needed_end) - e.offset;
        e.buffer_offset = layer.buffer_bytes;
        layer.buffer_bytes += e.length;
        layer.extents.push_back(std::move(e));
        e = Extent{};
    };
    for (Piece& p : pieces) {
        if (!e.tensors.empty() && p.offset > e.needed_end + kMergeGap) close();
        if (e.tensors.empty()) e.offset = p.offset;
        e.needed_end = std::max(e.needed_end, p.end);
        e.tensors.emplace_back(p.offset, std::move(p.name));
    }
    close();
    return layer;
}

uint64_t stream_buffer_bytes(const gguf::GgufFile& file, int il) {
    return LayerStream::plan_layer(file, il).buffer_bytes + kStreamAlign;
}

uint64_t stream_staging_bytes(const gguf::GgufFile& file, int first_layer, int n_layer) {
    uint64_t largest = 0;
    for (int il = first_layer; il < n_layer; ++il) largest = std::max(largest, stream_buffer_bytes(file, il));
    return largest == 0 ? 0 : kStreamBuffers * memory::PoolBuffer<std::byte>::bytes_for(largest);
}

LayerStream::LayerStream(const gguf::GgufFile& file, int first_layer, int n_layer, memory::Pool& staging,
                         bool direct_io)
    : first_layer_(first_layer), n_layer_(n_layer) {
    if (first_layer < 0 || first_layer >= n_layer) {
        throw std::invalid_argument(file.source() + ": cannot stream layers " + std::to_string(first_layer) + ".." +
                                    std::to_string(n_layer - 1));
    }
    if (file.mapping() == nullptr) {
        throw ModelError(file.source() + ": streaming layers needs a model opened from a file (GgufFile::open)");
    }
    path_ = file.mapping()->path();
    map_base_ = file.bytes().data();
    uint64_t largest = 0;
    for (int il = first_layer; il < n_layer; ++il) {
        layers_.push_back(plan_layer(file, il));
        largest = std::max(largest, layers_.back().buffer_bytes + kStreamAlign);
    }
    const std::string what = "stream buffer for layers " + std::to_string(first_layer) + ".." +
                             std::to_string(n_layer - 1) + " of " + file.source();
    for (int s = 0; s < kStreamBuffers; ++s) {
        buffers_.emplace_back(staging, static_cast<size_t>(largest), what);
        const auto address = reinterpret_cast<uintptr_t>(buffers_.back().data());
        slots_.push_back(buffers_.back().data() + (kStreamAlign - address % kStreamAlign) % kStreamAlign);
    }
    leased_.assign(kStreamBuffers, false);
    span_begin_ = UINT64_MAX;
    for (const LayerReads& layer : layers_) {
        for (const Extent& e : layer.extents) {
            span_begin_ = std::min(span_begin_, e.offset);
            span_end_ = std::max(span_end_, e.offset + e.length);
        }
    }
    if (span_end_ == 0) span_begin_ = 0;
    open_file(direct_io);
    if (static_cast<uint64_t>(::lseek(fd_, 0, SEEK_END)) != file.size()) {
        ::close(fd_);
        throw io::IoError(path_ + ": the file changed size since it was mapped; cannot stream its layers");
    }
    thread_ = std::thread([this] { reader(); });
}

LayerStream::~LayerStream() {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
    if (fd_ >= 0) ::close(fd_);
}

void LayerStream::open_file(bool direct) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    direct_ = false;
    if (direct) {
        fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
        direct_ = fd_ >= 0;
    }
    if (fd_ < 0) fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw io::IoError(path_ + ": cannot open to stream layers: " + std::strerror(errno));
    // No read-ahead for buffered reads: the reads are large already, and pages the kernel reads
    // ahead (still under I/O when we drop what we read) would stay cached and charged to us.
    if (!direct_) ::posix_fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);
}

void LayerStream::reader() {
    const uint64_t n = layers_.size();
    for (;;) {
        uint64_t seq;
        int slot;
        {
            std::unique_lock lock(mutex_);
            seq = next_read_;
            slot = static_cast<int>(seq % kStreamBuffers);
            // The slot is free once the sequence before in it was taken and given back.
            changed_.wait(lock, [&] {
                return stop_ || (next_acquire_ + kStreamBuffers > seq && !leased_[static_cast<size_t>(slot)]);
            });
            if (stop_) return;
        }
        try {
            read_layer(layers_[seq % n], slots_[static_cast<size_t>(slot)]);
            if (!direct_) {
                ::posix_fadvise(fd_, static_cast<off_t>(span_begin_), static_cast<off_t>(span_end_ - span_begin_),
                                POSIX_FADV_DONTNEED);
            }
        } catch (...) {
            std::lock_guard lock(mutex_);
            error_ = std::current_exception();
            changed_.notify_all();
            return;
        }
        std::lock_guard lock(mutex_);
        next_read_ = ready_ = seq + 1;
        changed_.notify_all();
    }
}

void LayerStream::read_layer(const LayerReads& layer, std::byte* buffer) {
    for (const Extent& e : layer.extents) {
        try {
            read_extent(e, buffer + e.buffer_offset);
        } catch (const io::IoError&) {
            if (!direct_) throw;
            // The filesystem took O_DIRECT at open but refuses these reads: read buffered.
            open_file(false);
            read_extent(e, buffer + e.buffer_offset);
        }
    }
}

void LayerStream::read_extent(const Extent& e, std::byte* buffer) {
    const auto fail = [&](uint64_t offset, const std::string& why) {
        auto t = std::upper_bound(e.tensors.begin(), e.tensors.end(), offset,
                                  [](uint64_t off, const auto& tensor) { return off < tensor.first; });
        const std::string tensor = t == e.tensors.begin() ? e.tensors.front().second : std::prev(t)->second;
        throw io::IoError(path_ + ": reading streamed tensor '" + tensor + "' at byte offset " +
                          std::to_string(offset) + ": " + why);
    };
    uint64_t done = 0;
    const uint64_t needed = e.needed_end - e.offset;
    while (done < needed) {
        const uint64_t want = std::min(kReadChunk, e.length - done);
        const ssize_t got = ::pread(fd_, buffer + done, want, static_cast<off_t>(e.offset + done));
        if (got < 0) {
            if (errno == EINTR) continue;
            fail(e.offset + done, std::strerror(errno));
        }
        if (got == 0) {
            fail(e.offset + done, "the file ends there, " + std::to_string(e.needed_end - (e.offset + done)) +
                                      " bytes short of the tensor data (truncated?)");
        }
        if (!direct_) ::posix_fadvise(fd_, static_cast<off_t>(e.offset + done), got, POSIX_FADV_DONTNEED);
        done += static_cast<uint64_t>(got);
        std::lock_guard lock(mutex_);
        bytes_read_ += static_cast<uint64_t>(got);
    }
}

LayerStream::Lease LayerStream::acquire(int il) {
    if (il < first_layer_ || il >= n_layer_) {
        throw std::invalid_argument("layer " + std::to_string(il) + " is not streamed (layers " +
                                    std::to_string(first_layer_) + ".." + std::to_string(n_layer_ - 1) + " are)");
    }
    const uint64_t n = layers_.size();
    std::unique_lock lock(mutex_);
    for (;;) {
        const uint64_t seq = next_acquire_;
        const auto slot = static_cast<size_t>(seq % kStreamBuffers);
        if (leased_[slot]) throw std::logic_error("LayerStream: every stream buffer is leased");
        changed_.wait(lock, [&] { return ready_ > seq || error_; });
        if (ready_ <= seq) std::rethrow_exception(error_);
        ++next_acquire_;
        const int layer = first_layer_ + static_cast<int>(seq % n);
        if (layer == il) {
            leased_[slot] = true;
            return Lease(this, layer, static_cast<int>(slot), slots_[slot]);
        }
        // The last pass stopped before this layer (an exception); skip ahead to il.
        changed_.notify_all();
    }
}

void LayerStream::release(int slot) noexcept {
    {
        std::lock_guard lock(mutex_);
        leased_[static_cast<size_t>(slot)] = false;
    }
    changed_.notify_all();
}

std::vector<FileRange> LayerStream::ranges() const {
    std::vector<FileRange> out;
    for (const LayerReads& layer : layers_) {
        for (const Extent& e : layer.extents) {
            const uint64_t begin = e.tensors.front().first;
            if (!out.empty() && out.back().offset + out.back().length >= begin) {
                out.back().length = std::max(out.back().length, e.needed_end - out.back().offset);
            } else {
                out.push_back({begin, e.needed_end - begin});
            }
        }
    }
    std::sort(out.begin(), out.end(), [](const FileRange& a, const FileRange& b) { return a.offset < b.offset; });
    return out;
}

uint64_t LayerStream::staging_bytes() const {
    uint64_t total = 0;
    for (const auto& b : buffers_) total += b.charged_bytes();
    return total;
}

bool LayerStream::direct_io() const {
    return direct_;
}

uint64_t LayerStream::bytes_read() const {
    std::lock_guard lock(mutex_);
    return bytes_read_;
}

LayerStream::Lease& LayerStream::Lease::operator=(Lease&& o) noexcept {
    if (this != &o) {
        reset();
        stream_ = std::exchange(o.stream_, nullptr);
        layer_ = o.layer_;
        slot_ = o.slot_;
        buffer_ = o.buffer_;
    }
    return *this;
}

void LayerStream::Lease::reset() noexcept {
    if (stream_) stream_->release(slot_);
    stream_ = nullptr;
}

const void* LayerStream::Lease::translate_bytes(const void* mapped) const {
    if (mapped == nullptr || stream_ == nullptr) return mapped;
    const auto* p = static_cast<const std::byte*>(mapped);
    if (p < stream_->map_base_) return mapped;
    const auto offset = static_cast<uint64_t>(p - stream_->map_base_);
    for (const Extent& e : stream_->layers_[static_cast<size_t>(layer_ - stream_->first_layer_)].extents) {
        if (offset >= e.offset && offset < e.needed_end) return buffer_ + e.buffer_offset + (offset - e.offset);
    }
    return mapped;
}

}  // namespace fitllm::model
