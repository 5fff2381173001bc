#include "ops/read_bandwidth.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

namespace fitllm::ops {

namespace {

constexpr size_t kChunk = size_t{1} << 20;

// Sums the 8-byte words of [p, p + n) into four independent accumulators (so that loads, not an
// add chain, set the pace), and the tail bytes one by one.
uint64_t read_all(const std::byte* p, size_t n) {
    uint64_t a = 0, b = 0, c = 0, d = 0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        uint64_t w[4];
        std::memcpy(w, p + i, sizeof w);
        a += w[0];
        b += w[1];
        c += w[2];
        d += w[3];
    }
    for (; i < n; ++i) a += static_cast<uint64_t>(p[i]);
    return a ^ b ^ c ^ d;
}

}  // namespace

ReadBandwidth measure_read_bandwidth(std::span<const std::span<const std::byte>> ranges, ThreadPool& pool, int passes) {
    struct Chunk {
        const std::byte* data;
        size_t size;
    };
    std::vector<Chunk> chunks;
    ReadBandwidth result;
    for (const auto& r : ranges) {
        for (size_t off = 0; off < r.size(); off += kChunk) {
            chunks.push_back({r.data() + off, std::min(kChunk, r.size() - off)});
        }
        result.bytes += r.size();
    }
    if (chunks.empty()) return result;
    std::atomic<uint64_t> sink{0};  // keeps the reads from being optimized away
    for (int pass = 0; pass < passes; ++pass) {
        const auto t0 = std::chrono::steady_clock::now();
        pool.parallel_for(static_cast<int64_t>(chunks.size()), [&](int64_t begin, int64_t end, int) {
            uint64_t s = 0;
            for (int64_t i = begin; i < end; ++i) {
                s ^= read_all(chunks[static_cast<size_t>(i)].data, chunks[static_cast<size_t>(i)].size);
            }
            sink.fetch_xor(s, std::memory_order_relaxed);
        });
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (seconds > 0) result.bytes_per_second = std::max(result.bytes_per_second, result.bytes / seconds);
        ++result.passes;
    }
    return result;
}

}  // namespace fitllm::ops
