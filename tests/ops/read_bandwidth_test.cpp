#include "ops/read_bandwidth.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <span>
#include <vector>

namespace fitllm::ops {
namespace {

TEST(ReadBandwidth, ReadsEveryRangeOncePerPass) {
    // Sizes that are not whole chunks or whole words, and an empty range.
    std::vector<std::byte> a((3u << 20) + 5, std::byte{1}), b(31, std::byte{2}), c;
    const std::vector<std::span<const std::byte>> ranges{a, b, c};
    for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        const ReadBandwidth r = measure_read_bandwidth(ranges, pool, 2);
        EXPECT_EQ(r.bytes, a.size() + b.size());
        EXPECT_EQ(r.passes, 2);
        EXPECT_GT(r.bytes_per_second, 0.0);
    }
}

TEST(ReadBandwidth, NothingToReadIsZero) {
    ThreadPool pool(2);
    const ReadBandwidth r = measure_read_bandwidth({}, pool);
    EXPECT_EQ(r.bytes, 0u);
    EXPECT_EQ(r.bytes_per_second, 0.0);
}

}  // namespace
}  // namespace fitllm::ops
