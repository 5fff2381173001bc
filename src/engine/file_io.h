#pragma once
// Small pieces the prompt cache's files share (engine/prompt_cache.cpp, engine/key_transform_file.cpp):
// whole reads and writes at an offset, a 64-bit hash, and a hex name tag.
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace fitllm::engine::file_io {

// Writes or reads all n bytes at `offset` of fd; false on an error (errno set) or a short file.
inline bool write_all(int fd, const void* data, size_t n, uint64_t offset) {
    const auto* bytes = static_cast<const std::byte*>(data);
    for (size_t done = 0; done < n;) {
        const ssize_t w = ::pwrite(fd, bytes + done, n - done, static_cast<off_t>(offset + done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        done += static_cast<size_t>(w);
    }
    return true;
}

inline bool read_all(int fd, void* data, size_t n, uint64_t offset) {
    auto* bytes = static_cast<std::byte*>(data);
    for (size_t done = 0; done < n;) {
        const ssize_t r = ::pread(fd, bytes + done, n - done, static_cast<off_t>(offset + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        done += static_cast<size_t>(r);
    }
    return true;
}

// A 64-bit hash of bytes, a word at a time (for identities and to catch corrupt files, not
// against an adversary).
class Hash {
public:
    void add(const void* data, size_t n) {
        const auto* p = static_cast<const unsigned char*>(data);
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            uint64_t w;
            std::memcpy(&w, p + i, 8);
            word(w);
        }
        if (i < n) {
            uint64_t w = 0;
            std::memcpy(&w, p + i, n - i);
            word(w ^ (uint64_t{n - i} << 59));
        }
        length_ += n;
    }
    template <class T>
    void add_value(const T& v) {
        add(&v, sizeof v);
    }
    uint64_t value() const {
        uint64_t h = h_ ^ length_;
        h ^= h >> 33;
        h *= 0xff51afd7ed558ccdULL;
        h ^= h >> 33;
        return h;
    }
    // value(), with 0 (which callers keep for "none") made 1.
    uint64_t identity() const {
        const uint64_t v = value();
        return v != 0 ? v : 1;
    }

private:
    void word(uint64_t w) {
        h_ ^= w * 0x9E3779B97F4A7C15ULL;
        h_ = (h_ << 27 | h_ >> 37) * 0xC2B2AE3D27D4EB4FULL + 0x165667B19E3779F9ULL;
    }
    uint64_t h_ = 0x27D4EB2F165667C5ULL;
    uint64_t length_ = 0;
};

inline std::string hex(uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

}  // namespace fitllm::engine::file_io
