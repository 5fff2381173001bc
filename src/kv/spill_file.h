#pragma once
// The file that holds spilled K/V (docs/architecture.md, idea 5): an anonymous file in a directory on disk,
// its blocks reserved up front, mapped shared so the cache reads and writes it like memory, and
// ranges of it sent to disk and out of memory on request (kv::KvCache decides which; see
// kv/cache.h, "Spill").
//
//   kv::SpillFile file("/var/tmp", bytes);             // or SpillError naming the directory
//   std::byte* p = file.data();                        // zeros until written
//   file.prefetch(offset, length);                     // read ahead, asynchronously
//   file.release(offset, length);                      // write back, then drop from memory
//
// Nothing is left behind: the file has no name (O_TMPFILE, or a name unlinked at once), so the
// kernel frees its blocks when the mapping goes, even when the process is killed.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fitllm/error.h"

namespace fitllm::kv {

// The spill file could not be made: the directory is missing, not writable, on tmpfs (memory,
// so spilling there saves nothing), or without room for the bytes. Says which and the numbers.
class SpillError : public Error {
public:
    using Error::Error;
};

class SpillFile {
public:
    // Creates the file in dir with `bytes` reserved on disk (posix_fallocate, so writing through
    // the mapping cannot fail for want of space later) and maps it. Checks the free space first
    // (statvfs). Throws SpillError.
    SpillFile(const std::string& dir, uint64_t bytes);
    SpillFile(const SpillFile&) = delete;
    SpillFile& operator=(const SpillFile&) = delete;
    ~SpillFile();

    std::byte* data() const { return data_; }
    uint64_t size() const { return size_; }
    const std::string& dir() const { return dir_; }
    static uint64_t page_size();

    // Asks the kernel to read [offset, offset + length) into the page cache now (MADV_WILLNEED),
    // without waiting. Ranges are widened to whole pages and clipped to the file.
    void prefetch(uint64_t offset, uint64_t length) const;
    // Takes [offset, offset + length) out of memory: unmaps its pages from this process
    // (MADV_DONTNEED; the data stays in the file), writes the dirty ones to disk and waits
    // (sync_file_range), then drops them from the page cache (POSIX_FADV_DONTNEED), so the
    // memory charged to the process (and its cgroup) shrinks. The next access reads them back.
    // Throws SpillError when the write-back fails (the data would be lost with the pages).
    void release(uint64_t offset, uint64_t length) const;

private:
    std::string dir_;
    int fd_ = -1;
    std::byte* data_ = nullptr;
    uint64_t size_ = 0;
};

}  // namespace fitllm::kv
