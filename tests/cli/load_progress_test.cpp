#include "cli/load_progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <thread>

#include "engine/prefault.h"
#include "gguf/gguf_writer.h"
#include "io/mapped_file.h"
#include "test_support.h"

namespace fitllm {
namespace {

std::string read_all(std::FILE* f) {
    std::rewind(f);
    std::string s;
    char buf[256];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    return s;
}

TEST(LoadProgress, PrintsPercentAndEndsTheLine) {
    std::FILE* f = std::tmpfile();
    ASSERT_NE(f, nullptr);
    cli::LoadProgress p(f, "model.gguf", /*enabled=*/true, /*delay_s=*/0.0);
    p.update(0, 4u << 20);
    p.update(1u << 20, 4u << 20);
    p.update(1u << 20, 4u << 20);  // same percent: not redrawn
    p.update(4u << 20, 4u << 20);
    const std::string out = read_all(f);
    std::fclose(f);
    EXPECT_NE(out.find("\rloading model.gguf:   0% (0 / 4 MiB)"), std::string::npos) << out;
    EXPECT_NE(out.find("\rloading model.gguf:  25% (1 / 4 MiB)"), std::string::npos) << out;
    EXPECT_NE(out.find("\rloading model.gguf: 100% (4 / 4 MiB) in "), std::string::npos) << out;
    EXPECT_EQ(out.find("25%", out.find("25%") + 1), std::string::npos) << "redrawn without progress: " << out;
    EXPECT_EQ(out.back(), '\n');
}

TEST(LoadProgress, SilentWhenDisabledOrFast) {
    std::FILE* f = std::tmpfile();
    ASSERT_NE(f, nullptr);
    cli::LoadProgress off(f, "m", /*enabled=*/false, 0.0);
    off.update(1, 2);
    off.update(2, 2);
    cli::LoadProgress fast(f, "m", /*enabled=*/true, /*delay_s=*/60.0);
    fast.update(1, 2);
    fast.update(2, 2);
    EXPECT_FALSE(off.printed());
    EXPECT_FALSE(fast.printed());
    EXPECT_EQ(read_all(f), "");
    std::fclose(f);
}

TEST(LoadProgress, StartsOnceLoadingTakesLongerThanTheDelay) {
    std::FILE* f = std::tmpfile();
    ASSERT_NE(f, nullptr);
    cli::LoadProgress p(f, "m", /*enabled=*/true, /*delay_s=*/0.05);
    p.update(1, 10);
    EXPECT_FALSE(p.printed());
    std::this_thread::sleep_for(std::chrono::milliseconds(80));
    p.update(5, 10);
    EXPECT_TRUE(p.printed());
    std::fclose(f);
}

TEST(Prefault, TouchesEveryPageOfTheTensorDataAndReportsProgress) {
    // 40 MiB of tensor data: three 16 MiB chunks, so progress is reported more than once.
    gguf::GgufWriter w;
    w.add_string("general.architecture", "test");
    const int64_t n = 10 << 20;  // floats
    std::vector<std::byte> data(static_cast<size_t>(n) * 4, std::byte{1});
    const std::vector<int64_t> dims{n};
    w.add_tensor("t", quant::GgmlType::F32, dims, std::move(data));
    const test::TempDir dir;
    const std::string path = (dir / "big.gguf").string();
    w.write_file(path);
    gguf::GgufFile file = gguf::GgufFile::open(path);
    const uint64_t begin = file.data_offset();
    file.mapping()->release(begin, file.size() - begin);  // out of memory, as after a cold start

    std::vector<std::pair<uint64_t, uint64_t>> calls;
    const uint64_t total = engine::prefault(file, [&](uint64_t done, uint64_t t) { calls.emplace_back(done, t); });
    EXPECT_EQ(total, file.size() - begin);
    ASSERT_GE(calls.size(), 3u);
    for (size_t i = 1; i < calls.size(); ++i) EXPECT_GT(calls[i].first, calls[i - 1].first);
    EXPECT_EQ(calls.back().first, total);
    EXPECT_EQ(calls.back().second, total);
    EXPECT_EQ(file.mapping()->resident_bytes(begin, total), total);
}

TEST(Prefault, ParsedBytesReportOnceAtTheEnd) {
    gguf::GgufWriter w;
    w.add_string("general.architecture", "test");
    const std::vector<int64_t> dims{8};
    w.add_tensor("t", quant::GgmlType::F32, dims, std::vector<std::byte>(32));
    const std::vector<std::byte> bytes = w.to_bytes();
    gguf::GgufFile file = gguf::GgufFile::parse(bytes, "memory");
    int calls = 0;
    EXPECT_EQ(engine::prefault(file,
                               [&](uint64_t done, uint64_t total) {
                                   ++calls;
                                   EXPECT_EQ(done, total);
                               }),
              file.size() - file.data_offset());
    EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace fitllm
