#pragma once
// fitllm::io — model files as read-only byte spans, with the knobs the memory budget needs:
// advice to the kernel, giving ranges back, asking what is resident, and pinning what must stay.
//
// The implementation is behind a pimpl so that a platform file (mapped_file_posix.cpp today,
// a Windows one later) can be swapped without callers or this header seeing OS headers.
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "fitllm/error.h"

namespace fitllm::io {

// Every failure names the path, the byte range when there is one, and the OS error text or
// the numbers that were compared.
class IoError : public fitllm::Error {
public:
    using Error::Error;
};

struct MapOptions {
    // Fault the whole file in while mapping (MAP_POPULATE), so the first pass runs at memory speed.
    bool populate = false;
    // false: read the whole file into anonymous memory owned by fitllm instead of mapping it.
    // Costs a copy and RSS, but the bytes no longer depend on the file or the page cache.
    bool use_mmap = true;
};

enum class Advice { normal, willneed, sequential, random, dontneed };

// A file's bytes, mapped read-only (or copied, see MapOptions::use_mmap). Move-only.
// Ranges are [offset, offset + length) in file bytes; a range that passes the end of the file
// throws IoError, and a zero-length range is a no-op. A moved-from MappedFile may only be
// destroyed or assigned to.
//
// In mmap mode the file must not be truncated while mapped: touching a page past the new end
// raises SIGBUS, which no library can turn into an exception.
class MappedFile {
public:
    // Throws IoError for a missing or unreadable file, a directory or other non-regular file.
    // An empty file is fine: size() == 0 and bytes() is empty.
    static MappedFile open(const std::string& path, MapOptions options = {});

    MappedFile(MappedFile&&) noexcept;
    MappedFile& operator=(MappedFile&&) noexcept;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    ~MappedFile();  // unlocks and unmaps

    const std::string& path() const;
    std::size_t size() const;
    std::span<const std::byte> bytes() const;  // the whole file
    bool is_file_mapping() const;              // false when the file was read into memory
    static std::size_t page_size();

    // Hint the kernel about the pages touching the range (rounded outward) and the file range.
    // For a copied file (no mmap) only the memory hints apply, and dontneed is ignored there
    // because on anonymous memory it would destroy the content; use release() for that.
    void advise(std::size_t offset, std::size_t length, Advice advice);

    // Give back the whole pages inside the range (rounded inward; a range that ends at the end
    // of the file also covers the file's last, partial page). In mmap mode the pages leave this
    // process and the file's page cache is asked to drop them too; reading them again faults
    // them back in from the file. For a copied file the memory is freed and the CONTENT OF A
    // RELEASED RANGE IS LOST: it must not be read again. Returns the bytes given back.
    // Throws if the range overlaps pages locked by lock().
    std::size_t release(std::size_t offset, std::size_t length);

    // Bytes of the range whose pages are resident (mincore), page granular, clipped to the range.
    std::size_t resident_bytes(std::size_t offset, std::size_t length) const;

    // Pin the pages touching the range in RAM. Checked first against RLIMIT_MEMLOCK (soft limit)
    // using what the whole process already has locked, even for root, who the kernel would let
    // through: the budget is ours to honour. Over the limit throws IoError with the numbers and
    // locks nothing. Locking is per page: unlock() unpins every page touching its range, even
    // one that an earlier lock() reached from a neighbouring range.
    void lock(std::size_t offset, std::size_t length);
    void unlock(std::size_t offset, std::size_t length);
    std::size_t locked_bytes() const;  // bytes this MappedFile holds locked, page-rounded

private:
    struct Impl;
    explicit MappedFile(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace fitllm::io
