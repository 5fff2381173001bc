#include "kv/spill_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

namespace fitllm::kv {
namespace {

constexpr long kTmpfsMagic = 0x01021994;  // TMPFS_MAGIC from linux/magic.h

std::string mib(uint64_t bytes) {
    return std::to_string((bytes + (1u << 19)) >> 20) + " MiB";
}

[[noreturn]] void fail(const std::string& dir, const std::string& what, int err = 0) {
    std::string msg = "KV spill directory '" + dir + "': " + what;
    if (err != 0) msg += std::string(": ") + std::strerror(err);
    throw SpillError(msg);
}

// An open file in dir that no name points to.
int anonymous_file(const std::string& dir) {
    int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) return fd;
    const int err = errno;
    if (err != EOPNOTSUPP && err != EISDIR && err != EINVAL) fail(dir, "cannot create a file there", err);
    // The file system has no O_TMPFILE: a named file, unlinked before anything else happens.
    std::string path = dir + "/fitllm-kv-XXXXXX";
    fd = ::mkostemp(path.data(), O_CLOEXEC);
    if (fd < 0) fail(dir, "cannot create a file there", errno);
    ::unlink(path.c_str());
    return fd;
}

}  // namespace

uint64_t SpillFile::page_size() {
    static const uint64_t size = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    return size;
}

SpillFile::SpillFile(const std::string& dir, uint64_t bytes) : dir_(dir), size_(bytes) {
    if (dir.empty()) throw SpillError("KV spill: no directory given");
    if (bytes == 0) fail(dir, "a spill file of 0 bytes");
    struct statfs fs {};
    if (::statfs(dir.c_str(), &fs) != 0) fail(dir, "cannot use it", errno);
    if (static_cast<long>(fs.f_type) == kTmpfsMagic) {
        fail(dir, "is on tmpfs, which is memory: spilling there saves none (pick a directory on disk)");
    }
    struct statvfs vfs {};
    if (::statvfs(dir.c_str(), &vfs) != 0) fail(dir, "cannot use it", errno);
    const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * static_cast<uint64_t>(vfs.f_frsize);
    if (free_bytes < bytes) fail(dir, "has " + mib(free_bytes) + " free, the KV spill file needs " + mib(bytes));

    fd_ = anonymous_file(dir);
    // Reserve the blocks now (unwritten extents read as zeros), so a full disk is this error
    // and not a SIGBUS when a page is written back later.
    if (const int err = ::posix_fallocate(fd_, 0, static_cast<off_t>(bytes)); err != 0) {
        ::close(fd_);
        fail(dir, "cannot reserve " + mib(bytes) + " for the KV spill file", err);
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd_);
        fail(dir, "cannot map the KV spill file of " + mib(bytes), err);
    }
    data_ = static_cast<std::byte*>(p);
}

SpillFile::~SpillFile() {
    if (data_ != nullptr) ::munmap(data_, size_);
    if (fd_ >= 0) ::close(fd_);
}

namespace {

// [offset, offset + length) widened to whole pages and clipped to size; empty when outside.
struct PageRange {
    uint64_t begin = 0, end = 0;
    PageRange(uint64_t offset, uint64_t length, uint64_t size, uint64_t page) {
        if (offset >= size || length == 0) return;
        begin = offset / page * page;
        end = std::min(size, (std::min(size, offset + length) + page - 1) / page * page);
    }
    bool empty() const { return end <= begin; }
    uint64_t length() const { return end - begin; }
};

}  // namespace

void SpillFile::prefetch(uint64_t offset, uint64_t length) const {
    const PageRange r(offset, length, size_, page_size());
    if (r.empty()) return;
    // Advice only: a failure leaves the pages to come in on first touch.
    ::madvise(data_ + r.begin, r.length(), MADV_WILLNEED);
}

void SpillFile::release(uint64_t offset, uint64_t length) const {
    const PageRange r(offset, length, size_, page_size());
    if (r.empty()) return;
    // Unmapped first: the page cache only drops pages no one maps. Unmapping moves the dirty
    // bits from the page tables to the pages, so the write-back below sees every write.
    ::madvise(data_ + r.begin, r.length(), MADV_DONTNEED);
    const auto off = static_cast<off_t>(r.begin);
    const auto len = static_cast<off_t>(r.length());
    // A failed write-back leaves pages whose data may be gone once dropped: stop here instead.
    if (::sync_file_range(fd_, off, len,
                          SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER) != 0) {
        fail(dir_, "writing the KV spill file back failed", errno);
    }
    ::posix_fadvise(fd_, off, len, POSIX_FADV_DONTNEED);
}

}  // namespace fitllm::kv
