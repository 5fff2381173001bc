#include "io/mapped_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace fitllm::io {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kFileSize = 8u << 20;

// AddressSanitizer intercepts mlock() and turns it into a no-op that reports success.
#ifndef FITLLM_UNDER_ASAN  // tests/CMakeLists.txt sets it in the sanitizer build
#define FITLLM_UNDER_ASAN 0
#endif
constexpr bool kMlockReallyLocks = !FITLLM_UNDER_ASAN;

// Different in every byte position and every page, so a page read from the wrong place shows.
std::byte pattern_at(std::size_t i) {
    return static_cast<std::byte>((i * 131 + i / 4096 * 7 + 3) & 0xff);
}

std::string unique_temp_path(const char* tag) {
    static std::atomic<int> counter{0};
    return (fs::temp_directory_path() /
            ("fitllm_io_" + std::string(tag) + "_" + std::to_string(getpid()) + "_" + std::to_string(counter++)))
        .string();
}

// Writes the pattern, fsyncs so the page cache holds clean pages the kernel may drop, then drops
// them so each test starts cold.
class TempFile {
public:
    explicit TempFile(std::size_t size, const char* tag = "file") : path_(unique_temp_path(tag)) {
        std::vector<std::byte> data(size);
        for (std::size_t i = 0; i < size; ++i) data[i] = pattern_at(i);
        const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) throw std::runtime_error("cannot create " + path_);
        std::size_t done = 0;
        while (done < size) {
            const ssize_t n = ::write(fd, data.data() + done, size - done);
            if (n <= 0) throw std::runtime_error("cannot write " + path_);
            done += static_cast<std::size_t>(n);
        }
        fsync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        ::close(fd);
    }
    ~TempFile() {
        std::error_code ignored;
        fs::remove(path_, ignored);
    }
    TempFile(const TempFile&) = delete;
    TempFile& operator=(const TempFile&) = delete;
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

// Sets the RLIMIT_MEMLOCK soft limit for a scope and puts the old limits back after.
class ScopedMemlockLimit {
public:
    explicit ScopedMemlockLimit(rlim_t soft) {
        getrlimit(RLIMIT_MEMLOCK, &saved_);
        set(soft);
    }
    ~ScopedMemlockLimit() { setrlimit(RLIMIT_MEMLOCK, &saved_); }
    ScopedMemlockLimit(const ScopedMemlockLimit&) = delete;
    ScopedMemlockLimit& operator=(const ScopedMemlockLimit&) = delete;
    bool set(rlim_t soft) {
        rlimit changed = saved_;
        changed.rlim_cur = soft;
        return setrlimit(RLIMIT_MEMLOCK, &changed) == 0;
    }
    rlim_t hard() const { return saved_.rlim_max; }

private:
    rlimit saved_{};
};

void touch_every_page(const MappedFile& file) {
    const auto bytes = file.bytes();
    unsigned sum = 0;
    for (std::size_t i = 0; i < bytes.size(); i += MappedFile::page_size()) {
        sum += static_cast<unsigned>(*static_cast<const volatile std::byte*>(&bytes[i]));
    }
    (void)sum;
}

bool bytes_match_pattern(const MappedFile& file, std::size_t offset, std::size_t length) {
    const auto bytes = file.bytes();
    for (std::size_t i = offset; i < offset + length; ++i) {
        if (bytes[i] != pattern_at(i)) return false;
    }
    return true;
}

std::string thrown_message(const std::function<void()>& action) {
    try {
        action();
    } catch (const IoError& e) {
        return e.what();
    }
    return "<nothing thrown>";
}

// On a file system that cannot drop clean pages (tmpfs keeps them: they are the file) the
// residency tests cannot observe anything, so they skip rather than fail.
#define SKIP_UNLESS_COLD(file)                                                                       \
    if ((file).resident_bytes(0, (file).size()) != 0) {                                              \
        GTEST_SKIP() << "the page cache of " << (file).path() << " cannot be dropped here (tmpfs?)"; \
    }

TEST(MappedFile, BytesMatchWhatWasWrittenWithMmap) {
    TempFile temp(kFileSize);
    const MappedFile file = MappedFile::open(temp.path());
    EXPECT_EQ(file.path(), temp.path());
    EXPECT_EQ(file.size(), kFileSize);
    EXPECT_TRUE(file.is_file_mapping());
    ASSERT_EQ(file.bytes().size(), kFileSize);
    EXPECT_TRUE(bytes_match_pattern(file, 0, kFileSize));
}

TEST(MappedFile, BytesMatchWhatWasWrittenWithoutMmap) {
    TempFile temp(kFileSize + 123);  // not a whole number of pages
    const MappedFile file = MappedFile::open(temp.path(), {.use_mmap = false});
    EXPECT_FALSE(file.is_file_mapping());
    ASSERT_EQ(file.size(), kFileSize + 123);
    EXPECT_TRUE(bytes_match_pattern(file, 0, file.size()));
    EXPECT_EQ(file.resident_bytes(0, file.size()), file.size());  // it was all read in
}

TEST(MappedFile, PopulateMakesTheWholeFileResident) {
    TempFile temp(kFileSize);
    const MappedFile file = MappedFile::open(temp.path(), {.populate = true});
    EXPECT_EQ(file.resident_bytes(0, file.size()), file.size());
}

TEST(MappedFile, EmptyFileHasAnEmptySpan) {
    TempFile temp(0);
    for (bool use_mmap : {true, false}) {
        MappedFile file = MappedFile::open(temp.path(), {.use_mmap = use_mmap});
        EXPECT_EQ(file.size(), 0u);
        EXPECT_TRUE(file.bytes().empty());
        EXPECT_EQ(file.resident_bytes(0, 0), 0u);
        EXPECT_EQ(file.release(0, 0), 0u);
        file.advise(0, 0, Advice::willneed);
        file.lock(0, 0);
        EXPECT_EQ(file.locked_bytes(), 0u);
    }
}

TEST(MappedFile, ReleaseGivesBackExactlyTheWholePagesInsideTheRange) {
    TempFile temp(kFileSize);
    MappedFile file = MappedFile::open(temp.path());
    SKIP_UNLESS_COLD(file);
    const std::size_t page = MappedFile::page_size();
    touch_every_page(file);
    ASSERT_EQ(file.resident_bytes(0, file.size()), file.size());

    // Ragged on both ends: pages 3 and 203 are only partly inside and must stay.
    const std::size_t offset = 3 * page + 100;
    const std::size_t length = 200 * page;
    const std::size_t released = file.release(offset, length);
    EXPECT_EQ(released, 199 * page);
    EXPECT_EQ(file.resident_bytes(0, file.size()), file.size() - 199 * page);
    EXPECT_EQ(file.resident_bytes(4 * page, 199 * page), 0u);
    EXPECT_EQ(file.resident_bytes(3 * page, page), page);
    EXPECT_EQ(file.resident_bytes(203 * page, page), page);
    // Clipped to the asked range, not rounded to pages.
    EXPECT_EQ(file.resident_bytes(offset, length), (page - 100) + 100);

    // A mapping re-faults released pages from the file.
    EXPECT_TRUE(bytes_match_pattern(file, offset, length));
    EXPECT_EQ(file.resident_bytes(0, file.size()), file.size());
}

TEST(MappedFile, ReleaseWithoutMmapFreesTheCopy) {
    TempFile temp(kFileSize);
    MappedFile file = MappedFile::open(temp.path(), {.use_mmap = false});
    const std::size_t page = MappedFile::page_size();
    ASSERT_EQ(file.resident_bytes(0, file.size()), file.size());
    EXPECT_EQ(file.release(10 * page - 1, 20 * page + 2), 20 * page);
    EXPECT_EQ(file.resident_bytes(0, file.size()), file.size() - 20 * page);
    EXPECT_EQ(file.resident_bytes(10 * page, 20 * page), 0u);
    // The ragged edges keep their content; the released pages are gone and not read again.
    EXPECT_TRUE(bytes_match_pattern(file, 9 * page, page));
    EXPECT_TRUE(bytes_match_pattern(file, 30 * page, page));
}

TEST(MappedFile, ReleaseOfLessThanAWholePageDoesNothing) {
    TempFile temp(kFileSize);
    MappedFile file = MappedFile::open(temp.path(), {.use_mmap = false});
    const std::size_t page = MappedFile::page_size();
    EXPECT_EQ(file.release(page + 1, page), 0u);
    EXPECT_EQ(file.resident_bytes(0, file.size()), file.size());
}

TEST(MappedFile, ReleaseToTheEndCoversTheLastPartialPage) {
    const std::size_t page = MappedFile::page_size();
    TempFile temp(3 * page + 10);
    MappedFile file = MappedFile::open(temp.path(), {.use_mmap = false});
    EXPECT_EQ(file.release(page + 1, file.size() - page - 1), page + 10);
    EXPECT_EQ(file.resident_bytes(0, file.size()), 2 * page);
}

TEST(MappedFile, AdviseWillneedReadsAheadAndDontneedDrops) {
    TempFile temp(kFileSize);
    MappedFile file = MappedFile::open(temp.path());
    SKIP_UNLESS_COLD(file);
    file.advise(0, 1u << 20, Advice::willneed);
    // Read-ahead may be asynchronous; not seeing it is allowed, an error is not.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (file.resident_bytes(0, 1u << 20) < (1u << 20) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (file.resident_bytes(0, 1u << 20) < (1u << 20)) {
        std::cout << "note: willneed read-ahead not observed within 2 s\n";
    }
    file.advise(0, file.size(), Advice::sequential);
    file.advise(0, file.size(), Advice::random);
    file.advise(0, file.size(), Advice::normal);

    touch_every_page(file);
    ASSERT_EQ(file.resident_bytes(0, file.size()), file.size());
    file.advise(0, file.size(), Advice::dontneed);
    EXPECT_EQ(file.resident_bytes(0, file.size()), 0u);
    EXPECT_TRUE(bytes_match_pattern(file, 0, file.size()));
}

TEST(MappedFile, AdviseOnACopyKeepsItsContent) {
    TempFile temp(kFileSize);
    MappedFile file = MappedFile::open(temp.path(), {.use_mmap = false});
    for (Advice a : {Advice::normal, Advice::willneed, Advice::sequential, Advice::random, Advice::dontneed}) {
        file.advise(1, file.size() - 2, a);
    }
    EXPECT_EQ(file.resident_bytes(0, file.size()), file.size());
    EXPECT_TRUE(bytes_match_pattern(file, 0, file.size()));
}

TEST(MappedFile, LockOverRlimitMemlockThrowsAndLocksNothing) {
    TempFile temp(kFileSize);
    MappedFile file = MappedFile::open(temp.path());
    ScopedMemlockLimit limit(64 << 10);
    const std::string message = thrown_message([&] { file.lock(0, 1u << 20); });
    EXPECT_NE(message.find("RLIMIT_MEMLOCK"), std::string::npos) << message;
    EXPECT_NE(message.find("1048576"), std::string::npos) << message;  // requested
    EXPECT_NE(message.find("65536"), std::string::npos) << message;    // limit
    EXPECT_NE(message.find("already locked"), std::string::npos) << message;
    EXPECT_NE(message.find(temp.path()), std::string::npos) << message;
    EXPECT_EQ(file.locked_bytes(), 0u);

    const rlim_t wanted = 4u << 20;
    if (limit.hard() != RLIM_INFINITY && limit.hard() < wanted) {
        GTEST_SKIP() << "hard RLIMIT_MEMLOCK " << limit.hard() << " is below the " << wanted << " bytes the rest needs";
    }
    ASSERT_TRUE(limit.set(wanted));
    file.lock(0, 1u << 20);
    EXPECT_EQ(file.locked_bytes(), 1u << 20);
    if (kMlockReallyLocks) {
        EXPECT_EQ(file.resident_bytes(0, 1u << 20), 1u << 20);
    }
    EXPECT_NE(thrown_message([&] { file.release(0, 1u << 20); }).find("locked"), std::string::npos);
    file.unlock(0, 1u << 20);
    EXPECT_EQ(file.locked_bytes(), 0u);
}

TEST(MappedFile, LockIsPageGranularAndTracksRanges) {
    TempFile temp(kFileSize);
    MappedFile file = MappedFile::open(temp.path(), {.use_mmap = false});
    ScopedMemlockLimit limit(RLIM_INFINITY);
    if (!limit.set(limit.hard())) GTEST_SKIP() << "cannot set RLIMIT_MEMLOCK";
    const std::size_t page = MappedFile::page_size();
    if (limit.hard() != RLIM_INFINITY && limit.hard() < 64 * page) GTEST_SKIP() << "RLIMIT_MEMLOCK too small";
    file.lock(1, 10);
    EXPECT_EQ(file.locked_bytes(), page);
    file.lock(page - 1, 2 * page);  // pages 0..2, page 0 already ours
    EXPECT_EQ(file.locked_bytes(), 3 * page);
    file.lock(10 * page, page);
    EXPECT_EQ(file.locked_bytes(), 4 * page);
    file.unlock(page, 1);  // the middle page of the first run
    EXPECT_EQ(file.locked_bytes(), 3 * page);
    file.unlock(0, file.size());
    EXPECT_EQ(file.locked_bytes(), 0u);
    file.lock(0, 4 * page);  // left locked: the destructor must unlock
}

TEST(MappedFile, RangesPastTheEndThrowWithTheRangeAndSize) {
    TempFile temp(kFileSize);
    MappedFile file = MappedFile::open(temp.path());
    const std::size_t size = file.size();
    const std::size_t huge = std::numeric_limits<std::size_t>::max();
    const std::vector<std::function<void(std::size_t, std::size_t)>> calls = {
        [&](std::size_t o, std::size_t l) { file.advise(o, l, Advice::willneed); },
        [&](std::size_t o, std::size_t l) { file.release(o, l); },
        [&](std::size_t o, std::size_t l) { (void)file.resident_bytes(o, l); },
        [&](std::size_t o, std::size_t l) { file.lock(o, l); },
        [&](std::size_t o, std::size_t l) { file.unlock(o, l); },
    };
    for (const auto& call : calls) {
        const std::string past = thrown_message([&] { call(size - 10, 11); });
        EXPECT_NE(past.find(temp.path()), std::string::npos) << past;
        EXPECT_NE(past.find(std::to_string(size + 1)), std::string::npos) << past;
        EXPECT_NE(past.find("size " + std::to_string(size)), std::string::npos) << past;
        EXPECT_NE(thrown_message([&] { call(size + 1, 0); }), "<nothing thrown>");
        const std::string overflow = thrown_message([&] { call(16, huge); });
        EXPECT_NE(overflow.find("overflows"), std::string::npos) << overflow;
        call(size, 0);  // empty range at the end: fine, does nothing
    }
    EXPECT_EQ(file.locked_bytes(), 0u);
}

TEST(MappedFile, MissingFileThrowsWithThePath) {
    const std::string path = unique_temp_path("missing");
    const std::string message = thrown_message([&] { MappedFile::open(path); });
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find("No such file"), std::string::npos) << message;
}

TEST(MappedFile, DirectoryThrowsWithThePath) {
    const std::string path = fs::temp_directory_path().string();
    for (bool use_mmap : {true, false}) {
        const std::string message = thrown_message([&] { MappedFile::open(path, {.use_mmap = use_mmap}); });
        EXPECT_NE(message.find(path), std::string::npos) << message;
        EXPECT_NE(message.find("directory"), std::string::npos) << message;
    }
}

TEST(MappedFile, UnreadableFileThrowsWithThePath) {
    if (geteuid() == 0) GTEST_SKIP() << "root reads files regardless of their mode";
    TempFile temp(100);
    fs::permissions(temp.path(), fs::perms::none);
    const std::string message = thrown_message([&] { MappedFile::open(temp.path()); });
    EXPECT_NE(message.find(temp.path()), std::string::npos) << message;
    EXPECT_NE(message.find("Permission denied"), std::string::npos) << message;
}

TEST(MappedFile, MoveTransfersTheMapping) {
    TempFile temp(kFileSize);
    MappedFile a = MappedFile::open(temp.path());
    const std::byte* data = a.bytes().data();
    MappedFile b = std::move(a);
    EXPECT_EQ(b.bytes().data(), data);
    TempFile other(4096);
    MappedFile c = MappedFile::open(other.path());
    c = std::move(b);  // c's old mapping is unmapped here
    EXPECT_EQ(c.bytes().data(), data);
    EXPECT_EQ(c.size(), kFileSize);
    EXPECT_TRUE(bytes_match_pattern(c, 0, c.size()));
}

}  // namespace
}  // namespace fitllm::io
