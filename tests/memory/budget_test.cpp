// memory/budget.h: sizes as users write them, and the default budget from fake /proc and /sys trees.
#include "memory/budget.h"

#include <gtest/gtest.h>

#include <fstream>

#include "test_support.h"

namespace fitllm::memory {
namespace {

TEST(ParseSize, BytesAndBinaryUnits) {
    EXPECT_EQ(parse_size("1073741824"), 1073741824u);
    EXPECT_EQ(parse_size("0"), 0u);
    EXPECT_EQ(parse_size("900M"), 900ull << 20);
    EXPECT_EQ(parse_size("1.5G"), 1610612736u);
    EXPECT_EQ(parse_size("2GiB"), 2ull << 30);
    EXPECT_EQ(parse_size("512MiB"), 512ull << 20);
    EXPECT_EQ(parse_size("512mb"), 512ull << 20);
    EXPECT_EQ(parse_size("64k"), 65536u);
    EXPECT_EQ(parse_size("1T"), 1ull << 40);
    EXPECT_EQ(parse_size(" 3 G "), 3ull << 30);
    EXPECT_EQ(parse_size("100B"), 100u);
    EXPECT_EQ(parse_size("0.5K"), 512u);
    EXPECT_EQ(parse_size("18446744073709551615"), 18446744073709551615ull);
}

TEST(ParseSize, BadTextIsNamed) {
    for (const char* bad : {"", "G", "-1G", "1.5.2G", "12X", "1GG", "1e9", "abc", "16E", "99999999999999999999"}) {
        try {
            parse_size(bad);
            ADD_FAILURE() << "accepted '" << bad << "'";
        } catch (const SizeError& e) {
            EXPECT_NE(std::string(e.what()).find("'" + std::string(bad) + "'"), std::string::npos) << e.what();
        }
    }
}

TEST(SafetyMargin, FivePercentOr64MiB) {
    EXPECT_EQ(safety_margin(10ull << 30), static_cast<uint64_t>((10ull << 30) * 0.05));
    EXPECT_EQ(safety_margin(512ull << 20), 64ull << 20);
    EXPECT_EQ(safety_margin(10ull << 20), 10ull << 20);  // never more than there is
}

void put(const std::filesystem::path& path, const std::string& text) {
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
}

constexpr const char* kMeminfo =
    "MemTotal:       24684092 kB\nMemFree:         1000000 kB\nMemAvailable:   21960340 kB\nBuffers: 5 kB\n";

TEST(HostBudget, MemAvailableWithoutCgroupLimit) {
    test::TempDir dir;
    SystemRoots roots{dir / "proc", dir / "sys"};
    put(roots.proc / "meminfo", kMeminfo);
    put(roots.proc / "self" / "cgroup", "0::/user.slice\n");
    put(roots.sys / "fs/cgroup/user.slice/memory.max", "max\n");
    const HostBudget b = host_budget(roots);
    EXPECT_EQ(b.available, 21960340ull * 1024);
    EXPECT_EQ(b.margin, safety_margin(b.available));
    EXPECT_EQ(b.budget, b.available - b.margin);
    EXPECT_NE(b.source.find("MemAvailable"), std::string::npos);
}

TEST(HostBudget, CgroupV2SmallestLimitUpTheTree) {
    test::TempDir dir;
    SystemRoots roots{dir / "proc", dir / "sys"};
    put(roots.proc / "meminfo", kMeminfo);
    put(roots.proc / "self" / "cgroup", "0::/a/b/c\n");
    put(roots.sys / "fs/cgroup/a/b/c/memory.max", "max\n");
    put(roots.sys / "fs/cgroup/a/b/memory.max", "2147483648\n");
    put(roots.sys / "fs/cgroup/a/memory.max", "4294967296\n");
    const HostBudget b = host_budget(roots);
    EXPECT_EQ(b.available, 2ull << 30);
    EXPECT_EQ(b.margin, 64ull << 20 > (2ull << 30) / 20 ? 64ull << 20 : (2ull << 30) / 20);
    EXPECT_NE(b.source.find("cgroup v2"), std::string::npos) << b.source;
    EXPECT_NE(b.source.find("a/b/memory.max"), std::string::npos) << b.source;
}

TEST(HostBudget, CgroupV1MemoryController) {
    test::TempDir dir;
    SystemRoots roots{dir / "proc", dir / "sys"};
    put(roots.proc / "meminfo", kMeminfo);
    put(roots.proc / "self" / "cgroup", "5:devices:/\n4:memory:/jobs/42\n3:cpu,cpuacct:/\n0::/\n");
    put(roots.sys / "fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");  // no limit
    put(roots.sys / "fs/cgroup/memory/jobs/memory.limit_in_bytes", "9223372036854771712\n");
    put(roots.sys / "fs/cgroup/memory/jobs/42/memory.limit_in_bytes", "943718400\n");
    const HostBudget b = host_budget(roots);
    EXPECT_EQ(b.available, 943718400u);
    EXPECT_EQ(b.budget, 943718400u - (64ull << 20));
    EXPECT_NE(b.source.find("cgroup v1"), std::string::npos) << b.source;
}

TEST(HostBudget, CgroupV1WithoutLimitFallsBackToMeminfo) {
    test::TempDir dir;
    SystemRoots roots{dir / "proc", dir / "sys"};
    put(roots.proc / "meminfo", "MemTotal: 1000 kB\nMemFree: 800 kB\n");  // old kernel: no MemAvailable
    put(roots.proc / "self" / "cgroup", "4:memory:/jobs/42\n");
    put(roots.sys / "fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    EXPECT_EQ(cgroup_limit(roots), 0u);
    const HostBudget b = host_budget(roots);
    EXPECT_EQ(b.available, 800u * 1024);
    EXPECT_EQ(b.budget, 0u);  // the margin takes all of so little
}

TEST(HostBudget, CgroupPathMissingUnderTheMountUsesTheRoot) {
    // A container that sees only its own cgroup at the mount, while /proc/self/cgroup names the
    // host's path: the walk up the tree ends at the mount's root, which is this container's.
    test::TempDir dir;
    SystemRoots roots{dir / "proc", dir / "sys"};
    put(roots.proc / "meminfo", kMeminfo);
    put(roots.proc / "self" / "cgroup", "0::/kubepods/pod1/abc\n");
    put(roots.sys / "fs/cgroup/memory.max", "1073741824\n");
    EXPECT_EQ(host_budget(roots).available, 1ull << 30);
}

TEST(HostBudget, NothingReadableIsAnError) {
    test::TempDir dir;
    EXPECT_THROW(host_budget({dir / "proc", dir / "sys"}), Error);
}

TEST(HostBudget, ThisMachineHasOne) {
    const HostBudget b = host_budget();
    EXPECT_GT(b.available, 0u);
    EXPECT_FALSE(b.source.empty());
}

}  // namespace
}  // namespace fitllm::memory
