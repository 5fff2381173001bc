// KV spill (issue 6): a cache whose K/V outgrows its resident limit keeps the layers that do not
// fit in an anonymous file in the spill directory, streams them through memory around each
// layer's attention, and reads and writes exactly what an in-memory cache does.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kv/cache.h"
#include "kv/cache_test_support.h"
#include "kv/spill_file.h"
#include "memory/device.h"
#include "memory/pool.h"
#include "test_support.h"

namespace fitllm::kv {
namespace {

namespace fs = std::filesystem;
using quant::GgmlType;
using test::place_run;
using test::shapes;

size_t files_in(const fs::path& dir) {
    return static_cast<size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

constexpr int kCells = 512;  // 32 blocks of 16

CacheParams params(GgmlType type, const std::string& dir = {}, uint64_t limit = 0) {
    CacheParams p;
    p.n_cells = kCells;
    p.n_seq_max = 2;
    p.block_size = 16;
    p.type_k = type;
    p.type_v = type;
    p.spill_dir = dir;
    p.resident_limit = limit;
    return p;
}

// K+V bytes of one layer of shapes(n) (2 heads of 32) at kCells cells.
uint64_t layer_bytes(GgmlType type) {
    const uint64_t head = type == GgmlType::F16 ? 64 : type == GgmlType::Q8_0 ? 34 : 18;
    return 2 * 2 * head * kCells;
}

// Pages of [p, p + n) in the page cache (mincore on a file mapping asks the page cache).
size_t resident_pages(const std::byte* p, size_t n) {
    const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t begin = reinterpret_cast<uintptr_t>(p) / page * page;
    const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n + page - 1) / page * page;
    std::vector<unsigned char> in((end - begin) / page);
    EXPECT_EQ(::mincore(reinterpret_cast<void*>(begin), end - begin, in.data()), 0);
    size_t count = 0;
    for (unsigned char c : in) count += c & 1;
    return count;
}

// Random K/V rows for n cells of every layer, stored in both caches.
void store_random(KvCache& a, KvCache& b, const std::vector<int32_t>& cells, std::mt19937& rng) {
    std::normal_distribution<float> dist;
    const size_t width = 2 * 32;
    std::vector<float> k(cells.size() * width), v(cells.size() * width);
    for (int layer = 0; layer < a.n_layer(); ++layer) {
        for (float& x : k) x = dist(rng);
        for (float& x : v) x = dist(rng);
        a.store(layer, cells, k.data(), v.data());
        b.store(layer, cells, k.data(), v.data());
    }
}

void expect_same_contents(const KvCache& a, const KvCache& b, int n_cells) {
    std::vector<float> ka(64), kb(64), va(64), vb(64);
    for (int layer = 0; layer < a.n_layer(); ++layer) {
        for (int32_t c = 0; c < n_cells; ++c) {
            a.read_k(layer, c, ka.data());
            b.read_k(layer, c, kb.data());
            a.read_v(layer, c, va.data());
            b.read_v(layer, c, vb.data());
            ASSERT_EQ(std::memcmp(ka.data(), kb.data(), 64 * sizeof(float)), 0)
                << "K, layer " << layer << " cell " << c;
            ASSERT_EQ(std::memcmp(va.data(), vb.data(), 64 * sizeof(float)), 0)
                << "V, layer " << layer << " cell " << c;
        }
    }
}

TEST(KvSpill, StaysInMemoryWithoutADirectoryOrWhenItFits) {
    std::string why_not;
    const fs::path dir = test::spill_test_dir("fits", why_not);
    if (!why_not.empty()) GTEST_SKIP() << why_not;
    const uint64_t all = 4 * layer_bytes(GgmlType::F16);
    EXPECT_FALSE(KvCache(shapes(4), params(GgmlType::F16, "", all / 2)).spilled());        // no directory
    EXPECT_FALSE(KvCache(shapes(4), params(GgmlType::F16, dir.string(), 0)).spilled());    // no limit
    EXPECT_FALSE(KvCache(shapes(4), params(GgmlType::F16, dir.string(), all)).spilled());  // fits
    const KvCache spilled(shapes(4), params(GgmlType::F16, dir.string(), all - 1));
    EXPECT_TRUE(spilled.spilled());
}

TEST(KvSpill, PinsWhatFitsAndChargesOnlyTheResidentPart) {
    std::string why_not;
    const fs::path dir = test::spill_test_dir("layout", why_not);
    if (!why_not.empty()) GTEST_SKIP() << why_not;
    const uint64_t layer = layer_bytes(GgmlType::Q8_0);
    // Cells, blocks and tables, and the K transforms of all 6 layers: none of it spills.
    const uint64_t bookkeeping = KvCache::bytes_for(shapes(6), params(GgmlType::Q8_0)) - 6 * layer;
    memory::Device host("host", uint64_t{1} << 30);
    memory::Pool& kv = host.pool("kv");
    struct Case {
        uint64_t limit;
        int pinned;    // layers kept in memory
        int resident;  // layers whose bytes are charged: pinned + the streamed window
    };
    for (const Case& c :
         {Case{layer, 0, 1}, Case{2 * layer + layer / 2, 0, 2}, Case{4 * layer, 2, 4}, Case{5 * layer + 7, 3, 5}}) {
        SCOPED_TRACE("limit " + std::to_string(c.limit));
        CacheParams p = params(GgmlType::Q8_0, dir.string(), c.limit);
        p.pool = &kv;
        const KvCache cache(shapes(6), p);
        ASSERT_TRUE(cache.spilled());
        EXPECT_EQ(cache.pinned_layers(), c.pinned);
        EXPECT_EQ(cache.bytes(), bookkeeping + c.resident * layer);
        EXPECT_LE(cache.bytes(), bookkeeping + c.limit);
        EXPECT_EQ(kv.live(), cache.bytes());
        EXPECT_EQ(cache.bytes(), KvCache::bytes_for(shapes(6), p));
        // The streamed layers' K and V, each page-aligned.
        EXPECT_GE(cache.spill_file_bytes(), (6 - c.pinned) * layer);
        EXPECT_LT(cache.spill_file_bytes(), (6 - c.pinned) * (layer + 2 * SpillFile::page_size()));
        EXPECT_EQ(files_in(dir), 0u) << "the spill file has no name";
    }
    EXPECT_EQ(kv.live(), 0u);
}

TEST(KvSpill, ALimitBelowOneLayerIsRefused) {
    std::string why_not;
    const fs::path dir = test::spill_test_dir("small", why_not);
    if (!why_not.empty()) GTEST_SKIP() << why_not;
    try {
        KvCache cache(shapes(4), params(GgmlType::F16, dir.string(), layer_bytes(GgmlType::F16) - 1));
        FAIL() << "no error";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("holds no whole layer"), std::string::npos) << e.what();
    }
}

TEST(KvSpill, ABadDirectoryIsAClearError) {
    std::string why_not;
    const fs::path bad = test::spill_test_dir("bad", why_not);
    if (!why_not.empty()) GTEST_SKIP() << why_not;
    const fs::path missing = bad / "missing";
    try {
        KvCache cache(shapes(4), params(GgmlType::F16, missing.string(), layer_bytes(GgmlType::F16)));
        FAIL() << "no error";
    } catch (const SpillError& e) {
        EXPECT_NE(std::string(e.what()).find(missing.string()), std::string::npos) << e.what();
    }
    // tmpfs is memory: refused, when this machine has one to try.
    if (fs::is_directory("/dev/shm") && ::access("/dev/shm", W_OK) == 0) {
        try {
            KvCache cache(shapes(4), params(GgmlType::F16, "/dev/shm", layer_bytes(GgmlType::F16)));
            ADD_FAILURE() << "spilled to /dev/shm";
        } catch (const SpillError& e) {
            EXPECT_NE(std::string(e.what()).find("tmpfs"), std::string::npos) << e.what();
        }
    }
    // No room: more than the file system has.
    try {
        SpillFile file(bad.string(), uint64_t{1} << 62);
        FAIL() << "no error";
    } catch (const SpillError& e) {
        EXPECT_NE(std::string(e.what()).find("free"), std::string::npos) << e.what();
    }
}

TEST(KvSpill, ReadsAndWritesWhatAnInMemoryCacheDoes) {
    std::string why_not;
    const fs::path dir = test::spill_test_dir("contents", why_not);
    if (!why_not.empty()) GTEST_SKIP() << why_not;
    for (const GgmlType type : {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0}) {
        for (const uint64_t layers_in_limit : {1, 2, 3}) {
            SCOPED_TRACE(std::to_string(layers_in_limit) + " layers resident");
            KvCache memory_cache(shapes(5), params(type));
            KvCache spilled(shapes(5), params(type, dir.string(), layers_in_limit * layer_bytes(type)));
            ASSERT_TRUE(spilled.spilled());
            std::mt19937 rng(7);
            // Batches of both sequences, with the forward pass's will_attend calls between.
            for (int batch = 0; batch < 6; ++batch) {
                const auto cells = place_run(memory_cache, batch % 2, 40 * (batch / 2), 40);
                ASSERT_EQ(place_run(spilled, batch % 2, 40 * (batch / 2), 40), cells);
                store_random(memory_cache, spilled, cells, rng);
                for (int layer = 0; layer < 5; ++layer) spilled.will_attend(layer);
            }
            // A shared block copied on write (copy_cell_data) and a K shift (rewrites K rows).
            memory_cache.seq_cp(0, 1, -1, -1);
            spilled.seq_cp(0, 1, -1, -1);
            EXPECT_EQ(place_run(spilled, 1, 200, 3), place_run(memory_cache, 1, 200, 3));
            memory_cache.seq_add(0, 10, -1, -5);
            spilled.seq_add(0, 10, -1, -5);
            const auto rerotate = [](float* rows, const int32_t* deltas, int n) {
                for (int i = 0; i < n; ++i) rows[i * 64] += static_cast<float>(deltas[i]);
            };
            for (int layer = 0; layer < 5; ++layer) {
                memory_cache.apply_k_shift(layer, rerotate);
                spilled.apply_k_shift(layer, rerotate);
            }
            expect_same_contents(memory_cache, spilled, kCells);
        }
    }
}

TEST(KvSpill, StreamedLayersLeaveMemoryOutsideTheWindow) {
    std::string why_not;
    const fs::path dir = test::spill_test_dir("residency", why_not);
    if (!why_not.empty()) GTEST_SKIP() << why_not;
    const uint64_t layer = layer_bytes(GgmlType::F16);
    KvCache cache(shapes(5), params(GgmlType::F16, dir.string(), 3 * layer));  // 1 pinned, 2 streamed at once
    ASSERT_EQ(cache.pinned_layers(), 1);
    KvCache memory_cache(shapes(5), params(GgmlType::F16));
    std::mt19937 rng(3);
    store_random(memory_cache, cache, place_run(cache, 0, 0, kCells), rng);
    place_run(memory_cache, 0, 0, kCells);
    const auto k_pages = [&](int il) {
        return resident_pages(cache.layer_view(il).k, kCells * cache.layer_view(il).k_row_bytes);
    };
    const auto v_pages = [&](int il) {
        return resident_pages(cache.layer_view(il).v, kCells * cache.layer_view(il).v_row_bytes);
    };
    // Before layer 2: layers 2 and 3 wanted, 4 written to and released (layer 1 too: streamed).
    cache.will_attend(2);
    EXPECT_EQ(k_pages(1), 0u);
    EXPECT_EQ(v_pages(1), 0u);
    EXPECT_EQ(k_pages(4), 0u);
    EXPECT_EQ(v_pages(4), 0u);
    // Before layer 4: 1 comes round next, 2 and 3 go.
    cache.will_attend(4);
    EXPECT_EQ(k_pages(2), 0u);
    EXPECT_EQ(v_pages(3), 0u);
    // The data came back from the file.
    expect_same_contents(memory_cache, cache, kCells);
}

}  // namespace
}  // namespace fitllm::kv
