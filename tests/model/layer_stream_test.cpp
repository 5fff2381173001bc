// Streaming the last layers (model/layer_stream.h, LoadOptions::n_streamed_layers): the same
// logits as the resident run, bit for bit; the streamed layers' pages stay out of the page cache;
// working memory and stream buffers are charged to the device; read errors name file, tensor and
// offset.
#include "model/layer_stream.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/prefault.h"
#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "io/mapped_file.h"
#include "memory/device.h"
#include "memory/pool.h"
#include "model/model.h"
#include "ops/thread_pool.h"
#include "test_support.h"

namespace fitllm {
namespace {

namespace fs = std::filesystem;

// A prompt in one batch (every token's logits), then `n_decode` single-token steps feeding back
// the argmax; all the logits, in order.
std::vector<float> run(model::Model& model, std::vector<int32_t> prompt, int n_decode, ops::ThreadPool& pool) {
    const auto n_vocab = static_cast<size_t>(model.n_vocab());
    kv::ModelCache cache = model.make_cache({.n_cells = 64}, 64);
    std::vector<int32_t> positions(prompt.size());
    std::iota(positions.begin(), positions.end(), 0);
    std::vector<float> all(prompt.size() * n_vocab);
    model.forward(prompt, positions, cache, all.data(), /*all_logits=*/true, pool);
    std::vector<float> step(n_vocab);
    int32_t token = static_cast<int32_t>(std::max_element(all.end() - static_cast<ptrdiff_t>(n_vocab), all.end()) -
                                         (all.end() - static_cast<ptrdiff_t>(n_vocab)));
    for (int i = 0; i < n_decode; ++i) {
        const int32_t pos = static_cast<int32_t>(prompt.size()) + i;
        model.forward(std::span(&token, 1), std::span(&pos, 1), cache, step.data(), false, pool);
        all.insert(all.end(), step.begin(), step.end());
        token = static_cast<int32_t>(std::max_element(step.begin(), step.end()) - step.begin());
    }
    return all;
}

void expect_bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    ASSERT_EQ(a.size(), b.size());
    size_t first_diff = a.size();
    for (size_t i = 0; i < a.size() && first_diff == a.size(); ++i) {
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) first_diff = i;
    }
    EXPECT_EQ(first_diff, a.size()) << "logit " << first_diff << ": " << a[first_diff] << " vs " << b[first_diff];
}

TEST(LayerStream, TinyModelsGiveTheResidentLogitsBitForBit) {
    ops::ThreadPool pool(2);
    const fs::path data = test::source_dir() / "tests/model/data";
    for (const char* arch : {"llama", "qwen2"}) {
        for (const char* type : {"f16", "q4_0", "q4_k_m", "q6_k", "q8_0"}) {
            const std::string path = (data / ("tiny-" + std::string(arch) + "-" + type + ".gguf")).string();
            SCOPED_TRACE(path);
            const gguf::GgufFile file = gguf::GgufFile::open(path);
            const auto resident = model::Model::load(file);
            const int n_layer = resident->hparams().n_layer;
            const std::vector<int32_t> prompt = {1, 17, 4, 29, 23, 8, 31};
            const std::vector<float> want = run(*resident, prompt, 4, pool);
            for (const int n_streamed : {1, n_layer}) {
                for (const bool direct : {true, false}) {
                    SCOPED_TRACE("streamed " + std::to_string(n_streamed) + (direct ? " O_DIRECT" : " buffered"));
                    const auto streamed =
                        model::Model::load(file, {.n_streamed_layers = n_streamed, .stream_direct_io = direct});
                    EXPECT_EQ(streamed->n_streamed_layers(), n_streamed);
                    expect_bitwise_equal(run(*streamed, prompt, 4, pool), want);
                }
            }
        }
    }
}

TEST(LayerStream, DemoModelGivesTheResidentLogitsBitForBit) {
    const auto path = test::demo_model();
    if (!path) GTEST_SKIP() << "demo model absent (scripts/setup.sh downloads it)";
    ops::ThreadPool pool(2);
    const gguf::GgufFile file = gguf::GgufFile::open(path->string());
    const auto resident = model::Model::load(file);
    const int n_layer = resident->hparams().n_layer;
    const std::vector<int32_t> prompt = {2, 818, 5279, 529, 7001, 563, 496, 9638};
    const std::vector<float> want = run(*resident, prompt, 3, pool);
    for (const int n_streamed : {1, n_layer}) {
        SCOPED_TRACE("streamed " + std::to_string(n_streamed));
        const auto streamed = model::Model::load(file, {.n_streamed_layers = n_streamed});
        expect_bitwise_equal(run(*streamed, prompt, 3, pool), want);
    }
}

// A Llama with layers of 2.4 MiB (F32), so that page-granular residency can be checked inside
// them: token_embd, output_norm and output first, then 4 layers.
constexpr int64_t kEmbd = 256, kFf = 512, kHeads = 4, kHeadsKv = 2, kHeadDim = 64, kVocab = 64, kLayers = 4;

std::vector<std::byte> wide_llama_bytes() {
    gguf::GgufWriter w;
    w.add_string("general.architecture", "llama");
    w.add<uint32_t>("llama.block_count", kLayers);
    w.add<uint32_t>("llama.embedding_length", kEmbd);
    w.add<uint32_t>("llama.feed_forward_length", kFf);
    w.add<uint32_t>("llama.context_length", 128);
    w.add<uint32_t>("llama.attention.head_count", kHeads);
    w.add<uint32_t>("llama.attention.head_count_kv", kHeadsKv);
    w.add<float>("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    w.add<float>("llama.rope.freq_base", 10000.0f);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 0.05f);
    const auto tensor = [&](const std::string& name, std::vector<int64_t> dims, float base) {
        const int64_t n = std::accumulate(dims.begin(), dims.end(), int64_t{1}, std::multiplies<>());
        std::vector<std::byte> bytes(static_cast<size_t>(n) * sizeof(float));
        for (int64_t i = 0; i < n; ++i) {
            const float v = base + normal(rng);
            std::memcpy(bytes.data() + i * 4, &v, 4);
        }
        w.add_tensor(name, quant::GgmlType::F32, dims, std::move(bytes));
    };
    tensor("token_embd.weight", {kEmbd, kVocab}, 0.0f);
    tensor("output_norm.weight", {kEmbd}, 1.0f);
    tensor("output.weight", {kEmbd, kVocab}, 0.0f);
    const int64_t q_dim = kHeads * kHeadDim, kv_dim = kHeadsKv * kHeadDim;
    for (int il = 0; il < kLayers; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        tensor(b + "attn_norm.weight", {kEmbd}, 1.0f);
        tensor(b + "attn_q.weight", {kEmbd, q_dim}, 0.0f);
        tensor(b + "attn_k.weight", {kEmbd, kv_dim}, 0.0f);
        tensor(b + "attn_v.weight", {kEmbd, kv_dim}, 0.0f);
        tensor(b + "attn_output.weight", {q_dim, kEmbd}, 0.0f);
        tensor(b + "ffn_norm.weight", {kEmbd}, 1.0f);
        tensor(b + "ffn_gate.weight", {kEmbd, kFf}, 0.0f);
        tensor(b + "ffn_up.weight", {kEmbd, kFf}, 0.0f);
        tensor(b + "ffn_down.weight", {kFf, kEmbd}, 0.0f);
    }
    return w.to_bytes();
}

// Asks the kernel to drop the file's cached pages (clean after fsync; pages mapped somewhere stay).
void drop_page_cache(const fs::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
}

// The bytes of the ranges that are in the page cache, leaving out kEdge at both ends: the page
// there is shared with resident tensors, and the kernel may cache it in a large folio (ext4 does,
// 64 KiB seen) that stays cached as a whole while that page is mapped, whatever we drop.
uint64_t resident_inside(const io::MappedFile& mapping, const std::vector<model::FileRange>& ranges) {
    constexpr uint64_t kEdge = 256 << 10;
    const uint64_t page = io::MappedFile::page_size();
    uint64_t resident = 0;
    for (const model::FileRange& r : ranges) {
        if (r.length <= 2 * kEdge) continue;
        const uint64_t begin = (r.offset + kEdge + page - 1) / page * page;
        const uint64_t end = (r.offset + r.length - kEdge) / page * page;
        if (end > begin) resident += mapping.resident_bytes(begin, end - begin);
    }
    return resident;
}

TEST(LayerStream, StreamedLayersStayOutOfThePageCache) {
    test::TempDir dir;
    const fs::path path = dir / "wide.gguf";
    test::write_file(path, wide_llama_bytes());
    ops::ThreadPool pool(2);
    for (const bool direct : {true, false}) {
        SCOPED_TRACE(direct ? "O_DIRECT" : "buffered");
        gguf::GgufFile file = gguf::GgufFile::open(path.string());
        drop_page_cache(path);  // opening read the header, and the kernel read ahead around it
        auto model = model::Model::load(file, {.n_streamed_layers = 2, .stream_direct_io = direct});
        const std::vector<model::FileRange> streamed = model->streamed_ranges();
        ASSERT_FALSE(streamed.empty());
        if (resident_inside(*file.mapping(), streamed) != 0) {
            GTEST_SKIP() << "the page cache kept the fresh file's pages after POSIX_FADV_DONTNEED";
        }
        // All but the streamed layers and the token embedding (the output is not tied to it), to
        // the page.
        const uint64_t prefaulted = engine::prefault(file, *model);
        uint64_t skipped = file.find_tensor("token_embd.weight")->n_bytes;
        for (const model::FileRange& r : streamed) skipped += r.length;
        const uint64_t page = io::MappedFile::page_size();
        EXPECT_LE(prefaulted, file.size() - file.data_offset() - skipped + 4 * page);
        EXPECT_GE(prefaulted + 4 * page, file.size() - file.data_offset() - skipped);
        run(*model, {1, 2, 3, 4, 5}, 3, pool);
        // The stream's reader runs ahead into the next pass, and between a read and the drop that
        // follows it the pages are cached: stop it (it finishes the read in hand) before looking.
        model.reset();
        EXPECT_EQ(resident_inside(*file.mapping(), streamed), 0u);
        // The resident layers are in: the check can see pages.
        const auto layer0 = *file.find_tensor("blk.0.ffn_up.weight");
        EXPECT_EQ(file.mapping()->resident_bytes(file.data_offset() + layer0.offset, layer0.n_bytes), layer0.n_bytes);
    }
}

TEST(LayerStream, ChargesStagingAndScratchToTheDevice) {
    test::TempDir dir;
    const fs::path path = dir / "wide.gguf";
    test::write_file(path, wide_llama_bytes());
    const gguf::GgufFile file = gguf::GgufFile::open(path.string());
    ops::ThreadPool pool(2);
    memory::Device host("host", uint64_t{64} << 20);
    {
        const auto model = model::Model::load(file, {.device = &host, .n_streamed_layers = 3});
        const uint64_t staging = host.pool(memory::pool_names::kStaging).live();
        EXPECT_EQ(staging, model::stream_staging_bytes(file, kLayers - 3, kLayers));
        // Two buffers of one layer (all the same size here), each a little over the layer's bytes.
        const uint64_t layer_bytes =
            (2 * kEmbd * kHeads * kHeadDim + 2 * kEmbd * kHeadsKv * kHeadDim + 3 * kEmbd * kFf + 2 * kEmbd) * 4;
        EXPECT_GE(staging, model::kStreamBuffers * layer_bytes);
        EXPECT_LE(staging, model::kStreamBuffers * (layer_bytes + 3 * model::kStreamAlign + 64));
        EXPECT_EQ(host.pool(memory::pool_names::kScratch).live(), 0u);
        run(*model, {1, 2, 3}, 1, pool);
        EXPECT_GT(host.pool(memory::pool_names::kScratch).live(), 0u);
    }
    EXPECT_EQ(host.live(), 0u) << host.breakdown();

    // Stream buffers over the budget: refused at load, nothing left charged.
    memory::Device small("small", uint64_t{4} << 20);
    EXPECT_THROW(model::Model::load(file, {.device = &small, .n_streamed_layers = 1}), memory::BudgetError);
    EXPECT_EQ(small.live(), 0u);
    // Activations over the budget: the forward pass refuses, the model lives on.
    const uint64_t fits_buffers = model::stream_staging_bytes(file, kLayers - 1, kLayers) + (256 << 10);
    memory::Device tight("tight", fits_buffers);
    const auto model = model::Model::load(file, {.device = &tight, .n_streamed_layers = 1});
    kv::ModelCache cache = model->make_cache({.n_cells = 64}, 64);
    std::vector<int32_t> tokens(60, 3), positions(60);
    std::iota(positions.begin(), positions.end(), 0);
    std::vector<float> logits(static_cast<size_t>(kVocab));
    EXPECT_THROW(model->forward(tokens, positions, cache, logits.data(), false, pool), memory::BudgetError);
    // Nothing was placed in the cache; a batch that fits still runs.
    EXPECT_NO_THROW(
        model->forward(std::span(tokens.data(), 1), std::span(positions.data(), 1), cache, logits.data(), false, pool));
}

TEST(LayerStream, RefusesALayerCountOutsideTheModel) {
    const gguf::GgufFile file =
        gguf::GgufFile::open((test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf").string());
    EXPECT_THROW(model::Model::load(file, {.n_streamed_layers = -1}), std::invalid_argument);
    EXPECT_THROW(model::Model::load(file, {.n_streamed_layers = 3}), std::invalid_argument);
    const std::vector<std::byte> bytes = test::read_file(test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf");
    const gguf::GgufFile parsed = gguf::GgufFile::parse(bytes, "in-memory.gguf");
    try {
        model::Model::load(parsed, {.n_streamed_layers = 1});
        FAIL() << "streaming from bytes without a file";
    } catch (const model::ModelError& e) {
        EXPECT_NE(std::string(e.what()).find("in-memory.gguf"), std::string::npos) << e.what();
    }
}

TEST(LayerStream, AShortFileNamesTheFileTensorAndOffset) {
    test::TempDir dir;
    const fs::path path = dir / "wide.gguf";
    test::write_file(path, wide_llama_bytes());
    const gguf::GgufFile file = gguf::GgufFile::open(path.string());
    const auto model = model::Model::load(file, {.n_streamed_layers = 1});
    // Cut the last layer in half; the resident layers' pages stay within the file. The stream has
    // read ahead, so the first passes may still run on what it read before.
    const auto down = *file.find_tensor("blk.3.ffn_down.weight");
    fs::resize_file(path, file.data_offset() + down.offset + down.n_bytes / 2);
    ops::ThreadPool pool(2);
    std::string error;
    // With n buffers the reader is at most n passes ahead of the one that fails.
    for (int pass = 0; pass <= model::kStreamBuffers && error.empty(); ++pass) {
        try {
            run(*model, {1, 2}, 0, pool);
        } catch (const io::IoError& e) {
            error = e.what();
        }
    }
    ASSERT_FALSE(error.empty()) << "no error from a truncated file";
    EXPECT_NE(error.find(path.string()), std::string::npos) << error;
    EXPECT_NE(error.find("blk.3.ffn_down.weight"), std::string::npos) << error;
    EXPECT_NE(error.find("offset"), std::string::npos) << error;
    // The error stays: every later pass reports it instead of computing with missing weights.
    EXPECT_THROW(run(*model, {1, 2}, 0, pool), io::IoError);
}

TEST(LayerStream, ALayerAskedOutOfTurnSkipsAhead) {
    test::TempDir dir;
    const fs::path path = dir / "wide.gguf";
    test::write_file(path, wide_llama_bytes());
    const gguf::GgufFile file = gguf::GgufFile::open(path.string());
    memory::Device host("host", UINT64_MAX);
    model::LayerStream stream(file, 1, kLayers, host.pool("staging"));
    const auto& t = *file.find_tensor("blk.2.attn_norm.weight");
    const auto* mapped = reinterpret_cast<const float*>(t.data.data());
    for (int round = 0; round < 3; ++round) {
        // As after a pass that stopped at layer 2: the next one asks for layer 1 again.
        model::LayerStream::Lease lease = stream.acquire(2);
        const float* copy = lease.translate(mapped);
        ASSERT_NE(copy, mapped);
        EXPECT_EQ(std::memcmp(copy, mapped, t.n_bytes), 0);
        lease.reset();
        model::LayerStream::Lease first = stream.acquire(1);
        EXPECT_TRUE(first);
    }
    EXPECT_THROW(stream.acquire(0), std::invalid_argument);
}

}  // namespace
}  // namespace fitllm
