// POSIX (with Linux extensions: MAP_POPULATE, /proc/self/status) implementation of MappedFile.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <fstream>
#include <limits>
#include <system_error>
#include <utility>
#include <vector>

#include "io/mapped_file.h"

namespace fitllm::io {
namespace {

struct ByteRange {
    std::size_t begin = 0;
    std::size_t end = 0;  // exclusive
};

std::string os_error_text(int err) {
    return std::system_category().message(err) + " (errno " + std::to_string(err) + ")";
}

std::string range_text(std::size_t offset, std::size_t length) {
    if (length > std::numeric_limits<std::size_t>::max() - offset) {
        return "range at offset " + std::to_string(offset) + " with length " + std::to_string(length) +
               " (offset + length overflows)";
    }
    return "bytes [" + std::to_string(offset) + ", " + std::to_string(offset + length) + ")";
}

std::size_t round_down(std::size_t x, std::size_t page) {
    return x / page * page;
}
std::size_t round_up(std::size_t x, std::size_t page) {
    return (x + page - 1) / page * page;
}

std::size_t overlap_bytes(const std::vector<ByteRange>& ranges, ByteRange r) {
    std::size_t total = 0;
    for (const ByteRange& x : ranges) {
        const std::size_t b = std::max(x.begin, r.begin);
        const std::size_t e = std::min(x.end, r.end);
        if (b < e) total += e - b;
    }
    return total;
}

// The parts of r that no range in `ranges` covers.
std::vector<ByteRange> uncovered_parts(const std::vector<ByteRange>& ranges, ByteRange r) {
    std::vector<ByteRange> parts;
    std::size_t cursor = r.begin;
    for (const ByteRange& x : ranges) {  // sorted and disjoint
        if (x.end <= cursor || x.begin >= r.end) continue;
        if (x.begin > cursor) parts.push_back({cursor, x.begin});
        cursor = std::max(cursor, x.end);
    }
    if (cursor < r.end) parts.push_back({cursor, r.end});
    return parts;
}

void add_range(std::vector<ByteRange>& ranges, ByteRange r) {
    ranges.push_back(r);
    std::sort(ranges.begin(), ranges.end(), [](ByteRange a, ByteRange b) { return a.begin < b.begin; });
    std::vector<ByteRange> merged;
    for (const ByteRange& x : ranges) {
        if (!merged.empty() && x.begin <= merged.back().end) {
            merged.back().end = std::max(merged.back().end, x.end);
        } else {
            merged.push_back(x);
        }
    }
    ranges = std::move(merged);
}

void remove_range(std::vector<ByteRange>& ranges, ByteRange r) {
    std::vector<ByteRange> kept;
    for (const ByteRange& x : ranges) {
        if (x.begin < r.begin) kept.push_back({x.begin, std::min(x.end, r.begin)});
        if (x.end > r.end) kept.push_back({std::max(x.begin, r.end), x.end});
    }
    ranges = std::move(kept);
}

// What the whole process has locked (mm->locked_vm), so the RLIMIT_MEMLOCK check sees locks made
// by other MappedFiles and other code too. 0 where /proc is not there to ask.
std::size_t process_locked_bytes() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("VmLck:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // "VmLck:  12 kB"
    }
    return 0;
}

int to_madvise(Advice advice) {
    switch (advice) {
        case Advice::normal:
            return MADV_NORMAL;
        case Advice::willneed:
            return MADV_WILLNEED;
        case Advice::sequential:
            return MADV_SEQUENTIAL;
        case Advice::random:
            return MADV_RANDOM;
        case Advice::dontneed:
            return MADV_DONTNEED;
    }
    return MADV_NORMAL;
}

int to_fadvise(Advice advice) {
    switch (advice) {
        case Advice::normal:
            return POSIX_FADV_NORMAL;
        case Advice::willneed:
            return POSIX_FADV_WILLNEED;
        case Advice::sequential:
            return POSIX_FADV_SEQUENTIAL;
        case Advice::random:
            return POSIX_FADV_RANDOM;
        case Advice::dontneed:
            return POSIX_FADV_DONTNEED;
    }
    return POSIX_FADV_NORMAL;
}

const char* advice_name(Advice advice) {
    switch (advice) {
        case Advice::normal:
            return "normal";
        case Advice::willneed:
            return "willneed";
        case Advice::sequential:
            return "sequential";
        case Advice::random:
            return "random";
        case Advice::dontneed:
            return "dontneed";
    }
    return "?";
}

}  // namespace

struct MappedFile::Impl {
    std::string path;
    int fd = -1;                // kept open in mmap mode: posix_fadvise needs it
    std::byte* base = nullptr;  // page aligned; null for an empty file
    std::size_t size = 0;
    bool file_mapping = true;
    std::vector<ByteRange> locked;  // sorted, disjoint, page-aligned offsets from base

    Impl() = default;
    Impl(const Impl&) = delete;
    Impl& operator=(const Impl&) = delete;

    ~Impl() {
        // Failures here cannot be reported and unmapping drops the locks anyway; the explicit
        // munlock keeps the order obvious when reading the code.
        for (const ByteRange& r : locked) munlock(base + r.begin, r.end - r.begin);
        if (base != nullptr) munmap(base, size);
        if (fd >= 0) close(fd);
    }

    [[noreturn]] void fail(const std::string& what) const { throw IoError("'" + path + "': " + what); }
    [[noreturn]] void fail_os(const std::string& what, int err) const { fail(what + ": " + os_error_text(err)); }

    void check_range(std::size_t offset, std::size_t length, const char* operation) const {
        if (offset > size || length > size - offset) {
            fail(std::string(operation) + " of " + range_text(offset, length) + " is past the end of the file (size " +
                 std::to_string(size) + " bytes)");
        }
    }

    // Pages touching [offset, offset + length), as offsets from base.
    ByteRange pages_touching(std::size_t offset, std::size_t length) const {
        const std::size_t page = page_size();
        return {round_down(offset, page), round_up(offset + length, page)};
    }

    void read_all() {
        std::size_t done = 0;
        while (done < size) {
            // Linux moves at most ~2 GiB per call; asking for 1 GiB keeps each call whole.
            const std::size_t chunk = std::min<std::size_t>(size - done, std::size_t{1} << 30);
            const ssize_t n = pread(fd, base + done, chunk, static_cast<off_t>(done));
            if (n < 0) {
                const int err = errno;
                if (err == EINTR) continue;
                fail_os("cannot read at byte offset " + std::to_string(done), err);
            }
            if (n == 0) {
                fail("file ended at byte " + std::to_string(done) + " while reading " + std::to_string(size) +
                     " bytes (was it truncated?)");
            }
            done += static_cast<std::size_t>(n);
        }
    }
};

MappedFile::MappedFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MappedFile::MappedFile(MappedFile&&) noexcept = default;
MappedFile& MappedFile::operator=(MappedFile&&) noexcept = default;
MappedFile::~MappedFile() = default;

MappedFile MappedFile::open(const std::string& path, MapOptions options) {
    auto impl = std::make_unique<Impl>();
    impl->path = path;
    impl->file_mapping = options.use_mmap;

    // O_NONBLOCK so that a FIFO given by mistake is rejected below instead of hanging in open().
    impl->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (impl->fd < 0) impl->fail_os("cannot open", errno);

    struct stat st {};
    if (fstat(impl->fd, &st) != 0) impl->fail_os("cannot stat", errno);
    if (S_ISDIR(st.st_mode)) impl->fail("is a directory, not a model file");
    if (!S_ISREG(st.st_mode)) impl->fail("is not a regular file");
    const int flags = fcntl(impl->fd, F_GETFL);
    if (flags < 0 || fcntl(impl->fd, F_SETFL, flags & ~O_NONBLOCK) != 0) impl->fail_os("cannot set file flags", errno);
    if (static_cast<std::uintmax_t>(st.st_size) > std::numeric_limits<std::size_t>::max()) {
        impl->fail("size " + std::to_string(st.st_size) + " bytes does not fit in this process's address space");
    }
    impl->size = static_cast<std::size_t>(st.st_size);

    if (impl->size > 0 && options.use_mmap) {
        int map_flags = MAP_SHARED;
#ifdef MAP_POPULATE
        if (options.populate) map_flags |= MAP_POPULATE;
#endif
        void* p = mmap(nullptr, impl->size, PROT_READ, map_flags, impl->fd, 0);
        if (p == MAP_FAILED) {
            const int err = errno;
            impl->fail_os("cannot map " + std::to_string(impl->size) + " bytes", err);
        }
        impl->base = static_cast<std::byte*>(p);
    } else if (impl->size > 0) {
        // Anonymous memory rather than new[]: page aligned, so release()/lock()/mincore work on
        // it exactly as on a file mapping.
        void* p = mmap(nullptr, impl->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            const int err = errno;
            impl->fail_os("cannot allocate " + std::to_string(impl->size) + " bytes to read into", err);
        }
        impl->base = static_cast<std::byte*>(p);
        impl->read_all();
        // Read-only from here on, like a mapping: a stray write crashes at the culprit.
        if (mprotect(impl->base, impl->size, PROT_READ) != 0) impl->fail_os("cannot make the copy read-only", errno);
    }
    if (!options.use_mmap) {
        close(impl->fd);  // the copy is all we use; no fadvise applies to it
        impl->fd = -1;
    }
    return MappedFile(std::move(impl));
}

const std::string& MappedFile::path() const {
    return impl_->path;
}
std::size_t MappedFile::size() const {
    return impl_->size;
}
std::span<const std::byte> MappedFile::bytes() const {
    return {impl_->base, impl_->size};
}
bool MappedFile::is_file_mapping() const {
    return impl_->file_mapping;
}

std::size_t MappedFile::page_size() {
    static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    return page;
}

void MappedFile::advise(std::size_t offset, std::size_t length, Advice advice) {
    impl_->check_range(offset, length, "advise");
    if (length == 0) return;
    const ByteRange pages = impl_->pages_touching(offset, length);
    const std::string what = std::string("madvise(") + advice_name(advice) + ") of " + range_text(offset, length);
    if (!impl_->file_mapping) {
        // On anonymous memory DONTNEED is not advice but destruction of the only copy.
        if (advice == Advice::dontneed) return;
        if (madvise(impl_->base + pages.begin, pages.end - pages.begin, to_madvise(advice)) != 0) {
            impl_->fail_os(what, errno);
        }
        return;
    }
    if (madvise(impl_->base + pages.begin, pages.end - pages.begin, to_madvise(advice)) != 0) {
        impl_->fail_os(what, errno);
    }
    const int err =
        posix_fadvise(impl_->fd, static_cast<off_t>(offset), static_cast<off_t>(length), to_fadvise(advice));
    if (err != 0)
        impl_->fail_os(std::string("posix_fadvise(") + advice_name(advice) + ") of " + range_text(offset, length), err);
}

std::size_t MappedFile::release(std::size_t offset, std::size_t length) {
    impl_->check_range(offset, length, "release");
    if (length == 0) return 0;
    const std::size_t page = page_size();
    // Whole pages only: a ragged edge page still holds bytes the caller did not give up. The
    // file's last page has nothing after the file end worth keeping, so it counts as whole.
    const std::size_t end = offset + length;
    const ByteRange pages{round_up(offset, page), end == impl_->size ? round_up(end, page) : round_down(end, page)};
    if (pages.end <= pages.begin) return 0;
    if (overlap_bytes(impl_->locked, pages) > 0) {
        impl_->fail("cannot release " + range_text(offset, length) + ": it overlaps locked pages; unlock them first");
    }
    if (madvise(impl_->base + pages.begin, pages.end - pages.begin, MADV_DONTNEED) != 0) {
        impl_->fail_os("madvise(dontneed) to release " + range_text(offset, length), errno);
    }
    if (impl_->file_mapping) {
        // Now that we no longer map them, the clean page-cache pages can go too (pages that another
        // process maps stay; the kernel skips them).
        const int err = posix_fadvise(impl_->fd, static_cast<off_t>(pages.begin),
                                      static_cast<off_t>(pages.end - pages.begin), POSIX_FADV_DONTNEED);
        if (err != 0) impl_->fail_os("posix_fadvise(dontneed) to release " + range_text(offset, length), err);
    }
    return std::min(pages.end, impl_->size) - pages.begin;
}

std::size_t MappedFile::resident_bytes(std::size_t offset, std::size_t length) const {
    impl_->check_range(offset, length, "resident_bytes");
    if (length == 0) return 0;
    const std::size_t page = page_size();
    const ByteRange pages = impl_->pages_touching(offset, length);
    std::vector<unsigned char> resident((pages.end - pages.begin) / page);
    if (mincore(impl_->base + pages.begin, pages.end - pages.begin, resident.data()) != 0) {
        impl_->fail_os("mincore of " + range_text(offset, length), errno);
    }
    std::size_t total = 0;
    for (std::size_t i = 0; i < resident.size(); ++i) {
        if ((resident[i] & 1) == 0) continue;
        const std::size_t page_begin = pages.begin + i * page;
        total += std::min(page_begin + page, offset + length) - std::max(page_begin, offset);
    }
    return total;
}

void MappedFile::lock(std::size_t offset, std::size_t length) {
    impl_->check_range(offset, length, "lock");
    if (length == 0) return;
    const ByteRange pages = impl_->pages_touching(offset, length);
    const std::size_t new_bytes = (pages.end - pages.begin) - overlap_bytes(impl_->locked, pages);
    if (new_bytes == 0) return;

    // Checked here rather than left to the kernel: root passes the kernel's check, and a failed
    // mlock can leave part of the range locked. The budget holds for everyone, all or nothing.
    rlimit limit{};
    if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) impl_->fail_os("getrlimit(RLIMIT_MEMLOCK)", errno);
    if (limit.rlim_cur != RLIM_INFINITY) {
        const std::size_t already = process_locked_bytes();
        if (already + new_bytes > limit.rlim_cur) {
            impl_->fail("cannot lock " + range_text(offset, length) + ": requested " + std::to_string(new_bytes) +
                        " bytes (whole pages not yet locked) + " + std::to_string(already) +
                        " bytes already locked by this process exceeds the RLIMIT_MEMLOCK soft limit of " +
                        std::to_string(limit.rlim_cur) + " bytes (see ulimit -l)");
        }
    }
    if (mlock(impl_->base + pages.begin, pages.end - pages.begin) != 0) {
        const int err = errno;
        // Undo whatever part got locked, but keep the pages that were ours before this call.
        for (const ByteRange& part : uncovered_parts(impl_->locked, pages)) {
            munlock(impl_->base + part.begin, part.end - part.begin);
        }
        impl_->fail_os("mlock of " + range_text(offset, length) + " (" + std::to_string(new_bytes) + " new bytes)",
                       err);
    }
    add_range(impl_->locked, pages);
}

void MappedFile::unlock(std::size_t offset, std::size_t length) {
    impl_->check_range(offset, length, "unlock");
    if (length == 0) return;
    const ByteRange pages = impl_->pages_touching(offset, length);
    if (overlap_bytes(impl_->locked, pages) == 0) return;
    if (munlock(impl_->base + pages.begin, pages.end - pages.begin) != 0) {
        impl_->fail_os("munlock of " + range_text(offset, length), errno);
    }
    remove_range(impl_->locked, pages);
}

std::size_t MappedFile::locked_bytes() const {
    std::size_t total = 0;
    for (const ByteRange& r : impl_->locked) total += r.end - r.begin;
    return total;
}

}  // namespace fitllm::io
